"""``meshlayout demo``: train a small model with TP + FSDP2 on local gloo processes (layer 4).

The demo is the end-to-end check a user runs first:

1. plan the meshes with :class:`~meshlayout.parallel_dims.ParallelDims` and print them;
2. start ``nproc`` CPU processes (gloo on 127.0.0.1), each a fresh Python
   interpreter (never ``fork``: the caller may already have used torch's thread
   pools, stores or process groups, and a forked child of such a process can
   hang; and not multiprocessing's ``spawn`` either, which re-runs the caller's
   main script), bind the meshes to real process groups with ``meshlayout.torch.build(pd, "cpu")`` and hand them to torch's
   tensor parallelism (``ColwiseParallel``/``RowwiseParallel``) and FSDP2
   (``fully_shard``) through ``DistributedMesh.to_torch()``;
3. train a 10 -> 6 -> 10 MLP (uneven FSDP-over-TP shards) for ``steps`` steps,
   printing the loss of every step;
4. check that the losses match a single-process run of the same model on the
   same data, and that :func:`meshlayout.torch.full_tensor` of every parameter
   (one all-gather, reassembled from our sharding spec) equals both torch's
   ``DTensor.full_tensor()`` and the single-process parameters. With ``tp=1``
   (odd ``nproc``) the parameters are sharded by FSDP alone, over the 1-D
   ``fsdp`` mesh, unevenly when ``nproc`` does not divide their rows;
5. save a checkpoint of the trained model with our exact DCP planners and with plain
   DCP, reload it into another configuration and into plain tensors, and compare
   plain DCP with ours on a layer torch 2.13 gets wrong (:mod:`.demo_checkpoint`).

It returns 0 if every check passes, 1 otherwise. torch is imported lazily so
that ``meshlayout --help`` stays fast and torch-free. The same training body
(:func:`_worker`) runs under torchrun, on one host or several, as
``python -m meshlayout.demo_train`` (:mod:`.demo_train`).
"""

from __future__ import annotations

import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import IO, Any

from . import demo_checkpoint, render
from .parallel_dims import ParallelDims

__all__ = ["DemoConfig", "demo_parallel_dims", "run_demo"]

IN_FEATURES, HIDDEN, OUT_FEATURES = 10, 6, 10
GLOBAL_BATCH = 24
LEARNING_RATE = 0.1
LOSS_TOLERANCE = 1e-5
PARAM_TOLERANCE = 1e-5
MAX_TIMEOUT = 86_400.0  # one day: a longer wait is a mistake, and timedelta overflows past ~1e14 s


@dataclass(frozen=True)
class DemoConfig:
    """What the demo runs: ``nproc`` processes for ``steps`` steps, bounded by ``timeout`` s.

    Everything is checked here, before a process starts; ``nproc`` must split the
    global batch of 24 (1, 2, 3, 4, 6 or 8), ``timeout`` is finite and positive.

    >>> DemoConfig(nproc=3, steps=2).timeout
    120.0
    >>> DemoConfig(timeout=float("nan"))
    Traceback (most recent call last):
    ...
    ValueError: timeout must be a finite number of seconds in (0, 86400], got nan
    """

    nproc: int = 4
    steps: int = 20
    timeout: float = 120.0

    def __post_init__(self) -> None:
        if isinstance(self.nproc, bool) or not isinstance(self.nproc, int):
            raise TypeError(f"nproc must be an int in [1, 8], got {self.nproc!r}")
        if not 1 <= self.nproc <= 8:
            raise ValueError(f"nproc must be an int in [1, 8], got {self.nproc!r}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int):
            raise TypeError(f"steps must be a positive int, got {self.steps!r}")
        if self.steps < 1:
            raise ValueError(f"steps must be a positive int, got {self.steps!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)):
            raise TypeError(f"timeout must be a number of seconds, got {self.timeout!r}")
        if not (math.isfinite(self.timeout) and 0 < self.timeout <= MAX_TIMEOUT):
            raise ValueError(
                f"timeout must be a finite number of seconds in (0, {MAX_TIMEOUT:.0f}], "
                f"got {self.timeout!r}"
            )
        if GLOBAL_BATCH % demo_parallel_dims(self.nproc).mesh("batch").size() != 0:
            raise ValueError(f"nproc={self.nproc} does not split the batch of {GLOBAL_BATCH}")


def demo_parallel_dims(nproc: int) -> ParallelDims:
    """The demo's plan: TP over 2 ranks when possible, FSDP over the rest.

    >>> demo_parallel_dims(4).degrees["dp_shard"], demo_parallel_dims(4).degrees["tp"]
    (2, 2)
    """
    tp = 2 if nproc % 2 == 0 else 1
    return ParallelDims(nproc, tp=tp)


# ---------------------------------------------------------------------- the model (shared)


def _make_model() -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_FEATURES))


