"""The demo's checkpoint phase: exact DCP checkpoints beside plain DCP (layer 4).

After training, every demo worker calls :func:`worker_phase`, which

1. saves the trained model twice, with :mod:`meshlayout.torch.checkpoint`'s
   ``ExactSavePlanner`` and with plain ``torch.distributed.checkpoint`` (DCP);
2. reloads both into *another configuration* on the same processes
   (:func:`reload_dims`: FSDP alone after FSDP over TP, TP alone after FSDP alone)
   and compares every parameter with the trained one, bitwise, through torch's own
   ``DTensor.full_tensor()``;
3. runs a *probe* (:func:`probe_for`), a small tensor on the demo's meshes that
   torch 2.13's DCP gets wrong, through both planners: an uneven ``nn.Linear``
   under ``fully_shard`` over ``ColwiseParallel`` when the FSDP degree is 3 or more
   (the rows chosen where torch's reading of ``_StridedShard`` differs from FSDP2's
   storage, e.g. 7 rows on (fsdp=3, tp=2)), otherwise a ``[_StridedShard(0, 2)]``
   DTensor whose ranks hold several runs (8 rows on 2 ranks).

Rank 0 returns a JSON-ready summary; the calling process hands it to :func:`report`
(:mod:`.checkpoint_report`, re-exported here), which loads both checkpoints into
plain tensors itself and prints the ``PASS``/``FAIL`` lines and the plain-DCP
comparison. Only our planners' results decide the demo's exit status.

The planning helpers are pure:

>>> first_uneven_rows(3, 2), first_uneven_rows(4, 2), first_uneven_rows(2, 2)
(7, 9, None)
>>> probe_for(ParallelDims(6, tp=2)).title
'nn.Linear(3, 7) under fully_shard over ColwiseParallel on (fsdp=3, tp=2)'
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from ..mesh import Mesh
from ..parallel_dims import ParallelDims
from ..sharding import Placement, Shard, ShardingSpec, StridedShard, torch_split_runs
from .checkpoint_report import EXACT, differences, error_message, report

__all__ = [
    "Probe",
    "config_name",
    "config_title",
    "first_uneven_rows",
    "make_summary",
    "parallelize",
    "probe_for",
    "reload_dims",
    "report",
    "worker_phase",
]

#: Probe weights are ``nn.Linear(PROBE_IN, rows)``: 3 columns keep them small.
PROBE_IN = 3
#: :func:`first_uneven_rows` looks at row counts up to this many.
MAX_PROBE_ROWS = 64


# ---------------------------------------------------------------------- pure planning
def config_name(pd: ParallelDims) -> str:
    """The demo's configuration of ``pd`` as ``(fsdp=F, tp=T)``.

    >>> config_name(ParallelDims(4, tp=2)), config_name(ParallelDims(3))
    ('(fsdp=2, tp=2)', '(fsdp=3, tp=1)')
    """
    if not isinstance(pd, ParallelDims):
        raise TypeError(f"pd must be a ParallelDims, got {type(pd).__name__}")
    return f"(fsdp={pd.mesh('fsdp').size()}, tp={pd.degrees['tp']})"


def config_title(pd: ParallelDims) -> str:
    """How the demo's model is sharded under ``pd``, with :func:`config_name`.

    >>> config_title(ParallelDims(4, tp=2)), config_title(ParallelDims(3, tp=3))
    ('FSDP over TP (fsdp=2, tp=2)', 'TP alone (fsdp=1, tp=3)')
    """
    name = config_name(pd)  # checks pd
    fsdp, tp = pd.mesh("fsdp").size(), pd.degrees["tp"]
    kind = {(True, True): "FSDP over TP", (True, False): "FSDP alone", (False, True): "TP alone"}
    return f"{kind.get((fsdp > 1, tp > 1), 'unsharded')} {name}"


def reload_dims(pd: ParallelDims) -> ParallelDims | None:
    """The other configuration the demo reloads its checkpoint into, on the same processes.

    FSDP over TP reloads as FSDP alone over every process; FSDP alone reloads as TP
    alone; one process has no other sharding (it reloads only as plain tensors).

    >>> config_name(reload_dims(ParallelDims(4, tp=2)))
    '(fsdp=4, tp=1)'
    >>> config_name(reload_dims(ParallelDims(3)))
    '(fsdp=1, tp=3)'
    >>> reload_dims(ParallelDims(1)) is None
    True
    """
    if not isinstance(pd, ParallelDims):
        raise TypeError(f"pd must be a ParallelDims, got {type(pd).__name__}")
    world = pd.world_size
    if world == 1:
        return None
    if pd.enabled("tp"):
        return ParallelDims(world)
    return ParallelDims(world, tp=world)


def first_uneven_rows(fsdp: int, tp: int) -> int | None:
    """Fewest rows whose FSDP-over-TP sharding torch 2.13's DCP reads wrongly, or None.

    FSDP2 over ``ColwiseParallel`` stores rows in the nested order (TP's chunks, each
    chunked again by FSDP) under the placements ``[_StridedShard(0, tp), Shard(0)]``;
    torch 2.13's ``compute_local_shape_and_global_offset`` (which DCP's default
    planners use) reads them literally (:func:`~meshlayout.sharding.torch_split_runs`).
    This is the fewest rows (up to :data:`MAX_PROBE_ROWS`) for which the two readings
    give some rank different rows; None if they always agree (e.g. ``fsdp`` = 2).

    >>> first_uneven_rows(3, 2), first_uneven_rows(1, 2)
    (7, None)
    """
    for name, value in (("fsdp", fsdp), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be a positive int, got {value!r}")
        if value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return _first_uneven_rows(fsdp, tp)


@cache
def _first_uneven_rows(fsdp: int, tp: int) -> int | None:
    if tp == 1:
        return None
    mesh = Mesh((fsdp, tp), ("fsdp", "tp"))
    placements: list[Placement] = [StridedShard(0, tp), Shard(0)]
    for rows in range(1, MAX_PROBE_ROWS + 1):
        shape = (rows, PROBE_IN)
        spec = ShardingSpec(shape, mesh, placements)
        for rank in range(fsdp * tp):
            coord = mesh.coordinate(rank)
            assert coord is not None
            if spec.local_runs(rank) != torch_split_runs(shape, mesh.shape, placements, coord):
                return rows
    return None


@dataclass(frozen=True)
class Probe:
    """The small tensor on which the demo compares plain DCP with ours.

    ``kind`` is ``"fsdp_tp"`` (an ``nn.Linear(3, rows)`` under ``fully_shard`` over
    ``ColwiseParallel`` on the ``view`` meshes), ``"strided"`` (``arange(rows)`` as a
    ``[_StridedShard(0, 2)]`` DTensor on the 1-D ``view`` mesh) or ``"none"``
    (``needs`` says what would make one possible). ``note`` explains a choice.
    """

    kind: str
    rows: int
    view: tuple[str, ...]
    title: str
    needs: str = ""
    note: str = ""


def probe_for(pd: ParallelDims) -> Probe:
    """The probe the demo runs for ``pd`` (see :class:`Probe`).

    >>> probe_for(ParallelDims(4, tp=2)).title
    'a [_StridedShard(0, 2)] DTensor of 8 rows on the 2-rank tp mesh (rank 0 holds rows 0,1,4,5)'
    >>> probe_for(ParallelDims(1)).needs
    '2 or more processes'
    """
    if not isinstance(pd, ParallelDims):
        raise TypeError(f"pd must be a ParallelDims, got {type(pd).__name__}")
    fsdp, tp = pd.mesh("fsdp").size(), pd.degrees["tp"]
    rows = first_uneven_rows(fsdp, tp) if tp > 1 else None
    if rows is not None:
        return Probe(
            "fsdp_tp",
            rows,
            ("fsdp", "tp"),
            f"nn.Linear({PROBE_IN}, {rows}) under fully_shard over ColwiseParallel "
            f"on {config_name(pd)}",
        )
    if pd.world_size == 1:
        return Probe("none", 0, (), "an uneven sharding", needs="2 or more processes")
    view = "tp" if tp > 1 else "fsdp"
    size = pd.mesh(view).size()
    held = ",".join(str(r) for r in (0, 1, 4 * size // 2, 4 * size // 2 + 1))
    if tp > 1:
        note = f"on {config_name(pd)} plain DCP reads uneven FSDP over TP correctly"
    else:
        note = f"the demo has no TP on {config_name(pd)} (odd --nproc)"
    note += "; it fails on uneven FSDP over TP from fsdp = 3 on: meshlayout demo --nproc 6"
    return Probe(
        "strided",
        4 * size,
        (view,),
        f"a [_StridedShard(0, 2)] DTensor of {4 * size} rows on the {size}-rank {view} mesh "
        f"(rank 0 holds rows {held})",
        note=note,
    )


# ---------------------------------------------------------------------- worker side
def parallelize(model: Any, built: Any, pd: ParallelDims) -> None:
    """Shard the demo's ``Sequential(Linear, ReLU, Linear)`` as the demo trains it.

    FSDP2 over TP (``ColwiseParallel`` then ``RowwiseParallel`` on the ``tp`` mesh,
    ``fully_shard`` on ``fsdp``) when ``pd`` has TP, else ``fully_shard`` alone.
    ``built`` is :func:`meshlayout.torch.build` of ``pd``.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    if pd.enabled("tp"):
        torch_mesh = built.get(("fsdp", "tp")).to_torch()
        plan = {"0": ColwiseParallel(), "2": RowwiseParallel()}
        parallelize_module(model, torch_mesh["tp"], plan)
        fully_shard(model, mesh=torch_mesh["fsdp"])
    else:
        fully_shard(model, mesh=built.get("fsdp").to_torch())


