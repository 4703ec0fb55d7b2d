"""The interim demo prints the mesh layout and its algebra as aligned tables."""

from __future__ import annotations

import pytest

from meshlayout.demo_layout import run


def test_demo_prints_aligned_tables(capsys: pytest.CaptureFixture[str]) -> None:
    run()
    out = capsys.readouterr().out
    assert "(2,2,8,2,8):(256,128,16,8,1)" in out
    for expected in ("512:1", "16:8", "(4,8):(128,1)", "(2,4):(64,16)", "(64,8):(8,1)"):
        assert expected in out
    assert "0 8 16 24 32 40 48 56 64 72 80 88 96 104 112 120" in out
    for block in out.strip().split("\n\n")[1:]:
        lines = block.splitlines()
        bars = {line.index("|") for line in lines if "|" in line}
        assert len(bars) == 1, f"misaligned table:\n{block}"
