"""A clean interpreter exit after gloo collectives: no ``SIGABRT`` at the end of a job.

**The abort.** A gloo process group runs each collective on one of its worker
threads (``pt_gloo_runloop``). The thread marks the operation's future complete —
waking the caller — and only then drops its own reference to the operation and to
the tensors it holds. If the caller has meanwhile dropped the last Python reference
to such a tensor (a temporary, or a local of a function that returned), torch keeps
the tensor's Python object alive on behalf of the C++ tensor (PyObject
preservation), so the worker's drop must take the GIL to release it. On a loaded
machine the worker can stay preempted between those two steps for longer than the
rest of the program takes to run: the main thread finishes, ``destroy_process_group()``
returns (it does not stop gloo's threads) and the interpreter starts to finalize.
A thread that asks for the GIL during finalization is ended with ``pthread_exit``,
whose forced unwinding through the worker's ``noexcept`` frames calls
``std::terminate``: ``terminate called without an active exception``, SIGABRT, and
torchrun reports a failed worker after every check passed. Any gloo collective on a
Python tensor can leave this behind, torch's own included; meshlayout's jobs
make more of them (group checks, transfers, verification) and keep their groups
cached, so they showed it more often (issue 24: about 1 run in 7 under load).

**The fix.** :func:`drain_at_exit`, registered with :mod:`atexit` when
:mod:`meshlayout.torch` is imported, runs while the interpreter is still whole:

1. it forgets the cached groups that c10d no longer knows (``destroy_process_group``
   was called), so a group only meshlayout still held is destroyed now, joining its
   worker threads while they can still take the GIL;
2. it waits, with the GIL released, until every gloo worker thread of the process is
   parked: asleep, and not woken between samples (Linux ``/proc/self/task``; a
   worker blocked on the GIL wakes as soon as the GIL is free, so it never looks
   parked). Bounded by :data:`DRAIN_SECONDS`; typically a few milliseconds. torch
   names the workers ``pt_gloo_runloop`` from 2.11; on 2.10 they are unnamed, so
   there the drain does step 1 only.

A user's script needs nothing: no ``os._exit``, no cache clearing. ``benchmarks/
soak_exit.py`` counts the aborts of a short job run many times (docs/runtime.md).

>>> drain_at_exit(timeout=0.5) >= 0   # no gloo threads here: returns at once
True
"""

from __future__ import annotations

import atexit
import os
import time

__all__ = ["DRAIN_SECONDS", "drain_at_exit", "gloo_worker_states"]

DRAIN_SECONDS = 5.0
"""The longest :func:`drain_at_exit` waits for gloo's workers at interpreter exit."""

_WORKER_NAME = "pt_gloo_runloop"  # gloo's worker threads (ProcessGroupGloo::runLoop)
_TASKS = "/proc/self/task"


def gloo_worker_states() -> dict[int, tuple[str, int]] | None:
    """Per gloo worker thread of this process: (scheduler state, context switches).

    ``None`` where ``/proc/self/task`` does not exist (not Linux).
    """
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    states: dict[int, tuple[str, int]] = {}
    for tid in tids:
        try:
            with open(f"{_TASKS}/{tid}/comm") as fh:
                if fh.read().strip() != _WORKER_NAME:
                    continue
            with open(f"{_TASKS}/{tid}/stat") as fh:
                stat = fh.read()
            with open(f"{_TASKS}/{tid}/status") as fh:
                status = fh.read()
        except OSError:  # the thread ended meanwhile
            continue
        state = stat[stat.rindex(")") + 2]  # the field after "(comm)"
        switches = sum(
            int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
        )
        states[int(tid)] = (state, switches)
    return states


def _parked(before: dict[int, tuple[str, int]], after: dict[int, tuple[str, int]]) -> bool:
    """Every worker asleep in both samples and not woken in between."""
    return all(
        state == "S" and after.get(tid) == (state, switches)
        for tid, (state, switches) in before.items()
    )


def drain_at_exit(timeout: float = DRAIN_SECONDS, interval: float = 0.002) -> float:
    """Let every gloo worker finish what it holds; returns the seconds waited.

    Forgets meshlayout's cached groups that c10d has destroyed, then samples the
    workers every ``interval`` seconds (sleeping, so the GIL is free) until two
    consecutive samples show all of them parked, or ``timeout`` passes.
    """
    start = time.monotonic()
    _forget_destroyed_groups()
    before = gloo_worker_states()
    if not before:
        return time.monotonic() - start
    deadline = start + timeout
    while time.monotonic() < deadline:
        time.sleep(interval)
        after = gloo_worker_states() or {}
        if _parked(before, after) and set(after) <= set(before):
            break
        before = after
    return time.monotonic() - start


def _forget_destroyed_groups() -> None:
    from ._groups import forget_destroyed

    forget_destroyed()


atexit.register(drain_at_exit)
