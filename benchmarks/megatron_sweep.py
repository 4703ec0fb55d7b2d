"""Sweep MegatronDims against Megatron-Core's own groups and print the counts.

Needs the ``megatron`` extra (``pip install -e '.[megatron]'``). Runs Megatron-Core's
``initialize_model_parallel`` (recording every group, ``tests/megatron_reference.py``)
for every configuration below and compares each group with
``MegatronDims.groups``: members, member order and group order. Configurations
Megatron refuses must be refused too. Prints the counts per Megatron group and in
total; exits 1 on any difference.

    python benchmarks/megatron_sweep.py            # the full sweep, about 15 minutes
    python benchmarks/megatron_sweep.py --quick    # the sweep of tests/test_megatron.py

The full sweep: every order string Megatron reads (325) with every tp, cp, pp, dp
in {1, 2} and ep, etp in {1, 2, 4}; the 120 orders naming all five dims with tp, cp,
pp, dp in {1, 2, 4} (world 32 to 64) and ep, etp in {1, 2, 4, 8}, with sizes 3 and 6,
and with two distributed-optimizer instances.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from megatron_reference import (
    ALL_ORDERS,
    FULL_ORDERS,
    Config,
    Counts,
    compare,
    degree_grid,
    megatron_available,
    run_reference,
    sweep_configs,
)


def full_sweep() -> list[Config]:
    big = [t for t in degree_grid((1, 2, 4), (1, 2, 4, 8), 64) if t[0] * t[1] * t[2] * t[3] >= 32]
    odd = [t for t in degree_grid((1, 3), (1, 3), 27) if t[0] * t[1] * t[2] * t[3] > 1]
    odd += [(6, 1, 2, 2, ep, etp) for ep in (1, 2, 3, 4, 6) for etp in (1, 2, 3, 6)]
    cfgs = (
        sweep_configs(degree_grid((1, 2), (1, 2, 4), 16), ALL_ORDERS)
        + sweep_configs(big, FULL_ORDERS)
        + sweep_configs(odd, FULL_ORDERS)
        + sweep_configs(degree_grid((1, 2), (1, 2), 16), FULL_ORDERS, instances=2)
        + sweep_configs(degree_grid((2, 3), (1, 2), 36)[:64], FULL_ORDERS, instances=2)
    )
    return sorted(cfgs, key=lambda c: c["world"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the sweep of tests/test_megatron.py")
    args = parser.parse_args()
    if not megatron_available():
        print("needs megatron-core: pip install -e '.[megatron]'", file=sys.stderr)
        return 2
    if args.quick:
        from test_megatron import CONFIGS

        configs = list(CONFIGS)
    else:
        configs = full_sweep()
    start = time.perf_counter()
    version, results = run_reference(configs, timeout=3600)
    megatron_s = time.perf_counter() - start
    start = time.perf_counter()
    counts = Counts()
    for cfg, result in zip(configs, results):
        compare(cfg, result, counts)
    ours_s = time.perf_counter() - start
    print(f"megatron-core {version}, max world {max(c['world'] for c in configs)}")
    print(f"orders: {len({c['order'] for c in configs})}")
    for desc, (n, equal) in sorted(counts.by_desc.items()):
        print(f"  {desc:45} {n:8} compared {equal:8} equal")
    print(counts.summary())
    print(f"time: Megatron {megatron_s:.1f} s (with its import), MegatronDims {ours_s:.1f} s")
    for line in counts.mismatches[:20]:
        print("MISMATCH", line)
    return 1 if counts.mismatches or counts.groups_equal != counts.groups_compared else 0


if __name__ == "__main__":
    sys.exit(main())
