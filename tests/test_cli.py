"""The ``meshlayout`` command: every subcommand and flag through ``main(argv)``, errors,
``--help`` examples, and each subcommand once as a subprocess."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from megatron_grid_reference import token_groups
from megatron_reference import config, megatron_available, run_reference
from mesh_reference import ModelMesh
from meshlayout import MegatronDims
from meshlayout.cli import COMMANDS, main
from meshlayout.cli.args import ArgError, parse_placements
from meshlayout.megatron import MEGATRON_VIEWS
from meshlayout.megatron import VIEWS as MEGATRON_PURPOSES
from meshlayout.sharding import Partial, Replicate, Shard, StridedShard
from parallel_dims_reference import DENSE, VIEW_DIMS
from report_reference import hosts_touched, view_groups, view_rank
from sharding_reference import reference_indices

NS = "{http://www.w3.org/2000/svg}"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    code, out, err = run([*argv, "--format", "json"], capsys)
    assert code == 0, err
    return json.loads(out)  # type: ignore[no-any-return]


# ---------------------------------------------------------------------- plan
PLAN = [
    "plan",
    "--world",
    "64",
    "--pp",
    "2",
    "--dp-shard",
    "-1",
    "--cp",
    "2",
    "--tp",
    "4",
    "--ep",
    "4",
]


def test_plan_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*PLAN, "--ranks-per-host", "8", "--rank", "13"], capsys)
    assert code == 0 and err == ""
    assert "dp_shard=4" in out and "efsdp=8" in out
    assert "16/16 groups span 4 hosts" in out  # dp_shard groups cross hosts
    assert "rank 13:" in out and "[12, 13, 14, 15]" in out
    assert ".. 25 more .." in out  # pp's 32 groups abridged
    code, out, _ = run([*PLAN, "--all-groups"], capsys)
    assert ".. 25 more .." not in out and "[31, 63]" in out


def test_plan_json_matches_reference(capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json(
        [*PLAN, "--dp-replicate", "1", "--etp", "1", "--ranks-per-host", "8", "--rank", "13"],
        capsys,
    )
    degrees = {"pp": 2, "dp_replicate": 1, "dp_shard": 4, "cp": 2, "tp": 4, "ep": 4, "etp": 1}
    assert rep["schema"] == "meshlayout.plan/1"
    assert rep["degrees"] == {**degrees, "efsdp": 8} and rep["order"] == list(DENSE)
    assert rep["num_hosts"] == 8 and rep["rank"] == 13
    assert list(rep["views"]) == list(VIEW_DIMS)[:13]
    for name, v in rep["views"].items():
        groups = view_groups(64, degrees, None, None, name)
        assert v["groups"] == groups
        assert v["hosts_spanned"] == max(hosts_touched(g, 8) for g in groups)
        coord, group = view_rank(64, degrees, None, None, name, 13)
        assert v["rank"]["coordinate"] == coord and v["rank"]["group"] == group
        assert v["rank"]["group_index"] == groups.index(group)


def test_plan_order_and_view_filter(capsys: pytest.CaptureFixture[str]) -> None:
    order = "tp,pp,dp_replicate,dp_shard,cp"
    rep = run_json(
        [
            "plan",
            "--world",
            "16",
            "--dp-shard",
            "4",
            "--tp",
            "4",
            "--order",
            order,
            "--view",
            "tp",
            "--view",
            "fsdp,tp",
        ],
        capsys,
    )
    degrees = {"pp": 1, "dp_replicate": 1, "dp_shard": 4, "cp": 1, "tp": 4, "ep": 1, "etp": 1}
    assert list(rep["views"]) == ["tp", "fsdp"]
    for name in ("tp", "fsdp"):
        assert rep["views"][name]["groups"] == view_groups(
            16, degrees, order.split(","), None, name
        )
    assert rep["views"]["tp"]["groups"][0] == [0, 4, 8, 12]


def test_plan_svg_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg, html = tmp_path / "p.svg", tmp_path / "p.html"
    code, _, err = run(
        [*PLAN, "--rank", "13", "--ranks-per-host", "8", "--svg", str(svg), "--html", str(html)],
        capsys,
    )
    assert code == 0 and "wrote" in err
    root = ET.parse(svg).getroot()
    nested = root.findall(f"{NS}svg")
    # default: every view with groups > 1, views with identical groups drawn once
    assert len(nested) == 5  # pp, dp_shard (= batch), cp, tp (= ep), loss (= fsdp, hsdp, ...)
    cells = [e for e in root.iter(f"{NS}rect") if e.get("class") == "cell"]
    assert len(cells) == 64 * len(nested)
    page = html.read_text()
    assert "http" not in page and "<script" not in page and page.count("<svg") == len(nested)
    assert "<h2>dp_shard (same groups: batch)</h2>" in page  # one section per picture
    code, _, _ = run([*PLAN, "--view", "tp", "--svg", str(svg)], capsys)
    root = ET.parse(svg).getroot()
    groups = [e for e in root.iter(f"{NS}rect") if e.get("class") == "group"]
    assert len(root.findall(f"{NS}svg")) == 1 and len(groups) == 16


# ---------------------------------------------------------------------- mesh
def test_mesh_text_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["mesh", "--shape", "pp=2,dp=4,tp=8", "--rank", "13"], capsys)
    assert code == 0 and "rank 13: coordinate pp=0,dp=1,tp=5" in out and "[13]" in out
    rep = run_json(
        ["mesh", "--shape", "pp=2,dp=4,tp=8", "--ranks", "2048:2112", "--rank", "2061"], capsys
    )
    m = ModelMesh.root((2, 4, 8), ("pp", "dp", "tp"), np.arange(2048, 2112))
    assert rep["schema"] == "meshlayout.mesh/1" and rep["rank_map_range"] == [2048, 2112, 1]
    assert rep["groups"]["dp"] == m.groups(1).tolist()
    assert rep["rank"]["groups"]["tp"] == list(m.group(2061, 2))
    assert rep["rank"]["submesh"] == m.submesh(2061).tolist()


def test_mesh_operations_in_argv_order(capsys: pytest.CaptureFixture[str]) -> None:
    m = ModelMesh.root((2, 4, 8), ("pp", "dp", "tp"), np.arange(64))
    rep = run_json(
        ["mesh", "--shape", "pp=2,dp=4,tp=8", "--slice", "tp,pp", "--rank", "13"], capsys
    )
    assert rep["dims"] == ["tp", "pp"] and rep["num_submeshes"] == 4
    assert rep["submeshes"] == m.slice([2, 0]).submeshes().tolist()
    rep = run_json(["mesh", "--shape", "pp=2,dp=4,tp=8", "--flatten", "dp,tp=dp_tp"], capsys)
    want = m.flatten_dims([1, 2], "dp_tp")
    assert rep["dims"] == ["pp", "dp_tp"] and rep["groups"]["dp_tp"] == want.groups(1).tolist()
    rep = run_json(["mesh", "--shape", "pp=2,dp=4,tp=8", "--flatten", "tp,pp=x"], capsys)
    assert rep["dims"] == ["dp", "x"]  # placed where tp was, ranks in tp-then-pp order
    assert rep["groups"]["x"] == m.flatten_dims([2, 0], "x").groups(1).tolist()
    rep = run_json(
        ["mesh", "--shape", "dp=4,tp=2", "--unflatten", "dp=2x2:rep,shard", "--flatten", "world"],
        capsys,
    )
    assert rep["dims"] == ["world"] and [o["op"] for o in rep["operations"]] == [
        "unflatten",
        "flatten",
    ]
    rep = run_json(
        ["mesh", "--shape", "dp=4,tp=2", "--flatten", "world", "--unflatten", "world=2x4"], capsys
    )
    assert rep["dims"] == ["world0", "world1"]
    assert rep["groups"]["world1"] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    rep = run_json(["mesh", "--shape", "dp=2,tp=2", "--ranks", "3,1,2,0", "--rank", "1"], capsys)
    assert rep["rank"]["groups"]["tp"] == [3, 1] and rep["rank_map_range"] is None


def test_mesh_svg_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg, html = tmp_path / "m.svg", tmp_path / "m.html"
    code, _, _ = run(
        [
            "mesh",
            "--shape",
            "pp=2,dp=4,tp=8",
            "--view",
            "dp",
            "--rank",
            "9",
            "--svg",
            str(svg),
            "--html",
            str(html),
        ],
        capsys,
    )
    assert code == 0
    root = ET.parse(svg).getroot()
    assert sum(e.get("class") == "cell" for e in root.iter(f"{NS}rect")) == 64
    assert sum(e.get("class") == "group" for e in root.iter(f"{NS}rect")) == 16
    assert "http" not in html.read_text()


# ---------------------------------------------------------------------- shard
SHARD = ["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2"]


def test_shard_text_notes_torch(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*SHARD, "--placements", "SS(0,2),S(0)"], capsys)
    assert code == 0 and "dim 0 <- tp then dp" in out
    assert "DIFFERS" in out and "note: torch 2.13" in out and "ranks [4, 5]" in out
    code, out, _ = run(["shard", "--shape", "8", "--mesh", "2", "--placements", "SS(0,2)"], capsys)
    assert "not decodable" in out and "[0:2)+[4:6)" in out and "NO" in out


def test_shard_json_matches_reference(capsys: pytest.CaptureFixture[str]) -> None:
    rep = run_json([*SHARD, "--placements", "[StridedShard(0, 2), Shard(dim=0)]"], capsys)
    placements = [StridedShard(0, 2), Shard(0)]
    assert rep["schema"] == "meshlayout.shard/1" and rep["decodable"] is True
    assert rep["shard_order"] == {"0": ["tp", "dp"]} and rep["torch_disagrees"] == [4, 5]
    for r in rep["ranks"]:
        coord = divmod(r["rank"], 2)
        rows, cols = reference_indices((7, 4), (3, 2), placements, coord)
        want = [[[int(x[0]), int(x[-1]) + 1]] if len(x) else [] for x in (rows, cols)]
        assert r["runs"] == want and r["is_box"]
        assert r["local_shape"] == [len(rows), len(cols)]
        assert r["global_offset"] == [int(rows[0]) if len(rows) else 7, 0]
    assert rep["ranks"][4]["torch"] == {
        "runs": [[[6, 7]], [[0, 4]]],
        "local_shape": [1, 4],
        "global_offset": [6, 0],
    }


def test_shard_order_flag(capsys: pytest.CaptureFixture[str]) -> None:
    by_order = run_json([*SHARD, "--shard-order", "0:tp,dp"], capsys)
    both = run_json([*SHARD, "--shard-order", "0:1,0", "--placements", "SS(0,2),S(0)"], capsys)
    assert by_order["ranks"] == both["ranks"] and by_order["placements"] == ["SS(0,2)", "S(0)"]
    code, _, err = run([*SHARD, "--shard-order", "0:dp,tp", "--placements", "SS(0,2),S(0)"], capsys)
    assert code == 2 and "shard order" in err


def test_shard_svg_html_and_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg, html = tmp_path / "s.svg", tmp_path / "s.html"
    code, _, _ = run(
        [
            *SHARD,
            "--ranks",
            "8:14",
            "--placements",
            "SS(0,2),S(0)",
            "--svg",
            str(svg),
            "--html",
            str(html),
        ],
        capsys,
    )
    assert code == 0
    root = ET.parse(svg).getroot()
    assert len(root.findall(f"{NS}svg")) == 2  # ours and torch's view (they differ)
    assert sum(e.get("class") == "cell" for e in root.iter(f"{NS}rect")) == 56
    assert "http" not in html.read_text()
    rep = run_json(
        ["shard", "--shape", "10,6", "--mesh", "dp=2,tp=2", "--placements", "S(0),P(max)"], capsys
    )
    assert rep["torch_disagrees"] == [] and rep["placements"] == ["S(0)", "P(max)"]


# ---------------------------------------------------------------------- errors and help
HUGE = "9223372036854775808"  # 2**63: one more than int64 holds
#: (argv, text the one-line error must contain: the flag and the bad value)
BAD = [
    (["plan", "--world", "64", "--tp", "3"], "--world 64 --tp 3"),  # non-dividing degrees
    (["plan", "--world", "64", "--tp", "4", "--ep", "3"], "--ep 3"),
    (["plan", "--world", "64", "--view", "nope"], "--view"),  # unknown view
    (["plan", "--world", "64", "--rank", "64"], "--rank 64"),  # rank outside the world
    (["plan", "--world", "64", "--order", "pp,tp"], "--order 'pp,tp'"),
    (["plan", "--world", "0"], "--world"),
    (["plan", "--world", "8", "--dp-shard", "0"], "--dp-shard"),
    (["plan", "--world", HUGE], f"--world: {HUGE}"),
    (["plan", "--world", "8", "--rank", "-1"], "--rank"),
    (["plan", "--world", "8", "--svg", ""], "--svg"),
    (["plan", "--world", "8", "--html", " "], "--html"),
    (["plan", "--world", "8", "--tp", "9" * 5000], "--tp"),  # past Python's int() digit limit
    (["plan"], "--world"),  # missing --world
    (
        ["plan", "--world", "12", "--tp", "2", "--ranks-per-host", "8"],
        "--ranks-per-host 8 does not divide --world 12: the last host would hold 4 of 8 ranks",
    ),
    (["mesh", "--shape", "pp=2,dp"], "--shape"),  # malformed --shape
    (["mesh", "--shape", "pp=0"], "--shape"),
    (["mesh", "--shape", f"a={HUGE}"], HUGE),
    (["mesh", "--shape", "a=4611686018427387904,b=2"], "--shape"),  # product overflows int64
    (["mesh", "--shape", "a=2", "--ranks", "0:99999999999999999999"], "--ranks '0:9999"),
    (["mesh", "--shape", "a=2", "--ranks", "0:2:0"], "--ranks '0:2:0'"),
    (["mesh", "--shape", "a=2", "--ranks", "4:2"], "--ranks '4:2'"),
    (["mesh", "--shape", "a=2", "--ranks", "0:4"], "--ranks '0:4'"),
    (["mesh", "--shape", "a=2", "--ranks", f"0,{HUGE}"], HUGE),
    (["mesh", "--shape", "pp=2,tp=2", "--rank", "9"], "--rank 9"),
    (["mesh", "--shape", "pp=2,tp=2", "--slice", "xx"], "--slice 'xx'"),
    (["mesh", "--shape", "pp=2,tp=2", "--flatten", "pp,xx=f"], "--flatten 'pp,xx=f'"),
    (["mesh", "--shape", "pp=2,tp=2", "--view", "xx"], "--view 'xx'"),
    (["mesh", "--shape", "pp=2,tp=4", "--unflatten", "tp=3x2"], "--unflatten 'tp=3x2'"),
    (["mesh", "--shape", "pp=2,tp=4", "--ranks", "0:3"], "--ranks '0:3'"),
    (["mesh", "--shape", "pp=2,tp=2", "--ranks", "1,1,2,3"], "--ranks '1,1,2,3'"),
    (["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2", "--placements", "S(0"], "--placements"),
    (["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2", "--placements", "Q(0),S(0)"], "'Q(0)'"),
    (["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2", "--placements", "S(0)"], "'S(0)'"),
    (["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2", "--placements", "S(2),R"], "'S(2),R'"),
    (["shard", "--shape", "7,x", "--mesh", "dp=3", "--placements", "R"], "--shape"),
    (["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2"], "--placements"),
    (["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2", "--shard-order", "0:zz"], "'0:zz'"),
    (["shard", "--shape", "7", "--mesh", "dp=3,tp=0", "--placements", "R,R"], "--mesh"),
    (["shard", "--shape", "7", "--mesh", "", "--placements", "R"], "--mesh: "),
    (["shard", "--shape", "7", "--mesh", "2", "--placements", f"S({HUGE})"], HUGE),
    (["shard", "--shape", "7", "--mesh", "2", "--placements", "SS(0,0)"], "split_factor"),
    (
        ["shard", "--shape", "7,4", "--mesh", "dp=3,tp=2", "--shard-order", "0:tp;-2:dp"],
        "--shard-order '0:tp;-2:dp'",  # a negative tensor dim aliasing a positive one
    ),
    (["nope"], "nope"),
    ([], "choose a command"),
]


@pytest.mark.parametrize("argv,names", BAD, ids=[" ".join(a)[:60] or "(none)" for a, _ in BAD])
def test_bad_arguments_one_line_exit_2(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "error" in err and names in err, err


def test_mesh_shape_errors_blame_mesh_not_shape(capsys: pytest.CaptureFixture[str]) -> None:
    for bad in ("dp=3,tp=0", "", "dp=3,dp=2"):
        code, _, err = run(["shard", "--shape", "7", "--mesh", bad, "--placements", "R"], capsys)
        assert code == 2 and "--mesh" in err and "--shape" not in err, err


def test_an_internal_error_is_not_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bug (here a render function raising ValueError) keeps its traceback."""
    import meshlayout.render as render

    def broken(*args: object, **kwargs: object) -> str:
        raise ValueError("an internal bug")

    monkeypatch.setattr(render, "plan_text", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["plan", "--world", "8"])
    monkeypatch.setattr(render, "mesh_report", broken)
    with pytest.raises(ValueError, match="an internal bug"):
        main(["mesh", "--shape", "2"])