def _batch(step: int) -> tuple[Any, Any]:
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=gen)
    y = torch.randn(GLOBAL_BATCH, OUT_FEATURES, generator=gen)
    return x, y


def _reference(steps: int) -> tuple[list[float], dict[str, Any]]:
    """Single-process training on the global batch: the ground truth."""
    import torch

    model = _make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for step in range(steps):
        x, y = _batch(step)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


# ---------------------------------------------------------------------- one worker


def _quiet_torch() -> None:
    """Silence torch's advice aimed at model authors; the demo reports its own findings."""
    import logging
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\..*")
    warnings.filterwarnings("ignore", message=".*requires_grad=True to a scalar.*")
    for name in ("torch", "torch.distributed", "torch.distributed.tensor._redistribute"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _tcp_store() -> Any:
    import torch.distributed as dist

    return dist.TCPStore  # type: ignore[attr-defined]  # not re-exported in torch's stubs


class _EventWriter:
    """A worker's report channel: one JSON array per line (``("loss", step, value)``...)."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def put(self, event: tuple[Any, ...]) -> None:
        self._stream.write(json.dumps(event) + "\n")
        self._stream.flush()


def _worker_main(spec: str) -> int:
    """Entry point of one worker interpreter; ``spec`` is the JSON that :func:`run_demo` passes.

    Events go to the stdout the parent reads; anything else printed in this
    process (torch's warnings, a stray ``print``) is sent to stderr instead, so
    it cannot corrupt the event stream.
    """
    args = json.loads(spec)
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    cfg = DemoConfig(nproc=args["nproc"], steps=args["steps"], timeout=args["timeout"])
    with channel:
        _worker(args["rank"], cfg, args["port"], _EventWriter(channel), args["checkpoint_dir"])
    return 0


def _worker(
    rank: int, cfg: DemoConfig, port: int | None, events: Any, checkpoint_dir: str = ""
) -> None:
    """Body of one process: build meshes, train, check, checkpoint, report through ``events``.

    ``port``: the parent's store (:func:`run_demo`); None when the caller has set up the
    default process group already and keeps it (torchrun's workers, :mod:`.demo_train`).

    With ``checkpoint_dir``, also run :func:`demo_checkpoint.worker_phase` there. Every
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

    _quiet_torch()
    if port is not None:
        limit = timedelta(seconds=cfg.timeout)
        store = _tcp_store()("127.0.0.1", port, cfg.nproc, is_master=False, timeout=limit)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=cfg.nproc, timeout=limit)
    events.put(("ready", rank))
    _quiet_torch()  # again: process-group start-up re-reads torch's log settings


def _train_and_check(rank: int, cfg: DemoConfig, events: Any, checkpoint_dir: str) -> None:
    """Build the meshes, shard and train the model, check its parameters, checkpoint it.

    Rank 0 reports the host report, every step's loss, the parameter checks and the
    checkpoint summary; the other ranks take part in the collectives only.
    """
    from .torch import build

    pd = demo_parallel_dims(cfg.nproc)
    built = build(pd, "cpu")
    if rank == 0:  # which groups cross hosts (hosts known under torchrun)
        events.put(("hosts", built.host_report(["tp", "fsdp", "batch"])))
    model = _make_model()
    # FSDP over TP: parameters live on the 2-D (fsdp, tp) mesh; FSDP alone: on 1-D fsdp.
    demo_checkpoint.parallelize(model, built, pd)
    dm = built.get(("fsdp", "tp") if pd.enabled("tp") else "fsdp")
    _train(model, built.get("batch"), cfg.steps, rank, events)
    checks = _parameter_checks(model, dm, rank)
    if rank == 0:
        events.put(("params", checks))
    if checkpoint_dir:
        summary = demo_checkpoint.worker_phase(model, built, pd, checkpoint_dir, _make_model)
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
        x, y = _batch(step)
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

    from .sharding import ShardingSpec
    from .torch import full_tensor

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


# ---------------------------------------------------------------------- the parent


def _progress(step: int, steps: int, width: int = 20) -> str:
    done = (step * width) // steps
    return "[" + "#" * done + "." * (width - done) + "]"


def _loss_matches(value: float, ref: float) -> bool:
    return abs(value - ref) <= LOSS_TOLERANCE * max(1.0, abs(ref))


def _step_line(step: int, steps: int, value: float, ref: float) -> str:
    """One training step's line: the distributed loss beside the single-process one."""
    mark = "ok" if _loss_matches(value, ref) else "MISMATCH"
    return (
        f"step {step + 1:3d}/{steps} {_progress(step + 1, steps)} "
        f"loss {value:.6f}  single-process {ref:.6f}  {mark}"
    )


def _check_training(
    steps: int,
    losses: dict[int, float],
    params: dict[str, Any],
    ref_losses: list[float],
    ref_params: dict[str, Any],
    out: IO[str],
) -> bool:
    """Print a PASS/FAIL line for the losses and for each parameter; True if all pass.

    ``losses`` and ``params`` are what rank 0 reported (``"loss"`` and ``"params"``
    events); the references are :func:`_reference`'s.
    """
    import torch

    ok = len(losses) == steps and all(_loss_matches(losses[s], ref_losses[s]) for s in range(steps))
    print(
        f"{'PASS' if ok else 'FAIL'} losses match the single-process run "
        f"({len(losses)}/{steps} steps, tolerance {LOSS_TOLERANCE:g})",
        file=out,
    )
    for name, ref in ref_params.items():
        info = params.get(name)
        if info is None:
            ok = False
            print(f"FAIL {name}: no parameter reported", file=out)
            continue
        close = torch.allclose(torch.tensor(info["value"]), ref, atol=PARAM_TOLERANCE)
        good = close and info["same_as_torch"]
        ok &= good
        ours_n, torch_n = info["collectives"]
        print(
            f"{'PASS' if good else 'FAIL'} full_tensor({name}) {tuple(ref.shape)} "
            f"{info['placements']}: equals single-process: {close}, equals torch's "
            f"DTensor.full_tensor(): {info['same_as_torch']}; collectives ours {ours_n}, "
            f"torch {torch_n}",
            file=out,
        )
    return ok


#: The Python code a worker interpreter runs: ``sys.argv`` is [``-c``, package root, spec].
#: The root is where the caller found ``meshlayout``, added only if the child's path lacks it.
_WORKER_CODE = (
    "import sys\n"
    "if sys.argv[1] not in sys.path:\n"
    "    sys.path.insert(0, sys.argv[1])\n"
    "from meshlayout.demo import _worker_main\n"
    "sys.exit(_worker_main(sys.argv[2]))\n"
)


class _Workers:
    """``nproc`` worker interpreters and threads that read their events and stderr.

    Every line a worker writes to stdout becomes an event on :attr:`events`
    (``("eof", rank)`` when its stdout closes); the last lines of its stderr are
    kept for the error report.
    """

    def __init__(self, cfg: DemoConfig, port: int, checkpoint_dir: str = "") -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ)
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # read when torch's C++ side loads
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self.tails: list[deque[str]] = [deque(maxlen=30) for _ in range(cfg.nproc)]
        self.procs: list[subprocess.Popen[str]] = []
        self._threads: list[threading.Thread] = []
        for rank in range(cfg.nproc):
            spec: dict[str, Any] = {"rank": rank, "port": port, "timeout": cfg.timeout}
            spec.update(nproc=cfg.nproc, steps=cfg.steps, checkpoint_dir=checkpoint_dir)
            proc = subprocess.Popen(
                [sys.executable, "-c", _WORKER_CODE, root, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
                encoding="utf-8",
                errors="replace",
            )
            self.procs.append(proc)
            self._follow(self._read_events, rank, proc.stdout)
            self._follow(self._read_tail, rank, proc.stderr)

    def _follow(self, target: Any, rank: int, stream: IO[str] | None) -> None:
        thread = threading.Thread(target=target, args=(rank, stream), daemon=True)
        thread.start()
        self._threads.append(thread)

    def _read_events(self, rank: int, stream: IO[str]) -> None:
        for line in stream:
            try:
                event = tuple(json.loads(line))
            except ValueError:
                event = ("error", rank, f"unreadable report {line.strip()!r}")
            self.events.put(event)
        self.events.put(("eof", rank))

    def _read_tail(self, rank: int, stream: IO[str]) -> None:
        for line in stream:
            self.tails[rank].append(line.rstrip())

    def exit_report(self, rank: int) -> str:
        """Why ``rank`` stopped early: its exit status and the end of its stderr."""
        try:
            code: int | str | None = self.procs[rank].wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = "(still running)"
        tail = "\n".join(self.tails[rank])
        return f"rank {rank} exited with status {code} before finishing" + (
            f"; its stderr ends with:\n{tail}" if tail else ""
        )

    def stop(self, grace: float) -> None:
        """Wait up to ``grace`` s in all for the workers, kill the ones still running."""
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for thread in self._threads:
            thread.join(timeout=5)


def run_demo(cfg: DemoConfig | None = None, out: IO[str] | None = None) -> int:
    """Run the demo; print to ``out`` (default stdout); return 0 if all checks pass.

    Safe to call from a process that already used torch (threads, stores, process
    groups), and from a script without an ``if __name__ == "__main__"`` guard:
    each worker is a fresh ``python -c`` interpreter, never a fork. Each costs an
    interpreter start and a torch import (a few seconds on a loaded 2-core
    machine), overlapped with the single-process reference run. The workers
    compute; the checks against ``LOSS_TOLERANCE`` and ``PARAM_TOLERANCE`` run
    here, in the calling process.
    """
    cfg = cfg or DemoConfig()
    out = out or sys.stdout
    started = time.perf_counter()
    pd = demo_parallel_dims(cfg.nproc)
    print("== plan ==", file=out)
    print(render.plan_text(render.plan_report(pd, views=("tp", "fsdp", "batch"))), file=out)
    print(file=out)

    store = _tcp_store()("127.0.0.1", 0, cfg.nproc + 1, is_master=True, wait_for_workers=False)
    print(
        f"== training a {IN_FEATURES}->{HIDDEN}->{OUT_FEATURES} MLP with "
        f"TP={pd.degrees['tp']} x FSDP={pd.mesh('fsdp').size()} on {cfg.nproc} gloo processes ==",
        file=out,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="meshlayout-demo-") as scratch:  # checkpoints
        workers = _Workers(cfg, store.port, scratch)
        ref_losses, ref_params = _reference(cfg.steps)
        got = _Collector(cfg, workers, ref_losses, started, out).run()
        workers.stop(grace=0.0 if got.errors else 10.0)  # a failed run's workers may be stuck
        ok = _checks(cfg, got, ref_losses, ref_params, scratch, out)
    print(f"demo {'passed' if ok else 'FAILED'} in {time.perf_counter() - started:.1f} s", file=out)
    return 0 if ok else 1


@dataclass
class _Reports:
    """What the workers reported in one run (filled by :class:`_Collector`)."""

    losses: dict[int, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] | None = None
    errors: list[str] = field(default_factory=list)
    ready: set[int] = field(default_factory=set)
    done: set[int] = field(default_factory=set)


class _Collector:
    """The parent's event loop: read the workers' events until all are done, one fails
    or ``cfg.timeout`` passes; print the start-up and loss lines as they come."""

    def __init__(
        self,
        cfg: DemoConfig,
        workers: _Workers,
        ref_losses: list[float],
        started: float,
        out: IO[str],
    ) -> None:
        self.cfg, self.workers, self.ref_losses = cfg, workers, ref_losses
        self.started, self.out = started, out
        self.got = _Reports()

    def run(self) -> _Reports:
        """Collect until every rank is done or an error (a failure, a timeout) is recorded."""
        cfg, got = self.cfg, self.got
        deadline = time.monotonic() + cfg.timeout
        while len(got.done) < cfg.nproc and not got.errors:
            try:
                wait = max(0.1, min(1.0, deadline - time.monotonic()))
                event = self.workers.events.get(timeout=wait)
            except queue.Empty:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(cfg.nproc)) - got.done)
                    got.errors.append(
                        f"timed out after {cfg.timeout:g} s waiting for ranks {missing}"
                    )
                continue
            self._record(event)
        return got

    def _record(self, event: tuple[Any, ...]) -> None:
        got, kind = self.got, event[0]
        if kind == "eof":
            if event[1] not in got.done:
                got.errors.append(self.workers.exit_report(event[1]))
        elif kind == "ready":
            got.ready.add(event[1])
            if len(got.ready) == self.cfg.nproc:
                self._print(
                    f"{self.cfg.nproc} worker interpreters joined the gloo group after "
                    f"{time.perf_counter() - self.started:.1f} s"
                )
        elif kind == "loss":
            _, step, value = event
            got.losses[step] = value
            self._print(_step_line(step, self.cfg.steps, value, self.ref_losses[step]))
        elif kind == "params":
            got.params = event[1]
        elif kind == "checkpoint":
            got.checkpoint = event[1]
        elif kind == "done":
            got.done.add(event[1])
        elif kind == "error":
            got.errors.append(f"rank {event[1]} failed: {event[2]}")

    def _print(self, text: str) -> None:
        print(text, file=self.out, flush=True)


def _checks(
    cfg: DemoConfig,
    got: _Reports,
    ref_losses: list[float],
    ref_params: dict[str, Any],
    scratch: str,
    out: IO[str],
) -> bool:
    """Print the ``== checks ==`` section (and the checkpoint one); True if all pass."""
    print(file=out)
    print("== checks ==", file=out)
    for err in got.errors:
        print(f"FAIL {err}", file=out)
    if got.errors:
        return False
    ok = _check_training(cfg.steps, got.losses, got.params, ref_losses, ref_params, out)
    print(file=out)
    ok &= demo_checkpoint.report(got.checkpoint, scratch, ref_params, PARAM_TOLERANCE, out)
    return ok
