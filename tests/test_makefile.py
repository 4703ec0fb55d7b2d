"""``make demo`` installs what the demo needs, ``make test`` the development stack, in
either order (issue 24 item 11). Asked of make itself (``make -n``: what it would run)
in a copy of the Makefile, with the venv's stamp files standing in for installs; the
installs themselves were checked by hand on fresh clones (sizes in the README)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEV = '".[dev,torch,megatron,torchtitan,transformers]"'

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    return tmp_path


def _would_run(project: Path, target: str) -> list[str]:
    done = subprocess.run(
        ["make", "-n", target], cwd=project, capture_output=True, text=True, check=True
    )
    return done.stdout.splitlines()


def _installs(lines: list[str]) -> list[str]:
    """The installs into the development venv (.venv; the vLLM tests' venv is another)."""
    return [
        line
        for line in lines
        if line.startswith(".venv/bin/") and "pip install" in line and "--upgrade pip" not in line
    ]


def _installed(project: Path, *stamps: str) -> None:
    """Stamp files as the recipes leave them: newer than pyproject.toml."""
    (project / ".venv").mkdir(exist_ok=True)
    later = time.time() + 5
    for stamp in stamps:
        (project / ".venv" / stamp).touch()
        os.utime(project / ".venv" / stamp, (later, later))


def test_demo_on_a_fresh_clone_installs_only_the_torch_extra(project: Path) -> None:
    installs = _installs(_would_run(project, "demo"))
    assert installs == [
        '.venv/bin/python -m pip install --quiet "torch==2.13.0"',
        '.venv/bin/python -m pip install --quiet -e ".[torch]" "torch==2.13.0"',
    ]


def test_test_on_a_fresh_clone_installs_the_development_stack(project: Path) -> None:
    installs = _installs(_would_run(project, "test"))
    assert len(installs) == 2 and DEV in installs[1] and "torch==2.13.0" in installs[1]


def test_demo_then_test_adds_the_development_stack(project: Path) -> None:
    _installed(project, ".installed-demo")
    assert _installs(_would_run(project, "demo")) == []
    installs = _installs(_would_run(project, "test"))
    assert len(installs) == 2 and DEV in installs[1]


def test_test_then_demo_installs_nothing_more(project: Path) -> None:
    _installed(project, ".installed", ".installed-demo")  # the dev recipe stamps both
    assert _installs(_would_run(project, "demo")) == []
    assert _installs(_would_run(project, "test")) == []
    recipe = _would_run(project, "-B")  # the default target forced: the dev set-up
    assert any(line.startswith("touch .venv/.installed .venv/.installed-demo") for line in recipe)
