"""Order-independent, position-aware tensor fingerprints at memory speed (``docs/transfer.md#verification``).

``WeightTransfer.run(verify=True)`` compares, per tensor, a fingerprint of the source
elements with one of the destination pieces. The fingerprint must be

* **order-independent**: a sum of per-element terms, so a tensor's boxes (pieces,
  slabs, replicas) can be hashed separately on any rank and added in any order;
* **position-aware**: the term of an element depends on its global index, so a
  permuted row, a wrong offset or a stale slab changes the sum;
* **exact**: integer arithmetic mod 2^64, identical bit for bit on every rank;
* **cheap**: one pass over the data that is no slower than copying it.

Definition. View the tensor (global shape ``shape``, element type ``dtype`` of ``s``
bytes) as a matrix: row ``r`` = the flat index over all dims but the last, and each
row as bytes (``s`` per element, row-major, little-endian). Cut each row into 8-byte
*limbs*: limb ``k`` holds the row's bytes ``8k .. 8k+7`` as an integer ``L[r, k]``
mod 2^64. Then

    F = sum over r, k of  L[r, k] * Wr[r] * Wc[k]   (mod 2^64)

with odd pseudo-random weights ``Wr[r] = mix(r, ROW_SALT)``, ``Wc[k] = mix(k, COL_SALT)``
(``mix``: the splitmix64 finaliser, then ``| 1``). A limb's value is the sum of its
bytes shifted into place, so ``F`` is a sum over elements of ``bits(e) << 8*(byte
offset of e in its limb)`` times the limb's weight: an element's term depends only
on its global index and its bits, and a box that starts or ends inside a limb
contributes its bytes with the other bytes zero; summing the boxes of any split of
the tensor gives ``F`` of the whole.

Computed per box as ``sum_r Wr[r] * (sum_k L[r, k] * Wc[k])``: the inner sums are
one ``torch.mv`` of the box's bytes viewed as int64 (no copy when the box is in the
wanted dtype, contiguous and 8-byte aligned: as fast as a copy, about 20 GB/s
here) with ``O(rows + limbs)`` weights; otherwise (a cast, a box that starts inside
a limb, strided rows) cache-sized blocks are first copied (and cast) into a
persistent 1 MiB scratch at their byte offset within the limbs.

What it catches. ``F`` is linear in the limbs with odd weights:

* a change confined to one limb (one wrong element of up to 8 bytes, a flipped bit)
  changes ``F`` by ``delta * w`` with ``0 < |delta| < 2^64`` and ``w`` odd: **always**
  detected;
* changes in several limbs (a swapped pair of values at limbs ``p``, ``q`` changes it
  by ``(L_p - L_q) * (w_q - w_p)``; a permuted row, a shifted slab, a stale slab)
  cancel only if ``sum delta_i * w_i = 0 mod 2^64``: for weights that behave like
  random odd numbers, with probability at most about ``2^-(63 - v)``, ``v`` the
  number of trailing zero bits of the deltas (``v`` is small for real weights:
  values differ in their low mantissa bits). The weak case is deltas in the top
  bits of a limb only, e.g. two values that differ only in their sign bit and sit at
  the top of their limbs, swapped: ``2^63 * (w_q - w_p) = 0`` as odd weights differ
  by an even number. Such corruptions go unnoticed. Widening 4-byte limbs to int64
  before the products (32 bits of headroom: that swap then cancels with probability
  about 2^-32) costs 3.7x a copy instead of 1x on the destination side
  (``benchmarks/bench_fingerprint.py``), so it is not done.

>>> import torch
>>> t = torch.arange(12, dtype=torch.float32).reshape(3, 4)
>>> whole = fingerprint(t, ((0, 3), (0, 4)), (3, 4), torch.float32)
>>> left = fingerprint(t[:, :1], ((0, 3), (0, 1)), (3, 4), torch.float32)
>>> right = fingerprint(t[:, 1:], ((0, 3), (1, 4)), (3, 4), torch.float32)
>>> (left + right) % 2**64 == whole
True
>>> swapped = t[[1, 0, 2]]
>>> fingerprint(swapped, ((0, 3), (0, 4)), (3, 4), torch.float32) == whole
False
"""

from __future__ import annotations

import math
from typing import Any

import torch

__all__ = ["Fingerprinter", "fingerprint", "mix"]

