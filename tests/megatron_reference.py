"""Megatron-Core's own process groups, recorded from ``initialize_model_parallel``.

Run as a script (``python tests/megatron_reference.py < configs.json``) in a
process of its own: it imports ``megatron.core`` (the ``megatron`` extra: the
package index's ``megatron-core``, which imports on the CPU without CUDA, apex or
Transformer Engine), starts a one-rank ``fake`` process group of each world size,
replaces ``parallel_state.create_group`` with a recorder, and calls Megatron's
``initialize_model_parallel`` for every configuration, then
``destroy_model_parallel``. Every group Megatron asks for is recorded, in
creation order, under its ``group_desc``; a configuration Megatron refuses
records the exception instead.

A configuration is a dict ``{"world", "tp", "pp", "cp", "ep", "etp", "order",
"instances"}`` (``etp`` may be None: Megatron's default, ``tp``). The output is
one JSON object per configuration, in order:
``{"groups": {group_desc: [[rank, ...], ...]}, "error": None}`` or
``{"groups": None, "error": "RuntimeError: ..."}``.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

Config = dict[str, Any]


def megatron_available() -> bool:
    """True if ``megatron.core`` can be found (without importing it)."""
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


def record(configs: list[Config]) -> list[dict[str, Any]]:
    """Megatron's groups for every configuration (call in a process of its own)."""
    import warnings

    warnings.simplefilter("ignore")
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from torch.testing._internal.distributed.fake_pg import FakeStore

    recorded: dict[str, list[list[int]]] = {}

    def create_group(ranks: Any = None, group_desc: str | None = None, **_: Any) -> object:
        recorded.setdefault(str(group_desc), []).append([int(r) for r in ranks])
        return object()

    ps.create_group = create_group
    out: list[dict[str, Any]] = []
    world = None
    try:
        for cfg in configs:
            if cfg["world"] != world:
                if world is not None:
                    dist.destroy_process_group()
                world = cfg["world"]
                dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
            recorded.clear()
            try:
                ps.initialize_model_parallel(
                    tensor_model_parallel_size=cfg["tp"],
                    pipeline_model_parallel_size=cfg["pp"],
                    context_parallel_size=cfg["cp"],
                    expert_model_parallel_size=cfg["ep"],
                    expert_tensor_parallel_size=cfg["etp"],
                    num_distributed_optimizer_instances=cfg["instances"],
                    order=cfg["order"],
                    create_gloo_process_groups=False,
                )
            except Exception as exc:  # Megatron refused the configuration
                out.append({"groups": None, "error": f"{type(exc).__name__}: {exc}"})
            else:
                out.append({"groups": dict(recorded), "error": None})
            finally:
                ps.destroy_model_parallel()
    finally:
        if world is not None:
            dist.destroy_process_group()
    return out


# ---------------------------------------------------------------------- the sweep

#: Every order string Megatron's RankGenerator can read: each arrangement of each
#: non-empty subset of its five tokens (325), innermost first.
ALL_ORDERS: tuple[str, ...] = tuple(
    "-".join(p)
    for k in range(1, 6)
    for c in itertools.combinations(("tp", "cp", "ep", "dp", "pp"), k)
    for p in itertools.permutations(c)
)
FULL_ORDERS: tuple[str, ...] = tuple(o for o in ALL_ORDERS if o.count("-") == 4)


def config(
    world: int, tp: int, cp: int, pp: int, ep: int, etp: int | None, order: str, instances: int = 1
) -> Config:
    return {
        "world": world, "tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp,
        "order": order, "instances": instances,
    }  # fmt: skip


def degree_grid(
    sizes: Sequence[int], expert_sizes: Sequence[int], max_world: int
) -> list[tuple[int, int, int, int, int, int]]:
    """Every ``(tp, cp, pp, dp, ep, etp)`` from the sizes with ``tp*cp*pp*dp <= max_world``.

    The expert sizes are not filtered: configurations Megatron refuses (``etp*ep*pp``
    not dividing the world, ...) are part of the sweep.
    """
    out = []
    for tp, cp, pp, dp in itertools.product(sizes, repeat=4):
        if tp * cp * pp * dp <= max_world:
            out += [(tp, cp, pp, dp, ep, etp) for ep in expert_sizes for etp in expert_sizes]
    return out


def sweep_configs(
    grid: Sequence[tuple[int, ...]], orders: Sequence[str], instances: int = 1
) -> list[Config]:
    """Every order with every degree tuple, sorted by world size (one fake group per size)."""
    cfgs = [
        config(tp * cp * pp * dp, tp, cp, pp, ep, etp, o, instances)
        for (tp, cp, pp, dp, ep, etp) in grid
        for o in orders
    ]
    return sorted(cfgs, key=lambda c: c["world"])


