"""The ``vllm.general_plugins`` entry point: registers the "meshlayout" backend.

vLLM calls every general plugin in each of its processes (the API server, the engine
core, every worker), so ``weight_transfer_config={"backend": "meshlayout"}`` finds the
engine wherever vLLM looks it up. Registration is lazy (module paths): nothing of
meshlayout's torch runtime is imported until the backend is used.
"""

from __future__ import annotations

__all__ = ["register"]

BACKEND = "meshlayout"


def register() -> None:
    """Register "meshlayout" in vLLM's worker and trainer factories (idempotent)."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(
            BACKEND, "meshlayout.vllm._worker", "MeshlayoutWeightTransferEngine"
        )
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(
            BACKEND, "meshlayout.vllm._trainer", "MeshlayoutTrainerEngine"
        )
