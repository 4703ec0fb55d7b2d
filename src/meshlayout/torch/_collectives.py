"""Collectives bounded by a mesh's timeout that name the members who never arrived.

``torch.distributed`` collectives wait for the group's timeout, fixed when the group
was made (the default group's: ``init_process_group``'s, 30 min for gloo), and a
missing peer surfaces as a backend error naming nobody. meshlayout's tensor
operations (:func:`~meshlayout.torch.full_tensor`, ``distribute``, ``redistribute``)
run their collectives through this module instead:

* **Healthy path: nothing extra.** One collective whose own timeout is the mesh's
  (a per-operation option, see :mod:`._c10d`); no store operation.
* **Failure path only.** When the collective raises (e.g. it timed out because a
  member never called it), this rank records under
  ``meshlayout/op/<default group #>/<group name>/<n>`` that it reached the ``n``-th
  meshlayout collective on that group (on a sync group: under its own store), waits
  at most :func:`report_grace` for the other members that reached it too (they fail
  at about the same time), and raises
  :class:`RankTimeoutError` naming the members that never did. If every member
  reached it, the original error is re-raised.

So a rank that fails before a collective makes its peers fail after about the mesh's
timeout (at most ``timeout + report_grace(timeout)``), each naming it. Members must
run meshlayout's collectives on a group in the same order (as for any collective).
On NCCL the per-operation timeout goes to torch's watchdog instead (CUDA collectives
return before they complete), so this naming applies to CPU backends such as gloo.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from . import _c10d
from ._errors import RankTimeoutError, format_ranks
from ._store import wait_for_members

if TYPE_CHECKING:  # the module, not the package: its __init__ imports this one
    from .transfer._sync import SyncGroup

__all__ = [
    "Bounded",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "report_grace",
]


@dataclass(frozen=True)
class Bounded:
    """A group with its members (global ranks, in group-rank order) and a timeout.

    ``sync``: the :class:`~meshlayout.torch.SyncGroup` that ``group`` belongs to (then
    members are its ranks and failures are reported through its store), or None for
    a group of the default world.
    """

    group: dist.ProcessGroup
    members: tuple[int, ...]
    timeout: timedelta | None  # None: c10d's default for the group's backend
    what: str  # the caller, for messages: "full_tensor", ...
    sync: SyncGroup | None = None

    def limit(self) -> timedelta:
        """The timeout of one collective on this group."""
        if self.timeout is not None:
            return self.timeout
        if self.sync is not None:
            return self.sync.timeout
        return _c10d.default_timeout(str(dist.get_backend(self.group)))


def report_grace(timeout: timedelta) -> timedelta:
    """How long a failed rank waits for its peers to report: ``min(timeout,
    max(10 s, timeout / 10))``; peers that reached the collective fail within their
    own timeout of it, so they report within their arrival skew.

    >>> report_grace(timedelta(seconds=4)), report_grace(timedelta(minutes=30))
    (datetime.timedelta(seconds=4), datetime.timedelta(seconds=180))
    """
    return min(timeout, max(timedelta(seconds=10), timeout / 10))


class _Sequence:
    """Per process: how many meshlayout collectives ran on each group (by name)."""

    def __init__(self) -> None:
        self.world: object | None = None
        self.generation = 0
        self.counts: dict[str, int] = {}

    def next(self, group: dist.ProcessGroup) -> str:
        world = dist.group.WORLD
        if world is not self.world:  # a new default group (and store): start afresh
            self.world = world
            self.generation += 1
            self.counts.clear()
        name = group.group_name
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        return f"meshlayout/op/{self.generation}/{name}/{n}"


_SEQUENCE = _Sequence()


def _run(g: Bounded, op: str, call: Callable[[timedelta], None]) -> None:
    """Run ``call(timeout)``; on failure, name the members that never reached it."""
    key = _SEQUENCE.next(g.group) if g.sync is None else g.sync.next_key("op")
    timeout = g.limit()
    try:
        call(timeout)
    except Exception as exc:
        # The store is looked up only here: the healthy path never touches it.
        if g.sync is None:
            store, me = _c10d.default_store(), dist.get_rank()
        else:
            store, me = g.sync.store, g.sync.rank
        missing = wait_for_members(store, key, g.members, me, report_grace(timeout))
        if not missing:
            raise
        first_line = (str(exc).strip().splitlines() or [""])[0][:200]
        raise RankTimeoutError(
            f"{g.what}: {op} over ranks {format_ranks(g.members)} failed on rank {me} "
            f"(timeout {timeout.total_seconds():g}s): ranks {format_ranks(missing)} never "
            f"reached it ({type(exc).__name__}: {first_line})",
            missing=missing,
        ) from exc


def _real(tensor: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def all_gather(g: Bounded, recv: torch.Tensor, send: torch.Tensor) -> None:
    """``recv`` = every member's ``send`` (contiguous, same size) in member order."""
    if len(g.members) == 1:
        recv.copy_(send)
        return
    _run(g, "all_gather", lambda t: _c10d.all_gather_single(_real(recv), _real(send), g.group, t))


def all_reduce(g: Bounded, tensor: torch.Tensor, op: dist.ReduceOp.RedOpType) -> None:
    """Reduce ``tensor`` (contiguous) in place over the members."""
    if len(g.members) == 1:
        return
    if tensor.is_complex() and op != dist.ReduceOp.SUM:
        raise ValueError(f"{g.what}: {op} is not defined on complex tensors (only a sum is)")
    _run(g, "all_reduce", lambda t: _c10d.all_reduce(_real(tensor), op, g.group, t))


def broadcast(g: Bounded, tensor: torch.Tensor, root: int) -> None:
    """Copy member ``root``'s (an index into ``members``) ``tensor`` to every member."""
    if len(g.members) == 1:
        return
    _run(g, "broadcast", lambda t: _c10d.broadcast(_real(tensor), root, g.group, t))


def all_to_all(
    g: Bounded,
    recv: torch.Tensor,
    send: torch.Tensor,
    recv_sizes: Sequence[int],
    send_sizes: Sequence[int],
) -> None:
    """Send ``send_sizes[j]`` elements of ``send`` (1-D) to member ``j``; receive into ``recv``."""
    if len(g.members) == 1:
        recv.copy_(send)
        return
    _run(
        g,
        "all_to_all",
        lambda t: _c10d.all_to_all_single(
            _real(recv), _real(send), recv_sizes, send_sizes, g.group, t
        ),
    )
