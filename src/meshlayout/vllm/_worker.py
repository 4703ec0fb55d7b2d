"""The inference side of the "meshlayout" backend: a vLLM ``WeightTransferEngine``.

vLLM constructs it in every worker (``weight_transfer_config={"backend":
"meshlayout"}``) with the worker's live, TP-local model. ``init_transfer_engine``
joins the sync group the trainer opened (worker ``w`` of ``E`` becomes sync rank
``trainer_world_size + w``). Each ``update_weights`` runs one update
(:mod:`._session`): the manifest is checked and the destinations derived from the
live model **before** the model is touched (a mismatch raises and the engine keeps
serving its weights); then vLLM's layerwise reload starts, and group by group each
layer is materialised, the transfer writes this worker's bytes straight into its
parameters (views into fused ones), padding is filled, and vLLM's own post-load
processing runs for the layer. Fallback tensors arrive whole and go through vLLM's
``load_weights`` of that tensor alone. ``finish_weight_update`` finalises the reload
and re-processes modules tied to an updated tensor (a tied head).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from ..torch import SyncGroup, WeightTransfer, sync_group
from ..torch._sync import open_store
from ..torch._transfer_meta import dtype_name, dtype_of
from . import _session
from ._derive import Derivation, derive
from ._reload import Reload

__all__ = [
    "MeshlayoutUpdateInfo",
    "MeshlayoutWeightTransferEngine",
    "MeshlayoutWorkerInitInfo",
]

log = logging.getLogger("meshlayout.vllm")
ENGINE_WORLD_KEY = "meshlayout/vllm/engine_world_size"


@dataclass
class MeshlayoutWorkerInitInfo(WeightTransferInitInfo):
    """What the trainer tells every worker at ``init_weight_transfer_engine``."""

    master_address: str
    master_port: int
    trainer_world_size: int
    bucket_bytes: int = 256 * 2**20
    verify: bool = False
    timeout_s: float = 300.0


@dataclass
class MeshlayoutUpdateInfo(WeightTransferUpdateInfo):
    """One update's number (its manifest is in the sync group's store)."""

    update: int
    extra: dict[str, Any] = field(default_factory=dict)


def _slices(box: tuple[tuple[int, int], ...]) -> tuple[slice, ...]:
    return tuple(slice(a, b) for a, b in box)


class MeshlayoutWeightTransferEngine(
    WeightTransferEngine[MeshlayoutWorkerInitInfo, MeshlayoutUpdateInfo]
):
    """vLLM worker side of the "meshlayout" backend (see the module docstring)."""

    init_info_cls = MeshlayoutWorkerInitInfo
    update_info_cls = MeshlayoutUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        self.sg: SyncGroup | None = None
        self.info: MeshlayoutWorkerInitInfo | None = None
        self._derived: tuple[str, Derivation] | None = None
        self._transfers: tuple[str, list[tuple[list[str], WeightTransfer]]] | None = None
        self._buffers = (torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8))
        self._reload: Reload | None = None
        self._tied: list[str] = []
        self.last_stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ init
    def init_transfer_engine(self, init_info: MeshlayoutWorkerInitInfo) -> None:
        from vllm.distributed import get_world_group

        world = get_world_group()
        me, engines = world.rank_in_group, world.world_size
        td = timedelta(seconds=init_info.timeout_s)
        trainers = init_info.trainer_world_size
        store = open_store(init_info.master_address, init_info.master_port, False, td)
        if me == 0:
            store.set(ENGINE_WORLD_KEY, str(engines))
        self.sg = sync_group(
            init_info.master_address,
            init_info.master_port,
            trainers + me,
            trainers + engines,
            timeout=td,
            store=store,
        )
        self.info = init_info
        self._buffers = (
            torch.empty(0, dtype=torch.uint8),
            torch.empty(init_info.bucket_bytes, dtype=torch.uint8),
        )

    # ------------------------------------------------------------------ phases
    def start_weight_update(self) -> None:
        """Nothing yet: the model is touched only once both sides agree (``update_weights``)."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, update_info: MeshlayoutUpdateInfo) -> None:
        sg, info = self.sg, self.info
        if sg is None or info is None:
            raise RuntimeError("meshlayout: init_weight_transfer_engine was not called")
        n = update_info.update
        trainers = info.trainer_world_size
        manifest = _session.read_manifest(sg, n)
        derivation = self._derive(manifest)
        _session.post_worker(sg, n, self._post(manifest, derivation))
        layout = _session.agree(sg, n, trainers, manifest)  # raises before any byte moves
        transfers = self._transfers_for(layout)
        reload = Reload(self.model, self.model_config)
        self._reload = reload
        reload.begin()
        try:
            self._run(layout, derivation, transfers, reload, info.verify)
        except BaseException:
            reload.finish()  # layers not processed yet get their serving tensors back
            self._reload = None
            raise

    def finish_weight_update(self) -> None:
        reload = self._reload
        if reload is None:
            return
        reload.finish()
        reload.reprocess(self._tied)
        self._reload = None

    def shutdown(self) -> None:
        if self.sg is not None:
            self.sg.destroy()
            self.sg = None

    # ------------------------------------------------------------------ helpers
    def _derive(self, manifest: _session.Manifest) -> Derivation:
        key = repr(manifest)
        if self._derived is None or self._derived[0] != key:
            entries = [(n, tuple(s), dtype_of(d)) for n, s, d in manifest]
            derivation = derive(self.model, entries)
            self._derived = (key, derivation)
            self._tied = self._tied_modules(derivation)
        return self._derived[1]

    def _tied_modules(self, derivation: Derivation) -> list[str]:
        """Modules that share a written parameter object but receive no copy."""
        modules = dict(self.model.named_modules())
        written = {id(getattr(modules[c.module], c.param)) for c in derivation.copies.values()}
        receivers = {c.module for c in derivation.copies.values()}
        out = []
        for name, module in modules.items():
            if name in receivers:
                continue
            if any(id(p) in written for p in module._parameters.values() if p is not None):
                out.append(name)
        return out

    def _post(self, manifest: _session.Manifest, d: Derivation) -> dict[str, Any]:
        modules = dict(self.model.named_modules())
        dtypes = {}
        for name, c in d.copies.items():
            dtypes[name] = dtype_name(getattr(modules[c.module], c.param).dtype)
        for name in d.fallback:
            dtypes[name] = dtype_name(self.model_config.dtype)
        filled = {d.kernel[(c.module, c.param)] for c in d.copies.values()}
        unfilled = (
            []  # a fallback's load may fill any parameter: vLLM's finalize reports those
            if d.fallback
            else sorted(
                f"{m}.{p}"
                for (m, p), n in d.param_numel.items()
                if n > 0 and d.kernel[(m, p)] not in filled
            )
        )
        return {
            "boxes": {n: c.src for n, c in d.copies.items()},
            "fallback": dict(d.fallback),
            "unknown": dict(d.unknown),
            "unfilled": unfilled,
            "dtypes": dtypes,
        }

    def _transfers_for(self, layout: _session.Layout) -> list[tuple[list[str], WeightTransfer]]:
        assert self.sg is not None and self.info is not None
        if self._transfers is not None and self._transfers[0] == layout.digest:
            return self._transfers[1]
        built = _session.transfers(
            layout,
            self.sg,
            self.info.bucket_bytes,
            self._buffers,
            lambda names: None,
            lambda names: {n: (layout.specs[n], dtype_of(layout.dtypes[n])) for n in names},
        )
        self._transfers = (layout.digest, built)
        return built

    def _run(
        self,
        layout: _session.Layout,
        d: Derivation,
        transfers: list[tuple[list[str], WeightTransfer]],
        reload: Reload,
        verify: bool,
    ) -> None:
        received = exact = 0
        fallback_names: list[str] = []
        for names, wt in transfers:
            views: dict[str, torch.Tensor] = {}
            written: dict[str, int] = {}
            for name in names:
                if name in layout.fallback:
                    continue
                c = d.copies[name]
                layer = reload.materialize(c.module)
                views[name] = getattr(layer, c.param)[_slices(c.dst)]
            got = wt.run(out=views, verify=verify)
            received += sum(
                s for r in range(len(wt.plan.rounds)) for s in wt.plan.round(r).recv_sizes(wt.rank)
            )
            for name in names:
                if name in layout.fallback:
                    continue
                c = d.copies[name]
                layer = reload.modules[c.module]
                for f in d.fills.get(name, ()):
                    getattr(reload.modules[f.module], f.param)[_slices(f.region)].fill_(f.value)
                written[c.module] = written.get(c.module, 0) + math.prod(b - a for a, b in c.dst)
                exact += 1
            with torch.no_grad():
                for module, numel in written.items():
                    reload.written(module, numel)
            for name in names:
                if name in layout.fallback:
                    log.warning(
                        "meshlayout: %s falls back to vLLM's load_weights (%s)",
                        name,
                        layout.fallback[name],
                    )
                    self.model.load_weights([(name, got.pop(name))])
                    fallback_names.append(name)
        self.last_stats = {
            "exact": exact,
            "bytes_received": received,
            "fallback": {n: layout.fallback[n] for n in fallback_names},
        }
