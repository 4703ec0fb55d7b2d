"""RunsSpec and view_spec against brute force: element ids cut with plain numpy indexing.

The reference never asks the spec how to cut: a rank's local piece is built here from
the runs it was given (``np.ix_`` of every run's indices, in local order), and plans
are checked element by element against those pieces.
"""

from __future__ import annotations

import itertools
import math
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshlayout import Mesh
from meshlayout.sharding import (
    Partial,
    Replicate,
    RunsSpec,
    Shard,
    ShardingSpec,
    StridedShard,
    _boxes,
    _reshard,
    local_slices,
    pieces,
    reshard_plan,
    run_boxes,
    transfer_plan,
    view_spec,
)
from reshard_strategies import covered, specs

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
RANKS = tuple(range(40))


# ---------------------------------------------------------------------- reference
def ref_cut(x: np.ndarray, runs) -> np.ndarray:
    """The local piece of ``runs`` (per dim, global runs in local order), by hand."""
    if not runs:
        return x.copy()
    idx = [[i for a, b in rs for i in range(a, b)] for rs in runs]
    if any(not ix for ix in idx):
        return np.zeros([len(ix) for ix in idx], dtype=x.dtype)
    return x[np.ix_(*idx)].copy()


def ids(shape) -> np.ndarray:
    return np.arange(math.prod(shape), dtype=np.int64).reshape(shape)


def held(spec, given, shape) -> dict[int, np.ndarray]:
    """{rank: its local piece of element ids}: given runs for RunsSpec, shard() otherwise."""
    x = ids(shape)
    if given is not None:
        return {r: ref_cut(x, rr) for r, rr in given.items()}
    return {r: spec.shard(x, r) for r in covered(spec)}


# ---------------------------------------------------------------------- strategies
def _segments(draw, n: int) -> list[tuple[int, int]]:
    """A random partition of [0, n) into runs."""
    if n < 2:
        return [(0, n)] if n else []
    cuts = sorted(draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 6))))
    edges = [0, *cuts, n]
    return list(itertools.pairwise(edges))


@st.composite
def grouped_runs(draw, shape, full: bool):
    """Pieces: groups of segments along one dim (shuffled: several runs, local order),
    times random segment subsets (shuffled) along the others."""
    d0 = draw(st.integers(0, len(shape) - 1))
    segs = [_segments(draw, n) for n in shape]
    order = draw(st.permutations(segs[d0]))
    k = draw(st.integers(1, max(1, len(order))))
    groups = [order[i::k] for i in range(k)]
    out = []
    for g in groups:
        if not g or (not full and draw(st.integers(0, 3)) == 0):
            continue
        runs = []
        for d, s in enumerate(segs):
            if d == d0:
                runs.append(tuple(g))
            elif full:
                runs.append(tuple(draw(st.permutations(s))))
            else:
                sub = draw(st.lists(st.sampled_from(s), min_size=1, unique=True)) if s else []
                runs.append(tuple(sub))
        out.append(tuple(runs))
    return out


@st.composite
def guillotine_runs(draw, shape, full: bool):
    """Boxes from random recursive cuts (no grid in general); some dropped if not full."""
    boxes = [tuple((0, n) for n in shape)]
    for _ in range(draw(st.integers(0, 9))):
        i = draw(st.integers(0, len(boxes) - 1))
        box = boxes[i]
        d = draw(st.integers(0, len(shape) - 1))
        a, b = box[d]
        if b - a < 2:
            continue
        c = draw(st.integers(a + 1, b - 1))
        boxes[i : i + 1] = [
            (*box[:d], (a, c), *box[d + 1 :]),
            (*box[:d], (c, b), *box[d + 1 :]),
        ]
    if not full:
        boxes = [b for b in boxes if draw(st.booleans())]
    return [tuple(((a, b),) if b > a else () for a, b in box) for box in boxes]


