"""The ``meshlayout`` command's entry point: the parser and the subcommand registry.

Subcommands are registered in :data:`COMMANDS` as ``name -> Command(help,
add_arguments, run, epilog)``; adding one is adding an entry. A subcommand
reports a user mistake by raising :class:`~meshlayout.cli.args.ArgError` (or by
calling the library inside :func:`~meshlayout.cli.args.user_input`): one line on
stderr naming the flag and the value, exit code 2. Any other exception is a bug
and keeps its traceback. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NoReturn

from . import checkpoint, demo, mesh, plan, reshard, shard
from .args import ArgError, one_line

__all__ = ["COMMANDS", "Command", "main"]

PROG = "meshlayout"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``prog: error: message``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


@dataclass(frozen=True)
class Command:
    """One subcommand: its one-line help, argument set-up, action and ``--help`` examples."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str = ""


COMMANDS: dict[str, Command] = {
    "plan": Command(plan.HELP, plan.add_arguments, plan.run, plan.EPILOG),
    "mesh": Command(mesh.HELP, mesh.add_arguments, mesh.run, mesh.EPILOG),
    "shard": Command(shard.HELP, shard.add_arguments, shard.run, shard.EPILOG),
    "reshard": Command(reshard.HELP, reshard.add_arguments, reshard.run, reshard.EPILOG),
    "demo": Command(demo.HELP, demo.add_arguments, demo.run, demo.EPILOG),
    "checkpoint": Command(
        checkpoint.HELP, checkpoint.add_arguments, checkpoint.run, checkpoint.EPILOG
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per entry of :data:`COMMANDS`."""
    parser = _Parser(
        prog=PROG,
        description="Named device meshes, process groups and exact sharding for N-D parallelism.",
        epilog="run 'meshlayout COMMAND --help' for examples",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(
            name,
            help=cmd.help,
            description=cmd.help,
            epilog=cmd.epilog or None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        cmd.add_arguments(p)
        p.set_defaults(run=cmd.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meshlayout`` command; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # --help (0) or a usage error (2, already reported)
        return exc.code if isinstance(exc.code, int) else 2
    if args.command is None:
        print(
            f"{PROG}: error: choose a command: {', '.join(COMMANDS)} (see {PROG} --help)",
            file=sys.stderr,
        )
        return 2
    try:
        code: int = args.run(args)
    except ArgError as exc:  # a user mistake; anything else is a bug: traceback
        lines = str(exc).strip().splitlines() or ["bad argument"]
        print(f"{PROG} {args.command}: error: {one_line(lines[0])}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `meshlayout plan ... | head`
        return 0
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
