"""`meshlayout demo`: the real multi-process TP + FSDP2 run, its checks and its errors."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from meshlayout import demo
from meshlayout.cli import main

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(180)]


def test_demo_subprocess_passes_and_reports_every_check() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "meshlayout.cli", "demo", "--nproc", "4", "--steps", "3"],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "== plan ==" in text and "fsdp" in text
    assert text.count(" ok\n") == 3  # one line per step, each matching the reference
    assert "PASS losses match the single-process run (3/3 steps" in text
    # one PASS per parameter of the 10->6->10 MLP, with our single all-gather
    for name in ("0.weight", "0.bias", "2.weight", "2.bias"):
        assert f"PASS full_tensor({name})" in text
    assert "collectives ours 1, torch 2" in text  # the strided FSDP+TP weight
    assert "FAIL" not in text and "demo passed" in text
    assert "Traceback" not in out.stderr


def test_demo_fails_with_nonzero_status_when_a_check_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A negative tolerance makes every loss comparison fail: the demo must say so.
    monkeypatch.setattr(demo, "LOSS_TOLERANCE", -1.0)
    buf = io.StringIO()
    code = demo.run_demo(demo.DemoConfig(nproc=2, steps=2), out=buf)
    assert code == 1
    assert "FAIL losses match" in buf.getvalue()
    assert "demo FAILED" in buf.getvalue()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--nproc", "0"], "nproc must be an int in [1, 8]"),
        (["demo", "--nproc", "9"], "nproc must be an int in [1, 8]"),
        (["demo", "--steps", "0"], "steps must be a positive int"),
        (["demo", "--nproc", "5"], "does not split the batch"),
    ],
)
def test_demo_bad_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_demo_plan_uses_tp_when_even() -> None:
    assert demo.demo_parallel_dims(4).degrees["tp"] == 2
    assert demo.demo_parallel_dims(3).degrees["tp"] == 1
    assert demo.demo_parallel_dims(8).mesh("fsdp").size() == 4