@st.composite
def runs_specs(draw, shape=None, full: bool | None = None, kinds=None):
    """(RunsSpec, {rank: runs}) with replicas, multi-run pieces, empty listed ranks."""
    if shape is None:
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=0, max_size=3)))
    if full is None:
        full = draw(st.booleans())
    if not shape:
        distinct = [()]
    elif math.prod(shape) == 0:
        distinct = []
    else:
        kind = draw(st.sampled_from(kinds or [grouped_runs, guillotine_runs]))
        distinct = [p for p in draw(kind(shape, full)) if all(p)]
    h = draw(st.integers(1, 3))
    need = len(distinct) * h + 2
    ranks = draw(st.lists(st.sampled_from(RANKS), min_size=need, max_size=need, unique=True))
    given = {}
    for i, p in enumerate(distinct):
        for r in ranks[i * h : (i + 1) * h]:
            given[r] = p
    empties = draw(st.integers(0 if given else 1, 2))
    for r in ranks[len(distinct) * h : len(distinct) * h + empties]:
        if shape:
            d = draw(st.integers(0, len(shape) - 1))
            given[r] = tuple(() if k == d else ((0, n),) if n else () for k, n in enumerate(shape))
        elif not given:
            given[r] = ()
    return RunsSpec(shape, given), given


# ---------------------------------------------------------------------- local pieces
@SETTINGS
@given(runs_specs())
def test_local_pieces_and_round_trip(case) -> None:
    spec, given = case
    shape = spec.global_shape
    x = ids(shape)
    assert spec.mesh.shape == (len(given),)
    assert sorted(covered(spec)) == sorted(given)
    assert spec.placements() == () and not spec.decodable
    for r in [*given, 99]:
        rr = given.get(r, ((),) * len(shape))
        assert spec.local_runs(r) == rr
        want = ref_cut(x, rr) if r in given else np.zeros((0,) * len(shape), dtype=np.int64)
        assert spec.local_shape(r) == (tuple(want.shape) if r in given else (0,) * len(shape))
        assert spec.is_box(r) == all(len(rs) <= 1 for rs in rr)
        if spec.is_box(r):
            off = tuple(rs[0][0] if rs else n for rs, n in zip(rr, shape))
            assert spec.local_offset(r) == off
        else:
            with pytest.raises(ValueError, match=f"rank {r}"):
                spec.local_offset(r)
        got = spec.shard(x, r)
        if r in given:
            np.testing.assert_array_equal(got, want)
        boxes = run_boxes(spec, r)
        assert sum(rb.numel for rb in boxes) == (want.size if r in given else 0)
        for rb in boxes:
            np.testing.assert_array_equal(
                got[rb.local_slices()], x[tuple(slice(a, b) for a, b in rb.box)]
            )
    # pieces: distinct non-empty runs with their holders, by brute force
    groups: dict = {}
    for r, rr in sorted(given.items()):
        if all(rr):
            groups.setdefault(rr, []).append(r)
    assert [(p.runs, p.ranks) for p in pieces(spec)] == sorted(
        (k, tuple(v)) for k, v in groups.items()
    )
    count = np.zeros(x.shape, dtype=np.int64)
    for rr in groups:
        count[np.ix_(*[[i for a, b in rs for i in range(a, b)] for rs in rr])] += 1 if rr else 0
    if not shape and groups:
        count[()] = 1
    full = bool(count.all())
    local = {r: spec.shard(x, r) for r in given}
    if full:
        np.testing.assert_array_equal(spec.unshard(local), x)
    else:
        with pytest.raises(ValueError, match="held by none"):
            spec.unshard(local)
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert eval(repr(spec)) == spec


