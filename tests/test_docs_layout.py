"""Run the examples of docs/layout.md and README.md as doctests (testpaths is tests/)."""

from __future__ import annotations

import doctest
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(path: Path) -> doctest.TestResults:
    return doctest.testfile(
        str(path),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )


def test_docs_layout_md() -> None:
    result = run(ROOT / "docs" / "layout.md")
    assert result.attempted >= 30
    assert result.failed == 0


def test_readme_examples() -> None:
    result = run(ROOT / "README.md")
    assert result.attempted >= 1
    assert result.failed == 0
