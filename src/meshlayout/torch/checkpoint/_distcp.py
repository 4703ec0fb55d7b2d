"""Where a DCP tensor item's bytes are, without loading it: read them in bounded pieces.

torch 2.13's ``FileSystemWriter`` (``SerializationFormat.TORCH_SAVE``, the default)
appends each tensor item to a ``.distcp`` file as a complete ``torch.save`` archive:
an uncompressed zip whose ``<prefix>/data.pkl`` describes the tensor and whose
``<prefix>/data/<key>`` record holds the storage's raw bytes; the metadata's
``_StorageInfo(relative_path, offset, length)`` locates the archive. :func:`locate`
reads only the archive's directory and ``data.pkl`` (with the restricted unpickler of
:mod:`._safe_pickle`) and returns a :class:`StoredTensor`: dtype, shape, strides and
the absolute file offset of the element bytes, which the exporter then reads with
positioned reads slab by slab, so no item is ever loaded whole.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath

import torch

from ._safe_pickle import tensor_record

__all__ = ["StoredTensor", "locate", "safe_relative"]

_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # zip local file header (30 bytes)


def _pread(fd: int, n: int, offset: int) -> bytes:
    """``os.pread`` where it exists (POSIX), else seek + read (Windows)."""
    if hasattr(os, "pread"):
        return os.pread(fd, n, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, n)


class _Window(io.RawIOBase):
    """Bytes ``[start, start + length)`` of an open file, as a seekable read-only stream."""

    def __init__(self, fd: int, start: int, length: int) -> None:
        super().__init__()
        self._fd, self._start, self._length, self._pos = fd, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._length}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        n = max(0, min(len(buffer), self._length - self._pos))
        data = _pread(self._fd, n, self._start + self._pos) if n else b""
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


@dataclass(frozen=True)
class StoredTensor:
    """One stored tensor item: element ``i`` (row-major over ``shape``) of a contiguous
    item is at byte ``data_offset + i * itemsize`` of the file; ``contiguous`` False
    means the strides are not row-major (read through a memory map instead)."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_start: int
    storage_bytes: int
    element_offset: int
    contiguous: bool

    @property
    def itemsize(self) -> int:
        return torch.empty((), dtype=self.dtype).element_size()

    @property
    def data_offset(self) -> int:
        """Absolute file offset of the tensor's first element."""
        return self.storage_start + self.element_offset * self.itemsize


def safe_relative(root: Path, relative_path: str, where: str) -> Path:
    """``root / relative_path``, refusing absolute paths and ``..`` (a crafted metadata
    could otherwise point the reader at any file)."""
    parts = set(PurePosixPath(relative_path).parts) | set(PureWindowsPath(relative_path).parts)
    if (
        not relative_path
        or PurePosixPath(relative_path).is_absolute()
        or PureWindowsPath(relative_path).is_absolute()
        or PureWindowsPath(relative_path).drive
        or ".." in parts
    ):
        raise ValueError(f"{where}: storage file {relative_path!r} is not inside the checkpoint")
    return root / relative_path


def _row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _is_row_major(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    return all(n <= 1 or s == r for n, s, r in zip(shape, stride, _row_major(shape)))


def locate(fd: int, offset: int, length: int, where: str) -> StoredTensor:
    """The :class:`StoredTensor` of the ``torch.save`` archive at ``[offset, offset+length)``.

    Reads the zip directory and ``data.pkl`` only. ValueError naming ``where`` for
    anything but an uncompressed, little-endian archive of one plain tensor whose
    elements lie inside its storage record; a file that ends before the item does says
    it is truncated, with the bytes expected and present.
    """
    size = os.fstat(fd).st_size
    if offset + length > size:
        present = max(0, min(length, size - offset))
        raise ValueError(
            f"{where}: truncated file: the item is bytes {offset}-{offset + length} "
            f"({length} bytes), the file ends at byte {size} ({present} of them present)"
        )
    head = _pread(fd, 4, offset)
    if head != b"PK\x03\x04":
        raise ValueError(
            f"{where}: corrupt item: bytes {offset}-{offset + length} do not start a "
            f"torch.save archive (they start {head!r}; DCP's default TORCH_SAVE "
            "serialization is read, its safetensors format is not)"
        )
    try:
        archive = zipfile.ZipFile(io.BufferedReader(_Window(fd, offset, length)))
        infos = {i.filename: i for i in archive.infolist()}
        pkl = [n for n in infos if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkl) != 1:
            raise ValueError("no data.pkl record")
        prefix = pkl[0][: -len("data.pkl")]
        record = tensor_record(archive.read(pkl[0]), where)
        order = infos.get(prefix + "byteorder")
        if order is not None and archive.read(order).strip() not in (b"little", b""):
            raise ValueError("big-endian archive")
        info = infos.get(prefix + "data/" + record.key)
        if info is None:
            raise ValueError(f"no storage record data/{record.key}")
    except ValueError as exc:
        if str(exc).startswith(where):
            raise
        raise ValueError(f"{where}: corrupt tensor item ({exc})") from None
    except (zipfile.BadZipFile, OSError, KeyError, EOFError, struct.error) as exc:
        raise ValueError(f"{where}: corrupt tensor item ({type(exc).__name__}: {exc})") from None
    if info.compress_type != zipfile.ZIP_STORED or info.compress_size != info.file_size:
        raise ValueError(f"{where}: compressed storage record (torch.save never compresses)")
    local = _LOCAL_HEADER.unpack(_pread(fd, _LOCAL_HEADER.size, offset + info.header_offset))
    if local[0] != b"PK\x03\x04":
        raise ValueError(f"{where}: corrupt zip local header")
    start = info.header_offset + _LOCAL_HEADER.size + local[9] + local[10]
    itemsize = torch.empty((), dtype=record.dtype).element_size()
    storage_bytes = record.storage_numel * itemsize
    if storage_bytes != info.file_size or start + storage_bytes > length:
        raise ValueError(
            f"{where}: storage record holds {info.file_size} bytes, the tensor needs "
            f"{storage_bytes}"
        )
    shape, stride = record.shape, record.stride
    if len(stride) != len(shape):
        raise ValueError(f"{where}: shape {shape} and strides {stride} differ in length")
    if any(n == 0 for n in shape):
        last = -1
    else:
        last = record.offset + sum((n - 1) * s for n, s in zip(shape, stride))
    if last >= record.storage_numel:
        raise ValueError(f"{where}: tensor {shape} reaches past its storage")
    return StoredTensor(
        record.dtype,
        shape,
        stride,
        offset + start,
        storage_bytes,
        record.offset,
        _is_row_major(shape, stride),
    )
