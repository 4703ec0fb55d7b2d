"""The process-group engine: one per-process cache of groups, created by members only.

Every ``ProcessGroup`` meshlayout uses comes from :func:`get_group`. A group is
identified by ``(ordered member ranks, backend, options)``:

* **Members only, one call per group.** Only the members call; a rank that needs
  ``k`` distinct groups makes exactly ``k`` creation calls, never O(world).
* **Deterministic names.** The c10d group name is a hash of the key, so members
  that hold different numbers of groups still agree on it. (torch 2.13's
  ``new_group(..., use_local_synchronization=True)`` hashes the ranks *together
  with* ``len(_world.pg_names)`` — the number of groups the caller already holds —
  so two members with different histories compute different names and hang in
  the rendezvous; torch 2.14 no longer does, but we support both. We therefore
  create through c10d's lower-level helper with our own name:
  :func:`meshlayout.torch._c10d.create_group`, where all torch internals live.)
* **Coordinate order.** The group rank of a member is its index in the ordered
  ranks we pass: torch's ``new_group`` sorts ranks by default, we never do, so
  ``pg.rank()``, ``dist.get_group_rank`` and ``get_process_group_ranks`` all agree
  with mesh coordinates, also for permuted rank maps.
* **World reuse, no size-1 communicators.** Ranks equal to ``range(world)`` with
  the default backend and no options return the default group; a one-member group
  is a local ``fake``-backend group (collectives on one rank are copies) — no
  communicator, no rendezvous. (On torch 2.10 to 2.12, whose fake backend does not
  copy for every collective, it is a real one-rank group:
  :func:`._c10d.one_member_backend`.)
* **Bounded.** Before creating, members meet through the default store with the
  group's timeout; absent members are named in a :class:`RankTimeoutError`.

>>> group_name((0, 2, 1), "gloo")  # doctest: +ELLIPSIS
'meshlayout_3_...'
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from . import _c10d
from ._errors import format_ranks
from ._store import as_timedelta, gather_arrivals

__all__ = [
    "GroupKey",
    "GroupStats",
    "clear_cache",
    "forget_destroyed",
    "get_group",
    "group_key",
    "group_name",
    "options_key",
    "stats",
]

GroupKey = tuple[tuple[int, ...], str, str]
"""(ordered member ranks, normalised backend, options key)."""

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass
class GroupStats:
    """Per-process counters (reset by :func:`clear_cache`).

    ``created``: communicators created (one rendezvous each); ``single``: local
    one-member groups; ``world``: requests served by the default group;
    ``hits``: requests served from the cache.
    """

    created: int = 0
    single: int = 0
    world: int = 0
    hits: int = 0
    created_keys: list[GroupKey] = field(default_factory=list)


class _Cache:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.world: dist.ProcessGroup | None = None  # the default group this cache belongs to
        self.groups: dict[GroupKey, dist.ProcessGroup] = {}
        self.generation: dict[GroupKey, int] = {}
        self.stats = GroupStats()


_CACHE = _Cache()


def options_key(options: Any) -> str:
    """A deterministic string identifying backend options (type + attribute values).

    >>> options_key(None)
    ''
    """
    if options is None:
        return ""
    parts = [f"{a}={_ADDRESS.sub('', v)}" for a, v in _c10d.options_fields(options)]
    return f"{type(options).__qualname__}({', '.join(parts)})"


def _normalise_backend(backend: str | None) -> str:
    if backend is None:
        return str(dist.get_backend())
    return str(dist.Backend(backend))


def group_key(ranks: Sequence[int], backend: str | None = None, options: Any = None) -> GroupKey:
    """The cache key of a group (needs an initialised default group when backend is None)."""
    return (tuple(int(r) for r in ranks), _normalise_backend(backend), options_key(options))


def group_name(ranks: Sequence[int], backend: str, opts: str = "", generation: int = 0) -> str:
    """The c10d name of a group: a pure function of (ordered ranks, backend, options).

    Identical on every member regardless of how many groups each already holds.
    """
    text = f"{backend}|{opts}|{','.join(str(int(r)) for r in ranks)}"
    digest = hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:20]
    suffix = f".{generation}" if generation else ""
    return f"meshlayout_{len(ranks)}_{digest}{suffix}"


def stats() -> GroupStats:
    """Counters of this process's group engine (see :class:`GroupStats`)."""
    return _CACHE.stats


