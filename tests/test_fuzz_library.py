"""Fuzz the pure library with hostile input: a right answer or a documented error.

Every call below gets random arguments, many of them hostile (bools, floats, nan,
huge and negative ints, numpy scalars of every kind, strings, nested junk). It must
either return an answer, which is then checked against the brute-force references
of ``tests/*_reference.py`` (or an evaluator written here) where that is cheap, or
raise one of the documented error types: ``ValueError``, ``TypeError``,
``KeyError``, ``IndexError``. Any other exception (``OverflowError``,
``RecursionError``, ``MemoryError``, ``AttributeError``, ...) fails the test.
Sizes are either small or far above every limit, so nothing can take long.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mesh_reference import ModelMesh
from meshlayout import Layout, Mesh, ParallelDims, RankMap
from meshlayout.sharding import Partial, Replicate, Shard, ShardingSpec, StridedShard
from parallel_dims_reference import VIEW_DIMS, family, reference_views
from sharding_reference import reference_indices

DOCUMENTED = (ValueError, TypeError, KeyError, IndexError)
FUZZ = settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Failed:
    """The documented error a call raised (so that answers and errors can be told apart)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def attempt(fn: Callable[[], Any]) -> Any:
    """``fn()``, or :class:`Failed` if it raised a documented error; anything else propagates."""
    try:
        return fn()
    except DOCUMENTED as exc:
        assert str(exc), f"{type(exc).__name__} without a message from {fn}"
        return Failed(exc)


def ok(value: Any) -> bool:
    return not isinstance(value, Failed)


# ---------------------------------------------------------------------- hostile values
HUGE = [2**31, 2**40, 2**62, 2**63 - 1, 2**63, 2**64, 10**20, -(2**63), -(2**64)]
JUNK: list[Any] = [
    True,
    False,
    1.5,
    2.0,
    -0.0,
    float("nan"),
    float("inf"),
    "3",
    b"2",
    "",
    None,
    [2],
    (3,),
    [[1]],
    {"a": 1},
    1 + 2j,
    np.float64(2.0),
    np.bool_(True),
    np.array([2, 3]),
    np.array(4),
    Ellipsis,
]
NUMPY_INT_TYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64]

small = st.integers(-2, 9)
numpy_small = st.builds(lambda t, v: t(v), st.sampled_from(NUMPY_INT_TYPES), st.integers(0, 9))
hostile_int = st.one_of(
    small, small, small, numpy_small, st.sampled_from(HUGE), st.sampled_from(JUNK)
)
names = st.one_of(
    st.sampled_from(["a", "b", "c", "tp", "dp", "x_y", "not a name", "", "1a"]),
    st.sampled_from([None, 3, b"a", ("a",)]),
)


def hostile_tuple(elem: st.SearchStrategy[Any], max_size: int = 3) -> st.SearchStrategy[Any]:
    nested = st.recursive(elem, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)
    return st.one_of(
        st.lists(elem, max_size=max_size).map(tuple), st.lists(elem, max_size=max_size), nested
    )


# ---------------------------------------------------------------------- layout
def leaves(t: Any) -> list[int]:
    return [t] if isinstance(t, int) else [x for e in t for x in leaves(e)]


def reference_values(shape: Any, stride: Any) -> list[int]:
    """Every value of a layout by enumerating its coordinates (last mode fastest)."""
    sizes, strides = leaves(shape), leaves(stride)
    return [
        sum(c * d for c, d in zip(coord, strides))
        for coord in itertools.product(*(range(s) for s in sizes))
    ]


@FUZZ
@given(
    shape=st.one_of(hostile_int, hostile_tuple(hostile_int)),
    stride=st.one_of(st.none(), hostile_int, hostile_tuple(hostile_int)),
    probe=hostile_int,
    other=st.one_of(hostile_int, st.builds(Layout, st.integers(1, 6), st.integers(0, 4))),
)
def test_layout_answers_or_documented_errors(
    shape: Any, stride: Any, probe: Any, other: Any
) -> None:
    lay = attempt(lambda: Layout(shape, stride))
    if not ok(lay):
        return
    size = lay.size()
    assert size == math.prod(leaves(lay.shape))
    if size <= 512:
        values = reference_values(lay.shape, lay.stride)
        assert [lay(i) for i in range(size)] == values
        indices = attempt(lay.indices)
        if max(values) <= 2**63 - 1:
            assert indices.tolist() == values
        else:
            assert not ok(indices)
        assert attempt(lambda: lay.coalesce().equivalent(lay)) in (True,) or not ok(
            attempt(lay.coalesce)
        )
    else:
        attempt(lay.indices)  # refused past the limit or exact
    called = attempt(lambda: lay(probe))
    if ok(called) and isinstance(probe, int) and 0 <= probe < size:
        assert called == sum(
            c * d for c, d in zip(_digits(probe, leaves(lay.shape)), leaves(lay.stride))
        )
    attempt(lambda: lay[probe])
    attempt(lambda: lay.complement(probe))
    attempt(lambda: lay.compose(other))
    attempt(lay.right_inverse)
    attempt(lay.left_inverse)
    attempt(lay.is_injective)
    attempt(lambda: Layout.parse(repr(lay)) == lay)


