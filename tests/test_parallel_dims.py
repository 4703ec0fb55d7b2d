"""ParallelDims against a brute-force numpy reference, plus every error message.

The reference (tests/parallel_dims_reference.py) lays ``arange(world)`` out in
``order``, transposes it to canonical positions and slices views out with
transpose/reshape; it shares no code with Layout or Mesh.
"""

from __future__ import annotations

import copy
import doctest
import itertools
import json
import pickle
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshlayout
import meshlayout.parallel_dims as pd_module
from meshlayout import Mesh, ParallelDims, RankMap
from meshlayout.parallel_dims import DENSE_DIMS, SPARSE_DIMS, VIEWS
from parallel_dims_reference import (
    VIEW_DIMS,
    dense_array,
    family,
    group_along,
    locate,
    reference_views,
)

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VIEW_NAMES = list(VIEWS)


# ---------------------------------------------------------------------- helpers


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def whole_mesh(pd: ParallelDims, name: str) -> Mesh:
    if name in ("dense", "sparse", "dataloading"):
        mesh: Mesh = getattr(pd, name)
        return mesh
    return pd.mesh(name)


def sorted_rows(array: np.ndarray) -> np.ndarray:
    """Rows of ``array`` (first axis; the rest flattened) in lexicographic order.

    Two arrays give equal results iff they hold the same multiset of rows.
    """
    flat = np.asarray(array, dtype=np.int64).reshape(array.shape[0], -1)
    return flat[np.lexsort(flat.T[::-1])]


def same_rows(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(sorted_rows(a), sorted_rows(b)))


def check_against_reference(
    pd: ParallelDims,
    world: int,
    degrees: Mapping[str, int],
    order: Sequence[str] | None,
    ranks: Any,
    sample: Sequence[int],
) -> None:
    """Every view and whole mesh equals the reference, as families and rank by rank."""
    ref = reference_views(world, degrees, order, ranks)
    for name, dims in VIEW_DIMS.items():
        mesh = whole_mesh(pd, name)
        nd = len(dims)
        expected = family(ref[name], nd)
        assert mesh.names == dims, name
        assert mesh.shape == expected.shape[1:], (name, mesh.shape, expected.shape)
        assert mesh.rank_map is pd.rank_map, name
        assert mesh.num_submeshes == expected.shape[0], name
        # Every sub-mesh with every rank at its coordinate (sets of arrays, not of sets).
        assert same_rows(mesh.submeshes(), expected), name
        # Every group along every dim, members in coordinate order.
        for k, dim in enumerate(dims):
            want = np.moveaxis(expected, k + 1, -1).reshape(-1, expected.shape[k + 1])
            assert same_rows(mesh.groups(dim), want), (name, dim)
        # Per-rank queries, through the O(answer) path.
        for r in sample:
            sub, coord = locate(ref[name], nd, r)
            assert mesh.coordinate(r) == coord, (name, r)
            assert mesh.submesh(r).tolist() == sub.tolist(), (name, r)
            for k, dim in enumerate(dims):
                assert mesh.local_rank(r, dim) == coord[k], (name, dim, r)
                assert mesh.group(r, dim) == group_along(sub, coord, k), (name, dim, r)


