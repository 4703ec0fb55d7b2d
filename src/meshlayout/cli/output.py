"""Output helpers shared by the subcommands: ``--format/--svg/--html`` flags, files, JSON.

Every subcommand module imports this one; it imports none of them (no cycle).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ..render import TooLargeError
from .args import ArgError, one_line, shown

__all__ = [
    "add_output",
    "busiest_rows",
    "emit",
    "file_name",
    "json_text",
    "picture_flags",
    "too_large",
    "write",
]


def file_name(text: str) -> str:
    """argparse type of ``--svg``/``--html`` FILE: any non-blank name."""
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file name, got {shown(text)}")
    return text


def add_output(p: argparse.ArgumentParser, *, html: bool = True) -> None:
    """``--format text|json``, ``--svg FILE`` and (``html``) ``--html FILE``."""
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="stdout format (default text)"
    )
    p.add_argument(
        "--svg", metavar="FILE", type=file_name, help="also write an SVG picture to FILE"
    )
    if html:
        p.add_argument(
            "--html", metavar="FILE", type=file_name, help="also write a self-contained HTML page"
        )


def write(flag: str, path: str, content: str, *, what: str = "") -> None:
    """Write ``content`` to ``path`` (named by ``flag`` in errors) and say so on stderr.

    ``what``, if given, names the content in the message: ``wrote f.svg (w, 812 bytes)``.
    """
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte or an unencodable name
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ArgError(f"{flag} {shown(path)}: cannot write: {reason}") from None
    label = f"{what}, " if what else ""
    print(f"wrote {one_line(path)} ({label}{len(content.encode())} bytes)", file=sys.stderr)


@contextmanager
def too_large(flag: str) -> Iterator[None]:
    """Blame a :class:`render.TooLargeError` (an answer past the listing limit) on ``flag``."""
    try:
        yield
    except TooLargeError as exc:
        raise ArgError(f"{flag}: {exc}") from None


def picture_flags(args: argparse.Namespace) -> str:
    """``--svg FILE --html FILE`` as given, for errors about the pictures."""
    given = [(f, getattr(args, f[2:], None)) for f in ("--svg", "--html")]
    return " ".join(f"{f} {shown(v)}" for f, v in given if v)


def json_text(value: Any, indent: str = "") -> str:
    """JSON with one key per line and every list on one line (fast for big lists).

    >>> print(json_text({"a": [[0, 1], [2, 3]], "b": {"c": None}}))
    {
     "a": [[0, 1], [2, 3]],
     "b": {
      "c": null
     }
    }
    """
    if not isinstance(value, dict) or not value:
        return json.dumps(value)
    inner = indent + " "
    items = [f"{inner}{json.dumps(str(k))}: {json_text(v, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(items) + f"\n{indent}}}"


def emit(args: argparse.Namespace, report: dict[str, Any], text: str) -> None:
    """Print the report as JSON (``--format json``) or the text."""
    print(json_text(report) if args.format == "json" else text)


def busiest_rows(
    summary: dict[str, Any], unit: str, amount: Callable[[int], str]
) -> list[list[str]]:
    """The ``busiest ranks`` and (with hosts) ``across hosts`` rows of a plan's summary.

    ``unit`` names the summary's counts (``max_send_<unit>``, ``across_host_<unit>``:
    ``elements`` for reshard, ``bytes`` for transfer); ``amount`` formats one count.
    """
    s = summary
    busiest = [
        f"rank {s[f'max_{k}_rank']} {verb} {amount(s[f'max_{k}_{unit}'])}"
        for k, verb in (("send", "sends"), ("recv", "receives"))
        if s[f"max_{k}_rank"] is not None
    ]
    rows = [["busiest ranks", "; ".join(busiest) or "nothing is sent"]]
    if s["ranks_per_host"] is not None:
        hosts = f"{amount(s[f'across_host_{unit}'])} ({s['ranks_per_host']} ranks per host)"
        rows.append(["across hosts", hosts])
    return rows
