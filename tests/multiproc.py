"""Run a function on N ``torch.distributed`` processes (gloo on 127.0.0.1), bounded in time.

Reusable test harness::

    from multiproc import run_multiproc

    def body(rank: int, world_size: int) -> int:
        import torch, torch.distributed as dist
        t = torch.tensor([rank])
        dist.all_reduce(t)
        return int(t)

    assert run_multiproc(body, 4) == [6, 6, 6, 6]

How it works:

* Children start with ``forkserver`` by default: forked from a fresh server process
  that has only *imported* torch (never used it), so they are safe even when the
  test process itself has already used torch (thread pools, stores, groups), and
  cheap because torch is imported once. ``spawn`` on request. ``fn`` must be
  importable (a module-level function of a test module).
* Rank 0 starts the ``TCPStore`` server on an OS-chosen free port (no port race
  between concurrent test runs) and hands the port to its peers through shared
  memory. Each child joins the default process group through that store, reports
  "ready", calls ``fn(rank, world_size, *args, **kwargs)`` and sends back its
  return value, or its exception and formatted traceback.
* Two budgets, so a loaded machine does not eat the test's time: ``startup_timeout``
  bounds starting every child and joining the process group; ``timeout`` bounds
  ``fn``, counted from the moment every rank is ready.
* Children stay alive until every rank has reported, so one rank finishing early
  never breaks its peers' gloo connections; then the parent releases them.
* When a budget runs out, stragglers get a Python stack dump (``faulthandler``, on
  their stderr) and are killed; the parent raises :class:`MultiProcTimeout` naming
  the ranks that did not finish.
* Any child exception is re-raised in the parent as :class:`MultiProcError`
  carrying every failing rank's traceback (``.errors``: rank -> exception when it
  could be pickled, ``.tracebacks``: rank -> text).
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import pickle
import queue
import socket
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any

__all__ = ["MultiProcError", "MultiProcTimeout", "run_multiproc"]

_RESULT_OK = "ok"
_RESULT_ERR = "err"
_READY = "ready"
#: Imported once by the forkserver, so forked children start with torch loaded.
_PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor", "torch._dynamo"]


class MultiProcError(RuntimeError):
    """One or more ranks raised. ``errors`` maps rank -> exception (if picklable)."""

    def __init__(
        self,
        message: str,
        errors: dict[int, BaseException | None],
        tracebacks: dict[int, str],
    ) -> None:
        super().__init__(message)
        self.errors = errors
        self.tracebacks = tracebacks


class MultiProcTimeout(MultiProcError, TimeoutError):
    """The run exceeded its hard timeout; ``missing`` lists ranks that never reported."""

    def __init__(
        self,
        message: str,
        missing: list[int],
        errors: dict[int, BaseException | None],
        tracebacks: dict[int, str],
    ) -> None:
        super().__init__(message, errors, tracebacks)
        self.missing = missing


def _child(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port_box: Any,
    port_ready: Any,
    backend: str,
    pg_timeout: float,
    budgets: tuple[float, float],
    env: dict[str, str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    results: Any,
    release: Any,
    init: bool,
) -> None:
    os.environ.update(env)
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    startup_timeout, timeout = budgets
    # Dump every thread's stack shortly before the parent kills us: hangs become readable.
    faulthandler.dump_traceback_later(max(startup_timeout - 1.0, 0.5), exit=False)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if not init:
            os.environ["MASTER_PORT"] = str(port_box.value)
        else:
            store_timeout = timedelta(seconds=max(pg_timeout, startup_timeout))
            if rank == 0:
                store = dist.TCPStore(
                    "127.0.0.1",
                    0,
                    world_size,
                    is_master=True,
                    timeout=store_timeout,
                    wait_for_workers=False,
                )
                port_box.value = store.port
                port_ready.set()
            else:
                if not port_ready.wait(startup_timeout):
                    raise TimeoutError(f"rank {rank}: rank 0 never published the store port")
                store = dist.TCPStore(
                    "127.0.0.1", port_box.value, is_master=False, timeout=store_timeout
                )
            os.environ["MASTER_PORT"] = str(port_box.value)
            dist.init_process_group(
                backend,
                store=store,
                rank=rank,
                world_size=world_size,
                timeout=timedelta(seconds=pg_timeout),
            )
        results.put((rank, _READY, None, ""))
        faulthandler.dump_traceback_later(max(timeout - 1.0, 0.5), exit=False)
        value = fn(rank, world_size, *args, **kwargs)
        try:
            payload = pickle.dumps(value)
        except Exception as exc:  # pragma: no cover - test authoring error
            raise TypeError(f"rank {rank}: return value is not picklable: {exc!r}") from exc
        results.put((rank, _RESULT_OK, payload, ""))
    except BaseException as exc:
        text = traceback.format_exc()
        try:
            blob: bytes | None = pickle.dumps(exc)
        except Exception:
            blob = None
        results.put((rank, _RESULT_ERR, blob, text))
    finally:
        # Stay alive (and connected) until every rank has reported.
        release.wait(startup_timeout + timeout)
        faulthandler.cancel_dump_traceback_later()
        sys.stdout.flush()
        sys.stderr.flush()


def run_multiproc(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    startup_timeout: float = 300.0,
    backend: str = "gloo",
    start_method: str = "forkserver",
    env: dict[str, str] | None = None,
    pg_timeout: float | None = None,
    init: bool = True,
    daemon: bool = True,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    Returns the list of return values indexed by rank. Raises :class:`MultiProcError`
    if any rank raised and :class:`MultiProcTimeout` if start-up took more than
    ``startup_timeout`` seconds or ``fn`` more than ``timeout`` seconds once every
    rank was ready (stragglers are killed). ``pg_timeout`` (default ``timeout``) is
    the default process group's timeout. ``init=False`` skips ``init_process_group``
    and exports a free ``MASTER_ADDR``/``MASTER_PORT`` for the caller's own rendezvous.
    ``daemon=False`` lets children start processes of their own (an inference engine);
    they are still killed when a budget runs out.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    pg_timeout = timeout if pg_timeout is None else pg_timeout
    child_env = {"OMP_NUM_THREADS": "1"}
    if os.path.exists("/sys/class/net/lo"):
        child_env["GLOO_SOCKET_IFNAME"] = "lo"
    child_env.update(env or {})

    ctx: Any = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(_PRELOAD)
    port_box = ctx.Value("i", 0)
    port_ready = ctx.Event()
    if not init:  # no store of ours: hand out a free port for the caller's rendezvous
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port_box.value = sock.getsockname()[1]
        port_ready.set()
    results = ctx.Queue()
    release = ctx.Event()
    procs = []
    for rank in range(world_size):
        p = ctx.Process(
            target=_child,
            args=(
                fn,
                rank,
                world_size,
                port_box,
                port_ready,
                backend,
                pg_timeout,
                (startup_timeout, timeout),
                child_env,
                args,
                kwargs,
                results,
                release,
                init,
            ),
            name=f"multiproc-rank{rank}",
            daemon=daemon,
        )
        p.start()
        procs.append(p)

    got = _Reports(world_size)
    try:
        ran_out = _collect(results, procs, got, startup_timeout, timeout)
    finally:
        _release(release, procs, got, results)

    missing = [r for r in range(world_size) if not got.finished(r)]
    detail = "".join(f"\n--- rank {r} ---\n{got.tracebacks[r]}" for r in sorted(got.tracebacks))
    if missing:
        raise MultiProcTimeout(
            f"ranks {missing} did not finish: the {ran_out} (killed){detail}",
            missing,
            got.errors,
            got.tracebacks,
        )
    if got.errors:
        raise MultiProcError(
            f"ranks {sorted(got.errors)} raised:{detail}", got.errors, got.tracebacks
        )
    return [got.values[r] for r in range(world_size)]


class _Reports:
    """What the children reported so far."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self.ready: set[int] = set()
        self.values: dict[int, Any] = {}
        self.errors: dict[int, BaseException | None] = {}
        self.tracebacks: dict[int, str] = {}

    def finished(self, rank: int) -> bool:
        return rank in self.values or rank in self.errors

    def all_finished(self) -> bool:
        return all(self.finished(r) for r in range(self.world_size))

    def all_started(self) -> bool:
        return all(r in self.ready or self.finished(r) for r in range(self.world_size))

    def record(self, rank: int, kind: str, payload: bytes | None, text: str) -> None:
        if kind == _READY:
            self.ready.add(rank)
        elif kind == _RESULT_OK:
            assert payload is not None
            self.values[rank] = pickle.loads(payload)
        else:
            exc: BaseException | None = None
            if payload is not None:
                try:
                    exc = pickle.loads(payload)
                except Exception:
                    exc = None
            self.errors[rank] = exc
            self.tracebacks[rank] = text


