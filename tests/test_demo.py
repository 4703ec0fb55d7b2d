"""`meshlayout demo`: the real multi-process TP + FSDP2 run, its checks and its errors.

Most runs here are started from *this* process after it has used torch on purpose
(intra-op threads, a TCPStore, a default gloo process group and a thread busy with
torch ops while the workers start): a library function may be called from such a
process, and workers forked from it hang or inherit its process group.
"""

from __future__ import annotations

import io
import pathlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist

from meshlayout import demo
from meshlayout.cli import main
from meshlayout.demo import config as demo_config
from meshlayout.demo import parent as demo_parent
from torch_versions import dcp_overlap_refusal

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(600)]

# Hang guards only, generous for a loaded 2-core machine (each worker imports torch).
DEMO_TIMEOUT = 540

SHAPES = {"0.weight": (6, 10), "0.bias": (6,), "2.weight": (10, 6), "2.bias": (10,)}
FSDP_ONLY = "(Shard(dim=0),)"  # tp=1: every parameter sharded on dim 0 of the 1-D fsdp mesh
STRIDED = "(StridedShard(dim=0, split_factor=2), Shard(dim=0))"  # FSDP over colwise TP
# The checkpoint phase's comparison of plain DCP with ours on a layout torch 2.13 gets
# wrong (tests/test_demo_checkpoint.py covers the FSDP-over-TP probe of 6 processes).
REFUSAL = dcp_overlap_refusal("w")
PROBE = {
    1: "compare  ours n/a   plain DCP n/a   an uneven sharding (needs 2 or more processes",
    2: "compare  ours PASS  plain DCP FAIL  a [_StridedShard(0, 2)] DTensor of 8 rows on the "
    f"2-rank tp mesh (rank 0 holds rows 0,1,4,5): dcp.save fails: {REFUSAL}\n",
    3: "compare  ours PASS  plain DCP FAIL  a [_StridedShard(0, 2)] DTensor of 12 rows on the "
    f"3-rank fsdp mesh (rank 0 holds rows 0,1,6,7): dcp.save fails: {REFUSAL}\n",
}
PROBE[4] = PROBE[2]


def failed_checks(text: str) -> list[str]:
    """The demo's failed checks: FAIL lines and ours failing on a compare line.

    A compare line's "plain DCP FAIL" is the expected result on torch 2.13, not a failure.
    """
    return [line for line in text.splitlines() if line.startswith("FAIL") or "ours FAIL" in line]


