"""A model's tensors (names, shapes, dtypes) from what users have, reading headers only.

``meshlayout transfer`` plans a whole model before anyone launches it, so it needs
the model's tensor list without loading the model. :func:`read_tensors` takes

- a ``.safetensors`` file, or a directory of them (with a
  ``*.safetensors.index.json``: exactly the files its ``weight_map`` names; without:
  every ``*.safetensors`` file, and a name stored twice is an error), or the index
  file itself. Only each file's header is read (8-byte little-endian length, then
  JSON), never tensor data;
- a DCP checkpoint directory (holding ``.metadata``), read with
  :func:`meshlayout.torch.checkpoint._inspect.read_metadata` (needs torch);
  non-tensor values are skipped;
- a small JSON file: ``[{"name": ..., "shape": [...], "dtype": "bfloat16"}, ...]``
  or ``{name: {"shape": [...], "dtype": ...}, ...}``.

Dtype names are canonical torch names (``bfloat16``, ``float8_e4m3fn``, ...);
:func:`dtype_name` also takes safetensors codes (``BF16``), ``torch.`` prefixes and
short forms (``bf16``, ``fp32``, ``half``). Every problem raises ``FileNotFoundError``
or ``ValueError`` with a one-line message naming the file and, where there is one,
the tensor.

>>> dtype_name("BF16"), dtype_name("torch.float32"), DTYPES["float8_e4m3fn"]
('bfloat16', 'float32', 1)
>>> TensorInfo("w", (4, 3), "bfloat16").nbytes
24
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "DTYPES",
    "TensorInfo",
    "dcp_tensors",
    "dtype_name",
    "json_tensors",
    "read_tensors",
    "safetensors_header",
    "safetensors_tensors",
]

#: Bytes per element of every dtype a tensor list may name (canonical torch names).
DTYPES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint64": 8,
    "uint32": 4,
    "uint16": 2,
    "uint8": 1,
    "bool": 1,
}

#: safetensors' dtype codes (the format's ``dtype`` field) and common short forms.
_ALIASES: dict[str, str] = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "f8_e4m3": "float8_e4m3fn",
    "f8_e5m2": "float8_e5m2",
    "f8_e8m0": "float8_e8m0fnu",
    "c64": "complex64",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u64": "uint64",
    "u32": "uint32",
    "u16": "uint16",
    "u8": "uint8",
    "fp64": "float64",
    "fp32": "float32",
    "fp16": "float16",
    "double": "float64",
    "float": "float32",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
}
#: Sub-byte formats: a byte count per element does not exist, so they are refused by name.
_SUB_BYTE = {"f4", "f6_e2m3", "f6_e3m2", "float4_e2m1fn_x2", "uint4", "int4", "bits"}

#: The largest header this module reads (the safetensors format's own limit is 100 MB).
_INDEX = ".safetensors.index.json"
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a model: its name, global shape and stored dtype (a :data:`DTYPES` key)."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        """Elements of the full tensor."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the full tensor in its stored dtype."""
        return self.numel * DTYPES[self.dtype]


def dtype_name(text: str) -> str:
    """The canonical name of a dtype name, safetensors code or short form; ValueError else.

    >>> dtype_name("F8_E4M3"), dtype_name("fp16")
    ('float8_e4m3fn', 'float16')
    >>> dtype_name("F4")
    Traceback (most recent call last):
    ...
    ValueError: dtype 'F4' packs several elements per byte; only whole-byte dtypes are supported
    """
    if not isinstance(text, str):
        raise ValueError(f"dtype must be a string, got {text!r}")
    key = text.strip().removeprefix("torch.").lower()
    if key in DTYPES:
        return key
    if key in _ALIASES:
        return _ALIASES[key]
    if key in _SUB_BYTE:
        raise ValueError(
            f"dtype {text!r} packs several elements per byte; only whole-byte dtypes are supported"
        )
    shown = text if len(text) <= 40 else text[:40] + "..."
    raise ValueError(
        f"unknown dtype {shown!r} (known: {', '.join(DTYPES)}; also safetensors codes such as BF16)"
    )


