"""``load_safetensors``: fill each rank's pieces from Hugging Face safetensors files.

See ``docs/checkpoint.md#hugging-face-to-training``.

Every rank, no collectives: for each tensor of the state dict, the rank reads from the
file only the byte ranges of the run boxes it holds (the nested shard order of
:class:`~meshlayout.sharding.ShardingSpec`, as FSDP2 / TP / redistribute store
DTensors: uneven, strided, several runs per rank) and copies them into its local
tensor in place. Plain tensors are read whole.

The safetensors format is small and documented (:mod:`._st_format` parses the header):
an 8-byte little-endian header length ``N``, ``N`` bytes of JSON ``{name: {"dtype",
"shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then the raw
little-endian, row-major data (offsets relative to the end of the header). So the
bytes of a box are found by arithmetic and read with ``os.preadv`` (seek and
``readinto`` where it is missing) straight into a buffer, and every byte read is counted (:class:`LoadStats`).

Which bytes are read: a box is cut into slabs of at most ``_SLAB_BYTES`` (64 MiB:
bounded memory); a slab's elements lie in ``count`` contiguous byte ranges of equal
length (one range for whole rows of a row-major tensor; one range per row for column
runs). When every gap between consecutive ranges is shorter than a page (4 KiB), no
page of the enclosing span lies wholly in a gap, so the storage delivers the same
pages whether the gaps are skipped or not: the span is read in one call and the gaps
count as over-read in :attr:`LoadStats.bytes_read`. Otherwise each range is read
exactly, one call per range. So a rank reads exactly its share for row runs and for
column runs with gaps of a page or more (a Rowwise weight of 4096 bf16 columns at
tp=2 has 4 KiB gaps), and its share plus under 4 KiB per range otherwise.

>>> import struct, json, tempfile, os, torch
>>> d = tempfile.mkdtemp()
>>> header = json.dumps({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})
>>> with open(os.path.join(d, "m.safetensors"), "wb") as f:
...     _ = f.write(struct.pack("<Q", len(header)) + header.encode())
...     _ = f.write(torch.arange(6.0).numpy().tobytes())
>>> sd = {"w": torch.zeros(2, 3), "step": 7}
>>> load_safetensors(sd, os.path.join(d, "m.safetensors")).bytes_read
24
>>> sd["w"].tolist(), sd["step"]
([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], 7)
"""

from __future__ import annotations

import io
import itertools
import json
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ...sharding import Box, RunBox, run_boxes
from .._c10d import local_tensor
from ._planners import _local_piece, dtensor_spec
from ._st_format import DTYPES, INDEX_NAME, read_header

__all__ = ["LoadStats", "SafetensorsEntry", "load_safetensors", "read_safetensors_index"]

#: Gaps shorter than a page between a slab's ranges are read through.
_PAGE_BYTES = 4096
#: Largest buffer read at once for one box (a box is read in slabs of at most this).
_SLAB_BYTES = 64 * 2**20

#: Positioned reads into a buffer (``os.preadv``), where the platform has them.
_PREADV = getattr(os, "preadv", None)

Rename = Mapping[str, str] | Callable[[str], str] | None


@dataclass(frozen=True)
class LoadStats:
    """What one rank's :func:`load_safetensors` read.

    ``bytes_read``: bytes requested from the files (data only, gaps read through
    included; headers are counted in ``header_bytes``). ``bytes_needed``: the stored
    bytes of the elements this rank holds (its share); ``bytes_read - bytes_needed``
    is the over-read. ``reads``: read calls; ``tensors``: tensors filled; ``files``:
    files whose data was read.
    """

    bytes_read: int
    bytes_needed: int
    header_bytes: int
    reads: int
    tensors: int
    files: int


@dataclass(frozen=True)
class SafetensorsEntry:
    """One tensor stored in a safetensors file: where its bytes are and what they mean."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int  # absolute file offset of the first data byte
    end: int
    data_start: int  # absolute offset where the file's data starts (8 + header length)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of the stored values."""
        return DTYPES[self.dtype]


