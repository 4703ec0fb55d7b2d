"""Which ranks share a host: ``ranks_per_host`` or torchrun's environment, checked.

meshlayout's host model is the one torchrun launches: host ``k`` holds the
consecutive global ranks ``[k*n, (k+1)*n)``, ``n`` ranks per host (torchrun's
agent on each node starts ``LOCAL_WORLD_SIZE`` workers and numbers them
consecutively after the workers of the lower ``GROUP_RANK`` nodes).

:func:`hosts_from_environment` picks ``n``: the ``ranks_per_host`` given, else
torchrun's ``LOCAL_WORLD_SIZE`` (with its node, ``GROUP_RANK``), else None (not
launched by torchrun: hosts unknown). :func:`check_hosts` then checks the claim
against what every rank reports about its own node, through the default store:
every rank of a host must report the same node and neighbouring hosts different
ones. Two torchrun agents on one machine are two nodes (their ``GROUP_RANK``
differs), which is how the tests run "two hosts" on loopback.

>>> hosts = hosts_from_environment(None, {"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}, "box")
>>> hosts.ranks_per_host, hosts.source, hosts.node
(2, 'torchrun: LOCAL_WORLD_SIZE=2', 'GROUP_RANK=1 (host box)')
>>> hosts.host_of(5)
2
>>> hosts_from_environment(None, {}, "box") is None
True
"""

from __future__ import annotations

import socket
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import timedelta

import numpy as np
import torch.distributed as dist

from ..inttuple import check_int
from ..mesh import Mesh
from ..rank_map import RankMap
from ._c10d import default_store
from ._check import rank_set_digest
from ._errors import RankTimeoutError, format_ranks
from ._store import wait_for_members

__all__ = [
    "HostLayoutWarning",
    "Hosts",
    "check_hosts",
    "crossing_summary",
    "hosts_from_environment",
    "warn_if_crossing",
]

#: The views whose groups should stay inside one host: a warning names them otherwise.
IN_HOST_VIEWS = ("tp", "etp")

_SEQ: dict[str, int] = {}


class HostLayoutWarning(UserWarning):
    """The rank order puts a tensor-parallel group (``tp``, ``etp``) across hosts.

    Tensor parallelism exchanges activations inside every layer; across hosts it
    runs on the network instead of NVLink. Filter it with
    ``warnings.filterwarnings("ignore", category=HostLayoutWarning)`` when intended.
    """


