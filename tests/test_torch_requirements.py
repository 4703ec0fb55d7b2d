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


def test_old_torch_is_refused() -> None:
    out = _import_with("import torch; torch.__version__ = '2.12.1'")
    assert out.returncode != 0
    assert "needs PyTorch >= 2.13, found 2.12.1" in out.stderr
