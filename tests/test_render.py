"""meshlayout.render: reports against the brute-force references (tests/*_reference.py),
SVG structure, HTML self-containment, and the pure torch 2.13 model against torch itself."""

from __future__ import annotations

import itertools
import json
import math
import re
import xml.etree.ElementTree as ET
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mesh_reference import ModelMesh
from meshlayout import Mesh, ParallelDims
from meshlayout.parallel_dims import VIEWS
from meshlayout.render import (
    Section,
    html_page,
    mesh_picture,
    mesh_report,
    mesh_svg,
    mesh_text,
    plan_report,
    plan_text,
    same_groups,
    shard_report,
    sharding_picture,
    sharding_svg,
    stack,
    torch_local_shape_and_offset,
)
from meshlayout.sharding import Partial, Replicate, Shard, ShardingSpec, StridedShard
from parallel_dims_reference import VIEW_DIMS
from report_reference import hosts_touched, sample_of, shown_indices, view_groups, view_rank
from sharding_reference import brute_decode, literal_indices, reference_indices, shard_dims

NS = "{http://www.w3.org/2000/svg}"


def _svg(text: str) -> ET.Element:
    root = ET.fromstring(text)
    assert root.tag == f"{NS}svg"
    return root


def _count(root: ET.Element, tag: str, cls: str) -> int:
    return sum(1 for e in root.iter(f"{NS}{tag}") if e.get("class") == cls)


def test_mesh_svg_cells_groups_labels() -> None:
    m = Mesh({"pp": 2, "dp": 3, "tp": 4})
    root = _svg(mesh_svg(m, m["tp"], rank=5, view_name="tp"))
    assert _count(root, "rect", "cell") == 24
    assert _count(root, "rect", "group") == 6  # each tp group is one row: one rectangle
    labels = [e.text for e in root.iter(f"{NS}text")]
    for r in range(24):
        assert str(r) in labels
    titles = [e.text or "" for e in root.iter(f"{NS}title")]
    assert any(t.startswith("rank 5 · pp=0,dp=1,tp=1 · tp group 1") for t in titles)


def test_mesh_svg_strided_groups_and_hosts() -> None:
    m = Mesh({"dp": 4, "tp": 2})
    root = _svg(mesh_svg(m, m["dp"], ranks_per_host=4, view_name="dp"))
    assert _count(root, "rect", "group") == 2  # each dp group is one column
    dashed = [e for e in root.iter(f"{NS}rect") if e.get("stroke-dasharray")]
    assert dashed  # groups crossing hosts are dashed
    # no view, hosts given: cells coloured by host
    root = _svg(mesh_svg(m, None, ranks_per_host=4))
    assert _count(root, "rect", "group") == 2


def test_mesh_svg_family_and_array_groups() -> None:
    m = Mesh({"pp": 2, "dp": 2, "tp": 2}, ranks=range(100, 108))["tp", "pp"]
    assert m.num_submeshes == 2
    groups = np.array([[100, 101], [102, 103], [104, 105], [106, 107]])
    root = _svg(mesh_svg(m, groups, rank=103))
    assert _count(root, "rect", "cell") == 4
    text = " ".join(e.text or "" for e in root.iter(f"{NS}text"))
    assert "one of 2 congruent sub-meshes" in text and "103" in text


def test_mesh_svg_4096_ranks_aggregates() -> None:
    pd = ParallelDims(4096, pp=4, dp_replicate=2, cp=2, tp=8)
    svg = mesh_svg(pd.dense, pd.mesh("tp"), rank=1234, view_name="tp")
    root = _svg(svg)
    assert _count(root, "rect", "cell") == 4096
    texts = [e.text or "" for e in root.iter(f"{NS}text")]
    assert "1234" not in texts  # no per-rank labels at this size
    assert "1232-1239" in texts  # the tp group drawn as a block with a range label
    assert len(svg) < 2_000_000


def test_mesh_svg_merges_blocks_beyond_max_cells() -> None:
    m = Mesh({"dp": 64, "tp": 8})
    root = _svg(mesh_svg(m, m["tp"], max_cells=100))
    assert _count(root, "rect", "cell") == 64
    text = " ".join(e.text or "" for e in root.iter(f"{NS}text"))
    assert "block of ranks over: tp" in text
    one_d = _svg(mesh_svg(Mesh({"w": 1024}), max_cells=100))
    assert 0 < _count(one_d, "rect", "cell") <= 100


