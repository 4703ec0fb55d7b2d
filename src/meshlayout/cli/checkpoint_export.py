"""``meshlayout checkpoint export CHECKPOINT OUT_DIR``: a DCP checkpoint as HF safetensors.

Runs :func:`meshlayout.torch.checkpoint.export_safetensors` with the flags
``--keys PATTERNS``, ``--exclude PATTERNS`` (which tensors, by fnmatch name pattern),
``--max-file-size SIZE``, ``--buffer SIZE``, ``--dtype DTYPE``, ``--strip-prefix
PREFIX``; draws a progress bar on stderr when it is a terminal. Exit code 0 when
written, 1 when the checkpoint does not hold some tensor exactly (holes, overlaps,
stored data unlike the metadata, a data file missing, truncated, corrupt or crafted:
nothing written), 2 for a usage error (bad flags, sizes, dtypes, patterns, paths, an
``OUT_DIR`` that already holds a model, a ``.metadata`` that is missing, unreadable or
crafted), each reported in one line. Called by :mod:`.checkpoint`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase

from .args import ArgError, one_line, parse_size, shown
from .output import json_text

__all__ = ["EXPORT_FLAGS", "add_export_arguments", "run_export"]

#: The flags that only apply to ``export`` (dest names).
EXPORT_FLAGS = ("keys", "exclude", "max_file_size", "buffer", "dtype", "strip_prefix")


def add_export_arguments(p: argparse.ArgumentParser) -> None:
    """The ``export`` action's flags, in their own help group."""
    g = p.add_argument_group("export (meshlayout checkpoint export CHECKPOINT OUT_DIR)")
    g.add_argument(
        "--keys",
        action="append",
        metavar="PATTERNS",
        help="export only tensors whose checkpoint name matches one of these fnmatch "
        "patterns (comma-separated, repeatable; e.g. 'model.*')",
    )
    g.add_argument(
        "--exclude",
        action="append",
        metavar="PATTERNS",
        help="leave out tensors whose name matches one of these patterns (e.g. 'optim.*')",
    )
    g.add_argument(
        "--max-file-size",
        metavar="SIZE",
        help="largest tensor data per output file (default 5GiB; e.g. 2GB, 500MiB)",
    )
    g.add_argument(
        "--buffer",
        metavar="SIZE",
        help="memory for streaming (default 64MiB): resident memory stays near it",
    )
    g.add_argument(
        "--dtype",
        metavar="DTYPE",
        help="cast floating-point tensors of 1 or more dims (BF16, F16, F32, bf16, ...)",
    )
    g.add_argument(
        "--strip-prefix",
        metavar="PREFIX",
        help="drop PREFIX from tensor names that start with it (e.g. 'model.')",
    )


def _human(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} bytes"


def _patterns(values: Sequence[str] | None, flag: str) -> list[str]:
    """The patterns of a repeatable, comma-separated flag; an empty one is an error."""
    out: list[str] = []
    for value in values or []:
        parts = [p.strip() for p in value.split(",")]
        if not all(parts):
            raise ArgError(f"{flag} {shown(value)}: empty pattern (expected PATTERN[,PATTERN...])")
        out.extend(parts)
    return out


def key_filter(
    names: Sequence[str], keys: Sequence[str], exclude: Sequence[str]
) -> Callable[[str], bool] | None:
    """The predicate of ``--keys`` / ``--exclude`` over the checkpoint's tensor ``names``.

    A name is kept when it matches a ``keys`` pattern (or no ``keys`` are given) and no
    ``exclude`` pattern. A ``keys`` pattern that matches no name is an error (a typo
    would silently drop tensors), and so is a selection that keeps nothing; an
    ``exclude`` pattern that matches nothing is fine (the same flags serve checkpoints
    with and without optimizer state).

    >>> keep = key_filter(["model.w", "optim.state.w.exp_avg"], [], ["optim.*"])
    >>> keep("model.w"), keep("optim.state.w.exp_avg")
    (True, False)
    """
    if not keys and not exclude:
        return None
    some = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    for pattern in keys:
        if not any(fnmatchcase(n, pattern) for n in names):
            raise ArgError(
                f"--keys {shown(pattern)}: matches none of the checkpoint's {len(names)} "
                f"tensor names ({some})"
            )

    def keep(name: str) -> bool:
        wanted = not keys or any(fnmatchcase(name, p) for p in keys)
        return wanted and not any(fnmatchcase(name, p) for p in exclude)

    if not any(keep(n) for n in names):
        given = [f"--keys {shown(','.join(keys))}"] if keys else []
        given += [f"--exclude {shown(','.join(exclude))}"] if exclude else []
        raise ArgError(f"{' '.join(given)}: leaves none of the checkpoint's tensors ({some})")
    return keep