@pytest.fixture
def torch_already_used() -> Iterator[None]:
    """Leave this process as a training script would: torch's threads, a store, a group."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    a = torch.randn(256, 256)
    assert torch.allclose(a @ torch.eye(256), a)  # starts the intra-op thread pool
    tcp_store = dist.TCPStore  # type: ignore[attr-defined]
    server = tcp_store("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
    server.set("used", "yes")
    own_group = not dist.is_initialized()
    if own_group:
        store = dist.HashStore()  # type: ignore[attr-defined]
        dist.init_process_group(
            "gloo", store=store, rank=0, world_size=1, timeout=timedelta(seconds=30)
        )
    one = torch.ones(3)
    dist.all_reduce(one)
    assert one.tolist() == [1.0, 1.0, 1.0]

    stop = threading.Event()

    def busy() -> None:  # torch work in another thread while the demo starts its workers
        x = torch.randn(128, 128)
        while not stop.wait(0.005):
            x = torch.tanh(x @ x.T / 128)

    worker = threading.Thread(target=busy, daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()
        assert dist.is_initialized(), "the demo must leave the caller's process group alone"
        if own_group:
            dist.destroy_process_group()
        torch.set_num_threads(threads)
        del server


def test_demo_subprocess_passes_and_reports_every_check() -> None:
    argv = ["demo", "--nproc", "4", "--steps", "3", "--timeout", str(DEMO_TIMEOUT)]
    out = subprocess.run(
        [sys.executable, "-m", "meshlayout.cli", *argv],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT + 30,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "== plan ==" in text and "fsdp" in text
    assert "TP=2 x FSDP=2 on 4 gloo processes" in text
    assert "4 worker interpreters joined the gloo group" in text
    assert text.count(" ok\n") == 3  # one line per step, each matching the reference
    assert "PASS losses match the single-process run (3/3 steps" in text
    # one PASS per parameter of the 10->6->10 MLP, with our single all-gather
    for name in SHAPES:
        assert f"PASS full_tensor({name})" in text
    assert "StridedShard(dim=0, split_factor=2), Shard(dim=0)" in text  # FSDP over TP
    assert "collectives ours 1, torch 2" in text  # the strided FSDP+TP weight
    # the checkpoint: exact with our planners on (fsdp=4) and as plain tensors in the parent
    assert (
        "PASS saved the trained model with ExactSavePlanner on 4 processes, FSDP over TP "
        "(fsdp=2, tp=2): 4 tensors in 14 chunks, every tensor tiles exactly\n"
    ) in text
    assert (
        "PASS reloaded it with ExactLoadPlanner as FSDP alone (fsdp=4, tp=1) on the same "
        "4 processes: every parameter equals the trained one, bitwise\n"
    ) in text
    assert (
        "PASS reloaded it as plain tensors in this process (no_dist=True): every parameter "
        "equals the trained one, bitwise, and the single-process run within 1e-05\n"
    ) in text
    # plain DCP: right on the demo model at fsdp=2, wrong on the strided probe
    assert (
        "compare  ours PASS  plain DCP PASS  the demo model saved on FSDP over TP "
        "(fsdp=2, tp=2), loaded into FSDP alone (fsdp=4, tp=1) and plain tensors\n"
    ) in text
    assert PROBE[4] in text
    assert "it fails on uneven FSDP over TP from fsdp = 3 on: meshlayout demo --nproc 6" in text
    assert failed_checks(text) == [] and "demo passed" in text
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize(
    ("nproc", "layout", "expected"),
    [
        # one process: the parameters are whole on rank 0, nothing to gather
        (1, "TP=1 x FSDP=1", {name: (FSDP_ONLY, "ours 0, torch 0") for name in SHAPES}),
        # FSDP over TP on a (1, 2) mesh: TP shards, FSDP has one member
        (
            2,
            "TP=2 x FSDP=1",
            {
                "0.weight": (STRIDED, "ours 1, torch 1"),
                "0.bias": (STRIDED, "ours 1, torch 1"),
                "2.weight": ("(Shard(dim=0), Shard(dim=1))", "ours 1, torch 1"),
                "2.bias": ("(Shard(dim=0), Replicate())", "ours 0, torch 0"),
            },
        ),
        # FSDP alone over 3 ranks (tp=1): 10 rows split 4, 4, 2; one all-gather each
        (3, "TP=1 x FSDP=3", {name: (FSDP_ONLY, "ours 1, torch 1") for name in SHAPES}),
    ],
)
def test_demo_passes_for_each_nproc_from_a_process_that_used_torch(
    nproc: int,
    layout: str,
    expected: dict[str, tuple[str, str]],
    torch_already_used: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["demo", "--nproc", str(nproc), "--steps", "2", "--timeout", str(DEMO_TIMEOUT)]
    assert main(argv) == 0, capsys.readouterr().out
    text = capsys.readouterr().out
    assert f"{layout} on {nproc} gloo processes" in text
    assert f"{nproc} worker interpreters joined the gloo group" in text
    assert text.count(" ok\n") == 2
    assert "PASS losses match the single-process run (2/2 steps" in text
    for name, (placements, collectives) in expected.items():
        assert (
            f"PASS full_tensor({name}) {SHAPES[name]} {placements}: equals single-process: True, "
            f"equals torch's DTensor.full_tensor(): True; collectives {collectives}\n"
        ) in text
    assert "PASS reloaded it as plain tensors in this process (no_dist=True)" in text
    assert ("PASS reloaded it with ExactLoadPlanner" in text) == (nproc > 1)
    assert PROBE[nproc] in text
    assert failed_checks(text) == [] and "demo passed" in text


def test_demo_fails_with_nonzero_status_when_a_check_fails(
    monkeypatch: pytest.MonkeyPatch, torch_already_used: None
) -> None:
    # A negative tolerance makes every loss comparison fail. The comparison runs in
    # this (calling) process, so the monkeypatch reaches it although the workers are
    # fresh interpreters that never see it: the demo must say so.
    monkeypatch.setattr(demo_config, "LOSS_TOLERANCE", -1.0)
    buf = io.StringIO()
    code = demo.run_demo(demo.DemoConfig(nproc=2, steps=2, timeout=DEMO_TIMEOUT), out=buf)
    text = buf.getvalue()
    assert code == 1, text
    assert text.count(" MISMATCH\n") == 2  # the workers ran every step...
    assert "FAIL losses match the single-process run (2/2 steps" in text  # ...and the check failed
    for name in SHAPES:  # the parameter checks do not use LOSS_TOLERANCE
        assert f"PASS full_tensor({name})" in text
    assert "demo FAILED" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["demo", "--nproc", "0"], "nproc must be an int in [1, 8], got 0"),
        (["demo", "--nproc", "9"], "nproc must be an int in [1, 8], got 9"),
        (["demo", "--nproc", "-1"], "nproc must be an int in [1, 8], got -1"),
        (["demo", "--steps", "0"], "steps must be a positive int, got 0"),
        (["demo", "--nproc", "5"], "nproc=5 does not split the batch"),
        (["demo", "--nproc", "7"], "nproc=7 does not split the batch"),
        (["demo", "--timeout", "-1"], "timeout must be a finite number of seconds"),
        (["demo", "--timeout", "0"], "got 0.0"),
        (["demo", "--timeout", "-0"], "got -0.0"),
        (["demo", "--timeout", "nan"], "got nan"),
        (["demo", "--timeout", "inf"], "got inf"),
        (["demo", "--timeout=-inf"], "got -inf"),
        (["demo", "--timeout", "-inf"], "argument --timeout"),  # argparse: not a number
        (["demo", "--timeout", "1e300"], "got 1e+300"),
        (["demo", "--timeout", "86401"], "in (0, 86400], got 86401.0"),
    ],
)
def test_demo_bad_arguments_exit_2_with_one_line_before_any_process_starts(
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[object] = []

    def run_demo(*args: object, **kwargs: object) -> int:
        started.append(args)
        return 0

    monkeypatch.setattr(demo, "run_demo", run_demo)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert len(captured.err.strip().splitlines()) == 1
    assert "Traceback" not in captured.err + captured.out
    assert started == []


@pytest.mark.parametrize("timeout", [-1.0, 0, 0.0, -0.0, float("nan"), float("inf"), -float("inf")])
def test_demo_config_rejects_timeouts_that_are_not_finite_and_positive(timeout: float) -> None:
    with pytest.raises(ValueError, match=r"timeout must be a finite number of seconds") as info:
        demo.DemoConfig(timeout=timeout)
    assert repr(timeout) in str(info.value)


@pytest.mark.parametrize("timeout", [1e-3, 1, 2.5, 120.0, demo_config.MAX_TIMEOUT])
def test_demo_config_accepts_positive_finite_timeouts(timeout: float) -> None:
    assert demo.DemoConfig(timeout=timeout).timeout == timeout


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("nproc", True),
        ("nproc", 2.0),
        ("nproc", "2"),
        ("steps", False),
        ("steps", 1.5),
        ("timeout", True),
        ("timeout", "10"),
        ("timeout", None),
    ],
)
def test_demo_config_rejects_wrong_types(field: str, value: object) -> None:
    with pytest.raises(TypeError, match=f"{field} must be .*got {value!r}"):
        demo.DemoConfig(**{field: value})  # type: ignore[arg-type]


def test_demo_accepts_exactly_the_nproc_that_split_the_batch() -> None:
    # 24 samples over nproc / tp batch groups (tp = 2 when nproc is even): 5 and 7 do not split.
    accepted = []
    for nproc in range(-2, 12):
        try:
            demo.DemoConfig(nproc=nproc)
        except ValueError:
            continue
        accepted.append(nproc)
    assert accepted == [1, 2, 3, 4, 6, 8]


def test_demo_plan_uses_tp_when_even() -> None:
    assert demo.demo_parallel_dims(4).degrees["tp"] == 2
    assert demo.demo_parallel_dims(3).degrees["tp"] == 1
    assert demo.demo_parallel_dims(8).mesh("fsdp").size() == 4


def test_demo_runs_from_a_script_without_a_main_guard(tmp_path: pathlib.Path) -> None:
    # multiprocessing's spawn and forkserver re-run the caller's main script in every
    # child, which fails (or recurses) without an `if __name__ == "__main__"` guard;
    # the demo's workers are plain interpreters that never import the caller's script.
    script = tmp_path / "no_guard.py"
    script.write_text(
        "import sys, torch\n"
        "from meshlayout.demo import DemoConfig, run_demo\n"
        "torch.set_num_threads(2)\n"
        "x = torch.randn(200, 200) @ torch.randn(200, 200)  # torch used first\n"
        "print('script body ran')\n"
        f"sys.exit(run_demo(DemoConfig(nproc=1, steps=1, timeout={DEMO_TIMEOUT})))\n"
    )
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=DEMO_TIMEOUT + 30
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("script body ran") == 1
    assert "1 worker interpreters joined the gloo group" in out.stdout
    assert "demo passed" in out.stdout and "FAIL" not in out.stdout
    assert "Traceback" not in out.stderr


def test_demo_reports_a_worker_that_dies_with_its_status_and_stderr(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker whose interpreter cannot start (here: a wrong -c program) is reported by
    # rank, exit status and the end of its stderr, without waiting for the timeout.
    monkeypatch.setattr(demo_parent, "_WORKER_CODE", "import sys; sys.exit('worker says no')")
    buf = io.StringIO()
    code = demo.run_demo(demo.DemoConfig(nproc=2, steps=1, timeout=600), out=buf)
    text = buf.getvalue()
    assert code == 1, text
    assert "exited with status 1 before finishing" in text
    assert "worker says no" in text
    assert "timed out" not in text
    assert "demo FAILED" in text
