"""Read DCP's pickles without running code from them: restricted unpicklers.

A DCP checkpoint's ``.metadata`` is a pickle, and every tensor item in a
``__<rank>_<n>.distcp`` file is a ``torch.save`` archive whose ``data.pkl`` is one.
``pickle.load`` on such a file calls whatever callable it names (``os.system``,
``builtins.eval``, ...): a downloaded checkpoint could run a shell command the moment
an inspector opens it. The unpicklers here resolve a global only if it is on an
allow-list of the types those files really hold (found by recording what torch 2.13
writes for plain DCP, our planners and ``async_save``: see ``tests/test_safe_pickle.py``);
anything else raises :class:`ForbiddenGlobal` before the callable is even looked up.

* :func:`load_metadata` -- DCP's ``Metadata`` from a ``.metadata`` file, written by any
  torch from 2.3 on, whichever torch is installed: torch 2.15's ``TensorProperties``
  pickles six fields (it added ``strides``), older releases five, and torch 2.14 and
  older cannot read the six (their ``__setstate__`` unpacks five); ours reads both;
* :func:`tensor_record` -- the dtype, shape, strides and storage key of the tensor in a
  ``torch.save`` archive's ``data.pkl``, without building the tensor (the caller reads
  the bytes it needs from the archive itself).

>>> import io, os, pickle
>>> load_metadata(io.BytesIO(pickle.dumps(os.getcwd)), "x/.metadata")
Traceback (most recent call last):
ValueError: x/.metadata: refused to unpickle the global posix.getcwd ...
"""

from __future__ import annotations

import io
import pathlib
import pickle
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

__all__ = [
    "ForbiddenGlobal",
    "TensorRecord",
    "load_metadata",
    "properties_fields",
    "tensor_record",
]

_DCP = "torch.distributed.checkpoint.metadata"
_FS = "torch.distributed.checkpoint.filesystem"
_LEGACY = "torch.distributed._shard.sharded_tensor.metadata"  # TensorProperties before torch 2.3

#: (module, name) of every class and function a DCP ``.metadata`` pickle may name.
METADATA_GLOBALS = frozenset(
    {
        (_DCP, "Metadata"),
        (_DCP, "TensorStorageMetadata"),
        (_DCP, "BytesStorageMetadata"),
        (_DCP, "ChunkStorageMetadata"),
        (_DCP, "TensorProperties"),
        (_DCP, "MetadataIndex"),
        (_DCP, "StorageMeta"),
        (_DCP, "_MEM_FORMAT_ENCODING"),
        (_FS, "_StorageInfo"),
        (_LEGACY, "TensorProperties"),
        (_LEGACY, "MEM_FORMAT_ENCODING"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),  # rebuilds torch.strided from its name
        ("collections", "OrderedDict"),
    }
)

#: Path classes in ``StorageMeta.checkpoint_id``: rebuilt as pure paths (no file access,
#: and a Windows path still reads on Linux and the reverse).
_PATHS = {
    "PosixPath": pathlib.PurePosixPath,
    "PurePosixPath": pathlib.PurePosixPath,
    "WindowsPath": pathlib.PureWindowsPath,
    "PureWindowsPath": pathlib.PureWindowsPath,
}

#: Legacy typed-storage classes ``torch.save`` names for a tensor's storage, and their dtype.
_STORAGES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexFloatStorage": torch.complex64,
    "ComplexDoubleStorage": torch.complex128,
}


class ForbiddenGlobal(pickle.UnpicklingError):
    """A pickle named a global outside the allow-list (``global_name`` is ``module.name``)."""

    def __init__(self, global_name: str) -> None:
        super().__init__(global_name)
        self.global_name = global_name


def _torch_dtype(name: str) -> torch.dtype | None:
    value = getattr(torch, name, None) if not name.startswith("_") else None
    return value if isinstance(value, torch.dtype) else None


