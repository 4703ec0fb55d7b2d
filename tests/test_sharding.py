"""meshlayout.sharding against a brute-force simulation (tests/sharding_reference.py)."""

from __future__ import annotations

import doctest
import gc
import itertools
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import meshlayout.sharding as sharding
from meshlayout.mesh import Mesh
from meshlayout.sharding import (
    REDUCE_OPS,
    Partial,
    Replicate,
    Shard,
    ShardingSpec,
    StridedShard,
)
from sharding_reference import (
    all_coords,
    brute_decode,
    chunk,
    literal_indices,
    nested_indices,
    reference_indices,
    reference_piece,
    replicating_dims,
    strided_split,
    torch_encoding,
)

SETTINGS = settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ---------------------------------------------------------------------- strategies
@st.composite
def raw_specs(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], list]:
    """Any placement list: decodable or not, negative dims, Replicate/Partial mixed in."""
    sizes = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    shape = tuple(draw(st.lists(st.integers(0, 13), min_size=1, max_size=3)))
    nd = len(shape)
    dims = st.integers(-nd, nd - 1)
    one = st.one_of(
        st.builds(Shard, dims),
        st.builds(StridedShard, dims, st.integers(1, 8)),
        st.just(Replicate()),
        st.builds(Partial, st.sampled_from(["sum", "max", "product"])),
    )
    placements = draw(st.lists(one, min_size=len(sizes), max_size=len(sizes)))
    return shape, sizes, placements


@st.composite
def order_specs(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], dict, dict]:
    """A random shard order (any permutation per tensor dim) plus Partial mesh dims."""
    sizes = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    shape = tuple(draw(st.lists(st.integers(0, 13), min_size=1, max_size=3)))
    role = draw(
        st.lists(
            st.sampled_from(["R", "P", *range(len(shape))]),
            min_size=len(sizes),
            max_size=len(sizes),
        )
    )
    order: dict[int, tuple[int, ...]] = {}
    for d in range(len(shape)):
        ms = [m for m, r in enumerate(role) if r == d]
        if ms:
            order[d] = tuple(draw(st.permutations(ms)))
    partial = {m: "sum" for m, r in enumerate(role) if r == "P"}
    return shape, sizes, order, partial


def expand(runs: tuple[tuple[int, int], ...]) -> np.ndarray:
    if not runs:
        return np.arange(0)
    return np.concatenate([np.arange(a, b) for a, b in runs])


def check_against_reference(spec: ShardingSpec, placements: list, ref_idx) -> None:
    """Every rank: runs, shape, offset, box-ness and piece equal the simulation's;
    the pieces partition the tensor; unshard inverts shard."""
    shape, mesh = spec.global_shape, spec.mesh
    sizes = mesh.shape
    array = np.arange(int(np.prod(shape))).reshape(shape)
    rep = replicating_dims(placements)
    sharded = {d for d, n in enumerate(shape) if spec._plan[d]}
    counts: dict[tuple[int, ...], np.ndarray] = {}
    pieces = {}
    for rank in range(int(np.prod(sizes))):
        coord = mesh.coordinate(rank)
        idx = ref_idx(coord)
        runs = spec.local_runs(rank)
        for d in range(len(shape)):
            np.testing.assert_array_equal(expand(runs[d]), idx[d], err_msg=f"rank {rank} dim {d}")
            assert all(b > a for a, b in runs[d])  # no empty runs
            assert all(runs[d][i][1] != runs[d][i + 1][0] for i in range(len(runs[d]) - 1))
        assert spec.local_shape(rank) == tuple(len(i) for i in idx)
        box = all(len(i) == 0 or np.array_equal(i, np.arange(i[0], i[0] + len(i))) for i in idx)
        assert spec.is_box(rank) == box
        if box:
            want = tuple(
                int(i[0]) if len(i) else (n if d in sharded else 0)
                for d, (i, n) in enumerate(zip(idx, shape))
            )
            assert spec.local_offset(rank) == want
        else:
            with pytest.raises(ValueError, match="not a box"):
                spec.local_offset(rank)
        piece = spec.shard(array, rank)
        expect = reference_piece(array, idx)
        zeroed = [
            m
            for m in rep
            if isinstance(placements[m], Partial)
            and placements[m].reduce_op in ("sum", "product")
            and coord[m] != 0
        ]
        if zeroed:
            ident = 0 if placements[zeroed[-1]].reduce_op == "sum" else 1
            expect = np.full_like(expect, ident)
        np.testing.assert_array_equal(piece, expect)
        pieces[rank] = piece
        key = tuple(coord[m] for m in rep)
        held = np.zeros(shape, dtype=np.int64)
        held[np.ix_(*idx)] += 1
        counts[key] = counts.get(key, np.zeros(shape, dtype=np.int64)) + held
    # exact partition: inside each group of fixed replicating coordinates, once each
    for key, c in counts.items():
        assert (c == 1).all(), f"group {key}: counts {c}"
    np.testing.assert_array_equal(spec.unshard(pieces), array)


