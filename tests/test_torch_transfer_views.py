"""``WeightTransfer`` of views: random views of random shardings, on real gloo processes.

A trainer tensor laid out by a random :class:`ShardingSpec` (uneven, strided, replicated,
mesh families) is sent as ``tensor[index]`` (:func:`~meshlayout.sharding.view_spec`: a
:class:`RunsSpec` source, each rank cutting its piece of the view out of its local
piece) to a random destination layout of the view. Every destination piece must equal
``dst.shard(full[index])`` bit for bit (the reference: numpy-style indexing of the full
tensor), with and without ``verify=True``: the stacked-expert recipe (one expert of a
``[E, F, D]`` tensor sharded by expert and FSDP) is one of these cases.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

pytest.importorskip("torch")

from meshlayout import Mesh
from meshlayout.sharding import Shard, ShardingSpec, StridedShard, view_spec
from multiproc import run_multiproc
from test_torch_reshard import WORLD, _bits, _full, _random_spec

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]

Case = tuple[str, ShardingSpec, Any, ShardingSpec, str]


def _random_index(rng: random.Random, shape: tuple[int, ...]) -> Any:
    out: list[Any] = []
    for n in shape[: rng.randint(1, len(shape))]:
        kind = rng.random()
        if kind < 0.35 and len(out) < len(shape) - 1:
            out.append(rng.randrange(-n, n))
        elif kind < 0.8:
            a = rng.randrange(n)
            out.append(slice(a, rng.randint(a + 1, n), rng.choice((None, 1, 1, 2, 3))))
        else:
            out.append(slice(None))
    return tuple(out)


def cases(n: int, seed: int) -> list[Case]:
    rng = random.Random(seed)
    out: list[Case] = []
    # the recipe: expert 3 of w1 [8, 6, 4], experts Shard(0) over ep=2, FSDP Shard(1) on top
    w1 = ShardingSpec((8, 6, 4), Mesh({"dp": 2, "ep": 2}), [Shard(1), Shard(0)])
    tp = Mesh({"tp": 2}, ranks=[4, 5])
    out.append(("expert", w1, (3,), ShardingSpec((6, 4), tp, [Shard(0)]), "float32"))
    strided = ShardingSpec((7, 5), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)])
    out.append(
        ("strided", strided, (slice(1, 7, 2),), ShardingSpec((3, 5), tp, [Shard(1)]), "int64")
    )
    while len(out) < n:
        shape = tuple(rng.randint(1, 7) for _ in range(rng.randint(1, 3)))
        try:
            src = _random_spec(rng, shape)
            index = _random_index(rng, shape)
            vspec, _ = view_spec(src, index)
            dst = _random_spec(rng, vspec.global_shape)
        except ValueError:
            continue
        out.append((f"random #{len(out)}", src, index, dst, rng.choice(("float32", "bfloat16"))))
    return out


def _ranks(spec: ShardingSpec) -> set[int]:
    import numpy as np

    return {int(r) for r in np.asarray(spec.mesh.submeshes()).reshape(-1).tolist()}


def _body(rank: int, world: int, all_cases: list[Case]) -> dict[str, Any]:
    import torch

    from meshlayout.torch import WeightTransfer

    union = set().union(*(_ranks(s) | _ranks(d) for _, s, _, d, _ in all_cases))
    if rank not in union:
        return {}
    src: dict[str, Any] = {}
    dst: dict[str, Any] = {}
    want: dict[str, Any] = {}
    for name, spec, index, dspec, dtype in all_cases:
        full = _full(spec.global_shape, dtype)
        vspec, local_index = view_spec(spec, index)
        if rank in local_index:
            local = spec.shard(full, rank)
            ix = tuple(
                torch.from_numpy(e) if hasattr(e, "dtype") and not isinstance(e, int) else e
                for e in local_index[rank]
            )
            src[name] = (local[ix].contiguous(), vspec)
        if rank in _ranks(dspec):
            dst[name] = dspec
            want[name] = dspec.shard(full[index], rank)
    wt = WeightTransfer(src or None, dst or None, bucket_bytes=64, timeout=120)
    problems = []
    for verify in (False, True):
        got = wt.run(verify=verify)
        for name, t in got.items():
            if not torch.equal(_bits(t), _bits(want[name])):
                problems.append(f"{name} (verify={verify}): {t} != {want[name]}")
        if sorted(got) != sorted(want):
            problems.append(f"names {sorted(got)} != {sorted(want)}")
    return {"problems": problems, "received": sorted(dst)}


@pytest.mark.parametrize("seed", [0, 1])
def test_random_views_of_random_shardings_arrive_exactly(seed: int) -> None:
    all_cases = cases(24, seed)
    results = run_multiproc(_body, WORLD, all_cases, timeout=300, start_method="spawn")
    problems = [p for r in results for p in r.get("problems", [])]
    assert not problems, "\n".join(problems[:10])
    assert sum(len(r.get("received", [])) for r in results) >= len(all_cases)


def _partial(rank: int, world: int) -> dict[str, Any]:
    """Destinations holding only part of a tensor (rows [0, 3) and [3, 4) of 6) verify
    against those elements alone; a corrupted one still fails."""
    import torch

    from meshlayout.sharding import RunsSpec
    from meshlayout.torch import TransferVerificationError, WeightTransfer

    full = _full((6, 4), "float32")
    src_spec = ShardingSpec((6, 4), Mesh({"dp": 3}), [Shard(0)])
    dst_spec = RunsSpec.from_boxes((6, 4), {4: ((0, 3), (0, 4)), 5: ((3, 4), (0, 4))})
    src = {"w": (src_spec.shard(full, rank), src_spec)} if rank < 3 else None
    dst = {"w": dst_spec} if rank >= 4 else None
    if src is None and dst is None:
        return {}
    wt = WeightTransfer(src, dst, bucket_bytes=64, timeout=120)
    got = wt.run(verify=True)
    ok = all(torch.equal(t, dst_spec.shard(full, rank)) for t in got.values())
    original = wt.unpack

    def corrupt(index: int, recv: Any, outs: Any) -> None:
        original(index, recv, outs)
        for t in outs.values():
            t.view(-1)[0] += 1

    wt.unpack = corrupt  # type: ignore[method-assign]
    try:
        wt.run(verify=True)
        caught = "no error"
    except TransferVerificationError as exc:
        caught = str(exc)
    return {"ok": ok, "caught": caught}


def test_a_destination_holding_part_of_a_tensor_verifies_on_that_part() -> None:
    results = run_multiproc(_partial, WORLD, timeout=300, start_method="spawn")
    for rank in (4, 5):
        assert results[rank]["ok"], results[rank]
    for rank in (0, 1, 2, 4, 5):
        assert "destination pieces differ from the source for ['w']" in results[rank]["caught"]
