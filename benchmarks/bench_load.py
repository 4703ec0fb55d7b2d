"""Load benchmark: ``load_safetensors`` vs every rank reading full tensors and slicing.

A 1 GiB safetensors file (8 float32 tensors of 8192 x 4096 = 128 MiB, written in a
temporary directory under /tmp, removed at the end) is loaded by 4 gloo processes into

(a) 4-way ``Shard(0)`` DTensors (one row run per rank and tensor);
(b) FSDP over TP at (dp=2, tp=2): tensors 0, 2, 4, 6 Colwise (``[_StridedShard(0, 2),
    Shard(0)]``, row runs), tensors 1, 3, 5, 7 Rowwise (``[Shard(0), Shard(1)]``, one
    8 KiB column run per row).

Methods, same run, alternating order, median of repeats (wall time of the slowest
rank, between barriers):

* ``ours``: ``load_safetensors`` (reads only the rank's byte ranges; bytes counted by
  its ``LoadStats`` and, independently, by the kernel's ``rchar`` in /proc/self/io);
* ``full``: ``safe_open(...).get_tensor`` of every full tensor, then the rank's boxes
  copied out (what loaders that "read full tensors and slice" do: 1 GiB per rank);
* ``get_slice``: safetensors' ``safe_open(...).get_slice`` with the rank's box
  (mmap: touches the pages of the box; no byte count available).

Floor: one process reading the whole file sequentially, cold (the disk's speed) and
warm (the page cache's copy speed): the ranks together must move the whole file.

Each method runs warm (file in the page cache) and cold (every rank drops the file's
pages with ``posix_fadvise(DONTNEED)`` before the timed load, so the data comes from
the disk). Every method's result is checked equal to ``ours``.

Run: ``.venv/bin/python benchmarks/bench_load.py [--quick]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

TENSORS = 8
ROWS, COLS = 8192, 4096  # float32: 128 MiB each, 1 GiB in all
METHODS = ("ours", "full", "get_slice")


def _write_file(path: Path) -> int:
    """Stream the 1 GiB file tensor by tensor (never the whole model in memory)."""
    import torch

    from meshlayout.torch.checkpoint._st_format import header_bytes

    size = ROWS * COLS * 4
    entries = {
        f"w{i}": (torch.float32, (ROWS, COLS), i * size, (i + 1) * size) for i in range(TENSORS)
    }
    g = torch.Generator().manual_seed(0)
    with open(path, "wb") as f:
        f.write(header_bytes(entries))
        for _ in range(TENSORS):
            f.write(torch.randn(ROWS, COLS, generator=g).numpy().tobytes())
    return TENSORS * size


def _specs(case: str) -> dict[str, Any]:
    from meshlayout import Mesh
    from meshlayout.sharding import Shard, ShardingSpec, StridedShard

    out = {}
    for i in range(TENSORS):
        if case == "shard0":
            spec = ShardingSpec((ROWS, COLS), Mesh((4,)), [Shard(0)])
        elif i % 2 == 0:  # Colwise under FSDP: nested order (tp, dp) on dim 0
            spec = ShardingSpec((ROWS, COLS), Mesh((2, 2)), [StridedShard(0, 2), Shard(0)])
        else:  # Rowwise under FSDP: dp on dim 0, tp on dim 1
            spec = ShardingSpec((ROWS, COLS), Mesh((2, 2)), [Shard(0), Shard(1)])
        out[f"w{i}"] = spec
    return out


def _io(field: str) -> int:
    """A counter of /proc/self/io: ``rchar`` (bytes through read syscalls) or
    ``read_bytes`` (bytes this process made the storage deliver)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _rchar() -> int:
    return _io("rchar")


