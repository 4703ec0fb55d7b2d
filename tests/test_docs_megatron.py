"""Run every example of docs/megatron.md."""

from __future__ import annotations

import doctest
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "megatron.md"


def test_megatron_doc_examples() -> None:
    result = doctest.testfile(
        str(DOC),
        module_relative=False,
        optionflags=doctest.ELLIPSIS,
        raise_on_error=False,
        verbose=False,
    )
    assert result.attempted >= 15, f"only {result.attempted} examples found in {DOC}"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {DOC}"