def _collect(
    results: Any, procs: list[Any], got: _Reports, startup_timeout: float, timeout: float
) -> str:
    """Read reports until every rank finished; else return which budget ran out."""
    phase, deadline = "start-up budget", time.monotonic() + startup_timeout
    while not got.all_finished():
        if phase == "start-up budget" and got.all_started():
            phase, deadline = "run budget", time.monotonic() + timeout
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            limit = startup_timeout if phase == "start-up budget" else timeout
            return f"{phase} of {limit:g}s ran out"
        try:
            got.record(*results.get(timeout=min(remaining, 0.5)))
        except queue.Empty:
            _note_dead(results, procs, got)
    return ""


def _note_dead(results: Any, procs: list[Any], got: _Reports) -> None:
    """A child that died without reporting (segfault, os._exit) never will."""
    dead = [r for r, p in enumerate(procs) if not p.is_alive() and not got.finished(r)]
    if not dead:
        return
    time.sleep(0.2)  # let a last in-flight report arrive
    try:
        while True:
            got.record(*results.get_nowait())
    except queue.Empty:
        pass
    for r in dead:
        if not got.finished(r):
            got.errors[r] = None
            got.tracebacks[r] = f"rank {r} exited with code {procs[r].exitcode} without reporting"


def _release(release: Any, procs: list[Any], got: _Reports, results: Any) -> None:
    """Let the children exit; kill stragglers at once and anyone slow to exit."""
    release.set()
    for r, p in enumerate(procs):
        if not got.finished(r):
            p.kill()
    grace = time.monotonic() + 5.0
    for p in procs:
        p.join(timeout=max(grace - time.monotonic(), 0.0))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5.0)
    results.close()
