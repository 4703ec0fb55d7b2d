"""torchtitan 0.3.0's own ``ParallelDims.build_mesh`` vs meshlayout's drop-in, one rank.

For worlds 2^10 .. 2^14 (``--max-log2``), one simulated rank (``world/2 + 3``) on
torch's ``fake`` backend (no peers: it counts what each real rank does) builds the
meshes of pp=4, dp_replicate=2, dp_shard=-1 (inferred), cp=2, tp=8, ep=8 under an SPMD
backend (``spmd_types``, 0.3.0's default, and ``partial_dtensor``):

* torchtitan: ``torchtitan.distributed.ParallelDims(...).build_mesh()``;
* drop-in: ``meshlayout.torch.torchtitan.ParallelDims(...).build_mesh()``.

Reported per run (each in a fresh spawned process): calls of c10d's group-creation
helper (``_new_process_group_helper``, which torch's ``new_group`` and meshlayout's
creation both go through), ``build_mesh`` wall time, and the process's peak RSS.
The drop-in's accessors give the same groups (tests/test_torchtitan_dropin.py).

Run: ``.venv/bin/python benchmarks/bench_torchtitan.py [--max-log2 14]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from typing import Any

DEGREES = {"pp": 4, "dp_replicate": 2, "dp_shard": -1, "cp": 2, "tp": 8, "ep": 8}
BACKENDS = ("spmd_types", "partial_dtensor")


def _child(world: int, which: str, backend: str, out: Any) -> None:
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)  # torchtitan logs each build
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")
    import torchtitan.distributed.parallel_dims as titan_module
    from torch.distributed import distributed_c10d as c10d

    titan_module.device_type = "cpu"  # torchtitan picks "cuda" without an accelerator
    if which == "torchtitan":
        from torchtitan.distributed import ParallelDims
    else:
        from meshlayout.torch.torchtitan import ParallelDims

    calls = {"n": 0}
    real = c10d._new_process_group_helper

    def counted(*a: Any, **k: Any) -> Any:
        calls["n"] += 1
        return real(*a, **k)

    c10d._new_process_group_helper = counted
    dist.init_process_group("fake", rank=world // 2 + 3, world_size=world, store=dist.HashStore())
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    pd = ParallelDims(**DEGREES, world_size=world, spmd_backend=backend)
    pd.build_mesh()
    elapsed = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    groups = len(pd.get_all_one_dimensional_meshes())
    out.put((calls["n"], elapsed, rss / 1024, (rss - rss0) / 1024, groups))


def run(max_log2: int) -> list[tuple[Any, ...]]:
    ctx = mp.get_context("spawn")
    rows = []
    for backend in BACKENDS:
        print(f"spmd_backend={backend}")
        for k in range(10, max_log2 + 1):
            world = 2**k
            got = {}
            for which in ("torchtitan", "drop-in"):
                q = ctx.Queue()
                p = ctx.Process(target=_child, args=(world, which, backend, q))
                p.start()
                try:
                    got[which] = q.get(timeout=3600)
                finally:
                    p.join(timeout=60)
            (tc, ts, trss, tgrow, _), (oc, os_, orss, ogrow, _) = got["torchtitan"], got["drop-in"]
            rows.append((backend, world, tc, ts, trss, oc, os_, orss))
            print(
                f"  2^{k:<2} torchtitan {tc:>6} calls {ts:8.3f} s {trss:6.0f} MB peak "
                f"(+{tgrow:.0f}) | drop-in {oc:>3} calls {os_:7.3f} s {orss:6.0f} MB peak "
                f"(+{ogrow:.0f}) | {tc / oc:7.0f}x calls, {ts / os_:6.1f}x time",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-log2", type=int, default=14)
    args = parser.parse_args()
    run(args.max_log2)


if __name__ == "__main__":
    main()
