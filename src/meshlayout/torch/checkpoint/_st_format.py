"""The safetensors file format and Hugging Face's sharded layout, written and read by hand.

A ``.safetensors`` file is an 8-byte little-endian header length ``N``, ``N`` bytes
of JSON (``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{...}}``, padded with spaces to 8-byte alignment), then the raw little-endian tensor
bytes, ``data_offsets`` relative to the end of the header. A model split over several
files is ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``
(``{"metadata": {"total_size": bytes}, "weight_map": {name: file}}``); one file is
``model.safetensors``. Writing the header ourselves lets the exporter fill each
tensor's bytes in place, piece by piece.

>>> safetensors_dtype("bf16"), dtype_name(torch.float8_e4m3fn)
(torch.bfloat16, 'F8_E4M3')
>>> head = header_bytes({"w": (torch.float32, (2,), 0, 8)})
>>> int.from_bytes(head[:8], "little"), head[8:].rstrip()
(88, b'{"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}')
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "INDEX_NAME",
    "SINGLE_NAME",
    "dtype_name",
    "header_bytes",
    "read_header",
    "safetensors_dtype",
    "shard_name",
]

SINGLE_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
#: Largest header we read (the safetensors library's own limit is 100 MB).
_MAX_HEADER = 100_000_000


def _dtypes() -> dict[str, torch.dtype]:
    names = {
        "F64": "float64",
        "F32": "float32",
        "F16": "float16",
        "BF16": "bfloat16",
        "I64": "int64",
        "I32": "int32",
        "I16": "int16",
        "I8": "int8",
        "U64": "uint64",
        "U32": "uint32",
        "U16": "uint16",
        "U8": "uint8",
        "BOOL": "bool",
        "C64": "complex64",
        "F8_E4M3": "float8_e4m3fn",
        "F8_E5M2": "float8_e5m2",
        "F8_E4M3FNUZ": "float8_e4m3fnuz",
        "F8_E5M2FNUZ": "float8_e5m2fnuz",
    }
    return {k: getattr(torch, v) for k, v in names.items() if hasattr(torch, v)}


#: safetensors dtype name -> torch dtype (those this torch has).
DTYPES: dict[str, torch.dtype] = _dtypes()
_NAMES = {v: k for k, v in DTYPES.items()}
_SHORT = {"fp32": "F32", "fp16": "F16", "bf16": "BF16", "fp64": "F64", "half": "F16"}


def dtype_name(dtype: torch.dtype) -> str:
    """The safetensors name of ``dtype``; ValueError when safetensors has none."""
    try:
        return _NAMES[dtype]
    except KeyError:
        raise ValueError(
            f"dtype {str(dtype).removeprefix('torch.')} has no safetensors name "
            f"(safetensors stores {', '.join(DTYPES)})"
        ) from None


def safetensors_dtype(value: str | torch.dtype) -> torch.dtype:
    """A torch dtype from a safetensors name (``BF16``), a torch name (``bfloat16``,
    ``torch.bfloat16``), a short name (``bf16``, ``fp32``) or a torch dtype.

    ValueError naming the value and the valid names otherwise.
    """
    if isinstance(value, torch.dtype):
        dtype_name(value)
        return value
    if not isinstance(value, str):
        raise TypeError(f"dtype must be a str or torch.dtype, got {type(value).__name__}")
    text = value.strip()
    key = _SHORT.get(text.lower(), text.upper())
    if key in DTYPES:
        return DTYPES[key]
    torch_name = text.removeprefix("torch.")
    for dtype in _NAMES:
        if str(dtype).removeprefix("torch.") == torch_name:
            return dtype
    raise ValueError(
        f"dtype {value!r} is not a safetensors dtype; use one of {', '.join(DTYPES)} "
        "(or a torch name such as bfloat16, or bf16/fp16/fp32)"
    )


def shard_name(i: int, n: int) -> str:
    """Hugging Face's name of file ``i`` (1-based) of ``n``.

    >>> shard_name(2, 3)
    'model-00002-of-00003.safetensors'
    """
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def header_bytes(entries: Mapping[str, tuple[torch.dtype, tuple[int, ...], int, int]]) -> bytes:
    """The 8-byte length and space-padded JSON header for ``name -> (dtype, shape, begin,
    end)`` (byte offsets relative to the data section), with ``{"format": "pt"}``
    metadata as ``safetensors.torch.save_file`` writes."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    for name, (dtype, shape, begin, end) in entries.items():
        header[name] = {
            "dtype": dtype_name(dtype),
            "shape": list(shape),
            "data_offsets": [begin, end],
        }
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def read_header(path: str | os.PathLike[str]) -> tuple[dict[str, Any], int]:
    """The JSON header of a ``.safetensors`` file and the offset of its data section.

    Checks what a reader needs (known dtypes, shapes, offsets that fit the file);
    ValueError naming the file otherwise. Reads only the header.
    """
    where = Path(path)
    size = where.stat().st_size
    with open(where, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise ValueError(f"{str(path)!r}: too short for a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > min(_MAX_HEADER, size - 8):
            raise ValueError(f"{str(path)!r}: header length {n} does not fit the file")
        text = f.read(n)
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{str(path)!r}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{str(path)!r}: header is not a JSON object")
    data = size - 8 - n
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES[entry["dtype"]]
            shape = [int(s) for s in entry["shape"]]
            begin, end = (int(v) for v in entry["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{str(path)!r}: tensor {name!r} has a malformed entry {entry!r}"
            ) from None
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= data or end - begin != nbytes:
            raise ValueError(
                f"{str(path)!r}: tensor {name!r} data_offsets {[begin, end]} do not hold "
                f"shape {shape} {entry['dtype']} inside the {data} data bytes"
            )
    return header, 8 + n
