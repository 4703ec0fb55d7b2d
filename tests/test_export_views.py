"""``export_safetensors`` with views: one checkpoint tensor -> several output tensors.

``rename`` may answer a list of ``(output name, index)`` views (a stacked expert tensor
-> per-expert weights). Every check reads the written files with
``safetensors.safe_open`` and compares them bit for bit with ``full[index]`` computed by
torch's own indexing of the tensor that was saved (the independent reference).

Checkpoints with arbitrary chunkings are made in one process: ``dcp.save`` writes each
chunk as a tensor of its own, then the metadata is rewritten so those items are the
chunks of one tensor (the file format DCP writes for a sharded save). Chunks may be
stored with transposed strides (read through a memory map by the exporter).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.metadata import (  # noqa: E402
    ChunkStorageMetadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from meshlayout.torch.checkpoint import export_safetensors  # noqa: E402
from test_export_safetensors import assert_bitwise, read_all, sharded  # noqa: E402, F401

pytestmark = [pytest.mark.torch]

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes)


def chunked_checkpoint(
    root: Path,
    tensors: dict[str, tuple[Any, Sequence[Box]]],
    transposed: Collection[tuple[str, int]] = (),
) -> None:
    """A DCP checkpoint holding each ``full`` tensor as the given chunks (which must
    tile it); chunk ``(name, i)`` in ``transposed`` is stored with transposed strides."""
    items: dict[str, Any] = {}
    for name, (full, chunks) in tensors.items():
        for i, (offsets, sizes) in enumerate(chunks):
            part = full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].clone()
            if (name, i) in transposed and part.dim() >= 2:
                part = part.mT.contiguous().mT  # same values, column-major strides
            items[f"{name}#{i}"] = part
    dcp.save(items, checkpoint_id=str(root), no_dist=True)
    md = dcp.FileSystemReader(str(root)).read_metadata()
    entries, storage = {}, {}
    for name, (full, chunks) in tensors.items():
        props = md.state_dict_metadata[f"{name}#0"].properties
        listed = []
        for i, (offsets, sizes) in enumerate(chunks):
            listed.append(ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes)))
            zero = torch.Size([0] * full.dim())
            storage[MetadataIndex(name, torch.Size(offsets))] = md.storage_data[
                MetadataIndex(f"{name}#{i}", zero)
            ]
        entries[name] = TensorStorageMetadata(props, full.shape, listed)
    md.state_dict_metadata = entries
    md.storage_data = storage
    md.planner_data = {k: (k,) for k in entries}
    with open(root / ".metadata", "wb") as f:
        pickle.dump(md, f)


def grid(shape: Sequence[int], cuts: Sequence[Sequence[int]]) -> list[Box]:
    """The chunks of a grid: per dim, the cut points (uneven allowed)."""
    import itertools

    ranges = []
    for n, cs in zip(shape, cuts):
        points = [0, *sorted(set(c for c in cs if 0 < c < n)), n]
        ranges.append(list(itertools.pairwise(points)))
    return [
        (tuple(a for a, _ in combo), tuple(b - a for a, b in combo))
        for combo in itertools.product(*ranges)
    ]


def expected(full: dict[str, Any], views: dict[str, tuple[str, Any]], dtype: Any = None) -> Any:
    """Output name -> ``full[name][index]`` by torch indexing (cast like the exporter)."""
    out = {}
    for new, (name, index) in views.items():
        v = full[name][index]
        t = torch.empty_like(v, memory_format=torch.contiguous_format).copy_(v)
        if dtype is not None and t.is_floating_point() and t.element_size() >= 2:
            t = t.to(dtype)
        out[new] = t
    return out


# ---------------------------------------------------------------------- stacked experts
E, F, H = 4, 6, 10  # experts, intermediate (moe_intermediate_size), hidden


@pytest.fixture(scope="module")
def experts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """A stacked-expert training checkpoint: transformers 5's layout (gate_up_proj
    [E, 2F, H], down_proj [E, H, F]) and torchtitan's (w1/w3 [E, F, H], w2 [E, H, F]),
    chunked unevenly on several dims, some chunks stored transposed."""
    g = torch.Generator().manual_seed(3)
    full = {
        "model.layers.0.mlp.experts.gate_up_proj": torch.randn(E, 2 * F, H, generator=g),
        "model.layers.0.mlp.experts.down_proj": torch.randn(E, H, F, generator=g),
        "layers.1.moe.experts.w1": torch.randn(E, F, H, generator=g),
        "layers.1.moe.experts.w2": torch.randn(E, H, F, generator=g),
        "layers.1.moe.experts.w3": torch.randn(E, F, H, generator=g).bfloat16(),
        "model.norm.weight": torch.randn(H, generator=g),
        "optim.step": torch.tensor(7),
    }
    cuts = {
        "model.layers.0.mlp.experts.gate_up_proj": [[1], [5, 9], [4]],  # EP x TP, uneven
        "model.layers.0.mlp.experts.down_proj": [[3], [], [2]],
        "layers.1.moe.experts.w1": [[1, 2], [4], []],
        "layers.1.moe.experts.w2": [[], [7], [1, 5]],
        "layers.1.moe.experts.w3": [[2], [], [3]],
        "model.norm.weight": [[3]],
        "optim.step": [],
    }
    root = tmp_path_factory.mktemp("experts") / "ckpt"
    chunked_checkpoint(
        root,
        {k: (v, grid(v.shape, cuts[k])) for k, v in full.items()},
        transposed={("model.layers.0.mlp.experts.gate_up_proj", 2), ("layers.1.moe.experts.w2", 1)},
    )
    return root, full


def hf_views(name: str) -> Any:
    """transformers 5 stacked -> per-expert names, and torchtitan w1/w2/w3 likewise."""
    if name.endswith("experts.gate_up_proj"):
        p = name.removesuffix("gate_up_proj")
        return [(f"{p}{e}.gate_proj.weight", (e, slice(0, F))) for e in range(E)] + [
            (f"{p}{e}.up_proj.weight", (e, slice(F, 2 * F))) for e in range(E)
        ]
    if name.endswith("experts.down_proj"):
        p = name.removesuffix("down_proj")
        return [(f"{p}{e}.down_proj.weight", (e,)) for e in range(E)]
    titan = {"w1": "gate_proj", "w2": "down_proj", "w3": "up_proj"}
    if ".moe.experts." in name:
        layer, w = name.split(".")[1], name.rsplit(".", 1)[1]
        return [(f"model.layers.{layer}.mlp.experts.{e}.{titan[w]}.weight", e) for e in range(E)]
    return name


def hf_reference(full: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    out: dict[str, tuple[str, Any]] = {}
    for name in full:
        got = hf_views(name)
        if isinstance(got, str):
            out[got] = (name, ())
        else:
            out.update({new: (name, index) for new, index in got})
    return out


@pytest.mark.parametrize("buffer_bytes", [64, 300, 2**20])
def test_stacked_experts_export_per_expert_bitwise(
    experts: tuple[Path, dict[str, Any]], tmp_path: Path, buffer_bytes: int
) -> None:
    root, full = experts
    result = export_safetensors(root, tmp_path / "out", rename=hf_views, buffer_bytes=buffer_bytes)
    want = expected(full, hf_reference(full))
    assert set(result.tensors) == set(want)
    assert "model.layers.0.mlp.experts.3.up_proj.weight" in want
    assert want["model.layers.0.mlp.experts.1.gate_proj.weight"].shape == (F, H)
    assert result.total_bytes == sum(t.numel() * t.element_size() for t in want.values())
    assert_bitwise(read_all(tmp_path / "out"), want)


def test_views_with_keys_dtype_and_several_files(
    experts: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, full = experts
    keep = [
        "model.layers.0.mlp.experts.gate_up_proj",
        "layers.1.moe.experts.w3",
        "model.norm.weight",
        "optim.step",
    ]
    result = export_safetensors(
        root,
        tmp_path / "out",
        keys=keep,
        rename=hf_views,
        dtype="bf16",
        max_file_bytes=300,
        buffer_bytes=128,
    )
    views = {k: v for k, v in hf_reference(full).items() if v[0] in keep}
    want = expected(full, views, torch.bfloat16)
    assert want["optim.step"].dtype == torch.int64  # integers keep their dtype
    got = read_all(tmp_path / "out")  # checks the index's weight_map lists every output
    assert_bitwise(got, want)
    assert len(result.files) > 3 and result.files[-1] == "model.safetensors.index.json"
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == sorted(want)


def test_strided_int_and_overlapping_views_by_mapping(
    experts: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, full = experts
    gu = "model.layers.0.mlp.experts.gate_up_proj"
    views: dict[str, Any] = {
        gu: [
            ("every_other_row", (1, slice(None, None, 2))),
            ("strided_cols", (slice(0, 4, 3), slice(1, 12, 5), slice(2, None, 4))),
            ("overlap_a", (slice(0, 3), slice(2, 9))),
            ("overlap_b", (slice(1, 4), slice(4, 12), slice(3, 8))),  # shares with overlap_a
            ("one_element", (-1, 11, 9)),  # 0-d output
            ("one_column", (slice(None), slice(None), 7)),
            ("whole", ()),
            ("negative", (-2, slice(-5, None))),
        ],
        "layers.1.moe.experts.w2": [("w2.last_col_strided", (2, slice(None, None, 3), -1))],
        "model.norm.weight": "norm",
    }
    export_safetensors(
        root, tmp_path / "out", keys=list(views), rename=views, buffer_bytes=96, dtype="fp16"
    )
    ref: dict[str, tuple[str, Any]] = {"norm": ("model.norm.weight", ())}
    for name, vs in views.items():
        if isinstance(vs, list):
            ref.update({new: (name, index) for new, index in vs})
    want = expected(full, ref, torch.float16)
    assert want["one_element"].shape == () and want["one_column"].shape == (E, 2 * F)
    assert_bitwise(read_all(tmp_path / "out"), want)


@pytest.mark.multiprocess
def test_views_of_an_fsdp_over_tp_checkpoint(
    sharded: tuple[Path, dict[str, Any]],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Views of tensors saved by ExactSavePlanner for 6 emulated ranks (uneven, strided)."""
    root, full = sharded
    views = {
        "cube": [(f"cube.{i}", i) for i in range(4)] + [("cube.odd", (slice(1, None, 2), 3))],
        "layers.0.wq": [("wq.top", slice(0, 7)), ("wq.rows", slice(2, 13, 4))],
        "runs": [("runs.col", (slice(None), 1))],
    }
    export_safetensors(
        root / "ours", tmp_path / "out", keys=list(views), rename=views, buffer_bytes=64
    )
    ref = {new: (name, index) for name, vs in views.items() for new, index in vs}
    assert_bitwise(read_all(tmp_path / "out"), expected(full, ref))


