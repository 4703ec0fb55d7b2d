"""The demo's training script under torchrun: one host, and two "hosts" on loopback.

Runs the exact commands shown in ``docs/runtime.md`` (a test checks they are there):
``torchrun --standalone`` with 4 workers, then two ``torchrun --nnodes 2`` agents of
2 workers each meeting at a c10d rendezvous on 127.0.0.1 (never more than 4 workers
at a time). Each run must exit 0 on every agent, print the host report that
``meshlayout.torch.build`` derives from torchrun's environment and checks through
the store, and print losses equal to a single-process run of the same model on the
same data, computed here. Subprocess timeouts are hang guards, not speed checks.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from meshlayout.demo import model as demo_model
from meshlayout.demo import train as demo_train

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
STEPS = 2
#: Hang guard for one launch (both agents, worker start-up on a loaded 2-core machine).
HANG_GUARD = 900
#: The commands of docs/runtime.md; ``$PORT`` is a free port chosen at run time.
STANDALONE = (
    f"torchrun --standalone --nproc-per-node 4 -m meshlayout.demo.train --steps {STEPS} "
    "--timeout 300"
)
TWO_HOSTS = (
    "torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d "
    "--rdzv-endpoint 127.0.0.1:$PORT --rdzv-id meshlayout-demo "
    f"-m meshlayout.demo.train --steps {STEPS} --timeout 300"
)
STEP_LINE = re.compile(r"^step +(\d+)/(\d+) \[[#.]+\] loss (\S+)  single-process (\S+)  ok$", re.M)


def _torchrun() -> list[str]:
    """This interpreter's ``torchrun`` (the console script beside it, else its module)."""
    script = Path(sys.executable).with_name("torchrun")
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


def _argv(command: str, port: int = 0) -> list[str]:
    words = command.replace("$PORT", str(port)).split()
    assert words[0] == "torchrun"
    return _torchrun() + words[1:]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "PET_"))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK"):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"  # what torchrun would set, without its notice
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM each agent (torchrun then stops its workers, which run in sessions of their
    own), SIGKILL its process group if it is still there a minute later."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _launch(*argvs: list[str]) -> list[tuple[int, str, str]]:
    """Start every agent at once; (exit status, stdout, stderr) of each; kill all on a hang.

    Output goes to files, not pipes: an agent never blocks on a full pipe while the
    test waits for another one.
    """
    with tempfile.TemporaryDirectory(prefix="meshlayout-torchrun-") as tmp:
        files = [
            (open(Path(tmp) / f"{i}.out", "w+"), open(Path(tmp) / f"{i}.err", "w+"))
            for i in range(len(argvs))
        ]
        procs = [
            subprocess.Popen(
                argv,
                cwd=ROOT,
                env=_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                text=True,
                start_new_session=True,  # its own process group, for the hang guard (_stop)
            )
            for argv, (out, err) in zip(argvs, files)
        ]
        deadline = time.monotonic() + HANG_GUARD
        hung = False
        try:
            for proc in procs:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung = True
            _stop(procs)
        results = []
        for proc, (out, err) in zip(procs, files):
            out.seek(0)
            err.seek(0)
            results.append((proc.returncode, out.read(), err.read()))
            out.close()
            err.close()
    if hung:
        tails = [err[-3000:] for _, _, err in results]
        pytest.fail(f"torchrun did not finish within the {HANG_GUARD} s hang guard: {tails}")
    return results


@pytest.fixture(scope="module")
def reference_losses() -> list[float]:
    losses, _ = demo_model.reference(STEPS)
    return losses


def _check_losses(out: str, reference: list[float]) -> None:
    steps = STEP_LINE.findall(out)
    assert [(int(s), int(n)) for s, n, _, _ in steps] == [(s + 1, STEPS) for s in range(STEPS)]
    for (_, _, value, printed_ref), ref in zip(steps, reference):
        assert float(printed_ref) == pytest.approx(ref, abs=1e-6)  # the script's reference
        assert float(value) == pytest.approx(ref, rel=1e-5, abs=2e-6)  # torchrun's training


def _check_passed(out: str, world: int) -> None:
    assert "PASS losses match the single-process run" in out
    assert out.count("PASS full_tensor(") == 4
    assert "FAIL" not in out
    assert f"demo.train passed on {world} processes" in out


