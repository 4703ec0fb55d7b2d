"""Small rendezvous primitives on a c10d ``Store``, bounded by a timeout.

Every blocking wait of :mod:`meshlayout.torch` that is not a collective goes through
:func:`wait_for_members`: O(1) store operations per participant on the success path,
the list of members that never arrived on the failure path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from ._c10d import Store, default_store
from ._errors import RankTimeoutError, format_ranks

__all__ = ["as_timedelta", "default_store", "gather_arrivals", "missing_ranks", "wait_for_members"]

_MAX_SECONDS = 1e9  # ~31 years: beyond it c10d's millisecond timeouts overflow


def as_timedelta(timeout: timedelta | float | None, default: timedelta) -> timedelta:
    """Normalise a timeout given as seconds or ``timedelta`` (``None`` -> ``default``).

    >>> as_timedelta(2.5, timedelta(seconds=1))
    datetime.timedelta(seconds=2, microseconds=500000)
    >>> as_timedelta(None, timedelta(seconds=1))
    datetime.timedelta(seconds=1)
    """
    if timeout is None:
        return default
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(
            f"timeout must be seconds (a number) or a timedelta, got {timeout!r} "
            f"of type {type(timeout).__name__}"
        )
    if not 0 < seconds < _MAX_SECONDS:  # also rejects nan and inf
        raise ValueError(
            f"timeout must be a finite number of seconds in (0, {_MAX_SECONDS:g}), got {timeout!r}"
        )
    return timeout if isinstance(timeout, timedelta) else timedelta(seconds=seconds)


def missing_ranks(store: Store, prefix: str, members: Sequence[int]) -> list[int]:
    """Members whose arrival key under ``prefix`` is absent (O(len(members)); failure path)."""
    return [r for r in members if not store.check([f"{prefix}/arrived/{r}"])]


def wait_for_members(
    store: Store, prefix: str, members: Sequence[int], me: int, timeout: timedelta
) -> list[int]:
    """Arrive under ``prefix`` and wait, at most ``timeout``, for every other member.

    Each participant writes ``{prefix}/arrived/{me}`` and increments a counter; the
    last one to arrive publishes ``{prefix}/done``. Returns ``[]`` once everybody has
    arrived, else (after ``timeout``) the members that have not.
    """
    store.set(f"{prefix}/arrived/{me}", "1")
    if store.add(f"{prefix}/count", 1) == len(members):
        store.set(f"{prefix}/done", "1")
    try:
        store.wait([f"{prefix}/done"], timeout)
    except Exception:  # DistStoreError / RuntimeError on timeout
        missing = missing_ranks(store, prefix, members)
        if missing:
            return missing
        if not store.check([f"{prefix}/done"]):  # everybody arrived, yet no "done"
            raise
    return []


def gather_arrivals(
    store: Store,
    prefix: str,
    members: Sequence[int],
    me: int,
    timeout: timedelta,
    what: str,
) -> None:
    """Block until every rank of ``members`` has called this with the same ``prefix``.

    On timeout raises :class:`RankTimeoutError` naming the members that never arrived.
    """
    missing = wait_for_members(store, prefix, members, me, timeout)
    if missing:
        raise RankTimeoutError(
            f"{what}: rank {me} waited {timeout.total_seconds():g}s; ranks "
            f"{format_ranks(missing)} of {format_ranks(members)} did not answer",
            missing=missing,
        )