# ---------------------------------------------------------------------- brute-force properties
@SETTINGS
@given(raw_specs())
def test_any_placement_list_matches_the_simulation(case) -> None:
    shape, sizes, placements = case
    mesh = Mesh(sizes)
    spec = ShardingSpec(shape, mesh, placements)
    has_strided = any(isinstance(p, StridedShard) for p in placements)
    decodable = not has_strided or brute_decode(placements, sizes, len(shape)) is not None
    assert spec.decodable == decodable
    check_against_reference(spec, placements, _ref(shape, sizes, placements))
    # a decodable list re-encodes to itself (StridedShard(d, 1) reads as Shard(d))
    if decodable:
        norm = [
            Shard(p.dim % len(shape))
            if isinstance(p, StridedShard) and p.split_factor == 1
            else type(p)(p.dim % len(shape), p.split_factor)
            if isinstance(p, StridedShard)
            else Shard(p.dim % len(shape))
            if isinstance(p, Shard)
            else p
            for p in placements
        ]
        assert list(spec.placements()) == norm
        assert ShardingSpec(shape, mesh, spec.placements()) == spec
    else:
        with pytest.raises(ValueError, match="cannot be decoded"):
            spec.shard_order()


@SETTINGS
@given(order_specs())
def test_any_shard_order_matches_nested_chunking(case) -> None:
    shape, sizes, order, partial = case
    mesh = Mesh(sizes)
    spec = ShardingSpec.from_shard_order(shape, mesh, order, partial=partial)
    assert spec.decodable
    placements = list(spec.placements())

    def ref(coord):
        return [
            nested_indices(n, order.get(d, ()), sizes, coord) if d in order else np.arange(n)
            for d, n in enumerate(shape)
        ]

    check_against_reference(spec, placements, ref)
    # encoding: torch's split factors, Shard where 1, Partial/Replicate elsewhere
    for m, p in enumerate(placements):
        if m in partial:
            assert p == Partial("sum")
        elif not any(m in o for o in order.values()):
            assert p == Replicate()
    canon = spec.shard_order()
    assert set(canon) == set(order)
    for d, o in order.items():
        sf = torch_encoding(o, sizes)
        got = {
            m: p.split_factor if isinstance(p, StridedShard) else 1
            for m, p in enumerate(placements)
            if m in o
        }
        assert got == sf
        assert sorted(canon[d]) == sorted(o)
        # only size-1 mesh dims (which split nothing) may move
        assert [m for m in canon[d] if sizes[m] > 1] == [m for m in o if sizes[m] > 1]
        if all(sizes[m] > 1 for m in o):
            assert canon[d] == o
    # decode(encode(order)) is a fixed point and an equal spec
    again = ShardingSpec.from_shard_order(shape, mesh, canon, partial=partial)
    assert again == spec and hash(again) == hash(spec)
    assert again.shard_order() == canon
    assert ShardingSpec(shape, mesh, placements) == spec


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw_specs())
def test_torch_split_runs_is_the_literal_walk(case) -> None:
    """torch_split_runs == the reference literal split, for every coordinate."""
    shape, sizes, placements = case
    steps = sharding.placement_steps(placements, sizes, len(shape))
    for d, s in enumerate(steps):
        want = [
            (m, sizes[m], p.split_factor if isinstance(p, StridedShard) else 1)
            for m, p in enumerate(placements)
            if isinstance(p, (Shard, StridedShard)) and p.dim % len(shape) == d
        ]
        assert list(s) == want
    for coord in all_coords(sizes):
        runs = sharding.torch_split_runs(shape, sizes, placements, coord)
        for d, n in enumerate(shape):
            want = literal_indices(n, d, placements, sizes, coord, len(shape))
            np.testing.assert_array_equal(expand(runs[d]), want)


