"""Micro-benchmark of WeightTransfer's verify fingerprint against a plain copy.

    .venv/bin/python benchmarks/bench_fingerprint.py [--rows 45056] [--cols 1024]

One process, one thread. For a weight matrix (default 45056 x 1024, 46M elements:
16 FFN weights of 2816 rows, 92 MB in bf16: larger than the L3 cache), best of 7:

* **copy**: ``dst.copy_(src)`` of the same tensor (bf16 -> bf16), and the sender's
  cast (fp32 -> bf16): the memory traffic every method must pay;
* **fingerprint** (``meshlayout.torch.transfer._fingerprint``): the destination side (bf16
  piece, one ``torch.mv`` over its int64 view) and the source side (fp32 piece hashed
  as bf16: cast into a cache-sized scratch, then ``mv``);
* **widened**: the same sum with 4-byte limbs widened to int64 first (32 bits of
  headroom: see the module's docstring), destination side;
* **before**: the previous fingerprint (``((i * C) xor bits)**2`` summed over int64
  per element, chunked), both sides.

Prints times and ratios to the copy. The machine is shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from meshlayout.torch.transfer._fingerprint import COL_SALT, ROW_SALT, Fingerprinter, mix


def _best(fn: Callable[[], Any], repeats: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _before(region: torch.Tensor, dtype: torch.dtype, chunk: int = 1 << 20) -> int:
    """The previous implementation's arithmetic (2-D box at the origin)."""
    c1 = -7046029254386353131
    rows, cols = region.shape
    row_c = ((cols * c1 + (1 << 63)) % (1 << 64)) - (1 << 63)  # wrapped to int64
    step = max(1, chunk // cols)
    total = 0
    for a in range(0, rows, step):
        part = region[a : a + step].to(dtype).contiguous().reshape(-1)
        size = part.element_size()
        kind = {2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
        bits = part.view(kind).to(torch.int64, copy=True)
        n = part.numel() // cols
        i = (torch.arange(a, a + n, dtype=torch.int64) * row_c).view(-1, 1) + (
            torch.arange(cols, dtype=torch.int64) * c1
        ).view(1, -1)
        bits.bitwise_xor_(i.reshape(-1))
        bits.mul_(bits)
        total += int(bits.sum())
    return total


def _widened(region: torch.Tensor, scratch: torch.Tensor, block: int) -> int:
    """4-byte limbs sign-extended to int64 before ``mv`` (bf16, contiguous, at the origin)."""
    rows = region.shape[0]
    limbs = region.view(torch.int32)
    wc = mix(torch.arange(limbs.shape[1], dtype=torch.int64), COL_SALT)
    wr = mix(torch.arange(rows, dtype=torch.int64), ROW_SALT)
    total = 0
    for a in range(0, rows, block):
        part = limbs[a : a + block]
        wide = scratch[: part.numel()].view(part.shape)
        wide.copy_(part)
        total += int((torch.mv(wide, wc) * wr[a : a + block]).sum())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=45056)
    parser.add_argument("--cols", type=int, default=1024)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows, cols = args.rows, args.cols
    shape = (rows, cols)
    box = ((0, rows), (0, cols))
    load = os.getloadavg()
    src32 = torch.randn(shape)
    piece = src32.to(torch.bfloat16)
    dst = torch.empty_like(piece)
    fp = Fingerprinter()
    scratch = torch.empty(1 << 17, dtype=torch.int64)
    block = max(1, (1 << 17) // (cols // 2))
    results = {
        "copy bf16 -> bf16": _best(lambda: dst.copy_(piece)),
        "cast fp32 -> bf16": _best(lambda: dst.copy_(src32)),
        "fingerprint, destination (bf16)": _best(lambda: fp.box(piece, box, shape, torch.bfloat16)),
        "fingerprint, source (fp32 as bf16)": _best(
            lambda: fp.box(src32, box, shape, torch.bfloat16)
        ),
        "widened limbs, destination": _best(lambda: _widened(piece, scratch, block)),
        "before, destination (bf16)": _best(lambda: _before(piece, torch.bfloat16), 3),
        "before, source (fp32 as bf16)": _best(lambda: _before(src32, torch.bfloat16), 3),
    }
    print(
        f"{rows} x {cols} = {rows * cols / 1e6:.1f}M elements; load average "
        f"{load[0]:.1f} -> {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores), 1 thread"
    )
    print()
    print("| operation | ms | vs copy bf16 | vs cast fp32 -> bf16 |")
    print("|---|---:|---:|---:|")
    copy, cast = results["copy bf16 -> bf16"], results["cast fp32 -> bf16"]
    for name, t in results.items():
        print(f"| {name} | {t * 1e3:.1f} | {t / copy:.1f}x | {t / cast:.1f}x |")


if __name__ == "__main__":
    main()