class _PropertiesAsWritten:
    """Stands in for DCP's ``TensorProperties`` while unpickling: keeps the state tuple
    as written (5 fields up to torch 2.14, 6 from 2.15), for :func:`_properties`."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


#: Fields of ``TensorProperties``' pickled state, in order (torch 2.15 added ``strides``).
_PROPERTIES_FIELDS = ("dtype", "layout", "requires_grad", "memory_format", "pin_memory")


def _properties(value: Any, what: str) -> TensorProperties:
    """The installed torch's ``TensorProperties`` of a state written by any torch.

    The first five fields go through torch's own ``__setstate__`` (it decodes the
    memory format); 2.15's sixth, ``strides`` (the saved tensor's strides, or None),
    is kept as an attribute (a field from torch 2.15 on). ValueError for anything else.
    """
    if not isinstance(value, _PropertiesAsWritten):
        raise ValueError(f"{what}: properties are a {type(value).__name__}")
    state = value.state
    if not isinstance(state, tuple) or len(state) not in (5, 6):
        n = len(state) if isinstance(state, tuple) else type(state).__name__
        raise ValueError(
            f"{what}: TensorProperties state has {n} fields; torch up to 2.14 writes 5 "
            f"({', '.join(_PROPERTIES_FIELDS)}), 2.15 adds strides"
        )
    strides = state[5] if len(state) == 6 else None
    if strides is not None and not (
        isinstance(strides, tuple)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in strides)
    ):
        raise ValueError(f"{what}: strides {strides!r} are not a tuple of ints")
    props = TensorProperties.__new__(TensorProperties)
    setstate: Any = props.__setstate__  # untyped in torch
    try:
        setstate(state[:5])
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ValueError(f"{what}: unreadable TensorProperties ({exc})") from None
    props.strides = strides  # type: ignore[attr-defined,unused-ignore]  # a field from 2.15
    return props


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only :data:`METADATA_GLOBALS`, torch dtypes and path classes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == (_DCP, "TensorProperties"):
            return _PropertiesAsWritten
        if (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and _torch_dtype(name) is not None:
            return _torch_dtype(name)
        if module in ("pathlib", "pathlib._local") and name in _PATHS:
            return _PATHS[name]
        raise ForbiddenGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise ForbiddenGlobal(f"persistent id {str(pid)[:60]!r}")


def _refused(where: str, exc: BaseException, what: str) -> ValueError:
    if isinstance(exc, ForbiddenGlobal):
        return ValueError(
            f"{where}: refused to unpickle the global {exc.global_name} (not a type DCP "
            "checkpoint files hold; the file may be crafted to run code). Nothing was executed"
        )
    return ValueError(f"{where}: cannot read {what} ({type(exc).__name__}: {exc})")


def _check_metadata(md: Any, where: str) -> Metadata:
    """The unpickled object, checked to be DCP metadata of the expected shape."""

    def bad(what: str) -> ValueError:
        return ValueError(f"{where}: not DCP checkpoint metadata ({what})")

    if not isinstance(md, Metadata):
        raise bad(f"holds a {type(md).__name__}")
    entries = md.state_dict_metadata
    if not isinstance(entries, Mapping):
        raise bad(f"state_dict_metadata is a {type(entries).__name__}")
    for name, entry in entries.items():
        if not isinstance(name, str):
            raise bad(f"key {name!r} is not a string")
        if isinstance(entry, BytesStorageMetadata):
            continue
        if not isinstance(entry, TensorStorageMetadata):
            raise bad(f"{name!r} is described by a {type(entry).__name__}")
        if isinstance(entry.properties, _PropertiesAsWritten):
            entry.properties = _properties(entry.properties, f"{where}: {name!r}")
        if not isinstance(getattr(entry.properties, "dtype", None), torch.dtype):
            raise bad(f"{name!r} has no dtype")
        if not isinstance(entry.chunks, list) or not all(
            isinstance(c, ChunkStorageMetadata) for c in entry.chunks
        ):
            raise bad(f"{name!r}: chunks are not ChunkStorageMetadata")
        for seq in (entry.size, *(v for c in entry.chunks for v in (c.offsets, c.sizes))):
            if not isinstance(seq, (tuple, list)) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in seq
            ):
                raise bad(f"{name!r}: sizes and offsets must be integers, got {seq!r}")
    storage = md.storage_data
    if storage is not None:
        if not isinstance(storage, Mapping):
            raise bad(f"storage_data is a {type(storage).__name__}")
        for key, info in storage.items():
            if not isinstance(key, MetadataIndex):
                raise bad(f"storage_data key {key!r}")
            path, offset, length = (
                getattr(info, a, None) for a in ("relative_path", "offset", "length")
            )
            if not (isinstance(path, str) and isinstance(offset, int) and isinstance(length, int)):
                raise bad(f"storage entry of {key.fqn!r} is {info!r}")
    return md


def _unpickle_metadata(file: IO[bytes], where: str) -> Any:
    try:
        return _MetadataUnpickler(file).load()
    except Exception as exc:  # pickle raises many kinds on malformed input
        raise _refused(where, exc, ".metadata") from None


def load_metadata(file: IO[bytes], where: str) -> Metadata:
    """DCP's ``Metadata`` unpickled from ``file`` with the allow-list; nothing else runs.

    ValueError naming ``where`` and the forbidden global (``module.name``) for a file
    naming any other global, or when it is no DCP metadata.
    """
    return _check_metadata(_unpickle_metadata(file, where), where)


def properties_fields(file: IO[bytes], where: str) -> set[int]:
    """How many fields the ``TensorProperties`` states in a ``.metadata`` pickle have
    (5: written by torch up to 2.14; 6: by torch 2.15 and newer), read as
    :func:`load_metadata` reads (ValueError likewise)."""
    md = _unpickle_metadata(file, where)
    entries = getattr(md, "state_dict_metadata", None)
    if not isinstance(md, Metadata) or not isinstance(entries, Mapping):
        raise ValueError(f"{where}: not DCP checkpoint metadata")
    return {
        len(entry.properties.state)
        for entry in entries.values()
        if isinstance(getattr(entry, "properties", None), _PropertiesAsWritten)
        and isinstance(entry.properties.state, tuple)
    }


@dataclass(frozen=True)
class TensorRecord:
    """The tensor a ``torch.save`` archive holds, as its ``data.pkl`` describes it.

    ``key``: the storage record's name in the archive (``<prefix>/data/<key>``);
    ``storage_numel``: elements of that storage; ``offset``, ``shape``, ``stride`` in
    elements, as ``Tensor.as_strided`` takes them.
    """

    key: str
    dtype: torch.dtype
    storage_numel: int
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class _Storage:
    key: str
    dtype: torch.dtype | None
    numel: int


def _ints(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, (tuple, list, torch.Size)) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise ValueError(f"{what} {value!r} is not a tuple of non-negative ints")
    return tuple(value)


def _rebuild(storage: Any, offset: Any, shape: Any, stride: Any, *rest: Any) -> TensorRecord:
    """Stands in for ``torch._utils._rebuild_tensor_v2`` / ``_v3``: records, builds nothing."""
    if not isinstance(storage, _Storage):
        raise ValueError(f"tensor storage is a {type(storage).__name__}")
    dtype = storage.dtype
    if dtype is None:  # v3: (requires_grad, hooks, dtype[, metadata])
        dtype = rest[2] if len(rest) >= 3 and isinstance(rest[2], torch.dtype) else None
    if dtype is None or not isinstance(offset, int):
        raise ValueError("tensor record without dtype or storage offset")
    return TensorRecord(
        storage.key, dtype, storage.numel, offset, _ints(shape, "shape"), _ints(stride, "stride")
    )


class _TensorUnpickler(pickle.Unpickler):
    """``data.pkl`` of a ``torch.save`` of one plain tensor, resolved to a :class:`TensorRecord`."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_tensor_v3"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name in _STORAGES:
            return ("typed", _STORAGES[name])
        if module in ("torch", "torch.storage") and name == "UntypedStorage":
            return ("untyped", None)
        if module == "torch" and _torch_dtype(name) is not None:
            return _torch_dtype(name)
        raise ForbiddenGlobal(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if (
            isinstance(pid, tuple)
            and len(pid) == 5
            and pid[0] == "storage"
            and isinstance(pid[1], tuple)
            and isinstance(pid[2], str)
            and isinstance(pid[4], int)
        ):
            return _Storage(pid[2], pid[1][1], pid[4])
        raise ForbiddenGlobal(f"persistent id {str(pid)[:60]!r}")


def tensor_record(data_pkl: bytes, where: str) -> TensorRecord:
    """The :class:`TensorRecord` of a ``torch.save`` archive's ``data.pkl``; runs no code.

    ValueError naming ``where`` when the pickle names a global outside the few a plain
    tensor needs, or holds something other than one tensor.
    """
    try:
        record = _TensorUnpickler(io.BytesIO(data_pkl)).load()
    except Exception as exc:
        raise _refused(where, exc, "the tensor record") from None
    if not isinstance(record, TensorRecord):
        raise ValueError(f"{where}: holds a {type(record).__name__}, not one plain tensor")
    return record
