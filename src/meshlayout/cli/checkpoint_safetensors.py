"""``meshlayout checkpoint PATH`` on a safetensors file or a Hugging Face model directory.

Prints :func:`meshlayout.torch.checkpoint.describe_safetensors` (headers only): every
tensor's shape, dtype, bytes and file, every file's tensors and bytes, the total, and
whether ``model.safetensors.index.json`` agrees with the files. Exit code 0, 1 when the
index disagrees, 2 for an unreadable file. Called by :mod:`.checkpoint`.
"""

from __future__ import annotations

import argparse
from typing import Any

from .args import ArgError, one_line, shown
from .output import json_text

__all__ = ["run_safetensors", "safetensors_text"]

_SHOWN = 200


def safetensors_text(report: dict[str, Any], tensor: str | None = None) -> str:
    """The plain-text table of a :func:`describe_safetensors` report."""
    tensors = report["tensors"]
    total = report["total_bytes"]
    index = f", index {report['index']}" if report["index"] else ""
    lines = [
        f"safetensors {report['path']}: {len(tensors)} tensors, {len(report['files'])} files, "
        f"{total} bytes{index}",
        "",
    ]
    chosen = [t for t in tensors if tensor is None or t["name"] == tensor]
    rows = [("tensor", "shape", "dtype", "bytes", "file")]
    rows += [
        (t["name"], str(tuple(t["shape"])), t["dtype"], str(t["bytes"]), t["file"])
        for t in chosen[:_SHOWN]
    ]
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    for r in rows:
        lines.append(
            "  ".join(r[k].rjust(widths[k]) if k == 3 else r[k].ljust(widths[k]) for k in range(4))
            + "  "
            + r[4]
        )
    if len(chosen) > _SHOWN:
        lines.append(f"... {len(chosen)} tensors in all (--format json lists every one)")
    if len(report["files"]) > 1:
        lines.append("")
        width = max(len(f["name"]) for f in report["files"])
        for f in report["files"]:
            lines.append(f"{f['name'].ljust(width)}  {f['tensors']} tensors  {f['bytes']} bytes")
    lines.append("")
    lines.extend(f"problem: {p}" for p in report["problems"])
    lines.append("ok" if report["ok"] else f"NOT OK: {len(report['problems'])} problems")
    return "\n".join(lines)


def run_safetensors(args: argparse.Namespace, path: str) -> int:
    """Describe the safetensors file or directory ``path``; 0, or 1 when the index disagrees."""
    for flag in ("verify", "svg"):
        if getattr(args, flag, None):
            raise ArgError(f"--{flag} applies to DCP checkpoints; {shown(path)} is safetensors")
    from ..torch.checkpoint._st_describe import describe_safetensors

    try:
        report = describe_safetensors(path)
    except (OSError, ValueError) as exc:
        raise ArgError(f"PATH {shown(path)}: {one_line(str(exc))}") from None
    if args.tensor is not None and all(t["name"] != args.tensor for t in report["tensors"]):
        raise ArgError(f"--tensor {shown(args.tensor)}: no such tensor in {shown(path)}")
    if args.format == "json":
        print(json_text(report))
    else:
        print(safetensors_text(report, args.tensor))
    return 0 if report["ok"] else 1
