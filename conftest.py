"""Repository-wide collection rules.

The vLLM backend's modules import vLLM, which lives in its own venv (``.venv-vllm``);
where vLLM is absent their doctests are not collected (``meshlayout.vllm`` itself
imports no vLLM and is still doctested).
"""

from __future__ import annotations

import importlib.util

_IMPORT_VLLM = ["_compat.py", "_source.py", "_trainer.py", "_worker.py"]  # at module level
collect_ignore = (
    [] if importlib.util.find_spec("vllm") else [f"src/meshlayout/vllm/{m}" for m in _IMPORT_VLLM]
)
