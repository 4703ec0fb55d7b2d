"""meshlayout.render: reports against the library, SVG structure, HTML self-containment,
and the pure torch 2.13 model against torch itself."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from meshlayout import Mesh, ParallelDims
from meshlayout.render import (
    Section,
    html_page,
    mesh_picture,
    mesh_svg,
    plan_report,
    shard_report,
    sharding_picture,
    sharding_svg,
    stack,
    torch_local_shape_and_offset,
)
from meshlayout.sharding import Partial, Replicate, Shard, ShardingSpec, StridedShard

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


def test_plan_report_matches_library() -> None:
    pd = ParallelDims(64, pp=2, cp=2, tp=4, ep=4)
    rep = plan_report(pd, rank=13, ranks_per_host=8)
    assert rep["degrees"] == pd.degrees and rep["world_size"] == 64
    for name, mesh in pd.views().items():
        v = rep["views"][name]
        assert v["shape"] == list(mesh.shape) and v["num_groups"] == mesh.num_submeshes
        assert v["groups"] == mesh.submeshes().reshape(mesh.num_submeshes, -1).tolist()
        assert v["rank"]["group"] == mesh.submesh(13).reshape(-1).tolist()
        assert v["groups"][v["rank"]["group_index"]] == v["rank"]["group"]
        assert v["rank"]["coordinate"] == list(mesh.coordinate(13) or ())
        assert v["hosts_spanned"] == pd.to_dict(ranks_per_host=8)["views"][name]["hosts_spanned"]


def test_shard_report_matches_spec() -> None:
    spec = ShardingSpec((7, 4), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)])
    rep = shard_report(spec)
    assert rep["shard_order"] == {"0": ["tp", "dp"]} and rep["torch_disagrees"] == [4, 5]
    for r in rep["ranks"]:
        assert r["local_shape"] == list(spec.local_shape(r["rank"]))
        assert r["global_offset"] == list(spec.local_offset(r["rank"]))


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
