"""The trainer side of the "meshlayout" backend: a vLLM ``TrainerWeightTransferEngine``.

``WeightTransferTrainerFactory.trainer_init(MeshlayoutTrainerInitInfo(...),
client=..., source=ShardedSource(model))`` on every trainer rank: trainer rank 0
hosts the sync group's store and asks the engine (through the client) to join;
every worker joins as sync rank ``world_size + w``. ``send_weights()`` (every trainer
rank, after each step) runs one update (:mod:`._session`): rank 0 posts the manifest
and drives ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``;
every rank sends the bytes of its own shards, cast to the engine's dtype, in
``bucket_bytes`` rounds, nothing gathered.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
)

from ..torch import SyncGroup, WeightTransfer, sync_group
from ..torch.transfer import open_store
from . import _compat, _session
from ._plugin import register
from ._source import ShardedSource
from ._worker import ENGINE_WORLD_KEY, MeshlayoutWorkerInitInfo

__all__ = ["LLMClient", "MeshlayoutTrainerEngine", "MeshlayoutTrainerInitInfo"]

log = logging.getLogger("meshlayout.vllm")


@dataclass
class MeshlayoutTrainerInitInfo(TrainerInitInfo):
    """Trainer-side init info of the "meshlayout" backend (``docs/vllm.md``).

    ``master_address:master_port``: where trainer rank 0 hosts the sync group's store
    (reachable from the engine's workers); ``rank`` / ``world_size``: this trainer
    process and the trainer's world size (the engine's size is learned when it
    joins); ``bucket_bytes``: the most any rank sends or receives per round;
    ``verify``: prove every update (``docs/transfer.md``, "Verification"); ``timeout_s``: bounds every wait.
    """

    backend: ClassVar[str] = "meshlayout"

    master_address: str
    master_port: int
    world_size: int
    bucket_bytes: int = 256 * 2**20
    verify: bool = False
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        for what in ("master_port", "world_size", "bucket_bytes", "rank"):
            value = getattr(self, what)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise TypeError(
                    f"MeshlayoutTrainerInitInfo.{what} must be an int >= 0, got {value!r}"
                )
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, world_size={self.world_size}), got {self.rank}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s!r}")


class LLMClient:
    """The four-method client protocol over an offline ``vllm.LLM`` (whose methods take
    ``{"init_info": ...}`` / ``{"update_info": ...}`` requests)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.llm.init_weight_transfer_engine({"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.start_weight_update()

    def update_weights(self, update_info: Any) -> None:
        self.llm.update_weights({"update_info": update_info})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.llm.finish_weight_update(weight_version)

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.shutdown_weight_transfer_engine()


def _as_client(client: Any) -> Any:
    if hasattr(client, "llm_engine") and hasattr(client, "update_weights"):
        return LLMClient(client)  # an offline vllm.LLM
    return client


class MeshlayoutTrainerEngine(TrainerWeightTransferEngine[MeshlayoutTrainerInitInfo]):
    """Trainer side of the "meshlayout" backend (see the module docstring).

    ``last_stats`` after each ``send_weights``: seconds per phase, ``bytes_sent`` by
    this rank, ``fallback`` (name -> why each tensor took vLLM's ``load_weights``),
    ``verified`` (True: ``verify`` ran and every tensor's fingerprint matched).

    ``shutdown()`` ends the session on both sides: rank 0 asks the engine (through the
    client's ``shutdown_weight_transfer_engine``) to close it, then every rank leaves the
    sync group. A later ``trainer_init`` (a restarted trainer) opens a new session.
    """

    init_info_cls = MeshlayoutTrainerInitInfo

    def __init__(
        self,
        *,
        client: Any,
        source: Any,
        is_sender: bool,
        info: MeshlayoutTrainerInitInfo,
        sg: SyncGroup,
    ) -> None:
        super().__init__(
            client=client,
            source=source,
            is_sender=is_sender,
            **_compat.trainer_engine_kwargs(info.rank),
        )
        self.info = info
        self.sg = sg
        self.updates = 0
        self._transfers: tuple[str, list[tuple[list[str], WeightTransfer]]] | None = None
        self._buffers = (
            torch.empty(info.bucket_bytes, dtype=torch.uint8),
            torch.empty(0, dtype=torch.uint8),
        )
        self.last_stats: dict[str, Any] = {}

    @classmethod
    def trainer_init(
        cls, init_info: MeshlayoutTrainerInitInfo, *, client: Any, source: Any = None
    ) -> MeshlayoutTrainerEngine:
        if not isinstance(source, ShardedSource):
            raise TypeError(
                "the meshlayout backend sends the trainer's shards as they are: pass "
                f"source=meshlayout.vllm.ShardedSource(model), got {type(source).__name__}"
            )
        client = _as_client(client)
        info = init_info
        td = timedelta(seconds=info.timeout_s)
        store = open_store(info.master_address, info.master_port, info.rank == 0, td)
        future: Future[Any] | None = None
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            if info.rank == 0:
                worker_info = MeshlayoutWorkerInitInfo(
                    master_address=info.master_address,
                    master_port=info.master_port,
                    trainer_world_size=info.world_size,
                    bucket_bytes=info.bucket_bytes,
                    verify=info.verify,
                    timeout_s=info.timeout_s,
                )
                future = pool.submit(client.init_weight_transfer_engine, asdict(worker_info))
            engines = int(_wait(store, ENGINE_WORLD_KEY, td, future, "no vLLM worker joined"))
            sg = sync_group(
                info.master_address,
                info.master_port,
                info.rank,
                info.world_size + engines,
                timeout=td,
                store=store,
            )
            if future is not None:
                future.result(timeout=info.timeout_s)
        finally:
            pool.shutdown(wait=False)
        return cls(client=client, source=source, is_sender=info.is_sender, info=info, sg=sg)

    def send_weights(self) -> None:
        assert isinstance(self.source, ShardedSource)
        sg, info = self.sg, self.info
        n = self.updates
        self.updates += 1
        t0 = time.perf_counter()
        tensors = self.source.tensors()
        manifest = _session.manifest_of(tensors)
        pool = ThreadPoolExecutor(max_workers=1)
        future: Future[Any] | None = None
        stats: dict[str, Any] = {}
        try:
            if self.is_sender:
                _session.post_manifest(sg, n, manifest)
                self.client.start_weight_update()
                stats["start_s"] = time.perf_counter() - t0
                future = pool.submit(self.client.update_weights, {"update": n})
            t1 = time.perf_counter()
            try:
                layout = _session.agree(sg, n, info.world_size, manifest)
                transfers = self._transfers_for(layout, tensors)
                sent = 0
                for names, wt in transfers:
                    held = [k for k in names if wt.rank in wt.src_specs[k].mesh]
                    mine = self.source.pieces(held, sg)
                    wt.run(src_tensors=mine, verify=info.verify)
                    sent += sum(
                        s
                        for r in range(len(wt.plan.rounds))
                        for s in wt.plan.round(r).send_sizes(wt.rank)
                    )
            except BaseException:
                if future is not None:  # let the engine's side of the error arrive, bounded
                    try:
                        future.result(timeout=info.timeout_s)
                    except Exception:
                        pass
                raise
            stats["transfer_s"] = time.perf_counter() - t1
            t2 = time.perf_counter()
            if future is not None:
                future.result(timeout=info.timeout_s)
                stats["update_rpc_s"] = time.perf_counter() - t2
                t3 = time.perf_counter()
                self.client.finish_weight_update()
                stats["finish_s"] = time.perf_counter() - t3
        finally:
            pool.shutdown(wait=False)
        stats["total_s"] = time.perf_counter() - t0
        stats["bytes_sent"] = sent
        stats["fallback"] = dict(layout.fallback)
        stats["verified"] = bool(info.verify)
        if layout.fallback and self.is_sender:
            log.warning(
                "meshlayout: %d tensors fall back to vLLM's load_weights: %s",
                len(layout.fallback),
                sorted(layout.fallback)[:20],
            )
        self.last_stats = stats

    def _transfers_for(
        self, layout: _session.Layout, tensors: dict[str, Any]
    ) -> list[tuple[list[str], WeightTransfer]]:
        if self._transfers is not None and self._transfers[0] == layout.digest:
            return self._transfers[1]
        assert isinstance(self.source, ShardedSource)
        source, sg = self.source, self.sg
        built = _session.transfers(
            layout,
            sg,
            self.info.bucket_bytes,
            self._buffers,
            lambda names: source.sources(names, sg) or None,
            lambda names: None,
        )
        self._transfers = (layout.digest, built)
        return built

    def shutdown(self) -> None:
        try:
            if self.is_sender:
                close = getattr(self.client, "shutdown_weight_transfer_engine", None)
                if callable(close):
                    try:
                        close()
                    except Exception as exc:  # the engine may be gone: still leave the group
                        log.warning("meshlayout: the engine did not close the session: %s", exc)
        finally:
            self._transfers = None
            self.sg.destroy()


def _wait(store: Any, key: str, td: timedelta, future: Future[Any] | None, what: str) -> str:
    """Wait for ``key``, failing early if the engine's init RPC failed."""
    from ..torch import RankTimeoutError

    deadline = time.monotonic() + td.total_seconds()
    while True:
        if future is not None and future.done():
            future.result()  # raises the engine's error
        try:
            store.wait([key], timedelta(seconds=min(1.0, max(deadline - time.monotonic(), 0.01))))
            return str(store.get(key).decode())
        except Exception:
            if time.monotonic() >= deadline:
                raise RankTimeoutError(
                    f"meshlayout: {what} within {td.total_seconds():g}s (the engine must "
                    "call init_weight_transfer_engine: trainer rank 0 asks it through the client)"
                ) from None


register()  # a trainer process loads no vLLM plugins: importing this side registers it