def test_examples_from_the_brief() -> None:
    vocab = RunsSpec((777, 64), {0: (((0, 416),), ((0, 64),)), 1: (((416, 777),), ((0, 64),))})
    assert vocab.local_shape(1) == (361, 64) and vocab.local_offset(1) == (416, 0)
    e, i, h = 3, 8, 2
    moe = RunsSpec(
        (e, 2 * i, h),
        {
            w: (
                ((0, e),),
                ((w * i // 2, (w + 1) * i // 2), (i + w * i // 2, i + (w + 1) * i // 2)),
                ((0, h),),
            )
            for w in (0, 1)
        },
    )
    x = ids(moe.global_shape)
    np.testing.assert_array_equal(moe.shard(x, 1), np.concatenate([x[:, 4:8], x[:, 12:16]], axis=1))
    hsdp = ShardingSpec((6, 2), Mesh({"dp": 2}, ranks=[0, 2]), [Shard(0)])
    both = RunsSpec((6, 2), {r: hsdp.local_runs(s) for r, s in ((0, 0), (2, 2), (1, 0), (3, 2))})
    assert [p.ranks for p in pieces(both)] == [(0, 1), (2, 3)]
    assert RunsSpec.from_boxes((4, 4), {5: ((0, 4), (2, 2))}).local_runs(5) == (((0, 4),), ())


def test_equality_and_piece_tables_include_the_runs() -> None:
    a = RunsSpec((8,), {0: (((0, 4),),), 1: (((4, 8),),)})
    b = RunsSpec((8,), {0: (((4, 8),),), 1: (((0, 4),),)})
    c = RunsSpec((8,), {1: ([(4, 8)],), 0: [[(0, 4)]]})
    assert a.mesh == b.mesh and a.global_shape == b.global_shape
    assert a != b and a == c and hash(a) == hash(c)
    assert _boxes.piece_table(a) is not _boxes.piece_table(b)
    assert [p.ranks for p in pieces(a)] == [(0,), (1,)]
    assert [p.ranks for p in pieces(b)] == [(1,), (0,)]
    assert a != ShardingSpec((8,), Mesh({"holders": 2}), [Shard(0)])
    with pytest.raises(ValueError, match="shard order"):
        a.shard_order()
    with pytest.raises(ValueError, match="no torch placement"):
        a.to_torch()
    with pytest.raises(TypeError, match="given by runs"):
        RunsSpec.from_shard_order((8,), Mesh((2,)), {0: (0,)})


# ---------------------------------------------------------------------- plans
def check_plan(plan, src, dst, src_given, dst_given) -> None:
    shape = src.global_shape
    x = ids(shape)
    have = held(src, src_given, shape)
    need = held(dst, dst_given, shape)
    holders: dict[int, set[int]] = {}
    for r, piece in have.items():
        for e in piece.reshape(-1).tolist():
            holders.setdefault(e, set()).add(r)
    got: dict[int, list[int]] = {r: [] for r in need}
    for t in plan.transfers:
        part = x[tuple(slice(a, b) for a, b in t.box)].reshape(-1).tolist()
        assert all(t.src_rank in holders[e] for e in part)
        sl = local_slices(src, t.src_rank, t.box)
        np.testing.assert_array_equal(have[t.src_rank][sl], x[tuple(slice(a, b) for a, b in t.box)])
        dl = local_slices(dst, t.dst_rank, t.box)
        np.testing.assert_array_equal(need[t.dst_rank][dl], x[tuple(slice(a, b) for a, b in t.box)])
        got[t.dst_rank].extend(part)
    for r, piece in need.items():
        assert sorted(got[r]) == sorted(piece.reshape(-1).tolist())  # each exactly once


@st.composite
def mixed_pairs(draw):
    """(src, dst, src runs or None, dst runs or None): RunsSpec on one side or both."""
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=0, max_size=3)))
    kind = draw(st.sampled_from(["runs->spec", "spec->runs", "runs->runs"]))
    if kind == "spec->runs":
        src, sg = draw(specs(shape)), None
    else:
        src, sg = draw(runs_specs(shape, full=True))
    if kind == "runs->spec":
        dst, dg = draw(specs(shape)), None
    else:
        dst, dg = draw(runs_specs(shape))
    return src, dst, sg, dg


@SETTINGS
@given(mixed_pairs(), st.sampled_from([None, 2, 4]))
def test_reshard_plan_brute_force(case, rph) -> None:
    src, dst, sg, dg = case
    _reshard._plan.cache_clear()
    _boxes.piece_table.cache_clear()
    plan = reshard_plan(src, dst, ranks_per_host=rph)
    check_plan(plan, src, dst, sg, dg)
    assert set(plan.src_ranks) == covered(src) and set(plan.dst_ranks) == covered(dst)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(mixed_pairs(), min_size=1, max_size=3), st.integers(1, 40))
