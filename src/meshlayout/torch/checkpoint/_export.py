"""``export_safetensors``: a DCP checkpoint to Hugging Face safetensors, streamed.

See ``docs/checkpoint.md#export-to-hugging-face-safetensors``.

One process, no process group. The plan is made and checked before anything is
written: every selected tensor's saved chunks must tile it exactly
(:func:`~._plan.tiling`; a hole or overlap raises naming the tensor and the region),
and every chunk's stored archive must hold the shape and dtype the metadata promises
(plain DCP's uneven FSDP-over-TP checkpoints fail here). Then each output file gets
its header (written by hand, :mod:`._st_format`) and each tensor's bytes are filled
in place, one *slab* at a time: a slab is a range of the output in row-major order
cut along one dim so that every chunk's share of it is one contiguous byte range of
that chunk's stored data (:mod:`._distcp`). Per slab: read each share into an input
buffer, copy (casting if asked) into an output buffer, write the output buffer with
one positioned write (a share that is a contiguous part of the slab and needs no cast
is read straight into the output buffer). The two buffers share ``buffer_bytes``:
resident memory stays near ``buffer_bytes`` above the interpreter's, whatever the model
or tensor size.

A view (``rename`` answering ``[(name, index), ...]``) is an output of its own: its
slabs are cut in the view's row-major order and mapped back to a selection of the
source tensor (a box when every step is 1); each chunk's share of that selection is
read with as few positioned reads as its layout allows (one when it is contiguous in
the chunk, as for per-expert cuts of a stacked tensor; a strided share is read span by
span, each span within the input buffer, and selected). The source is never loaded.

The files are written in a temporary directory inside ``out_dir`` and moved into
place at the end (the index, or the single file, last), so an interrupted export
never leaves a complete-looking model.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import shutil
import sys
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, TensorStorageMetadata

from ...sharding._runs_spec import _check_index as _basic_index
from ._distcp import StoredTensor, locate, safe_relative
from ._inspect import read_metadata
from ._plan import ChunkIndex, tiling
from ._st_format import (
    INDEX_NAME,
    SINGLE_NAME,
    dtype_name,
    header_bytes,
    safetensors_dtype,
    shard_name,
)

__all__ = ["ExportResult", "NotExportableError", "export_safetensors"]

Progress = Callable[[int, int], None]
#: a basic index of a tensor's global shape: ints (drop the dim) and slices (step >= 1)
Index = int | slice | tuple[int | slice, ...]
#: one output tensor cut from a checkpoint tensor: ``(output name, index)``
View = tuple[str, Index]
#: what ``rename`` gives for one checkpoint name: an output name, or a list of views
Renamed = str | list[View]
# one output of a checkpoint tensor: (output name, normalised index or None = whole)
_Out = tuple[str, tuple[int | slice, ...] | None]
_MIN_BUFFER = 64


class NotExportableError(ValueError):
    """The checkpoint does not hold some tensor exactly: its chunks leave a hole or
    overlap, a stored chunk is not what the metadata says, or its data file is missing,
    truncated, corrupt or refused by the safe reader (nothing was written)."""


@dataclass(frozen=True)
class ExportResult:
    """What :func:`export_safetensors` wrote: ``files`` (names inside ``out_dir``, the
    data files then the index when there is one), ``tensors`` (output name -> file),
    ``total_bytes`` (tensor data bytes, as the index's ``total_size``)."""

    out_dir: Path
    files: tuple[str, ...]
    tensors: Mapping[str, str]
    total_bytes: int


@dataclass(frozen=True)
class _Piece:
    box: tuple[tuple[int, int], ...]
    path: Path
    stored: StoredTensor


@dataclass(frozen=True)
class _Tensor:
    """One output tensor: ``source[index]`` of checkpoint tensor ``name``."""

    name: str  # in the checkpoint
    out: str  # in the output
    shape: tuple[int, ...]  # of the output (the view)
    dtype: torch.dtype  # stored
    out_dtype: torch.dtype
    pieces: tuple[_Piece, ...]
    source: tuple[int, ...]  # the checkpoint tensor's shape
    index: tuple[int | slice, ...]  # one entry per source dim: int (dropped) or slice

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.out_dtype)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _positive(value: Any, what: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int (bytes), got {value!r}")
    if value < minimum:
        raise ValueError(f"{what} must be at least {minimum} bytes, got {value}")
    return value


def _path(value: Any, what: str) -> Path:
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{what} must be a str or os.PathLike, got {value!r}")
    if not str(value):
        raise ValueError(f"{what} is empty; give a directory")
    return Path(value)


def _chosen(keys: Callable[[str], bool], tensors: list[str]) -> list[str]:
    """The tensor names the predicate ``keys`` says yes to (it must answer a bool)."""
    out = []
    for name in tensors:
        answer = keys(name)
        if not isinstance(answer, (bool, np.bool_)):
            raise TypeError(f"keys({name!r}) returned {answer!r}; a keys callable returns a bool")
        if answer:
            out.append(name)
    if tensors and not out:
        some = ", ".join(tensors[:6]) + (", ..." if len(tensors) > 6 else "")
        raise ValueError(f"keys: the callable selects none of the checkpoint's tensors ({some})")
    return out


def _selected(metadata: Metadata, keys: Iterable[str] | Callable[[str], bool] | None) -> list[str]:
    entries = metadata.state_dict_metadata
    tensors = sorted(n for n, md in entries.items() if isinstance(md, TensorStorageMetadata))
    if keys is None:
        return tensors
    if isinstance(keys, str):
        raise TypeError(f"keys must be an iterable of names or a callable, got the string {keys!r}")
    if callable(keys):
        return _chosen(keys, tensors)
    if not isinstance(keys, Iterable):
        raise TypeError(
            f"keys must be an iterable of names or a callable name -> bool, got {keys!r}"
        )
    wanted = list(dict.fromkeys(keys))
    for key in wanted:
        if not isinstance(key, str):
            raise TypeError(f"keys must be strings, got {key!r}")
        if key not in entries:
            some = ", ".join(tensors[:6]) + (", ..." if len(tensors) > 6 else "")
            raise KeyError(f"keys: {key!r} is not in the checkpoint (its tensors: {some})")
        if not isinstance(entries[key], TensorStorageMetadata):
            raise ValueError(f"keys: {key!r} is a non-tensor value; safetensors holds tensors only")
    return sorted(wanted)


def _outputs(
    metadata: Metadata,
    names: list[str],
    rename: Mapping[str, Renamed] | Callable[[str], Renamed] | None,
) -> list[list[_Out]]:
    """Per selected name, its outputs: ``(name, None)`` for the whole tensor, or views
    ``(name, normalised index)``; every output name checked valid and unique."""
    if rename is None:
        answers: list[Any] = list(names)
    elif isinstance(rename, Mapping):
        answers = [rename.get(n, n) for n in names]
    elif callable(rename):
        answers = [rename(n) for n in names]
    else:
        raise TypeError(f"rename must be a mapping or a callable, got {type(rename).__name__}")
    out: list[list[_Out]] = []
    seen: dict[str, str] = {}
    for name, answer in zip(names, answers):
        md = metadata.state_dict_metadata[name]
        assert isinstance(md, TensorStorageMetadata)
        shape = tuple(int(n) for n in md.size)
        if isinstance(answer, list):
            outs = _views(name, shape, answer)
        else:
            if not _valid_name(answer):
                raise ValueError(
                    f"rename: {name!r} -> {answer!r} is not a valid tensor name (give a "
                    "non-empty string other than '__metadata__', or a list of (name, index) views)"
                )
            outs = [(answer, None)]
        for new, index in outs:
            what = repr(name) if index is None else f"{name!r} (view {index!r})"
            if new in seen:
                raise ValueError(
                    f"rename: {seen[new]} and {what} would both be written as {new!r}; "
                    "output names must be unique"
                )
            seen[new] = what
        out.append(outs)
    return out


def _valid_name(new: object) -> bool:
    return isinstance(new, str) and bool(new) and new != "__metadata__"


def _views(name: str, shape: tuple[int, ...], views: list[Any]) -> list[_Out]:
    """Checked views ``[(output name, index), ...]`` of checkpoint tensor ``name``."""
    if not views:
        raise ValueError(
            f"rename: {name!r} -> [] gives no output; leave the tensor out with keys= instead"
        )
    out: list[_Out] = []
    for view in views:
        if not isinstance(view, tuple) or len(view) != 2:
            raise TypeError(
                f"rename: {name!r}: view {view!r} must be a pair (output name, index), "
                "e.g. ('experts.0.w', (0, slice(0, 8)))"
            )
        new, index = view
        if not _valid_name(new):
            raise ValueError(
                f"rename: {name!r} view {view!r}: {new!r} is not a valid tensor name "
                "(a non-empty string other than '__metadata__')"
            )
        where = f"rename: checkpoint tensor {name!r} {shape}, output {new!r}"
        try:
            entries = _basic_index(index, shape)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        except TypeError as exc:
            raise TypeError(f"{where}: {exc}") from None
        size = tuple(len(range(e.start, e.stop, e.step)) for e in entries if isinstance(e, slice))
        if 0 in size:
            raise ValueError(
                f"{where}: index {index!r} selects no element (view shape {size}); "
                "a view needs at least one"
            )
        out.append((new, tuple(_plain(e) for e in entries)))
    return out


def _plain(e: int | slice) -> int | slice:
    """An index entry with plain Python ints (numpy ints print as ``np.int64(3)``)."""
    return int(e) if isinstance(e, int) else slice(int(e.start), int(e.stop), int(e.step))


def _out_dtype(
    stored: torch.dtype, dtype: torch.dtype | None, shape: tuple[int, ...]
) -> torch.dtype:
    """Floating-point tensors of 16 bits or more with at least one dim take ``dtype``.

    Integer, bool and 8-bit float tensors (quantized weights, whose scales live beside
    them) keep theirs, and so do 0-d tensors: scalars such as scales or an optimizer's
    ``step`` (bf16 stores 10000.0 as 9984.0), a few bytes each.

    >>> bf16 = torch.bfloat16
    >>> _out_dtype(torch.float32, bf16, (4, 4)), _out_dtype(torch.float32, bf16, ())
    (torch.bfloat16, torch.float32)
    """
    if dtype is None or not stored.is_floating_point or _itemsize(stored) < 2 or not shape:
        return stored
    return dtype


class _Files:
    """Open checkpoint data files by path (read-only, unbuffered), at most ``limit`` at
    once: a checkpoint of thousands of ranks has thousands of files, more than the
    usual open-file limit. Each file is used right after :meth:`get`."""

    def __init__(self, limit: int = 64) -> None:
        self._open: OrderedDict[Path, Any] = OrderedDict()
        self._limit = limit

    def get(self, path: Path) -> Any:
        f = self._open.get(path)
        if f is None:
            if len(self._open) >= self._limit:
                self._open.popitem(last=False)[1].close()
            f = self._open[path] = open(path, "rb", buffering=0)
        self._open.move_to_end(path)
        return f

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


def _plan(
    root: Path,
    metadata: Metadata,
    names: list[str],
    outputs: list[list[_Out]],
    dtype: torch.dtype | None,
    files: _Files,
) -> list[_Tensor]:
    """Every output tensor (a selected tensor, or a view of one) with its chunks located
    and checked; raises before any write."""
    storage = metadata.storage_data if isinstance(metadata.storage_data, Mapping) else {}
    plans = []
    for name, outs in zip(names, outputs):
        md = metadata.state_dict_metadata[name]
        assert isinstance(md, TensorStorageMetadata)
        shape = tuple(int(s) for s in md.size)
        stored_dtype = md.properties.dtype
        out_dtype = _out_dtype(stored_dtype, dtype, shape)
        try:
            dtype_name(out_dtype)
        except ValueError as exc:
            raise ValueError(f"tensor {name!r}: {exc}; leave it out with keys=") from None
        chunks = [
            (tuple(int(o) for o in c.offsets), tuple(int(s) for s in c.sizes)) for c in md.chunks
        ]
        report = tiling(shape, chunks)
        if not report.exact:
            raise NotExportableError(
                f"tensor {name!r} {shape}: its saved chunks do not tile it ({report.describe()}); "
                "the full tensor is not in the checkpoint, nothing was written"
            )
        pieces = []
        for i, (offsets, sizes) in enumerate(chunks):
            if math.prod(sizes) == 0:
                continue
            where = f"tensor {name!r} chunk {i} at offsets {offsets}"
            info = storage.get(MetadataIndex(name, offsets))
            if info is None:
                raise NotExportableError(f"{where}: no storage entry in the metadata")
            if getattr(info, "transform_descriptors", None):
                raise ValueError(
                    f"{where}: stored with transforms {list(info.transform_descriptors)} "
                    "(e.g. compression), which export does not read"
                )
            path = safe_relative(root, info.relative_path, where)
            try:
                f = files.get(path)
            except OSError as exc:
                raise NotExportableError(
                    f"{where}: cannot open {info.relative_path}: {exc.strerror}; nothing was "
                    "written"
                ) from None
            try:
                stored = locate(
                    f.fileno(),
                    int(info.offset),
                    int(info.length),
                    f"{where} in {info.relative_path}",
                )
            except ValueError as exc:  # truncated, corrupt or crafted: the data is not there
                raise NotExportableError(f"{exc}; nothing was written") from None
            if stored.shape != sizes or stored.dtype != stored_dtype:
                raise NotExportableError(
                    f"{where}: the metadata says {sizes} {stored_dtype}, {info.relative_path} "
                    f"holds {stored.shape} {stored.dtype}; the checkpoint's data does not match "
                    "its metadata, nothing was written"
                )
            box = tuple((o, o + s) for o, s in zip(offsets, sizes))
            pieces.append(_Piece(box, path, stored))
        whole = tuple(slice(0, n, 1) for n in shape)
        for out, index in outs:
            entries = whole if index is None else index
            view = tuple(
                len(range(e.start, e.stop, e.step)) for e in entries if isinstance(e, slice)
            )
            plans.append(
                _Tensor(name, out, view, stored_dtype, out_dtype, tuple(pieces), shape, entries)
            )
    return plans


def _split(tensors: list[_Tensor], max_file_bytes: int) -> list[list[_Tensor]]:
    """Greedy, in output-name order: a file takes tensors while it stays within
    ``max_file_bytes``; a larger tensor gets a file of its own."""
    groups: list[list[_Tensor]] = []
    size = 0
    for t in sorted(tensors, key=lambda t: t.out):
        if not groups or (groups[-1] and size + t.nbytes > max_file_bytes):
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    return groups or [[]]


def _slabs(shape: tuple[int, ...], budget: int) -> Iterator[tuple[tuple[int, ...], int, int, int]]:
    """Output slabs of at most ``budget`` elements: ``(lead, k, start, stop)`` = the
    elements whose index is ``lead`` on dims < k, in ``[start, stop)`` on dim k, any on
    dims > k. Each chunk's share of a slab is contiguous in the chunk's row-major order."""
    if not shape:
        yield (), 0, 0, 1
        return
    k = 0
    while math.prod(shape[k + 1 :]) > budget:
        k += 1
    inner = math.prod(shape[k + 1 :])
    rows = max(1, budget // inner)
    for lead in np.ndindex(*shape[:k]) if k else [()]:
        for start in range(0, shape[k], rows):
            yield tuple(int(i) for i in lead), k, start, min(shape[k], start + rows)


def _read_into(f: Any, view: memoryview, offset: int) -> None:
    f.seek(offset)
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            raise ValueError(f"{f.name}: ends before byte {offset + len(view)}")
        got += n


def _write_at(f: Any, data: memoryview, offset: int) -> None:
    f.seek(offset)
    done = 0
    while done < len(data):
        done += f.write(data[done:])


@contextlib.contextmanager
def _mapped(f: Any, stored: StoredTensor) -> Iterator[torch.Tensor]:
    """A stored tensor with non-row-major strides, through a read-only memory map."""
    page = mmap.ALLOCATIONGRANULARITY
    base = stored.storage_start - stored.storage_start % page
    length = stored.storage_start + stored.storage_bytes - base
    with mmap.mmap(f.fileno(), length, access=mmap.ACCESS_COPY, offset=base) as m:
        raw = torch.frombuffer(
            m, dtype=torch.uint8, count=stored.storage_bytes, offset=stored.storage_start - base
        )
        try:
            yield raw.view(stored.dtype).as_strided(
                stored.shape, stored.stride, stored.element_offset
            )
        finally:
            del raw


def _select(
    piece: _Piece, sel: list[tuple[int, int, int]]
) -> tuple[list[int], list[int], list[int]] | None:
    """A chunk's share of a selection ``sel`` (per source dim: first index, count,
    step): per dim the first selected index inside the chunk (chunk-local), the count
    there, and the position of that first index within the selection; None if the
    chunk holds none of it (a strided selection may step over a chunk)."""
    local, counts, at = [], [], []
    for (first, count, step), (p0, p1) in zip(sel, piece.box):
        lo, hi = max(first, p0), min(first + (count - 1) * step + 1, p1)
        g0 = first + -(-(lo - first) // step) * step  # first selected index >= lo
        if g0 >= hi:
            return None
        local.append(g0 - p0)
        counts.append(-(-(hi - g0) // step))
        at.append((g0 - first) // step)
    return local, counts, at


# a read may take up to this many bytes it does not need, to save system calls
_SLACK = 64 * 1024


def _fill(
    t: _Tensor,
    out: Any,
    at: int,
    files: _Files,
    inbuf: torch.Tensor,
    outbuf: torch.Tensor,
    tick: Callable[[int], None],
) -> None:
    """Write output tensor ``t`` (the view ``source[t.index]``) at offset ``at`` of
    ``out``, slab by slab: a slab of the view is a selection of the source (a box when
    every step is 1); each chunk's share of it is read in as few positioned reads as
    its layout allows (one when the share is contiguous in the chunk, as for whole
    tensors and views cutting leading dims) and copied into the output buffer."""
    shape, o_size = t.shape, _itemsize(t.out_dtype)
    if math.prod(shape) == 0:
        return
    i_size = _itemsize(t.dtype)
    budget = max(1, min(outbuf.numel() // o_size, inbuf.numel() // i_size))
    in_cap = inbuf.numel() // i_size
    same = t.dtype == t.out_dtype
    index = ChunkIndex(
        t.source, [(tuple(a for a, _ in p.box), tuple(b - a for a, b in p.box)) for p in t.pieces]
    )
    in_view = memoryview(inbuf.numpy())  # type: ignore[arg-type]
    out_view = memoryview(outbuf.numpy())  # type: ignore[arg-type]
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    kept = [d for d, e in enumerate(t.index) if isinstance(e, slice)]  # source dim of view dim
    for lead, k, start, stop in _slabs(shape, budget):
        # the slab in view coordinates, one (start, stop) per view dim
        vbox = (
            [(i, i + 1) for i in lead] + [(start, stop)] + [(0, n) for n in shape[k + 1 :]]
            if shape
            else []
        )
        count = math.prod(b - a for a, b in vbox)
        slab = outbuf[: count * o_size].view(t.out_dtype).view([b - a for a, b in vbox])
        # the same elements in source coordinates: per dim (first, count, step)
        vdims = iter(vbox)
        sel = []
        for e in t.index:
            if isinstance(e, int):
                sel.append((e, 1, 1))
            else:
                a, b = next(vdims)
                sel.append((e.start + a * e.step, b - a, e.step))
        cover = tuple((f, f + (c - 1) * s + 1) for f, c, s in sel)
        for ci, _ in index.overlapping(cover):
            piece = t.pieces[ci]
            share = _select(piece, sel)
            if share is None:
                continue
            local, counts, where = share
            steps = [s for _, _, s in sel]
            f = files.get(piece.path)
            if not piece.stored.contiguous:
                with _mapped(f, piece.stored) as whole:
                    part = whole[
                        tuple(
                            slice(lo, lo + (c - 1) * s + 1, s) if d in kept else lo
                            for d, (lo, c, s) in enumerate(zip(local, counts, steps))
                        )
                    ]
                    slab[tuple(slice(where[d], where[d] + counts[d]) for d in kept)].copy_(part)
                continue
            csizes = [b - a for a, b in piece.box]
            cstr = [math.prod(csizes[d + 1 :]) for d in range(len(csizes))]
            nd = len(csizes)
            # outer dims [0, j) are looped over, dims [j, nd) read at once: the smallest j
            # whose sub-share's byte span fits the input buffer without much waste
            j = 0
            while j < nd:
                n_sub = math.prod(counts[j:])
                span = sum((counts[d] - 1) * steps[d] * cstr[d] for d in range(j, nd)) + 1
                if span <= in_cap and (span <= 2 * n_sub or span * i_size <= _SLACK):
                    break
                j += 1
            n_sub = math.prod(counts[j:])
            span = sum((counts[d] - 1) * steps[d] * cstr[d] for d in range(j, nd)) + 1
            inner_kept = [d for d in kept if d >= j]
            for outer in np.ndindex(*counts[:j]) if j else [()]:
                first = sum(
                    (local[d] + (outer[d] if d < j else 0) * steps[d]) * cstr[d] for d in range(nd)
                )
                target = slab[
                    tuple(
                        where[d] + int(outer[d]) if d < j else slice(where[d], where[d] + counts[d])
                        for d in kept
                    )
                ]
                offset = piece.stored.data_offset + first * i_size
                if span == n_sub and same and target.is_contiguous():
                    lo = target.storage_offset() * o_size
                    _read_into(f, out_view[lo : lo + n_sub * o_size], offset)
                    continue
                _read_into(f, in_view[: span * i_size], offset)
                src = (
                    inbuf[: span * i_size]
                    .view(t.dtype)
                    .as_strided(
                        [counts[d] for d in inner_kept], [steps[d] * cstr[d] for d in inner_kept]
                    )
                )
                target.copy_(src)
        first_out = sum(i * s for i, s in zip((*lead, start), strides)) if shape else 0
        _write_at(out, out_view[: count * o_size], at + first_out * o_size)
        tick(count * o_size)


def _existing(out_dir: Path) -> list[str]:
    if not out_dir.is_dir():
        return []
    return sorted(
        p.name
        for p in out_dir.iterdir()
        if p.name in (SINGLE_NAME, INDEX_NAME)
        or (p.name.startswith("model-") and p.name.endswith(".safetensors"))
    )


def _progress(
    progress: bool | Progress, total: int
) -> tuple[Callable[[int], None], Callable[[], None]]:
    if progress is False or progress is None:
        return (lambda n: None), (lambda: None)
    if progress is True:
        from tqdm import tqdm  # type: ignore[import-untyped]

        bar = tqdm(
            total=total,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc="export",
            file=sys.stderr,
        )
        return bar.update, bar.close
    if not callable(progress):
        raise TypeError(f"progress must be a bool or a callable(done, total), got {progress!r}")
    done = [0]

    def tick(n: int) -> None:
        done[0] += n
        progress(done[0], total)

    return tick, (lambda: None)


def export_safetensors(
    checkpoint_id: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    keys: Iterable[str] | Callable[[str], bool] | None = None,
    rename: Mapping[str, Renamed] | Callable[[str], Renamed] | None = None,
    dtype: str | torch.dtype | None = None,
    max_file_bytes: int = 5 * 2**30,
    buffer_bytes: int = 64 * 2**20,
    progress: bool | Progress = False,
) -> ExportResult:
    """Write the DCP checkpoint ``checkpoint_id`` as Hugging Face safetensors in ``out_dir``.

    One process, no process group; any DCP checkpoint whose chunks tile each tensor
    (ours always; plain DCP's where its metadata and data are right). Writes
    ``model.safetensors`` when everything fits in ``max_file_bytes`` of tensor data,
    else ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``;
    full tensors, in output-name order; a tensor larger than ``max_file_bytes`` gets a
    file of its own.

    ``keys``: which tensors: checkpoint names, or a callable name -> bool such as
    ``lambda n: n.startswith("model.")`` (default every tensor; non-tensor values are
    skipped; a callable that selects nothing raises ValueError). ``rename``: mapping
    (names it lacks keep theirs) or callable, checkpoint name -> output name, or ->
    a list of *views* ``[(output name, index), ...]``: one output tensor
    ``tensor[index]`` each, ``index`` a basic index of the tensor's shape (ints drop
    their dim, slices have step >= 1, missing trailing entries take the dim whole),
    e.g. a stacked ``gate_up_proj`` [E, 2I, H] -> ``[(f"...experts.{e}.gate_proj.weight",
    (e, slice(0, I))), ...]``. Views may overlap; each is streamed like a tensor (only
    the chunks it intersects are read) and takes the tensor's dtype rule. ``dtype``
    (``"bf16"``, ``"BF16"``, ``torch.bfloat16``, ...): floating-point tensors of 16 bits
    or more are cast to it on the way; integer, bool and float8 tensors, and 0-d
    tensors, keep their dtype. ``buffer_bytes``: the slab buffers' total size (resident
    memory stays near it above the interpreter's). ``progress``: True draws a tqdm bar on stderr; a
    callable gets ``(bytes_done, bytes_total)``.

    Raises, before writing anything: ValueError naming the checkpoint tensor, the output
    name and the index for a view index out of range, with a step < 1 or too many
    entries, or selecting nothing; ValueError naming both for two outputs (plain or
    views) with one name; ValueError naming the tensor and the region when
    its chunks leave a hole or overlap, or when a stored chunk is not what the
    metadata says; KeyError for an unknown key; ValueError/TypeError for bad
    arguments; FileExistsError when ``out_dir`` already holds a safetensors model.
    The checkpoint's pickles are read with restricted unpicklers: safe on any input.
    """
    root = _path(checkpoint_id, "checkpoint_id")
    dest = _path(out_dir, "out_dir")
    max_file_bytes = _positive(max_file_bytes, "max_file_bytes")
    buffer_bytes = _positive(buffer_bytes, "buffer_bytes", _MIN_BUFFER)
    cast = None if dtype is None else safetensors_dtype(dtype)
    if cast is not None and not cast.is_floating_point:
        raise ValueError(f"dtype {dtype!r}: only floating-point dtypes can be cast to")
    if dest.exists() and not dest.is_dir():
        raise NotADirectoryError(f"out_dir {str(dest)!r} exists and is not a directory")
    if dest.resolve() == root.resolve():
        raise ValueError(f"out_dir {str(dest)!r} is the checkpoint directory; choose another")
    metadata = read_metadata(root)
    names = _selected(metadata, keys)
    outputs = _outputs(metadata, names, rename)
    clash = _existing(dest)
    if clash:
        raise FileExistsError(
            f"out_dir {str(dest)!r} already holds {clash[0]}; remove it or choose another"
        )
    files = _Files()
    try:
        tensors = _plan(root, metadata, names, outputs, cast, files)
        groups = _split(tensors, max_file_bytes)
        dest.mkdir(parents=True, exist_ok=True)
        return _write(dest, groups, files, buffer_bytes, progress)
    finally:
        files.close()


def _write(
    dest: Path,
    groups: list[list[_Tensor]],
    files: _Files,
    buffer_bytes: int,
    progress: bool | Progress,
) -> ExportResult:
    n = len(groups)
    names = [SINGLE_NAME] if n == 1 else [shard_name(i + 1, n) for i in range(n)]
    total = sum(t.nbytes for g in groups for t in g)
    tick, close = _progress(progress, total)
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=dest))
    try:
        # never more than the largest tensor needs: a huge buffer_bytes allocates nothing more
        need_in = max(
            (t.nbytes // _itemsize(t.out_dtype) * _itemsize(t.dtype) for g in groups for t in g),
            default=0,
        )
        need_out = max((t.nbytes for g in groups for t in g), default=0)
        inbuf = torch.empty(max(16, min(buffer_bytes // 2, need_in)), dtype=torch.uint8)
        outbuf = torch.empty(
            max(16, min(buffer_bytes - buffer_bytes // 2, need_out)), dtype=torch.uint8
        )
        weight_map: dict[str, str] = {}
        for name, group in zip(names, groups):
            entries, pos = {}, 0
            for t in group:
                entries[t.out] = (t.out_dtype, t.shape, pos, pos + t.nbytes)
                pos += t.nbytes
                weight_map[t.out] = name
            head = header_bytes(entries)
            with open(tmp / name, "wb", buffering=0) as out:
                out.write(head)
                out.truncate(len(head) + pos)
                for t in group:
                    _fill(t, out, len(head) + entries[t.out][2], files, inbuf, outbuf, tick)
                os.fsync(out.fileno())
        del inbuf, outbuf
        written = list(names)
        if n > 1:
            import json

            index = {
                "metadata": {"total_size": total},
                "weight_map": dict(sorted(weight_map.items())),
            }
            with open(tmp / INDEX_NAME, "w", encoding="utf-8") as f:
                json.dump(index, f, indent=2)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            written.append(INDEX_NAME)
        for name in written:  # the single file or the index last: complete only at the end
            os.replace(tmp / name, dest / name)
        with contextlib.suppress(OSError):
            fd = os.open(dest, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return ExportResult(dest, tuple(written), weight_map, total)
    finally:
        close()
        shutil.rmtree(tmp, ignore_errors=True)
