"""``meshlayout checkpoint DIR`` on real DCP checkpoints: ours tile exactly (exit 0), plain
DCP's uneven FSDP-over-TP ones do not (exit 1), usage errors exit 2 with one line.

The checkpoints are written once by a spawned process that runs DCP's save protocol
for 6 emulated ranks (``dcp_emulation``): a (13, 3) weight laid out as FSDP2 over
ColwiseParallel stores it on (dp=3, tp=2), saved by our planner; the same saved by
plain DCP without its validation (what it would write: overlap + hole); and the
7-row one plain DCP does save, whose metadata tiles but whose data does not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from meshlayout.cli import main
from multiproc import run_multiproc

pytestmark = [pytest.mark.torch]


def _write(rank: int, world: int, root: str) -> None:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    from dcp_emulation import fsdp_over_tp_checkpoint
    from meshlayout.torch.checkpoint import ExactSavePlanner

    fsdp_over_tp_checkpoint(f"{root}/ours", 13, ExactSavePlanner)
    fsdp_over_tp_checkpoint(f"{root}/plain13", 13, DefaultSavePlanner, validate=False)
    fsdp_over_tp_checkpoint(f"{root}/plain7", 7, DefaultSavePlanner)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_ckpt")
    run_multiproc(_write, 1, str(root), timeout=240, start_method="spawn", init=False)
    return root


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_ours_tiles_exactly(ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["checkpoint", str(ckpt / "ours")], capsys)
    assert code == 0, out
    assert "w       (13, 3)  float32  6       exact" in out
    assert "step" in out and "exact: all 1 tensors tile exactly" in out
    code, out, _ = run(["checkpoint", str(ckpt / "ours"), "--verify", "--format", "json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"]
    (w,) = report["tensors"]
    assert w["stored"] == [] and w["exact"] and w["holes"] == [] and w["overlaps"] == []
    # one chunk per rank, at FSDP2's true offsets: (rank, first row, rows)
    chunks = sorted((c["rank"], c["offsets"][0], c["sizes"][0]) for c in w["chunks"])
    assert chunks == [(0, 0, 3), (1, 7, 2), (2, 3, 3), (3, 9, 2), (4, 6, 1), (5, 11, 2)]


def test_plain_overlapping_checkpoint_exits_1_naming_overlap_and_hole(
    ckpt: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    svg = tmp_path / "w.svg"
    code, out, err = run(["checkpoint", str(ckpt / "plain13"), "--svg", str(svg)], capsys)
    assert code == 1
    assert "overlap: chunks 1 and 4 share ((7, 8), (0, 3)); hole: ((11, 12), (0, 3))" in out
    assert "NOT EXACT: 1 of 1 tensors (w)" in out
    assert "chunk 4   (6:8, 0:3)" in out and "rank 4" in out
    text = svg.read_text()
    assert text.startswith("<svg") and "overlap" in text and "hole" in text and "rank 4" in text
    assert f"wrote {svg}" in err


def test_plain_checkpoint_whose_data_does_not_match_its_metadata(
    ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["checkpoint", str(ckpt / "plain7")], capsys)
    assert code == 0  # the metadata alone tiles: only the data betrays it
    code, out, _ = run(["checkpoint", str(ckpt / "plain7"), "--verify"], capsys)
    assert code == 1
    assert (
        "stored data: chunk 4 at offsets (6, 0): metadata says (1, 3) float32, "
        "__4_0.distcp holds (0, 3) float32" in out
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["checkpoint", "/nonexistent/ckpt"],
            "DIR '/nonexistent/ckpt': '/nonexistent/ckpt' is not a directory",
        ),
        (["checkpoint", "{tmp}"], "holds no DCP checkpoint (no .metadata file)"),
        (
            ["checkpoint", "{ours}", "--tensor", "nope"],
            "--tensor 'nope': no such tensor in the checkpoint (it has w)",
        ),
        (
            ["checkpoint", "{ours}", "--svg", "/nonexistent/dir/x.svg"],
            "--svg '/nonexistent/dir/x.svg': cannot write",
        ),
        (["checkpoint", "{garbage}"], "cannot read .metadata"),
    ],
)
def test_usage_errors_are_one_line_exit_2(
    ckpt: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    message: str,
) -> None:
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / ".metadata").write_bytes(b"not a pickle")
    paths: dict[str, Any] = {"tmp": tmp_path, "ours": ckpt / "ours", "garbage": garbage}
    code, out, err = run([a.format(**paths) for a in argv], capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_tensor_flag_lists_chunks_of_an_exact_tensor(
    ckpt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run(["checkpoint", str(ckpt / "ours"), "--tensor", "w"], capsys)
    assert code == 0
    assert "w: exact" in out and out.count("    chunk ") == 6
