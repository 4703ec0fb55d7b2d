"""The torchtitan configurations and names both torchtitan-name test files sweep (one home)."""

from __future__ import annotations

import itertools
import random

DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep", "etp")

#: torchtitan 0.3.0's single-dim names per SPMD backend (its ``_single_axis_meshes``):
#: these under ``partial_dtensor``; ``spmd_types`` has ``dp`` and ``dp_shard`` for ``fsdp``.
TITAN = ("pp", "batch", "loss", "dp_replicate", "fsdp", "cp", "tp", "ep", "efsdp")
TITAN_SPMD_TYPES = ("dp", "dp_shard")
#: Multi-dim requests inside one of torchtitan's global meshes, in their order there.
COMBOS = (
    ("dp_replicate", "fsdp"),
    ("dp_replicate", "efsdp"),
    ("pp", "tp"),
    ("batch", "cp"),
    ("pp", "batch", "cp", "tp"),
    ("dp_replicate", "fsdp", "tp"),
    ("efsdp", "ep"),
    ("pp", "dp_replicate", "efsdp", "ep"),
)
#: Requests with meshlayout's expert TP, which torchtitan 0.3.0 does not have.
ETP_COMBOS = (("ep", "etp"), ("pp", "dp_replicate", "efsdp", "ep", "etp"))

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


# ---------------------------------------------------------------------- torchtitan 0.3.0

#: torchtitan 0.3.0's SPMD backends (its default first).
BACKENDS = ("spmd_types", "partial_dtensor", "full_dtensor")
TITAN_DEGREES = ("dp_replicate", "dp_shard", "cp", "tp", "pp", "ep")

#: Degrees torchtitan 0.3.0 refuses (at construction or in build_mesh), with world_size.
INVALID = (
    dict(dp_replicate=1, dp_shard=3, cp=1, tp=2, pp=1, ep=1, world_size=8),  # product
    dict(dp_replicate=1, dp_shard=-1, cp=1, tp=3, pp=1, ep=1, world_size=8),  # -1 inexact
    dict(dp_replicate=1, dp_shard=-1, cp=1, tp=16, pp=1, ep=1, world_size=8),  # -1 -> 0
    dict(dp_replicate=1, dp_shard=2, cp=1, tp=4, pp=1, ep=3, world_size=8),  # ep does not divide
    dict(dp_replicate=2, dp_shard=2, cp=1, tp=1, pp=1, ep=8, world_size=4),  # ep > region
    dict(dp_replicate=1, dp_shard=2, cp=1, tp=4, pp=1, ep=16, world_size=8),  # ep > region
    dict(dp_replicate=0, dp_shard=2, cp=1, tp=4, pp=1, ep=1, world_size=8),  # zero
    dict(dp_replicate=1, dp_shard=0, cp=1, tp=4, pp=1, ep=1, world_size=8),  # zero dp_shard
    dict(dp_replicate=1, dp_shard=-2, cp=1, tp=4, pp=1, ep=1, world_size=8),  # negative
    dict(dp_replicate=1, dp_shard=2, cp=-1, tp=4, pp=1, ep=1, world_size=8),  # negative
    dict(dp_replicate=1, dp_shard=2, cp=1, tp=4, pp=1, ep=0, world_size=8),  # zero ep
)


def titan_configs() -> list[dict[str, int]]:
    """The configurations torchtitan 0.3.0 can express (``etp == 1``, then dropped), large
    worlds included; every third one asks for ``dp_shard=-1`` (inferred)."""
    out = []
    for i, cfg in enumerate(c for c in configs(large=True) if c["etp"] == 1):
        titan = {k: cfg[k] for k in (*TITAN_DEGREES, "world_size")}
        if i % 3 == 0:
            titan["dp_shard"] = -1
        out.append(titan)
    return out


def titan_jobs() -> list[dict[str, object]]:
    """One reference job per (configuration, backend): torchtitan's own and the drop-in,
    described on one simulated rank (chosen at random, fixed seed), plus the members of
    the real groups on the first and last rank."""
    rng = random.Random(20)
    jobs: list[dict[str, object]] = []
    for cfg in titan_configs():
        world = cfg["world_size"]
        for backend in BACKENDS:
            ranks = sorted({0, world - 1, rng.randrange(world)})
            jobs.append({"cfg": cfg, "backend": backend, "ranks": ranks, "dropin": True})
    for cfg in INVALID:
        for backend in BACKENDS:
            jobs.append({"cfg": dict(cfg), "backend": backend, "ranks": [0], "dropin": True})
    return jobs