def test_error_lines_escape_control_characters(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (
        ["mesh", "--shape", "a\nb=2"],
        ["plan", "--world", "8", "un\nknown"],
        ["mesh", "--shape", "a=2", "--slice", "b\nc"],
    ):
        code, out, err = run(argv, capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err


def test_unwritable_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for flag, path in [("--svg", "/nonexistent/dir/x.svg"), ("--html", str(tmp_path))]:
        code, out, err = run([*PLAN, flag, path], capsys)
        assert code == 2 and out == "" and "cannot write" in err and flag in err, err
        assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "demo"])
def test_help_shows_examples(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([name, "--help"], capsys)
    assert code == 0 and "examples:" in out and f"meshlayout {name} --" in out


def test_top_level_help_and_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0 and all(n in out for n in COMMANDS)
    code, out, _ = run(["demo", "--nproc", "2", "--steps", "2"], capsys)
    assert code == 0 and out


def test_placement_grammar() -> None:
    assert parse_placements("S(0), SS(1,3), R, P, P(max)") == [
        Shard(0),
        StridedShard(1, 3),
        Replicate(),
        Partial(),
        Partial("max"),
    ]
    assert parse_placements(
        "Shard(0),StridedShard(0, split_factor=2),Replicate(),Partial('avg')"
    ) == [
        Shard(0),
        StridedShard(0, 2),
        Replicate(),
        Partial("avg"),
    ]
    for bad in ("S()", "SS(0)", "R(1)", "P(foo)", "S(0),,R", "SS(0,0)"):
        with pytest.raises(ArgError):
            parse_placements(bad)


# ---------------------------------------------------------------------- subprocess, once each
@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "--world", "8", "--tp", "2", "--format", "json"],
        ["mesh", "--shape", "dp=2,tp=2", "--format", "json"],
        ["shard", "--shape", "4", "--mesh", "2", "--placements", "S(0)", "--format", "json"],
        ["demo", "--nproc", "2", "--steps", "1"],
    ],
)
def test_subprocess(argv: list[str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "meshlayout.cli", *argv],
        capture_output=True,
        text=True,
        timeout=900,  # a guard against a hang, not a speed check (the machine may be loaded)
    )
    assert proc.returncode == 0, proc.stderr
    if "json" in argv:
        json.loads(proc.stdout)


