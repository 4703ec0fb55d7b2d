"""``meshlayout checkpoint PATH``: the tensors of a DCP checkpoint and whether their chunks tile.

For every tensor: shape, dtype, number of chunks and the tiling verdict (``exact``, or
the holes and overlaps by name); tensors that do not tile also list their chunks (as
does ``--tensor NAME``). Exit code 0 when every tensor tiles exactly, 1 when one does
not (or, with ``--verify``, when a stored chunk is not what the metadata says), 2 for
a usage error. ``--format json`` prints the full report; ``--svg FILE`` draws one
tensor's chunks coloured by writing rank. Needs torch (to read ``.metadata``).

``PATH`` may also be a ``.safetensors`` file or a Hugging Face model directory
(:mod:`.checkpoint_safetensors`), and ``meshlayout checkpoint export CHECKPOINT
OUT_DIR`` writes a DCP checkpoint as safetensors (:mod:`.checkpoint_export`). A first
path ``export`` always means the action: inspect a directory named ``export`` as
``./export``. ``.metadata`` is read with a restricted unpickler: safe on any input.
Registered in :data:`meshlayout.cli.COMMANDS`; see ``docs/checkpoint.md``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .args import ArgError, one_line, shown
from .checkpoint_export import EXPORT_FLAGS, add_export_arguments, run_export
from .checkpoint_safetensors import run_safetensors
from .output import write

__all__ = ["EPILOG", "HELP", "add_arguments", "report_text", "run"]

HELP = "a DCP checkpoint's tensors: shapes, dtypes, chunks, writers; holes and overlaps named"

USAGE = """\
meshlayout checkpoint [--tensor NAME] [--verify] [--format {text,json}] [--svg FILE] PATH
       meshlayout checkpoint export [--keys PATTERNS] [--exclude PATTERNS] [--max-file-size SIZE]
                                    [--buffer SIZE] [--dtype DTYPE] [--strip-prefix PREFIX]
                                    [--format {text,json}] CHECKPOINT OUT_DIR"""

EPILOG = """\
examples:
  meshlayout checkpoint ckpt/step-100
  meshlayout checkpoint --tensor model.layers.0.attention.wq.weight ckpt/step-100
  meshlayout checkpoint --verify ckpt/step-100        # also open every stored chunk
  meshlayout checkpoint --format json ckpt/step-100
  meshlayout checkpoint --svg chunks.svg ckpt/step-100  # first tensor that does not tile
  meshlayout checkpoint hf-out/                       # a safetensors file or model directory
  meshlayout checkpoint export ckpt/step-100 hf-out --dtype bf16 --strip-prefix model.
  meshlayout checkpoint export ckpt/step-100 hf-out --keys 'model.*' --strip-prefix model.
  meshlayout checkpoint ./export                      # a directory named export

exit codes: 0 every tensor tiles exactly, 1 some tensor does not (or --verify found
stored data that differs from the metadata or a data file truncated, corrupt or
missing; for safetensors, the index disagrees with the files; for export, nothing was
written because of that), 2 usage error (or no readable .metadata).
.metadata is read with a restricted unpickler: inspecting and exporting are safe on
any checkpoint; loading one (dcp.load) unpickles it: load only checkpoints you trust.
"""

_CHUNKS_SHOWN = 32


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``checkpoint`` subcommand's arguments (inspecting, and the ``export`` action's)."""
    p.usage = USAGE
    p.add_argument(
        "paths",
        metavar="PATH",
        nargs="+",
        help="checkpoint directory (holds .metadata), or a .safetensors file or directory; "
        "or: export CHECKPOINT OUT_DIR",
    )
    p.add_argument("--tensor", metavar="NAME", help="list this tensor's chunks (and draw it)")
    p.add_argument(
        "--verify",
        action="store_true",
        help="also read every stored chunk and check its shape and dtype",
    )
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="stdout format (default text)"
    )
    p.add_argument("--svg", metavar="FILE", help="write an SVG of one tensor's chunks to FILE")
    add_export_arguments(p)


def _box(box: list[list[int]]) -> str:
    return "(" + ", ".join(f"{a}:{b}" for a, b in box) + ")" if box else "()"


def _chunk_lines(entry: dict[str, Any]) -> list[str]:
    lines = []
    for i, c in enumerate(entry["chunks"][:_CHUNKS_SHOWN]):
        box = _box([[o, o + s] for o, s in zip(c["offsets"], c["sizes"])])
        writer = f"rank {c['rank']}" if c.get("rank") is not None else "rank ?"
        lines.append(f"    chunk {i:<3} {box:<24} {writer:<8} {c.get('file') or '-'}")
    if len(entry["chunks"]) > _CHUNKS_SHOWN:
        lines.append(
            f"    ... {len(entry['chunks'])} chunks in all (--format json lists every one)"
        )
    return lines