def test_sharding_svg_cells_runs_and_torch_view() -> None:
    mesh = Mesh({"dp": 3, "tp": 2})
    spec = ShardingSpec((7, 4), mesh, [StridedShard(0, 2), Shard(0)])
    root = _svg(sharding_svg(spec))
    assert _count(root, "rect", "cell") == 28
    assert _count(root, "rect", "run") == 5  # rank 4 holds nothing
    torch_root = _svg(sharding_svg(spec, torch_view=True))
    run_titles = [
        t.text for e in torch_root.iter(f"{NS}rect") if e.get("class") == "run" for t in e
    ]
    assert "r4: rows [6:7) cols [0:4)" in run_titles


def test_sharding_svg_1d_non_box_and_large() -> None:
    spec = ShardingSpec((8,), Mesh((2,)), [StridedShard(0, 2)])
    root = _svg(sharding_svg(spec))
    assert _count(root, "rect", "cell") == 8
    assert _count(root, "rect", "run") == 4  # two runs per rank
    big = ShardingSpec((1000, 300), Mesh({"dp": 3, "tp": 2}), [Shard(0), Shard(1)])
    root = _svg(sharding_svg(big))
    assert _count(root, "rect", "cell") == 0
    assert _count(root, "rect", "block") == 6
    three = ShardingSpec((4, 4, 4), Mesh({"dp": 2}), [Shard(2)])
    assert _count(_svg(sharding_svg(three)), "rect", "cell") == 16


def test_html_page_is_self_contained() -> None:
    m = Mesh({"dp": 2, "tp": 2})
    spec = ShardingSpec((4, 4), m, [Shard(0), Replicate()])
    pics = [mesh_picture(m, m["tp"]), sharding_picture(spec)]
    page = html_page(
        "t <x>", [Section("s", notes=["a & b"], table=[["h"], ["v"]], text="x", pictures=pics)]
    )
    assert "http" not in page and "src=" not in page and "<script" not in page
    assert page.count("<svg") == 2 and "<title>" in page and "t &lt;x&gt;" in page
    ET.fromstring(stack(pics).to_string())  # stacked pictures are valid XML


