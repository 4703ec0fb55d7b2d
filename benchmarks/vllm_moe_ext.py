"""Worker-side hooks for ``benchmarks/bench_vllm_moe.py`` (benchmark only, not the library).

Importing this module in a vLLM worker (it is the engine's ``worker_extension_cls``
module, and the functions below reach the workers through ``collective_rpc``) wraps
``meshlayout.vllm._worker.derive`` to record how long each derivation of the live model
takes (:data:`DERIVE_S`). :func:`force_fallback`, called in every trainer rank and every
worker, makes every tensor take meshlayout's per-tensor fallback (each worker receives
whole tensors and runs vLLM's ``load_weights``): the "whole tensor per worker" baseline.
"""

from __future__ import annotations

import time
from typing import Any

from meshlayout.vllm import _session, _worker

DERIVE_S: list[float] = []
_derive = _worker.derive


def _timed_derive(*args: Any, **kwargs: Any) -> Any:
    t0 = time.perf_counter()
    try:
        return _derive(*args, **kwargs)
    finally:
        DERIVE_S.append(time.perf_counter() - t0)


if getattr(_worker.derive, "__name__", "") != "_timed_derive":
    _worker.derive = _timed_derive


def _no_spec(shape: Any, runs: Any) -> None:
    return None


def force_fallback(_: Any = None) -> bool:
    """No destination spec for any tensor: every tensor falls back (here only)."""
    _session._dst_spec = _no_spec
    return True


def derive_seconds(_: Any = None) -> list[float]:
    return list(DERIVE_S)


class MoeBenchExtension:
    """The ``worker_extension_cls`` (importing this module installs the timing)."""


def moe_worker_stats(worker: Any) -> dict[str, Any]:
    """``bench_vllm.worker_stats`` plus this worker's derivation times."""
    from bench_vllm import worker_stats

    stats = worker_stats(worker)
    stats["derive_s"] = list(DERIVE_S)
    return stats