def _shape(value: object, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) for s in value
    ):
        raise ValueError(f"{where}: shape must be a list of integers, got {_short(value)}")
    if any(s < 0 or s > _INT64_MAX for s in value):
        raise ValueError(f"{where}: shape sizes must lie in [0, 2**63), got {_short(value)}")
    return tuple(value)


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, (bytes, set)) else repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _tensor(name: str, shape: object, dtype: object, where: str) -> TensorInfo:
    here = f"{where}: tensor {name!r}"
    if not isinstance(dtype, str):
        raise ValueError(f"{here}: dtype must be a string, got {_short(dtype)}")
    try:
        canonical = dtype_name(dtype)
    except ValueError as exc:
        raise ValueError(f"{here}: {exc}") from None
    return TensorInfo(name, _shape(shape, here), canonical)


# ---------------------------------------------------------------------- safetensors
def safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of one ``.safetensors`` file (read without touching tensor data).

    The format and its checks are :func:`meshlayout.torch.checkpoint._st_format.read_header`'s
    (the exporter and ``load_safetensors`` read files through it too); ValueError naming
    the file when it is not a safetensors file or an entry does not fit it.
    """
    from ..torch.checkpoint._st_format import read_header  # torch: only when a file is read

    return read_header(path)[0]


def safetensors_tensors(path: str | os.PathLike[str]) -> tuple[TensorInfo, ...]:
    """The tensors of one ``.safetensors`` file, in header order; checks each entry.

    An entry's ``data_offsets`` must span exactly ``numel x itemsize`` bytes (a cheap
    header-only consistency check; the data itself is never read).
    """
    where = str(path)
    out = []
    for name, entry in safetensors_header(path).items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"{where!r}: tensor {name!r}: header entry is not an object")
        info = _tensor(name, entry.get("shape"), entry.get("dtype"), repr(where))
        offsets = entry.get("data_offsets")
        if (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
            and offsets[1] - offsets[0] != info.nbytes
        ):
            raise ValueError(
                f"{where!r}: tensor {name!r}: data_offsets {offsets} hold "
                f"{offsets[1] - offsets[0]} bytes, but {info.shape} {info.dtype} needs {info.nbytes}"
            )
        out.append(info)
    return tuple(out)


def _index_files(index: Path) -> list[Path]:
    """The data files a ``*.safetensors.index.json`` names, in first-mention order."""
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{str(index)!r} is not valid JSON ({exc})") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"{str(index)!r}: expected an object with a weight_map of name -> file")
    files = [index.parent / f for f in dict.fromkeys(weight_map.values())]
    for f in files:
        if not f.is_file():
            raise FileNotFoundError(f"{str(index)!r} names {f.name!r}, which does not exist")
    return files


def _merged(files: Iterable[Path]) -> tuple[TensorInfo, ...]:
    """The tensors of several files; a name stored in two files is an error naming both."""
    seen: dict[str, Path] = {}
    out: list[TensorInfo] = []
    for f in files:
        for t in safetensors_tensors(f):
            if t.name in seen:
                raise ValueError(
                    f"tensor {t.name!r} is stored in both {seen[t.name].name!r} and {f.name!r}"
                )
            seen[t.name] = f
            out.append(t)
    return tuple(out)


def _safetensors_dir(root: Path) -> tuple[TensorInfo, ...]:
    indexes = sorted(root.glob("*" + _INDEX))
    if len(indexes) > 1:
        names = ", ".join(i.name for i in indexes)
        raise ValueError(f"{str(root)!r} holds several index files ({names}); name one of them")
    if indexes:
        return _merged(_index_files(indexes[0]))
    files = sorted(root.glob("*.safetensors"))
    return _merged(files)


# ---------------------------------------------------------------------- DCP
def dcp_tensors(path: str | os.PathLike[str]) -> tuple[TensorInfo, ...]:
    """The tensors of a DCP checkpoint directory, from its ``.metadata`` (needs torch)."""
    try:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        from ..torch.checkpoint._inspect import read_metadata
    except ImportError as exc:
        raise ValueError(
            f"reading a DCP checkpoint needs torch (pip install 'meshlayout[torch]'): {exc}"
        ) from None
    metadata = read_metadata(path)
    out = []
    for name, md in metadata.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            dtype = str(md.properties.dtype)
            shape = [int(s) for s in md.size]
            out.append(_tensor(str(name), shape, dtype, repr(str(path))))
    return tuple(out)


# ---------------------------------------------------------------------- JSON
_KEYS = ("name", "shape", "dtype")


def _entry(value: object, where: str, name: str | None) -> TensorInfo:
    label = f"entry {name!r}" if name is not None else "an entry"
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {label} must be an object with shape and dtype")
    keys = ("shape", "dtype") if name is not None else _KEYS
    unknown = [k for k in value if k not in keys]
    missing = [k for k in keys if k not in value]
    if unknown or missing:
        what = f"unknown key {unknown[0]!r}" if unknown else f"missing key {missing[0]!r}"
        raise ValueError(f"{where}: {label}: {what} (expected {', '.join(keys)})")
    if name is None:
        name = value["name"]
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: name must be a non-empty string, got {_short(name)}")
    return _tensor(name, value["shape"], value["dtype"], where)


def json_tensors(path: str | os.PathLike[str]) -> tuple[TensorInfo, ...]:
    """The tensors of a JSON list (``[{name, shape, dtype}, ...]``) or map (``{name: {shape, dtype}}``).

    >>> import json, tempfile
    >>> with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    ...     json.dump({"w": {"shape": [4, 3], "dtype": "bf16"}}, f)
    >>> json_tensors(f.name)
    (TensorInfo(name='w', shape=(4, 3), dtype='bfloat16'),)
    """
    where = repr(str(path))
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{where} is not UTF-8 text ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where} is not valid JSON ({exc})") from None
    if isinstance(data, dict):
        out = tuple(_entry(v, where, str(k)) for k, v in data.items())
    elif isinstance(data, list):
        out = tuple(_entry(v, where, None) for v in data)
    else:
        raise ValueError(f"{where}: expected a list of tensors or an object name -> tensor")
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"{where}: tensor {dup!r} is listed twice")
    return out


# ---------------------------------------------------------------------- dispatch
def read_tensors(path: str | os.PathLike[str]) -> tuple[str, tuple[TensorInfo, ...]]:
    """``(kind, tensors)`` of a safetensors file or directory, a DCP checkpoint or a JSON list.

    ``kind`` is ``"safetensors"``, ``"dcp"`` or ``"json"``. ``FileNotFoundError`` for
    a path that does not exist or a directory holding none of these; ``ValueError``
    for a file that is not what it claims to be, or a model without tensors.
    """
    where = Path(path)
    if where.is_dir():
        if (where / ".metadata").is_file():
            kind, tensors = "dcp", dcp_tensors(where)
        elif any(where.glob("*.safetensors")):
            kind, tensors = "safetensors", _safetensors_dir(where)
        else:
            raise FileNotFoundError(
                f"{str(path)!r} holds neither a DCP checkpoint (.metadata) nor .safetensors files"
            )
    elif where.is_file():
        if where.name.endswith(_INDEX):
            kind, tensors = "safetensors", _merged(_index_files(where))
        elif where.suffix == ".json":
            kind, tensors = "json", json_tensors(where)
        else:
            kind, tensors = "safetensors", safetensors_tensors(where)
    else:
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    if not tensors:
        raise ValueError(f"{str(path)!r} holds no tensors")
    return kind, tensors