MASK64 = (1 << 64) - 1
ROW_SALT = 0x243F6A8885A308D3  # digits of pi: any fixed constants would do
COL_SALT = 0x13198A2E03707344
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's constants
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_SCRATCH_LIMBS = 1 << 17  # 1 MiB of int64: a block stays in the L2 cache
_CACHE_MAX = 1 << 16  # weight vectors longer than this are recomputed, not cached


def _i64(value: int) -> int:
    """``value`` mod 2^64 as a signed 64-bit int (torch's int64 wraps the same way)."""
    value &= MASK64
    return value - (1 << 64) if value >> 63 else value


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def mix(index: torch.Tensor, salt: int) -> torch.Tensor:
    """Odd pseudo-random int64 weights of ``index`` (int64): splitmix64's finaliser of
    ``index * GAMMA + salt``, lowest bit set. Wraps mod 2^64 like C's uint64_t.

    >>> mix(torch.tensor([0, 1]), 0).tolist()
    [1, -2152535657050944081]
    """
    x = index * _i64(_GAMMA) + _i64(salt)
    x = (x ^ _shr(x, 30)) * _i64(_M1)
    x = (x ^ _shr(x, 27)) * _i64(_M2)
    return (x ^ _shr(x, 31)) | 1


class Fingerprinter:
    """Computes :func:`fingerprint` of boxes, reusing a scratch block and cached weights.

    One per executor: repeated verification allocates no large buffers (the scratch
    is ``_SCRATCH_LIMBS`` int64, allocated on first use).
    """

    def __init__(self, scratch_limbs: int = _SCRATCH_LIMBS) -> None:
        if scratch_limbs < 2:
            raise ValueError(f"scratch_limbs must be >= 2, got {scratch_limbs}")
        self.scratch_limbs = scratch_limbs
        self._scratch: torch.Tensor | None = None
        self._weights: dict[tuple[Any, ...], torch.Tensor] = {}

    def box(
        self,
        region: torch.Tensor,
        box: tuple[tuple[int, int], ...],
        shape: tuple[int, ...],
        dtype: torch.dtype,
    ) -> int:
        """Fingerprint (in ``[0, 2^64)``) of ``region``, the elements of the global
        ``box`` of a tensor of ``shape``, as ``dtype`` (cast like ``copy_`` when the
        region has another dtype)."""
        if tuple(region.shape) != tuple(b - a for a, b in box) or len(box) != len(shape):
            raise ValueError(
                f"region of shape {tuple(region.shape)} does not match box {box} of a "
                f"tensor of shape {shape}"
            )
        if region.numel() == 0:
            return 0
        if not shape:  # 0-d: one element in row 0
            region, box, shape = region.reshape(1), ((0, 1),), (1,)
        if len(shape) == 1:
            region, box, shape = region.unsqueeze(0), ((0, 1), *box), (1, *shape)
        return self._rows(region, box, shape, dtype, 0) & MASK64

    def _rows(
        self,
        region: torch.Tensor,
        box: tuple[tuple[int, int], ...],
        shape: tuple[int, ...],
        dtype: torch.dtype,
        row0: int,
    ) -> int:
        """``region`` (2-D or more) is the global ``box``; its global flat rows are
        offset by ``row0`` (when an outer dim was peeled off)."""
        if len(shape) > 2:
            flat = _flat_rows(region)
            if flat is None:
                a0, _ = box[0]
                inner = math.prod(shape[1:-1])
                return sum(
                    self._rows(region[i], box[1:], shape[1:], dtype, row0 + (a0 + i) * inner)
                    for i in range(region.shape[0])
                )
            wr = self._row_weights(box, shape, flat.device, row0)
            return self._matrix(flat, wr, box[-1][0], dtype)
        (r0, r1), _ = box
        wr = self._range_weights("r", row0 + r0, row0 + r1, ROW_SALT, region.device)
        return self._matrix(region, wr, box[-1][0], dtype)

    # ------------------------------------------------------------------ weights
    def _range_weights(
        self, kind: str, start: int, stop: int, salt: int, device: torch.device
    ) -> torch.Tensor:
        key = (kind, start, stop, device)
        got = self._weights.get(key)
        if got is None:
            got = mix(torch.arange(start, stop, dtype=torch.int64, device=device), salt)
            if stop - start <= _CACHE_MAX:
                self._weights[key] = got
        return got

    def _row_weights(
        self,
        box: tuple[tuple[int, int], ...],
        shape: tuple[int, ...],
        device: torch.device,
        row0: int = 0,
    ) -> torch.Tensor:
        """Weights of the global flat rows (all dims but the last) of ``box``."""
        key = ("rows", box[:-1], shape[:-1], row0, device)
        got = self._weights.get(key)
        if got is not None:
            return got
        index = torch.full((), row0, dtype=torch.int64, device=device)
        lead = len(shape) - 1
        for d in range(lead):
            stride = math.prod(shape[d + 1 : lead])
            view = [1] * lead
            view[d] = box[d][1] - box[d][0]
            part = torch.arange(box[d][0], box[d][1], dtype=torch.int64, device=device) * stride
            index = index + part.view(view)
        got = mix(index.reshape(-1), ROW_SALT)
        if got.numel() <= _CACHE_MAX:
            self._weights[key] = got
        return got

    # ------------------------------------------------------------------ matrices
    def _scratch_for(self, device: torch.device) -> torch.Tensor:
        if self._scratch is None or self._scratch.device != device:
            self._scratch = torch.empty(self.scratch_limbs, dtype=torch.int64, device=device)
        return self._scratch

    def _matrix(self, m: torch.Tensor, wr: torch.Tensor, c0: int, dtype: torch.dtype) -> int:
        """``sum_r wr[r] * sum_k L[r, k] * Wc[k]`` for the 2-D ``m`` whose columns start at
        global column ``c0`` (as ``dtype``)."""
        rows, cols = m.shape
        size = torch.empty((), dtype=dtype).element_size()
        byte0 = c0 * size
        off, k0 = byte0 % 8, byte0 // 8
        nbytes = cols * size
        limbs = (off + nbytes + 7) // 8
        if limbs > self.scratch_limbs:  # rows too long for the scratch: column blocks
            step = max(1, (self.scratch_limbs - 2) * 8 // size)
            return sum(
                self._matrix(m[:, j : j + step], wr, c0 + j, dtype) for j in range(0, cols, step)
            )
        wc = self._range_weights("c", k0, k0 + limbs, COL_SALT, m.device)
        if (
            m.dtype == dtype
            and off == 0
            and nbytes % 8 == 0
            and m.is_contiguous()
            and m.data_ptr() % 8 == 0
        ):  # strides of size-1 dims normalised for the view
            return _rows_dot(m.reshape(-1).view(rows, cols).view(torch.int64), wc, wr)
        scratch = self._scratch_for(m.device)
        block = max(1, self.scratch_limbs // limbs)
        pad = off != 0 or (off + nbytes) % 8 != 0
        total = 0
        for a in range(0, rows, block):
            part = m[a : a + block]
            n = part.shape[0]
            limbs_view = scratch[: n * limbs].view(n, limbs)
            if pad:
                limbs_view.zero_()
            target = limbs_view.view(torch.uint8)[:, off : off + nbytes].view(dtype)
            target.copy_(part)
            total += _rows_dot(limbs_view, wc, wr[a : a + n])
        return total


def _flat_rows(region: torch.Tensor) -> torch.Tensor | None:
    """``region`` (N-D, N > 2) as ``[rows, last]`` without a copy, or None."""
    try:
        return region.view(-1, region.shape[-1])
    except RuntimeError:
        return None


def _rows_dot(limbs: torch.Tensor, wc: torch.Tensor, wr: torch.Tensor) -> int:
    """``sum_r wr[r] * sum_k limbs[r, k] * wc[k]`` mod 2^64 (int64 wraps)."""
    if limbs.device.type == "cpu":
        inner = torch.mv(limbs, wc)  # no temporary the size of the data
    else:  # integer mv is CPU-only in torch
        inner = (limbs * wc).sum(dim=1)
    return int((inner * wr).sum())


def fingerprint(
    region: torch.Tensor,
    box: tuple[tuple[int, int], ...],
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> int:
    """Fingerprint of the global ``box`` (elements ``region``) of a tensor of ``shape``
    as ``dtype``: see the module docstring. Summing (mod 2^64) the fingerprints of
    disjoint boxes covering a tensor gives the tensor's fingerprint."""
    return Fingerprinter().box(region, box, shape, dtype)
