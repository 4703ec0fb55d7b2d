"""A process group of its own between separately launched worlds (docs/transfer.md, "Two worlds").

An RL trainer runs under torchrun (its own default process group); vLLM's workers
have theirs (their TP world). Weights cross between them through a third group that
spans both: :func:`sync_group` makes it over its **own** ``TCPStore`` (rank 0 of the
sync group hosts it at ``master_address:master_port``), with ranks and a world size
of its own, independent of any default group, which a process may have or not.
c10d's world never learns about it, so ``torch.distributed``'s functions refuse it;
meshlayout uses the group object's own methods (with per-operation timeouts, see
:mod:`meshlayout.torch._c10d`) and the group's store for every rendezvous, timeout and error report.

Start-up is bounded by ``timeout`` and checked: a rank claimed by two processes, or
members that disagree on the world size or backend, raise ``ValueError`` naming the
fields; members that never arrive are named in a
:class:`~meshlayout.torch.RankTimeoutError`.

DTensors keep the ranks of their own default group; :meth:`SyncGroup.rank_map`
translates those to sync-group ranks (each member posts its default-group identity
once; read lazily, only by processes that pass DTensors).

>>> from meshlayout.torch import SyncGroup, sync_group
>>> sync_group("127.0.0.1", 29500, rank=2, world_size=2)
Traceback (most recent call last):
  ...
ValueError: sync_group: rank must be in [0, 2), got 2
"""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import _c10d
from .._errors import RankTimeoutError, format_ranks
from .._store import as_timedelta, gather_arrivals

__all__ = ["SyncGroup", "open_store", "sync_group"]

_BACKENDS = ("gloo", "nccl")
_PREFIX = "meshlayout/sync"


class SyncGroup:
    """A process group over its own store, spanning separately launched worlds.

    Made by :func:`sync_group`; pass it as ``group=`` to
    :class:`~meshlayout.torch.WeightTransfer`. Attributes: ``rank``, ``world_size``,
    ``backend``, ``timeout`` (the default bound of every wait on it), ``store`` (its
    own ``TCPStore``), ``pg`` (the ``ProcessGroup``; use its own methods), ``device``
    (where its collectives' buffers live).
    """

    def __init__(
        self,
        store: _c10d.Store,
        pg: dist.ProcessGroup,
        rank: int,
        world_size: int,
        backend: str,
        timeout: timedelta,
        name: str,
    ) -> None:
        self.store = store
        self.pg = pg
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.timeout = timeout
        self.name = name
        self._counts: dict[str, int] = {}
        self._rank_map: dict[int, int] | None = None

    def __repr__(self) -> str:
        return (
            f"SyncGroup(rank={self.rank}, world_size={self.world_size}, "
            f"backend={self.backend!r}, timeout={self.timeout.total_seconds():g}s)"
        )

    @property
    def device(self) -> torch.device:
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def next_key(self, kind: str) -> str:
        """A store prefix for the next ``kind`` operation of this process on this group
        (members run them in the same order, as collectives, so they agree)."""
        n = self._counts.get(kind, 0)
        self._counts[kind] = n + 1
        return f"{_PREFIX}/{kind}/{n}"

    def rank_map(self) -> dict[int, int]:
        """This process's default-group rank -> sync rank, for every member of its default
        group that joined (``{}`` without a default group). One store read, then cached."""
        if self._rank_map is None:
            posts = self.store.multi_get([f"{_PREFIX}/world/{r}" for r in range(self.world_size)])
            mine = posts[self.rank].decode().split()
            found: dict[int, int] = {}
            if mine:
                for sync_rank, raw in enumerate(posts):
                    fields = raw.decode().split()
                    if fields and fields[0] == mine[0]:
                        found[int(fields[1])] = sync_rank
            self._rank_map = found
        return self._rank_map

    def destroy(self) -> None:
        """Shut the group's communicator down (the store closes with the object)."""
        try:
            self.pg.shutdown()
        except Exception:  # already shut down, or a backend without shutdown
            pass


def _check_int(what: str, value: object, low: int, high: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"sync_group: {what} must be an int, got {value!r}")
    if value < low or (high is not None and value >= high):
        bound = f"[{low}, {high})" if high is not None else f">= {low}"
        raise ValueError(f"sync_group: {what} must be in {bound}, got {value}")
    return value