# ---------------------------------------------------------------------- plan reports
DENSE = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def plans(draw: st.DrawFn) -> dict[str, Any]:
    """A random job: degrees (world <= 256), expert split, order, ranks, a rank, hosts."""
    degrees: dict[str, int] = {}
    room = 256
    for n in draw(st.permutations(DENSE)):
        degrees[n] = draw(st.sampled_from([d for d in (1, 2, 3, 4, 8) if d <= room]))
        room //= degrees[n]
    world = math.prod(degrees[n] for n in DENSE)
    region = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    degrees["etp"] = draw(st.sampled_from(_divisors(region)))
    degrees["ep"] = draw(st.sampled_from(_divisors(region // degrees["etp"])))
    order = draw(st.none() | st.permutations(DENSE).map(tuple))
    kind = draw(st.sampled_from(["none", "offset", "strided", "permuted"]))
    offset = draw(st.integers(0, 1000))
    ranks: Any = {
        "none": None,
        "offset": range(offset, offset + world),
        "strided": range(offset, offset + 3 * world, 3),
        "permuted": draw(st.permutations(range(offset, offset + world))),
    }[kind]
    given = list(range(world)) if ranks is None else list(ranks)
    return dict(
        world=world,
        degrees=degrees,
        order=order,
        ranks=ranks,
        rank=draw(st.sampled_from(given)),
        ranks_per_host=draw(st.none() | st.sampled_from([1, 2, 3, 4, 8, 16])),
    )


def _pd(cfg: dict[str, Any]) -> ParallelDims:
    return ParallelDims(cfg["world"], **cfg["degrees"], order=cfg["order"], ranks=cfg["ranks"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=plans())
def test_plan_report_matches_reference(cfg: dict[str, Any]) -> None:
    """Complete and sampled plan reports against the numpy reference, view by view."""
    pd, rank, rph = _pd(cfg), cfg["rank"], cfg["ranks_per_host"]
    ref = (cfg["world"], cfg["degrees"], cfg["order"], cfg["ranks"])
    given = range(cfg["world"]) if cfg["ranks"] is None else cfg["ranks"]
    if rph and cfg["world"] % rph and sorted(given) == list(range(cfg["world"])):
        with pytest.raises(ValueError, match=f"does not divide the world of {cfg['world']} "):
            plan_report(pd, rank=rank, ranks_per_host=rph)  # a partial last host: refused
        return
    full = plan_report(pd, rank=rank, ranks_per_host=rph)
    sampled = plan_report(pd, rank=rank, ranks_per_host=rph, complete=False)
    assert json.loads(json.dumps(full)) == full
    assert list(full["views"]) == list(VIEWS) and full["world_size"] == cfg["world"]
    seen: dict[str, list[list[int]]] = {}
    for name in VIEWS:
        v, s = full["views"][name], sampled["views"][name]
        groups = view_groups(*ref, name)
        assert v["dims"] == list(VIEW_DIMS[name]) and v["groups"] == groups
        assert v["num_groups"] == len(groups) and v["group_size"] == len(groups[0])
        same = next((n for n, g in seen.items() if g == groups), None)
        assert v["same_groups_as"] == s["same_groups_as"] == same
        seen[name] = groups
        hosts = None if rph is None else [hosts_touched(g, rph) for g in groups]
        assert v["group_hosts"] == hosts
        if hosts is not None:
            assert v["hosts_spanned"] == s["hosts_spanned"] == max(hosts)
            assert v["crossing_groups"] == s["crossing_groups"] == sum(h > 1 for h in hosts)
            fewest = min((h for h in hosts if h > 1), default=1)
            assert v["crossing_hosts_min"] == s["crossing_hosts_min"] == fewest
        coord, group = view_rank(*ref, name, rank)
        index = groups.index(group)
        want_rank = {"coordinate": coord, "group_index": index, "group": group}
        want_rank["hosts"] = None if hosts is None else hosts[index]
        assert v["rank"] == want_rank
        assert {**s["rank"], "group": None} == {**want_rank, "group": None}
        assert vars(s["rank"]["group"]) == sample_of(group)
        assert s["groups"] is None
        assert [g["index"] for g in s["sample_groups"]] == shown_indices(len(groups))
        for g in s["sample_groups"]:
            assert vars(g["ranks"]) == sample_of(groups[g["index"]])
            assert g["hosts"] == (None if hosts is None else hosts[g["index"]])
    assert plan_text(full) == plan_text(sampled)  # text is the same from either report


def test_plan_text_content() -> None:
    pd = ParallelDims(16, pp=2, dp_shard=2, cp=2, tp=2, ep=4)
    lines = plan_text(plan_report(pd, rank=9)).splitlines()
    assert (
        lines[0]
        == "ParallelDims(16, pp=2, dp_replicate=1, dp_shard=2, cp=2, tp=2, ep=4, etp=1)  ->  efsdp=2"
    )
    assert lines[3].split() == ["view", "shape", "size", "groups", "purpose"]
    rows = {ln.split()[0]: ln for ln in lines[4:17]}
    assert list(rows) == list(VIEWS)
    assert re.match(r"ep\s+ep=4\s+4\s+4\s+expert parallel", rows["ep"])
    assert re.match(r"hsdp\s+dp_replicate=1 x fsdp=4\s+4\s+4\s+hybrid", rows["hsdp"])
    at = lines[3].index("purpose")  # every column starts at the same offset in every row
    assert all(ln[at - 2 : at] == "  " and ln[at] != " " for ln in lines[4:17])
    text = "\n".join(lines)
    assert "  ep: 4 groups of 4\n       0: [0, 1, 2, 3]\n" in text
    assert "  loss: 4 groups of 4\n       0: [0, 2, 4, 6]\n" in text
    assert "  fsdp: 4 groups of 4: the same groups as loss\n" in text
    assert "hsdp: 4 groups of 4: the same groups as loss" in text
    assert "pp: 8 groups of 2\n       0: [0, 8]\n" in text
    assert "dp_replicate: 16 groups of 1 (every rank alone)" in text
    assert re.search(r"\n  tp\s+tp=1\s+4\s+\[8, 9\]\n", text)


def test_plan_hosts() -> None:
    # 32 ranks, 8 per host, tp=8 innermost: TP and EP stay inside a host.
    pd = ParallelDims(32, dp_shard=4, tp=8, ep=8)
    views = plan_report(pd, ranks_per_host=8)["views"]
    assert views["tp"]["hosts_spanned"] == views["ep"]["hosts_spanned"] == 1
    assert views["dp_shard"]["hosts_spanned"] == 4 and views["pp"]["hosts_spanned"] == 1
    text = plan_text(plan_report(pd, ranks_per_host=8))
    assert re.search(r"\ntp .* every group in one host ", text)
    assert re.search(r"\ndp_shard .* 8/8 groups span 4 hosts ", text)
    # tp outermost: every TP group crosses four hosts, dp_shard stays inside one.
    tp_out = ParallelDims(32, dp_shard=4, tp=8, order="tp,pp,dp_replicate,dp_shard,cp")
    views = plan_report(tp_out, ranks_per_host=8)["views"]
    assert views["tp"]["hosts_spanned"] == 4 and views["dp_shard"]["hosts_spanned"] == 1
    assert "host" not in plan_text(plan_report(pd))  # no column without ranks_per_host


def test_plan_hosts_column_names_the_fewest_and_most_hosts() -> None:
    """30 ranks, pp=3, 6 per host: the dp_shard groups are ranks 0-9, 10-19, 20-29,
    touching hosts {0, 1}, {1, 2, 3}, {3, 4}; 12 ranks, pp=3: 0-3, 4-7, 8-11 on hosts of
    6 touch {0}, {0, 1}, {1}. Counted here from the groups, by hand in the docstring."""
    for world, want in ((30, "3/3 groups span 2-3 hosts"), (12, "1/3 groups span 2 hosts")):
        rep = plan_report(ParallelDims(world, pp=3), ranks_per_host=6, views=["dp_shard", "tp"])
        groups = rep["views"]["dp_shard"]["groups"]
        touched = [len({r // 6 for r in g}) for g in groups]
        assert touched == ([2, 3, 2] if world == 30 else [1, 2, 1])
        text = plan_text(rep)
        assert re.search(rf"\ndp_shard .*  {want}  ", text), text
        assert re.search(r"\ntp .*  every group in one host  ", text), text


def test_plan_text_abridges_big_groups() -> None:
    text = plan_text(plan_report(ParallelDims(4096, tp=8), rank=9, complete=False))
    assert "[0, 8, .., 4088] (512 ranks)" in text and "[0, 1, .., 4095] (4096 ranks)" in text
    assert ".. 505 more .." in text
    assert max(len(line) for line in text.splitlines()) < 160


def test_plan_report_errors() -> None:
    pd = ParallelDims(8, tp=2, ranks=range(8, 16))
    with pytest.raises(ValueError, match="rank 3 is not in"):
        plan_report(pd, rank=3)
    with pytest.raises(TypeError, match=re.escape("1.5")):
        plan_report(pd, rank=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks_per_host must be >= 1, got 0"):
        plan_report(pd, ranks_per_host=0)
    with pytest.raises(KeyError, match="nope"):
        plan_report(pd, views=["nope"])
    with pytest.raises(ValueError, match="complete report"):
        plan_text(plan_report(pd, complete=False), all_groups=True)


# ---------------------------------------------------------------------- mesh reports
@st.composite
def meshes(draw: st.DrawFn) -> tuple[Mesh, ModelMesh, list[tuple[str, str]]]:
    """A random root mesh (<= 96 ranks, range or permuted ranks), then random operations."""
    shape = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=4))
    assume(math.prod(shape) <= 96)
    names = [f"d{i}" for i in range(len(shape))]
    n = math.prod(shape)
    offset = draw(st.integers(0, 100))
    if draw(st.booleans()):
        flat = list(range(offset, offset + n))
    else:
        flat = draw(st.permutations(range(offset, offset + 2 * n)))[:n]
    mesh = Mesh(shape, names, ranks=flat)
    model = ModelMesh.root(shape, names, np.asarray(flat))
    ops: list[tuple[str, str]] = []
    for k in range(draw(st.integers(0, 3))):
        idx = draw(st.permutations(range(mesh.ndim)))[: draw(st.integers(1, mesh.ndim))]
        dims = [mesh.names[i] for i in idx]
        if draw(st.booleans()):
            mesh, model = mesh[dims], model.slice(idx)
            ops.append(("slice", ",".join(dims)))
        else:
            mesh = mesh.flatten(f"f{k}", dims=dims)
            model = model.flatten_dims(idx, f"f{k}")
            ops.append(("flatten", f"{','.join(dims)}=f{k}"))
    return mesh, model, ops


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=meshes(), data=st.data())
def test_mesh_report_matches_model(
    case: tuple[Mesh, ModelMesh, list[tuple[str, str]]], data: st.DataObject
) -> None:
    """Complete and sampled mesh reports against the brute-force model of the family."""
    mesh, model, ops = case
    rank = data.draw(st.sampled_from(model.ranks.tolist()))
    full = mesh_report(mesh, operations=ops, rank=rank)
    sampled = mesh_report(mesh, operations=ops, rank=rank, complete=False)
    assert json.loads(json.dumps(full)) == full
    assert full["rank_map"] == model.ranks.tolist()
    assert vars(sampled["rank_map"]) == sample_of(model.ranks.tolist())
    assert full["submeshes"] == model.submeshes().tolist()
    assert full["shape"] == list(model.shape) and full["num_submeshes"] == model.num_submeshes
    for i, name in enumerate(model.names):
        groups = model.groups(i).tolist()
        assert full["groups"][name] == groups
        assert full["num_groups"][name] == sampled["num_groups"][name] == len(groups)
        got = [vars(g) for g in sampled["groups"][name]]
        assert got == [sample_of(g) for g in groups[: min(len(groups), 6)]]
        group = list(model.group(rank, i))
        assert full["rank"]["groups"][name] == group
        assert vars(sampled["rank"]["groups"][name]) == sample_of(group)
    coord = list(model.coordinate(rank) or ())
    assert full["rank"]["coordinate"] == sampled["rank"]["coordinate"] == coord
    assert full["rank"]["submesh"] == sampled["rank"]["submesh"] == model.submesh(rank).tolist()
    assert sampled["first_submesh"] == model.submeshes()[0].tolist()
    assert mesh_text(full) == mesh_text(sampled)
    assert mesh_text(mesh_report(mesh, complete=False)) == mesh_text(mesh_report(mesh))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=meshes(), data=st.data())
def test_same_groups_iff_same_group_tables(
    case: tuple[Mesh, ModelMesh, list[tuple[str, str]]], data: st.DataObject
) -> None:
    mesh, model, _ = case
    a = data.draw(st.permutations(range(mesh.ndim)))[: data.draw(st.integers(1, mesh.ndim))]
    b = data.draw(st.permutations(range(mesh.ndim)))[: data.draw(st.integers(1, mesh.ndim))]
    ta, tb = model.slice(a).submeshes(), model.slice(b).submeshes()
    want = ta.reshape(len(ta), -1).tolist() == tb.reshape(len(tb), -1).tolist()
    assert same_groups(mesh[[mesh.names[i] for i in a]], mesh[[mesh.names[i] for i in b]]) == want


# ---------------------------------------------------------------------- shard reports
@st.composite
def shardings(draw: st.DrawFn) -> tuple[ShardingSpec, list[Any]]:
    """A random 1-D or 2-D tensor on a random mesh with random placements (any list)."""
    shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=2)))
    sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))
    placement = st.one_of(
        st.builds(Shard, st.integers(0, len(shape) - 1)),
        st.builds(StridedShard, st.integers(0, len(shape) - 1), st.integers(1, 4)),
        st.just(Replicate()),
        st.just(Partial()),
    )
    placements = draw(st.lists(placement, min_size=len(sizes), max_size=len(sizes)))
    mesh = Mesh(sizes, [f"m{i}" for i in range(len(sizes))])
    return ShardingSpec(shape, mesh, placements), placements