def test_transfer_plan_brute_force(cases, bucket) -> None:
    names = [f"t{i}" for i in range(len(cases))]
    plan = transfer_plan(
        {n: c[0] for n, c in zip(names, cases)},
        {n: c[1] for n, c in zip(names, cases)},
        dict.fromkeys(names, 1),
        bucket_bytes=bucket,
    )
    for n, (src, dst, sg, dg) in zip(names, cases):
        shape = src.global_shape
        x = ids(shape)
        have, need = held(src, sg, shape), held(dst, dg, shape)
        got: dict[int, list[int]] = {r: [] for r in need}
        for rnd in plan.rounds:
            for t in rnd.transfers:
                if t.name != n:
                    continue
                part = x[tuple(slice(a, b) for a, b in t.box)]
                np.testing.assert_array_equal(
                    have[t.src_rank][local_slices(src, t.src_rank, t.box)], part
                )
                np.testing.assert_array_equal(
                    need[t.dst_rank][local_slices(dst, t.dst_rank, t.box)], part
                )
                got[t.dst_rank].extend(part.reshape(-1).tolist())
        for r in need:
            for name, box in plan.local_copies(r):
                if name == n:
                    part = x[tuple(slice(a, b) for a, b in box)]
                    assert np.isin(part, have[r]).all()
                    got[r].extend(part.reshape(-1).tolist())
        for r, piece in need.items():
            assert sorted(got[r]) == sorted(piece.reshape(-1).tolist())


def test_source_not_holding_the_destination_is_a_value_error() -> None:
    src = RunsSpec.from_boxes((4, 4), {0: ((0, 2), (0, 4))})
    dst = ShardingSpec((4, 4), Mesh({"tp": 2}), [Shard(1)])
    with pytest.raises(ValueError, match="held by no source rank"):
        reshard_plan(src, dst)
    # a destination holding less than the source is fine
    plan = reshard_plan(dst, src)
    assert sorted(t.box for t in plan.transfers) == [((0, 2), (0, 2)), ((0, 2), (2, 4))]


# ---------------------------------------------------------------------- views
@st.composite
def indices(draw, shape):
    out = []
    for n in shape[: draw(st.integers(min(1, len(shape)), len(shape)))]:
        if n and draw(st.booleans()):
            out.append(draw(st.integers(-n, n - 1)))
        else:
            bound = st.none() | st.integers(-n - 2, n + 2)
            out.append(slice(draw(bound), draw(bound), draw(st.integers(1, 3) | st.none())))
    return tuple(out) if len(out) != 1 or draw(st.booleans()) else out[0]


@st.composite
def view_cases(draw):
    pick = draw(st.integers(0, 2))
    if pick == 0:
        spec = draw(specs())
        given = None
    elif pick == 1:
        spec, given = draw(runs_specs())
    else:  # several runs per rank along some dim: local indices may need arrays
        shape = tuple(draw(st.lists(st.integers(4, 9), min_size=1, max_size=3)))
        spec, given = draw(runs_specs(shape, full=True, kinds=[grouped_runs]))
    return spec, given, draw(indices(spec.global_shape))


@SETTINGS
@given(view_cases())
def test_view_spec_brute_force(case) -> None:
    spec, given, index = case
    shape = spec.global_shape
    x = ids(shape)
    pieces_ = held(spec, given, shape)
    view = x[index]
    inside = set(np.asarray(view).reshape(-1).tolist())
    holding = sorted(r for r, p in pieces_.items() if inside & set(p.reshape(-1).tolist()))
    if not holding:
        with pytest.raises(ValueError, match="selects no element"):
            view_spec(spec, index)
        return
    vspec, local = view_spec(spec, index)
    assert vspec.global_shape == np.asarray(view).shape
    assert sorted(local) == holding == sorted(covered(vspec))
    vx = np.asarray(view)
    for r in holding:
        cut = pieces_[r][local[r]]
        assert cut.shape == vspec.local_shape(r)
        # the view spec's runs, cut by hand from the view, hold the same elements in order
        np.testing.assert_array_equal(cut, ref_cut(vx, vspec.local_runs(r)))
        assert set(cut.reshape(-1).tolist()) == inside & set(pieces_[r].reshape(-1).tolist())
        if not all(isinstance(i, (int, slice)) for i in local[r]):
            assert any(isinstance(i, np.ndarray) for i in local[r])


