"""Untrusted checkpoints: DCP's pickles are read with allow-list unpicklers, nothing runs.

``.metadata`` and every tensor item's ``data.pkl`` are pickles. Crafted ones (``os.system``,
``builtins.eval``, ``subprocess.Popen``, a ``__reduce__`` nested inside an otherwise valid
``Metadata``, ``operator.attrgetter``, dotted names reaching a module's globals,
protocol-0 ``GLOBAL``, persistent ids) must be refused by ``read_metadata``,
``describe_checkpoint``, ``export_safetensors`` and ``meshlayout checkpoint``, naming the
file and the forbidden global, and the payload's side effect (creating a marker
file) must not happen. Real checkpoints (plain DCP, our planners, ``async_save``, many
dtypes, non-tensor values) must read exactly as torch's own reader reads them.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import subprocess
import zipfile
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint import FileSystemReader  # noqa: E402
from torch.distributed.checkpoint.filesystem import _StorageInfo  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from meshlayout.cli import main  # noqa: E402
from meshlayout.torch.checkpoint import (  # noqa: E402
    describe_checkpoint,
    export_safetensors,
    read_metadata,
)
from multiproc import run_multiproc  # noqa: E402

pytestmark = [pytest.mark.torch]


class Reduce:
    """Pickles as ``func(*args)``."""

    def __init__(self, func: Any, *args: Any) -> None:
        self.func, self.args = func, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.func, self.args

    def __call__(self) -> None:  # pickle wants a callable; it is never called here
        raise AssertionError


def _short(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw


def call_global(module: str, name: str, arg: str) -> bytes:
    """A protocol-4 pickle calling ``module.name(arg)`` (``name`` may be dotted)."""
    return b"\x80\x04" + _short(module) + _short(name) + b"\x93" + _short(arg) + b"\x85R."


def payloads(marker: Path) -> list[tuple[str, bytes, str]]:
    """(label, pickle bytes, the global the refusal must name); each would create ``marker``."""
    touch = f"touch {marker}"
    valid = Metadata(state_dict_metadata={}, planner_data=Reduce(os.system, touch))
    import importlib
    import operator

    getter = Reduce(operator.attrgetter, "system")  # attrgetter("system")(os)(touch)

    return [
        ("os.system", pickle.dumps(Reduce(os.system, touch)), f"{os.system.__module__}.system"),
        ("posix.system", call_global("posix", "system", touch), "posix.system"),
        (
            "builtins.eval",
            pickle.dumps(Reduce(eval, f"open({str(marker)!r}, 'w')")),
            "builtins.eval",
        ),
        (
            "subprocess.Popen",
            pickle.dumps(Reduce(subprocess.Popen, ["touch", str(marker)])),
            "subprocess.Popen",
        ),
        ("nested in Metadata", pickle.dumps(valid), f"{os.system.__module__}.system"),
        (
            "operator.attrgetter",
            pickle.dumps(Reduce(Reduce(getter, Reduce(importlib.import_module, "os")), touch)),
            "operator.attrgetter",
        ),
        (
            "dotted name into a module's globals",
            call_global("torch.distributed.checkpoint.metadata", "os.system", touch),
            "torch.distributed.checkpoint.metadata.os.system",
        ),
        (
            "dotted name on an allowed class",
            call_global("torch.distributed.checkpoint.metadata", "Metadata.__init__", touch),
            "torch.distributed.checkpoint.metadata.Metadata.__init__",
        ),
        ("torch.load", call_global("torch", "load", str(marker)), "torch.load"),
        ("protocol 0 GLOBAL", f"cposix\nsystem\n(V{touch}\ntR.".encode(), "posix.system"),
        ("persistent id", b"Pmarker\n.", "persistent id"),
    ]


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "MARKER"


def _checkpoint_with_metadata(root: Path, blob: bytes) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / ".metadata").write_bytes(blob)
    return root


@pytest.mark.parametrize("index", range(11))
def test_crafted_metadata_is_refused_and_nothing_runs(
    tmp_path: Path, marker: Path, capsys: pytest.CaptureFixture[str], index: int
) -> None:
    label, blob, name = payloads(marker)[index]
    ckpt = _checkpoint_with_metadata(tmp_path / "ckpt", blob)
    for call in (
        read_metadata,
        describe_checkpoint,
        lambda p: export_safetensors(p, tmp_path / "out"),
    ):
        with pytest.raises(ValueError) as info:
            call(ckpt)
        text = str(info.value)
        assert f"{ckpt / '.metadata'}: refused to unpickle the global {name}" in text, (label, text)
        assert not marker.exists(), label
    assert not (tmp_path / "out").exists()
    code = main(["checkpoint", str(ckpt)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"refused to unpickle the global {name}" in err
    assert not marker.exists(), label


@pytest.mark.parametrize("index", [0, 1, 2, 3, 4, 5, 6, 9])
def test_the_payloads_do_run_under_plain_pickle(marker: Path, index: int) -> None:
    """The tests would prove nothing if the payloads were harmless: plain pickle runs them."""
    _, blob, _ = payloads(marker)[index]
    value = pickle.loads(blob)
    if isinstance(value, subprocess.Popen):
        value.wait(timeout=60)
    assert marker.exists()


def _archive_with(data_pkl: bytes) -> bytes:
    """A torch.save-shaped zip whose data.pkl is ``data_pkl``."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", data_pkl)
        z.writestr("archive/byteorder", "little")
        z.writestr("archive/data/0", struct.pack("<2f", 1.0, 2.0))
        z.writestr("archive/version", "3\n")
    return buf.getvalue()


