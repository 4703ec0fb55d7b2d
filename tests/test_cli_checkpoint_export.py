"""``meshlayout checkpoint export CHECKPOINT OUT_DIR`` and ``meshlayout checkpoint PATH`` on
safetensors: real files read back by the ``safetensors`` library, usage errors in one line
with exit 2, a checkpoint that does not tile exits 1 with nothing written, a progress bar
only on a terminal, and ``meshlayout checkpoint DIR`` unchanged (also for a directory
named ``export``, written ``./export``)."""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import torch.distributed.checkpoint as dcp  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from meshlayout.cli import main  # noqa: E402
from meshlayout.cli.args import ArgError, parse_size  # noqa: E402

pytestmark = [pytest.mark.torch]


def tensors() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {
        "model.embed": torch.randn(11, 6, generator=g),
        "model.layers.0.w": torch.randn(6, 6, generator=g),
        "model.layers.0.b": torch.randn(6, generator=g).half(),
        "model.ids": torch.arange(4),
        "lm_head": torch.randn(11, 6, generator=g).bfloat16(),
    }


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli_export") / "ckpt"
    dcp.save({**tensors(), "step": 5}, checkpoint_id=str(root), no_dist=True)
    return root


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def read_dir(out_dir: Path) -> dict[str, Any]:
    got: dict[str, Any] = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        got.update(load_file(str(f)))
    return got


def same(a: Any, b: Any) -> bool:
    return bool(a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b))


