"""reshard_plan against a brute-force reference: per-element holder sets from each spec.

The reference never looks at the plan's machinery: it cuts every rank's piece out of
an index array with ``ShardingSpec.shard`` and reasons element by element.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshlayout import Mesh
from meshlayout.sharding import (
    Partial,
    Replicate,
    ReshardPlan,
    Shard,
    ShardingSpec,
    StridedShard,
    Transfer,
    _boxes,
    _reshard,
    box_slices,
    local_slices,
    reshard_plan,
)
from reshard_strategies import covered, spec_pairs, specs

SETTINGS = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fresh_plan(src: ShardingSpec, dst: ShardingSpec, rph: int | None) -> ReshardPlan:
    """A plan computed from scratch (no cached plan or piece table)."""
    _reshard._plan.cache_clear()
    _boxes.piece_table.cache_clear()
    return reshard_plan(src, dst, ranks_per_host=rph)


class Reference:
    """Per-element holder sets of both specs, enumerated."""

    def __init__(self, src: ShardingSpec, dst: ShardingSpec) -> None:
        shape = src.global_shape
        self.numel = math.prod(shape)
        self.flat = np.arange(self.numel).reshape(shape)
        self.src = {r: self._mask(src, r) for r in covered(src)}
        self.dst = {r: self._mask(dst, r) for r in covered(dst)}

    def _mask(self, spec: ShardingSpec, rank: int) -> np.ndarray:
        held = np.zeros(self.numel, dtype=bool)
        held[spec.shard(self.flat, rank).reshape(-1)] = True
        return held

    def elements(self, box: tuple[tuple[int, int], ...]) -> np.ndarray:
        return self.flat[box_slices(box)].reshape(-1)

    def holders(self, element: int) -> list[int]:
        return sorted(r for r, held in self.src.items() if held[element])


def check_plan(plan: ReshardPlan, src: ShardingSpec, dst: ShardingSpec, rph: int | None) -> None:
    ref = Reference(src, dst)
    assert plan.src_ranks == tuple(sorted(ref.src)) and plan.dst_ranks == tuple(sorted(ref.dst))
    delivered = {r: np.zeros(ref.numel, dtype=np.int64) for r in ref.dst}
    sent: dict[int, int] = {}
    recv: dict[int, int] = {}
    across = 0
    pieces = {r: src.shard(ref.flat, r) for r in ref.src}
    built = {r: dst.shard(np.zeros_like(ref.flat) - 1, r) for r in ref.dst}
    for t in plan.transfers:
        assert isinstance(t, Transfer)
        els = ref.elements(t.box)
        assert len(els) == t.numel > 0
        assert ref.src[t.src_rank][els].all(), "the sender holds the whole box"
        assert ref.dst[t.dst_rank][els].all(), "the receiver needs the whole box"
        delivered[t.dst_rank][els] += 1
        holds_it = t.dst_rank in ref.src and ref.src[t.dst_rank][els]
        if t.is_local:
            assert holds_it.all()
        else:
            assert not np.any(holds_it), "an element the destination holds is never sent"
            sent[t.src_rank] = sent.get(t.src_rank, 0) + t.numel
            recv[t.dst_rank] = recv.get(t.dst_rank, 0) + t.numel
            holders = ref.holders(int(els[0]))
            assert all(ref.src[h][els].all() for h in holders)  # one source piece
            if rph is not None:
                if t.src_rank // rph != t.dst_rank // rph:
                    across += t.numel
                    assert all(h // rph != t.dst_rank // rph for h in holders), (
                        "a holder on the destination's host was available"
                    )
        # execute the transfer on the reference pieces: boxes sit inside one run box each
        value = pieces[t.src_rank][local_slices(src, t.src_rank, t.box)]
        built[t.dst_rank][local_slices(dst, t.dst_rank, t.box)] = value
    check_sender_rule(plan, ref, rph)
    minimum = 0
    for r, need in ref.dst.items():
        assert np.array_equal(delivered[r], need.astype(np.int64)), "exactly once"
        held = ref.src.get(r, np.zeros(ref.numel, dtype=bool))
        minimum += int((need & ~held).sum())
        assert np.array_equal(built[r], dst.shard(ref.flat, r))
    assert plan.elements_moved == minimum
    # per-rank views and totals
    for r in plan.ranks:
        assert plan.sends(r) == tuple(t for t in plan.transfers if t.src_rank == r != t.dst_rank)
        assert plan.receives(r) == tuple(t for t in plan.transfers if t.dst_rank == r != t.src_rank)
        assert plan.local_copies(r) == tuple(
            t for t in plan.transfers if t.dst_rank == r == t.src_rank
        )
    ranks, m = plan.matrix()
    assert ranks == tuple(sorted(set(ref.src) | set(ref.dst)))
    want = np.zeros_like(m)
    for t in plan.transfers:
        if not t.is_local:
            want[ranks.index(t.src_rank), ranks.index(t.dst_rank)] += t.numel
    assert np.array_equal(m, want)
    s = plan.summary()
    local = sum(t.numel for t in plan.transfers if t.is_local)
    assert s["elements_moved"] == minimum and s["local_copy_elements"] == local
    assert s["elements_delivered"] == sum(int(n.sum()) for n in ref.dst.values())
    for key, per_rank in (("send", sent), ("recv", recv)):
        top = max(per_rank.values(), default=0)
        assert s[f"max_{key}_elements"] == top
        assert s[f"max_{key}_rank"] == min(
            (r for r, n in per_rank.items() if n == top), default=None
        )
    assert s["across_host_elements"] == (across if rph is not None else None)
    gather = [ref.numel - int(h.sum()) for h in ref.src.values()]
    gather += [ref.numel for r in ref.dst if r not in ref.src]
    assert s["allgather_elements"] == sum(gather)
    assert s["allgather_max_recv_elements"] == max(gather, default=0)


def check_sender_rule(plan: ReshardPlan, ref: Reference, rph: int | None) -> None:
    """Replay the documented rule by scanning every holder: in plan order, each box sent
    goes from the least-loaded holder (elements sent so far, then lowest rank), among the
    holders on the destination's host when there are any."""
    load: dict[int, int] = {}
    for t in plan.transfers:
        if t.is_local:
            continue
        holders = ref.holders(int(ref.elements(t.box)[0]))
        if rph is not None:
            near = [h for h in holders if h // rph == t.dst_rank // rph]
            holders = near or holders
        best = min(holders, key=lambda h: (load.get(h, 0), h))
        assert t.src_rank == best, (t, holders, load)
        load[best] = load.get(best, 0) + t.numel


@SETTINGS
@given(spec_pairs(), st.sampled_from([None, 1, 2, 3, 4, 8]))
def test_plan_matches_brute_force(pair: tuple[ShardingSpec, ShardingSpec], rph: int | None) -> None:
    src, dst = pair
    plan = fresh_plan(src, dst, rph)
    check_plan(plan, src, dst, rph)
    again = fresh_plan(src, dst, rph)
    assert again.transfers == plan.transfers, "deterministic"
    assert reshard_plan(src, dst, ranks_per_host=rph) is again  # cached


def transposed(spec: ShardingSpec, perm: list[int]) -> ShardingSpec:
    """The same holdings described over the mesh dims in another order."""
    mesh = spec.mesh[tuple(perm)]  # type: ignore[index]
    order = {d: tuple(perm.index(m) for m in ms) for d, ms in spec.shard_order().items()}
    return ShardingSpec.from_shard_order(spec.global_shape, mesh, order)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec_pairs(), st.data())