def run_export(args: argparse.Namespace, paths: list[str]) -> int:
    """Export ``paths = [CHECKPOINT, OUT_DIR]``; print what was written."""
    if len(paths) != 2:
        raise ArgError(
            f"export takes CHECKPOINT OUT_DIR, got {len(paths)} paths"
            + (" (to inspect a directory named export, write ./export)" if not paths else "")
        )
    for flag in ("verify", "svg", "tensor"):
        if getattr(args, flag, None):
            raise ArgError(f"--{flag} applies to inspecting a checkpoint, not to export")
    try:
        import torch  # noqa: F401

        from ..torch.checkpoint._export import NotExportableError, export_safetensors
        from ..torch.checkpoint._inspect import tensor_names
        from ..torch.checkpoint._st_format import safetensors_dtype
    except ImportError as exc:
        raise ArgError(f"checkpoint export needs torch: {exc}") from None
    max_file = 5 * 2**30
    if args.max_file_size is not None:
        max_file = parse_size(args.max_file_size, "--max-file-size")
    buffer = 64 * 2**20
    if args.buffer is not None:
        buffer = parse_size(args.buffer, "--buffer", minimum=64)
    dtype = None
    if args.dtype is not None:
        try:
            dtype = safetensors_dtype(args.dtype)
        except ValueError as exc:
            raise ArgError(f"--dtype: {one_line(str(exc))}") from None
        if not dtype.is_floating_point:
            raise ArgError(
                f"--dtype {shown(args.dtype)}: only floating-point dtypes can be cast to"
            )
    rename: Callable[[str], str] | None = None
    if args.strip_prefix:
        prefix = args.strip_prefix
        rename = lambda name: name.removeprefix(prefix)  # noqa: E731
    keys, exclude = _patterns(args.keys, "--keys"), _patterns(args.exclude, "--exclude")
    checkpoint, out_dir = paths
    try:
        keep = None
        if keys or exclude:
            names = tensor_names(checkpoint)
            keep = key_filter(names, keys, exclude)
        result = export_safetensors(
            checkpoint,
            out_dir,
            keys=keep,
            rename=rename,
            dtype=dtype,
            max_file_bytes=max_file,
            buffer_bytes=buffer,
            progress=sys.stderr.isatty(),
        )
    except ArgError:
        raise
    except NotExportableError as exc:
        print(
            f"meshlayout checkpoint export: cannot export {one_line(checkpoint)}: "
            f"{one_line(str(exc))}",
            file=sys.stderr,
        )
        return 1
    except (OSError, ValueError, KeyError) as exc:
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        if isinstance(exc, OSError) and exc.strerror and not text.startswith("'"):
            text = f"{exc.strerror}: {exc.filename}"
        raise ArgError(f"{shown(checkpoint)} -> {shown(out_dir)}: {one_line(text)}") from None
    summary = {
        "checkpoint": checkpoint,
        "out_dir": str(result.out_dir),
        "files": list(result.files),
        "tensors": len(result.tensors),
        "total_bytes": result.total_bytes,
    }
    if args.format == "json":
        print(json_text(summary))
    else:
        print(
            f"exported {len(result.tensors)} tensors ({_human(result.total_bytes)}) from "
            f"{one_line(checkpoint)} to {one_line(out_dir)}: {', '.join(result.files)}"
        )
    return 0