@dataclass(frozen=True)
class Hosts:
    """``ranks_per_host`` consecutive ranks per host; where the number came from; our node.

    ``source`` says how it was found (``"ranks_per_host=8"`` or
    ``"torchrun: LOCAL_WORLD_SIZE=8"``); ``node`` is what this rank reports about
    its own host in :func:`check_hosts` (torchrun's ``GROUP_RANK`` and the host
    name, or the host name alone); ``checked`` is True once :func:`check_hosts`
    passed.
    """

    ranks_per_host: int
    source: str
    node: str
    checked: bool = False

    def host_of(self, rank: int) -> int:
        """The host index of a global rank: ``rank // ranks_per_host``."""
        return int(rank) // self.ranks_per_host

    def describe(self, world_size: int) -> str:
        """One line: how many hosts of how many ranks, from where, checked or not.

        >>> Hosts(2, "torchrun: LOCAL_WORLD_SIZE=2", "n", True).describe(4)
        'hosts: 2 x 2 ranks (torchrun: LOCAL_WORLD_SIZE=2); checked: every rank of a host reports the same node'
        """
        num = -(-world_size // self.ranks_per_host)
        checked = (
            "checked: every rank of a host reports the same node"
            if self.checked
            else "not checked (build(check=False))"
        )
        return f"hosts: {num} x {self.ranks_per_host} ranks ({self.source}); {checked}"


def _env_int(environ: Mapping[str, str], name: str) -> int:
    text = environ[name]
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < (1 if name == "LOCAL_WORLD_SIZE" else 0):
        raise ValueError(
            f"torchrun's environment variable {name}={text!r} is not a "
            f"{'positive' if name == 'LOCAL_WORLD_SIZE' else 'non-negative'} integer"
        )
    return value


def hosts_from_environment(
    ranks_per_host: int | None,
    environ: Mapping[str, str],
    hostname: str | None = None,
) -> Hosts | None:
    """The host layout: ``ranks_per_host`` if given, else torchrun's, else None.

    torchrun's is ``LOCAL_WORLD_SIZE`` ranks per host, this rank's node being its
    ``GROUP_RANK`` (both must be set). ``hostname`` defaults to this machine's.
    """
    host = socket.gethostname() if hostname is None else hostname
    torchrun = "LOCAL_WORLD_SIZE" in environ and "GROUP_RANK" in environ
    node = f"GROUP_RANK={_env_int(environ, 'GROUP_RANK')} (host {host})" if torchrun else host
    if ranks_per_host is not None:
        n = check_int(ranks_per_host, "ranks_per_host", minimum=1)
        return Hosts(n, f"ranks_per_host={n}", node)
    if not torchrun:
        return None
    n = _env_int(environ, "LOCAL_WORLD_SIZE")
    return Hosts(n, f"torchrun: LOCAL_WORLD_SIZE={n}", node)


def _host_neighbours(hosts: Hosts, me: int, members: RankMap) -> tuple[list[int], list[int]]:
    """(the members of my host, the nearest member of each neighbouring host)."""
    n = hosts.ranks_per_host
    first = hosts.host_of(me) * n
    rng = members.as_range()
    last = max(rng[0], rng[-1]) if rng is not None else int(members.to_numpy().max())
    same = [r for r in range(first, min(first + n, last + 1)) if r in members]
    around = [r for r in (first - 1, first + n) if 0 <= r <= last and r in members]
    return same, around


def check_hosts(hosts: Hosts, members: RankMap, *, timeout: timedelta, what: str) -> Hosts:
    """Check ``hosts`` against the node every rank of ``members`` reports; return it checked.

    Each rank posts its node, reads those of its own host (``ranks_per_host``
    keys) and of the nearest rank on each side of it, then all meet once: if any
    rank found a disagreement, **every** rank raises ``ValueError`` with the first
    disagreement found. Ranks that never post are named in a
    :class:`RankTimeoutError` after ``timeout``. O(``ranks_per_host``) store
    operations per rank.
    """
    me = dist.get_rank()
    store = default_store()
    rng = members.as_range()
    digest = rank_set_digest(rng if rng is not None else members.to_numpy())
    seq = _SEQ.get(digest, 0)
    _SEQ[digest] = seq + 1
    ns = f"meshlayout/hosts/{digest}/{seq}"
    store.set(f"{ns}/node/{me}", hosts.node)
    same, around = _host_neighbours(hosts, me, members)
    keys = [f"{ns}/node/{r}" for r in same + around]
    try:
        store.wait(keys, timeout)
    except Exception as exc:  # DistStoreError / RuntimeError on timeout
        absent = [r for r, k in zip(same + around, keys) if not store.check([k])]
        if not absent:
            raise
        raise RankTimeoutError(
            f"{what}: checking hosts, rank {me} waited {timeout.total_seconds():g}s for the "
            f"nodes of ranks {format_ranks(absent)}, which never reported ({exc})",
            missing=absent,
        ) from None
    nodes = dict(zip(same + around, (v.decode() for v in store.multi_get(keys))))
    problem = _disagreement(hosts, me, same, around, nodes)
    if problem:
        store.add(f"{ns}/bad", 1)
        store.compare_set(f"{ns}/problem", "", problem)
    late = wait_for_members(store, f"{ns}/checked", members, me, timeout)
    if late:  # name the ranks that never posted their node (the others wait for them)
        silent = [r for r in members if not store.check([f"{ns}/node/{r}"])]
        raise RankTimeoutError(
            f"{what}: checking hosts, rank {me} waited {timeout.total_seconds():g}s; ranks "
            f"{format_ranks(silent or late)} of {format_ranks(list(members))} "
            f"{'never reported their node' if silent else 'did not answer'}",
            missing=silent or late,
        )
    if store.add(f"{ns}/bad", 0):
        reported = store.get(f"{ns}/problem").decode()
        raise ValueError(f"{what}: {reported}")
    return replace(hosts, checked=True)


def _disagreement(
    hosts: Hosts, me: int, same: Sequence[int], around: Sequence[int], nodes: Mapping[int, str]
) -> str:
    n = hosts.ranks_per_host
    host = hosts.host_of(me)
    by_node: dict[str, list[int]] = {}
    for r in same:
        by_node.setdefault(nodes[r], []).append(r)
    if len(by_node) > 1:
        parts = "; ".join(f"ranks {format_ranks(rs)} on {node}" for node, rs in by_node.items())
        return (
            f"{hosts.source} puts ranks {format_ranks(same)} on host {host}, but they are on "
            f"{len(by_node)} different nodes: {parts}. Pass the real number of ranks per host "
            "(all hosts alike, ranks numbered host by host)"
        )
    for r in around:
        if nodes[r] == nodes[me]:
            return (
                f"{hosts.source} puts rank {me} on host {host} and rank {r} on host "
                f"{hosts.host_of(r)}, but both are on {nodes[me]}: a host has more than "
                f"{n} ranks. Pass the real number of ranks per host"
            )
    return ""


def crossing_summary(mesh: Mesh, ranks_per_host: int) -> tuple[int, int, int]:
    """(most hosts any group touches, groups touching more than one, number of groups).

    >>> crossing_summary(Mesh({"dp": 2, "tp": 2})["dp"], 2)
    (2, 2, 2)
    """
    spans = mesh.hosts_spanned(ranks_per_host)
    return int(spans.max()), int(np.count_nonzero(spans > 1)), int(spans.size)


def warn_if_crossing(meshes: Mapping[str, Mesh], hosts: Hosts, what: str) -> list[str]:
    """Warn (:class:`HostLayoutWarning`) for every view of ``meshes`` whose groups cross hosts.

    Returns the views warned about.
    """
    warned = []
    for name, mesh in meshes.items():
        most, crossing, total = crossing_summary(mesh, hosts.ranks_per_host)
        if most == 1:
            continue
        warned.append(name)
        table = mesh.group_table()
        row = int(np.argmax(mesh.hosts_spanned(hosts.ranks_per_host)))
        ranks = [int(r) for r in table[row]]
        touched = sorted({hosts.host_of(r) for r in ranks})
        warnings.warn(
            f"{what}: the rank order puts {name} across hosts ({hosts.ranks_per_host} ranks "
            f"per host, {hosts.source}): {crossing} of {total} {name} groups span up to "
            f"{most} hosts, e.g. {format_ranks(ranks)} on hosts {format_ranks(touched)}. "
            f"Tensor parallelism wants each group inside one host: keep {name} innermost in "
            f"the order (the default) and at most {hosts.ranks_per_host} ranks",
            HostLayoutWarning,
            stacklevel=3,
        )
    return warned
