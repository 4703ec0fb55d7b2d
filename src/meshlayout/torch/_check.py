"""Cross-rank consistency check of a fingerprint through the default store.

Every participant posts a fingerprint (a mapping field -> short string); if any
two differ, **every** participant raises :class:`MeshMismatchError` naming the
ranks and the differing fields; if some never post within the timeout, the
others raise :class:`RankTimeoutError` naming them. Nobody hangs in a collective.

Keys. Participants meet under ``meshlayout/check/<set>/<seq>`` where ``<set>``
digests the *set* of participating ranks and ``<seq>`` counts the checks this
process has already made over that set. Both are independent of the content
being checked, so ranks whose meshes differ (names, shape, order of the rank
map, backends) still meet on the same keys and can report the difference; the
per-set counter keeps repeated checks apart and stays equal across ranks that
run the same program. (Ranks that disagree on *which* ranks participate cannot
meet; they time out, and the error reports what each missing rank was last
checking, from ``meshlayout/check/last/<rank>``.)

Cost on the success path: O(1) store operations per rank.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from datetime import timedelta

import numpy as np
import torch.distributed as dist

from ..rank_map import RankMap
from ..sharding import MeshLike
from ._c10d import Store, default_store
from ._errors import MeshMismatchError, RankTimeoutError, format_ranks
from ._store import gather_arrivals

__all__ = [
    "check_consistent",
    "check_in_world",
    "check_over_rank_map",
    "rank_map_summary",
    "rank_set_digest",
]

_SEQ: dict[str, int] = {}


def rank_set_digest(ranks: Sequence[int] | np.ndarray) -> str:
    """Order-independent digest of a set of ranks.

    >>> rank_set_digest([2, 0, 1]) == rank_set_digest(range(3))
    True
    """
    if isinstance(ranks, range) and ranks.step > 0 and len(ranks) > 0:
        step = ranks.step if len(ranks) > 1 else 1
        text = f"range:{ranks.start}:{len(ranks)}:{step}"
        return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]
    arr = np.sort(np.asarray(ranks, dtype=np.int64).ravel())
    n = arr.size
    if n and (n == 1 or np.all(np.diff(arr) == arr[1] - arr[0])):
        step = int(arr[1] - arr[0]) if n > 1 else 1
        return rank_set_digest(range(int(arr[0]), int(arr[0]) + n * step, step))
    return hashlib.sha1(arr.tobytes(), usedforsecurity=False).hexdigest()[:16]


def rank_map_summary(rank_map: RankMap) -> str:
    """A short fingerprint of a rank map: its range, or head, size and digest.

    >>> rank_map_summary(RankMap(range(8)))
    'range(0, 8)'
    >>> rank_map_summary(RankMap([3, 1, 2, 0]))  # doctest: +ELLIPSIS
    '[3, 1, 2, 0] (n=4, sha1 ...)'
    """
    rng = rank_map.as_range()
    if rng is not None:
        return str(rng)
    arr = rank_map.to_numpy()
    digest = hashlib.sha1(np.ascontiguousarray(arr).tobytes(), usedforsecurity=False).hexdigest()
    head = ", ".join(str(int(v)) for v in arr[:8])
    more = ", ..." if arr.size > 8 else ""
    return f"[{head}{more}] (n={arr.size}, sha1 {digest[:12]})"


def _encode(fields: Mapping[str, str]) -> str:
    return json.dumps(dict(fields), sort_keys=True)


def check_consistent(
    fields: Mapping[str, str],
    members: Sequence[int],
    *,
    timeout: timedelta,
    what: str = "mesh check",
    set_digest: str | None = None,
) -> None:
    """Compare ``fields`` across ``members`` (global ranks, this rank among them).

    Raises :class:`MeshMismatchError` on every member if fingerprints differ and
    :class:`RankTimeoutError` naming the absent members after ``timeout``.
    """
    me = dist.get_rank()
    store = default_store()
    digest = set_digest or rank_set_digest(members)
    seq = _SEQ.get(digest, 0)
    _SEQ[digest] = seq + 1
    ns = f"meshlayout/check/{digest}/{seq}"
    mine = _encode(fields)
    store.set(f"{ns}/fp/{me}", mine)
    store.set(f"meshlayout/check/last/{me}", json.dumps({"key": ns, "fields": dict(fields)}))
    reference = store.compare_set(f"{ns}/ref", "", mine)
    if reference.decode() != mine:
        store.add(f"{ns}/bad", 1)
    try:
        gather_arrivals(store, ns, members, me, timeout, what)
    except RankTimeoutError as exc:
        raise RankTimeoutError(
            f"{exc}{_describe_missing(store, exc.missing, ns)}", missing=exc.missing
        ) from exc
    if store.add(f"{ns}/bad", 0) == 0:
        return
    # Failure path: read every fingerprint (O(members)) and explain the difference.
    values = store.multi_get([f"{ns}/fp/{r}" for r in members])
    by_fp: dict[str, list[int]] = {}
    for r, v in zip(members, values):
        by_fp.setdefault(v.decode(), []).append(int(r))
    raise _mismatch(what, by_fp, me)


def check_over_rank_map(
    fields: Mapping[str, str], rank_map: RankMap, *, timeout: timedelta, what: str
) -> None:
    """:func:`check_consistent` over every rank of ``rank_map`` (this rank must be one).

    The digest of the rank set is O(1) for a range (O(size) otherwise), so the
    success path stays O(1) store operations per rank at any scale.
    """
    rng = rank_map.as_range()
    digest = rank_set_digest(rng if rng is not None else rank_map.to_numpy())
    check_consistent(fields, rank_map, timeout=timeout, what=what, set_digest=digest)


def _mismatch(what: str, by_fp: dict[str, list[int]], me: int) -> MeshMismatchError:
    variants = sorted(by_fp.items(), key=lambda kv: (-len(kv[1]), kv[1][0]))
    decoded = [(json.loads(fp), ranks) for fp, ranks in variants]
    keys = sorted({k for d, _ in decoded for k in d})
    differing = [k for k in keys if len({d.get(k) for d, _ in decoded}) > 1]
    minority = sorted(r for _, ranks in variants[1:] for r in ranks)
    lines = [
        f"{what}: ranks disagree on {', '.join(differing)} "
        f"({len(variants)} variants; seen from rank {me}):"
    ]
    for d, ranks in decoded:
        shown = ", ".join(f"{k}={d.get(k)}" for k in differing)
        lines.append(f"  ranks {format_ranks(ranks)}: {shown}")
    return MeshMismatchError("\n".join(lines), ranks=minority, fields=differing)


def _describe_missing(store: Store, missing: Sequence[int], ns: str) -> str:
    notes = []
    for r in list(missing)[:8]:
        key = f"meshlayout/check/last/{r}"
        if not store.check([key]):
            notes.append(f"\n  rank {r}: has made no mesh check yet")
            continue
        last = json.loads(store.get(key).decode())
        if last.get("key") == ns:
            continue
        notes.append(f"\n  rank {r}: last checked a different rank set or sequence: {last}")
    return "".join(notes)


def _top_rank(ranks: RankMap | MeshLike) -> int | None:
    """The largest global rank of a rank map or a mesh (None when it has none)."""
    if isinstance(ranks, RankMap):
        rank_map = ranks
    else:
        found = getattr(ranks, "rank_map", None)
        if not isinstance(found, RankMap):  # another MeshLike: O(its ranks)
            every = np.asarray(ranks.submeshes())
            return int(every.max()) if every.size else None
        rank_map = found
    if len(rank_map) == 0:
        return None
    rng = rank_map.as_range()
    return max(rng[0], rng[-1]) if rng is not None else int(rank_map.to_numpy().max())


def check_in_world(
    ranks: RankMap | MeshLike, what: str, world: int | None = None, hint: str = ""
) -> None:
    """Fail at once, on every rank, if ``ranks`` (a rank map or a mesh) names a rank the
    job does not have.

    ``world``: the size of the process group the ranks live in (default: the default
    group's). Without this check the ranks that do exist would wait the whole timeout
    for the missing ones (c10d's default: 30 minutes on gloo) before naming them; each
    rank sees the same two numbers, so each raises the same ``ValueError`` without
    talking to the others. ``hint`` ends the message (what would be valid).

    >>> check_in_world(RankMap(range(8)), "a job of 8 ranks", world=4)
    Traceback (most recent call last):
    ...
    ValueError: a job of 8 ranks needs global ranks up to 7 (8 processes), but this job's process group has world size 4 (ranks 0..3)
    """
    if world is None:
        world = dist.get_world_size()
    top = _top_rank(ranks)
    if top is not None and top >= world:
        raise ValueError(
            f"{what} needs global ranks up to {top} ({top + 1} processes), but this job's "
            f"process group has world size {world} (ranks 0..{world - 1})"
            + (f"; {hint}" if hint else "")
        )
