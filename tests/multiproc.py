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

* Rank 0 starts the ``TCPStore`` server on an OS-chosen free port (no port race
  between concurrent test workers) and hands the port to its peers through shared
  memory. The parent itself never starts torch threads before forking (a forked
  child can inherit a lock held by such a thread and hang in its first connect).
* Each child (``fork`` by default — fast, torch already imported; ``spawn`` on
  request, then ``fn`` must be importable) joins the default process group through
  that store, calls ``fn(rank, world_size, *args, **kwargs)`` and sends back its
  return value, or its exception and formatted traceback.
* Children stay alive until every rank has reported, so one rank finishing early
  never breaks its peers' gloo connections; then the parent releases them.
* A hard ``timeout`` bounds the run: stragglers get a Python stack dump
  (``faulthandler``, on their stderr) and are killed; the parent raises
  :class:`MultiProcTimeout` naming the ranks that did not finish.
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
    hard_timeout: float,
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
    # Dump every thread's stack shortly before the parent kills us: hangs become readable.
    faulthandler.dump_traceback_later(max(hard_timeout - 1.0, 0.5), exit=False)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if not init:
            os.environ["MASTER_PORT"] = str(port_box.value)
        else:
            store_timeout = timedelta(seconds=pg_timeout)
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
                if not port_ready.wait(hard_timeout):
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
        release.wait(hard_timeout)
        faulthandler.cancel_dump_traceback_later()
        sys.stdout.flush()
        sys.stderr.flush()


def run_multiproc(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 60.0,
    backend: str = "gloo",
    start_method: str = "fork",
    env: dict[str, str] | None = None,
    pg_timeout: float | None = None,
    init: bool = True,
    **kwargs: Any,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args, **kwargs)`` on ``world_size`` processes.

    Returns the list of return values indexed by rank. Raises :class:`MultiProcError`
    if any rank raised and :class:`MultiProcTimeout` if the run exceeded ``timeout``
    seconds (stragglers are killed). ``pg_timeout`` (default ``timeout``) is the
    default process group's timeout. ``init=False`` skips ``init_process_group`` and
    exports a free ``MASTER_ADDR``/``MASTER_PORT`` for the caller's own rendezvous.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    pg_timeout = timeout if pg_timeout is None else pg_timeout
    child_env = {"OMP_NUM_THREADS": "1"}
    if os.path.exists("/sys/class/net/lo"):
        child_env["GLOO_SOCKET_IFNAME"] = "lo"
    child_env.update(env or {})

    ctx = mp.get_context(start_method)
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
                timeout,
                child_env,
                args,
                kwargs,
                results,
                release,
                init,
            ),
            name=f"multiproc-rank{rank}",
            daemon=True,
        )
        p.start()
        procs.append(p)

    values: dict[int, Any] = {}
    errors: dict[int, BaseException | None] = {}
    tracebacks: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(values) + len(errors) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                rank, kind, payload, text = results.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                dead = [
                    r
                    for r, p in enumerate(procs)
                    if not p.is_alive() and r not in values and r not in errors
                ]
                # A child that died without reporting (segfault, os._exit) never will.
                if dead:
                    time.sleep(0.2)  # let a last in-flight report arrive
                    try:
                        while True:
                            rank, kind, payload, text = results.get_nowait()
                            _record(rank, kind, payload, text, values, errors, tracebacks)
                    except queue.Empty:
                        pass
                    for r in dead:
                        if r not in values and r not in errors:
                            errors[r] = None
                            tracebacks[r] = (
                                f"rank {r} exited with code {procs[r].exitcode} without reporting"
                            )
                continue
            _record(rank, kind, payload, text, values, errors, tracebacks)
    finally:
        release.set()
        for r, p in enumerate(procs):
            if r not in values and r not in errors:
                p.kill()  # a straggler: never waits for the grace period
        grace = time.monotonic() + 5.0
        for p in procs:
            p.join(timeout=max(grace - time.monotonic(), 0.0))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5.0)
        results.close()

    missing = [r for r in range(world_size) if r not in values and r not in errors]
    if missing:
        detail = "".join(f"\n--- rank {r} ---\n{tracebacks[r]}" for r in sorted(tracebacks))
        raise MultiProcTimeout(
            f"ranks {missing} did not finish within {timeout}s (killed){detail}",
            missing,
            errors,
            tracebacks,
        )
    if errors:
        detail = "".join(f"\n--- rank {r} ---\n{tracebacks[r]}" for r in sorted(tracebacks))
        raise MultiProcError(f"ranks {sorted(errors)} raised:{detail}", errors, tracebacks)
    return [values[r] for r in range(world_size)]


def _record(
    rank: int,
    kind: str,
    payload: bytes | None,
    text: str,
    values: dict[int, Any],
    errors: dict[int, BaseException | None],
    tracebacks: dict[int, str],
) -> None:
    if kind == _RESULT_OK:
        assert payload is not None
        values[rank] = pickle.loads(payload)
        return
    exc: BaseException | None = None
    if payload is not None:
        try:
            exc = pickle.loads(payload)
        except Exception:
            exc = None
    errors[rank] = exc
    tracebacks[rank] = text
