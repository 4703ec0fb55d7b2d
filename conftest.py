"""Repository-wide collection rules.

The vLLM backend's modules import vLLM, which lives in its own venv (``.venv-vllm``);
where vLLM is absent their doctests are not collected (``meshlayout.vllm`` itself
imports no vLLM and is still doctested).
"""

from __future__ import annotations

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("vllm") else ["src/meshlayout/vllm/_*.py"]