def test_placement_steps_validates() -> None:
    with pytest.raises(ValueError, match="one placement per mesh dim"):
        sharding.placement_steps([Shard(0)], (2, 2), 1)
    with pytest.raises(ValueError, match="out of range"):
        sharding.placement_steps([Shard(2)], (2,), 2)
    assert "placement_steps" in sharding.__all__ and "torch_split_runs" in sharding.__all__


def _ref(shape, sizes, placements):
    return lambda c: reference_indices(shape, sizes, placements, c)


def test_fsdp_over_tp_sweep_exact_everywhere() -> None:
    """Deterministic sweep: [StridedShard(0, tp), Shard(0)] and its literal twin."""
    checked = 0
    for dp, tp, n in itertools.product(range(1, 6), range(1, 6), range(14)):
        mesh = Mesh({"dp": dp, "tp": tp})
        pl = [StridedShard(0, tp), Shard(0)]
        spec = ShardingSpec((n,), mesh, pl)
        assert spec.shard_order() == ({0: (1, 0)} if tp > 1 else {0: (0, 1)})
        check_against_reference(spec, pl, _ref((n,), (dp, tp), pl))
        checked += 1
    assert checked == 350


def test_chunk_rule_matches_torch_chunk() -> None:
    torch = pytest.importorskip("torch")
    for n in range(0, 20):
        for k in range(1, 7):
            want = [list(t.tolist()) for t in torch.chunk(torch.arange(n), k)] if n else []
            want += [[]] * (k - len(want))
            got = [list(chunk(np.arange(n), k)[i]) for i in range(k)]
            assert got == want
            assert [sharding.chunk_bounds(n, k, i) for i in range(k)] == [
                (min(i * -(-n // k), n), min((i + 1) * -(-n // k), n)) for i in range(k)
            ]


# ---------------------------------------------------------------------- the torch 2.13 cases
def test_issue_case_uneven_strided_alone_is_literal() -> None:
    """distribute_tensor(arange(5), mesh(2,), [_StridedShard(0, 2)]) asserts in torch."""
    spec = ShardingSpec((5,), Mesh((2,)), [StridedShard(0, 2)])
    assert not spec.decodable
    assert spec.local_runs(0) == (((0, 2), (3, 4)),)
    assert spec.local_runs(1) == (((2, 3), (4, 5)),)
    a = np.arange(5)
    assert spec.shard(a, 0).tolist() == [0, 1, 3]
    assert spec.shard(a, 1).tolist() == [2, 4]
    np.testing.assert_array_equal(spec.unshard({r: spec.shard(a, r) for r in (0, 1)}), a)


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        # rank = dp * 2 + tp; TP splits rows first, then FSDP splits each TP piece
        (7, [(0, 2), (4, 5), (2, 4), (5, 6), None, (6, 7)]),
        (13, [(0, 3), (7, 9), (3, 6), (9, 11), (6, 7), (11, 13)]),
    ],
)
def test_issue_case_fsdp_over_tp_dp3_tp2(rows: int, expected: list) -> None:
    mesh = Mesh({"dp": 3, "tp": 2})
    spec = ShardingSpec((rows, 4), mesh, [StridedShard(0, 2), Shard(0)])
    assert spec.shard_order() == {0: (1, 0)}
    for rank, run in enumerate(expected):
        assert spec.local_runs(rank) == ((run,) if run else (), ((0, 4),))
    if rows == 7:
        # rank (2, 0) physically holds no rows, rank (2, 1) holds row 6
        assert spec.local_shape(4) == (0, 4) and spec.local_offset(4) == (7, 0)
        assert spec.local_shape(5) == (1, 4) and spec.local_offset(5) == (6, 0)


def test_issue_case_51_of_656_and_never_dp2() -> None:
    """torch's split meaning differs from FSDP2's nested layout in exactly 51 of the
    656 (dp, tp, n) combinations with dp, tp in 2..5 and n in 0..40; never at dp = 2.
    We follow the nested layout everywhere."""
    wrong = []
    for dp, tp, n in itertools.product(range(2, 6), range(2, 6), range(41)):
        pl = [StridedShard(0, tp), Shard(0)]
        spec = ShardingSpec((n,), Mesh((dp, tp)), pl)
        differs = False
        for rank, c in enumerate(all_coords((dp, tp))):
            nested = nested_indices(n, (1, 0), (dp, tp), c)
            np.testing.assert_array_equal(expand(spec.local_runs(rank)[0]), nested)
            differs |= not np.array_equal(nested, literal_indices(n, 0, pl, (dp, tp), c, 1))
        if differs:
            wrong.append((dp, tp, n))
    assert len(wrong) == 51
    assert all(dp != 2 for dp, _, _ in wrong)
    assert (3, 2, 7) in wrong and (3, 2, 13) in wrong


def test_issue_case_three_level_checkpoint_round_trip() -> None:
    """[_StridedShard(0, 6), Shard(0), Shard(0)], 9 rows, mesh (2, 2, 3): DCP with
    torch's (shape, offset) permutes rows to [0,1,2,3,4,6,5,8,7]; ours is exact."""
    sizes = (2, 2, 3)
    mesh = Mesh(sizes)
    pl = [StridedShard(0, 6), Shard(0), Shard(0)]
    spec = ShardingSpec((9,), mesh, pl)
    assert spec.shard_order() == {0: (1, 2, 0)}
    data = np.arange(9)
    ours = np.full(9, -1)
    theirs = np.full(9, -1)
    for rank, c in enumerate(all_coords(sizes)):
        local = spec.shard(data, rank)  # what the nested layout physically holds
        (off,), (size,) = spec.local_offset(rank), spec.local_shape(rank)
        ours[off : off + size] = local
        lit = literal_indices(9, 0, pl, sizes, c, 1)  # torch's split-meaning box
        if len(lit):
            theirs[lit[0] : lit[0] + len(lit)] = local
    np.testing.assert_array_equal(ours, data)
    assert theirs.tolist() == [0, 1, 2, 3, 4, 6, 5, 8, 7]


def test_issue_case_two_strided_is_undecodable_and_exact() -> None:
    """[_StridedShard(0,2), _StridedShard(0,2)], 8 rows: torch's full_tensor gives
    [0,4,2,6,1,5,3,7]; the literal pieces reassemble exactly."""
    spec = ShardingSpec((8,), Mesh((2, 2)), [StridedShard(0, 2), StridedShard(0, 2)])
    assert not spec.decodable
    a = np.arange(8)
    pieces = {r: spec.shard(a, r) for r in range(4)}
    assert [pieces[r].tolist() for r in range(4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert spec.local_runs(0) == (((0, 1), (4, 5)),)
    np.testing.assert_array_equal(spec.unshard(pieces), a)


def test_issue_case_strided_alone_is_not_a_box() -> None:
    spec = ShardingSpec((8,), Mesh((2,)), [StridedShard(0, 2)])
    assert spec.local_runs(0) == (((0, 2), (4, 6)),)
    assert spec.local_shape(0) == (4,)
    assert not spec.is_box(0)
    with pytest.raises(ValueError, match=r"rank 0 holds runs .*not a box"):
        spec.local_offset(0)


# ---------------------------------------------------------------------- meshes, ranks, cost
def test_family_mesh_uses_each_ranks_own_submesh() -> None:
    root = Mesh({"pp": 2, "dp": 3, "tp": 2})
    fam = root["tp"]  # 6 TP groups
    spec = ShardingSpec((5, 3), fam, [Shard(0)])
    for rank in range(12):
        tp = rank % 2
        assert spec.local_runs(rank) == (((0, 3),) if tp == 0 else ((3, 5),), ((0, 3),))
    a = np.arange(15).reshape(5, 3)
    every = {r: spec.shard(a, r) for r in range(12)}
    np.testing.assert_array_equal(spec.unshard(every), a)
    np.testing.assert_array_equal(spec.unshard({6: every[6], 7: every[7]}), a)
    with pytest.raises(ValueError, match="held by none"):
        spec.unshard({6: every[6], 8: every[8]})
    bad = dict(every)
    bad[9] = bad[9] + 1
    with pytest.raises(ValueError, match="disagrees"):
        spec.unshard(bad)


def test_family_mesh_partial_reduces_within_each_submesh() -> None:
    root = Mesh({"dp": 2, "tp": 2})
    spec = ShardingSpec((4,), root["tp"], [Partial("sum")])
    pieces = {0: np.array([1, 2, 3, 4]), 1: np.array([9, 8, 7, 6])}
    np.testing.assert_array_equal(spec.unshard(pieces), [10, 10, 10, 10])
    with pytest.raises(ValueError, match="every member is needed"):
        spec.unshard({0: pieces[0]})
    pieces.update({2: np.array([5, 5, 5, 5]), 3: np.array([6, 5, 5, 5])})
    with pytest.raises(ValueError, match="disagrees"):
        spec.unshard(pieces)


def test_partial_ops_round_trip() -> None:
    mesh = Mesh({"a": 2, "b": 3})
    a = np.arange(1, 7).reshape(2, 3)
    for op in ("sum", "avg", "min", "max", "product", "band", "bor", "bxor"):
        spec = ShardingSpec((2, 3), mesh, [Partial(op), Shard(1)])
        got = spec.unshard({r: spec.shard(a, r) for r in range(6)})
        np.testing.assert_array_equal(got, a)


def test_ranks_outside_the_mesh_hold_nothing() -> None:
    mesh = Mesh((2, 2), ranks=range(4, 8))
    spec = ShardingSpec((6, 5), mesh, [Shard(0), Replicate()])
    assert spec.local_runs(0) == ((), ())
    assert spec.local_shape(0) == (0, 0)
    assert spec.local_offset(0) == (6, 5)
    assert spec.shard(np.arange(30).reshape(6, 5), 0).shape == (0, 0)
    assert spec.local_runs(6) == (((3, 6),), ((0, 5),))
    with pytest.raises(ValueError, match="not in the mesh"):
        spec.unshard({0: np.zeros((0, 0))})


def test_permuted_rank_map() -> None:
    mesh = Mesh((2, 2), ranks=[[3, 1], [2, 0]])
    spec = ShardingSpec((4,), mesh, [Shard(0), Shard(0)])
    assert [spec.local_runs(r)[0] for r in (3, 1, 2, 0)] == [((i, i + 1),) for i in range(4)]


def python_calls(op: Callable[[], object]) -> int:
    """How many Python function calls ``op`` makes: a cost measure free of timing noise.

    The garbage collector is off while counting: a collection could run finalisers or
    weakref callbacks of earlier tests' objects (Python calls that are not ``op``'s).
    """
    count = 0

    def tracer(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event == "call"

    gc.collect()
    gc.disable()
    sys.setprofile(tracer)
    try:
        op()
    finally:
        sys.setprofile(None)
        gc.enable()
    return count


def test_cost_is_independent_of_tensor_size() -> None:
    mesh = Mesh({"dp": 3, "cp": 5, "tp": 7})
    pl = [StridedShard(0, 7), Shard(1), Shard(0)]

    def all_shapes(n: int) -> list[tuple[int, ...]]:
        spec = ShardingSpec((n, n), mesh, pl)
        return [spec.local_shape(rank) for rank in range(105)]

    n = 2**62 + 12345
    all_shapes(10**6 + 9)  # warm what every size shares (mesh caches), whichever test ran first
    huge_cost = python_calls(lambda: all_shapes(n))
    small_cost = python_calls(lambda: all_shapes(10**6 + 7))
    # The same work for 2**62 rows as for 10**6 (an O(rows) path would differ by ~10**12x);
    # a few calls of slack for bounded caches that earlier tests may have filled.
    assert abs(huge_cost - small_cost) <= small_cost // 50, (huge_cost, small_cost)
    total = sum(a * (b > 0) for a, b in all_shapes(n))
    assert total == n * 5  # each row on one (dp, tp) pair, and on each of its 5 cp ranks
    lit = ShardingSpec((n,), Mesh((2, 2)), [StridedShard(0, 2), StridedShard(0, 2)])
    assert sum(lit.local_shape(r)[0] for r in range(4)) == n
    huge = ShardingSpec((5,), Mesh((2,)), [StridedShard(0, 10**12)])
    assert [huge.local_runs(r) for r in (0, 1)] == [(((0, 5),),), ((),)]


def test_literal_split_cost_does_not_depend_on_the_split_factor() -> None:
    """Issue 10: StridedShard(0, 10**12) on 10**12 rows answers in closed form."""
    n = 10**12

    def runs(sf: int) -> list[tuple[Any, ...]]:
        spec = ShardingSpec((n,), Mesh((2,)), [StridedShard(0, sf)])
        return [spec.local_runs(r) for r in (0, 1)]

    runs(10**4)  # warm what every split factor shares, whichever test ran first
    assert runs(10**12) == [(((0, n),),), ((),)]  # one-row pieces: rank 0 keeps every row
    assert runs(10**15) == runs(10**12)
    costs = {sf: python_calls(lambda sf=sf: runs(sf)) for sf in (10**3, 10**12, 10**15)}
    assert costs[10**12] == costs[10**15] <= costs[10**3], costs
    # a literal list of many pieces: the count of runs is the answer's size, then a limit
    spec = ShardingSpec((n,), Mesh((2,)), [StridedShard(0, 1000)])
    assert len(spec.local_runs(0)[0]) == 1000 and spec.local_shape(0) == (n // 2,)
    too_many = ShardingSpec((n,), Mesh((2,)), [StridedShard(0, 10**6)])
    with pytest.raises(ValueError, match=r"gives piece 0 1000000 runs, more than MAX_RUNS = 65536"):
        too_many.local_runs(0)


def test_literal_runs_refuses_exactly_past_max_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import meshlayout.sharding._order as order

    monkeypatch.setattr(order, "MAX_RUNS", 10)
    assert len(sharding.literal_runs(40, [(2, 0, 10)])) == 10
    with pytest.raises(ValueError, match="11 runs, more than MAX_RUNS = 10"):
        sharding.literal_runs(44, [(2, 0, 11)])
    assert sharding.literal_runs(44, [(1, 0, 11)]) == ((0, 44),)  # whole pieces merge


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(0, 150),
    st.lists(
        st.tuples(st.integers(1, 6), st.integers(0, 5), st.integers(1, 400)), min_size=1, max_size=3
    ),
)
def test_literal_runs_closed_form_matches_the_simulation(n: int, raw: list) -> None:
    steps = [(k, i % k, sf) for k, i, sf in raw]
    idx = np.arange(n)
    for k, i, sf in steps:
        idx = strided_split(idx, sf, k, i)
    runs = sharding.literal_runs(n, steps)
    np.testing.assert_array_equal(expand(runs), idx)
    assert all(b > a for a, b in runs)
    assert all(runs[j][1] < runs[j + 1][0] for j in range(len(runs) - 1))  # sorted, merged


def test_local_queries_are_cached_per_rank() -> None:
    spec = ShardingSpec((7,), Mesh((3, 2)), [StridedShard(0, 2), Shard(0)])
    assert spec.local_runs(3) is spec.local_runs(3)


# ---------------------------------------------------------------------- value objects, errors
def test_placements_are_values() -> None:
    assert Shard(0) == Shard(0) and hash(Shard(0)) == hash(Shard(0))
    assert Shard(0) != StridedShard(0, 1) and Shard(0) != Shard(1)
    assert len({Replicate(), Replicate(), Partial(), Partial("sum"), Partial("max")}) == 3
    assert repr(StridedShard(1, 4)) == "StridedShard(dim=1, split_factor=4)"
    assert str(Partial()) == "P(sum)" and str(Replicate()) == "R"
    for p in (Shard(-1), StridedShard(0, 3), Replicate(), Partial("avg")):
        assert eval(repr(p)) == p
        assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(AttributeError):
        Shard(0).dim = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        Shard(1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Shard(True)
    with pytest.raises(ValueError, match="split_factor must be >= 1"):
        StridedShard(0, 0)
    with pytest.raises(ValueError, match="reduce_op"):
        Partial("mean")
    assert Shard(np.int64(2)).dim == 2


def test_spec_value_semantics() -> None:
    mesh = Mesh({"dp": 2, "tp": 2})
    a = ShardingSpec((8, 3), mesh, [StridedShard(0, 2), Shard(0)])
    b = ShardingSpec.from_shard_order([8, 3], mesh, {0: ["tp", "dp"]})
    assert a == b and hash(a) == hash(b)
    assert a != ShardingSpec((8, 3), mesh, [Shard(0), Shard(0)])
    assert ShardingSpec((8,), mesh, [StridedShard(0, 1), Shard(-1)]) == ShardingSpec(
        (8,), mesh, [Shard(0), Shard(0)]
    )
    assert "StridedShard(dim=0, split_factor=2)" in repr(a)
    c = pickle.loads(pickle.dumps(a))
    assert c == a and c.local_runs(1) == a.local_runs(1)
    with pytest.raises(AttributeError):
        a.global_shape = (1,)  # type: ignore[misc]


def test_spec_errors_name_placement_and_sizes() -> None:
    mesh = Mesh({"dp": 3, "tp": 2})
    with pytest.raises(ValueError, match=r"1 placements \[Shard\(dim=0\)\] for a 2-D mesh"):
        ShardingSpec((4,), mesh, [Shard(0)])
    with pytest.raises(ValueError, match=r"Shard\(dim=2\) on mesh dim 1 \(size 2\).*\(4, 5\)"):
        ShardingSpec((4, 5), mesh, [Replicate(), Shard(2)])
    with pytest.raises(ValueError, match=r"StridedShard\(dim=-3.*out of range"):
        ShardingSpec((4, 5), mesh, [StridedShard(-3, 2), Replicate()])
    with pytest.raises(ValueError, match="negative sizes"):
        ShardingSpec((4, -1), mesh, [Replicate(), Replicate()])
    with pytest.raises(TypeError, match="not a placement"):
        ShardingSpec((4,), mesh, [Replicate(), "S(0)"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="mesh"):
        ShardingSpec((4,), (3, 2), [Replicate(), Replicate()])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="global_shape"):
        ShardingSpec("44", mesh, [Replicate(), Replicate()])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ShardingSpec((4.0,), mesh, [Replicate(), Replicate()])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shape"):
        ShardingSpec((4,), mesh, [Shard(0), Replicate()]).shard(np.arange(5), 0)
    with pytest.raises(ValueError, match="expected"):
        ShardingSpec((4,), mesh, [Shard(0), Replicate()]).unshard({0: np.arange(4)})
    with pytest.raises(ValueError, match="at least one"):
        ShardingSpec((4,), mesh, [Shard(0), Replicate()]).unshard({})


def test_from_shard_order_errors() -> None:
    mesh = Mesh({"dp": 3, "tp": 2})
    with pytest.raises(KeyError, match="valid names"):
        ShardingSpec.from_shard_order((4,), mesh, {0: ("pp",)})
    with pytest.raises(ValueError, match="appears in order"):
        ShardingSpec.from_shard_order((4, 4), mesh, {0: ("tp",), 1: ("tp",)})
    with pytest.raises(ValueError, match="already in Partial"):
        ShardingSpec.from_shard_order((4,), mesh, {0: ("tp",)}, partial="tp")
    with pytest.raises(ValueError, match="tensor dim 1 out of range"):
        ShardingSpec.from_shard_order((4,), mesh, {1: ("tp",)})
    with pytest.raises(ValueError, match="mesh dim 2 out of range"):
        ShardingSpec.from_shard_order((4,), mesh, {0: (2,)})
    with pytest.raises(ValueError, match="reduce_op"):
        ShardingSpec.from_shard_order((4,), mesh, {}, partial={"dp": "mean"})
    spec = ShardingSpec.from_shard_order((4,), mesh, {-1: (-1, 0)}, partial=None)
    assert spec.shard_order() == {0: (1, 0)}
    # a negative tensor dim that aliases a positive one is an error, not a silent drop
    with pytest.raises(ValueError, match=r"order keys 0 and -2 both name tensor dim 0"):
        ShardingSpec.from_shard_order((7, 4), mesh, {0: ("tp",), -2: ("dp",)})
    with pytest.raises(ValueError, match=r"order keys -1 and (np\.int64\()?0"):
        ShardingSpec.from_shard_order((7,), mesh, {-1: ("tp",), np.int64(0): ("dp",)})
    spec = ShardingSpec.from_shard_order((4,), mesh, {0: ()}, partial={"dp": "max"})
    assert spec.placements() == (Partial("max"), Replicate())


def test_shard_and_unshard_take_nested_lists_and_name_bad_types() -> None:
    spec = ShardingSpec((4, 2), Mesh((2,)), [Shard(0)])
    rows = [[1, 2], [3, 4], [5, 6], [7, 8]]
    assert spec.shard(rows, 1).tolist() == [[5, 6], [7, 8]]
    assert spec.unshard({0: rows[:2], 1: tuple(rows[2:])}).tolist() == rows
    with pytest.raises(TypeError, match=r"shard: array must be a numpy array.*got str"):
        spec.shard("abcd", 0)
    with pytest.raises(TypeError, match="got dict"):
        spec.shard({0: 1}, 0)
    with pytest.raises(ValueError, match="ragged nested list"):
        spec.shard([[1, 2], [3]], 0)
    with pytest.raises(TypeError, match="must hold numbers"):
        spec.shard([["a", "b"]] * 4, 0)
    with pytest.raises(TypeError, match=r"the piece of rank 1 must be .*got NoneType"):
        spec.unshard({0: rows[:2], 1: None})


@pytest.mark.parametrize("op", ["band", "bor", "bxor"])
def test_bitwise_partial_on_float_data_names_the_op_and_dtype(op: str) -> None:
    spec = ShardingSpec((4,), Mesh((2,)), [Partial(op)])
    with pytest.raises(TypeError, match=rf"Partial\('{op}'\) reduces with bitwise .* got float64"):
        spec.shard(np.zeros(4), 0)
    with pytest.raises(TypeError, match=rf"Partial\('{op}'\).*got float32"):
        spec.unshard({0: np.zeros(4, np.float32), 1: np.zeros(4, np.float32)})
    ints = {0: np.array([3, 3, 1, 0]), 1: np.array([1, 2, 3, 0])}
    want = {"band": [1, 2, 1, 0], "bor": [3, 3, 3, 0], "bxor": [2, 1, 2, 0]}[op]
    assert spec.unshard(ints).tolist() == want
    assert spec.unshard({0: np.ones(4, bool), 1: np.ones(4, bool)}).dtype == bool


@settings(max_examples=300, deadline=None)
@given(raw_specs())
def test_str_of_every_placement_parses_back(case) -> None:
    """One spelling: ``str(p)`` is what ``--placements`` reads (``SS(d,sf)``, not ``_S``)."""
    from meshlayout.cli.args import parse_placements

    _, _, placements = case
    text = ",".join(map(str, placements))
    assert parse_placements(text) == placements
    assert [str(p) for p in parse_placements(f"[{text}]")] == [str(p) for p in placements]
    assert str(StridedShard(-1, 12)) == "SS(-1,12)"


# ---------------------------------------------------------------------- packaging
def test_import_does_not_import_torch() -> None:
    code = "import sys, meshlayout.sharding; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_docstring_examples() -> None:
    import meshlayout.sharding._arrays as arrays
    import meshlayout.sharding._literal as lit
    import meshlayout.sharding._order as o
    import meshlayout.sharding._placements as p
    import meshlayout.sharding._spec as s

    for mod in (sharding, o, p, s, arrays, lit):
        result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS)
        assert result.failed == 0, mod.__name__
    assert doctest.testmod(s).attempted >= 5


#: Two-op combinations that cannot reduce one tensor exactly, whatever the values:
#: the mean of integers is fractional before a bitwise op sees it.
_NEVER_EXACT = {("avg", b) for b in ("band", "bor", "bxor")} | {
    (b, "avg") for b in ("band", "bor", "bxor")
}


@pytest.mark.parametrize("first", REDUCE_OPS)
@pytest.mark.parametrize("second", REDUCE_OPS)
@pytest.mark.parametrize("dtype", ["int64", "int8", "float64", "float32", "bool"])
def test_every_pair_of_partial_ops_round_trips_or_names_the_ops_and_dtype(
    first: str, second: str, dtype: str
) -> None:
    """``unshard(shard(x))`` on ``[Partial(a), Partial(b)]``: ``x`` back, or a TypeError
    that names an op and the dtype, never numpy's own error or a wrong value."""
    spec = ShardingSpec((4,), Mesh((2, 2)), [Partial(first), Partial(second)])
    x = np.array([1, 0, 3, 2]).astype(dtype)
    bitwise = {"band", "bor", "bxor"} & {first, second}
    refused = (
        (bitwise and dtype.startswith("float"))
        or ("avg" in (first, second) and dtype == "bool")
        or (first, second) in _NEVER_EXACT
    )
    if refused:
        with pytest.raises(TypeError) as info:
            spec.unshard({r: spec.shard(x, r) for r in range(4)})
        text = str(info.value)
        assert any(f"Partial('{op}')" in text for op in (first, second)), text
        assert dtype in text or "bool" in text, text
        return
    got = spec.unshard({r: spec.shard(x, r) for r in range(4)})
    assert got.tolist() == x.tolist(), (first, second, dtype, got)


def test_partial_pairs_on_torch_tensors_refuse_like_numpy() -> None:
    torch = pytest.importorskip("torch")
    spec = ShardingSpec((4,), Mesh((2, 2)), [Partial("band"), Partial("avg")])
    x = torch.tensor([1, 0, 3, 2])
    with pytest.raises(TypeError, match=r"Partial\('band'\) and Partial\('avg'\).*int64"):
        spec.unshard({r: spec.shard(x, r) for r in range(4)})
    mean = ShardingSpec((4,), Mesh((2,)), [Partial("avg")])
    with pytest.raises(TypeError, match=r"Partial\('avg'\) averages.*bool"):
        mean.shard(torch.ones(4, dtype=torch.bool), 0)
    both = ShardingSpec((4,), Mesh((2, 2)), [Partial("bxor"), Partial("max")])
    assert both.unshard({r: both.shard(x, r) for r in range(4)}).tolist() == [1, 0, 3, 2]