def _digits(i: int, sizes: Sequence[int]) -> list[int]:
    out = []
    for s in reversed(sizes):
        out.append(i % s)
        i //= s
    return out[::-1]


# ---------------------------------------------------------------------- rank map
rank_inputs = st.one_of(
    st.builds(
        range,
        hostile_int.filter(lambda v: isinstance(v, int)),
        st.sampled_from([1, 5, 2**64, 10**20]),
    ),
    st.lists(st.integers(0, 40), min_size=0, max_size=8),
    st.lists(hostile_int, max_size=4),
    st.builds(
        lambda v: np.array(v, dtype=np.uint64),
        st.lists(st.sampled_from([0, 1, 5, 2**63 + 1, 2**64 - 1]), min_size=1, max_size=3),
    ),
    st.sampled_from(JUNK),
)


@FUZZ
@given(ranks=rank_inputs, index=hostile_int, rank=hostile_int)
def test_rank_map_answers_or_documented_errors(ranks: Any, index: Any, rank: Any) -> None:
    rm = attempt(lambda: RankMap(ranks))
    if not ok(rm):
        return
    n = len(rm)
    if isinstance(ranks, range):
        expect = ranks
        assert n == len(ranks) and (n == 0 or (rm[0] == ranks[0] and rm[-1] == ranks[-1]))
    else:
        expect = [int(v) for v in np.asarray(ranks).reshape(-1).tolist()]
        assert list(rm) == expect
        assert all(rm.position(r) == p for p, r in enumerate(expect))
    got = attempt(lambda: rm[index])
    if ok(got):
        assert isinstance(index, (int, np.integer)) and not isinstance(index, bool)
        assert got == expect[int(index)]
    pos = attempt(lambda: rm.position(rank))
    if ok(pos) and pos is not None:
        assert rm[pos] == rank
    assert (rank in rm) == (ok(pos) and pos is not None)


# ---------------------------------------------------------------------- mesh
mesh_shapes = st.one_of(
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(1, 4), min_size=1),
    st.lists(st.one_of(st.integers(1, 4), hostile_int), max_size=3),
    st.dictionaries(names, st.one_of(st.integers(1, 4), hostile_int), max_size=3),
    st.sampled_from(JUNK),
)
dims = st.one_of(names, hostile_int)


def _flat_ranks(ranks: Any, n: int) -> np.ndarray:
    if ranks is None:
        return np.arange(n)
    return np.asarray(list(ranks) if isinstance(ranks, range) else ranks, dtype=np.int64).reshape(
        -1
    )


