"""The demo's parent process: plan, start the workers, collect their events, run the checks."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO, Any

from .. import render
from . import checkpoint_report, config
from .checks import check_training, step_line
from .config import HIDDEN, IN_FEATURES, OUT_FEATURES, DemoConfig, demo_parallel_dims
from .model import reference
from .worker import tcp_store

__all__ = ["run_demo"]


#: The Python code a worker interpreter runs: ``sys.argv`` is [``-c``, package root, spec].
#: The root is where the caller found ``meshlayout``, added only if the child's path lacks it.
_WORKER_CODE = (
    "import sys\n"
    "if sys.argv[1] not in sys.path:\n"
    "    sys.path.insert(0, sys.argv[1])\n"
    "from meshlayout.demo.worker import worker_main\n"
    "sys.exit(worker_main(sys.argv[2]))\n"
)


class _Workers:
    """``nproc`` worker interpreters and threads that read their events and stderr.

    Every line a worker writes to stdout becomes an event on :attr:`events`
    (``("eof", rank)`` when its stdout closes); the last lines of its stderr are
    kept for the error report.
    """

    def __init__(self, cfg: DemoConfig, port: int, checkpoint_dir: str = "") -> None:
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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

    store = tcp_store()("127.0.0.1", 0, cfg.nproc + 1, is_master=True, wait_for_workers=False)
    print(
        f"== training a {IN_FEATURES}->{HIDDEN}->{OUT_FEATURES} MLP with "
        f"TP={pd.degrees['tp']} x FSDP={pd.mesh('fsdp').size()} on {cfg.nproc} gloo processes ==",
        file=out,
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="meshlayout-demo-") as scratch:  # checkpoints
        workers = _Workers(cfg, store.port, scratch)
        ref_losses, ref_params = reference(cfg.steps)
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
            self._print(step_line(step, self.cfg.steps, value, self.ref_losses[step]))
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
    ok = check_training(cfg.steps, got.losses, got.params, ref_losses, ref_params, out)
    print(file=out)
    ok &= checkpoint_report.report(got.checkpoint, scratch, ref_params, config.PARAM_TOLERANCE, out)
    return ok
