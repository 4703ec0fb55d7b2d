"""``export_safetensors``: DCP checkpoints -> Hugging Face safetensors, checked by the
``safetensors`` library itself against the tensors that were saved (bitwise).

Checkpoints: plain ``dcp.save`` of plain tensors (many dtypes, 0-d, empty, transposed,
channels-last, non-tensor values), and DTensors saved by ``ExactSavePlanner`` for 6
emulated ranks of FSDP over TP (uneven, strided, several runs per rank; a spawned
child runs DCP's save protocol, ``dcp_emulation``), plus plain DCP's broken uneven
FSDP-over-TP checkpoints, which export must refuse before writing anything.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")

import torch.distributed.checkpoint as dcp  # noqa: E402
from safetensors import safe_open  # noqa: E402

from meshlayout.torch.checkpoint import export_safetensors  # noqa: E402
from multiproc import run_multiproc  # noqa: E402

pytestmark = [pytest.mark.torch]


def _bits(t: Any) -> Any:
    """A tensor's bytes, for bitwise comparison (NaNs and -0.0 included)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def read_all(out_dir: Path) -> dict[str, Any]:
    """Every tensor of an exported model, read by the safetensors library; checks the index."""
    files = sorted(p.name for p in out_dir.iterdir() if p.name.endswith(".safetensors"))
    index_path = out_dir / "model.safetensors.index.json"
    tensors: dict[str, Any] = {}
    where: dict[str, str] = {}
    for name in files:
        with safe_open(str(out_dir / name), framework="pt") as f:
            for key in f.keys():
                assert key not in tensors, f"{key} in two files"
                tensors[key] = f.get_tensor(key)
                where[key] = name
    if len(files) == 1:
        assert files == ["model.safetensors"] and not index_path.exists()
    else:
        n = len(files)
        assert files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
        index = json.loads(index_path.read_text())
        assert index["weight_map"] == where
        assert index["metadata"]["total_size"] == sum(
            t.numel() * t.element_size() for t in tensors.values()
        )
    return tensors


