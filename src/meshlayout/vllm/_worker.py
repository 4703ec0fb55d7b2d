"""The inference side of the "meshlayout" backend: a vLLM ``WeightTransferEngine``.

vLLM constructs it in every worker (``weight_transfer_config={"backend":
"meshlayout"}``) with the worker's live, TP-local model. It serves many trainer
**sessions** one after another, for days:

* ``init_transfer_engine`` opens a session: it joins the sync group the trainer opened
  (worker ``w`` of ``E`` becomes sync rank ``trainer_world_size + w``). Whatever an
  earlier session built for its group (transfers, buffers) is dropped; an earlier
  session whose trainer vanished mid-update is ended first (its update rolled back).
* ``update_weights`` runs one update (:mod:`._session`): the manifest is checked and
  the destinations derived from the live model **before** the model is touched (a
  mismatch raises and the engine keeps serving its weights); then vLLM's layerwise
  reload starts, and group by group each layer is materialised, the transfer writes
  this worker's bytes straight into its parameters (views into fused ones), padding is
  filled, and vLLM's own post-load processing runs for the layer. Fallback tensors
  arrive whole and go through vLLM's ``load_weights`` of that tensor alone. The update
  is **all or nothing** across the workers: they exchange their outcomes (over vLLM's
  own group); if any failed (a trainer rank died or stalled: every wait is bounded by
  ``timeout_s``), every worker puts back exactly its previous weights
  (:class:`._reload.Reload`), so the engine never serves a mix. Otherwise the reload
  is finalised and modules tied to an updated tensor (a tied head) are reprocessed.
* ``shutdown`` (the trainer's ``shutdown()`` asks for it) ends the session.

A failed phase raises on the **last** worker only, with every worker's error; the
others return normally. vLLM reads the workers' answers in rank order and stops at the
first failure, leaving later answers unread for the next call to trip on: raising on
the last one alone keeps its answers in step.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
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
from ..torch.transfer import dtype_name, dtype_of, open_store
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
    """vLLM worker side of the "meshlayout" backend (see the module docstring).

    ``last_stats`` after each update: the session, the update number, ``exact`` and
    ``fallback`` (name -> why) tensors, ``bytes_received`` by this worker, ``verified``
    (True: ``verify`` ran and held), seconds, and ``outcome`` ("ok" or the error).
    """

    init_info_cls = MeshlayoutWorkerInitInfo
    update_info_cls = MeshlayoutUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        self.sg: SyncGroup | None = None
        self.info: MeshlayoutWorkerInitInfo | None = None
        self.sessions = 0
        self._derived: tuple[str, Derivation] | None = None
        self._transfers: tuple[str, list[tuple[list[str], WeightTransfer]]] | None = None
        self._buffers = (torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.uint8))
        self._reload: Reload | None = None
        self._tied: list[str] = []
        self._worker: Any = None
        self._expected: dict[str, tuple[int, ...]] | None = None
        self.last_stats: dict[str, Any] = {}

    # ------------------------------------------------------------------ init
    def init_transfer_engine(self, init_info: MeshlayoutWorkerInitInfo) -> None:
        self._worker = self._worker or _calling_worker(self)
        self._guarded("init_weight_transfer_engine", lambda: self._open(init_info))

    def _open(self, init_info: MeshlayoutWorkerInitInfo) -> None:
        from vllm.distributed import get_world_group

        self._end_session("a new session started")
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
        self.sessions += 1
        if self._buffers[1].numel() != init_info.bucket_bytes:
            self._buffers = (
                torch.empty(0, dtype=torch.uint8),
                torch.empty(init_info.bucket_bytes, dtype=torch.uint8),
            )

    def _end_session(self, why: str) -> None:
        """Forget what the current session built; roll back an update it left open."""
        if self._reload is not None:
            log.warning("meshlayout: %s; the open weight update is rolled back", why)
            self._reload.abort()
            self._reload = None
        worker = self._worker
        if worker is not None and getattr(worker, "_weight_update_active", False):
            log.warning("meshlayout: %s; the unfinished weight update is ended", why)
            worker._weight_update_active = False
            self.reset_weight_update_target()
        self._transfers = None
        if self.sg is not None:
            try:
                self.sg.destroy()
            except Exception as exc:  # the trainer's side is gone: nothing to release
                log.info("meshlayout: closing the previous sync group: %s", exc)
            self.sg = None

    # ------------------------------------------------------------------ phases
    def start_weight_update(self) -> None:
        """Nothing yet: the model is touched only once both sides agree (``update_weights``)."""

    def update_weights(self, update_info: dict[str, Any]) -> None:
        info = self.parse_update_info(update_info)
        self._guarded("update_weights", lambda: self.receive_weights(info), self._settle)

    def receive_weights(self, update_info: MeshlayoutUpdateInfo) -> None:
        sg, info = self.sg, self.info
        if sg is None or info is None:
            raise RuntimeError(
                "meshlayout: no trainer session is open (the trainer's trainer_init calls "
                "init_weight_transfer_engine)"
            )
        t0 = time.perf_counter()
        n = update_info.update
        self.last_stats = {"session": self.sessions, "update": n, "outcome": "running"}
        trainers = info.trainer_world_size
        manifest = _session.read_manifest(sg, n)
        derivation = self._derive(manifest)
        _session.post_worker(sg, n, self._post(manifest, derivation))
        layout = _session.agree(sg, n, trainers, manifest)  # raises before any byte moves
        transfers = self._transfers_for(layout)
        reload = Reload(self.model, self.model_config)
        self._reload = reload
        reload.begin()
        self._run(layout, derivation, transfers, reload, info.verify)
        self.last_stats["seconds"] = time.perf_counter() - t0

    def _settle(self, ok: bool) -> None:
        """After every worker's outcome is known: finalise the update, or roll it back."""
        reload, self._reload = self._reload, None
        if reload is None:
            return
        if ok:
            reload.finish()
            reload.reprocess(self._tied)
            self.last_stats["outcome"] = "ok"
        else:
            reload.abort()

    def finish_weight_update(self) -> None:
        """Nothing left: ``update_weights`` finalised the update on every worker."""

    def shutdown(self) -> None:
        self._end_session("the trainer ended its session")

    # ------------------------------------------------------------------ failures
    def _guarded(
        self,
        phase: str,
        run: Callable[[], None],
        settle: Callable[[bool], None] | None = None,
    ) -> None:
        """Run ``phase`` on every worker, then agree on its outcome (see the module doc)."""
        error: BaseException | None = None
        try:
            run()
        except BaseException as exc:  # reported below, by the last worker
            error = exc
        outcomes = _gather_outcomes(_describe(error))
        failed: list[tuple[int, str | None]] = [
            (w, e) for w, e in enumerate(outcomes) if e is not None
        ]
        if settle is not None:
            try:
                settle(not failed)
            except BaseException as exc:
                log.exception("meshlayout: settling %s failed", phase)
                if error is None:
                    error = exc
                    failed.append((_my_index(), _describe(exc)))
        if not failed:
            return
        self.last_stats["outcome"] = "failed"
        self.last_stats["error"] = _describe(error) or "another worker failed"
        if _my_index() == len(outcomes) - 1:
            raise RuntimeError(_combined(phase, failed)) from error
        log.error("meshlayout: %s failed: %s", phase, _combined(phase, failed))
        worker = self._worker
        if phase == "update_weights" and worker is not None:
            worker._weight_update_active = False  # as vLLM does for the raising worker
            self.reset_weight_update_target()

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

    def _expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of the engine's own checkpoint (its safetensors headers, when
        the model is a local folder): what a tensor missing from the trainer is."""
        if self._expected is None:
            self._expected = checkpoint_shapes(getattr(self.model_config, "model", None))
        return self._expected

    def _post(self, manifest: _session.Manifest, d: Derivation) -> dict[str, Any]:
        from vllm.distributed import get_world_group

        modules = dict(self.model.named_modules())
        dtypes = {}
        for name, c in d.copies.items():
            dtypes[name] = dtype_name(getattr(modules[c.module], c.param).dtype)
        for name in d.fallback:
            dtypes[name] = dtype_name(self.model_config.dtype)
        # a parameter sharing its serving tensor with a written one (a tied head) is filled
        filled_kernels = {
            d.kernel[key] for key, n in d.writes.items() if n >= d.param_numel.get(key, 0)
        }
        underfilled = {}
        if not d.fallback or all(d.reads.get(n) is not None for n in d.fallback):
            for key, numel in d.param_numel.items():
                got = d.writes.get(key, 0)
                if numel > 0 and got < numel and d.kernel[key] not in filled_kernels:
                    underfilled[f"{key[0]}.{key[1]}"] = (got, numel)
        first = get_world_group().rank_in_group == 0
        return {
            "runs": {n: c.runs for n, c in d.copies.items()},
            "reads": d.reads,
            "fallback": dict(d.fallback),
            "unknown": dict(d.unknown),
            "underfilled": underfilled,
            "expected": self._expected_shapes() if first else {},
            "dtypes": dtypes,
        }

    def _transfers_for(self, layout: _session.Layout) -> list[tuple[list[str], WeightTransfer]]:
        assert self.sg is not None and self.info is not None
        me = self.sg.rank
        if self._transfers is not None and self._transfers[0] == layout.digest:
            return self._transfers[1]
        built = _session.transfers(
            layout,
            self.sg,
            self.info.bucket_bytes,
            self._buffers,
            lambda names: None,
            lambda names: {
                n: (layout.specs[n], dtype_of(layout.dtypes[n]))
                for n in names
                if me in layout.specs[n].mesh  # an expert-parallel worker holds some experts
            },
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
        stats = self.last_stats
        stats.update(exact=0, bytes_received=0, fallback={}, verified=False)
        for names, wt in transfers:
            views: dict[str, torch.Tensor] = {}
            written: dict[str, int] = {}
            for name in names:
                if name in layout.fallback or name not in d.copies:
                    continue
                c = d.copies[name]
                layer = reload.materialize(c.module)
                views[name] = getattr(layer, c.param)[_slices(c.dst)].view(c.shape)
            got = wt.run(out=views, verify=verify)
            received += sum(
                s for r in range(len(wt.plan.rounds)) for s in wt.plan.round(r).recv_sizes(wt.rank)
            )
            for name in names:
                if name in layout.fallback or name not in d.copies:
                    continue
                c = d.copies[name]
                for f in d.fills.get(name, ()):
                    getattr(reload.modules[f.module], f.param)[_slices(f.region)].fill_(f.value)
                written[c.module] = written.get(c.module, 0) + math.prod(c.shape)
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
            stats.update(exact=exact, bytes_received=received)
        stats["fallback"] = {n: layout.fallback[n] for n in fallback_names}
        stats["verified"] = bool(verify)


def _my_index() -> int:
    from vllm.distributed import get_world_group

    return int(get_world_group().rank_in_group)


def _gather_outcomes(mine: str | None) -> list[str | None]:
    """Every worker's outcome of the phase (None: ok), over vLLM's own CPU group."""
    import torch.distributed as dist
    from vllm.distributed import get_world_group

    world = get_world_group()
    if world.world_size == 1:
        return [mine]
    out: list[str | None] = [None] * world.world_size
    dist.all_gather_object(out, mine, group=world.cpu_group)
    return out


def _describe(error: BaseException | None) -> str | None:
    if error is None:
        return None
    return f"{type(error).__name__}: {error}"


def _combined(phase: str, failed: list[tuple[int, str | None]]) -> str:
    texts = list(dict.fromkeys(e or "" for _, e in failed))
    who = ", ".join(str(w) for w, _ in failed)
    if len(texts) == 1:
        return f"meshlayout {phase} failed on worker(s) {who}: {texts[0]}"
    return f"meshlayout {phase} failed on worker(s) {who}:\n" + "\n".join(
        f"  worker {w}: {e}" for w, e in failed
    )


def _calling_worker(engine: Any) -> Any:
    """The vLLM worker that owns ``engine`` (it calls ``init_transfer_engine``): its
    ``_weight_update_active`` flag is reset when a session ends mid-update."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        owner = frame.f_locals.get("self")
        if owner is not engine and getattr(owner, "weight_transfer_engine", None) is engine:
            return owner
        frame = frame.f_back
    return None


def checkpoint_shapes(path: Any) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in the safetensors files of a local model folder
    (headers only); empty when ``path`` is not a local folder."""
    import glob
    import os

    from ..torch.checkpoint._st_format import read_header

    if not isinstance(path, str) or not os.path.isdir(path):
        return {}
    out: dict[str, tuple[int, ...]] = {}
    for file in sorted(glob.glob(os.path.join(path, "*.safetensors"))):
        header, _ = read_header(file)
        for name, entry in header.items():
            if name != "__metadata__":
                out[name] = tuple(int(x) for x in entry["shape"])
    return out
