"""What a DCP checkpoint holds: every tensor's chunks, who wrote them, and whether they tile.

:func:`describe_checkpoint` reads a checkpoint directory's ``.metadata`` (written by
any DCP planner, ours or torch's) and returns a JSON-ready report: per tensor its
shape, dtype and chunks (offsets, sizes, storage file, writing rank when the file
name records it: ``__<rank>_<n>.distcp``), and the :func:`~._plan.tiling` verdict
naming holes and overlaps. ``verify=True`` also opens every stored chunk and checks
that it holds the shape and dtype the metadata promises (plain DCP's uneven
FSDP-over-TP checkpoints fail this: their metadata tiles, their data does not).
The ``meshlayout checkpoint`` command prints this report.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)

from ._distcp import StoredTensor, locate, safe_relative
from ._plan import tiling
from ._safe_pickle import load_metadata

__all__ = ["describe_checkpoint", "read_metadata", "tensor_names", "writer_rank"]

_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


def writer_rank(relative_path: str) -> int | None:
    """The rank that wrote a DCP ``FileSystemWriter`` data file, from its name (or None).

    >>> writer_rank("__3_0.distcp"), writer_rank("data.bin")
    (3, None)
    """
    m = _FILE.match(os.path.basename(relative_path))
    return int(m.group(1)) if m else None


def read_metadata(path: str | os.PathLike[str]) -> Metadata:
    """The ``Metadata`` of the DCP checkpoint in directory ``path``; safe on any file.

    ``.metadata`` is a pickle: it is read with the restricted unpickler of
    :mod:`._safe_pickle`, which admits only DCP's metadata types, so a crafted file
    raises ValueError naming it and the forbidden global and runs nothing.
    FileNotFoundError / ValueError name the path when it holds no readable checkpoint.
    """
    where = Path(path)
    if not where.is_dir():
        raise FileNotFoundError(f"{str(path)!r} is not a directory")
    file = where / ".metadata"
    if not file.is_file():
        raise FileNotFoundError(f"{str(path)!r} holds no DCP checkpoint (no .metadata file)")
    with open(file, "rb") as f:
        return load_metadata(f, str(file))


def tensor_names(path: str | os.PathLike[str]) -> list[str]:
    """The sorted names of the tensors (not the other values) of the checkpoint in ``path``."""
    entries = read_metadata(path).state_dict_metadata
    return sorted(n for n, md in entries.items() if isinstance(md, TensorStorageMetadata))


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _storage(storage: Mapping[Any, Any] | None, index: MetadataIndex) -> dict[str, Any]:
    info = (storage or {}).get(index)
    if info is None:
        return {"file": None, "rank": None, "offset": None, "length": None}
    path = str(info.relative_path)
    return {
        "file": path,
        "rank": writer_rank(path),
        "offset": int(info.offset),
        "length": int(info.length),
        "transformed": bool(getattr(info, "transform_descriptors", None)),
    }


def _stored_tensor(root: Path, where: dict[str, Any]) -> StoredTensor:
    """Shape and dtype of a stored chunk, from its archive's header (data not read)."""
    path = safe_relative(root, where["file"], "metadata")
    fd = os.open(path, os.O_RDONLY)
    try:
        return locate(fd, where["offset"], where["length"], where["file"])
    finally:
        os.close(fd)


def _verify(
    root: Path, name: str, md: TensorStorageMetadata, chunks: list[dict[str, Any]]
) -> list[str]:
    """Chunks whose stored data is not what the metadata says (one line each)."""
    bad = []
    for i, (chunk, where) in enumerate(zip(md.chunks, chunks)):
        if where["file"] is None:
            bad.append(f"chunk {i}: no storage entry")
            continue
        if where.get("transformed"):
            continue  # compressed or otherwise transformed: not verified
        at = f"chunk {i} at offsets {tuple(int(o) for o in chunk.offsets)}"
        try:
            value = _stored_tensor(root, where)
        except ValueError as exc:  # names the file: truncated, corrupt, refused, outside
            bad.append(f"{at}: {exc}")
            continue
        except OSError as exc:
            bad.append(f"{at}: cannot read {where['file']}: {exc.strerror or exc}")
            continue
        except Exception as exc:  # anything else a damaged or crafted file raises
            bad.append(f"{at}: {where['file']}: unreadable ({type(exc).__name__}: {exc})")
            continue
        sizes = tuple(int(s) for s in chunk.sizes)
        if tuple(value.shape) != sizes or value.dtype != md.properties.dtype:
            bad.append(
                f"{at}: metadata says "
                f"{sizes} {_dtype(md.properties.dtype)}, {where['file']} holds "
                f"{tuple(value.shape)} {_dtype(value.dtype)}"
            )
    return bad


def _boxes(boxes: Any) -> list[list[list[int]]]:
    return [[[a, b] for a, b in box] for box in boxes]


def describe_checkpoint(path: str | os.PathLike[str], *, verify: bool = False) -> dict[str, Any]:
    """A JSON-ready report of the DCP checkpoint in ``path`` (see the module docstring).

    Keys: ``checkpoint``, ``files``, ``tensors`` (name, shape, dtype, chunks, exact,
    tiling, holes, missing, overlaps, overlap_pairs, and with ``verify`` stored),
    ``values`` (non-tensor entries), ``ok`` (every tensor tiles exactly and, with
    ``verify``, every stored chunk matches).
    """
    root = Path(path)
    metadata = read_metadata(root)
    storage = metadata.storage_data if isinstance(metadata.storage_data, Mapping) else None
    tensors: list[dict[str, Any]] = []
    values: list[dict[str, Any]] = []
    files = sorted({str(i.relative_path) for i in (storage or {}).values()})
    for name in sorted(metadata.state_dict_metadata):
        md = metadata.state_dict_metadata[name]
        if isinstance(md, BytesStorageMetadata):
            values.append({"name": name, **_storage(storage, MetadataIndex(name))})
            continue
        assert isinstance(md, TensorStorageMetadata)
        shape = tuple(int(s) for s in md.size)
        raw = [
            (tuple(int(o) for o in c.offsets), tuple(int(s) for s in c.sizes)) for c in md.chunks
        ]
        chunks = [
            {"offsets": list(o), "sizes": list(s), **_storage(storage, MetadataIndex(name, o))}
            for o, s in raw
        ]
        report = tiling(shape, raw)
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(shape),
            "dtype": _dtype(md.properties.dtype),
            "chunks": chunks,
            "exact": report.exact,
            "tiling": report.describe(),
            "holes": _boxes(report.holes),
            "missing": report.missing,
            "overlaps": [{"chunks": [i, j], "box": _boxes([c])[0]} for i, j, c in report.overlaps],
            "overlap_pairs": report.overlap_pairs,
        }
        if verify:
            entry["stored"] = _verify(root, name, md, chunks)
        tensors.append(entry)
    ok = all(t["exact"] and not t.get("stored") for t in tensors)
    return {"checkpoint": str(path), "files": files, "tensors": tensors, "values": values, "ok": ok}
