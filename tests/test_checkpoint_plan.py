"""Pure checkpoint planning (meshlayout.torch.checkpoint._plan) against brute force.

Every rule is checked by enumerating elements with numpy: the boxes all ranks write
tile the tensor exactly once; reads planned for any destination sharding reproduce
the destination's local pieces from saved chunks; tiling reports name exactly the
holes and overlaps a count array shows.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from meshlayout import Mesh
from meshlayout.sharding import (
    Partial,
    Replicate,
    RunBox,
    Shard,
    ShardingSpec,
    StridedShard,
    box_slices,
    run_boxes,
)
from meshlayout.torch.checkpoint import ChunkIndex, replica_dims, tiling, written_boxes
from reshard_strategies import covered, shapes, specs

SETTINGS = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _counts(shape: tuple[int, ...], boxes: list[tuple[tuple[int, int], ...]]) -> np.ndarray:
    count = np.zeros(shape, dtype=np.int64)
    for box in boxes:
        count[box_slices(box)] += 1
    return count


def _saved_chunks(
    spec: ShardingSpec, salt: int = 0
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The chunks every rank of a root-mesh spec writes."""
    out = []
    for rank in sorted(covered(spec)):
        for rb in written_boxes(spec, rank, salt):
            out.append((tuple(a for a, _ in rb.box), tuple(b - a for a, b in rb.box)))
    return out


# ---------------------------------------------------------------------- written_boxes
@SETTINGS
@given(specs(), st.integers(0, 50))
def test_written_boxes_tile_the_tensor_once(spec: ShardingSpec, salt: int) -> None:
    assume(spec.mesh.num_submeshes == 1)  # type: ignore[attr-defined]
    shape = spec.global_shape
    boxes = []
    for rank in covered(spec):
        mine = written_boxes(spec, rank, salt)
        held = {rb.box: rb for rb in run_boxes(spec, rank)}
        for rb in mine:
            if math.prod(shape):
                assert held[rb.box] == rb  # a box the rank holds, at its local place
        boxes.extend(rb.box for rb in mine)
    if math.prod(shape) == 0:
        assert boxes == [tuple((0, n) for n in shape)]  # one empty chunk keeps shape/dtype
    else:
        assert (_counts(shape, boxes) == 1).all()
    assert written_boxes(spec, 10_000, salt) == ()  # not in the mesh


@SETTINGS
@given(specs(), st.integers(0, 50))
def test_each_submesh_of_a_family_writes_its_own_full_copy(spec: ShardingSpec, salt: int) -> None:
    assume(math.prod(spec.global_shape) > 0)
    for sub in spec.mesh.submeshes().reshape(spec.mesh.num_submeshes, -1):  # type: ignore[attr-defined]
        boxes = [rb.box for r in sub.tolist() for rb in written_boxes(spec, int(r), salt)]
        assert (_counts(spec.global_shape, boxes) == 1).all()


def test_replicas_share_the_writes_deterministically() -> None:
    # 12 rows on (replicate=3, shard=4): 4 boxes, written by replica (p + salt) % 3
    spec = ShardingSpec((12, 2), Mesh({"r": 3, "s": 4}), [Replicate(), Shard(0)])
    assert replica_dims(spec) == (0,)
    writers = {rb.box[0]: rank for rank in range(12) for rb in written_boxes(spec, rank, salt=1)}
    assert writers == {(0, 3): 4, (3, 6): 9, (6, 9): 2, (9, 12): 7}
    # undecodable: several boxes per rank, spread over replicas box by box
    spec = ShardingSpec((8,), Mesh((2, 2)), [Replicate(), StridedShard(0, 2)])
    assert [[rb.box for rb in written_boxes(spec, r)] for r in range(4)] == [
        [((0, 2),)],
        [((6, 8),)],
        [((4, 6),)],
        [((2, 4),)],
    ]