def _checkpoint_with_item(root: Path, archive: bytes) -> Path:
    """A checkpoint with a valid ``.metadata`` whose tensor ``w`` (2 floats) is ``archive``."""
    root.mkdir(parents=True)
    (root / "__0_0.distcp").write_bytes(b"\0" * 7 + archive)
    md = Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(
                TensorProperties(dtype=torch.float32),
                torch.Size([2]),
                [ChunkStorageMetadata(torch.Size([0]), torch.Size([2]))],
            )
        },
        storage_data={MetadataIndex("w", [0]): _StorageInfo("__0_0.distcp", 7, len(archive))},
    )
    (root / ".metadata").write_bytes(pickle.dumps(md))
    return root


def test_a_valid_hand_made_item_exports(tmp_path: Path) -> None:
    good = io.BytesIO()
    torch.save(torch.tensor([1.0, 2.0]), good)
    ckpt = _checkpoint_with_item(tmp_path / "ckpt", good.getvalue())
    export_safetensors(ckpt, tmp_path / "out")
    from safetensors.torch import load_file

    assert torch.equal(
        load_file(str(tmp_path / "out" / "model.safetensors"))["w"], torch.tensor([1.0, 2.0])
    )


@pytest.mark.parametrize("index", [0, 2, 3, 5, 8, 9])
def test_crafted_tensor_item_is_refused_and_nothing_runs(
    tmp_path: Path, marker: Path, capsys: pytest.CaptureFixture[str], index: int
) -> None:
    label, blob, name = payloads(marker)[index]
    ckpt = _checkpoint_with_item(tmp_path / "ckpt", _archive_with(blob))
    with pytest.raises(ValueError) as info:
        export_safetensors(ckpt, tmp_path / "out")
    assert (
        "tensor 'w' chunk 0 at offsets (0,) in __0_0.distcp: refused to unpickle the global"
        in str(info.value)
    )
    assert name in str(info.value)
    assert not marker.exists() and not (tmp_path / "out").exists(), label
    report = describe_checkpoint(ckpt, verify=True)
    assert not report["ok"] and name in report["tensors"][0]["stored"][0]
    code = main(["checkpoint", "--verify", str(ckpt)])
    out, _ = capsys.readouterr()
    assert code == 1 and name in out
    assert not marker.exists(), label