def test_plan_depends_only_on_what_each_rank_holds(pair, data) -> None:
    src, dst = pair
    if not src.decodable:
        return
    perm = data.draw(st.permutations(range(src.mesh.ndim)))
    other = transposed(src, list(perm))
    for r in covered(src):
        assert other.local_runs(r) == src.local_runs(r)
    rph = data.draw(st.sampled_from([None, 2]))
    assert fresh_plan(other, dst, rph).transfers == fresh_plan(src, dst, rph).transfers


def test_fsdp_to_tp_on_other_ranks_worked_numbers() -> None:
    src = ShardingSpec((8, 6), Mesh({"dp": 4}), [Shard(0)])
    dst = ShardingSpec((8, 6), Mesh({"tp": 2}, ranks=[2, 3]), [Shard(1)])
    plan = reshard_plan(src, dst)
    assert plan.receives(3) == (
        Transfer(0, 3, ((0, 2), (3, 6))),
        Transfer(1, 3, ((2, 4), (3, 6))),
        Transfer(2, 3, ((4, 6), (3, 6))),
    )
    assert plan.local_copies(3) == (Transfer(3, 3, ((6, 8), (3, 6))),)
    s = plan.summary()
    assert (s["elements_moved"], s["local_copy_elements"], s["max_send_elements"]) == (36, 12, 12)
    assert s["max_recv_elements"] == 18
    assert s["allgather_elements"] == 4 * 36  # each dp rank lacks 3/4 of 48
    ranks, m = plan.matrix()
    assert ranks == (0, 1, 2, 3)
    assert m.tolist() == [[0, 0, 6, 6], [0, 0, 6, 6], [0, 0, 0, 6], [0, 0, 6, 0]]


def test_replicas_spread_load_lowest_rank_first() -> None:
    shape = (8,)
    src = ShardingSpec(shape, Mesh({"dp": 4}), [Replicate()])
    dst = ShardingSpec(shape, Mesh({"tp": 4}, ranks=[4, 5, 6, 7]), [Shard(0)])
    plan = reshard_plan(src, dst)
    assert [(t.src_rank, t.dst_rank) for t in plan.transfers] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    # the destination rank itself first; then the least-loaded holder
    dst = ShardingSpec(shape, Mesh({"tp": 4}, ranks=[3, 4, 5, 6]), [Shard(0)])
    plan = reshard_plan(src, dst)
    assert [(t.src_rank, t.dst_rank) for t in plan.transfers] == [(3, 3), (0, 4), (1, 5), (2, 6)]