def _runs_of(index: np.ndarray) -> list[list[int]]:
    """Maximal runs [a, b) of consecutive values, in the order they are held."""
    runs: list[list[int]] = []
    for v in index.tolist():
        if runs and runs[-1][1] == v:
            runs[-1][1] = v + 1
        else:
            runs.append([v, v + 1])
    return runs


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=shardings())
def test_shard_report_matches_reference(case: tuple[ShardingSpec, list[Any]]) -> None:
    """Per rank: runs, shape, offset and torch's literal view against the brute force."""
    spec, placements = case
    rep = shard_report(spec)
    assert json.loads(json.dumps(rep)) == rep
    shape, sizes = spec.global_shape, list(spec.mesh.shape)
    differ = []
    for r, entry in enumerate(rep["ranks"]):
        coord = tuple(int(c) for c in np.unravel_index(r, sizes))
        assert entry["rank"] == r and entry["coordinate"] == list(coord)
        ours = reference_indices(shape, sizes, placements, coord)
        assert entry["runs"] == [_runs_of(i) for i in ours]
        assert entry["local_shape"] == [len(i) for i in ours]
        box = all(len(_runs_of(i)) <= 1 for i in ours)
        assert entry["is_box"] == box
        if box:
            offset = [int(i[0]) if len(i) else n for i, n in zip(ours, shape)]
            assert entry["global_offset"] == offset
        sharded = shard_dims(placements, len(shape))
        torch = [
            literal_indices(n, d, placements, sizes, coord, len(shape))
            if d in sharded
            else np.arange(n)
            for d, n in enumerate(shape)
        ]
        assert entry["torch"]["runs"] == [_runs_of(i) for i in torch]
        assert entry["torch_agrees"] == (entry["torch"]["runs"] == entry["runs"])
        if not entry["torch_agrees"]:
            differ.append(r)
    assert rep["torch_disagrees"] == differ
    has_strided = any(isinstance(p, StridedShard) for p in placements)
    decodable = not has_strided or brute_decode(placements, sizes, len(shape)) is not None
    assert rep["decodable"] == decodable


