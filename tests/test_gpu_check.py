"""``benchmarks/gpu_check.py`` (``make gpu-check``) runs on the CPU too, so it cannot rot.

On a GPU machine it checks meshlayout's torch layer on CUDA with NCCL; here the same
script runs with ``--device cpu --small`` (gloo, world size 1) in a fresh interpreter
with meshlayout from ``src`` (as ``make gpu-check`` runs it), and every check must pass.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")

pytestmark = [pytest.mark.torch]

ROOT = Path(__file__).resolve().parent.parent
CHECKS = [
    "init",
    "groups",
    "mesh",
    "fsdp2+dcp",
    "safetensors",
    "transfer",
    "pack/unpack",
    "throughput",
]


def test_the_gpu_check_passes_on_the_cpu() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        # --time-limit: a hang guard only (the script's default, 280 s, is for a GPU run)
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_check.py"),
            *("--device", "cpu", "--small", "--time-limit", "1800"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = dict(re.findall(r"^\| ([a-z0-9+/]+) \| (PASS|FAIL) \|", out.stdout, re.M))
    assert rows == {name: "PASS" for name in CHECKS}, out.stdout
    assert f"all {len(CHECKS)} checks passed" in out.stdout
    assert f"meshlayout from {ROOT / 'src' / 'meshlayout'}" in out.stdout
    table = [
        line for line in out.stdout.splitlines() if line.startswith("| ") and "x memcpy" not in line
    ]
    for op in (
        "device memcpy",
        "fingerprint, destination",
        "fingerprint, source",
        "cast fp32",
        "pack, fp32",
        "unpack, bf16",
    ):
        assert any(line.startswith(f"| {op}") for line in table), op


def test_without_cuda_the_default_device_exits_2_naming_the_fix() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 2
    assert "no CUDA device here; run with --device cpu" in out.stderr