def test_view_spec_local_index_in_torch() -> None:
    torch = pytest.importorskip("torch")
    spec = ShardingSpec((9, 5, 4), Mesh({"a": 2, "b": 2}), [StridedShard(0, 3), Shard(2)])
    assert not spec.decodable  # several runs per rank along dim 0
    x = ids(spec.global_shape)
    for index in [(slice(None, None, 2), 1), (slice(1, 8, 3), slice(None), 3), 4, (slice(None), 2)]:
        vspec, local = view_spec(spec, index)
        for r, ix in local.items():
            piece = spec.shard(x, r)
            want = piece[ix]
            got = torch.as_tensor(piece)[ix].numpy()
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(want, vspec.shard(x[index], r))
    vspec, local = view_spec(spec, (slice(None, None, 2), 1))
    assert any(isinstance(i, np.ndarray) for ix in local.values() for i in ix)


def test_view_of_one_expert() -> None:
    e, f, d = 4, 6, 2
    mesh = Mesh({"ep": 2, "fsdp": 2})
    spec = ShardingSpec((e, f, d), mesh, [Shard(0), Shard(1)])
    vspec, local = view_spec(spec, 3)
    assert vspec == RunsSpec((f, d), {2: (((0, 3),), ((0, 2),)), 3: (((3, 6),), ((0, 2),))})
    assert local == {2: (1, slice(0, 3, 1), slice(0, 2, 1)), 3: (1, slice(0, 3, 1), slice(0, 2, 1))}


def test_view_spec_cached_views_are_shared_and_indices_fresh() -> None:
    # equal specs (a model's layers) share one view; array indices are new per call
    def stack():
        return ShardingSpec((9, 5, 4), Mesh({"a": 2, "b": 2}), [StridedShard(0, 3), Shard(2)])

    index = (slice(None, None, 2), 1)
    v1, l1 = view_spec(stack(), index)
    v2, l2 = view_spec(stack(), index)
    assert v1 is v2 and l1.keys() == l2.keys()
    pairs = [(a, b) for r in l1 for a, b in zip(l1[r], l2[r]) if isinstance(a, np.ndarray)]
    assert pairs
    for a, b in pairs:
        assert a is not b and a.flags.writeable
        np.testing.assert_array_equal(a, b)
    want = [b.copy() for _, b in pairs]
    for a, _ in pairs:
        a[...] = -1  # a caller scribbling on its index changes no later answer
    _, l3 = view_spec(stack(), index)
    fresh = [x for r in l3 for x in l3[r] if isinstance(x, np.ndarray)]
    for x, w in zip(fresh, want, strict=True):
        np.testing.assert_array_equal(x, w)


@SETTINGS
@given(mixed_pairs(), st.integers(0, 60))
def test_relabelled_plan_is_the_direct_plan(case, shift) -> None:
    # runs sources on holders disjoint from the destination share one canonical plan;
    # mapped back it is column for column the plan built directly
    src, dst, _, _ = case
    if not isinstance(src, RunsSpec):
        return
    moved = RunsSpec(src.global_shape, {r + shift: rr for r, rr in src.runs.items()})
    for s in (src, moved):
        if not set(covered(s)).isdisjoint(covered(dst)):
            continue
        got = reshard_plan(s, dst)
        want = _reshard._build(s, dst, None)
        assert got.src_spec == s and got.dst_spec == dst
        assert (got.src_ranks, got.dst_ranks) == (want.src_ranks, want.dst_ranks)
        for k, v in want.arrays().items():
            np.testing.assert_array_equal(got.arrays()[k], v)
            assert not got.arrays()[k].flags.writeable