def report_text(report: dict[str, Any], tensor: str | None = None) -> str:
    """The plain-text table of a :func:`describe_checkpoint` report."""
    tensors, values = report["tensors"], report["values"]
    bad = [t for t in tensors if not t["exact"] or t.get("stored")]
    head = (
        f"checkpoint {report['checkpoint']}: {len(tensors)} tensors, {len(values)} other "
        f"values, {len(report['files'])} data files"
    )
    rows = [("tensor", "shape", "dtype", "chunks", "tiling")]
    for t in tensors:
        verdict = t["tiling"]
        if t.get("stored"):
            verdict += f"; {len(t['stored'])} stored chunks unlike the metadata or damaged"
        rows.append((t["name"], str(tuple(t["shape"])), t["dtype"], str(len(t["chunks"])), verdict))
    widths = [max(len(r[k]) for r in rows) for k in range(4)]
    lines = [head, ""]
    for r in rows:
        lines.append("  ".join(r[k].ljust(widths[k]) for k in range(4)) + "  " + r[4])
    for v in values:
        lines.append(f"{v['name'].ljust(widths[0])}  (non-tensor value, {v.get('file') or '-'})")
    for t in tensors:
        if t["exact"] and not t.get("stored") and t["name"] != tensor:
            continue
        lines.append("")
        lines.append(f"{t['name']}: {t['tiling']}")
        lines.extend(f"  stored data: {s}" for s in t.get("stored", []))
        lines.extend(_chunk_lines(t))
    lines.append("")
    if bad:
        lines.append(
            f"NOT EXACT: {len(bad)} of {len(tensors)} tensors ({', '.join(t['name'] for t in bad[:5])}"
            + (", ..." if len(bad) > 5 else "")
            + ")"
        )
    else:
        lines.append(f"exact: all {len(tensors)} tensors tile exactly")
    return "\n".join(lines)


def _pick(report: dict[str, Any], name: str | None) -> dict[str, Any] | None:
    tensors: list[dict[str, Any]] = report["tensors"]
    if name is not None:
        for t in tensors:
            if t["name"] == name:
                return t
        names = ", ".join(t["name"] for t in tensors[:8]) + (", ..." if len(tensors) > 8 else "")
        raise ArgError(f"--tensor {shown(name)}: no such tensor in the checkpoint (it has {names})")
    for t in tensors:
        if not t["exact"] or t.get("stored"):
            return t
    return tensors[0] if tensors else None


def run(args: argparse.Namespace) -> int:
    """Inspect PATH (0 all exact, else 1) or run ``export``."""
    paths: list[str] = args.paths
    if paths[0] == "export":
        return run_export(args, paths[1:])
    for dest in EXPORT_FLAGS:
        if getattr(args, dest, None) is not None:
            flag = "--" + dest.replace("_", "-")
            raise ArgError(f"{flag} applies to 'meshlayout checkpoint export CHECKPOINT OUT_DIR'")
    if len(paths) > 1:
        raise ArgError(f"give one PATH to inspect, got {len(paths)}: {' '.join(map(shown, paths))}")
    args.dir = paths[0]
    try:
        from ..torch.checkpoint._st_describe import is_safetensors
    except ImportError as exc:
        raise ArgError(f"the checkpoint command needs torch: {exc}") from None
    try:
        safetensors = is_safetensors(args.dir)
    except (OSError, ValueError) as exc:  # e.g. a name too long for the file system
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ArgError(f"PATH {shown(args.dir)}: {one_line(reason)}") from None
    if safetensors:
        return run_safetensors(args, args.dir)
    try:
        from ..torch.checkpoint._inspect import describe_checkpoint
    except ImportError as exc:
        raise ArgError(f"the checkpoint command needs torch: {exc}") from None
    try:
        report = describe_checkpoint(args.dir, verify=args.verify)
    except (OSError, ValueError) as exc:
        raise ArgError(f"DIR {shown(args.dir)}: {one_line(str(exc))}") from None
    entry = _pick(report, args.tensor)
    if args.svg:
        if entry is None:
            raise ArgError(f"--svg {shown(args.svg)}: the checkpoint holds no tensor to draw")
        from ..render.checkpoint_svg import checkpoint_svg

        write("--svg", args.svg, checkpoint_svg(entry), what=entry["name"])
    if args.format == "json":
        print(json.dumps(report, indent=1))
    else:
        print(report_text(report, args.tensor))
    return 0 if report["ok"] else 1