def sync_group(
    master_address: str,
    master_port: int,
    rank: int,
    world_size: int,
    *,
    backend: str = "gloo",
    timeout: timedelta | float | None = None,
    store: _c10d.Store | None = None,
) -> SyncGroup:
    """Join (rank 0: create) the sync group at ``master_address:master_port``.

    Every member calls it with the same ``world_size`` and ``backend`` and its own
    ``rank`` in ``[0, world_size)``; rank 0 hosts the store. Blocks until every member
    has arrived, at most ``timeout`` (seconds or ``timedelta``; default c10d's for
    the backend), which also bounds every later wait and collective on the group.
    ``store``: a store every member already reaches (e.g. one a rendezvous used to
    learn ``world_size``) to use instead of opening one at the address (which then
    only names it in messages).
    """
    if not isinstance(master_address, str) or not master_address:
        raise TypeError(f"sync_group: master_address must be a host name, got {master_address!r}")
    _check_int("master_port", master_port, 1, 65536)
    world_size = _check_int("world_size", world_size, 1)
    rank = _check_int("rank", rank, 0, world_size)
    if backend not in _BACKENDS:
        raise ValueError(f"sync_group: backend must be one of {_BACKENDS}, got {backend!r}")
    td = as_timedelta(timeout, _c10d.default_timeout(backend))
    where = f"{master_address}:{master_port}"
    if store is None:
        store = open_store(master_address, master_port, rank == 0, td)
    token = uuid.uuid4().hex
    claimed = store.compare_set(f"{_PREFIX}/claim/{rank}", "", token).decode()
    if claimed != token:
        raise ValueError(
            f"sync_group: rank {rank} of the group at {where} is already taken by another "
            "process; every member needs its own rank in [0, world_size)"
        )
    params = json.dumps({"world_size": world_size, "backend": backend})
    if rank == 0:
        store.set(f"{_PREFIX}/params", params)
    else:
        _compare_params(store, rank, params, where, td)
    store.set(f"{_PREFIX}/world/{rank}", _world_identity())
    gather_arrivals(store, f"{_PREFIX}/join", range(world_size), rank, td, f"sync_group at {where}")
    name = f"meshlayout_sync_{world_size}_{master_port}"
    pg = _c10d.stateless_group(store, rank, world_size, backend, td, name)
    return SyncGroup(store, pg, rank, world_size, backend, td, name)


def open_store(address: str, port: int, host: bool, timeout: timedelta) -> _c10d.Store:
    """The ``TCPStore`` at ``address:port``: hosted here when ``host``, else joined
    (retrying until ``timeout``); errors name the address."""
    where = f"{address}:{port}"
    try:
        store: _c10d.Store = _c10d.TCPStore(
            address, port, is_master=host, timeout=timeout, wait_for_workers=False
        )
    except Exception as exc:
        if host:
            raise OSError(f"sync_group: cannot host the store at {where}: {exc}") from exc
        raise RankTimeoutError(
            f"sync_group: found no store at {where} within {timeout.total_seconds():g}s "
            f"(rank 0 hosts it): {exc}",
            missing=[0],
        ) from exc
    return store


def _compare_params(store: _c10d.Store, rank: int, mine: str, where: str, td: timedelta) -> None:
    key = f"{_PREFIX}/params"
    try:
        store.wait([key], td)
    except Exception as exc:
        raise RankTimeoutError(
            f"sync_group: rank {rank} waited {td.total_seconds():g}s at {where}; rank 0 never "
            "arrived",
            missing=[0],
        ) from exc
    theirs = json.loads(store.get(key).decode())
    ours = json.loads(mine)
    differ = sorted(k for k in ours if ours[k] != theirs.get(k))
    if differ:
        raise ValueError(
            f"sync_group at {where}: rank {rank} disagrees with rank 0 on {differ}: "
            + ", ".join(f"{k} {ours[k]!r} here, {theirs.get(k)!r} on rank 0" for k in differ)
        )


def _world_identity() -> str:
    """``"<token> <default rank>"``: the token is one per default group (agreed through
    its store), so members of one world recognise each other; ``""`` without one."""
    if not dist.is_initialized():
        return ""
    token = _c10d.default_store().compare_set("meshlayout/world_token", "", uuid.uuid4().hex)
    return f"{token.decode()} {dist.get_rank()}"


def check_members(group: SyncGroup, members: tuple[int, ...], what: str) -> None:
    """A transfer over ``group`` must involve every member (its collectives are the group's)."""
    absent = sorted(set(range(group.world_size)) - set(members))
    if absent:
        raise ValueError(
            f"{what}: the sync group has {group.world_size} members, but ranks "
            f"{format_ranks(absent)} are on neither side; every member takes part"
        )
