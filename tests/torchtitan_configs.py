"""The torchtitan configurations and names both torchtitan-name test files sweep (one home)."""

from __future__ import annotations

import itertools

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")

#: torchtitan's single-dim names in the vendored version (its ``_meshes``).
TITAN = ("pp", "batch", "loss", "dp_replicate", "fsdp", "cp", "tp", "ep", "efsdp", "etp")
#: Multi-dim requests inside one of torchtitan's global meshes, in their order there.
COMBOS = (
    ("dp_replicate", "fsdp"),
    ("dp_replicate", "efsdp"),
    ("pp", "tp"),
    ("batch", "cp"),
    ("pp", "batch", "cp", "tp"),
    ("dp_replicate", "fsdp", "tp"),
    ("efsdp", "ep"),
    ("ep", "etp"),
    ("pp", "dp_replicate", "efsdp", "ep", "etp"),
)

#: Beyond the 2^5 grid: odd sizes, and larger worlds that only the fake backend runs.
ODD_SIZES = (
    dict(dp_replicate=1, dp_shard=3, cp=1, tp=2, pp=1, ep=3, etp=1),
    dict(dp_replicate=2, dp_shard=3, cp=2, tp=1, pp=1, ep=6, etp=1),
    dict(dp_replicate=1, dp_shard=2, cp=3, tp=2, pp=2, ep=3, etp=2),
)
LARGE_WORLDS = (
    dict(dp_replicate=2, dp_shard=8, cp=2, tp=4, pp=4, ep=8, etp=1),  # 512
    dict(dp_replicate=4, dp_shard=4, cp=1, tp=8, pp=2, ep=1, etp=1),  # 256
    dict(dp_replicate=1, dp_shard=16, cp=2, tp=4, pp=1, ep=4, etp=4),  # 128
)


def configs(*, large: bool = False) -> list[dict[str, int]]:
    """Every (dp_replicate, dp_shard, cp, tp, pp) in {1, 2}^5 with each valid (ep, etp), the odd
    sizes, and with ``large`` the large worlds; each with its ``world_size``."""
    out = []
    for dpr, dps, cp, tp, pp in itertools.product((1, 2), repeat=5):
        region = dps * cp * tp
        for ep, etp in itertools.product((1, 2, 4), sorted({1, tp})):
            if region % (ep * etp) == 0:
                out.append(
                    dict(dp_replicate=dpr, dp_shard=dps, cp=cp, tp=tp, pp=pp, ep=ep, etp=etp)
                )
    out += [dict(c) for c in ODD_SIZES]
    out += [dict(c) for c in LARGE_WORLDS] if large else []
    for cfg in out:
        cfg["world_size"] = (
            cfg["dp_replicate"] * cfg["dp_shard"] * cfg["cp"] * cfg["tp"] * cfg["pp"]
        )
    return out