def test_same_host_holder_is_preferred() -> None:
    # two replicas of the rows: ranks 0-3 (host 0) and 4-7 (host 1); receivers on host 1
    src = ShardingSpec((8, 4), Mesh({"rep": 2, "dp": 4}), [Replicate(), Shard(0)])
    dst = ShardingSpec((8, 4), Mesh({"tp": 2}, ranks=[8, 9]), [Shard(1)])
    near = reshard_plan(src, dst, ranks_per_host=4)
    assert near.summary()["across_host_elements"] == 32  # host 2 has no holder
    dst = ShardingSpec((8, 4), Mesh({"tp": 2}, ranks=[6, 7]), [Shard(1)])
    plan = reshard_plan(src, dst, ranks_per_host=4)
    assert all(t.src_rank >= 4 for t in plan.transfers)
    assert plan.summary()["across_host_elements"] == 0
    assert reshard_plan(src, dst).summary()["across_host_elements"] is None


def test_undecodable_source_with_several_runs_per_rank() -> None:
    src = ShardingSpec((8, 2), Mesh((2,)), [StridedShard(0, 2)])  # rank 0: rows 0-1, 4-5
    dst = ShardingSpec((8, 2), Mesh((2,), ranks=[1, 2]), [Shard(0)])
    plan = reshard_plan(src, dst)
    assert plan.transfers == (
        Transfer(0, 1, ((0, 2), (0, 2))),
        Transfer(1, 1, ((2, 4), (0, 2))),
        Transfer(0, 2, ((4, 6), (0, 2))),
        Transfer(1, 2, ((6, 8), (0, 2))),
    )
    check_plan(plan, src, dst, None)


def test_zero_dim_and_empty_tensors() -> None:
    src = ShardingSpec((), Mesh((2,)), [Replicate()])
    dst = ShardingSpec((), Mesh((2,), ranks=[1, 2]), [Replicate()])
    plan = reshard_plan(src, dst)
    assert plan.transfers == (Transfer(1, 1, ()), Transfer(0, 2, ()))
    assert plan.elements_moved == 1
    empty = reshard_plan(
        ShardingSpec((0, 3), Mesh((2,)), [Shard(0)]), ShardingSpec((0, 3), Mesh((3,)), [Shard(1)])
    )
    assert empty.transfers == () and empty.summary()["allgather_ratio"] is None


def test_large_fsdp_plan_sizes() -> None:
    """Shapes only (timing is in benchmarks/bench_reshard_plan.py)."""
    src = ShardingSpec((8192, 1024), Mesh({"dp": 4096}), [Shard(0)])
    dst = ShardingSpec((8192, 1024), Mesh({"tp": 8}), [Shard(1)])
    plan = reshard_plan(src, dst)
    assert len(plan) == 4096 * 8
    assert len(plan.local_copies()) == 8
    assert plan.elements_moved == 8192 * 1024 - 8 * 2 * 128
    assert plan.sends(100) == tuple(
        Transfer(100, d, ((200, 202), (128 * d, 128 * d + 128))) for d in range(8)
    )
    assert len(plan.receives(7)) == 4095


def test_errors_name_the_problem() -> None:
    mesh = Mesh({"dp": 2, "tp": 2})
    ok = ShardingSpec((4, 4), mesh, [Shard(0), Shard(1)])
    partial = ShardingSpec((4, 4), mesh, [Partial(), Shard(1)])
    with pytest.raises(ValueError, match=r"src_spec has Partial\(reduce_op='sum'\) on mesh dim 0"):
        reshard_plan(partial, ok)
    with pytest.raises(ValueError, match=r"dst_spec has Partial.*'dp'"):
        reshard_plan(ok, partial)
    with pytest.raises(
        ValueError, match=r"global shapes differ: src_spec \(4, 4\), dst_spec \(4, 5\)"
    ):
        reshard_plan(ok, ShardingSpec((4, 5), mesh, [Shard(0), Shard(1)]))
    with pytest.raises(TypeError, match="dst_spec must be a ShardingSpec"):
        reshard_plan(ok, "spec")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ranks_per_host must be >= 1, got 0"):
        reshard_plan(ok, ok, ranks_per_host=0)
    with pytest.raises(TypeError, match="ranks_per_host must be an int"):
        reshard_plan(ok, ok, ranks_per_host=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rank must be an int"):
        reshard_plan(ok, ok).sends("0")  # type: ignore[arg-type]


def test_plan_is_an_immutable_value() -> None:
    src = ShardingSpec((4,), Mesh((2,)), [Shard(0)])
    dst = ShardingSpec((4,), Mesh((4,)), [Shard(0)])
    plan = reshard_plan(src, dst)
    assert plan == fresh_plan(src, dst, None) and hash(plan) == hash(fresh_plan(src, dst, None))
    with pytest.raises(AttributeError):
        plan.ranks_per_host = 2  # type: ignore[misc]
    with pytest.raises(ValueError, match="read-only"):
        plan.arrays()["src"][0] = 5
    assert "4 transfers" in repr(plan)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_identity_reshard_is_all_local(spec: ShardingSpec) -> None:
    plan = reshard_plan(spec, spec)
    assert plan.elements_moved == 0
    assert all(t.is_local for t in plan.transfers)