def _without_exit_barrier_log(err: str) -> str:
    """``err`` without the lines torchrun's agents log about their own exit barrier.

    After every worker finished, the two agents meet once more in an exit barrier
    over the rendezvous store; when the agent hosting that store leaves first, the
    other logs "Error waiting on exit barrier" with a traceback and still exits 0
    (torch's elastic agent, ``_exit_barrier``: a race between the agents, seen here
    under load). Those lines carry the agent module's location; workers' own output
    does not.
    """
    return "\n".join(
        line for line in err.splitlines() if "elastic/agent/server/api.py:" not in line
    )


def _without_gloo_log(out: str) -> str:
    """``out`` without gloo's own connection lines: torch 2.10's gloo prints "[Gloo]
    Rank N is connected to K peer ranks ..." on stdout of every process that joins a
    group (also on the agent whose workers print nothing else)."""
    return "\n".join(line for line in out.splitlines() if not line.startswith("[Gloo] Rank "))


def test_standalone_one_host(reference_losses: list[float]) -> None:
    [(code, out, err)] = _launch(_argv(STANDALONE))
    assert code == 0, out + err[-3000:]
    assert "TP=2 x FSDP=2 on 4 torchrun processes" in out
    assert (
        "hosts: 1 x 4 ranks (torchrun: LOCAL_WORLD_SIZE=4); "
        "checked: every rank of a host reports the same node"
    ) in out
    assert (
        "\ntp: every group in one host\nfsdp: every group in one host\n"
        "batch: every group in one host\n"
    ) in out
    _check_losses(out, reference_losses)
    _check_passed(out, 4)
    assert "Traceback" not in err and "HostLayoutWarning" not in err


def test_two_hosts_on_loopback(reference_losses: list[float]) -> None:
    argv = _argv(TWO_HOSTS, _free_port())
    agents = _launch(argv, argv)
    for code, out, err in agents:
        assert code == 0, out + err[-3000:]
        ours = _without_exit_barrier_log(err)
        assert "Traceback" not in ours and "HostLayoutWarning" not in ours, ours[-3000:]
    # rank 0 lives on whichever agent the rendezvous made node 0: it alone prints
    printed = [out for _, out, _ in agents if _without_gloo_log(out).strip()]
    assert len(printed) == 1, agents
    out = printed[0]
    assert (
        "hosts: 2 x 2 ranks (torchrun: LOCAL_WORLD_SIZE=2); "
        "checked: every rank of a host reports the same node"
    ) in out
    assert "\ntp: every group in one host\n" in out  # tp = (0, 1), (2, 3): inside each agent
    assert "\nfsdp: 2/2 groups span 2 hosts\n" in out
    assert "\nbatch: 2/2 groups span 2 hosts\n" in out
    _check_losses(out, reference_losses)
    _check_passed(out, 4)


def test_docs_show_the_commands_this_test_runs() -> None:
    text = (ROOT / "docs" / "runtime.md").read_text()
    flat = re.sub(r"\s*\\\n\s*", " ", text)  # join lines continued with a backslash
    assert STANDALONE in flat
    assert TWO_HOSTS in flat


# ---------------------------------------------------------------------- failures


def test_a_failed_check_exits_1() -> None:
    # One worker (RANK/WORLD_SIZE as torchrun sets them) with a tolerance no loss meets.
    env = _env()
    env.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    code = (
        "import sys, meshlayout.demo.config as config\n"
        "config.LOSS_TOLERANCE = -1.0\n"
        "from meshlayout.demo.train import main\n"
        "sys.exit(main(['--steps', '1', '--timeout', '300']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HANG_GUARD,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "step   1/1" in proc.stdout and "MISMATCH" in proc.stdout
    assert "FAIL losses match the single-process run (1/1 steps" in proc.stdout
    assert "demo.train FAILED on 1 processes" in proc.stdout
    assert "hosts: unknown" in proc.stdout  # not torchrun: no LOCAL_WORLD_SIZE / GROUP_RANK


def test_outside_torchrun_exits_2_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert demo_train.main(["--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT unset: launch with torchrun" in err


@pytest.mark.parametrize(
    ("env", "argv", "message"),
    [
        ({"WORLD_SIZE": "5"}, [], "nproc=5 does not split the batch"),
        ({"WORLD_SIZE": "four"}, [], "WORLD_SIZE='four' is not an integer"),
        ({}, ["--steps", "0"], "steps must be a positive int, got 0"),
        ({}, ["--timeout", "nan"], "timeout must be a finite number of seconds"),
    ],
)
def test_bad_settings_exit_2_before_joining_the_group(
    env: dict[str, str],
    argv: list[str],
    message: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = {"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    for name, value in {**base, **env}.items():
        monkeypatch.setenv(name, value)
    assert demo_train.main(argv) == 2  # port 1 is never contacted: it fails before
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