def _full(state: Mapping[str, Any]) -> dict[str, Any]:
    """Every DTensor of ``state`` gathered with torch's own ``full_tensor`` (collective)."""
    return {name: value.full_tensor().detach().clone() for name, value in state.items()}


def _zero(model: Any) -> Any:
    import torch

    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
    return model


def _save_and_load(
    save: Callable[[str], None], load: Callable[[str], dict[str, Any]], path: str, want: Any
) -> str:
    """Save, load, compare: ``EXACT`` or what went wrong (the same on every rank for errors)."""
    try:
        save(path)
    except BaseException as exc:  # DCP raises CheckpointException, a BaseException
        return f"dcp.save fails: {error_message(exc)}"
    try:
        got = load(path)
    except BaseException as exc:
        return f"dcp.load fails: {error_message(exc)}"
    return differences(got, want)


def _planners() -> dict[str, tuple[Callable[..., Any], Callable[..., Any]]]:
    """``{"ours": (save, load), "plain": (save, load)}``, each called as ``f(sd, path)``."""
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    from ..torch import checkpoint as mlcp

    def plain_save(sd: dict[str, Any], path: str) -> None:
        dcp_save(sd, checkpoint_id=path)

    def plain_load(sd: dict[str, Any], path: str) -> None:
        dcp_load(sd, checkpoint_id=path)

    def ours_save(sd: dict[str, Any], path: str) -> None:
        mlcp.save(sd, path)

    def ours_load(sd: dict[str, Any], path: str) -> None:
        mlcp.load(sd, path)

    return {"ours": (ours_save, ours_load), "plain": (plain_save, plain_load)}


