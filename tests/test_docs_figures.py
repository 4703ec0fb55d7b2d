"""One set of figures: the weight-transfer speed-ups the README and docs/transfer.md quote
are the ones measured in docs/performance.md (issue 24 item 10: the README said 18–28x
while the measurements give 20–26x)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def _measured_speedups() -> list[float]:
    """Every 'gather+bcast is Nx the transfer' figure of the execution measurements."""
    part = _section(PERFORMANCE, "## Weight transfer")
    table = re.findall(r"^\| gather\+bcast \| [0-9.]+ \| ([0-9.]+)x \|", part, flags=re.M)
    prose = re.findall(r"([0-9]+\.[0-9])x faster than\s+gather\+bcast", part)
    rerun = re.findall(r"verify \+[0-9]+%, ([0-9.]+)x, [0-9.]+x, [0-9.]+x floor", part)
    return [float(x) for x in (*table, *prose, *rerun)]


def test_the_measurements_are_found() -> None:
    assert sorted(_measured_speedups()) == [20.0, 22.0, 24.5, 25.9]


def test_every_page_quotes_the_measured_range() -> None:
    figures = _measured_speedups()
    low, high = round(min(figures)), round(max(figures))
    claim = f"{low}–{high}x"
    pages = {
        "README.md": r"([0-9]+–[0-9]+x)\s+faster than gather-then-broadcast",
        "docs/transfer.md": r"([0-9]+–[0-9]+x) faster than gather-then-broadcast",
        "docs/performance.md": r"faster than gather\+bcast: met \(([0-9]+–[0-9]+x)\)",
    }
    for page, pattern in pages.items():
        found = re.findall(pattern, (ROOT / page).read_text(encoding="utf-8"))
        assert found == [claim], (page, found, claim)
