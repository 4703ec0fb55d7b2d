"""What a safetensors file or Hugging Face model directory holds, from the headers alone.

:func:`describe_safetensors` reads each file's JSON header (never the tensor data)
and returns a JSON-ready report: per tensor its name, shape, dtype, bytes and file;
per file its tensors and bytes; the total; and, for a directory with
``model.safetensors.index.json``, whether the index agrees with the files (every
tensor it lists is in the file it names, every tensor of the files is listed, the
``total_size`` matches). ``meshlayout checkpoint PATH`` prints it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from ._st_format import DTYPES, INDEX_NAME, read_header

__all__ = ["describe_safetensors", "is_safetensors"]


def is_safetensors(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a ``.safetensors`` file or a directory holding one (and no DCP
    ``.metadata``)."""
    where = Path(path)
    if where.is_file():
        return where.suffix == ".safetensors"
    if where.is_dir() and not (where / ".metadata").exists():
        return (where / INDEX_NAME).is_file() or any(where.glob("*.safetensors"))
    return False


def _itemsize(dtype: str) -> int:
    import torch

    return torch.empty((), dtype=DTYPES[dtype]).element_size()


def describe_safetensors(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON-ready report of one ``.safetensors`` file or a directory of them.

    Keys: ``path``, ``format`` (``"safetensors"``), ``files`` (name, tensors, bytes),
    ``tensors`` (name, shape, dtype, bytes, file; in file then header order),
    ``total_bytes``, ``index`` (the index file's name or None), ``problems`` (one line
    each: index disagreements, a tensor in two files) and ``ok``. FileNotFoundError /
    ValueError name the path when it holds no readable safetensors file.
    """
    where = Path(path)
    if where.is_dir():
        names = sorted(p.name for p in where.glob("*.safetensors"))
        root = where
        if not names:
            raise FileNotFoundError(f"{str(path)!r} holds no .safetensors file")
    elif where.is_file():
        root, names = where.parent, [where.name]
    else:
        raise FileNotFoundError(f"{str(path)!r} does not exist")
    files: list[dict[str, Any]] = []
    tensors: list[dict[str, Any]] = []
    seen: dict[str, str] = {}
    problems: list[str] = []
    for name in names:
        header, _ = read_header(root / name)
        entries = sorted(
            ((k, v) for k, v in header.items() if k != "__metadata__"),
            key=lambda kv: (int(kv[1]["data_offsets"][0]), kv[0]),
        )
        size = 0
        for key, entry in entries:
            shape = [int(s) for s in entry["shape"]]
            nbytes = math.prod(shape) * _itemsize(entry["dtype"])
            if key in seen:
                problems.append(f"tensor {key!r} is in both {seen[key]} and {name}")
            seen[key] = name
            tensors.append(
                {
                    "name": key,
                    "shape": shape,
                    "dtype": entry["dtype"],
                    "bytes": nbytes,
                    "file": name,
                }
            )
            size += nbytes
        files.append({"name": name, "tensors": len(entries), "bytes": size})
    total = sum(f["bytes"] for f in files)
    index_name = None
    if where.is_dir() and (where / INDEX_NAME).is_file():
        index_name = INDEX_NAME
        problems.extend(_index_problems(where / INDEX_NAME, seen, total))
    return {
        "path": str(path),
        "format": "safetensors",
        "files": files,
        "tensors": tensors,
        "total_bytes": total,
        "index": index_name,
        "problems": problems,
        "ok": not problems,
    }


def _index_problems(index_path: Path, seen: dict[str, str], total: int) -> list[str]:
    try:
        index = json.loads(index_path.read_text(encoding="utf-8"))
        weight_map = dict(index["weight_map"])
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
    ) as exc:
        return [f"{INDEX_NAME} is unreadable ({type(exc).__name__}: {exc})"]
    out = []
    for key, file in sorted(weight_map.items()):
        if key not in seen:
            out.append(f"{INDEX_NAME} lists {key!r} in {file}, which no file holds")
        elif seen[key] != file:
            out.append(f"{INDEX_NAME} lists {key!r} in {file}, it is in {seen[key]}")
    missing = sorted(set(seen) - set(weight_map))
    if missing:
        out.append(
            f"{INDEX_NAME} does not list {len(missing)} tensors ({', '.join(map(repr, missing[:5]))})"
        )
    size = (index.get("metadata") or {}).get("total_size") if isinstance(index, dict) else None
    if size is not None and size != total:
        out.append(f"{INDEX_NAME} says total_size {size}, the files hold {total} bytes")
    return out