def _model_phase(
    model: Any, pd: ParallelDims, root: str, make_model: Callable[[], Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Save the trained model with both planners; reload into :func:`reload_dims`."""
    from ..torch import build

    trained = _full(model.state_dict())
    outcome: dict[str, str] = {}
    other = reload_dims(pd)
    built = build(other, "cpu", views=("fsdp", "tp")) if other is not None else None
    for who, (save, load) in _planners().items():
        path = os.path.join(root, who)
        try:
            save({"model": model.state_dict()}, path)
            outcome[f"save {who}"] = EXACT
        except BaseException as exc:
            outcome[f"save {who}"] = f"dcp.save fails: {error_message(exc)}"
            continue
        if other is None:
            continue
        fresh = _zero(make_model())
        parallelize(fresh, built, other)
        state = fresh.state_dict()
        try:
            load({"model": state}, path)
        except BaseException as exc:
            outcome[f"reload {who}"] = f"dcp.load fails: {error_message(exc)}"
            continue
        outcome[f"reload {who}"] = differences(_full(state), trained)
    return trained, outcome


def _probe_phase(probe: Probe, built: Any, root: str) -> dict[str, str]:
    """Run ``probe`` through both planners: save, load into a sharding and a plain tensor."""
    import torch
    from torch import nn
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard as TShard
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    if probe.kind == "none":
        return {}
    mesh = built.get(probe.view).to_torch()
    if probe.kind == "fsdp_tp":
        full = torch.arange(probe.rows * PROBE_IN, dtype=torch.float32).view(probe.rows, PROBE_IN)

        def make(zero: bool) -> Any:
            linear = nn.Linear(PROBE_IN, probe.rows, bias=False)
            with torch.no_grad():
                linear.weight.copy_(torch.zeros_like(full) if zero else full)
            layer = nn.Sequential(linear)
            parallelize_module(layer, mesh["tp"], {"0": ColwiseParallel()})
            fully_shard(layer, mesh=mesh["fsdp"])
            return linear.weight

        source, target = make(False), make(True)  # target: the same configuration, zeroed
    else:
        full = torch.arange(probe.rows, dtype=torch.float32)
        # torch's own placement for StridedShard(0, 2), spelled by our sharding layer
        strided = ShardingSpec((probe.rows,), built.get(probe.view).mesh, [StridedShard(0, 2)])
        source = distribute_tensor(full, mesh, list(strided.to_torch()))
        target = distribute_tensor(torch.zeros_like(full), mesh, [TShard(0)])
    outcome = {}
    for who, (save, load) in _planners().items():

        def loaded(path: str, load: Callable[..., Any] = load) -> dict[str, Any]:
            sharded = {"w": target}
            load(sharded, path)
            whole = {"w": torch.zeros_like(full)}
            load(whole, path)
            return {"w": sharded["w"].full_tensor(), "w (plain tensor)": whole["w"]}

        def saved(path: str, save: Callable[..., Any] = save) -> None:
            save({"w": source}, path)

        path = os.path.join(root, f"probe-{who}")
        want = {"w": full, "w (plain tensor)": full}
        outcome[who] = _save_and_load(saved, loaded, path, want)
        with torch.no_grad():
            target.zero_()  # the next planner starts from zeros too
    return outcome


def _merge(per_rank: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """One outcome per key: ``EXACT`` if every rank says so, else the first rank's failure."""
    merged: dict[str, str] = {}
    for key in per_rank[0]:
        bad = [(r, o[key]) for r, o in enumerate(per_rank) if o.get(key) != EXACT]
        if not bad:
            merged[key] = EXACT
        elif all(text == bad[0][1] for _, text in bad):
            merged[key] = bad[0][1]
        else:
            merged[key] = f"rank {bad[0][0]}: {bad[0][1]}"
    return merged


def worker_phase(
    model: Any, built: Any, pd: ParallelDims, root: str, make_model: Callable[[], Any]
) -> dict[str, Any] | None:
    """The checkpoint phase of one demo worker: collective over the default group.

    ``model`` is the trained model sharded by :func:`parallelize` on ``built`` (from
    :func:`meshlayout.torch.build` of ``pd``), ``root`` a directory every rank can
    write (the calling process removes it), ``make_model`` builds the demo's model
    unsharded. Returns rank 0's JSON-ready summary for :func:`report` (None on the
    other ranks): the configurations, the trained parameters as lists, and per check
    ``"exact"`` or what went wrong (``"dcp.save fails: ..."``, ``"dcp.load fails:
    ..."``, ``"loads wrong values: ..."``).
    """
    import torch.distributed as dist

    if not isinstance(pd, ParallelDims):
        raise TypeError(f"pd must be a ParallelDims, got {type(pd).__name__}")
    if not isinstance(root, str) or not os.path.isdir(root):
        raise ValueError(f"root must be an existing directory, got {root!r}")
    trained, own = _model_phase(model, pd, root, make_model)
    probe = probe_for(pd)
    own |= {f"probe {k}": v for k, v in _probe_phase(probe, built, root).items()}
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, own)  # bounded by the default group's timeout
    if dist.get_rank() != 0:
        return None
    lists = {name: value.tolist() for name, value in trained.items()}
    return make_summary(pd, lists, _merge(gathered))


def make_summary(
    pd: ParallelDims, trained: Mapping[str, Any], outcome: Mapping[str, str]
) -> dict[str, Any]:
    """The JSON-ready summary :func:`worker_phase` returns and :func:`report` prints.

    ``trained`` maps parameter names to their full values as nested lists;
    ``outcome`` maps each check (``"save ours"``, ``"reload plain"``, ``"probe
    ours"``, ...) to ``"exact"`` or what went wrong.

    >>> make_summary(ParallelDims(2, tp=2), {}, {})["reloaded_on"]
    'FSDP alone (fsdp=2, tp=1)'
    """
    other = reload_dims(pd)
    probe = probe_for(pd)
    return {
        "nproc": pd.world_size,
        "saved_on": config_title(pd),
        "reloaded_on": config_title(other) if other is not None else None,
        "probe": {"title": probe.title, "kind": probe.kind, "needs": probe.needs},
        "probe_note": probe.note,
        "trained": dict(trained),
        "outcome": dict(outcome),
    }
