"""The examples of docs/design.md run as doctests."""

from __future__ import annotations

import doctest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_design_md() -> None:
    result = doctest.testfile(
        str(ROOT / "docs" / "design.md"),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
    )
    assert result.attempted >= 5
    assert result.failed == 0