# ---------------------------------------------------------------------- the comparison


@dataclass
class Counts:
    """What a sweep compared (``groups_*`` count single process groups)."""

    configs: int = 0
    accepted: int = 0
    rejected: int = 0
    groups_compared: int = 0
    groups_equal: int = 0
    not_meshes: int = 0  # views whose groups are right but not congruent layouts
    by_desc: dict[str, list[int]] = field(default_factory=dict)  # desc -> [compared, equal]
    mismatches: list[str] = field(default_factory=list)

    def add(self, desc: str, ours: Any, theirs: list[list[int]], cfg: Config) -> None:
        rows = [list(map(int, r)) for r in np.asarray(ours).tolist()]
        equal = sum(a == b for a, b in zip(rows, theirs))
        if len(rows) != len(theirs) or equal != len(theirs):
            self.mismatches.append(f"{cfg}: {desc}: ours {rows[:4]} ... Megatron {theirs[:4]} ...")
        entry = self.by_desc.setdefault(desc, [0, 0])
        entry[0] += len(theirs)
        entry[1] += equal
        self.groups_compared += len(theirs)
        self.groups_equal += equal

    def summary(self) -> str:
        return (
            f"{self.configs} configurations: {self.accepted} accepted by both, {self.rejected} "
            f"refused by both; {self.groups_compared} groups compared, {self.groups_equal} equal "
            f"(members, member order and group order); {self.not_meshes} views not a mesh"
        )


#: Megatron groups that are not a view: checked through MegatronDims methods.
EXTRA_DESCS = ("EMBEDDING_GROUP", "POSITION_EMBEDDING_GROUP")


def compare(cfg: Config, result: dict[str, Any], counts: Counts) -> None:
    """Compare MegatronDims with Megatron's recorded groups for one configuration."""
    from meshlayout.megatron import MEGATRON_VIEWS, MegatronDims

    counts.configs += 1
    try:
        md = MegatronDims(
            cfg["world"], tp=cfg["tp"], cp=cfg["cp"], pp=cfg["pp"], ep=cfg["ep"], etp=cfg["etp"],
            order=cfg["order"], num_distributed_optimizer_instances=cfg["instances"],
        )  # fmt: skip
    except ValueError as exc:
        if result["error"] is None:
            counts.mismatches.append(f"{cfg}: we refuse ({exc}), Megatron accepts")
        else:
            counts.rejected += 1
        return
    if result["error"] is not None:
        counts.mismatches.append(f"{cfg}: we accept, Megatron refuses: {result['error']}")
        return
    counts.accepted += 1
    counts.not_meshes += len(MEGATRON_VIEWS) - len(md.views())
    groups: dict[str, list[list[int]]] = result["groups"]
    known = {v.group_desc for v in MEGATRON_VIEWS.values()} | set(EXTRA_DESCS)
    unknown = sorted(set(groups) - known)
    if unknown:
        counts.mismatches.append(f"{cfg}: Megatron created groups we do not model: {unknown}")
    aliases = {  # Megatron reuses these groups when there is one optimizer instance
        "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP": "DATA_PARALLEL_GROUP_WITH_CP",
        "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0": "EXPERT_DATA_PARALLEL_GROUP",
    }
    for name, view in MEGATRON_VIEWS.items():
        desc = view.group_desc
        theirs = groups.get(desc)
        if theirs is None and desc in aliases:
            theirs = groups.get(aliases[desc])
        if theirs is None:
            if md.groups(name).shape[1] != 1:  # only the inter-instance split may be absent
                counts.mismatches.append(f"{cfg}: Megatron made no {desc} for view {name}")
            continue
        counts.add(desc, md.groups(name), theirs, cfg)
    pp = md.groups("pp")
    counts.add("EMBEDDING_GROUP", md.embedding_groups(), groups["EMBEDDING_GROUP"], cfg)
    counts.add("POSITION_EMBEDDING_GROUP", pp[:, :1], groups["POSITION_EMBEDDING_GROUP"], cfg)


def run_reference(configs: list[Config], timeout: float = 900) -> tuple[str, list[dict[str, Any]]]:
    """Run this file as a script on ``configs``: (megatron-core version, results)."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve())],
        input=json.dumps(configs),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the Megatron reference failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout)
    return out["version"], out["results"]


def megatron_version() -> str:
    from importlib.metadata import version

    return version("megatron-core")


if __name__ == "__main__":
    json.dump({"version": megatron_version(), "results": record(json.load(sys.stdin))}, sys.stdout)