def test_partial_cannot_be_written() -> None:
    spec = ShardingSpec((4,), Mesh((2, 2)), [Partial(), Shard(0)])
    with pytest.raises(ValueError, match=r"Partial on mesh dims \[0\]"):
        written_boxes(spec, 0)
    with pytest.raises(TypeError, match="ShardingSpec"):
        written_boxes("spec", 0)  # type: ignore[arg-type]


def test_empty_and_scalar_tensors() -> None:
    spec = ShardingSpec((0, 5), Mesh((2, 3)), [Shard(1), Shard(0)])
    assert [r for r in range(6) if written_boxes(spec, r)] == [0]
    assert written_boxes(spec, 0)[0] == RunBox(((0, 0), (0, 5)), (0, 0))
    scalar = ShardingSpec((), Mesh((2,)), [Replicate()])
    assert [[rb.box for rb in written_boxes(scalar, r)] for r in (0, 1)] == [[()], []]


# ---------------------------------------------------------------------- reads
def _apply_reads(src: ShardingSpec, dst: ShardingSpec, rank: int, data: np.ndarray) -> np.ndarray:
    """The destination local piece filled by the planned reads from saved chunk arrays."""
    chunks = _saved_chunks(src)
    stored = [data[box_slices(tuple((o, o + s) for o, s in zip(*c)))] for c in chunks]
    index = ChunkIndex(src.global_shape, chunks)
    boxes = run_boxes(dst, rank)
    out = np.full(dst.local_shape(rank), -1, dtype=data.dtype)
    seen = np.zeros(dst.local_shape(rank), dtype=np.int64)
    for r in index.reads(boxes):
        rb = boxes[r.box]
        local = tuple(
            slice(ls + d, ls + d + n) for ls, d, n in zip(rb.local_start, r.dest_offsets, r.lengths)
        )
        piece = tuple(slice(s, s + n) for s, n in zip(r.storage_offsets, r.lengths))
        out[local] = stored[r.chunk][piece]
        seen[local] += 1
    assert (seen == 1).all()  # every destination element read exactly once
    return out


@SETTINGS
@given(st.data())
def test_reads_fill_any_destination_exactly(data: st.DataObject) -> None:
    shape = data.draw(shapes())
    src = data.draw(specs(shape))
    dst = data.draw(specs(shape))
    assume(src.mesh.num_submeshes == 1)  # type: ignore[attr-defined]
    full = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    for rank in sorted(covered(dst)):
        np.testing.assert_array_equal(_apply_reads(src, dst, rank, full), dst.shard(full, rank))


def test_reads_into_an_undecodable_destination() -> None:
    src = ShardingSpec((8, 3), Mesh((3,)), [Shard(0)])
    dst = ShardingSpec((8, 3), Mesh((2,)), [StridedShard(0, 2)])  # rank 0: rows 0,1,4,5
    full = np.arange(24).reshape(8, 3)
    np.testing.assert_array_equal(_apply_reads(src, dst, 0, full), full[[0, 1, 4, 5]])


def test_reads_refuse_holes_and_overlaps() -> None:
    index = ChunkIndex((6,), [((0,), (2,)), ((4,), (2,))])
    whole = [RunBox(((0, 6),), (0,))]
    with pytest.raises(ValueError, match=r"w: the checkpoint's chunks cover 4 of the 6 elements"):
        index.reads(whole, what="w")
    assert len(index.reads([RunBox(((4, 6),), (0,))])) == 1  # a hole elsewhere is fine
    index = ChunkIndex((6,), [((0,), (4,)), ((3,), (3,))])
    with pytest.raises(ValueError, match=r"saved chunks 0 .* and 1 .* overlap on \(\(3, 4\),\)"):
        index.reads(whole)
    assert len(index.reads([RunBox(((4, 6),), (0,))])) == 1  # not inside the clash


