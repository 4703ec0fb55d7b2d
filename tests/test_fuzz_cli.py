"""Fuzz the ``meshlayout`` command: thousands of random command lines, in-process.

Every command line mixes the flags of ``plan``, ``mesh`` or ``shard`` with
plausible and hostile values (huge, negative, empty, junk, unicode, control
characters, int64 overflow, products that overflow). Each must either exit 0
with an answer that is correct (checked against the brute-force references of
tests/*_reference.py where the answer is small enough to check, and for
consistency always), or exit 2 with exactly one line on stderr and no traceback.
An exception escaping ``main`` fails the test: it is a bug.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_grid_reference import token_groups
from meshlayout.cli import main
from meshlayout.cli.args import parse_placements
from meshlayout.megatron import ALIASES, MEGATRON_VIEWS, ORDER_TOKENS
from parallel_dims_reference import VIEW_DIMS
from report_reference import view_groups
from sharding_reference import reference_indices

FUZZ = settings(
    max_examples=700,
    deadline=None,
    derandomize=True,  # the same command lines on every run: a stable suite
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
DENSE = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
VIEW_NAMES = list(VIEW_DIMS)[:13]

HOSTILE_VALUES = [
    "",
    " ",
    "-1",
    "0",
    "-0",
    "+3",
    "1.5",
    "1e3",
    "0x10",
    "nan",
    "inf",
    "abc",
    "١٢",  # Arabic-Indic digits
    "２",  # fullwidth digit
    "²",
    "δp",
    "a\nb",
    "\t",
    "\x00",
    "\udcff",  # an undecodable argv byte (surrogateescape)
    str(2**63 - 1),
    str(2**63),
    str(2**64),
    str(-(2**63) - 1),
    "9" * 50,
    "9" * 5000,
    "4611686018427387904",
    "1099511627776",
    ",",
    "=",
    ":",
    ";",
    "(",
    ")",
    "[]",
    "x" * 300,
]
HOSTILE = st.sampled_from(HOSTILE_VALUES)


def hostile_or(draw: st.DrawFn, plausible: str, odds: int = 10) -> str:
    """``plausible``, or (one time in ``odds``) a hostile value instead."""
    return draw(HOSTILE) if draw(st.integers(0, odds - 1)) == odds - 1 else plausible


def add(draw: st.DrawFn, argv: list[str], flag: str, v: str) -> None:
    """``--flag value`` or ``--flag=value`` (the only form argparse takes for ``-1``)."""
    argv += [f"{flag}={v}"] if v.startswith("-") or draw(st.booleans()) else [flag, v]


@st.composite
def outputs(draw: st.DrawFn, tmp: Path) -> list[str]:
    argv: list[str] = []
    kind = draw(st.sampled_from(["text", "text", "json", "json", "svg", "html", "bad"]))
    if kind == "json":
        argv = ["--format", "json"]
    elif kind in ("svg", "html"):
        path = draw(st.sampled_from([str(tmp / "out.svg"), str(tmp / "out.svg"), "", str(tmp)]))
        add(draw, argv, f"--{kind}", path)
    elif kind == "bad":
        add(draw, argv, draw(st.sampled_from(["--format", "--svg", "--html"])), draw(HOSTILE))
    return argv


@st.composite
def stray(draw: st.DrawFn, argv: list[str]) -> list[str]:
    """Now and then a stray hostile token, or a required flag dropped."""
    roll = draw(st.integers(0, 29))
    if roll == 29:
        argv.insert(draw(st.integers(1, len(argv))), draw(HOSTILE))
    elif roll == 28 and len(argv) > 2:
        del argv[1:3]
    return argv


@st.composite
def megatron_plan_argv(draw: st.DrawFn, tmp: Path) -> list[str]:
    """``plan --megatron-order``: Megatron's sizes and order strings, now and then refused ones."""
    sizes = {n: draw(st.sampled_from([1, 1, 2, 2, 3, 4])) for n in ("tp", "cp", "pp", "dp")}
    world = math.prod(sizes.values())
    expert_region = world // sizes["pp"]  # etp * ep * edp
    sizes["ep"] = draw(st.sampled_from([d for d in (1, 2, 4) if expert_region % d == 0]))
    etps = [d for d in (1, 2, 4) if expert_region // sizes["ep"] % d == 0]
    etp = draw(st.sampled_from([None, *etps, 3]))  # 3: mostly not dividing (refused)
    argv = ["plan"]
    add(draw, argv, "--world", hostile_or(draw, str(world)))
    for n in ("tp", "cp", "pp", "ep"):
        if sizes[n] != 1 or draw(st.integers(0, 4)) == 4:
            add(draw, argv, f"--{n}", hostile_or(draw, str(sizes[n])))
    if etp is not None:
        add(draw, argv, "--etp", hostile_or(draw, str(etp)))
    # name every dim of size > 1 on either grid (now and then not: refused), others maybe
    etp_size = sizes["tp"] if etp is None else etp
    edp = expert_region // max(sizes["ep"] * etp_size, 1)
    big = {"tp": max(sizes["tp"], etp_size), "dp": max(sizes["dp"], edp)}
    kept = [
        t
        for t in draw(st.permutations(ORDER_TOKENS))
        if big.get(t, sizes.get(t, 1)) > 1 or draw(st.integers(0, 2)) > 0
    ]
    if kept and draw(st.integers(0, 9)) == 0:
        kept.pop(draw(st.integers(0, len(kept) - 1)))
    add(draw, argv, "--megatron-order", hostile_or(draw, "-".join(kept)))
    if draw(st.integers(0, 9)) == 0:  # ParallelDims' own flags: refused
        flag = draw(st.sampled_from(["--dp-shard", "--dp-replicate", "--order"]))
        add(draw, argv, flag, "pp,tp" if flag == "--order" else "2")
    if draw(st.booleans()):
        add(draw, argv, "--rank", hostile_or(draw, str(draw(st.integers(0, world)))))
    if draw(st.integers(0, 2)) == 0:
        add(draw, argv, "--ranks-per-host", str(draw(st.sampled_from([1, 2, 4, 8]))))
    if draw(st.integers(0, 2)) == 0:
        names = [*MEGATRON_VIEWS, *ALIASES, "dp-cp", "tp-ep-pp", "fsdp"]
        views = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
        add(draw, argv, "--view", hostile_or(draw, ",".join(views)))
    if draw(st.integers(0, 4)) == 0:
        argv.append("--all-groups")
    return draw(stray(argv + draw(outputs(tmp))))


@st.composite
def plan_argv(draw: st.DrawFn, tmp: Path) -> list[str]:
    if draw(st.integers(0, 3)) == 0:
        return draw(megatron_plan_argv(tmp))
    degrees = {
        n: draw(st.sampled_from([1, 1, 2, 2, 3, 4]))
        for n in ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    }
    world = math.prod(degrees.values())
    region = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    etp = draw(st.sampled_from([d for d in range(1, region + 1) if region % d == 0]))
    ep = draw(st.sampled_from([d for d in range(1, region // etp + 1) if region // etp % d == 0]))
    if draw(st.integers(0, 9)) == 9:
        world = draw(st.sampled_from([world * 2, 1099511627776, 2**63 - 1, 7]))
    argv = ["plan"]
    add(draw, argv, "--world", hostile_or(draw, str(world)))
    if draw(st.booleans()):
        degrees["dp_shard"] = -1
    for n, v in [*degrees.items(), ("ep", ep), ("etp", etp)]:
        if v != 1 or draw(st.integers(0, 4)) == 4:
            add(draw, argv, "--" + n.replace("_", "-"), hostile_or(draw, str(v)))
    if draw(st.integers(0, 3)) == 0:
        add(draw, argv, "--order", hostile_or(draw, ",".join(draw(st.permutations(DENSE)))))
    if draw(st.integers(0, 2)) == 0:
        add(
            draw,
            argv,
            "--ranks-per-host",
            hostile_or(draw, str(draw(st.sampled_from([1, 2, 4, 8, 16])))),
        )
    if draw(st.booleans()):
        add(draw, argv, "--rank", hostile_or(draw, str(draw(st.integers(0, world)))))
    if draw(st.integers(0, 2)) == 0:
        views = draw(st.lists(st.sampled_from([*VIEW_NAMES, "nope"]), min_size=1, max_size=3))
        add(draw, argv, "--view", hostile_or(draw, ",".join(views)))
    if draw(st.integers(0, 4)) == 0:
        argv.append("--all-groups")
    return draw(stray(argv + draw(outputs(tmp))))


@st.composite
def mesh_argv(draw: st.DrawFn, tmp: Path) -> list[str]:
    sizes = draw(st.lists(st.sampled_from([1, 2, 2, 3, 4]), min_size=1, max_size=4))
    names = draw(st.sampled_from([None, ["a", "b", "c", "d"], ["pp", "dp", "cp", "tp"]]))
    shape = (
        ",".join(map(str, sizes))
        if names is None
        else ",".join(f"{n}={s}" for n, s in zip(names, sizes))
    )
    names = names[: len(sizes)] if names else [f"dim{i}" for i in range(len(sizes))]
    n = math.prod(sizes)
    argv = ["mesh"]
    add(draw, argv, "--shape", hostile_or(draw, shape))
    if draw(st.booleans()):
        start = draw(st.integers(0, 100))
        ranks = draw(
            st.sampled_from(
                [f"{start}:{start + n}", f"{start}:{start + 2 * n}:2", f"{start}:{start + n + 1}"]
            )
            | st.permutations(range(start, start + n)).map(lambda p: ",".join(map(str, p)))
        )
        add(draw, argv, "--ranks", hostile_or(draw, ranks))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["--slice", "--flatten", "--unflatten"]))
        dims = ",".join(draw(st.lists(st.sampled_from([*names, "zz"]), min_size=1, max_size=3)))
        if op == "--slice":
            v = dims
        elif op == "--flatten":
            v = draw(st.sampled_from(["w", f"{dims}=m", f"{dims}=m{len(argv)}"]))
        else:
            dim = draw(st.sampled_from([*names, "w", "m"]))
            v = draw(st.sampled_from([f"{dim}=1x{n}", f"{dim}=2x2", f"{dim}=2x2:u,v", f"{dim}=3"]))
        add(draw, argv, op, hostile_or(draw, v))
    if draw(st.booleans()):
        add(draw, argv, "--rank", hostile_or(draw, str(draw(st.integers(0, 110)))))
    if draw(st.integers(0, 3)) == 0:
        add(draw, argv, "--view", hostile_or(draw, ",".join(draw(st.permutations(names)))[:5]))
    return draw(stray(argv + draw(outputs(tmp))))


@st.composite
def shard_argv(draw: st.DrawFn, tmp: Path) -> list[str]:
    shape = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    names = ["dp", "cp", "tp"][: len(sizes)]
    nd = len(shape)
    placement = st.one_of(
        st.integers(-nd, nd - 1).map(lambda d: f"S({d})"),
        st.tuples(st.integers(-nd, nd - 1), st.integers(1, 6)).map(lambda t: f"SS({t[0]},{t[1]})"),
        st.sampled_from(["R", "P", "P(max)", "Replicate()", "Partial('avg')"]),
    )
    argv = ["shard"]
    add(draw, argv, "--shape", hostile_or(draw, ",".join(map(str, shape))))
    mesh = ",".join(f"{n}={s}" for n, s in zip(names, sizes))
    add(draw, argv, "--mesh", hostile_or(draw, mesh))
    if draw(st.integers(0, 4)) == 0:
        add(draw, argv, "--ranks", hostile_or(draw, f"8:{8 + math.prod(sizes)}"))
    kind = draw(st.sampled_from(["placements", "placements", "order", "both", "none"]))
    if kind in ("placements", "both"):
        ps = draw(st.lists(placement, min_size=len(sizes), max_size=len(sizes)))
        add(draw, argv, "--placements", hostile_or(draw, ",".join(ps)))
    if kind in ("order", "both"):
        used = draw(st.permutations([*names, *range(len(names))]))
        parts = []
        for _ in range(nd):
            k = draw(st.integers(0, 2))
            if k:
                parts.append(f"{draw(st.integers(-nd, nd - 1))}:{','.join(map(str, used[:k]))}")
                used = used[k:]
        add(draw, argv, "--shard-order", hostile_or(draw, ";".join(parts) or "0:dp"))
    return draw(stray(argv + draw(outputs(tmp))))


# ---------------------------------------------------------------------- the oracle
def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def check(argv: list[str]) -> None:
    code, out, err = run(argv)
    assert "Traceback" not in err, (argv, err)
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and ": error: " in lines[0], (argv, err)
        return
    assert code == 0, (argv, code, err)
    assert "error" not in err, (argv, err)
    assert out.strip() or "--help" in argv, argv
    if "json" in argv and out.lstrip().startswith("{"):
        report = json.loads(out)
        CHECKS[argv[0]](report)


def check_plan(rep: dict[str, Any]) -> None:
    world, degrees, order = rep["world_size"], rep["degrees"], rep["order"]
    megatron = rep["kind"] == "MegatronDims"
    for name, v in rep["views"].items():
        groups = v["groups"]
        assert len(groups) == v["num_groups"] and {len(g) for g in groups} == {v["group_size"]}
        assert sorted(r for g in groups for r in g) == list(range(world))  # a partition
        if world <= 512 and not megatron:
            assert groups == view_groups(world, degrees, order, None, name)
        elif world <= 512 and MEGATRON_VIEWS[name].token:  # Megatron's get_ranks(token)
            spec = MEGATRON_VIEWS[name]
            want = token_groups(world, degrees, order[::-1], spec.grid, spec.token)
            assert groups == want, name
        me = v["rank"]
        if me is not None:
            assert groups[me["group_index"]] == me["group"] and rep["rank"] in me["group"]


def check_mesh(rep: dict[str, Any]) -> None:
    ranks = sorted(rep["rank_map"])
    subs = np.asarray(rep["submeshes"])
    assert list(subs.shape) == [rep["num_submeshes"], *rep["shape"]]
    assert sorted(subs.reshape(-1).tolist()) == ranks
    for i, name in enumerate(rep["dims"]):
        groups = rep["groups"][name]
        assert sorted(r for g in groups for r in g) == ranks
        assert {len(g) for g in groups} == {rep["shape"][i]}
        # each group is a line of some sub-mesh along dim i
        lines = {
            tuple(x) for x in np.moveaxis(subs, 1 + i, -1).reshape(-1, rep["shape"][i]).tolist()
        }
        assert {tuple(g) for g in groups} == lines
    me = rep["rank"]
    if me is not None:
        assert all(me["rank"] in g for g in me["groups"].values())
        assert me["rank"] in np.asarray(me["submesh"]).reshape(-1).tolist()


def check_shard(rep: dict[str, Any]) -> None:
    shape, sizes = rep["global_shape"], rep["mesh"]["shape"]
    placements = parse_placements(",".join(rep["placements"]))
    if math.prod(sizes) > 64:
        return
    for r in rep["ranks"]:
        want = reference_indices(shape, sizes, placements, r["coordinate"])
        held = [[i for a, b in runs for i in range(a, b)] for runs in r["runs"]]
        assert held == [w.tolist() for w in want], (rep["placements"], r)


CHECKS = {"plan": check_plan, "mesh": check_mesh, "shard": check_shard}


# ---------------------------------------------------------------------- the tests
@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch directory, also the working directory: relative --svg names land there."""
    path = tmp_path_factory.mktemp("fuzz_cli")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(path)
        yield path


@FUZZ
@given(data=st.data())
def test_fuzz_plan(tmp: Path, data: st.DataObject) -> None:
    check(data.draw(plan_argv(tmp)))


@FUZZ
@given(data=st.data())
def test_fuzz_mesh(tmp: Path, data: st.DataObject) -> None:
    check(data.draw(mesh_argv(tmp)))


@FUZZ
@given(data=st.data())
def test_fuzz_shard(tmp: Path, data: st.DataObject) -> None:
    check(data.draw(shard_argv(tmp)))


@pytest.mark.parametrize("command", ["plan", "mesh", "shard"])
def test_hostile_value_for_every_flag(command: str, tmp: Path) -> None:
    """Each hostile value on each flag of each command: exit 0 or one line, never a traceback."""
    flags = {
        "plan": [
            "--world",
            "--pp",
            "--dp-shard",
            "--tp",
            "--ep",
            "--etp",
            "--order",
            "--megatron-order",
            "--rank",
            "--ranks-per-host",
            "--view",
            "--format",
            "--svg",
        ],
        "mesh": [
            "--shape",
            "--ranks",
            "--slice",
            "--flatten",
            "--unflatten",
            "--rank",
            "--view",
            "--format",
            "--html",
        ],
        "shard": ["--shape", "--mesh", "--ranks", "--placements", "--shard-order", "--format"],
    }[command]
    base = {
        "plan": ["plan", "--world", "8", "--tp", "2"],
        "mesh": ["mesh", "--shape", "a=2,b=2"],
        "shard": ["shard", "--shape", "4,4", "--mesh", "a=2,b=2", "--placements", "S(0),R"],
    }[command]
    for flag in flags:
        for bad in HOSTILE_VALUES:
            check([*base, flag, bad])