def test_subprocess_error_has_no_traceback() -> None:
    exe = Path(sys.executable).with_name("meshlayout")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "meshlayout.cli"]
    proc = subprocess.run(
        [*cmd, "plan", "--world", "64", "--tp", "3"], capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert (
        proc.stderr.strip()
        == "meshlayout plan: error: " + proc.stderr.strip().split(": error: ", 1)[1]
    )


# ---------------------------------------------------------------------- huge worlds and limits
TIB = 2**40  # ranks


def _lines_with(out: str, start: str) -> list[str]:
    return [line.strip() for line in out.splitlines() if line.strip().startswith(start)]


def test_huge_mesh_text_is_abridged_in_bounded_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """``mesh --shape 1048576,1048576`` (2**40 ranks) answers per rank, in bounded memory."""
    import tracemalloc

    tracemalloc.start()
    try:
        code, out, err = run(["mesh", "--shape", "1048576,1048576", "--rank", str(TIB - 3)], capsys)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 0 and err == "", err
    assert peak < 64 * 2**20  # no O(world) allocation (2**40 ranks would be 8 TiB)
    assert "rank map    range(0, 1099511627776)" in out
    n, r = 2**20, TIB - 3
    # dim0 groups are columns (stride 2**20), dim1 groups rows; rank r's by arithmetic
    assert f"dim0  [{r % n}, {r % n + n}, .., {r}] ({n} ranks)" in out
    assert f"dim1  [{r - r % n}, {r - r % n + 1}, .., {r - r % n + n - 1}] ({n} ranks)" in out
    assert f"dim0 ({n} groups of {n}): [0, {n}, .., {TIB - n}] ({n} ranks); [1, " in out
    assert "grid omitted" in out


def test_huge_plan_text_per_rank(capsys: pytest.CaptureFixture[str]) -> None:
    r = 123_456_789
    code, out, err = run(["plan", "--world", str(TIB), "--tp", "8", "--rank", str(r)], capsys)
    assert code == 0 and err == ""
    base = r - r % 8
    tp = [f"{base + i}" for i in range(8)]
    mine = out.split(f"rank {r}:")[1]
    (tp_line,) = _lines_with(mine, "tp ")
    assert tp_line.split()[1:3] == [f"tp={r % 8}", str(r // 8)]
    assert tp_line.endswith("[" + ", ".join(tp) + "]")
    (fsdp,) = _lines_with(mine, "fsdp ")
    assert fsdp.endswith(f"[{r % 8}, {r % 8 + 8}, .., {TIB - 8 + r % 8}] ({TIB // 8} ranks)")
    assert f".. {TIB // 8 - 7} more .." in out  # tp: first six and the last of 2**37 groups
    last = TIB // 8 - 1
    assert f"{last}: [{TIB - 8}, {TIB - 7}, " in out


@pytest.mark.parametrize(
    "argv,flag",
    [
        (["plan", "--world", str(TIB), "--tp", "8", "--format", "json"], "--format json"),
        (["plan", "--world", str(TIB), "--all-groups"], "--all-groups"),
        (["plan", "--world", str(TIB), "--ranks-per-host", "8"], "--ranks-per-host 8"),
        (["plan", "--world", str(TIB), "--svg", "x.svg"], "--svg 'x.svg'"),
        (["plan", "--world", str(TIB), "--order", "tp,pp,dp_replicate,dp_shard,cp"], "--order"),
        (["mesh", "--shape", "1048576,1048576", "--format", "json"], "--format json"),
        (["mesh", "--shape", "1048576,1048576", "--html", "x.html"], "--html 'x.html'"),
        (["shard", "--shape", "10", "--mesh", "1048576,1048576", "--placements", "R,R"], "--mesh"),
        (
            ["shard", "--shape", str(10**12), "--mesh", "2", "--placements", f"SS(0,{10**12})"],
            "--shape",
        ),
    ],
)
def test_huge_answers_are_refused_naming_the_flag(
    argv: list[str],
    flag: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert flag in err and "limit" in err, err
    assert list(tmp_path.iterdir()) == []


def test_limit_both_sides_at_the_real_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """Host counts over one view: allowed at exactly LIST_LIMIT ranks, refused just above."""
    from meshlayout.render import LIST_LIMIT

    at = ["plan", "--world", str(LIST_LIMIT), "--tp", "8", "--view", "tp", "--ranks-per-host", "8"]
    code, out, err = run(at, capsys)
    assert code == 0 and err == "" and "every group in one host" in out
    above = ["plan", "--world", str(LIST_LIMIT + 8), "--tp", "8", "--view", "tp"]
    code, out, err = run([*above, "--ranks-per-host", "8"], capsys)
    assert code == 2 and "--ranks-per-host 8" in err and str(LIST_LIMIT) in err
    code, out, err = run(above, capsys)  # text without host counts: any size
    assert code == 0 and err == ""


@pytest.mark.parametrize(
    "argv,limit",
    [
        (["plan", "--world", "16", "--tp", "4", "--format", "json"], 13 * 16),  # 13 views x 16
        (["plan", "--world", "16", "--tp", "4", "--view", "tp", "--format", "json"], 16),
        (["plan", "--world", "16", "--tp", "4", "--view", "tp,fsdp", "--svg", "p.svg"], 2 * 16),
        (
            ["mesh", "--shape", "4,4", "--format", "json"],
            16 * (2 + 2),
        ),  # rank map, sub-meshes, groups
        (["mesh", "--shape", "4,4", "--svg", "m.svg"], 16),
        (["shard", "--shape", "8,8", "--mesh", "4,4", "--placements", "S(0),S(1)"], 16 * 2),
        (["shard", "--shape", "8", "--mesh", "2", "--placements", "SS(0,4)"], 2 * 4),
    ],
)
def test_limit_both_sides(
    argv: list[str],
    limit: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each answer is allowed at exactly the limit and refused one below it."""
    import meshlayout.render.reports as reports

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(reports, "LIST_LIMIT", limit)
    code, out, err = run(argv, capsys)
    assert code == 0, err
    monkeypatch.setattr(reports, "LIST_LIMIT", limit - 1)
    code, out, err = run(argv, capsys)
    assert code == 2 and out == "" and "limit" in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------- plan --megatron-order
MEGATRON = ["plan", "--world", "32", "--tp", "2", "--cp", "2", "--pp", "2", "--ep", "4"]
MEGATRON += ["--etp", "1", "--megatron-order", "tp-cp-ep-dp-pp"]
#: (world, tp, cp, pp, ep, etp or None, order): default and non-default orders, left-out
#: dims, pp not last, expert dims striding over dense ones.
MEGATRON_CONFIGS = [
    (32, 2, 2, 2, 4, 1, "tp-cp-ep-dp-pp"),
    (16, 2, 1, 2, 4, 1, "tp-ep-dp-pp"),
    (32, 2, 2, 2, 2, None, "tp-pp-cp-ep-dp"),
    (32, 2, 2, 2, 1, 4, "tp-cp-pp-ep-dp"),
    (16, 2, 2, 1, 2, 1, "cp-tp-ep-dp"),
    (8, 2, 1, 2, 1, None, "tp-dp-pp"),
    (24, 2, 1, 3, 2, 1, "ep-tp-dp-pp"),
    (16, 1, 2, 1, 4, 2, "dp-ep-tp-cp-pp"),
]
#: Megatron's distributed-optimizer splits: the same groups, created in another order.
SPLIT_VIEWS = ("intra_dp_cp", "intra_edp", "inter_edp")


def _megatron_argv(cfg: tuple[int, int, int, int, int, int | None, str]) -> list[str]:
    world, tp, cp, pp, ep, etp, order = cfg
    argv = ["plan", "--world", str(world), "--tp", str(tp), "--cp", str(cp), "--pp", str(pp)]
    argv += ["--ep", str(ep), "--megatron-order", order]
    return argv + ([] if etp is None else ["--etp", str(etp)])


def test_plan_megatron_text(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run([*MEGATRON, "--ranks-per-host", "8", "--rank", "5"], capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == "MegatronDims(32, tp=2, cp=2, dp=4, pp=2, ep=4, etp=1)  ->  edp=4"
    assert lines[1] == "order tp-cp-ep-dp-pp (innermost first); 8 ranks per host, 4 hosts"
    assert lines[3].split()[:5] == ["view", "shape", "size", "groups", "hosts"]
    rows = lines[4 : 4 + len(MEGATRON_PURPOSES)]
    assert [r.split()[0] for r in rows] == list(MEGATRON_PURPOSES)
    assert all(r.endswith(MEGATRON_PURPOSES[r.split()[0]]) for r in rows)
    # rank 5's groups, as docs/megatron.md gives them (checked there against Megatron-Core)
    mine = {ln.split()[0]: ln for ln in out.split("\nrank 5:\n")[1].splitlines()[1:]}
    assert mine["dp"].endswith("[1, 5, 9, 13] *") and mine["ep"].endswith("[4, 5, 6, 7]")
    assert mine["dp_cp"].endswith("[1, 3, 5, 7, 9, 11, 13, 15] *")
    assert mine["tp_ep_pp"].endswith("[4, 5, 6, 7, 20, 21, 22, 23] *")
    assert "  ep: 8 groups of 4: the same groups as tp_cp" in out
    assert "ParallelDims" not in out and "efsdp" not in out


@pytest.mark.parametrize("cfg", MEGATRON_CONFIGS, ids=[c[-1] for c in MEGATRON_CONFIGS])
def test_plan_megatron_json_is_megatrons_grid(
    cfg: tuple[int, int, int, int, int, int | None, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Every token view against Megatron's rank rule by brute force; all against MegatronDims."""
    world, tp, cp, pp, ep, etp, order = cfg
    rank = world - 3
    rep = run_json([*_megatron_argv(cfg), "--rank", str(rank), "--ranks-per-host", "4"], capsys)
    md = MegatronDims(world, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, order=order)
    assert (rep["kind"], rep["dims"], rep["world_size"]) == ("MegatronDims", repr(md), world)
    assert rep["degrees"]["etp"] == (tp if etp is None else etp)  # Megatron's default: tp
    assert rep["degrees"]["dp"] * tp * cp * pp == world
    assert "-".join(reversed(rep["order"])).startswith(order)  # the full order, innermost first
    assert list(rep["views"]) == list(md.views())
    innermost_first = list(reversed(rep["order"]))
    for name, v in rep["views"].items():
        groups, spec = v["groups"], MEGATRON_VIEWS[name]
        ours = md.groups(name).tolist()
        assert groups == (sorted(ours) if name in SPLIT_VIEWS else ours), name
        if spec.token:
            assert groups == token_groups(
                world, rep["degrees"], innermost_first, spec.grid, spec.token
            )
        assert sorted(r for g in groups for r in g) == list(range(world))
        assert v["hosts_spanned"] == max(len({r // 4 for r in g}) for g in groups)
        me = v["rank"]
        assert groups[me["group_index"]] == me["group"] and rank in me["group"]


@pytest.mark.skipif(
    not megatron_available(),
    reason="megatron-core is not installed (the megatron extra)",
)
def test_plan_megatron_groups_are_megatron_cores(capsys: pytest.CaptureFixture[str]) -> None:
    """The command's groups, for every config above, against Megatron-Core's own groups."""
    cfgs = [config(w, tp, cp, pp, ep, etp, o) for w, tp, cp, pp, ep, etp, o in MEGATRON_CONFIGS]
    _, results = run_reference(sorted(cfgs, key=lambda c: c["world"]))
    by_config = {
        json.dumps(c, sort_keys=True): r
        for c, r in zip(sorted(cfgs, key=lambda c: c["world"]), results)
    }
    reused = {  # Megatron reuses these groups when there is one optimizer instance
        "intra_dp_cp": "DATA_PARALLEL_GROUP_WITH_CP",
        "intra_edp": "EXPERT_DATA_PARALLEL_GROUP",
    }
    compared = 0
    for cfg, c in zip(MEGATRON_CONFIGS, cfgs):
        result = by_config[json.dumps(c, sort_keys=True)]
        assert result["error"] is None, (cfg, result["error"])
        theirs_by_desc: dict[str, list[list[int]]] = result["groups"]
        rep = run_json(_megatron_argv(cfg), capsys)
        for name, v in rep["views"].items():
            desc = MEGATRON_VIEWS[name].group_desc
            theirs = theirs_by_desc.get(desc) or theirs_by_desc.get(reused.get(name, ""))
            if theirs is None:  # only the inter-instance split may be absent with one instance
                assert name == "inter_edp" and v["group_size"] == 1, (cfg, name)
                continue
            want = sorted(theirs) if name in SPLIT_VIEWS else theirs
            assert v["groups"] == want, (cfg, name)
            compared += len(theirs)
    assert compared > 500


def test_plan_megatron_views_and_pictures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rep = run_json(
        [*MEGATRON, "--view", "dp-cp,model_parallel,TP,dp_cp", "--view", "etp_ep"], capsys
    )
    assert list(rep["views"]) == ["dp_cp", "mp", "tp", "tp_ep"]  # spellings, deduplicated
    svg, html = tmp_path / "m.svg", tmp_path / "m.html"
    argv = [*MEGATRON, "--view", "ep,dp", "--rank", "5", "--svg", str(svg), "--html", str(html)]
    code, out, _ = run(argv, capsys)
    assert code == 0 and out.startswith("MegatronDims(32")
    root = ET.parse(svg).getroot()
    pictures = root.findall(f"{NS}svg")
    assert len(pictures) == 2
    heads = [next(p.iter(f"{NS}text")).text or "" for p in pictures]
    assert heads == [
        "ep: expert parallel: token dispatch / combine all-to-all",
        "dp: data parallel: ranks that read different samples",
    ]
    page = html.read_text()
    assert "meshlayout plan: MegatronDims(32, tp=2, cp=2, dp=4, pp=2, ep=4, etp=1)" in page
    # by default: every view with groups > 1, views with the same groups drawn once
    code, _, _ = run([*MEGATRON, "--svg", str(svg)], capsys)
    heads = [
        next(p.iter(f"{NS}text")).text or "" for p in ET.parse(svg).getroot().findall(f"{NS}svg")
    ]
    want = ["tp", "cp", "dp (same groups: edp, intra_edp)", "pp",
            "dp_cp (same groups: intra_dp_cp)", "tp_cp (same groups: ep, tp_ep)"]  # fmt: skip
    assert len(heads) == 11 and all(h.startswith(f"{w}: ") for h, w in zip(heads, want)), heads


def test_plan_etp_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    """--etp: 1 for ParallelDims (torchtitan), the tp size with --megatron-order (Megatron)."""
    base = ["plan", "--world", "16", "--tp", "4", "--ep", "2"]
    assert run_json(base, capsys)["degrees"]["etp"] == 1
    rep = run_json([*base, "--megatron-order", "tp-cp-ep-dp-pp"], capsys)
    assert rep["degrees"]["etp"] == 4 and rep["degrees"]["edp"] == 2


#: (argv after "plan", text the one-line error must contain)
MEGATRON_BAD = [
    (["--world", "16", "--tp", "2", "--cp", "2", "--megatron-order", "tp-dp-pp"],
     "--world 16 --tp 2 --cp 2 --megatron-order 'tp-dp-pp': order 'tp-dp-pp' leaves out 'cp'"),
    (["--world", "16", "--megatron-order", "tp-dp", "--dp-shard", "4"],
     "--megatron-order 'tp-dp' cannot be combined with --dp-shard 4"),
    (["--world", "16", "--megatron-order", "tp-dp", "--dp-replicate", "1"], "--dp-replicate 1"),
    (["--world", "16", "--megatron-order", "tp-dp", "--order", "pp,tp"], "--order 'pp,tp'"),
    (["--world", "16", "--megatron-order", "tp-xx"], "--megatron-order 'tp-xx': order 'tp-xx'"),
    (["--world", "16", "--megatron-order", ""], "--megatron-order ''"),
    (["--world", "16", "--megatron-order", "tp-tp"], "repeated ['tp']"),
    (["--world", "16", "--tp", "3", "--megatron-order", "tp-dp"], "--world 16 --tp 3"),
    (["--world", "16", "--ep", "2", "--etp", "3", "--megatron-order", "tp-dp"], "--etp 3"),
    (["--world", "16", "--tp", "2", "--pp", "2", "--etp", "1", "--megatron-order", "tp-pp-dp"],
     "--etp 1 --megatron-order 'tp-pp-dp': order 'tp-pp-dp' does not end with pp"),
    (["--world", "16", "--megatron-order", "tp-dp", "--view", "fsdp"],
     "--view: unknown view 'fsdp'; valid views are tp, cp, dp"),
    (["--world", "16", "--view", "dp_cp"], "--view: unknown view 'dp_cp'"),  # not ParallelDims'
    (["--world", "16", "--megatron-order", "tp-dp", "--rank", "16"], "--rank 16"),
]  # fmt: skip


@pytest.mark.parametrize(
    "argv,names", MEGATRON_BAD, ids=[" ".join(a)[-40:] for a, _ in MEGATRON_BAD]
)
def test_plan_megatron_errors_one_line_exit_2(
    argv: list[str], names: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["plan", *argv], capsys)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshlayout plan: error: "), err
    assert names in lines[0], lines[0]


DOCS = Path(__file__).resolve().parent.parent / "docs"


def _doc_plan_commands(page: str) -> list[tuple[list[str], str]]:
    """Every ``$ meshlayout plan ... --megatron-order ...`` block of a docs page, with its output."""
    text = (DOCS / page).read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n\$ meshlayout (plan .*?)\n(.*?)```", text, re.S)
    return [(shlex.split(cmd), out) for cmd, out in blocks if "--megatron-order" in cmd]


@pytest.mark.parametrize("page", ["cli.md", "megatron.md"])
def test_docs_megatron_plan_output_is_what_the_command_prints(
    page: str, capsys: pytest.CaptureFixture[str]
) -> None:
    commands = _doc_plan_commands(page)
    assert len(commands) == 1
    for argv, want in commands:
        code, out, err = run(argv, capsys)
        assert code == 0 and err == ""
        assert out == want
