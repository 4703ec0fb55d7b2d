"""Small rendezvous primitives on a c10d ``Store``, bounded by a timeout.

Every blocking wait in :mod:`meshlayout.torch` goes through :func:`gather_arrivals`,
which costs O(1) store operations per participant on the success path and names
the ranks that never arrived on the failure path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from torch._C._distributed_c10d import Store

from ._errors import RankTimeoutError, format_ranks

__all__ = ["as_timedelta", "default_store", "gather_arrivals", "missing_ranks"]


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
        result = timeout
    else:
        result = timedelta(seconds=float(timeout))
    if result.total_seconds() <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return result


def default_store() -> Store:
    """The default process group's store (c10d's; no public accessor exists)."""
    # Private c10d accessor: torch 2.13 has no public way to reach the default store.
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


def missing_ranks(store: Store, prefix: str, members: Sequence[int]) -> list[int]:
    """Members whose arrival key under ``prefix`` is absent (O(len(members)); failure path)."""
    return [r for r in members if not store.check([f"{prefix}/arrived/{r}"])]


def gather_arrivals(
    store: Store,
    prefix: str,
    members: Sequence[int],
    me: int,
    timeout: timedelta,
    what: str,
) -> None:
    """Block until every rank of ``members`` has called this with the same ``prefix``.

    Each participant writes ``{prefix}/arrived/{me}``, increments a counter, and the
    last one to arrive publishes ``{prefix}/done``. On timeout raises
    :class:`RankTimeoutError` naming the members that never arrived.
    """
    store.set(f"{prefix}/arrived/{me}", "1")
    if store.add(f"{prefix}/count", 1) == len(members):
        store.set(f"{prefix}/done", "1")
    try:
        store.wait([f"{prefix}/done"], timeout)
    except Exception as exc:  # DistStoreError / RuntimeError on timeout
        missing = missing_ranks(store, prefix, members)
        if not missing:  # everybody arrived in the meantime: the wait raced the timeout
            if store.check([f"{prefix}/done"]):
                return
            raise
        raise RankTimeoutError(
            f"{what}: rank {me} waited {timeout.total_seconds():g}s; ranks "
            f"{format_ranks(missing)} of {format_ranks(members)} did not answer",
            missing=missing,
        ) from exc