# ---------------------------------------------------------------------- random
@st.composite
def cases(draw: Any) -> tuple[Any, list[Box], set[int], list[Any], int, Any]:
    nd = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=nd, max_size=nd)))
    cuts = [draw(st.lists(st.integers(1, max(1, n - 1)), max_size=2)) for n in shape]
    chunks = grid(shape, cuts)
    transposed = set(draw(st.sets(st.integers(0, len(chunks) - 1), max_size=3)))

    def entry(n: int) -> Any:
        return st.one_of(
            st.integers(-n, n - 1),
            st.builds(
                slice,
                st.integers(0, n - 1),
                st.integers(1, n),
                st.integers(1, 4),
            ).filter(lambda s: s.start < s.stop),
            st.just(slice(None)),
        )

    views = []
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.integers(0, nd))
        views.append(tuple(draw(entry(n)) for n in shape[:k]))
    buffer_bytes = draw(st.sampled_from([64, 100, 256, 4096]))
    dtype = draw(st.sampled_from([None, torch.bfloat16, torch.float64]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    full = torch.randn(shape, generator=g)
    return full, chunks, transposed, views, buffer_bytes, dtype


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_random_views_of_random_chunkings(case: Any) -> None:
    full, chunks, transposed, views, buffer_bytes, dtype = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        chunked_checkpoint(root, {"t": (full, chunks)}, {("t", i) for i in transposed})
        named = [(f"v{i}", index) for i, index in enumerate(views)]
        export_safetensors(
            root, Path(tmp) / "out", rename={"t": named}, buffer_bytes=buffer_bytes, dtype=dtype
        )
        want = expected({"t": full}, {new: ("t", index) for new, index in named}, dtype)
        assert_bitwise(read_all(Path(tmp) / "out"), want)


# ---------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("rename", "error", "message"),
    [
        (
            {"model.norm.weight": [("n", 10)]},
            ValueError,
            "checkpoint tensor 'model.norm.weight' (10,), output 'n': index 10: 10 is out of "
            "range for dim 0 of size 10",
        ),
        (
            {"model.norm.weight": [("n", slice(0, 4, 0))]},
            ValueError,
            "output 'n': index slice(0, 4, 0): slice slice(0, 4, 0) on dim 0 has step 0",
        ),
        (
            {"model.norm.weight": [("n", slice(None, None, -1))]},
            ValueError,
            "has step -1; steps >= 1",
        ),
        (
            {"model.norm.weight": [("n", (1, 2))]},
            ValueError,
            "output 'n': index (1, 2) has 2 entries for global_shape (10,) (1 dims)",
        ),
        (
            {"model.norm.weight": [("n", slice(3, 3))]},
            ValueError,
            "output 'n': index slice(3, 3, None) selects no element (view shape (0,))",
        ),
        (
            {"layers.1.moe.experts.w1": [("a", 0), ("a", 1)]},
            ValueError,
            "'layers.1.moe.experts.w1' (view (0, slice(0, 6, 1), slice(0, 10, 1))) and "
            "'layers.1.moe.experts.w1' (view (1, slice(0, 6, 1), slice(0, 10, 1))) would both "
            "be written as 'a'",
        ),
        (
            {"layers.1.moe.experts.w1": [("x", 0)], "layers.1.moe.experts.w2": [("x", 0)]},
            ValueError,
            "'layers.1.moe.experts.w1' (view (0, slice(0, 6, 1), slice(0, 10, 1))) and "
            "'layers.1.moe.experts.w2' (view (0, slice(0, 10, 1), slice(0, 6, 1))) would both "
            "be written as 'x'",
        ),
        (
            {"layers.1.moe.experts.w1": [("model.norm.weight", 0)]},
            ValueError,
            "'layers.1.moe.experts.w1' (view (0, slice(0, 6, 1), slice(0, 10, 1))) and "
            "'model.norm.weight' would both be written as 'model.norm.weight'",
        ),
        ({"model.norm.weight": [("n", [1])]}, TypeError, "entry [1] on dim 0 must be an int"),
        ({"model.norm.weight": [("n", 1.0)]}, TypeError, "entry 1.0 on dim 0 must be an int"),
        ({"model.norm.weight": [["n", 1]]}, TypeError, "must be a pair (output name, index)"),
        ({"model.norm.weight": [("", 1)]}, ValueError, "'' is not a valid tensor name"),
        ({"model.norm.weight": []}, ValueError, "gives no output; leave the tensor out with keys"),
        (lambda n: None, ValueError, "-> None is not a valid tensor name"),
    ],
)
def test_bad_views_raise_before_writing(
    experts: tuple[Path, dict[str, Any]], tmp_path: Path, rename: Any, error: Any, message: str
) -> None:
    root, _ = experts
    with pytest.raises(error) as info:
        export_safetensors(root, tmp_path / "out", rename=rename)
    assert message in str(info.value)
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------- memory
MEASURE = """
import sys
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
import torch
import meshlayout.torch.checkpoint as mlcp
ckpt, out, mode, E, F = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
if mode == "export":
    views = [(f"e{e}.gate", (e, slice(0, F))) for e in range(E)]
    views += [(f"e{e}.up", (e, slice(F, 2 * F))) for e in range(E)]
    views += [(f"e{e}.even", (e, slice(0, 2 * F, 2))) for e in range(E)]
    mlcp.export_safetensors(ckpt, out, rename=lambda n: views, buffer_bytes=8 * 2**20)
print(peak())
"""


def test_views_of_a_large_stacked_tensor_stay_near_buffer_bytes(tmp_path: Path) -> None:
    """192 MiB of stacked experts -> per-expert (and strided) views with an 8 MiB buffer:
    the exporting process's peak RSS (VmHWM, a fresh interpreter) stays near the idle
    interpreter's plus the buffer, far below the tensor's size."""
    n_e, n_i, n_h = 12, 1024, 2048  # 12 x 2048 x 2048 float32 = 192 MiB
    g = torch.Generator().manual_seed(5)
    full = torch.randn(n_e, 2 * n_i, n_h, generator=g)
    root = tmp_path / "ckpt"
    chunked_checkpoint(root, {"w": (full, grid(full.shape, [[5], [700], []]))})
    size = full.numel() * full.element_size()

    def peak(mode: str) -> int:
        argv = [str(root), str(tmp_path / "out"), mode, str(n_e), str(n_i)]
        proc = subprocess.run(
            [sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, check=True
        )
        return int(proc.stdout.strip().splitlines()[-1])

    idle, used = peak("idle"), peak("export")
    extra = used - idle
    print(
        f"tensor {size >> 20} MiB: idle {idle >> 20} MiB, export {used >> 20} MiB, "
        f"extra {extra >> 20} MiB"
    )
    assert extra < 8 * 2**20 + 24 * 2**20, extra  # the buffer plus slack, not 192 MiB
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "model.safetensors"), framework="pt") as f:
        for e in (0, 5, 11):
            assert torch.equal(f.get_tensor(f"e{e}.gate"), full[e, :n_i])
            assert torch.equal(f.get_tensor(f"e{e}.up"), full[e, n_i:])
            assert torch.equal(f.get_tensor(f"e{e}.even"), full[e, ::2])