def assert_bitwise(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert g.dtype == w.dtype and tuple(g.shape) == tuple(w.shape), k
        assert torch.equal(_bits(g), _bits(w)), k


def plain_tensors() -> dict[str, Any]:
    g = torch.Generator().manual_seed(19)
    return {
        "a": torch.randn(3, 4, generator=g),
        "b.ids": torch.arange(5),
        "c.scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        "d.half": torch.randn(7, 3, generator=g).half(),
        "e.empty": torch.empty(0, 3),
        "f.mask": torch.rand(6, generator=g) > 0.5,
        "g.u8": torch.randint(0, 255, (4, 2), generator=g, dtype=torch.uint8),
        "h.t": torch.randn(5, 3, generator=g).t(),  # stored with transposed strides
        "i.cl": torch.randn(2, 3, 4, 5, generator=g).to(memory_format=torch.channels_last),
        "j.f64": torch.randn(3, 3, 2, generator=g, dtype=torch.float64),
        "k.bf16": torch.randn(9, 10, generator=g).bfloat16(),
        "l.i32": torch.randint(-9, 9, (3,), generator=g, dtype=torch.int32),
        "m.f8": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
    }


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("plain") / "ckpt"
    tensors = plain_tensors()
    dcp.save({**tensors, "step": 7, "opt": {"lr": 0.1}}, checkpoint_id=str(root), no_dist=True)
    return root, tensors


@pytest.mark.parametrize("buffer_bytes", [64, 200, 64 * 2**20])
def test_plain_dcp_checkpoint_exports_bitwise(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path, buffer_bytes: int
) -> None:
    root, tensors = plain
    result = export_safetensors(root, tmp_path / "out", buffer_bytes=buffer_bytes)
    assert result.files == ("model.safetensors",)
    assert set(result.tensors) == set(tensors)  # non-tensor values skipped
    assert result.total_bytes == sum(t.numel() * t.element_size() for t in tensors.values())
    assert_bitwise(read_all(tmp_path / "out"), tensors)
    assert sorted(os.listdir(tmp_path / "out")) == ["model.safetensors"]  # no temp left


def test_split_into_files_with_an_index(plain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, tensors = plain
    sizes = {k: t.numel() * t.element_size() for k, t in tensors.items()}
    limit = 100
    result = export_safetensors(root, tmp_path / "out", max_file_bytes=limit, buffer_bytes=96)
    got = read_all(tmp_path / "out")
    assert_bitwise(got, tensors)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    # greedy in name order: a file holds tensors up to the limit, a larger tensor is alone
    expect: list[list[str]] = []
    total = 0
    for k in sorted(tensors):
        if not expect or (expect[-1] and total + sizes[k] > limit):
            expect.append([])
            total = 0
        expect[-1].append(k)
        total += sizes[k]
    n = len(expect)
    assert n > 3 and result.files[-1] == "model.safetensors.index.json"
    for i, group in enumerate(expect):
        for k in group:
            assert index["weight_map"][k] == f"model-{i + 1:05d}-of-{n:05d}.safetensors"
    for group in expect:
        assert len(group) == 1 or sum(sizes[k] for k in group) <= limit
    again = export_safetensors(root, tmp_path / "again", max_file_bytes=limit, buffer_bytes=96)
    for name in again.files:  # deterministic: the same bytes every time
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "again" / name).read_bytes()


@pytest.mark.parametrize("dtype", ["bf16", "BF16", "bfloat16", "torch.bfloat16"])
def test_dtype_casts_floating_tensors_only(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path, dtype: str
) -> None:
    root, tensors = plain
    export_safetensors(root, tmp_path / "out", dtype=dtype, buffer_bytes=64)
    want = {
        k: t.to(torch.bfloat16) if t.is_floating_point() and t.element_size() >= 2 else t
        for k, t in tensors.items()
    }  # integer, bool and float8 tensors keep their dtype
    assert_bitwise(read_all(tmp_path / "out"), want)


def test_dtype_leaves_non_floating_and_0d_tensors_alone(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A cast to float16 changes only the floating tensors with at least one dim: the 0-d
    bf16 scalar, the integers, the bool mask and the float8 weight keep their dtype."""
    root, tensors = plain
    export_safetensors(root, tmp_path / "out", dtype="F16")
    got = read_all(tmp_path / "out")
    kept = ["b.ids", "c.scalar", "f.mask", "g.u8", "l.i32", "m.f8"]
    assert_bitwise({k: got[k] for k in kept}, {k: tensors[k] for k in kept})
    cast = [k for k in tensors if k not in kept]
    assert cast == ["a", "d.half", "e.empty", "h.t", "i.cl", "j.f64", "k.bf16"]
    assert_bitwise({k: got[k] for k in cast}, {k: tensors[k].half() for k in cast})


def test_dtype_keeps_an_optimizer_step_exact(tmp_path: Path) -> None:
    """Adam's ``step`` is a 0-d float32 tensor: bf16 would store 10000.0 as 9984.0."""
    step = torch.tensor(10000.0)
    assert step.bfloat16().item() == 9984.0
    sd = {"w": torch.ones(2, 2), "optim.state.w.step": step}
    dcp.save(sd, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    export_safetensors(tmp_path / "ckpt", tmp_path / "out", dtype="bf16")
    got = read_all(tmp_path / "out")
    assert got["w"].dtype == torch.bfloat16
    assert_bitwise({"step": got["optim.state.w.step"]}, {"step": step})


def test_keys_may_be_a_predicate(plain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, tensors = plain
    result = export_safetensors(root, tmp_path / "out", keys=lambda name: "." in name)
    dotted = {k: v for k, v in tensors.items() if "." in k}
    assert len(dotted) == len(tensors) - 1 and sorted(result.tensors) == sorted(dotted)
    assert_bitwise(read_all(tmp_path / "out"), dotted)
    asked: list[str] = []
    export_safetensors(root, tmp_path / "b", keys=lambda n: asked.append(n) or n == "a")
    assert sorted(asked) == sorted(tensors)  # asked about tensors only, never about "step"
    assert_bitwise(read_all(tmp_path / "b"), {"a": tensors["a"]})


def test_dtype_cast_to_float16_and_float32(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, tensors = plain
    for dtype in (torch.float16, "F32"):
        out = tmp_path / str(dtype)
        export_safetensors(root, out, dtype=dtype, keys=["a", "k.bf16", "b.ids"])
        target = torch.float16 if dtype is torch.float16 else torch.float32
        want = {
            k: tensors[k].to(target) if k != "b.ids" else tensors[k]
            for k in ("a", "k.bf16", "b.ids")
        }
        assert_bitwise(read_all(out), want)


def test_keys_and_rename(plain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, tensors = plain
    result = export_safetensors(
        root, tmp_path / "m", keys=["a", "b.ids", "c.scalar"], rename={"a": "model.a"}
    )
    assert result.tensors == {
        "model.a": "model.safetensors",
        "b.ids": "model.safetensors",
        "c.scalar": "model.safetensors",
    }
    assert_bitwise(
        read_all(tmp_path / "m"),
        {"model.a": tensors["a"], "b.ids": tensors["b.ids"], "c.scalar": tensors["c.scalar"]},
    )
    export_safetensors(
        root, tmp_path / "c", keys=["b.ids", "f.mask"], rename=lambda n: n.split(".")[1]
    )
    assert_bitwise(read_all(tmp_path / "c"), {"ids": tensors["b.ids"], "mask": tensors["f.mask"]})


@pytest.mark.parametrize(
    ("kwargs", "kind", "message"),
    [
        ({"keys": ["nope"]}, KeyError, "'nope' is not in the checkpoint"),
        ({"keys": ["step"]}, ValueError, "'step' is a non-tensor value"),
        ({"keys": "a"}, TypeError, "iterable of names"),
        ({"keys": 3}, TypeError, "iterable of names or a callable name -> bool, got 3"),
        ({"keys": lambda n: "yes"}, TypeError, "returned 'yes'; a keys callable returns a bool"),
        ({"keys": lambda n: False}, ValueError, "the callable selects none of the checkpoint's"),
        ({"rename": lambda n: "x"}, ValueError, "would both be written as 'x'"),
        ({"rename": {"a": "b.ids"}}, ValueError, "'a' and 'b.ids' would both be written"),
        ({"rename": {"a": ""}}, ValueError, "'a' -> '' is not a valid tensor name"),
        ({"rename": {"a": "__metadata__"}}, ValueError, "not a valid tensor name"),
        ({"rename": 3}, TypeError, "mapping or a callable"),
        ({"dtype": "F33"}, ValueError, "dtype 'F33' is not a safetensors dtype"),
        ({"dtype": "int8"}, ValueError, "only floating-point dtypes"),
        ({"dtype": 3}, TypeError, "dtype must be a str or torch.dtype"),
        ({"buffer_bytes": 0}, ValueError, "buffer_bytes must be at least 64 bytes, got 0"),
        ({"buffer_bytes": True}, TypeError, "buffer_bytes must be an int"),
        ({"max_file_bytes": -1}, ValueError, "max_file_bytes must be at least 1 bytes, got -1"),
        ({"max_file_bytes": "5G"}, TypeError, "max_file_bytes must be an int (bytes), got '5G'"),
        ({"progress": 3}, TypeError, "progress must be a bool or a callable"),
    ],
)
def test_bad_arguments_raise_naming_the_value(
    plain: tuple[Path, dict[str, Any]],
    tmp_path: Path,
    kwargs: dict[str, Any],
    kind: type,
    message: str,
) -> None:
    root, _ = plain
    with pytest.raises(kind) as info:
        export_safetensors(root, tmp_path / "out", **kwargs)
    assert message in str(info.value)
    leftovers = (
        [p.name for p in (tmp_path / "out").iterdir()] if (tmp_path / "out").exists() else []
    )
    assert leftovers == []


def test_bad_paths(plain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    root, _ = plain
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        export_safetensors(tmp_path / "missing", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match=r"no \.metadata"):
        export_safetensors(tmp_path, tmp_path / "out")
    with pytest.raises(ValueError, match="is the checkpoint directory"):
        export_safetensors(root, root)
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        export_safetensors(root, tmp_path / "file")
    with pytest.raises(TypeError, match="out_dir must be"):
        export_safetensors(root, None)  # type: ignore[arg-type]
    export_safetensors(root, tmp_path / "out", keys=["a"])
    with pytest.raises(FileExistsError, match=r"already holds model\.safetensors"):
        export_safetensors(root, tmp_path / "out")


def test_progress_callback_sees_every_byte(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, _ = plain
    seen: list[tuple[int, int]] = []
    result = export_safetensors(
        root, tmp_path / "out", buffer_bytes=64, progress=lambda d, t: seen.append((d, t))
    )
    assert seen[-1] == (result.total_bytes, result.total_bytes)
    assert all(a[0] < b[0] for a, b in itertools.pairwise(seen))


def test_an_exception_mid_export_leaves_nothing(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, _ = plain

    def stop(done: int, total: int) -> None:
        if done > total // 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_safetensors(
            root, tmp_path / "out", buffer_bytes=64, max_file_bytes=100, progress=stop
        )
    assert list((tmp_path / "out").iterdir()) == []


KILLED = """
import os, sys
from meshlayout.torch.checkpoint import export_safetensors
def die(done, total):
    if done > total // 2:
        os._exit(9)   # as if killed: no clean-up runs
export_safetensors(sys.argv[1], sys.argv[2], buffer_bytes=64, max_file_bytes=int(sys.argv[3]), progress=die)
"""


@pytest.mark.parametrize("max_file_bytes", [100, 2**30])
def test_a_killed_export_never_looks_complete(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path, max_file_bytes: int
) -> None:
    root, _ = plain
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED, str(root), str(out), str(max_file_bytes)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 9, proc.stderr
    names = [p.name for p in out.iterdir()]
    assert names and all(n.startswith(".export-") for n in names)  # only the temporary dir
    assert not any(n.endswith((".safetensors", ".json")) for n in names)


# ---------------------------------------------------------------------- sharded checkpoints
def _sharded(rank: int, world: int, root: str) -> dict[str, Any]:
    """Checkpoints of 6 emulated ranks (mesh dp=3, tp=2): ours for several shardings, and
    plain DCP's broken uneven FSDP-over-TP ones. Returns the full tensors saved."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    from dcp_emulation import dtensor_of, emulated_save, fsdp_over_tp_checkpoint
    from meshlayout import Mesh
    from meshlayout.sharding import Replicate, Shard, ShardingSpec, StridedShard
    from meshlayout.torch.checkpoint import ExactSavePlanner

    mesh = Mesh({"dp": 3, "tp": 2})
    g = torch.Generator().manual_seed(7)
    specs = {
        # FSDP2 over ColwiseParallel, uneven (the case plain DCP gets wrong)
        "layers.0.wq": (torch.randn(13, 5, generator=g), [StridedShard(0, 2), Shard(0)]),
        # FSDP2 over RowwiseParallel: column chunks, bf16
        "layers.0.wo": (torch.randn(7, 11, generator=g).bfloat16(), [Shard(0), Shard(1)]),
        # 3-d, sharded on inner dims, int64
        "cube": (torch.randint(-99, 99, (4, 5, 9), generator=g), [Shard(1), Shard(2)]),
        # several runs per rank (undecodable strided list keeps the split reading)
        "runs": (torch.randn(8, 3, generator=g), [Replicate(), StridedShard(0, 2)]),
        # replicated over dp, sharded over tp (HSDP-like): replicas share the writes
        "bias": (torch.randn(9, generator=g), [Replicate(), Shard(0)]),
        "scalar": (torch.tensor(3.25), [Replicate(), Replicate()]),
    }
    full = {k: v for k, (v, _) in specs.items()}
    made = {k: ShardingSpec(tuple(v.shape), mesh, p) for k, (v, p) in specs.items()}

    def state(r: int) -> dict[str, Any]:
        return {**{k: dtensor_of(made[k], r, full[k]) for k in specs}, "step": 3}

    emulated_save(6, state, f"{root}/ours", ExactSavePlanner)
    fsdp_over_tp_checkpoint(f"{root}/plain13", 13, DefaultSavePlanner, validate=False)
    fsdp_over_tp_checkpoint(f"{root}/plain7", 7, DefaultSavePlanner)
    return full


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    root = tmp_path_factory.mktemp("sharded")
    (full,) = run_multiproc(_sharded, 1, str(root), timeout=240, start_method="spawn", init=False)
    return root, full


@pytest.mark.multiprocess
@pytest.mark.parametrize(("buffer_bytes", "max_file_bytes"), [(64, 200), (2**20, 2**30)])
def test_fsdp_over_tp_checkpoint_exports_full_tensors(
    sharded: tuple[Path, dict[str, Any]], tmp_path: Path, buffer_bytes: int, max_file_bytes: int
) -> None:
    root, full = sharded
    from meshlayout.torch.checkpoint import read_metadata

    md = read_metadata(root / "ours").state_dict_metadata
    assert len(md["runs"].chunks) == 4  # 2 tp ranks x 2 runs each (replicas write once)
    assert len(md["layers.0.wo"].chunks) == 6
    export_safetensors(
        root / "ours", tmp_path / "out", buffer_bytes=buffer_bytes, max_file_bytes=max_file_bytes
    )
    assert_bitwise(read_all(tmp_path / "out"), full)


@pytest.mark.multiprocess
def test_chunks_that_do_not_tile_are_refused_before_writing(
    sharded: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, _ = sharded
    with pytest.raises(ValueError) as info:
        export_safetensors(root / "plain13", tmp_path / "out")
    assert str(info.value).startswith("tensor 'w' (13, 3): its saved chunks do not tile it")
    assert "overlap: chunks 1 and 4 share ((7, 8), (0, 3)); hole: ((11, 12), (0, 3))" in str(
        info.value
    )
    assert not (tmp_path / "out").exists()
    # 7 rows: the metadata tiles, the stored data does not match it
    with pytest.raises(ValueError) as info:
        export_safetensors(root / "plain7", tmp_path / "out")
    assert "tensor 'w' chunk 4 at offsets (6, 0): the metadata says (1, 3) torch.float32" in str(
        info.value
    )
    assert "holds (0, 3) torch.float32" in str(info.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.multiprocess
def test_few_data_files_open_at_once(
    sharded: tuple[Path, dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint of thousands of ranks has thousands of files: at most ``limit`` stay open."""
    from meshlayout.torch.checkpoint import _export

    root, full = sharded
    seen: list[int] = []

    class Few(_export._Files):
        def __init__(self) -> None:
            super().__init__(limit=2)

        def get(self, path: Path) -> Any:
            f = super().get(path)
            seen.append(len(self._open))
            return f

    monkeypatch.setattr(_export, "_Files", Few)
    export_safetensors(root / "ours", tmp_path / "out", buffer_bytes=64)
    assert max(seen) == 2 and len(seen) > 20
    assert_bitwise(read_all(tmp_path / "out"), full)


def test_a_huge_buffer_allocates_only_what_the_largest_tensor_needs(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, tensors = plain
    export_safetensors(root, tmp_path / "out", buffer_bytes=2**62)
    assert_bitwise(read_all(tmp_path / "out"), tensors)
    with pytest.raises(ValueError, match="checkpoint_id is empty"):
        export_safetensors("", tmp_path / "other")


def _item(root: Path, name: str) -> tuple[str, int, int]:
    """(file, offset, length) of a tensor's first stored item, by torch's own reader."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import MetadataIndex

    md = FileSystemReader(str(root)).read_metadata()
    info = md.storage_data[MetadataIndex(name, [0] * len(md.state_dict_metadata[name].size))]
    return str(info.relative_path), int(info.offset), int(info.length)


def _copy(plain: tuple[Path, dict[str, Any]], tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(plain[0], tmp_path / "ckpt"))


def test_a_truncated_item_is_named_with_the_bytes_expected_and_present(
    plain: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    from meshlayout.torch.checkpoint import NotExportableError, describe_checkpoint

    root = _copy(plain, tmp_path)
    file, offset, length = _item(root, "j.f64")
    end = offset + length // 2  # the file now ends inside j.f64's item
    os.truncate(root / file, end)
    want = (
        f"tensor 'j.f64' chunk 0 at offsets (0, 0, 0) in {file}: truncated file: the item is "
        f"bytes {offset}-{offset + length} ({length} bytes), the file ends at byte {end} "
        f"({length // 2} of them present); nothing was written"
    )
    with pytest.raises(NotExportableError) as info:
        export_safetensors(root, tmp_path / "out")
    assert str(info.value) == want
    assert not (tmp_path / "out").exists()
    stored = {t["name"]: t.get("stored") for t in describe_checkpoint(root, verify=True)["tensors"]}
    assert stored["j.f64"] == [
        f"chunk 0 at offsets (0, 0, 0): {file}: truncated file: the item is bytes "
        f"{offset}-{offset + length} ({length} bytes), the file ends at byte {end} "
        f"({length // 2} of them present)"
    ]
    later = [k for k in plain[1] if _item(root, k)[1] >= end]  # items wholly cut off
    assert later and all(f"({_item(root, k)[2]} bytes)" in str(stored[k]) for k in later)
    assert all("(0 of them present)" in str(stored[k]) for k in later)


def test_a_corrupt_item_is_named(plain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from meshlayout.torch.checkpoint import NotExportableError

    root = _copy(plain, tmp_path)
    file, offset, _ = _item(root, "j.f64")
    with open(root / file, "r+b") as f:
        f.seek(offset)
        f.write(b"\0\0\0\0")
    with pytest.raises(NotExportableError, match=r"corrupt item: bytes \d+-\d+ do not start a"):
        export_safetensors(root, tmp_path / "out")