def _read_header(file: Path) -> dict[str, SafetensorsEntry]:
    """The entries of one safetensors file (its header checked by :func:`read_header`)."""
    try:
        header, base = read_header(file)
    except OSError as exc:
        raise ValueError(f"cannot read safetensors file {file}: {exc}") from None
    return {
        name: SafetensorsEntry(
            name,
            file,
            str(info["dtype"]),
            tuple(int(n) for n in info["shape"]),
            base + int(info["data_offsets"][0]),
            base + int(info["data_offsets"][1]),
            base,
        )
        for name, info in header.items()
        if name != "__metadata__"
    }


def read_safetensors_index(path: str | os.PathLike[str]) -> dict[str, SafetensorsEntry]:
    """Every tensor stored under ``path``: name -> :class:`SafetensorsEntry`.

    ``path`` is a ``.safetensors`` file or a directory: with
    ``model.safetensors.index.json`` its ``weight_map`` names the files (each file's
    header is read once); without, every ``*.safetensors`` file in it is scanned. A
    name stored in two files, or listed in the index but absent from its file, raises
    ValueError. Only headers are read.
    """
    root = Path(path)
    if root.is_file():
        return _read_header(root)
    if not root.is_dir():
        raise ValueError(f"{root}: no such safetensors file or directory")
    index_file = root / INDEX_NAME
    if index_file.is_file():
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
            files = sorted({str(f) for f in weight_map.values()})
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{index_file}: not a safetensors index ({exc!r})") from None
        headers = {f: _read_header(root / f) for f in files}
        out: dict[str, SafetensorsEntry] = {}
        for name, f in weight_map.items():
            entry = headers[str(f)].get(name)
            if entry is None:
                raise ValueError(f"{index_file}: {name!r} is mapped to {f}, which does not hold it")
            out[name] = entry
        return out
    found = sorted(root.glob("*.safetensors"))
    if not found:
        raise ValueError(f"{root}: no *.safetensors files and no model.safetensors.index.json")
    out = {}
    for file in found:
        for name, entry in _read_header(file).items():
            if name in out:
                raise ValueError(f"{name!r} is stored in both {out[name].file} and {file}")
            out[name] = entry
    return out


def _renamer(rename: Rename) -> Callable[[str], str]:
    if rename is None:
        return lambda name: name
    if isinstance(rename, Mapping):
        table = dict(rename)
        return lambda name: table.get(name, name)
    if callable(rename):
        return rename
    raise TypeError(f"rename must be a mapping, a callable or None, got {type(rename).__name__}")