@FUZZ
@given(
    shape=mesh_shapes,
    dim_names=st.one_of(st.none(), st.lists(names, max_size=3)),
    ranks_kind=st.sampled_from(["none", "range", "perm", "nested", "junk"]),
    junk=st.one_of(hostile_int, st.lists(hostile_int, max_size=3)),
    data=st.data(),
)
def test_mesh_answers_or_documented_errors(
    shape: Any, dim_names: Any, ranks_kind: str, junk: Any, data: st.DataObject
) -> None:
    sizes = list(shape.values()) if isinstance(shape, dict) else shape
    n = math.prod(sizes) if isinstance(sizes, list) and all(type(s) is int for s in sizes) else None
    ranks: Any = None
    if ranks_kind == "range":
        ranks = range(7, 7 + 3 * (n or 1), 3)
    elif ranks_kind in ("perm", "nested") and n is not None and 0 < n <= 64:
        flat = data.draw(st.permutations(range(n + 3)))[:n]
        ranks = np.array(flat).reshape(sizes).tolist() if ranks_kind == "nested" else flat
    elif ranks_kind == "junk":
        ranks = junk
    mesh = attempt(lambda: Mesh(shape, dim_names, ranks=ranks))
    if not ok(mesh):
        return
    if mesh.size() <= 64:
        _check_mesh_against_model(mesh, shape, ranks)
    rank = data.draw(
        st.one_of(st.sampled_from(list(itertools.islice(mesh.rank_map, 3))), hostile_int)
    )
    dim = data.draw(st.one_of(st.sampled_from(mesh.names), st.integers(-3, 3), dims))
    for call in (
        lambda: mesh.coordinate(rank),
        lambda: mesh.group(rank, dim),
        lambda: mesh.local_rank(rank, dim),
        lambda: mesh.submesh(rank),
        lambda: mesh.groups(dim),
        mesh.group_table,
        lambda: mesh.hosts_spanned(data.draw(hostile_int)),
        lambda: mesh[dim],
        lambda: Mesh.concat(
            data.draw(st.one_of(hostile_int, st.just([mesh, mesh]), st.just([mesh[0]])))
        ),
    ):
        attempt(call)
    small = mesh.size() <= 64
    model = (
        ModelMesh.root(mesh.shape, mesh.names, _flat_ranks(ranks, mesh.size())) if small else None
    )
    some_names = st.permutations(list(mesh.names)).flatmap(
        lambda p: st.integers(1, len(p)).map(lambda k: p[:k])
    )
    keys = data.draw(st.one_of(some_names, st.lists(dims, max_size=3)))
    sliced = attempt(lambda: mesh[keys])
    if ok(sliced) and model is not None:
        _same_family(sliced, model.slice([mesh.dim_index(k) for k in keys]))
    name = data.draw(st.one_of(st.none(), names))
    merged = attempt(lambda: mesh.flatten(name, dims=keys))
    if ok(merged) and model is not None:
        _same_family(merged, model.flatten_dims([mesh.dim_index(k) for k in keys], "m"))
    size = mesh.shape[mesh.dim_index(dim)] if ok(attempt(lambda: mesh.dim_index(dim))) else 1
    sizes = data.draw(
        st.one_of(
            st.just((size,)),
            st.sampled_from([(1, size), (size, 1)]),
            hostile_int,
            st.lists(hostile_int, max_size=3),
        )
    )
    new_names = data.draw(
        st.one_of(
            st.just(("u", "v")[: len(sizes)] if isinstance(sizes, tuple) else ()),
            names,
            st.lists(names, max_size=3),
        )
    )
    split = attempt(lambda: mesh.unflatten(dim, sizes, new_names))
    if ok(split) and model is not None:
        i = mesh.dim_index(dim)
        _same_family(split, model.unflatten(i, list(sizes), list(split.names[i : i + len(sizes)])))


def _same_family(mesh: Mesh, model: ModelMesh) -> None:
    """Same shape, and the same sub-meshes with the same ranks at the same coordinates."""
    assert mesh.shape == model.shape
    got = sorted(map(tuple, mesh.group_table().tolist()))
    want = sorted(map(tuple, model.submeshes().reshape(model.num_submeshes, -1).tolist()))
    assert got == want


def _check_mesh_against_model(mesh: Mesh, shape: Any, ranks: Any) -> None:
    model = ModelMesh.root(mesh.shape, mesh.names, _flat_ranks(ranks, mesh.size()))
    for r in model.ranks.tolist():
        assert mesh.coordinate(r) == model.coordinate(r)
        for i in range(mesh.ndim):
            assert mesh.group(r, i) == model.group(r, i)
    assert mesh.group_table().tolist() == model.submeshes().reshape(1, -1).tolist()


# ---------------------------------------------------------------------- sharding
def hostile_placement() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.builds(Shard, st.integers(-2, 1)),
        st.builds(StridedShard, st.integers(-2, 1), st.integers(1, 5)),
        st.just(Replicate()),
        st.builds(Partial, st.sampled_from(["sum", "max", "product", "band"])),
        st.builds(lambda d: attempt(lambda: Shard(d)), hostile_int),
        st.builds(lambda d, f: attempt(lambda: StridedShard(d, f)), hostile_int, hostile_int),
        st.builds(
            lambda op: attempt(lambda: Partial(op)), st.sampled_from(["mean", 3, None, "SUM"])
        ),
        st.sampled_from(JUNK),
    )


