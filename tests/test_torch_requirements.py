"""meshlayout.torch explains a missing or too old torch instead of failing obscurely."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshlayout.torch._requirements import parse_version

pytest.importorskip("torch")


def test_parse_version() -> None:
    assert parse_version("2.13.0+cpu") == (2, 13)
    assert parse_version("3.0.1") == (3, 0)
    with pytest.raises(ValueError, match="cannot read a torch version"):
        parse_version("nightly")


def _import_with(setup: str) -> subprocess.CompletedProcess[str]:
    code = setup + "\nimport meshlayout.torch\n"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_missing_torch_names_the_extra() -> None:
    out = _import_with("import sys; sys.modules['torch'] = None")
    assert out.returncode != 0
    assert "pip install 'meshlayout[torch]'" in out.stderr


def test_old_torch_is_refused_naming_the_version_and_the_fix() -> None:
    out = _import_with("import torch; torch.__version__ = '2.9.1+cu128'")
    assert out.returncode != 0
    assert "ImportError: meshlayout.torch needs PyTorch >= 2.10" in out.stderr
    assert "found 2.9.1+cu128" in out.stderr
    assert "pip install 'torch>=2.10'" in out.stderr


@pytest.mark.parametrize("version", ["2.10.0", "2.12.1", "2.15.0", "3.0.0"])
def test_supported_torch_is_accepted(version: str) -> None:
    out = _import_with(f"import torch; torch.__version__ = {version!r}")
    assert out.returncode == 0, out.stderr


_HIDE_TORCHTITAN = (
    "import importlib.util as u; real = u.find_spec; "
    "u.find_spec = lambda n, *a: None if n == 'torchtitan' else real(n, *a)"
)


def _import_torchtitan_dropin(
    version: str, hide_torchtitan: bool
) -> subprocess.CompletedProcess[str]:
    """``import meshlayout.torch.torchtitan`` in a fresh interpreter whose torch reports
    ``version`` (and, with ``hide_torchtitan``, where torchtitan cannot be found)."""
    setup = f"{_HIDE_TORCHTITAN if hide_torchtitan else ''}\nimport torch; torch.__version__ = {version!r}"
    return subprocess.run(
        [sys.executable, "-c", setup + "\nimport meshlayout.torch.torchtitan\n"],
        capture_output=True,
        text=True,
    )


@pytest.mark.parametrize("version", ["2.10.0", "2.11.0", "2.12.1"])
@pytest.mark.parametrize("hidden", [True, False])
def test_torchtitan_on_a_torch_before_2_13_is_refused_naming_why(
    version: str, hidden: bool
) -> None:
    out = _import_torchtitan_dropin(version, hide_torchtitan=hidden)
    assert out.returncode != 0
    assert "needs torchtitan 0.3.0 on torch >= 2.13" in out.stderr
    assert "DataParallelMeshDims" in out.stderr
    assert f"found {version}: upgrade torch" in out.stderr


def test_missing_torchtitan_names_the_extra() -> None:
    out = _import_torchtitan_dropin("2.13.0", hide_torchtitan=True)
    assert out.returncode != 0
    assert "ImportError: meshlayout.torch.torchtitan needs torchtitan 0.3.0" in out.stderr
    assert "pip install 'meshlayout[torchtitan]'" in out.stderr
    assert "torch >= 2.13" not in out.stderr
