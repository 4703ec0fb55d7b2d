"""Packing a model's boxes into rounds of bounded bytes (the rounds of :func:`transfer_plan`).

A round is what one collective moves: each rank sends at most ``bucket_bytes`` and
receives at most ``bucket_bytes`` in it. :func:`pack_rounds` places every box
first-fit per (sender, receiver) pair into the earliest round with room on both
sides, cutting boxes into :func:`slabs` (each still a box) to fill the room;
:func:`layout_rounds` then gives every piece its byte offset in the sender's and the
receiver's buffer of its round. Columnar rows (numpy arrays), no torch.

>>> slabs(((0, 4), (0, 3)), 2, 12)  # 2-byte items, 12 bytes: two rows of 3 per slab
[((0, 2), (0, 3)), ((2, 4), (0, 3))]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._boxes import Box
from ._reshard import max_per_rank

__all__ = ["layout_rounds", "pack_rounds", "slabs"]

_I64 = np.int64


def slabs(box: Box, itemsize: int, max_bytes: int) -> list[Box]:
    """``box`` cut into boxes of at most ``max_bytes`` each, in row-major order.

    Cuts along the outermost dim of extent > 1 (slabs of whole inner rows); when one
    index of that dim is larger than ``max_bytes``, each index becomes its own box
    and is cut along the next dim. ValueError if one element is larger than
    ``max_bytes``.

    >>> slabs(((0, 5), (0, 4)), 1, 8)
    [((0, 2), (0, 4)), ((2, 4), (0, 4)), ((4, 5), (0, 4))]
    >>> slabs(((0, 2), (0, 4)), 1, 3)
    [((0, 1), (0, 3)), ((0, 1), (3, 4)), ((1, 2), (0, 3)), ((1, 2), (3, 4))]
    """
    if itemsize > max_bytes:
        raise ValueError(f"one element ({itemsize} bytes) is larger than max_bytes={max_bytes}")
    out: list[Box] = []
    stack = [box]
    while stack:
        b = stack.pop()
        n = math.prod(hi - lo for lo, hi in b) * itemsize
        if n <= max_bytes:
            out.append(b)
            continue
        k, inner = _cut_dim(b, itemsize)
        lo, hi = b[k]
        if inner > max_bytes:
            parts = [(i, i + 1) for i in range(lo, hi)]
        else:
            step = max_bytes // inner
            parts = [(i, min(i + step, hi)) for i in range(lo, hi, step)]
        stack.extend((*b[:k], p, *b[k + 1 :]) for p in reversed(parts))
    return out


def _cut_dim(box: Box, itemsize: int) -> tuple[int, int]:
    """(outermost dim of extent > 1, bytes of one index along it)."""
    k = next((d for d, (lo, hi) in enumerate(box) if hi - lo > 1), len(box) - 1)
    inner = itemsize * math.prod(hi - lo for lo, hi in box[k + 1 :])
    return k, inner


def pack_rounds(rows: dict[str, Any], isz_of: Any, bucket: int) -> dict[str, Any]:
    """Assign every row a round (first fit, cutting slabs); returns the new rows.

    Rows are taken per (sender, receiver) pair, in plan order; whole rows that fit in
    the current round's room are placed in one numpy step, a row that does not is
    cut (:func:`_place_box`) to fill the room and continue in later rounds. Python
    work: O(pairs + cut rows + rounds), not O(rows).
    """
    n = len(rows["tid"])
    rows["round"] = np.zeros(n, dtype=_I64)
    if not n:
        return rows
    send_tot = max_per_rank(rows["src"], rows["nbytes"])[0]
    recv_tot = max_per_rank(rows["dst"], rows["nbytes"])[0]
    if max(send_tot, recv_tot) <= bucket:  # one round holds everything: no cut
        return rows
    src, dst, nbytes = rows["src"], rows["dst"], rows["nbytes"]
    order = np.lexsort((np.arange(n), dst, src))
    new_pair = np.ones(n, dtype=bool)
    new_pair[1:] = (src[order][1:] != src[order][:-1]) | (dst[order][1:] != dst[order][:-1])
    firsts = [*np.flatnonzero(new_pair).tolist(), n]
    csum = np.concatenate([[0], np.cumsum(nbytes[order])])  # bytes before sorted row i
    rnd = rows["round"]
    cut = np.zeros(n, dtype=bool)
    used: dict[tuple[str, int], list[int]] = {}
    pieces: list[tuple[int, int, int, int, Box]] = []
    starts, stops, ndims, tids = rows["start"], rows["stop"], rows["ndim"], rows["tid"]
    for g in range(len(firsts) - 1):
        lo_row, hi_row = firsts[g], firsts[g + 1]
        first = int(order[lo_row])
        s, d = int(src[first]), int(dst[first])
        su = used.setdefault(("s", s), [])
        ru = used.setdefault(("r", d), [])
        r = 0
        pos = lo_row
        while pos < hi_row:
            room = bucket - max(su[r] if r < len(su) else 0, ru[r] if r < len(ru) else 0)
            # whole rows pos..j-1 fit in the room
            j = int(np.searchsorted(csum, csum[pos] + room, "right")) - 1
            j = min(max(j, pos), hi_row)
            if j > pos:
                rnd[order[pos:j]] = r
                _add(su, r, int(csum[j] - csum[pos]))
                _add(ru, r, int(csum[j] - csum[pos]))
                pos = j
                continue
            # row pos does not fit whole: cut it to fill this round and the next ones
            i = int(order[pos])
            t = int(tids[i])
            nd = int(ndims[i])
            box = tuple(zip(starts[i, :nd].tolist(), stops[i, :nd].tolist()))
            r = _place_box(
                box,
                int(isz_of[t]),
                bucket,
                su,
                ru,
                r,
                lambda rr, b, i=i, t=t: pieces.append((i, t, rr, 0, b)),
            )
            cut[i] = True
            pos += 1
    keep = ~cut
    m = len(pieces)
    maxnd = starts.shape[1]
    start = np.zeros((m, maxnd), dtype=_I64)
    stop = np.ones((m, maxnd), dtype=_I64)
    pndim = np.zeros(m, dtype=_I64)
    for k, (_, _, _, _, b) in enumerate(pieces):
        pndim[k] = len(b)
        start[k, : len(b)] = [a for a, _ in b]
        stop[k, : len(b)] = [z for _, z in b]
    src_row = np.array([p[0] for p in pieces], dtype=_I64)
    tid = np.concatenate([tids[keep], tids[src_row]])
    start_all = np.concatenate([starts[keep], start])
    stop_all = np.concatenate([stops[keep], stop])
    return {
        "tid": tid,
        "src": np.concatenate([src[keep], src[src_row]]),
        "dst": np.concatenate([dst[keep], dst[src_row]]),
        "round": np.concatenate([rnd[keep], np.array([p[2] for p in pieces], dtype=_I64)]),
        "nbytes": np.prod(stop_all - start_all, axis=1) * isz_of[tid],
        "ndim": np.concatenate([ndims[keep], pndim]),
        "start": start_all,
        "stop": stop_all,
    }


def _add(used: list[int], r: int, n: int) -> None:
    while len(used) <= r:
        used.append(0)
    used[r] += n


def _place_box(
    box: Box,
    isz: int,
    bucket: int,
    su: list[int],
    ru: list[int],
    r: int,
    emit: Any,
) -> int:
    """Place ``box`` from round ``r`` on, cutting slabs that fill each round's room.

    ``su`` / ``ru``: bytes the sender / receiver already move per round. Each part is
    a box: a prefix along the outermost dim of extent > 1, or, when one index along
    it does not fit the room, that index alone cut along the next dim. Returns the
    round of the last part.
    """
    stack: list[Box] = [box]
    while stack:
        b = stack.pop()
        nbytes = math.prod(hi - lo for lo, hi in b) * isz
        k, inner = _cut_dim(b, isz) if b else (0, isz)
        while True:  # the first round where both sides have room for one element
            room = bucket - max(su[r] if r < len(su) else 0, ru[r] if r < len(ru) else 0)
            if room >= isz:
                break
            r += 1
        take = b
        if nbytes > room:
            lo, hi = b[k]
            if inner > room:  # one index along k does not fit: it alone, cut deeper
                stack.append((*b[:k], (lo + 1, hi), *b[k + 1 :]))
                stack.append((*b[:k], (lo, lo + 1), *b[k + 1 :]))
                continue
            cut = lo + room // inner
            take = (*b[:k], (lo, cut), *b[k + 1 :])
            stack.append((*b[:k], (cut, hi), *b[k + 1 :]))
            nbytes = (cut - lo) * inner
        _add(su, r, nbytes)
        _add(ru, r, nbytes)
        emit(r, take)
    return r


def layout_rounds(rows: dict[str, Any], isz_of: Any) -> tuple[dict[str, Any], tuple[int, ...]]:
    """Sort rows into buffer order and compute byte offsets; the round boundaries."""
    n = len(rows["tid"])
    seq = np.arange(n, dtype=_I64)
    isz = isz_of[rows["tid"]] if n else np.zeros(0, dtype=_I64)
    order = np.lexsort((seq, -isz, rows["dst"], rows["src"], rows["round"]))
    cols = {k: rows[k][order] for k in ("tid", "src", "dst", "round", "nbytes", "ndim")}
    cols["start"] = rows["start"][order]
    cols["stop"] = rows["stop"][order]
    cols["send_off"] = _offsets(cols["round"], cols["src"], cols["nbytes"])
    recv_order = np.lexsort((np.arange(n), cols["src"], cols["dst"], cols["round"]))
    off = np.empty(n, dtype=_I64)
    off[recv_order] = _offsets(
        cols["round"][recv_order], cols["dst"][recv_order], cols["nbytes"][recv_order]
    )
    cols["recv_off"] = off
    nrounds = int(cols["round"].max()) + 1 if n else 0
    bounds = np.searchsorted(cols["round"], np.arange(nrounds + 1))
    return cols, tuple(int(b) for b in bounds)


def _offsets(rnd: Any, rank: Any, nbytes: Any) -> Any:
    """Exclusive running sum of ``nbytes`` within each (round, rank) group of sorted rows."""
    n = len(rnd)
    if not n:
        return np.zeros(0, dtype=_I64)
    csum = np.cumsum(nbytes) - nbytes
    new = np.ones(n, dtype=bool)
    new[1:] = (rnd[1:] != rnd[:-1]) | (rank[1:] != rank[:-1])
    first = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    return csum - csum[first]