@FUZZ
@given(
    global_shape=st.one_of(
        st.lists(st.integers(0, 7), min_size=1, max_size=2), hostile_tuple(hostile_int)
    ),
    mesh_sizes=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    extra=st.sampled_from([0, 0, 0, -1, 1]),
    order=st.dictionaries(
        st.one_of(small, numpy_small, st.sampled_from([*HUGE, True, 1.5, "0", None, (0,)])),
        st.one_of(st.lists(st.one_of(st.integers(-2, 2), names), max_size=2), hostile_int),
        max_size=2,
    ),
    rank=hostile_int,
    data=st.data(),
)
def test_sharding_answers_or_documented_errors(
    global_shape: Any,
    mesh_sizes: list[int],
    extra: int,
    order: Any,
    rank: Any,
    data: st.DataObject,
) -> None:
    mesh = Mesh(mesh_sizes)
    count = max(0, len(mesh_sizes) + extra)
    drawn = data.draw(st.lists(hostile_placement(), min_size=count, max_size=count))
    placements = [p.exc if isinstance(p, Failed) else p for p in drawn]
    spec = attempt(lambda: ShardingSpec(global_shape, mesh, placements))
    by_order = attempt(lambda: ShardingSpec.from_shard_order(global_shape, mesh, order))
    for s in (spec, by_order):
        if ok(s):
            _check_spec(s, mesh, global_shape, rank)


def _check_spec(s: ShardingSpec, mesh: Mesh, global_shape: Any, rank: Any) -> None:
    shape = s.global_shape
    if math.prod(shape) <= 200 and max(shape, default=0) <= 200:  # the reference enumerates
        for r in range(mesh.size()):
            want = reference_indices(shape, mesh.shape, s.placements(), mesh.coordinate(r))
            got = s.local_runs(r)
            for d in range(len(shape)):
                assert [i for a, b in got[d] for i in range(a, b)] == want[d].tolist()
        array = np.arange(math.prod(shape)).reshape(shape)
        pieces = {r: attempt(lambda r=r: s.shard(array, r)) for r in range(mesh.size())}
        if all(ok(p) for p in pieces.values()):
            back = attempt(lambda: s.unshard(pieces))
            if ok(back) and not any(isinstance(p, Partial) for p in s.placements()):
                assert back.tolist() == array.tolist()
        attempt(lambda: s.shard(array.tolist(), 0))
    attempt(lambda: s.local_runs(rank))
    attempt(lambda: s.shard(global_shape, 0))
    attempt(lambda: s.unshard({0: global_shape}))


# ---------------------------------------------------------------------- ParallelDims
pd_degree = st.one_of(st.integers(1, 4), st.integers(1, 4), hostile_int)
PD_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep", "etp")
DENSE = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


@FUZZ
@given(
    degrees=st.fixed_dictionaries({}, optional={n: pd_degree for n in PD_DIMS}),
    world_kind=st.sampled_from(["product", "product", "hostile"]),
    world_junk=hostile_int,
    order=st.one_of(
        st.none(),
        st.permutations(DENSE),
        st.sampled_from(["tp,cp,dp_shard,dp_replicate,pp", "tp-cp-ep-dp-pp", "pp", ""]),
        st.sampled_from(JUNK),
    ),
    ranks_kind=st.sampled_from(["none", "none", "perm", "junk"]),
    data=st.data(),
)
def test_parallel_dims_answers_or_documented_errors(
    degrees: dict[str, Any],
    world_kind: str,
    world_junk: Any,
    order: Any,
    ranks_kind: str,
    data: st.DataObject,
) -> None:
    dense = [degrees.get(n, 1) for n in DENSE]
    world: Any = world_junk
    if world_kind == "product" and all(type(v) is int and v > 0 for v in dense):
        world = math.prod(dense)
    ranks: Any = None
    if ranks_kind == "perm" and type(world) is int and 0 < world <= 256:
        ranks = data.draw(st.permutations(range(world)))
    elif ranks_kind == "junk":
        ranks = data.draw(st.one_of(hostile_int, st.lists(hostile_int, max_size=3)))
    pd = attempt(lambda: ParallelDims(world, **degrees, order=order, ranks=ranks))
    if not ok(pd):
        return
    full = pd.degrees
    for n, v in degrees.items():
        assert full[n] == v or (n == "dp_shard" and v == -1)
    assert math.prod(full[n] for n in DENSE) == pd.world_size == world
    assert eval(repr(pd), {"ParallelDims": ParallelDims}) == pd
    if pd.world_size <= 256:
        ref = reference_views(pd.world_size, full, pd.order, ranks)
        wholes = {"dense": pd.dense, "sparse": pd.sparse, "dataloading": pd.dataloading}
        for name, view_dims in VIEW_DIMS.items():
            mesh = wholes.get(name) or pd.mesh(name)
            want = family(ref[name], len(view_dims)).reshape(mesh.num_submeshes, -1)
            got = mesh.group_table()
            assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist())), name
    attempt(lambda: pd.mesh(data.draw(st.one_of(names, st.lists(names, max_size=2), hostile_int))))
    attempt(lambda: pd.enabled(data.draw(names)))
