"""The examples of docs/transfer.md run as doctests."""

from __future__ import annotations

import doctest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_transfer_md() -> None:
    result = doctest.testfile(
        str(ROOT / "docs" / "transfer.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert result.attempted >= 10
    assert result.failed == 0
