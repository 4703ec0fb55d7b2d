"""``load_safetensors`` on one process: plain tensors, odd dtypes, boxes, errors.

Files are written by the ``safetensors`` library itself (the real client), and the
expected values are the tensors that were saved, sliced by torch indexing (an
independent reference for the byte arithmetic of box reads). Multi-process DTensor
loads are in tests/test_safetensors_load_multiproc.py.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

import numpy as np  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as hst  # noqa: E402

from meshlayout.torch.checkpoint import (  # noqa: E402
    LoadStats,
    load_safetensors,
    read_safetensors_index,
)
from meshlayout.torch.checkpoint import _safetensors_load as sl  # noqa: E402

pytestmark = pytest.mark.torch


def _odd() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return {
        "bf16": torch.randn(5, 7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(3, 4, 2, generator=g).to(torch.float16),
        "i64": torch.arange(-50, 50, 7, dtype=torch.int64),
        "bool": torch.randn(4, 3, generator=g) > 0,
        "scalar": torch.tensor(2.5),
        "f64": torch.randn(6, generator=g, dtype=torch.float64),
        "i8": torch.arange(-8, 8, dtype=torch.int8).reshape(4, 4),
        "empty": torch.zeros(0, 5),
    }


def test_plain_tensors_odd_dtypes(tmp_path: Path) -> None:
    ref = _odd()
    st.save_file(ref, tmp_path / "model.safetensors")
    dest = {k: torch.zeros_like(v) for k, v in ref.items()}
    dest["note"] = "kept"
    stats = load_safetensors(dest, tmp_path / "model.safetensors")
    for k, v in ref.items():
        assert dest[k].dtype == v.dtype
        assert torch.equal(dest[k], v), k
    assert dest["note"] == "kept"
    need = sum(v.numel() * v.element_size() for v in ref.values())
    assert isinstance(stats, LoadStats)
    assert stats.bytes_read == stats.bytes_needed == need
    assert stats.tensors == len(ref) and stats.files == 1


def test_directory_with_and_without_index(tmp_path: Path) -> None:
    ref = _odd()
    names = sorted(ref)
    first, second = names[:4], names[4:]
    st.save_file({k: ref[k] for k in first}, tmp_path / "model-00001-of-00002.safetensors")
    st.save_file({k: ref[k] for k in second}, tmp_path / "model-00002-of-00002.safetensors")
    dest = {k: torch.zeros_like(v) for k, v in ref.items()}
    stats = load_safetensors(dest, tmp_path)  # no index: headers scanned
    assert all(torch.equal(dest[k], ref[k]) for k in ref) and stats.files == 2
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in second}
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    dest = {k: torch.zeros_like(v) for k, v in ref.items()}
    load_safetensors(dest, str(tmp_path))
    assert all(torch.equal(dest[k], ref[k]) for k in ref)
    assert set(read_safetensors_index(tmp_path)) == set(ref)


def test_rename_and_cast(tmp_path: Path) -> None:
    w = torch.randn(4, 6, generator=torch.Generator().manual_seed(1))
    st.save_file({"model.w": w}, tmp_path / "m.safetensors")
    dest = {"w": torch.zeros(4, 6)}
    load_safetensors(dest, tmp_path / "m.safetensors", rename={"w": "model.w"})
    assert torch.equal(dest["w"], w)
    dest = {"w": torch.zeros(4, 6, dtype=torch.bfloat16)}
    load_safetensors(dest, tmp_path / "m.safetensors", rename=lambda n: "model." + n, cast=True)
    assert torch.equal(dest["w"], w.to(torch.bfloat16))
    # tied weights: both names of one tensor, the file holds one of them
    tied = torch.zeros(4, 6)
    dest = {"model.w": tied, "head.w": tied, "step": 3}
    load_safetensors(dest, tmp_path / "m.safetensors", rename={"head.w": "model.w"})
    assert torch.equal(tied, w) and dest["step"] == 3


def test_errors_name_the_tensor(tmp_path: Path) -> None:
    st.save_file({"w": torch.zeros(4, 6)}, tmp_path / "m.safetensors")
    f = tmp_path / "m.safetensors"
    with pytest.raises(KeyError, match="missing"):
        load_safetensors({"missing": torch.zeros(1)}, f)
    with pytest.raises(ValueError, match=r"w: stored shape \[4, 6\].*\[6, 4\]"):
        load_safetensors({"w": torch.zeros(6, 4)}, f)
    with pytest.raises(ValueError, match=r"w: stored dtype F32.*cast=True"):
        load_safetensors({"w": torch.zeros(4, 6, dtype=torch.float16)}, f)
    with pytest.raises(TypeError, match="flat state dict"):
        load_safetensors({"model": {"w": torch.zeros(4, 6)}}, f)
    with pytest.raises(TypeError, match="rename"):
        load_safetensors({"w": torch.zeros(4, 6)}, f, rename=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no such"):
        load_safetensors({"w": torch.zeros(4, 6)}, tmp_path / "nope")
    with pytest.raises(ValueError, match="meta"):
        load_safetensors({"w": torch.empty(4, 6, device="meta")}, f)
    dest = {"w": torch.ones(4, 6)}
    with pytest.raises(KeyError):
        load_safetensors({**dest, "missing": torch.zeros(1)}, f)
    assert torch.equal(dest["w"], torch.ones(4, 6))  # checked before anything is read


def _raw_file(path: Path, header: object, data: bytes = b"") -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_malformed_files(tmp_path: Path) -> None:
    dest = {"w": torch.zeros(2)}
    unknown = {"w": {"dtype": "F4X", "shape": [2], "data_offsets": [0, 2]}}
    with pytest.raises(ValueError, match=r"'w' has a malformed entry.*F4X"):
        load_safetensors(dest, _raw_file(tmp_path / "a.safetensors", unknown, b"\0\0"))
    wrong = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}
    with pytest.raises(ValueError, match=r"'w' data_offsets"):
        load_safetensors(dest, _raw_file(tmp_path / "b.safetensors", wrong, b"\0" * 4))
    beyond = {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    with pytest.raises(ValueError, match=r"'w' data_offsets \[0, 8\] do not hold"):
        load_safetensors(dest, _raw_file(tmp_path / "c.safetensors", beyond, b"\0" * 4))
    (tmp_path / "d.safetensors").write_bytes(struct.pack("<Q", 10**12))
    with pytest.raises(
        ValueError, match=r"not a safetensors file \(header length 10+, file size 8\)"
    ):
        load_safetensors(dest, tmp_path / "d.safetensors")
    (tmp_path / "e.safetensors").write_bytes(struct.pack("<Q", 3) + b"{x}")
    with pytest.raises(ValueError, match="header is not JSON"):
        load_safetensors(dest, tmp_path / "e.safetensors")
    st.save_file({"w": torch.zeros(2)}, tmp_path / "sub1.safetensors")
    twice = tmp_path / "twice"
    twice.mkdir()
    st.save_file({"w": torch.zeros(2)}, twice / "a.safetensors")
    st.save_file({"w": torch.zeros(2)}, twice / "b.safetensors")
    with pytest.raises(ValueError, match="'w' is stored in both"):
        load_safetensors(dest, twice)


def test_big_endian_host_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    st.save_file({"w": torch.zeros(2)}, tmp_path / "m.safetensors")
    monkeypatch.setattr(sl.sys, "byteorder", "big")
    with pytest.raises(ValueError, match="little-endian"):
        load_safetensors({"w": torch.zeros(2)}, tmp_path / "m.safetensors")


@settings(max_examples=60, deadline=None)
@given(data=hst.data())
def test_read_box_matches_slicing(tmp_path_factory: Any, data: Any) -> None:
    """Any box of any stored tensor: values equal torch slicing; bytes read as the rule says."""
    outer = data.draw(hst.lists(hst.integers(1, 9), min_size=0, max_size=3))
    last = data.draw(hst.one_of(hst.integers(1, 9), hst.integers(1000, 3000)))  # wide rows
    shape = (*outer, last)
    dtype = data.draw(hst.sampled_from([torch.float32, torch.int16, torch.bfloat16]))
    full = torch.arange(math.prod(shape)).reshape(shape).to(dtype)
    box = []
    for n in shape:
        a = data.draw(hst.integers(0, n - 1))
        box.append((a, data.draw(hst.integers(a + 1, n))))
    path = tmp_path_factory.mktemp("box") / "m.safetensors"
    st.save_file({"t": full}, path)
    entry = read_safetensors_index(path)["t"]
    reader = sl._Reader()
    try:
        got = reader.read_box(entry, tuple(box))
    finally:
        reader.close()
    want = full[tuple(slice(a, b) for a, b in box)]
    assert torch.equal(got, want)
    assert reader.bytes_read == _expected_bytes(shape, box, full.element_size())


def _expected_bytes(shape: tuple[int, ...], box: list[tuple[int, int]], item: int) -> int:
    """Brute force: the byte offset of every element of the box, grouped into maximal
    contiguous runs; when every gap between runs is shorter than a page (4096) the
    enclosing span is read, else exactly the runs."""
    grids = np.meshgrid(*(np.arange(a, b) for a, b in box), indexing="ij")
    starts = np.sort(np.ravel_multi_index([g.ravel() for g in grids], shape)) * item
    breaks = np.flatnonzero(np.diff(starts) != item)
    run_starts = np.concatenate([[starts[0]], starts[breaks + 1]])
    run_ends = np.concatenate([starts[breaks] + item, [starts[-1] + item]])
    gaps = run_starts[1:] - run_ends[:-1]
    if gaps.size and gaps.max() < 4096:
        return int(run_ends[-1] - run_starts[0])
    return int((run_ends - run_starts).sum())


def test_wide_column_runs_read_exactly(tmp_path: Path) -> None:
    """Column runs wider than a page: one read per row, exactly the share."""
    full = torch.arange(8 * 4096, dtype=torch.float32).reshape(8, 4096)
    st.save_file({"t": full}, tmp_path / "m.safetensors")
    entry = read_safetensors_index(tmp_path / "m.safetensors")["t"]
    reader = sl._Reader()
    got = reader.read_box(entry, ((1, 7), (2048, 4096)))
    reader.close()
    assert torch.equal(got, full[1:7, 2048:])
    assert reader.bytes_read == 6 * 2048 * 4 and reader.reads == 6
    # through a buffer: a destination of another dtype, or not contiguous
    wide = torch.zeros(6, 2048, dtype=torch.float64)
    reader.fill(entry, ((1, 7), (2048, 4096)), wide)
    transposed = torch.zeros(2048, 6).t()
    reader.fill(entry, ((1, 7), (2048, 4096)), transposed)
    reader.close()
    assert torch.equal(wide, full[1:7, 2048:].double())
    assert torch.equal(transposed, full[1:7, 2048:])


def test_slabs_bound_memory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Boxes larger than a slab are read slab by slab, with the same values."""
    monkeypatch.setattr(sl, "_SLAB_BYTES", 64)
    full = torch.arange(5 * 3 * 11, dtype=torch.float32).reshape(5, 3, 11)
    st.save_file({"t": full}, tmp_path / "m.safetensors")
    dest = {"t": torch.zeros_like(full)}
    stats = load_safetensors(dest, tmp_path / "m.safetensors")
    assert torch.equal(dest["t"], full)
    assert stats.bytes_read == full.numel() * 4 and stats.reads > 5
    slabs = list(sl._slabs(((0, 5), (0, 3), (0, 11)), 4))
    assert all(math.prod(b - a for a, b in s) * 4 <= 64 for s in slabs)
    cells = {
        (i, j, k) for s in slabs for i in range(*s[0]) for j in range(*s[1]) for k in range(*s[2])
    }
    assert len(cells) == sum(math.prod(b - a for a, b in s) for s in slabs) == full.numel()


def test_without_positioned_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Platforms without ``os.preadv`` (Windows) seek and read: same values, same bytes."""
    monkeypatch.setattr(sl, "_PREADV", None)
    full = torch.arange(8 * 2048, dtype=torch.float32).reshape(8, 2048)
    st.save_file({"t": full}, tmp_path / "m.safetensors")
    entry = read_safetensors_index(tmp_path / "m.safetensors")["t"]
    reader = sl._Reader()
    got = reader.read_box(entry, ((2, 8), (1024, 2048)))
    reader.close()
    assert torch.equal(got, full[2:, 1024:])
    assert reader.bytes_read == 6 * 1024 * 4 and reader.reads == 6
