"""Checkpoints whose ``.metadata`` torch 2.15 wrote are inspected and exported under any
supported torch.

torch 2.15's ``TensorProperties`` pickles six fields (it added ``strides``); torch 2.10
to 2.14 unpickle exactly five, so their own reader fails on such a file. meshlayout's
restricted unpickler reads both. Here:

* a checkpoint saved by the installed torch gets its ``.metadata`` rewritten as torch
  2.15 writes it (``dcp_torch215.metadata_as_torch_215``); torch's own reader refuses
  it (below 2.15, and ``meshlayout.torch.checkpoint.load``, which uses it, says what
  to do instead), ``meshlayout checkpoint`` describes and verifies it and exports it to
  safetensors bitwise;
* on torch 2.15 (``make test-torch TORCH=2.15.0``) those bytes are checked against
  what torch 2.15 itself writes, byte for byte;
* when ``.venv-torch-2.15.0`` exists (``make test-torch TORCH=2.15.0`` creates it), a
  checkpoint that torch 2.15 wrote in that venv is read and exported here.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import torch.distributed.checkpoint as dcp  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402

from dcp_torch215 import metadata_as_torch_215, sample_tensors, strides_of  # noqa: E402
from meshlayout.cli import main  # noqa: E402
from meshlayout.torch.checkpoint import read_metadata  # noqa: E402
from test_export_safetensors import assert_bitwise, read_all  # noqa: E402
from torch_versions import TORCH  # noqa: E402

pytestmark = [pytest.mark.torch]

ROOT = Path(__file__).resolve().parent.parent
TORCH_215_PYTHON = Path(
    os.environ.get("MESHLAYOUT_TORCH215_PYTHON", ROOT / ".venv-torch-2.15.0" / "bin" / "python")
)


def _save(root: Path, tensors: dict[str, Any]) -> None:
    dcp.save({**tensors, "step": 7, "opt": {"lr": 0.1}}, checkpoint_id=str(root), no_dist=True)


@pytest.fixture(scope="module")
def as_215(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of :func:`sample_tensors` saved here, its ``.metadata`` as 2.15 writes it."""
    root = tmp_path_factory.mktemp("as215") / "ckpt"
    tensors = sample_tensors()
    _save(root, tensors)
    md = FileSystemReader(str(root)).read_metadata()
    (root / ".metadata").write_bytes(metadata_as_torch_215(md, strides_of(tensors)))
    return root


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    out, _ = capsys.readouterr()
    return code, out