def test_experts_on_other_holders_share_one_canonical_plan() -> None:
    stack = ShardingSpec((8, 6, 4), Mesh({"efsdp": 2, "ep": 4}), [StridedShard(0, 4), Shard(0)])
    dst = ShardingSpec((6, 4), Mesh({"tp": 2}, ranks=[8, 9]), [Shard(0)])
    _reshard._plan.cache_clear()
    _reshard._canonical_plan.cache_clear()
    views = [view_spec(stack, e)[0] for e in range(8)]
    assert len(set(views)) == 8  # one holder each, all different
    plans = [reshard_plan(v, dst) for v in views]
    assert _reshard._canonical_plan.cache_info().misses == 1
    for v, plan in zip(views, plans):
        (holder,) = covered(v)
        assert set(plan.arrays()["src"].tolist()) == {holder}
        assert plan.elements_moved == 24


# ---------------------------------------------------------------------- errors
def test_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match=r"ranks \[1\] hold runs .* box \(\(2, 3\),\)"):
        RunsSpec((4,), {0: (((0, 3),),), 1: (((2, 4),),)})
    with pytest.raises(ValueError, match="identical"):
        RunsSpec((4,), {0: (((0, 2), (2, 4)),), 1: (((2, 4), (0, 2)),)})
    with pytest.raises(ValueError, match="same number of holders"):
        RunsSpec((4,), {0: (((0, 2),),), 1: (((0, 2),),), 2: (((2, 4),),)})
    with pytest.raises(ValueError, match=r"rank 1, dim 1: run \(0, 5\).*<= 4"):
        RunsSpec((4, 4), {1: (((0, 4),), ((0, 5),))})
    with pytest.raises(ValueError, match=r"rank 1, dim 0: run \(2, 2\)"):
        RunsSpec((4,), {1: (((2, 2),),)})
    with pytest.raises(ValueError, match=r"rank 0, dim 0: runs \(0, 2\) and \(1, 3\) overlap"):
        RunsSpec((4,), {0: (((0, 2), (1, 3)),)})
    with pytest.raises(ValueError, match="rank -1 is negative"):
        RunsSpec((4,), {-1: (((0, 4),),)})
    with pytest.raises(ValueError, match="2 dims but global_shape"):
        RunsSpec((4,), {0: (((0, 4),), ((0, 1),))})
    with pytest.raises(ValueError, match="at least one rank"):
        RunsSpec((4,), {})
    with pytest.raises(TypeError, match="ranks must be ints"):
        RunsSpec((4,), {"0": (((0, 4),),)})
    with pytest.raises(TypeError, match="pair of ints"):
        RunsSpec((4,), {0: (((0.0, 4),),)})
    with pytest.raises(TypeError, match="mapping"):
        RunsSpec((4,), [(0, (((0, 4),),))])  # type: ignore[arg-type]
    spec = ShardingSpec((4, 3), Mesh((2,)), [Shard(0)])
    with pytest.raises(ValueError, match=r"index \(0, 3\): 3 is out of range for dim 1 of size 3"):
        view_spec(spec, (0, 3))
    with pytest.raises(ValueError, match="-5 is out of range"):
        view_spec(spec, -5)
    with pytest.raises(ValueError, match="step -1"):
        view_spec(spec, slice(None, None, -1))
    with pytest.raises(ValueError, match="3 entries"):
        view_spec(spec, (0, 0, 0))
    with pytest.raises(ValueError, match="selects no element"):
        view_spec(spec, slice(2, 2))
    with pytest.raises(TypeError, match="Ellipsis"):
        view_spec(spec, (Ellipsis, 0))
    with pytest.raises(ValueError, match="pending reduction"):
        view_spec(ShardingSpec((4,), Mesh((2,)), [Partial()]), 0)
    assert view_spec(ShardingSpec((4,), Mesh((2,)), [Replicate()]), 1)[0].mesh.shape == (2,)
