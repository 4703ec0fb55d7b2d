"""Two separately launched worlds move a model over a ``meshlayout.torch.sync_group``.

A "trainer" world (4 processes with their own gloo default group: FSDP2 over TP, uneven
and strided) and an "engine" world (2 processes, with no default group, or with an
unrelated gloo default group of their own) are started independently (forkserver
children that never used torch before, one ``run_multiproc`` per world),
as torchrun and vLLM would start them; they meet only through the sync group's store.
Trainer ranks sit at permuted sync ranks, so DTensor meshes must be translated.
Expected destination pieces come from ``torch.chunk`` of an unsharded copy of the model
(torch's own ``Shard`` semantics), bit for bit in bfloat16.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

pytest.importorskip("torch")

from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(400)]

ENGINE = 2  # engine world: sync ranks 0, 1 (sync rank 0 hosts the store)
TRAINER = 4  # trainer world: sync ranks 2..5, permuted
WORLD = ENGINE + TRAINER
# name -> (global shape, engine placement: ("shard", dim) or ("replicate",))
TENSORS = {
    "0.weight": ((13, 10), ("shard", 0)),  # column-parallel, 13 rows: uneven
    "0.bias": ((13,), ("shard", 0)),
    "2.weight": ((7, 13), ("shard", 1)),  # row-parallel
    "2.bias": ((7,), ("replicate",)),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _sync_rank_of_trainer(rank: int) -> int:
    return ENGINE + (rank ^ 1)


def _make() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(10, 13), torch.nn.ReLU(), torch.nn.Linear(13, 7))


# ---------------------------------------------------------------------- trainer world
def _trainer(rank: int, world: int, port: int, errors: bool) -> dict[str, Any]:
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    from meshlayout.torch import WeightTransfer, sync_group

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    model = _make()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    params = dict(model.named_parameters())
    out: dict[str, Any] = {"placements": {n: str(list(p.placements)) for n, p in params.items()}}
    sg = sync_group("127.0.0.1", port, _sync_rank_of_trainer(rank), WORLD, timeout=60)
    out["rank_map"] = sg.rank_map()
    wt = WeightTransfer(params, None, bucket_bytes=64, group=sg)
    wt.run(verify=True)
    with torch.no_grad():  # a "training step": every parameter changes in place
        for p in params.values():
            p.mul_(2)
    wt.run(verify=True)
    out["rounds"] = len(wt.plan.rounds)
    if errors:
        out["mismatch"] = _attempt(lambda: WeightTransfer(params, None, group=sg))
        out["absent"] = _attempt(lambda: WeightTransfer(params, None, group=sg, timeout=5).run())
    sg.destroy()
    return out


def _attempt(call: Any) -> Any:
    try:
        call()
        return "no error"
    except Exception as exc:
        return (type(exc).__name__, list(getattr(exc, "missing", [])), str(exc))


# ---------------------------------------------------------------------- engine world
def _engine_dst(rank: int, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    import torch

    from meshlayout import Mesh
    from meshlayout.sharding import Replicate, Shard, ShardingSpec

    tp = Mesh({"tp": ENGINE}, ranks=list(range(ENGINE)))
    dst = {}
    for name, (_, how) in TENSORS.items():
        placement = Shard(how[1]) if how[0] == "shard" else Replicate()
        dst[name] = (ShardingSpec(shapes[name], tp, [placement]), torch.bfloat16)
    return dst


def _expected(rank: int, scale: float) -> dict[str, Any]:
    import torch

    full = {n: p.detach() * scale for n, p in _make().named_parameters()}
    want = {}
    for name, (_, how) in TENSORS.items():
        t = full[name].to(torch.bfloat16)
        want[name] = t.chunk(ENGINE, how[1])[rank] if how[0] == "shard" else t
    return want


def _engine(rank: int, world: int, port: int, errors: bool, default_group: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from meshlayout.torch import WeightTransfer, sync_group

    out: dict[str, Any] = {"default_group": dist.is_initialized()}
    assert dist.is_initialized() == default_group
    sg = sync_group("127.0.0.1", port, rank, WORLD, timeout=60)
    out["rank_map"] = sg.rank_map()
    shapes = {n: s for n, (s, _) in TENSORS.items()}
    dst = _engine_dst(rank, shapes)
    wt = WeightTransfer(None, dst, bucket_bytes=64, group=sg)
    outs = {n: torch.zeros(spec.local_shape(rank), dtype=dt) for n, (spec, dt) in dst.items()}
    problems = []
    for step, scale in enumerate((1.0, 2.0)):
        got = wt.run(out=outs, verify=True)
        for name, want in _expected(rank, scale).items():
            if got[name] is not outs[name]:
                problems.append(f"step {step} {name}: not written into out=")
            elif not torch.equal(got[name].view(torch.int16), want.view(torch.int16)):
                problems.append(f"step {step} {name}: wrong values")
    out["problems"] = problems
    if errors:
        bad = dict(shapes, **{"2.weight": (7, 12)})
        out["mismatch"] = _attempt(lambda: WeightTransfer(None, _engine_dst(rank, bad), group=sg))
        if rank == 0:  # sync rank 1 leaves; rank 0 must stay to host the store
            out["absent"] = _attempt(lambda: WeightTransfer(None, dst, group=sg, timeout=5).run())
    if not errors or rank == 1:
        sg.destroy()
        return out
    time.sleep(1)  # keep hosting the store while the others report
    sg.destroy()
    return out


# ---------------------------------------------------------------------- parent side
def _two_worlds(engine_default_group: bool, errors: bool) -> tuple[list[Any], list[Any]]:
    port = _free_port()
    with ThreadPoolExecutor(2) as pool:
        engine = pool.submit(
            run_multiproc,
            _engine,
            ENGINE,
            port,
            errors,
            engine_default_group,
            timeout=240,
            init=engine_default_group,
        )
        trainer = pool.submit(run_multiproc, _trainer, TRAINER, port, errors, timeout=240)
        return trainer.result(), engine.result()


@pytest.fixture(scope="module")
def without_default_group() -> tuple[list[Any], list[Any]]:
    return _two_worlds(engine_default_group=False, errors=True)


def test_fsdp2_over_tp_reaches_a_world_without_a_default_group(
    without_default_group: tuple[list[Any], list[Any]],
) -> None:
    trainer, engine = without_default_group
    for r, got in enumerate(engine):
        assert got["default_group"] is False
        assert got["rank_map"] == {}
        assert got["problems"] == [], (r, got["problems"])
    for got in trainer:
        assert got["placements"]["0.weight"].startswith("[_StridedShard(dim=0"), got
        assert got["rank_map"] == {t: _sync_rank_of_trainer(t) for t in range(TRAINER)}
        assert got["rounds"] > 1  # several rounds, each one collective of the sync group


def test_mismatch_raises_in_both_worlds(without_default_group: tuple[list[Any], list[Any]]) -> None:
    trainer, engine = without_default_group
    for got in trainer + engine:
        kind, _, text = got["mismatch"]
        assert kind == "ValueError", got["mismatch"]  # the plan's check, on every rank
        assert "'2.weight': global shapes differ: src (7, 13), dst (7, 12)" in text, text


def test_absent_rank_is_named_across_worlds(
    without_default_group: tuple[list[Any], list[Any]],
) -> None:
    trainer, engine = without_default_group
    for got in [*trainer, engine[0]]:
        kind, missing, text = got["absent"]
        assert kind == "RankTimeoutError" and missing == [1], got["absent"]
        assert "1" in text


def test_a_world_with_its_own_unrelated_default_group() -> None:
    trainer, engine = _two_worlds(engine_default_group=True, errors=False)
    for r, got in enumerate(engine):
        assert got["default_group"] is True
        assert got["rank_map"] == {0: 0, 1: 1}
        assert got["problems"] == [], (r, got["problems"])
    for got in trainer:
        assert got["rank_map"] == {t: _sync_rank_of_trainer(t) for t in range(TRAINER)}


# ---------------------------------------------------------------------- start-up errors
def test_disagreeing_members_and_taken_ranks_fail_clearly() -> None:
    from meshlayout.torch import RankTimeoutError, sync_group

    port = _free_port()
    results: dict[str, Any] = {}

    def join(key: str, rank: int, world: int, timeout: float) -> None:
        try:
            results[key] = sync_group("127.0.0.1", port, rank, world, timeout=timeout)
        except Exception as exc:
            results[key] = exc

    host = threading.Thread(target=join, args=("host", 0, 3, 4))
    host.start()
    time.sleep(0.5)
    join("world size", 1, 2, 4)  # world size 2 here, 3 on rank 0
    join("taken", 1, 3, 4)  # rank 1 was claimed by the call above
    host.join()
    assert isinstance(results["world size"], ValueError), results
    assert "world_size 2 here, 3 on rank 0" in str(results["world size"])
    assert isinstance(results["taken"], ValueError), results
    assert "already taken" in str(results["taken"])
    assert isinstance(results["host"], RankTimeoutError), results
    assert results["host"].missing == (1, 2)


def test_no_store_at_the_address_is_named() -> None:
    from meshlayout.torch import RankTimeoutError, sync_group

    with pytest.raises(RankTimeoutError, match="found no store") as info:
        sync_group("127.0.0.1", _free_port(), 1, 2, timeout=1)
    assert info.value.missing == (0,)


def test_bad_arguments() -> None:
    from meshlayout.torch import WeightTransfer, sync_group

    with pytest.raises(ValueError, match="backend must be one of"):
        sync_group("127.0.0.1", 29500, 0, 1, backend="mpi")
    with pytest.raises(TypeError, match="world_size must be an int"):
        sync_group("127.0.0.1", 29500, 0, 1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="group must be a SyncGroup"):
        WeightTransfer({}, {"w": None}, group="world")  # type: ignore[arg-type]