def test_export_writes_what_safetensors_reads(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(["checkpoint", "export", ckpt, tmp_path / "out"], capsys)
    assert code == 0 and err == ""  # no progress bar: stderr is not a terminal
    assert out == (
        f"exported 5 tensors (584 bytes) from {ckpt} to {tmp_path / 'out'}: model.safetensors\n"
    )
    got = read_dir(tmp_path / "out")
    assert sorted(got) == sorted(tensors()) and all(same(got[k], v) for k, v in tensors().items())


def test_export_flags(ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "out"
    argv = ["checkpoint", "export", ckpt, out_dir, "--max-file-size", "300", "--buffer", "1KiB"]
    argv += ["--dtype", "bf16", "--strip-prefix", "model.", "--format", "json"]
    code, out, _ = run(argv, capsys)
    assert code == 0
    summary = json.loads(out)
    assert summary["tensors"] == 5 and summary["files"][-1] == "model.safetensors.index.json"
    assert len(summary["files"]) > 2
    got = read_dir(out_dir)
    for name, value in tensors().items():
        want = value.bfloat16() if value.is_floating_point() else value
        assert same(got[name.removeprefix("model.")], want), name
    assert summary["total_bytes"] == sum(v.numel() * v.element_size() for v in got.values())


def test_progress_bar_on_a_terminal(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    assert main(["checkpoint", "export", str(ckpt), str(tmp_path / "out")]) == 0
    assert "export" in term.getvalue() and "100%" in term.getvalue()


def test_describe_a_safetensors_directory_and_file(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    assert run(["checkpoint", "export", ckpt, out_dir, "--max-file-size", "300"], capsys)[0] == 0
    code, out, _ = run(["checkpoint", out_dir], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == (
        f"safetensors {out_dir}: 5 tensors, 3 files, 584 bytes, index model.safetensors.index.json"
    )
    assert "model.embed       (11, 6)  F32      264  model-00002-of-00003.safetensors" in lines
    assert "lm_head           (11, 6)  BF16     132  model-00001-of-00003.safetensors" in lines
    assert lines[-1] == "ok"
    code, out, _ = run(["checkpoint", out_dir, "--format", "json"], capsys)
    report = json.loads(out)
    assert report["format"] == "safetensors" and report["total_bytes"] == 584
    assert {t["name"]: t["shape"] for t in report["tensors"]}["model.ids"] == [4]
    first = out_dir / "model-00001-of-00003.safetensors"
    code, out, _ = run(["checkpoint", first, "--tensor", "lm_head"], capsys)
    assert code == 0 and "lm_head" in out and "model.embed" not in out
    # an index that disagrees with the files: exit 1, named
    index = json.loads((out_dir / "model.safetensors.index.json").read_text())
    index["weight_map"]["lm_head"] = "model-00003-of-00003.safetensors"
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    code, out, _ = run(["checkpoint", out_dir], capsys)
    assert code == 1
    assert (
        "problem: model.safetensors.index.json lists 'lm_head' in "
        "model-00003-of-00003.safetensors, it is in model-00001-of-00003.safetensors" in out
    )


def test_a_directory_named_export_is_inspected_as_dot_slash_export(
    ckpt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "export"), no_dist=True)
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(["checkpoint", "./export"], capsys)
    assert code == 0 and "w       (2,)   float32  1       exact" in out
    code, _, err = run(["checkpoint", "export"], capsys)
    assert code == 2 and "(to inspect a directory named export, write ./export)" in err


def _holey(root: Path) -> Path:
    """A checkpoint whose 2-element tensor has a chunk for element 0 only."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        Metadata,
        MetadataIndex,
        TensorProperties,
        TensorStorageMetadata,
    )

    root.mkdir()
    blob = io.BytesIO()
    torch.save(torch.tensor([1.0]), blob)
    (root / "__0_0.distcp").write_bytes(blob.getvalue())
    md = Metadata(
        state_dict_metadata={
            "w": TensorStorageMetadata(
                TensorProperties(dtype=torch.float32),
                torch.Size([2]),
                [ChunkStorageMetadata(torch.Size([0]), torch.Size([1]))],
            )
        },
        storage_data={
            MetadataIndex("w", [0]): _StorageInfo("__0_0.distcp", 0, len(blob.getvalue()))
        },
    )
    (root / ".metadata").write_bytes(pickle.dumps(md))
    return root


def test_a_checkpoint_that_does_not_tile_exits_1_writing_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    holey = _holey(tmp_path / "holey")
    code, out, err = run(["checkpoint", "export", holey, tmp_path / "out"], capsys)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert "tensor 'w' (2,): its saved chunks do not tile it (hole: ((1, 2),))" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--buffer", "1.5B"], "--buffer: '1.5B' is not a whole number of bytes"),
        (["--buffer", "10"], "--buffer: must be at least 64 bytes, got '10'"),
        (["--max-file-size", "0"], "--max-file-size: must be at least 1 bytes, got '0'"),
        (["--max-file-size", "5XB"], "--max-file-size: unknown unit 'XB' in '5XB'"),
        (["--max-file-size", "-1"], "--max-file-size: '-1' is not a size"),
        (["--dtype", "F33"], "--dtype: dtype 'F33' is not a safetensors dtype"),
        (["--dtype", "I8"], "--dtype 'I8': only floating-point dtypes can be cast to"),
        (["--verify"], "--verify applies to inspecting a checkpoint, not to export"),
        (["--strip-prefix", "model."], None),  # collision-free: fine
    ],
)
def test_bad_flags_exit_2_in_one_line(
    ckpt: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    message: str | None,
) -> None:
    code, out, err = run(["checkpoint", "export", ckpt, tmp_path / "out", *extra], capsys)
    if message is None:
        assert code == 0
        return
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["checkpoint", "export", "{ckpt}"], "export takes CHECKPOINT OUT_DIR, got 1 paths"),
        (["checkpoint", "export", "{tmp}/none", "{tmp}/out"], "'{tmp}/none' is not a directory"),
        (["checkpoint", "export", "{ckpt}", "{ckpt}"], "is the checkpoint directory"),
        (["checkpoint", "export", "{ckpt}", "{tmp}/file"], "exists and is not a directory"),
        (["checkpoint", "export", "{ckpt}", "{tmp}/full"], "already holds model.safetensors"),
        (
            ["checkpoint", "{ckpt}", "--dtype", "bf16"],
            "--dtype applies to 'meshlayout checkpoint export",
        ),
        (["checkpoint", "{ckpt}", "{tmp}"], "give one PATH to inspect, got 2"),
        (["checkpoint", "{tmp}/full", "--verify"], "--verify applies to DCP checkpoints"),
        (["checkpoint", "{tmp}/bad.safetensors"], "header length"),
    ],
)
def test_usage_errors_exit_2_in_one_line(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 16)
    assert main(["checkpoint", "export", str(ckpt), str(tmp_path / "full")]) == 0
    capsys.readouterr()
    fill = {"ckpt": ckpt, "tmp": tmp_path}
    code, out, err = run([a.format(**fill) for a in argv], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert message.format(**fill) in err, err


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("4096", 4096),
        ("64MiB", 64 * 2**20),
        ("64M", 64 * 2**20),
        ("64m", 64 * 2**20),
        ("2GB", 2 * 10**9),
        ("1.5 GiB", 3 * 2**29),
        ("1K", 1024),
        ("3kb", 3000),
        ("7B", 7),
        ("1TiB", 2**40),
    ],
)
def test_parse_size(text: str, value: int) -> None:
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "x", "1.2.3", "-5", "1e9", "1 GiBs", "0.5B", "9" * 41])
def test_parse_size_refuses(text: str) -> None:
    with pytest.raises(ArgError, match=r"^--size: "):
        parse_size(text)


def test_hostile_values_never_traceback(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every hostile value on every export flag and path: exit 0 or one line, no traceback."""
    from test_fuzz_cli import HOSTILE_VALUES

    for i, bad in enumerate(HOSTILE_VALUES):
        out_dir = tmp_path / f"o{i}"
        cases = [
            [flag, bad] for flag in ("--max-file-size", "--buffer", "--dtype", "--strip-prefix")
        ]
        for extra in cases:
            code, out, err = run(["checkpoint", "export", ckpt, out_dir, *extra], capsys)
            assert code in (0, 2), (extra, err)
            if code == 2:
                assert out == "" and len(err.strip().splitlines()) == 1, (extra, err)
                assert ": error: " in err
            else:
                for f in out_dir.iterdir():
                    f.unlink()
        for argv in (["checkpoint", "export", bad, out_dir], ["checkpoint", bad]):
            code, out, err = run(argv, capsys)
            assert code == 2 and len(err.strip().splitlines()) == 1, (argv, err)


@pytest.fixture(scope="module")
def training(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A training checkpoint: ``{"model": ..., "optim": ...}`` as torch's optimizer names it."""
    root = tmp_path_factory.mktemp("cli_export_training") / "ckpt"
    model = tensors()
    optim = {
        "state": {
            k: {"exp_avg": torch.zeros_like(v), "step": torch.tensor(10000.0)}
            for k, v in model.items()
            if v.is_floating_point()
        },
        "param_groups": [{"lr": 0.1, "params": sorted(model)}],
    }
    dcp.save({"model": model, "optim": optim, "step": 5}, checkpoint_id=str(root), no_dist=True)
    return root


@pytest.mark.parametrize(
    "select",
    [
        ["--exclude", "optim.*"],
        ["--keys", "model.*"],
        ["--keys", "model.model.*,model.lm_head"],
        ["--keys", "model.model.*", "--keys", "model.lm_head", "--exclude", "*.step"],
    ],
)
def test_keys_and_exclude_keep_optimizer_state_out(
    training: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], select: list[str]
) -> None:
    argv = ["checkpoint", "export", training, tmp_path / "out", *select]
    code, out, err = run([*argv, "--strip-prefix", "model.", "--dtype", "bf16"], capsys)
    assert code == 0 and err == "" and out.startswith("exported 5 tensors"), err
    got = read_dir(tmp_path / "out")
    assert sorted(got) == sorted(tensors())
    for name, value in tensors().items():
        want = value.bfloat16() if value.is_floating_point() else value
        assert same(got[name], want), name


def test_exclude_alone_keeps_the_rest_and_dtype_spares_0d_steps(
    training: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["checkpoint", "export", training, tmp_path / "out", "--exclude", "model.*,*exp_avg"]
    code, _, err = run([*argv, "--dtype", "bf16"], capsys)
    assert code == 0 and err == ""
    got = read_dir(tmp_path / "out")
    floating = [k for k, v in tensors().items() if v.is_floating_point()]
    assert sorted(got) == sorted(f"optim.state.{k}.step" for k in floating)
    assert all(same(v, torch.tensor(10000.0)) for v in got.values())  # 0-d: not cast


@pytest.mark.parametrize(
    ("select", "message"),
    [
        (
            ["--keys", "modle.*"],
            "--keys 'modle.*': matches none of the checkpoint's 13 tensor names (model.lm_head, "
            "model.model.embed, model.model.ids, model.model.layers.0.b, ...)",
        ),
        (["--keys", "model.*", "--keys", "x*"], "--keys 'x*': matches none"),
        (
            ["--keys", "model.*", "--exclude", "model.*"],
            "--keys 'model.*' --exclude 'model.*': leaves none of the checkpoint's tensors",
        ),
        (["--exclude", "*"], "--exclude '*': leaves none of the checkpoint's tensors"),
        (["--keys", "model.*,"], "--keys 'model.*,': empty pattern"),
        (["--exclude", ""], "--exclude '': empty pattern"),
    ],
)
def test_bad_key_patterns_exit_2_in_one_line(
    training: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    select: list[str],
    message: str,
) -> None:
    code, out, err = run(["checkpoint", "export", training, tmp_path / "out", *select], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert message in err
    assert not (tmp_path / "out").exists()


def test_key_flags_belong_to_export(training: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["checkpoint", training, "--keys", "model.*"], capsys)
    assert code == 2 and "--keys applies to 'meshlayout checkpoint export" in err


def test_a_truncated_data_file_exits_1_naming_it(
    ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    from torch.distributed.checkpoint import FileSystemReader

    root = Path(shutil.copytree(ckpt, tmp_path / "ckpt"))
    storage = FileSystemReader(str(root)).read_metadata().storage_data
    file = str(next(iter(storage.values())).relative_path)
    size = (root / file).stat().st_size
    os.truncate(root / file, size - 100)
    code, out, err = run(["checkpoint", "export", root, tmp_path / "out"], capsys)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"meshlayout checkpoint export: cannot export {root}: tensor '")
    assert f"in {file}: truncated file: the item is bytes " in err
    assert f"the file ends at byte {size - 100} (" in err and "nothing was written" in err
    assert not (tmp_path / "out").exists()
    code, out, err = run(["checkpoint", "--verify", root], capsys)
    assert code == 1 and err == ""
    assert f"{file}: truncated file: " in out and "not a torch.save archive" not in out