def test_shard_report_fsdp_over_tp() -> None:
    spec = ShardingSpec((7, 4), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)])
    rep = shard_report(spec)
    assert rep["shard_order"] == {"0": ["tp", "dp"]} and rep["torch_disagrees"] == [4, 5]
    rows = [r["runs"][0] for r in rep["ranks"]]
    assert rows == [[[0, 2]], [[4, 5]], [[2, 4]], [[5, 6]], [], [[6, 7]]]


def _torch_cases() -> list[tuple[tuple[int, ...], dict[str, int], list[object]]]:
    out: list[tuple[tuple[int, ...], dict[str, int], list[object]]] = [
        ((7, 4), {"dp": 3, "tp": 2}, [StridedShard(0, 2), Shard(0)]),
        ((8,), {"dp": 2}, [StridedShard(0, 2)]),
        ((13, 5), {"a": 2, "b": 3}, [Shard(1), StridedShard(1, 2)]),
        ((11, 9), {"a": 3, "b": 2, "c": 2}, [StridedShard(0, 4), Shard(1), Shard(0)]),
        ((10, 6), {"a": 2, "b": 2}, [Partial(), Shard(1)]),
    ]
    for n, k1, k2, sf in itertools.product((5, 7, 12), (2, 3), (2, 3), (2, 3)):
        out.append(((n,), {"a": k1, "b": k2}, [StridedShard(0, sf), Shard(0)]))
    return out


@pytest.mark.torch
@pytest.mark.parametrize("shape,mesh_shape,placements", _torch_cases())
def test_torch_model_matches_torch(
    shape: tuple[int, ...], mesh_shape: dict[str, int], placements: list[object]
) -> None:
    pytest.importorskip("torch")
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

    mesh = Mesh(mesh_shape)
    spec = ShardingSpec(shape, mesh, placements)  # type: ignore[arg-type]
    torch_placements = spec.to_torch()
    for rank in range(mesh.size()):
        coord = list(mesh.coordinate(rank) or ())
        want = _compute_local_shape_and_global_offset(shape, mesh.shape, coord, torch_placements)
        assert torch_local_shape_and_offset(spec, rank) == (tuple(want[0]), tuple(want[1]))