def _inspect_and_export(root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Any:
    """``meshlayout checkpoint --verify`` and ``checkpoint export`` of ``root``; the export."""
    code, out = _cli(["checkpoint", str(root), "--verify", "--format", "json"], capsys)
    report = json.loads(out)
    assert code == 0 and report["ok"], out
    entries = {e["name"]: e for e in report["tensors"]}
    assert set(entries) == set(sample_tensors())
    assert all(e["exact"] and e["holes"] == [] and e["overlaps"] == [] for e in entries.values())
    assert entries["i.bf16"]["dtype"] == "bfloat16" and entries["i.bf16"]["shape"] == [9, 10]
    code, out = _cli(["checkpoint", str(root)], capsys)
    assert code == 0 and "exact: all 10 tensors tile exactly" in out, out
    out_dir = tmp_path / "hf"
    code, out = _cli(["checkpoint", "export", str(root), str(out_dir)], capsys)
    assert code == 0, out
    return read_all(out_dir)


@pytest.mark.skipif(
    TORCH is not None and TORCH >= (2, 15), reason="torch 2.15 and newer read six fields"
)
def test_torch_before_215_cannot_read_it_itself(as_215: Path) -> None:
    """The files here are what makes older torch fail (so the tests below mean something)."""
    with pytest.raises(ValueError, match="too many values to unpack"):
        FileSystemReader(str(as_215)).read_metadata()


@pytest.mark.skipif(
    TORCH is not None and TORCH >= (2, 15), reason="torch 2.15 and newer read six fields"
)
def test_loading_it_with_dcp_here_names_the_fix(as_215: Path) -> None:
    """``load`` uses DCP's own reader, which cannot read it: a ValueError says what works."""
    from meshlayout.torch.checkpoint import load

    state = {k: torch.empty_like(v) for k, v in sample_tensors().items()}
    with pytest.raises(ValueError, match=r"written by torch 2\.15 or newer .* export_safetensors"):
        load(state, as_215, no_dist=True)


def test_meshlayout_reads_the_six_fields(as_215: Path) -> None:
    from torch.distributed.checkpoint.metadata import TensorProperties, TensorStorageMetadata

    md = read_metadata(as_215)
    want = strides_of(sample_tensors())
    for name, entry in md.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            assert type(entry.properties) is TensorProperties  # the installed torch's class
            assert entry.properties.strides == want[name], name
            assert entry.properties.memory_format == torch.contiguous_format
    assert md.state_dict_metadata["g.t"].properties.strides == (1, 3)  # transposed


def test_it_is_described_verified_and_exported_bitwise(
    as_215: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_bitwise(_inspect_and_export(as_215, tmp_path, capsys), sample_tensors())


@pytest.mark.parametrize(
    ("extra", "strides", "match"),
    [
        ((0,), None, "state has 7 fields; torch up to 2.14 writes 5"),
        ((), "a", r"strides 'a' are not a tuple of ints"),
    ],
)
def test_other_states_are_refused(
    tmp_path: Path, extra: tuple[int, ...], strides: Any, match: str
) -> None:
    tensors = sample_tensors()
    _save(tmp_path, tensors)
    md = FileSystemReader(str(tmp_path)).read_metadata()
    given = {n: strides for n in tensors}
    (tmp_path / ".metadata").write_bytes(metadata_as_torch_215(md, given, extra_fields=extra))
    with pytest.raises(ValueError, match=match):
        read_metadata(tmp_path)


@pytest.mark.skipif(
    TORCH is None or TORCH < (2, 15),
    reason="compares with what torch 2.15 writes: runs under torch >= 2.15 "
    "(make test-torch TORCH=2.15.0)",
)
def test_the_bytes_equal_what_torch_215_writes(tmp_path: Path) -> None:
    tensors = sample_tensors()
    _save(tmp_path / "real", tensors)
    real = (tmp_path / "real" / ".metadata").read_bytes()
    md = pickle.loads(real)  # torch's own classes (trusted: written just now)
    assert metadata_as_torch_215(md, strides_of(tensors)) == real


_WRITE_WITH_215 = """
import sys
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from dcp_torch215 import sample_tensors
root = sys.argv[1]
tensors = sample_tensors()
dcp.save({**tensors, "step": 7, "opt": {"lr": 0.1}}, checkpoint_id=root + "/ckpt", no_dist=True)
save_file({k: v.contiguous() for k, v in tensors.items()}, root + "/reference.safetensors")
print(torch.__version__)
"""


@pytest.fixture(scope="module")
def written_by_215(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if TORCH is not None and TORCH >= (2, 15):
        pytest.skip("the installed torch is 2.15 or newer: covered by the tests above")
    if not TORCH_215_PYTHON.exists():
        pytest.skip(f"no torch 2.15 venv at {TORCH_215_PYTHON} (make test-torch TORCH=2.15.0)")
    root = tmp_path_factory.mktemp("written215")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)}
    out = subprocess.run(
        [str(TORCH_215_PYTHON), "-c", _WRITE_WITH_215, str(root)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("2.15."), out.stdout
    return root


def test_a_checkpoint_written_by_torch_215_is_exported_here(
    written_by_215: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _inspect_and_export(written_by_215 / "ckpt", tmp_path, capsys)
    reference = load_file(str(written_by_215 / "reference.safetensors"))
    assert_bitwise(got, reference)
    assert_bitwise(got, sample_tensors())  # and it is what was meant: the same on every torch
    if TORCH is not None and TORCH < (2, 15):
        with pytest.raises(ValueError, match="too many values to unpack"):
            FileSystemReader(str(written_by_215 / "ckpt")).read_metadata()
