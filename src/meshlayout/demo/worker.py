"""One demo process: join the group, build the meshes, train, check, checkpoint, report.

Runs in a fresh interpreter started by :mod:`.parent` (or under torchrun, :mod:`.train`);
every result goes to the parent as an event, one JSON array per line.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import IO, Any

from . import checkpoint
from .config import LEARNING_RATE, DemoConfig, demo_parallel_dims
from .model import global_batch, make_model

__all__ = ["EventWriter", "quiet_torch", "tcp_store", "worker", "worker_main"]


def quiet_torch() -> None:
    """Silence torch's advice aimed at model authors; the demo reports its own findings."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
    warnings.filterwarnings("ignore", message=".*requires_grad=True to a scalar.*")
    for name in ("torch", "torch.distributed", "torch.distributed.tensor._redistribute"):
        logging.getLogger(name).setLevel(logging.ERROR)


def tcp_store() -> Any:
    """torch's ``TCPStore`` class (imported lazily: ``meshlayout demo --help`` needs no torch)."""
    import torch.distributed as dist

    return dist.TCPStore  # type: ignore[attr-defined]  # not re-exported in torch's stubs


class EventWriter:
    """A worker's report channel: one JSON array per line (``("loss", step, value)``...)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def put(self, event: tuple[Any, ...]) -> None:
        self._stream.write(json.dumps(event) + "\n")
        self._stream.flush()


def worker_main(spec: str) -> int:
    """Entry point of one worker interpreter; ``spec`` is the JSON that :func:`.parent.run_demo` passes.

    Events go to the stdout the parent reads; anything else printed in this
    process (torch's warnings, a stray ``print``) is sent to stderr instead, so
    it cannot corrupt the event stream.
    """
    args = json.loads(spec)
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    cfg = DemoConfig(nproc=args["nproc"], steps=args["steps"], timeout=args["timeout"])
    with channel:
        worker(args["rank"], cfg, args["port"], EventWriter(channel), args["checkpoint_dir"])
    return 0


def worker(
    rank: int, cfg: DemoConfig, port: int | None, events: Any, checkpoint_dir: str = ""
) -> None:
    """Body of one process: build meshes, train, check, checkpoint, report through ``events``.

    ``port``: the parent's store (:func:`.parent.run_demo`); None when the caller has set up the
    default process group already and keeps it (torchrun's workers, :mod:`.train`).

    With ``checkpoint_dir``, also run :func:`checkpoint.worker_phase` there. Every
    failure is reported as an ``("error", rank, text)`` event, never raised.
    """
    try:
        _join(rank, cfg, port, events)
        _train_and_check(rank, cfg, events, checkpoint_dir)
        _leave(rank, port, events)
    except BaseException as exc:  # report, then let the parent fail the demo
        import traceback

        events.put(("error", rank, f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _join(rank: int, cfg: DemoConfig, port: int | None, events: Any) -> None:
    """Join the parent's gloo group (unless ``port`` is None: already joined); say ``ready``."""
    import torch.distributed as dist

    quiet_torch()
    if port is not None:
        limit = timedelta(seconds=cfg.timeout)
        store = tcp_store()("127.0.0.1", port, cfg.nproc, is_master=False, timeout=limit)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=cfg.nproc, timeout=limit)
    events.put(("ready", rank))
    quiet_torch()  # again: process-group start-up re-reads torch's log settings


def _train_and_check(rank: int, cfg: DemoConfig, events: Any, checkpoint_dir: str) -> None:
    """Build the meshes, shard and train the model, check its parameters, checkpoint it.

    Rank 0 reports the host report, every step's loss, the parameter checks and the
    checkpoint summary; the other ranks take part in the collectives only.
    """
    from ..torch import build

    pd = demo_parallel_dims(cfg.nproc)
    built = build(pd, "cpu")
    if rank == 0:  # which groups cross hosts (hosts known under torchrun)
        events.put(("hosts", built.host_report(["tp", "fsdp", "batch"])))
    model = make_model()
    # FSDP over TP: parameters live on the 2-D (fsdp, tp) mesh; FSDP alone: on 1-D fsdp.
    checkpoint.parallelize(model, built, pd)
    dm = built.get(("fsdp", "tp") if pd.enabled("tp") else "fsdp")
    _train(model, built.get("batch"), cfg.steps, rank, events)
    checks = _parameter_checks(model, dm, rank)
    if rank == 0:
        events.put(("params", checks))
    if checkpoint_dir:
        summary = checkpoint.worker_phase(model, built, pd, checkpoint_dir, make_model)
        if rank == 0:
            events.put(("checkpoint", summary))


def _train(model: Any, batch: Any, steps: int, rank: int, events: Any) -> None:
    """SGD for ``steps`` steps, each ``batch`` group on its slice of the global batch.

    ``batch`` is the 1-D ``batch`` :class:`~meshlayout.torch.DistributedMesh`; the
    loss is averaged over it and reported by rank 0 as ``("loss", step, value)``.
    """
    import torch
    import torch.distributed as dist

    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    n_batch = batch.mesh.size()
    me = batch.get_local_rank("batch")
    for step in range(steps):
        x, y = global_batch(step)
        x, y = x.chunk(n_batch)[me], y.chunk(n_batch)[me]
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        if n_batch > 1:
            dist.all_reduce(total, group=batch.get_group("batch"))
        if rank == 0:
            events.put(("loss", step, total.item() / n_batch))


def _parameter_checks(model: Any, dm: Any, rank: int) -> dict[str, Any]:
    """Per parameter: its placements, our ``full_tensor`` vs torch's, and both collective counts.

    ``dm`` is the :class:`~meshlayout.torch.DistributedMesh` the parameters live on;
    a parameter on another torch mesh is an error. Collective (every rank calls it).
    """
    import torch
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.debug import CommDebugMode

    from ..sharding import ShardingSpec
    from ..torch import full_tensor

    checks: dict[str, Any] = {}
    for name, param in model.state_dict().items():
        assert isinstance(param, DTensor)
        torch_ranks = param.device_mesh.mesh.tolist()
        if torch_ranks != dm.mesh.submesh(rank).tolist():
            raise RuntimeError(f"{name} lives on torch's mesh {torch_ranks}, not on {dm!r}")
        spec = ShardingSpec.from_torch(tuple(param.shape), dm.mesh, param.placements)
        with CommDebugMode() as ours_comm:  # type: ignore[no-untyped-call]
            ours = full_tensor(param.to_local(), dm, spec)
        with CommDebugMode() as torch_comm:  # type: ignore[no-untyped-call]
            theirs = param.full_tensor()
        checks[name] = {
            "placements": str(spec.placements()),
            "same_as_torch": bool(torch.equal(ours, theirs)),
            "value": ours.tolist(),
            "collectives": (ours_comm.get_total_counts(), torch_comm.get_total_counts()),
        }
    return checks


def _leave(rank: int, port: int | None, events: Any) -> None:
    """Wait for every rank, leave the group this worker joined (if any), say ``done``."""
    import torch.distributed as dist

    dist.barrier()
    if port is not None:
        dist.destroy_process_group()
    events.put(("done", rank))