def clear_cache() -> None:
    """Forget cached groups and reset counters (groups themselves stay alive in c10d)."""
    with _CACHE.lock:
        _CACHE.groups.clear()
        _CACHE.world = None
        _CACHE.stats = GroupStats()


def forget_destroyed() -> int:
    """Drop cached groups that c10d no longer knows (``destroy_process_group`` was called).

    A group only this cache still held is destroyed at once, its worker threads
    joined while the interpreter is whole (see :mod:`meshlayout.torch._exit`, which
    calls this at exit). Returns the number of groups forgotten. Counters are kept.
    """
    with _CACHE.lock:
        gone = [k for k, pg in _CACHE.groups.items() if not _c10d.is_registered(pg)]
        for key in gone:
            del _CACHE.groups[key]
        if _CACHE.world is not None and not _c10d.is_registered(_CACHE.world):
            _CACHE.world = None
        return len(gone)


def _default_group() -> dist.ProcessGroup:
    world = dist.group.WORLD if dist.is_initialized() else None
    if world is None:
        raise RuntimeError(
            "meshlayout.torch needs an initialised default process group: launch with "
            "torchrun (or call torch.distributed.init_process_group) first"
        )
    return world


def get_group(
    ranks: Sequence[int],
    *,
    backend: str | None = None,
    pg_options: Any = None,
    timeout: timedelta | float | None = None,
    group_desc: str | None = None,
) -> dist.ProcessGroup:
    """This rank's group over ``ranks`` (in that order), created at most once per process.

    Must be called by every member (and only members) of ``ranks``; blocks until
    all members have arrived, at most ``timeout`` (default: c10d's default timeout
    for the backend). ``backend`` defaults to the default group's.
    """
    world_pg = _default_group()
    me = dist.get_rank()
    world = dist.get_world_size()
    key = group_key(ranks, backend, pg_options)
    members = key[0]
    if len(set(members)) != len(members):
        raise ValueError(f"group ranks must be distinct, got {format_ranks(members)}")
    bad = [r for r in members if not 0 <= r < world]
    if bad:
        raise ValueError(f"ranks {format_ranks(bad)} are outside the world [0, {world})")
    if me not in members:
        raise ValueError(
            f"rank {me} is not a member of the group {format_ranks(members)}: groups are "
            "created by their members only"
        )
    with _CACHE.lock:
        if _CACHE.world is not world_pg:  # a new default group: start afresh
            _CACHE.groups.clear()
            _CACHE.generation.clear()
            _CACHE.world = world_pg
        cached = _CACHE.groups.get(key)
        if cached is not None and _c10d.is_registered(cached):
            _CACHE.stats.hits += 1
            return cached
        if (
            members == tuple(range(world))
            and key[1] == _normalise_backend(None)
            and pg_options is None
        ):
            _CACHE.stats.world += 1
            _CACHE.groups[key] = world_pg
            return world_pg

        gen = _CACHE.generation.get(key, -1) + 1
        name = group_name(members, key[1], key[2], gen)
        td = as_timedelta(timeout, _c10d.default_timeout(key[1]))
        desc = group_desc or f"meshlayout_{len(members)}"
        if len(members) == 1:
            single = _c10d.one_member_backend(key[1])
            options = pg_options if single == key[1] else None
            pg = _c10d.create_group(members, single, options, td, name, desc)
            _CACHE.stats.single += 1
        else:
            if key[1] != _c10d.FAKE_BACKEND:  # a fake world has no peers to wait for
                gather_arrivals(
                    _c10d.default_store(),
                    f"meshlayout/group/{name}",
                    members,
                    me,
                    td,
                    f"creating process group {format_ranks(members)} ({key[1]})",
                )
            pg = _c10d.create_group(members, key[1], pg_options, td, name, desc)
            _CACHE.stats.created += 1
            _CACHE.stats.created_keys.append(key)
        _CACHE.generation[key] = gen
        _CACHE.groups[key] = pg
        return pg
