"""Run boxes and box arithmetic against brute force (materialised index sets)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshlayout import Mesh
from meshlayout.sharding import (
    Replicate,
    RunBox,
    Shard,
    ShardingSpec,
    StridedShard,
    box_numel,
    box_slices,
    intersect,
    local_slices,
    pieces,
    run_boxes,
)
from reshard_strategies import covered, specs

SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def elements(box: tuple[tuple[int, int], ...]) -> set[tuple[int, ...]]:
    """Every index tuple of a box, enumerated."""
    return set(itertools.product(*(range(a, b) for a, b in box)))


@SETTINGS
@given(specs())
def test_run_boxes_tile_each_ranks_piece_exactly(spec: ShardingSpec) -> None:
    shape = spec.global_shape
    flat = np.arange(int(np.prod(shape, dtype=np.int64))).reshape(shape)
    for rank in [*sorted(covered(spec)), 999]:
        boxes = run_boxes(spec, rank)
        if rank == 999:
            assert boxes == ()
            continue
        local = spec.shard(flat, rank)
        # the boxes cover exactly the rank's elements, each once
        assert sum(rb.numel for rb in boxes) == local.size
        seen: set[int] = set()
        for rb in boxes:
            assert rb.numel > 0
            got = local[rb.local_slices()]
            want = flat[box_slices(rb.box)]
            assert np.array_equal(got, want)
            values = set(want.reshape(-1).tolist())
            assert not values & seen
            seen |= values
            assert local_slices(spec, rank, rb.box) == rb.local_slices()
        assert seen == set(local.reshape(-1).tolist())


@SETTINGS
@given(specs())
def test_pieces_group_ranks_by_identical_holdings(spec: ShardingSpec) -> None:
    # reference: ask every covered rank for its runs and group ranks by them
    groups: dict[tuple, list[int]] = {}
    for rank in covered(spec):
        runs = spec.local_runs(rank)
        if all(runs):
            groups.setdefault(runs, []).append(rank)
    want = sorted((runs, tuple(sorted(ranks))) for runs, ranks in groups.items())
    got = pieces(spec)
    assert [(p.runs, p.ranks) for p in got] == want
    # distinct pieces are disjoint and cover the tensor exactly once
    numel = int(np.prod(spec.global_shape, dtype=np.int64))
    count = np.zeros(numel, dtype=np.int64)
    flat = np.arange(numel).reshape(spec.global_shape)
    for p in got:
        assert p.numel == sum(rb.numel for rb in p.run_boxes()) > 0
        assert p.run_boxes() == run_boxes(spec, p.ranks[0])
        np.add.at(count, spec.shard(flat, p.ranks[0]).reshape(-1), 1)
    assert (count == 1).all()


intervals = st.tuples(st.integers(0, 9), st.integers(0, 9))


@settings(max_examples=2000, deadline=None)
@given(
    st.integers(0, 3).flatmap(
        lambda n: st.tuples(*[st.lists(intervals, min_size=n, max_size=n)] * 2)
    )
)
def test_intersect_and_numel_match_enumeration(
    pair: tuple[list[tuple[int, int]], list[tuple[int, int]]],
) -> None:
    a = tuple((s, e) for s, e in pair[0])
    b = tuple((s, e) for s, e in pair[1])
    common = elements(a) & elements(b)
    got = intersect(a, b)
    if not common:
        assert got is None
    else:
        assert got is not None and elements(got) == common
        assert box_numel(got) == len(common)
    assert box_numel(a) == len(elements(a))


def test_sub_box_slices_of_an_undecodable_piece() -> None:
    spec = ShardingSpec((8, 3), Mesh((2,)), [StridedShard(0, 2)])
    local = spec.shard(np.arange(24).reshape(8, 3), 0)  # rows 0, 1, 4, 5
    (first, second) = run_boxes(spec, 0)
    sub = ((5, 6), (1, 3))
    assert second.local_slices(sub) == (slice(3, 4), slice(1, 3))
    assert np.array_equal(local[second.local_slices(sub)], [[16, 17]])
    assert local_slices(spec, 0, sub) == second.local_slices(sub)
    with pytest.raises(ValueError, match="not inside the run box"):
        first.local_slices(sub)


def test_errors_name_the_values() -> None:
    spec = ShardingSpec((8,), Mesh((2,)), [StridedShard(0, 2)])
    with pytest.raises(ValueError, match=r"does not hold box \(\(1, 5\),\) as one piece"):
        local_slices(spec, 0, ((1, 5),))
    with pytest.raises(ValueError, match="rank 5 is not in the mesh"):
        local_slices(spec, 5, ((0, 1),))
    with pytest.raises(ValueError, match="has 2 dims"):
        local_slices(spec, 0, ((0, 1), (0, 1)))
    with pytest.raises(ValueError, match="different ndim"):
        intersect(((0, 1),), ())
    with pytest.raises(TypeError, match="pairs"):
        box_numel([0, 1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ShardingSpec"):
        run_boxes("spec", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="local_start"):
        RunBox(((0, 1),), (0, 0))
    with pytest.raises(ValueError, match="origin"):
        box_slices(((0, 1),), origin=(0, 0))


def test_zero_dim_tensor_is_one_box_on_every_covered_rank() -> None:
    spec = ShardingSpec((), Mesh((2,), ranks=[3, 4]), [Replicate()])
    assert run_boxes(spec, 3) == (RunBox((), ()),)
    assert run_boxes(spec, 0) == ()
    assert box_numel(()) == 1
    spec = ShardingSpec((0, 4), Mesh((2,)), [Shard(1)])
    assert run_boxes(spec, 0) == ()