def _slabs(box: Box, itemsize: int) -> Iterator[Box]:
    """``box`` cut into sub-boxes of at most ``_SLAB_BYTES`` (at least one element each).

    The outermost dim ``d`` whose inner part (dims after it) fits is cut into steps;
    dims before it are taken one index at a time.

    >>> list(_slabs(((0, 2), (0, 3)), 2**25))  # rows of 96 MiB: one row, then halves
    [((0, 1), (0, 2)), ((0, 1), (2, 3)), ((1, 2), (0, 2)), ((1, 2), (2, 3))]
    """
    extents = [b - a for a, b in box]
    if itemsize * math.prod(extents) <= _SLAB_BYTES:
        yield box
        return
    d = 0
    while itemsize * math.prod(extents[d + 1 :]) > _SLAB_BYTES:
        d += 1
    step = max(1, _SLAB_BYTES // (itemsize * math.prod(extents[d + 1 :])))
    lo, hi = box[d]
    for head in itertools.product(*(range(a, b) for a, b in box[:d])):
        for start in range(lo, hi, step):
            yield (*((i, i + 1) for i in head), (start, min(hi, start + step)), *box[d + 1 :])


class _Reader:
    """Reads boxes of stored tensors into destinations, counting bytes and read calls."""

    def __init__(self) -> None:
        self._files: dict[Path, io.FileIO] = {}
        self.bytes_read = 0
        self.reads = 0

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    @property
    def files(self) -> int:
        return len(self._files)

    def _file(self, file: Path) -> io.FileIO:
        f = self._files.get(file)
        if f is None:
            f = self._files[file] = io.FileIO(file, "r")
        return f

    def _pread(self, f: io.FileIO, view: memoryview, offset: int) -> None:
        done = 0
        while done < len(view):  # short reads are legal; loop until filled
            if _PREADV is not None:
                got = _PREADV(f.fileno(), [view[done:]], offset + done)
            else:  # no positioned read here (Windows): seek, then read
                f.seek(offset + done)
                got = f.readinto(view[done:]) or 0
            if got <= 0:
                raise ValueError(f"{f.name}: unexpected end of file at byte {offset + done}")
            done += got
        self.bytes_read += len(view)
        self.reads += 1

    def read_box(self, entry: SafetensorsEntry, box: Box) -> torch.Tensor:
        """The stored values of ``box`` (global indices), as a new tensor of the stored dtype."""
        out = torch.empty([b - a for a, b in box], dtype=entry.torch_dtype)
        self.fill(entry, box, out)
        return out

    def fill(self, entry: SafetensorsEntry, box: Box, dest: torch.Tensor) -> None:
        """Copy the stored values of ``box`` (global indices) into ``dest`` (box-shaped).

        Reads straight into ``dest``'s memory when it is a contiguous CPU tensor of the
        stored dtype (one copy, kernel to destination); otherwise through a buffer and
        ``copy_`` (which casts and moves to ``dest``'s device). Gaps shorter than a
        page are read through (module doc).
        """
        dtype = entry.torch_dtype
        item = dtype.itemsize
        shape = entry.shape
        strides = [item * math.prod(shape[d + 1 :]) for d in range(len(shape))]
        sizes = [b - a for a, b in box]
        first = entry.begin + sum(a * s for (a, _), s in zip(box, strides))
        # contiguous ranges: dims after k are whole, so each index of dims < k is one range
        k = len(shape) - 1
        while k > 0 and box[k] == (0, shape[k]):
            k -= 1
        length = (sizes[k] * strides[k]) if shape else item
        count = math.prod(sizes[:k]) if shape else 1
        span = sum((b - 1 - a) * s for (a, b), s in zip(box, strides)) + item
        f = self._file(entry.file)
        direct = dest.dtype == dtype and dest.is_contiguous() and dest.device.type == "cpu"
        contiguous = span == count * length
        offsets: list[int] = []
        if not contiguous:
            offsets = _range_offsets(first, sizes[:k], strides[:k])
            gap = max(b - a for a, b in itertools.pairwise(offsets)) - length
            if gap < _PAGE_BYTES:  # no page lies wholly in a gap: read the span through
                buf = torch.empty(span, dtype=torch.uint8)
                self._pread(f, _bytes(buf), first)
                elem = [s // item for s in strides]
                dest.copy_(buf.view(dtype).as_strided(sizes, elem))
                return
        # exact ranges, in order: straight into dest, or into a buffer then copy_
        target = dest if direct else torch.empty(sizes, dtype=dtype)
        view = _bytes(target)
        if contiguous:
            self._pread(f, view, first)
        else:
            pread = self._pread
            for j, offset in enumerate(offsets):
                pread(f, view[j * length : (j + 1) * length], offset)
        if not direct:
            dest.copy_(target)


def _range_offsets(first: int, sizes: Sequence[int], strides: Sequence[int]) -> list[int]:
    """File offsets of the ranges of a box: ``first`` plus every combination of
    ``index * stride`` over the outer dims (row-major order), vectorised.

    >>> _range_offsets(100, [2, 3], [1000, 10])
    [100, 110, 120, 1100, 1110, 1120]
    """
    offsets = np.array([first], dtype=np.int64)
    for n, stride in zip(sizes, strides):
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64) * stride).reshape(-1)
    result: list[int] = offsets.tolist()
    return result


def _bytes(tensor: torch.Tensor) -> memoryview:
    """A writable byte view of a contiguous CPU tensor's memory (any dtype, 0-d too)."""
    flat = tensor.detach().reshape(-1).view(torch.uint8)
    view: memoryview = flat.numpy().data
    return view.cast("B")