def test_box_views_read_each_share_in_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per-expert views of an expert-parallel checkpoint: each view lies in one chunk and
    is contiguous there, so it costs one positioned read (two when the chunks also cut
    the hidden dim, one per chunk)."""
    from meshlayout.torch.checkpoint import _export

    full = torch.randn(E, 2 * F, H, generator=torch.Generator().manual_seed(1))
    views = [(f"{e}.gate", (e, slice(0, F))) for e in range(E)]
    views += [(f"{e}.up", (e, slice(F, 2 * F))) for e in range(E)]
    reads: list[int] = []
    real = _export._read_into

    def counted(f: Any, view: memoryview, offset: int) -> None:
        reads.append(len(view))
        real(f, view, offset)

    monkeypatch.setattr(_export, "_read_into", counted)
    for cuts, per_view in (([[1, 3], [], []], 1), ([[2], [], [4]], 2)):
        root, out = tmp_path / f"ckpt{per_view}", tmp_path / f"out{per_view}"
        chunked_checkpoint(root, {"w": (full, grid(full.shape, cuts))})
        reads.clear()
        export_safetensors(root, out, rename={"w": views})
        assert len(reads) == per_view * len(views)
        ref = {new: ("w", index) for new, index in views}
        assert_bitwise(read_all(out), expected({"w": full}, ref))


def test_a_tiny_qwen3_moe_loads_from_the_exported_per_expert_files(tmp_path: Path) -> None:
    """transformers 5 keeps Qwen3-MoE experts stacked in memory (``gate_up_proj``
    [E, 2I, H], ``down_proj`` [E, H, I]) and saves them per expert: the views write the
    same files ``save_pretrained`` does, and ``from_pretrained`` gives the same logits."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=32,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    sd = model.state_dict()
    n_e, n_i = cfg.num_experts, cfg.moe_intermediate_size
    assert sd["model.layers.0.mlp.experts.gate_up_proj"].shape == (n_e, 2 * n_i, 16)
    ckpt = tmp_path / "ckpt"
    dcp.save({k: v.clone() for k, v in sd.items()}, checkpoint_id=str(ckpt), no_dist=True)

    def per_expert(name: str) -> Any:
        if name.endswith("experts.gate_up_proj"):
            p = name.removesuffix("gate_up_proj")
            return [(f"{p}{e}.gate_proj.weight", (e, slice(0, n_i))) for e in range(n_e)] + [
                (f"{p}{e}.up_proj.weight", (e, slice(n_i, 2 * n_i))) for e in range(n_e)
            ]
        if name.endswith("experts.down_proj"):
            return [
                (f"{name}".replace("down_proj", f"{e}.down_proj.weight"), e) for e in range(n_e)
            ]
        return name

    out = tmp_path / "hf"
    export_safetensors(ckpt, out, rename=per_expert)
    cfg.save_pretrained(out)
    model.save_pretrained(tmp_path / "reference")  # transformers' own per-expert files
    assert_bitwise(read_all(out), read_all(tmp_path / "reference"))
    loaded = transformers.Qwen3MoeForCausalLM.from_pretrained(out).eval()
    ids = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