@st.composite
def configs(draw: st.DrawFn, max_world: int = 512) -> dict[str, Any]:
    """A valid configuration: degrees, ep/etp of the expert region, order, ranks."""
    degrees: dict[str, int] = {}
    room = max_world
    dims = list(DENSE_DIMS)
    for n in draw(st.permutations(dims)):  # no dim is favoured by drawing first
        v = draw(st.sampled_from([d for d in range(1, min(room, 8) + 1)]))
        degrees[n] = v
        room //= v
    world = int(np.prod([degrees[n] for n in DENSE_DIMS]))
    region = degrees["dp_shard"] * degrees["cp"] * degrees["tp"]
    etp = draw(st.sampled_from(divisors(region)))
    ep = draw(st.sampled_from(divisors(region // etp)))
    degrees.update(ep=ep, etp=etp)
    order: tuple[str, ...] | None = tuple(draw(st.permutations(dims)))
    form = draw(st.sampled_from(["none", "tuple", "list", "comma", "dash", "space"]))
    given_order: Any
    if form == "none":
        order = given_order = None
    elif form == "tuple":
        given_order = order
    elif form == "list":
        given_order = list(order)  # type: ignore[arg-type]
    elif form == "comma":
        given_order = ",".join(order)  # type: ignore[arg-type]
    elif form == "dash":
        given_order = "-".join(order)  # type: ignore[arg-type]
    else:
        given_order = " ".join(order)  # type: ignore[arg-type]
    kind = draw(st.sampled_from(["none", "offset", "strided", "permuted", "rankmap"]))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    offset = draw(st.integers(0, 4096))
    ranks: Any
    if kind == "none":
        ranks = None
    elif kind == "offset":
        ranks = range(offset, offset + world)
    elif kind == "strided":
        ranks = range(offset, offset + 3 * world, 3)
    elif kind == "permuted":
        ranks = (offset + rng.permutation(world)).tolist()
    else:
        ranks = RankMap(offset + rng.permutation(world))
    sample = sorted({int(v) for v in rng.integers(0, world, size=min(world, 6))} | {0, world - 1})
    return dict(
        world=world,
        degrees=degrees,
        order=order,
        given_order=given_order,
        ranks=ranks,
        sample=sample,
        ranks_per_host=draw(st.sampled_from([1, 2, 3, 4, 8, 16])),
    )


def build(cfg: Mapping[str, Any]) -> ParallelDims:
    d = cfg["degrees"]
    kwargs = {n: d[n] for n in (*DENSE_DIMS, "ep", "etp")}
    if d.get("_infer"):
        kwargs["dp_shard"] = -1
    return ParallelDims(cfg["world"], **kwargs, order=cfg["given_order"], ranks=cfg["ranks"])


def global_ranks(cfg: Mapping[str, Any]) -> list[int]:
    ranks = cfg["ranks"]
    return list(range(cfg["world"])) if ranks is None else [int(r) for r in ranks]


# ---------------------------------------------------------------------- the reference


def test_reference_doctests() -> None:
    import parallel_dims_reference

    assert doctest.testmod(parallel_dims_reference).failed == 0


def test_module_doctests() -> None:
    result = doctest.testmod(pd_module)
    assert result.failed == 0 and result.attempted >= 10


@SETTINGS
@given(cfg=configs())
def test_matches_numpy_reference(cfg: dict[str, Any]) -> None:
    pd = build(cfg)
    world, degrees = cfg["world"], cfg["degrees"]
    efsdp = degrees["dp_shard"] * degrees["cp"] * degrees["tp"] // (degrees["ep"] * degrees["etp"])
    assert pd.degrees == {**degrees, "efsdp": efsdp}
    assert pd.order == (cfg["order"] or DENSE_DIMS)
    ranks = global_ranks(cfg)
    sample = [ranks[i] for i in cfg["sample"]]
    check_against_reference(pd, world, degrees, cfg["order"], cfg["ranks"], sample)
    # pp and dp_replicate: one and the same mesh in dense and sparse (and pp in dataloading).
    for dim in ("pp", "dp_replicate"):
        assert pd.dense[dim] == pd.sparse[dim] == pd.mesh(dim)
        assert pd.dense.groups(dim).tolist() == pd.sparse.groups(dim).tolist()
    assert pd.dataloading["pp"] == pd.dense["pp"]
    # The rank map is shared by every view and every combination.
    for mesh in [*pd.views().values(), pd.dense, pd.sparse, pd.dataloading]:
        assert mesh.rank_map is pd.rank_map
    assert pd.mesh(("dp_replicate", "efsdp")).rank_map is pd.rank_map
    # Hosts crossed: brute force over the reference families.
    n = cfg["ranks_per_host"]
    ref = reference_views(world, degrees, cfg["order"], cfg["ranks"])
    for name in ("tp", "ep", "fsdp", "ehsdp"):
        blocks = family(ref[name], len(VIEW_DIMS[name])).reshape(-1, pd.mesh(name).size())
        want = max(len({int(r) // n for r in row}) for row in blocks)
        assert int(pd.mesh(name).hosts_spanned(n).max()) == want, name


def test_every_order_on_one_world() -> None:
    """All 120 permutations: only the rank map moves, and it moves as the reference says."""
    degrees = dict(pp=2, dp_replicate=3, dp_shard=2, cp=2, tp=5, ep=2, etp=5)
    world = 120
    base = ParallelDims(world, **degrees)
    seen = set()
    for order in itertools.permutations(DENSE_DIMS):
        pd = ParallelDims(world, **degrees, order=order)
        seen.add(tuple(pd.rank_map))
        assert (
            pd.rank_map.to_numpy().tolist()
            == dense_array(world, degrees, order).reshape(-1).tolist()
        )
        for name in VIEW_NAMES:
            assert pd.mesh(name).names == base.mesh(name).names
            assert pd.mesh(name).axes == base.mesh(name).axes  # positions never move
        check_against_reference(pd, world, degrees, order, None, [0, 7, 119])
    assert len(seen) == 120


@pytest.mark.parametrize(
    ("world", "degrees", "why"),
    [
        (16, dict(dp_shard=2, cp=2, tp=4, ep=2, etp=4), "etp == tp"),
        (16, dict(dp_shard=2, cp=2, tp=4, ep=4, etp=2), "etp not 1 and not tp, ep spans tp"),
        (16, dict(dp_shard=1, cp=4, tp=4, ep=8, etp=2), "ep spans cp and tp"),
        (16, dict(dp_shard=4, cp=2, tp=2, ep=1, etp=8), "etp spans dp_shard, cp and tp"),
        (24, dict(dp_shard=3, cp=2, tp=4, ep=3, etp=8), "ep=3 outside tp, etp=cp*tp"),
        (24, dict(dp_shard=3, cp=2, tp=4, ep=12, etp=1), "ep spans everything but one dp"),
        (48, dict(pp=2, dp_replicate=2, dp_shard=3, cp=2, tp=2, ep=6, etp=2), "ep=6 across"),
        (36, dict(dp_shard=3, cp=3, tp=4, ep=9, etp=4), "odd ep, etp=tp"),
        (30, dict(dp_replicate=2, dp_shard=5, cp=1, tp=3, ep=5, etp=3), "primes"),
        (64, dict(dp_shard=4, cp=2, tp=8, ep=64, etp=1), "ep = whole region"),
        (32, dict(pp=2, dp_shard=2, cp=2, tp=4, ep=1, etp=16), "etp = whole region"),
    ],
)
@pytest.mark.parametrize("order", [None, ("tp", "cp", "dp_shard", "dp_replicate", "pp")])
def test_unusual_expert_factorisations(
    world: int, degrees: dict[str, int], why: str, order: tuple[str, ...] | None
) -> None:
    full = {n: 1 for n in DENSE_DIMS} | {"ep": 1, "etp": 1} | degrees
    pd = ParallelDims(world, **degrees, order=order)
    check_against_reference(pd, world, full, order, None, list(range(world)))
    region = full["dp_shard"] * full["cp"] * full["tp"]
    assert pd.degrees["efsdp"] * full["ep"] * full["etp"] == region, why


def test_named_example_groups() -> None:
    """The 16-rank example of docs/parallel_dims.md, spelled out."""
    pd = ParallelDims(16, pp=2, dp_shard=2, cp=2, tp=2, ep=4)
    groups = {name: pd.mesh(name).groups(pd.mesh(name).names[-1]).tolist() for name in VIEWS}
    assert groups["tp"][:2] == [[0, 1], [2, 3]]
    assert groups["cp"][:2] == [[0, 2], [1, 3]]
    assert groups["dp_shard"][:2] == [[0, 4], [1, 5]]
    assert groups["pp"][:2] == [[0, 8], [1, 9]]
    assert groups["fsdp"] == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert groups["loss"] == groups["fsdp"]
    assert groups["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert groups["efsdp"][:2] == [[0, 4], [1, 5]]
    assert groups["etp"][:3] == [[0], [1], [2]]
    assert pd.dataloading.group(5, "batch") == (1, 5)


# ---------------------------------------------------------------------- order and ranks


def test_order_forms_are_equivalent() -> None:
    order = ("tp", "cp", "dp_shard", "dp_replicate", "pp")
    forms: list[Any] = [
        order,
        list(order),
        "tp,cp,dp_shard,dp_replicate,pp",
        "tp-cp-dp_shard-dp_replicate-pp",
        " tp, cp ,dp_shard, dp_replicate,pp ",
        "tp cp dp_shard dp_replicate pp",
    ]
    pds = [ParallelDims(32, pp=2, dp_shard=2, cp=2, tp=4, order=f) for f in forms]
    assert all(p == pds[0] and p.order == order for p in pds)
    # tp outermost: a TP group strides across the world.
    assert pds[0].mesh("tp").group(0, "tp") == (0, 8, 16, 24)
    assert pds[0].mesh("pp").group(0, "pp") == (0, 1)


def test_default_order_keeps_a_range_rank_map() -> None:
    assert ParallelDims(2**20, tp=8, cp=4).rank_map.is_range
    pd = ParallelDims(64, tp=8, ranks=range(64, 128))
    assert pd.rank_map.is_range and pd.rank_map.as_range() == range(64, 128)
    assert pd.mesh("tp").group(70, "tp") == tuple(range(64, 72))
    # An order that only moves size-1 dims changes nothing.
    same = ParallelDims(64, tp=8, order=("cp", "pp", "dp_replicate", "dp_shard", "tp"))
    assert same.rank_map == ParallelDims(64, tp=8).rank_map and same.rank_map.is_range


def test_custom_ranks_follow_rank_space_order() -> None:
    ranks = [7, 3, 5, 1, 6, 2, 4, 0]
    pd = ParallelDims(8, dp_shard=2, tp=4, ranks=ranks)
    assert pd.mesh("tp").group(7, "tp") == (7, 3, 5, 1)  # coordinate order, not sorted
    assert pd.mesh("tp").coordinate(5) == (2,)
    flipped = ParallelDims(8, dp_shard=2, tp=4, ranks=ranks, order="tp,dp_shard,pp,cp,dp_replicate")
    # rank-space index i*2 + j holds (tp=i, dp_shard=j)
    assert flipped.mesh("tp").group(7, "tp") == (7, 5, 6, 4)
    assert flipped.mesh("dp_shard").group(7, "dp_shard") == (7, 3)


# ---------------------------------------------------------------------- combinations


def test_combinations_of_views() -> None:
    pd = ParallelDims(32, pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=4)
    assert pd.mesh(("dp_replicate", "fsdp")) == pd.mesh("hsdp")
    assert pd.mesh(["dp_replicate", "efsdp"]) == pd.mesh("ehsdp")
    assert pd.mesh(("pp", "batch", "cp", "tp")) == pd.dataloading
    assert pd.mesh(("pp", "dp_replicate", "efsdp", "ep", "etp")) == pd.sparse
    assert pd.mesh(("tp",)) == pd.mesh("tp")
    both = pd.mesh(("ep", "pp"))
    assert both.names == ("ep", "pp") and both.rank_map is pd.rank_map
    assert both.group(5, "pp") == (5, 21)
    # hsdp plus tp: three dims, HSDP x TP
    assert pd.mesh(("hsdp", "tp")).names == ("dp_replicate", "fsdp", "tp")


@pytest.mark.parametrize(
    "names",
    [
        ("tp", "ep"),
        ("fsdp", "dp_shard"),
        ("batch", "loss"),
        ("hsdp", "ehsdp"),
        ("dp_shard", "efsdp"),
        ("cp", "ep"),
    ],
)
def test_overlapping_combinations_raise(names: tuple[str, ...]) -> None:
    pd = ParallelDims(32, pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=4)
    with pytest.raises(ValueError, match=re.escape(f"views {list(names)} ")):
        pd.mesh(names)


def test_disjoint_expert_and_dense_dims_combine() -> None:
    pd = ParallelDims(32, pp=2, dp_replicate=2, dp_shard=2, cp=2, tp=2, ep=4)
    # efsdp = dp_shard*cp*tp/(ep*etp) = 2 is exactly dp_shard here, disjoint from cp
    assert pd.mesh(("cp", "efsdp")).names == ("cp", "efsdp")
    assert pd.mesh("efsdp").axes == pd.mesh("dp_shard").axes


def test_repeated_view_in_combination() -> None:
    pd = ParallelDims(8, tp=2)
    with pytest.raises(
        ValueError, match=re.escape("views ['tp', 'tp'] name ['tp'] more than once")
    ):
        pd.mesh(("tp", "tp"))


# ---------------------------------------------------------------------- errors


def raises(exc: type[Exception], text: str) -> Any:
    return pytest.raises(exc, match=re.escape(text))


def test_error_product_not_world() -> None:
    with raises(
        ValueError,
        "the degrees do not multiply to the world size: "
        "pp*dp_replicate*dp_shard*cp*tp = 2*1*3*2*4 = 48 != 64",
    ):
        ParallelDims(64, pp=2, dp_shard=3, cp=2, tp=4)


def test_error_dp_shard_not_inferable() -> None:
    with raises(
        ValueError,
        "dp_shard=-1 cannot be inferred: world_size 64 is not divisible by "
        "pp*dp_replicate*cp*tp = 3*1*1*1 = 3",
    ):
        ParallelDims(64, pp=3)
    with raises(
        ValueError,
        "dp_shard=-1 cannot be inferred: world_size 12 is not divisible by "
        "pp*dp_replicate*cp*tp = 1*1*2*8 = 16",
    ):
        ParallelDims(12, cp=2, tp=8)


def test_inferred_dp_shard() -> None:
    assert ParallelDims(64, pp=2, cp=2, tp=4).degrees["dp_shard"] == 4
    assert ParallelDims(7).degrees["dp_shard"] == 7


@pytest.mark.parametrize("name", ["pp", "dp_replicate", "cp", "tp", "ep", "etp"])
@pytest.mark.parametrize("value", [0, -1, -3])
def test_error_degree_below_one(name: str, value: int) -> None:
    with raises(ValueError, f"{name} must be >= 1, got {value}"):
        ParallelDims(8, **{name: value})


@pytest.mark.parametrize("value", [0, -2])
def test_error_dp_shard_below_one(value: int) -> None:
    with raises(ValueError, f"dp_shard must be >= 1 (or -1 to infer it), got {value}"):
        ParallelDims(8, dp_shard=value)


def test_error_world_size() -> None:
    with raises(ValueError, "world_size must be >= 1, got 0"):
        ParallelDims(0)
    with raises(TypeError, "world_size must be an int, got 8.0 of type float"):
        ParallelDims(8.0)  # type: ignore[arg-type]
    with raises(ValueError, "world_size 9223372036854775808 is more than MAX_WORLD"):
        ParallelDims(2**63)
    with raises(ValueError, "world_size 18446744073709551616 is more than MAX_WORLD"):
        ParallelDims(2**64, tp=8)


def test_a_2_pow_40_world_is_cheap_per_rank() -> None:
    pd = ParallelDims(2**40, tp=8, cp=2)
    assert pd.rank_map.is_range
    assert pd.mesh("tp").group(2**40 - 1, "tp") == tuple(range(2**40 - 8, 2**40))
    assert pd.mesh("loss").size() == 2**37  # dp_shard * cp = world / tp
    with raises(ValueError, "elements, more than the limit MAX_ELEMENTS"):
        pd.mesh("tp").group_table()


@pytest.mark.parametrize("name", ["pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp"])
@pytest.mark.parametrize(
    ("value", "type_name"), [(2.0, "float"), ("2", "str"), (True, "bool"), (None, "NoneType")]
)
def test_error_degree_not_int(name: str, value: object, type_name: str) -> None:
    with raises(TypeError, f"{name} must be an int, got {value!r} of type {type_name}"):
        ParallelDims(8, **{name: value})  # type: ignore[arg-type]


def test_numpy_ints_are_ints() -> None:
    pd = ParallelDims(np.int64(8), tp=np.int32(2), dp_shard=np.int64(4))  # type: ignore[arg-type]
    assert pd.degrees["tp"] == 2 and type(pd.degrees["tp"]) is int
    assert type(pd.world_size) is int
    json.dumps(pd.degrees)


def test_error_ep_etp() -> None:
    with raises(
        ValueError,
        "ep=3 does not divide dp_shard*cp*tp/etp = 8 (dp_shard*cp*tp = 4*1*2 = 8, etp=1)",
    ):
        ParallelDims(8, tp=2, ep=3)
    with raises(
        ValueError,
        "ep=8 does not divide dp_shard*cp*tp/etp = 4 (dp_shard*cp*tp = 2*2*4 = 16, etp=4)",
    ):
        ParallelDims(16, dp_shard=2, cp=2, tp=4, ep=8, etp=4)
    with raises(ValueError, "etp=5 does not divide dp_shard*cp*tp = 3*2*4 = 24"):
        ParallelDims(24, dp_shard=3, cp=2, tp=4, etp=5)
    # pp and dp_replicate are not part of the expert region
    with raises(ValueError, "ep=2 does not divide dp_shard*cp*tp/etp = 1"):
        ParallelDims(4, pp=2, dp_replicate=2, ep=2)


def test_error_unknown_view() -> None:
    pd = ParallelDims(8, tp=2)
    valid = str(list(VIEWS))
    with raises(KeyError, f"unknown view 'dp'; valid views are {valid}"):
        pd.mesh("dp")
    with raises(KeyError, f"unknown view 'world'; valid views are {valid}"):
        pd.mesh(("pp", "world"))
    with raises(KeyError, "unknown view 'sparse'"):
        pd.enabled("sparse")
    with raises(ValueError, "name at least one view"):
        pd.mesh(())
    with raises(TypeError, "mesh() takes a view name or a sequence of view names, got 3"):
        pd.mesh(3)  # type: ignore[arg-type]
    with raises(TypeError, "a view name is a str, got 3"):
        pd.mesh(("pp", 3))  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("order", "text"),
    [
        ("pp,dp_replicate,dp_shard,cp", "missing ['tp']"),
        ("pp,dp_replicate,dp_shard,cp,tp,tp", "repeated ['tp']"),
        (("pp", "dp", "cp", "tp", "ep"), "unknown ['dp', 'ep']"),
        ("tp-cp-ep-dp-pp", "a Megatron order string lists the innermost dim first"),
        ("", "got []"),
        (["pp", "dp_replicate", "dp_shard", "cp", "TP"], "unknown ['TP'], missing ['tp']"),
    ],
)
def test_error_bad_order(order: Any, text: str) -> None:
    with raises(ValueError, text) as info:
        ParallelDims(8, tp=2, order=order)
    assert "order must be a permutation of ['pp', 'dp_replicate', 'dp_shard', 'cp', 'tp']" in str(
        info.value
    )


@pytest.mark.parametrize(
    ("order", "text"),
    [
        (["pp", 1, "dp_shard", "cp", "tp"], "order must contain dim names (str)"),
        (set(DENSE_DIMS), "order must be a sequence of dim names or a string"),
        (5, "order must be a sequence of dim names or a string"),
    ],
)
def test_error_order_type(order: Any, text: str) -> None:
    with raises(TypeError, text):
        ParallelDims(8, tp=2, order=order)


def test_error_ranks() -> None:
    with raises(ValueError, "ranks has 7 entries but world_size is 8"):
        ParallelDims(8, ranks=range(7))
    with pytest.raises(ValueError, match="distinct"):
        ParallelDims(4, ranks=[0, 1, 1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        ParallelDims(4, ranks=[0, 1, -1, 2])


# ---------------------------------------------------------------------- value object


def test_value_object() -> None:
    pd = ParallelDims(
        16, pp=2, dp_shard=2, cp=2, tp=2, ep=4, order="tp,cp,dp_shard,pp,dp_replicate"
    )
    for clone in (pickle.loads(pickle.dumps(pd)), copy.copy(pd), copy.deepcopy(pd)):
        assert clone == pd and hash(clone) == hash(pd)
        assert clone.mesh("ep") == pd.mesh("ep")
        assert clone.mesh("ep").rank_map is clone.rank_map
    assert pd != ParallelDims(16, pp=2, dp_shard=2, cp=2, tp=2, ep=4)
    assert pd != ParallelDims(16, pp=2, dp_shard=2, cp=2, tp=2, ep=2, order=pd.order)
    with pytest.raises(AttributeError, match="immutable"):
        pd.world_size = 3  # type: ignore[misc]
    d = pd.degrees
    d["tp"] = 99
    assert pd.degrees["tp"] == 2
    assert pd.mesh("tp") is pd.mesh("tp")  # cached
    assert "order='tp,cp,dp_shard,pp,dp_replicate'" in repr(pd)


@SETTINGS
@given(cfg=configs())
def test_repr_round_trips(cfg: dict[str, Any]) -> None:
    """``eval(repr(pd)) == pd`` for every order and rank list (issue 11: ranks were dropped)."""
    pd = build(cfg)
    text = repr(pd)
    again = eval(text, {"ParallelDims": ParallelDims})
    assert again == pd and again.rank_map == pd.rank_map, text
    assert ("ranks=" in text) == (global_ranks(cfg) != list(range(cfg["world"])))


def test_repr_of_a_permuted_order_keeps_the_ranks() -> None:
    pd = ParallelDims(
        8, dp_shard=2, tp=4, order="tp,cp,dp_shard,dp_replicate,pp", ranks=range(8, 16)
    )
    assert repr(pd).endswith("order='tp,cp,dp_shard,dp_replicate,pp', ranks=range(8, 16))")
    assert eval(repr(pd)) == pd
    assert "ranks=range(2047, -1, -1))" in repr(ParallelDims(2048, ranks=range(2047, -1, -1)))
    perm = np.random.default_rng(3).permutation(2048).tolist()
    assert "…" in repr(ParallelDims(2048, tp=2, ranks=perm))  # > REPR_RANKS_LIMIT: abridged
    small = np.random.default_rng(3).permutation(1024).tolist()
    assert eval(repr(ParallelDims(1024, tp=2, ranks=small))).rank_map == RankMap(small)


def test_enabled() -> None:
    pd = ParallelDims(16, dp_replicate=2, dp_shard=2, tp=4, ep=2)
    assert [n for n in (*DENSE_DIMS, "ep", "etp", "efsdp") if pd.enabled(n)] == [
        "dp_replicate",
        "dp_shard",
        "tp",
        "ep",
        "efsdp",
    ]
    assert pd.enabled("batch") and pd.enabled("hsdp") and pd.enabled("fsdp")
    assert not ParallelDims(4, tp=4).enabled("fsdp")


def test_public_names() -> None:
    assert meshlayout.ParallelDims is ParallelDims
    assert SPARSE_DIMS == ("pp", "dp_replicate", "efsdp", "ep", "etp")
    assert set(VIEWS) == {
        "pp",
        "dp_replicate",
        "dp_shard",
        "cp",
        "tp",
        "batch",
        "loss",
        "fsdp",
        "hsdp",
        "efsdp",
        "ep",
        "etp",
        "ehsdp",
    }
    pd = ParallelDims(8, tp=2)
    assert set(pd.views()) == set(VIEWS)
    # ``build`` (binding views to process groups) belongs to layer 4: meshlayout.torch.