def test_storage_paths_stay_inside_the_checkpoint(tmp_path: Path) -> None:
    good = io.BytesIO()
    torch.save(torch.tensor([1.0, 2.0]), good)
    ckpt = _checkpoint_with_item(tmp_path / "ckpt", good.getvalue())
    md = pickle.loads((ckpt / ".metadata").read_bytes())
    for bad in ("../secret.distcp", "/etc/passwd"):
        md.storage_data = {MetadataIndex("w", [0]): _StorageInfo(bad, 0, 10)}
        (ckpt / ".metadata").write_bytes(pickle.dumps(md))
        with pytest.raises(ValueError, match="is not inside the checkpoint"):
            export_safetensors(ckpt, tmp_path / "out")


def test_metadata_of_the_wrong_shape_is_refused(tmp_path: Path) -> None:
    cases = [
        (Metadata(state_dict_metadata={"w": "oops"}), "'w' is described by a str"),
        ([1, 2], "holds a list"),
        (
            Metadata(
                state_dict_metadata={
                    "w": TensorStorageMetadata(
                        TensorProperties(dtype=torch.float32),
                        torch.Size([2]),
                        [ChunkStorageMetadata([0.5], [2])],  # type: ignore[arg-type]
                    )
                }
            ),
            "sizes and offsets must be integers",
        ),
    ]
    for i, (value, message) in enumerate(cases):
        ckpt = _checkpoint_with_metadata(tmp_path / str(i), pickle.dumps(value))
        with pytest.raises(ValueError, match=message):
            read_metadata(ckpt)


# ---------------------------------------------------------------------- real checkpoints
def _same(ours: Metadata, torchs: Metadata) -> None:
    assert ours.state_dict_metadata == torchs.state_dict_metadata
    assert ours.storage_data == torchs.storage_data
    assert ours.planner_data == torchs.planner_data
    assert ours.version == torchs.version


def _real(rank: int, world: int, root: str) -> list[str]:
    """Checkpoints written by torch 2.13's savers in a 1-process gloo group (async_save
    needs one), with the values every test above uses."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from meshlayout.torch.checkpoint import ExactSavePlanner

    sd: dict[str, Any] = {
        "f32": torch.randn(3, 4),
        "bf16": torch.randn(2, 2).bfloat16(),
        "i64": torch.arange(5),
        "zero_d": torch.tensor(1.5),
        "empty": torch.empty(0, 2),
        "f8": torch.zeros(2, dtype=torch.float8_e4m3fn),
        "step": 3,
        "name": "run",
        "nested": {"x": torch.ones(2), "list": [1, 2.0, None], "tuple": (1, "a")},
    }
    mesh = init_device_mesh("cpu", (1,))
    sd["dt"] = distribute_tensor(torch.randn(4, 4), mesh, [Shard(0)])
    dcp.save(sd, checkpoint_id=f"{root}/pg")
    dcp.save(sd, checkpoint_id=f"{root}/exact", planner=ExactSavePlanner())
    dcp.async_save(sd, checkpoint_id=f"{root}/async").result()
    dcp.async_save(sd, checkpoint_id=f"{root}/async_exact", planner=ExactSavePlanner()).result()
    dist.barrier()
    return ["pg", "exact", "async", "async_exact"]


@pytest.mark.multiprocess
def test_real_checkpoints_read_exactly_as_torch_reads_them(tmp_path: Path) -> None:
    (names,) = run_multiproc(_real, 1, str(tmp_path), timeout=240, start_method="spawn")
    no_dist = tmp_path / "no_dist"
    dcp.save({"w": torch.randn(2, 3), "step": 1}, checkpoint_id=str(no_dist), no_dist=True)
    for name in [*names, "no_dist"]:
        _same(read_metadata(tmp_path / name), FileSystemReader(tmp_path / name).read_metadata())
        assert describe_checkpoint(tmp_path / name, verify=True)["ok"]
        export_safetensors(tmp_path / name, tmp_path / f"{name}_out")