def test_chunk_index_validates_chunks() -> None:
    with pytest.raises(ValueError, match=r"chunk 1 .* lies outside the tensor of shape"):
        ChunkIndex((4,), [((0,), (2,)), ((3,), (2,))])
    with pytest.raises(ValueError, match="does not have 2 dims"):
        ChunkIndex((4, 1), [((0,), (2,))])
    with pytest.raises(TypeError, match=r"chunk 0 must be \(offsets, sizes\)"):
        ChunkIndex((4,), [3])


def test_reads_scale_with_overlapping_chunks_only() -> None:
    # 4096 chunks of one row each: a one-row box finds its chunk by bisection
    chunks = [((i, 0), (1, 8)) for i in range(4096)]
    index = ChunkIndex((4096, 8), chunks)
    assert index._candidates(((100, 101), (0, 8))) == [100]
    reads = index.reads([RunBox(((100, 102), (2, 5)), (0, 0))])
    assert [(r.chunk, r.storage_offsets, r.lengths) for r in reads] == [
        (100, (0, 2), (1, 3)),
        (101, (0, 2), (1, 3)),
    ]


# ---------------------------------------------------------------------- tiling
@st.composite
def chunk_lists(draw: st.DrawFn) -> tuple[tuple[int, ...], list]:
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=0, max_size=3)))
    chunks = []
    for _ in range(draw(st.integers(0, 7))):
        offs, sizes = [], []
        for n in shape:
            a = draw(st.integers(0, n))
            offs.append(a)
            sizes.append(draw(st.integers(0, n - a)))
        chunks.append((tuple(offs), tuple(sizes)))
    return shape, chunks


@settings(max_examples=800, deadline=None)
@given(chunk_lists())
def test_tiling_matches_a_count_array(case: tuple[tuple[int, ...], list]) -> None:
    shape, chunks = case
    boxes = [tuple((o, o + s) for o, s in zip(*c)) for c in chunks]
    count = _counts(shape, boxes)
    report = tiling(shape, chunks)
    assert report.missing == int((count == 0).sum())
    assert report.exact == bool((count == 1).all())
    pairs = set()
    for i, j in itertools.combinations(range(len(chunks)), 2):
        a, b = np.zeros(shape, bool), np.zeros(shape, bool)
        a[box_slices(boxes[i])] = True
        b[box_slices(boxes[j])] = True
        if (a & b).any():
            pairs.add((i, j))
    assert report.overlap_pairs == len(pairs)
    assert {(i, j) for i, j, _ in report.overlaps} <= pairs
    named = _counts(shape, list(report.holes))
    assert (named <= (count == 0)).all()  # holes are uncovered and disjoint
    if len(report.holes) < 16:
        assert int(named.sum()) == report.missing
    text = report.describe()
    assert (text == "exact") == report.exact


def test_tiling_names_holes_and_overlaps() -> None:
    # torch 2.13's (offset, size) per rank for FSDP2 over TP, 13 rows, dp=3, tp=2: rank 4
    # holds rows 6 and 11 by torch's literal reading, reported as 2 rows at offset 6
    rows = [(0, 3), (7, 2), (3, 3), (9, 2), (6, 2), (12, 1)]
    report = tiling((13, 3), [((a, 0), (n, 3)) for a, n in rows])
    assert not report.exact
    assert report.overlaps == ((1, 4, ((7, 8), (0, 3))),)
    assert report.holes == (((11, 12), (0, 3)),) and report.missing == 3
    assert report.describe() == (
        "overlap: chunks 1 and 4 share ((7, 8), (0, 3)); hole: ((11, 12), (0, 3))"
    )
    spec = ShardingSpec((13, 3), Mesh((3, 2)), [StridedShard(0, 2), Shard(0)])
    assert tiling((13, 3), _saved_chunks(spec)).exact
    assert tiling((), []).describe() == "hole: ()"
    assert tiling((), [((), ()), ((), ())]).overlap_pairs == 1