def _targets(
    state_dict: Mapping[str, Any], rank: int
) -> Iterator[tuple[str, torch.Tensor, tuple[RunBox, ...], tuple[int, ...]]]:
    """(name, local tensor, run boxes, global shape) for every tensor value."""
    for name, value in state_dict.items():
        if isinstance(value, DTensor):
            spec = dtensor_spec(value)
            _local_piece(name, value, spec, rank)  # validates the local shape
            local = local_tensor(value)
            if type(local) not in (torch.Tensor, torch.nn.Parameter):
                raise TypeError(
                    f"{name}: the DTensor wraps a {type(local).__name__}; only plain local "
                    "tensors can be filled"
                )
            boxes = tuple(rb for rb in run_boxes(spec, rank) if rb.numel)
            yield name, local, boxes, spec.global_shape
        elif isinstance(value, torch.Tensor):
            shape = tuple(int(n) for n in value.shape)
            whole = RunBox(tuple((0, n) for n in shape), (0,) * len(shape))
            yield name, value, ((whole,) if value.numel() else ()), shape
        elif isinstance(value, Mapping):
            raise TypeError(
                f"state_dict[{name!r}] is a mapping: load_safetensors takes a flat state dict "
                "(e.g. model.state_dict()); pass the inner dict"
            )


def load_safetensors(
    state_dict: dict[str, Any],
    path: str | os.PathLike[str],
    *,
    rename: Rename = None,
    cast: bool = False,
) -> LoadStats:
    """Fill ``state_dict``'s tensors in place from safetensors files; returns :class:`LoadStats`.

    Call on every rank (no collectives). ``path``: a ``.safetensors`` file or a
    directory (with or without ``model.safetensors.index.json``). Each DTensor (any
    sharding: uneven, ``StridedShard`` / FSDP over TP, several runs per rank, replicas)
    gets its local piece and each plain tensor its full value; each rank reads only the
    bytes of the boxes it holds (see the module doc for the read-through of small gaps).
    Non-tensor values are left untouched; a nested mapping raises TypeError (pass a flat
    state dict such as ``model.state_dict()``). ``rename``: state-dict name -> stored
    name (mapping, names absent from it unchanged, or callable).

    Errors name the tensor: KeyError when it is not stored; ValueError for a shape
    mismatch, a dtype mismatch (unless ``cast=True``, which converts to each
    destination's dtype), an unsupported stored dtype, a local piece whose shape is not
    the one its placements give, or a malformed file.
    """
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    if sys.byteorder != "little":
        raise ValueError(
            "load_safetensors needs a little-endian host (safetensors data is little-endian)"
        )
    to_stored = _renamer(rename)
    stored = read_safetensors_index(path)
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    plan = []
    for name, local, boxes, shape in _targets(state_dict, rank):
        key = to_stored(name)
        if not isinstance(key, str):
            raise TypeError(f"rename({name!r}) must give a str, got {type(key).__name__}")
        entry = stored.get(key)
        if entry is None:
            alias = f" (stored name {key!r})" if key != name else ""
            raise KeyError(f"{name}{alias} is not in {path}; it holds {len(stored)} tensors")
        if entry.shape != shape:
            raise ValueError(
                f"{name}: stored shape {list(entry.shape)} in {entry.file.name} differs from "
                f"the destination's global shape {list(shape)}"
            )
        if entry.torch_dtype != local.dtype and not cast:
            raise ValueError(
                f"{name}: stored dtype {entry.dtype} ({entry.torch_dtype}) differs from the "
                f"destination's {local.dtype}; pass cast=True to convert"
            )
        if local.device.type == "meta":
            raise ValueError(f"{name}: the destination is on the meta device; materialise it first")
        plan.append((entry, local, boxes))
    reader = _Reader()
    needed = 0
    try:
        with torch.no_grad():
            for entry, local, boxes in plan:
                item = entry.torch_dtype.itemsize
                for rb in boxes:
                    needed += rb.numel * item
                    for slab in _slabs(rb.box, item):
                        reader.fill(entry, slab, local[rb.local_slices(slab)])
    finally:
        files = reader.files
        reader.close()
    headers = sum({e.file: e.data_start for e in stored.values()}.values())
    return LoadStats(reader.bytes_read, needed, headers, reader.reads, len(plan), files)
