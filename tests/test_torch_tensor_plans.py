"""The data plans of full_tensor and redistribute, every rank simulated in one process.

The collectives themselves are tested on real gloo processes (test_torch_tensor.py,
test_torch_failures.py); here the pure parts around them — which ranks gather
together, how the padded receive buffer becomes the global tensor, who sends which
elements to whom and how a receiver unpacks them — run for every rank of random
meshes (permuted rank maps included) and random specs (uneven, strided, undecodable),
with the collective replaced by its definition, and are compared with the brute-force
answer: ``ShardingSpec.shard`` of the global tensor.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from meshlayout import Mesh  # noqa: E402
from meshlayout.sharding import Replicate, Shard, ShardingSpec, StridedShard  # noqa: E402
from meshlayout.torch._tensor import (  # noqa: E402
    _assemble_by_runs,
    _assemble_in_order,
    _Exchange,
    _pairs,
    _pieces_in_memory_order,
)

pytestmark = pytest.mark.torch


@st.composite
def meshes(draw: st.DrawFn) -> Mesh:
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3)))
    ranks = draw(st.permutations(range(math.prod(shape))))
    return Mesh(shape, ranks=ranks)


@st.composite
def specs(draw: st.DrawFn, mesh: Mesh, shape: tuple[int, ...]) -> ShardingSpec:
    placements = []
    for _ in range(mesh.ndim):
        d = draw(st.integers(0, len(shape) - 1))
        kind = draw(st.sampled_from(("R", "S", "SS")))
        if kind == "R":
            placements.append(Replicate())
        elif kind == "S":
            placements.append(Shard(d))
        else:
            placements.append(StridedShard(d, draw(st.integers(2, 3))))
    try:
        return ShardingSpec(shape, mesh, placements)
    except ValueError:
        assume(False)
        raise  # unreachable


@st.composite
def cases(draw: st.DrawFn, n_specs: int) -> tuple[Mesh, torch.Tensor, list[ShardingSpec]]:
    mesh = draw(meshes())
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=1, max_size=2)))
    x = torch.arange(float(math.prod(shape)), dtype=torch.float64).reshape(shape) + 1
    return mesh, x, [draw(specs(mesh, shape)) for _ in range(n_specs)]


def _padded_gather(pieces: list[torch.Tensor]) -> tuple[torch.Tensor, int]:
    """What the padded all-gather delivers: each piece at j * width (padding is NaN)."""
    width = max(p.numel() for p in pieces)
    recv = torch.full((width * len(pieces),), float("nan"), dtype=torch.float64)
    for j, p in enumerate(pieces):
        recv[j * width : j * width + p.numel()] = p.reshape(-1)
    return recv, width


SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
)


@SETTINGS
@given(cases(1))
def test_full_tensor_assembly_gives_the_global_tensor_on_every_rank(case) -> None:
    mesh, x, (spec,) = case
    placements = spec.placements()
    sharding = [m for m, p in enumerate(placements) if not isinstance(p, Replicate)]
    assume(any(mesh.shape[m] > 1 for m in sharding))
    in_order = _pieces_in_memory_order(spec)
    for rank in mesh.rank_map:
        if in_order is not None:  # the group is flattened in shard order
            flat = mesh[tuple(m for m in in_order if mesh.shape[m] > 1)].flatten()
            members = flat.group(rank, 0)
            recv, width = _padded_gather([spec.shard(x, r) for r in members])
            sizes = [math.prod(spec.local_shape(r)) for r in members]
            got = _assemble_in_order(recv, width, sizes, spec.global_shape)
            assert got.data_ptr() == recv.data_ptr()  # a view: no reassembly copy
        else:
            members = mesh[tuple(sharding)].flatten().group(rank, 0)
            recv, width = _padded_gather([spec.shard(x, r) for r in members])
            got = _assemble_by_runs(recv, width, spec, members)
        assert torch.equal(got, x), (spec.placements(), rank, members)


@SETTINGS
@given(cases(2))
def test_redistribute_plan_moves_each_needed_element_once_and_lands_it(case) -> None:
    mesh, x, (src, dst) = case
    ranks = list(mesh.rank_map)
    plans = {}
    for rank in ranks:
        members = mesh.flatten().group(rank, 0)
        plans[rank] = (members, _Exchange(src.shard(x, rank), src, dst, rank, members))
    for rank in ranks:
        members, plan = plans[rank]
        parts = []
        for i, sender in enumerate(members):  # the all_to_all, by definition
            sender_members, sender_plan = plans[sender]
            assert sender_members == members
            j = members.index(rank)
            start = sum(sender_plan.send_sizes[:j])
            n = sender_plan.send_sizes[j]
            assert n == plan.recv_sizes[i], (sender, rank)  # both sides agree
            parts.append(sender_plan.send[start : start + n])
        recv = torch.cat(parts) if parts else torch.empty(0, dtype=x.dtype)
        in_place = sum(plan.out[d].numel() for _, d in _pairs(src, rank, dst, rank))
        needed = math.prod(dst.local_shape(rank))
        assert in_place + sum(plan.recv_sizes) == needed  # every element once, no more
        assert torch.equal(plan.unpack(recv), dst.shard(x, rank)), (rank, src, dst)