def _drop_cache(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _zeros(specs: dict[str, Any], rank: int, meshes: dict[int, Any]) -> dict[str, Any]:
    import torch
    from torch.distributed.tensor import DTensor

    return {
        name: DTensor.from_local(
            torch.zeros(spec.local_shape(rank)),
            meshes[spec.mesh.ndim],
            spec.to_torch(),
            run_check=False,
            shape=torch.Size((ROWS, COLS)),
            stride=(COLS, 1),
        )
        for name, spec in specs.items()
    }


def _run(
    method: str, dests: dict[str, Any], specs: dict[str, Any], rank: int, path: str
) -> dict[str, int]:
    """One load by ``method``; its byte counts."""
    import torch
    from safetensors import safe_open

    from meshlayout.sharding import run_boxes
    from meshlayout.torch.checkpoint import load_safetensors, read_safetensors_index

    sd = dests["ours" if method == "ours" else "other"]
    if method == "ours":
        before = _rchar()
        stats = load_safetensors(sd, path)
        return {"bytes": stats.bytes_read, "rchar": _rchar() - before, "reads": stats.reads}
    if method == "full":  # each full tensor's bytes into memory, then the rank's boxes
        stored = read_safetensors_index(path)
        before = _rchar()
        with open(path, "rb", buffering=0) as raw:
            for name, spec in specs.items():
                entry = stored[name]
                full = torch.empty(ROWS, COLS)
                raw.seek(entry.begin)
                raw.readinto(full.numpy().data.cast("B"))
                local = sd[name].to_local()
                for rb in run_boxes(spec, rank):
                    local[rb.local_slices()].copy_(full[tuple(slice(a, b) for a, b in rb.box)])
                del full
        return {"bytes": TENSORS * ROWS * COLS * 4, "rchar": _rchar() - before}
    with safe_open(path, framework="pt") as f:  # mmap: pages of the boxes are touched
        for name, spec in specs.items():
            local = sd[name].to_local()
            sl = f.get_slice(name)
            for rb in run_boxes(spec, rank):
                local[rb.local_slices()].copy_(sl[tuple(slice(a, b) for a, b in rb.box)])
    return {"bytes": -1, "rchar": -1}


def _body(rank: int, world: int, path: str, repeats: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    meshes = {1: init_device_mesh("cpu", (4,)), 2: init_device_mesh("cpu", (2, 2))}
    out: dict[str, Any] = {}
    for case in ("shard0", "fsdp_tp"):
        specs = _specs(case)

        # two sets of pieces (memory: 2 x the share): ours, and the baselines' (checked
        # equal to ours after every baseline run)
        dests = {"ours": _zeros(specs, rank, meshes), "other": _zeros(specs, rank, meshes)}
        share = sum(
            spec.local_shape(rank)[0] * spec.local_shape(rank)[1] * 4 for spec in specs.values()
        )

        times: dict[str, list[float]] = {f"{m} {c}": [] for m in METHODS for c in ("warm", "cold")}
        counts: dict[str, dict[str, int]] = {}
        exact = True
        for k in range(repeats):
            for cold in (False, True):
                order = METHODS if k % 2 == 0 else METHODS[::-1]
                for method in order:
                    if cold:
                        _drop_cache(path)
                    dist.barrier()
                    t0 = time.perf_counter()
                    disk = _io("read_bytes")
                    counts[method] = _run(method, dests, specs, rank, path)
                    mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
                    if cold:
                        counts[method]["disk"] = _io("read_bytes") - disk
                    dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # the slowest rank's time
                    times[f"{method} {'cold' if cold else 'warm'}"].append(float(mine))
                    if method != "ours" and "ours" in counts:
                        exact &= all(
                            torch.equal(dests["other"][n].to_local(), dests["ours"][n].to_local())
                            for n in specs
                        )
                        for t in dests["other"].values():
                            t.to_local().zero_()
        out[case] = {
            "median": {k: statistics.median(v) for k, v in times.items()},
            "counts": counts,
            "share": share,
            "exact": exact,
        }
    return out


def _floors(path: Path, repeats: int) -> dict[str, float]:
    """One process reading the whole file sequentially (64 MiB reads into one buffer):
    cold (pages dropped first, the disk's sequential speed) and warm (the page cache's
    copy speed). Every method must move the whole file off the disk (cold) or through
    memory (warm), split over the ranks."""
    import torch

    buf = torch.empty(64 * 2**20, dtype=torch.uint8)
    view = buf.numpy().data.cast("B")
    times: dict[str, list[float]] = {"cold": [], "warm": []}
    for _ in range(repeats):
        for mode in ("cold", "warm"):
            if mode == "cold":
                _drop_cache(str(path))
            t0 = time.perf_counter()
            with open(path, "rb", buffering=0) as f:
                while f.readinto(view):
                    pass
            times[mode].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    from multiproc import run_multiproc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 repeat instead of 5")
    args = parser.parse_args()
    repeats = 1 if args.quick else 5
    root = tempfile.mkdtemp(prefix="bench_load_", dir="/tmp")
    try:
        path = Path(root) / "model.safetensors"
        total = _write_file(path)
        print(f"file: {total / 2**30:.2f} GiB, {TENSORS} x float32 [{ROWS}, {COLS}], in {root}")
        floors = _floors(path, repeats)
        print(
            "floor, one process reading the whole file sequentially: "
            f"cold {floors['cold']:.3f} s ({total / floors['cold'] / 2**20:.0f} MiB/s), "
            f"warm {floors['warm']:.3f} s ({total / floors['warm'] / 2**20:.0f} MiB/s)"
        )
        out = run_multiproc(
            _body, 4, str(path), repeats, timeout=3600, start_method="spawn", pg_timeout=600
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"4 gloo processes, median of {repeats}, wall time of the slowest rank")
    for case, title in (
        ("shard0", "(a) 4-way Shard(0)"),
        ("fsdp_tp", "(b) FSDP over TP, dp=2 tp=2"),
    ):
        print(f"\n{title}; every method equal to ours: {all(o[case]['exact'] for o in out)}")
        print(
            "| rank | share MiB | ours read / share | ours rchar / share | ours reads "
            "| full rchar / share |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        for rank, o in enumerate(out):
            share, c = o[case]["share"], o[case]["counts"]
            ours, full = c["ours"], c["full"]
            print(
                f"| {rank} | {share / 2**20:.1f} | {ours['bytes'] / share:.3f} | "
                f"{ours['rchar'] / share:.3f} | {ours['reads']} | {full['rchar'] / share:.2f} |"
            )
        # the page cache is shared: whichever rank faults a page in is charged for it,
        # so only the sum over ranks means something (1.0 = the file once)
        disk = {m: sum(o[case]["counts"][m]["disk"] for o in out) / total for m in METHODS}
        print(
            "cold, bytes the disk delivered (all ranks) / file size: "
            + ", ".join(f"{m} {v:.2f}" for m, v in disk.items())
        )
        med = out[0][case]["median"]
        print("| cache | ours s | full + slice s | get_slice s | full / ours | get_slice / ours |")
        print("|---|---:|---:|---:|---:|---:|")
        for c in ("warm", "cold"):
            o, f, s = med[f"ours {c}"], med[f"full {c}"], med[f"get_slice {c}"]
            print(f"| {c} | {o:.3f} | {f:.3f} | {s:.3f} | {f / o:.2f}x | {s / o:.2f}x |")


if __name__ == "__main__":
    main()
