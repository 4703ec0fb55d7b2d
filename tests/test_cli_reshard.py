"""``meshlayout reshard`` through ``cli.main``: text, JSON, pictures, errors; docs/reshard.md."""

from __future__ import annotations

import doctest
import json
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from meshlayout import Mesh
from meshlayout.cli import main
from meshlayout.sharding import Shard, ShardingSpec, StridedShard, reshard_plan

DOC = Path(__file__).resolve().parent.parent / "docs" / "reshard.md"
NS = "{http://www.w3.org/2000/svg}"
FSDP_TP = [
    "reshard",
    "--shape",
    "8,6",
    "--src-mesh",
    "dp=4",
    "--src-placements",
    "S(0)",
    "--dst-mesh",
    "tp=2",
    "--dst-ranks",
    "2,3",
    "--dst-placements",
    "S(1)",
]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_doc_examples_are_doctests() -> None:
    result = doctest.testfile(str(DOC), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    assert result.attempted >= 15


def _doc_commands() -> list[tuple[list[str], str]]:
    """Every ``$ meshlayout reshard ...`` block of docs/reshard.md with its printed output."""
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n\$ meshlayout (reshard .*?)\n(.*?)```", text, re.S)
    return [(shlex.split(cmd), out) for cmd, out in blocks]


def test_doc_command_output_is_what_the_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    commands = _doc_commands()
    assert len(commands) == 2
    for argv, want in commands:
        code, out, err = run(argv, capsys)
        assert code == 0 and err == ""
        assert out == want


def test_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*FSDP_TP, "--ranks-per-host", "2", "--dtype", "float32"], capsys)
    assert code == 0 and err == ""
    assert "  2        [6]  6" in out  # rank 2 keeps rows 4-5, columns 0-2
    assert "elements moved         36 (144 B) (kept locally: 12, delivered: 48)" in out
    assert "rank 0 sends 12 (48 B); rank 2 receives 18 (72 B)" in out
    # ranks 0-1 on host 0, 2-3 on host 1: ranks 0, 1 send 24 across, 2 -> 3 and 3 -> 2 stay
    assert "across hosts           24 (96 B) (2 ranks per host)" in out
    assert "144 (576 B) received, at most 36 (144 B) per rank: 4.00x the plan" in out


def test_large_worlds_are_abridged(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["reshard", "--shape", "16384,4096", "--src-mesh", "dp=4096"]
    argv += ["--src-placements", "S(0)", "--dst-mesh", "tp=64", "--dst-placements", "S(1)"]
    code, out, err = run(argv, capsys)
    assert code == 0 and err == ""
    matrix = out.split("elements sent")[1].split("\n\n")[0].splitlines()[1:]
    assert len(matrix) == 1 + 12 + 1 + 2  # header, 12 first ranks, "...", 2 last
    assert matrix[0].split() == ["src\\dst", *map(str, range(8)), "...", "62", "63"]
    assert matrix[-1].split()[0] == "4095" and matrix[13].strip() == "..."
    assert "transfers              262080 boxes sent, 64 local copies" in out


def test_json_report_is_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*FSDP_TP, "--format", "json", "--dtype", "bfloat16"], capsys)
    assert code == 0 and err == ""
    rep = json.loads(out)
    assert list(rep) == [
        "schema",
        "shape",
        "dtype",
        "itemsize",
        "src",
        "dst",
        "summary",
        "pairs",
        "transfers",
    ]
    assert rep["schema"] == "meshlayout.reshard/1" and rep["shape"] == [8, 6]
    assert (rep["dtype"], rep["itemsize"]) == ("bfloat16", 2)
    assert rep["src"] == {
        "mesh": "dp=4",
        "names": ["dp"],
        "sizes": [4],
        "ranks": [0, 1, 2, 3],
        "placements": ["S(0)"],
        "shard_order": {"0": ["dp"]},
    }
    assert rep["dst"]["ranks"] == [2, 3] and rep["dst"]["shard_order"] == {"1": ["tp"]}
    src = ShardingSpec((8, 6), Mesh({"dp": 4}), [Shard(0)])
    dst = ShardingSpec((8, 6), Mesh({"tp": 2}, ranks=[2, 3]), [Shard(1)])
    plan = reshard_plan(src, dst)
    summary = plan.summary()
    assert {k: rep["summary"][k] for k in summary} == summary
    assert rep["summary"]["bytes_moved"] == 2 * summary["elements_moved"]
    assert rep["summary"]["allgather_bytes"] == 2 * summary["allgather_elements"]
    want = [[t.src_rank, t.dst_rank, [list(iv) for iv in t.box]] for t in plan.transfers]
    assert rep["transfers"] == want
    assert [2, 2, 0, 6] in rep["pairs"] and [0, 3, 6, 0] in rep["pairs"]
    assert sum(p[2] for p in rep["pairs"]) == summary["elements_moved"]


def test_undecodable_source_has_no_shard_order(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["reshard", "--shape", "8,2", "--src-mesh", "2", "--src-placements", "SS(0,2)"]
    argv += ["--dst-mesh", "2", "--dst-ranks", "1,2", "--dst-placements", "S(0)"]
    code, out, err = run([*argv, "--format", "json"], capsys)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["src"]["shard_order"] is None
    src = ShardingSpec((8, 2), Mesh((2,)), [StridedShard(0, 2)])
    dst = ShardingSpec((8, 2), Mesh((2,), ranks=[1, 2]), [Shard(0)])
    assert rep["transfers"] == [
        [t.src_rank, t.dst_rank, [list(iv) for iv in t.box]]
        for t in reshard_plan(src, dst).transfers
    ]


def test_shard_order_flags(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["reshard", "--shape", "13,8", "--src-mesh", "dp=3,tp=2", "--src-shard-order", "0:tp,dp"]
    argv += ["--dst-mesh", "tp=3", "--dst-placements", "S(0)"]
    code, out, err = run(argv, capsys)
    assert code == 0 and err == ""
    assert "dp=3,tp=2 on ranks [0, 1, 2, 3, 4, 5]: SS(0,2), S(0)" in out
    code, out2, _ = run([*argv, "--src-placements", "SS(0,2),S(0)"], capsys)
    assert out2 == out


def test_pictures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg, html = tmp_path / "r.svg", tmp_path / "r.html"
    code, _out, err = run([*FSDP_TP, "--svg", str(svg), "--html", str(html)], capsys)
    assert code == 0 and "wrote" in err
    root = ET.parse(svg).getroot()
    rects = [r.get("class") for r in root.iter(f"{NS}rect")]
    assert rects.count("cell") == 4 * 2  # source x destination ranks
    assert rects.count("local") == 2
    assert rects.count("box") == 6 and rects.count("box local") == 2
    page = html.read_text()
    assert "<svg" in page and "elements moved" in page and "http://" not in page.split("<svg")[0]


def _one_line_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "", (code, out, err)
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(
    "change,message",
    [
        ({"--src-placements": None}, "give --src-placements, --src-shard-order, or both"),
        ({"--dst-placements": "X(1)"}, "--dst-placements 'X(1)': unknown placement 'X'"),
        ({"--dst-placements": "S(5)"}, "--dst-placements 'S(5)'"),
        ({"--src-placements": "P"}, "--src-placements: P(sum) is a pending reduction"),
        (
            {"--dst-ranks": "2,3,4"},
            "--dst-ranks '2,3,4' gives 3 ranks, but --dst-mesh 'tp=2' needs 2",
        ),
        ({"--dst-mesh": "tp=0"}, "--dst-mesh"),
        ({"--shape": "8,x"}, "--shape"),
        ({"--src-shard-order": "0:tp"}, "--src-shard-order '0:tp'"),
        ({"--src-shard-order": "1:dp"}, "decode to shard order {0: (0,)}, but --src-shard-order"),
        ({"--src-mesh": "8388608"}, "--src-mesh '8388608': a reshard plan looks at every rank"),
        (
            {"--ranks-per-host": "3"},
            "--ranks-per-host 3 does not divide the 4 ranks 0-3 the meshes span: the last host "
            "would hold 1 of 3 ranks (every host holds as many ranks); if the job has more "
            "ranks than the meshes use, give --world N",
        ),
        (
            {"--ranks-per-host": "8", "--world": "12"},
            "--ranks-per-host 8 does not divide --world 12: the last host would hold 4 of 8",
        ),
        ({"--world": "8"}, "--world 8 applies with --ranks-per-host (it places the hosts)"),
        (
            {"--ranks-per-host": "2", "--world": "2"},
            "--world 2: the meshes use rank 3, outside ranks 0-1",
        ),
    ],
)
def test_user_errors_exit_2_with_one_line(
    change: dict[str, str | None], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = list(FSDP_TP)
    for flag, value in change.items():
        if flag in argv:
            i = argv.index(flag)
            del argv[i : i + 2]
        if value is not None:
            argv += [flag, value]
    err = _one_line_error(argv, capsys)
    assert message in err, err
    assert err.startswith("meshlayout reshard: error:") or "usage" not in err


def test_a_world_larger_than_the_meshes_takes_whole_hosts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Ranks 0-3 of a job of 8 on hosts of 8: one host, nothing crosses (and 8 is refused
    without --world, which says the job is larger than the meshes)."""
    code, out, err = run([*FSDP_TP, "--ranks-per-host", "8", "--world", "8"], capsys)
    assert code == 0 and err == ""
    assert "across hosts           0 (8 ranks per host)" in out
    assert "--world N" in _one_line_error([*FSDP_TP, "--ranks-per-host", "8"], capsys)


def test_argparse_and_output_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "--ranks-per-host" in _one_line_error([*FSDP_TP, "--ranks-per-host", "0"], capsys)
    assert "--dtype" in _one_line_error([*FSDP_TP, "--dtype", "float3"], capsys)
    err = _one_line_error([*FSDP_TP, "--svg", str(tmp_path / "no" / "x.svg")], capsys)
    assert "--svg" in err and "cannot write" in err
    assert "--src-mesh" in _one_line_error(FSDP_TP[:3], capsys)  # required flags


def test_json_limit_names_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import meshlayout.render.reports as reports

    monkeypatch.setattr(reports, "LIST_LIMIT", 8)  # this plan has 8 transfers
    code, _out, _ = run([*FSDP_TP, "--format", "json"], capsys)
    assert code == 0
    monkeypatch.setattr(reports, "LIST_LIMIT", 7)
    err = _one_line_error([*FSDP_TP, "--format", "json"], capsys)
    assert "--format json" in err and "8 transfers" in err


def test_subprocess() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "meshlayout.cli", *FSDP_TP, "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["summary"]["elements_moved"] == 36
