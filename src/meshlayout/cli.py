"""The ``meshlayout`` command (layer 4): plan a job's meshes, inspect a mesh, a sharding.

Subcommands are registered in :data:`COMMANDS` as ``name -> Command(help,
add_arguments, run, epilog)``; adding one is adding an entry. A subcommand
reports a user mistake by raising :class:`~meshlayout.cli_args.ArgError` (or by
calling the library inside :func:`~meshlayout.cli_args.user_input`): one line on
stderr naming the flag and the value, exit code 2. Any other exception is a bug
and keeps its traceback. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NoReturn

from . import cli_checkpoint, cli_plan, cli_reshard, cli_transfer, render
from .cli_args import (
    ArgError,
    build_mesh,
    int_arg,
    one_line,
    parse_flatten,
    parse_int_list,
    parse_names,
    parse_placements,
    parse_shard_order,
    parse_unflatten,
    shown,
    spec_from_flags,
    user_input,
)
from .mesh import Mesh
from .sharding import Placement, ShardingSpec

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


# ---------------------------------------------------------------------- shared options
_positive = int_arg(minimum=1)
_rank_arg = int_arg(minimum=0)


def _file_name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"expected a file name, got {shown(text)}")
    return text


def _add_output(p: argparse.ArgumentParser, *, html: bool = True) -> None:
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="stdout format (default text)"
    )
    p.add_argument(
        "--svg", metavar="FILE", type=_file_name, help="also write an SVG picture to FILE"
    )
    if html:
        p.add_argument(
            "--html", metavar="FILE", type=_file_name, help="also write a self-contained HTML page"
        )


def _write(flag: str, path: str, content: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte or an unencodable name
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ArgError(f"{flag} {shown(path)}: cannot write: {reason}") from None
    print(f"wrote {one_line(path)} ({len(content.encode())} bytes)", file=sys.stderr)


@contextmanager
def _too_large(flag: str) -> Iterator[None]:
    """Blame a :class:`render.TooLargeError` (an answer past the listing limit) on ``flag``."""
    try:
        yield
    except render.TooLargeError as exc:
        raise ArgError(f"{flag}: {exc}") from None


def _picture_flags(args: argparse.Namespace) -> str:
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


def _emit(args: argparse.Namespace, report: dict[str, Any], text: str) -> None:
    print(json_text(report) if args.format == "json" else text)


# ---------------------------------------------------------------------- mesh
_MESH_EPILOG = """\
examples:
  meshlayout mesh --shape pp=2,dp=4,tp=8
  meshlayout mesh --shape pp=2,dp=4,tp=8 --ranks 2048:2112 --rank 2061
  meshlayout mesh --shape pp=2,dp=4,tp=8 --slice tp,pp --rank 13
  meshlayout mesh --shape pp=2,dp=4,tp=8 --flatten dp,tp=dp_tp --format json
  meshlayout mesh --shape dp=4,tp=2 --unflatten dp=2x2:rep,shard --svg mesh.svg
  meshlayout mesh --shape dp=2,tp=2 --ranks 3,1,2,0 --rank 1

operations (--slice, --flatten, --unflatten) are applied in the order they are
given on the command line, each to the result of the previous one; repeat freely:
  --slice DIMS               keep these dims, in this order (a transpose is allowed)
  --flatten NAME             merge every dim into one named NAME
  --flatten DIMS=NAME        merge DIMS into one dim NAME, placed where the first was
  --unflatten DIM=AxB[:N1,N2] split DIM row-major into sizes A, B (names N1, N2;
                             default DIM0, DIM1, ...)
"""


class _Op(argparse.Action):
    """Record mesh operations in command-line order under ``namespace.ops``."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        ops = list(getattr(namespace, "ops", None) or [])
        ops.append((self.dest, str(values)))
        namespace.ops = ops


def _mesh_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--shape", required=True, help="dims: NAME=SIZE,... (or SIZE,... named dim0, dim1, ...)"
    )
    p.add_argument("--ranks", help="global ranks in row-major order: START:STOP[:STEP] or R,R,... ")
    p.add_argument("--slice", action=_Op, metavar="DIMS", help="keep DIMS (any order)")
    p.add_argument("--flatten", action=_Op, metavar="[DIMS=]NAME", help="merge dims")
    p.add_argument("--unflatten", action=_Op, metavar="DIM=AxB[:NAMES]", help="split a dim")
    p.add_argument("--rank", type=_rank_arg, help="this rank's coordinate, groups and sub-mesh")
    p.add_argument(
        "--view",
        metavar="DIMS",
        help="pictures: colour the groups along these dims (default: the last dim)",
    )
    p.set_defaults(ops=[])
    _add_output(p)


def _apply(mesh: Mesh, op: str, arg: str) -> Mesh:
    """``mesh`` after one ``--slice``/``--flatten``/``--unflatten``; errors name the flag."""
    with user_input(f"--{op}", arg):
        if op == "slice":
            return mesh[parse_names(arg, "--slice")]
        if op == "flatten":
            dims, name = parse_flatten(arg)
            return mesh.flatten(name, dims=dims)
        dim, sizes, names = parse_unflatten(arg)
        return mesh.unflatten(dim, sizes, names)


def _mesh_run(args: argparse.Namespace) -> int:
    mesh = build_mesh(args.shape, args.ranks)
    for op, arg in args.ops:
        mesh = _apply(mesh, op, arg)
    if args.rank is not None and args.rank not in mesh:
        raise ArgError(f"--rank {args.rank} is not in the mesh (ranks {mesh.rank_map!r})")
    view = mesh[mesh.ndim - 1]
    if args.view:
        with user_input("--view", args.view):
            view = mesh[parse_names(args.view, "--view")]
    with _too_large("--format json"):
        report = render.mesh_report(
            mesh, operations=args.ops, rank=args.rank, complete=args.format == "json"
        )
    text = render.mesh_text(report)
    if args.svg or args.html:
        with _too_large(_picture_flags(args)):
            picture = render.mesh_picture(
                mesh, view, rank=args.rank, view_name=",".join(view.names), title=repr(mesh)
            )
        if args.svg:
            _write("--svg", args.svg, picture.to_string())
        if args.html:
            page = render.html_page(
                f"meshlayout mesh: {mesh!r}",
                [render.Section("mesh", text=text, pictures=[picture])],
            )
            _write("--html", args.html, page)
    _emit(args, report, text)
    return 0


# ---------------------------------------------------------------------- shard
_SHARD_EPILOG = """\
examples:
  meshlayout shard --shape 7,4 --mesh dp=3,tp=2 --placements "SS(0,2),S(0)"
  meshlayout shard --shape 7,4 --mesh dp=3,tp=2 --shard-order "0:tp,dp" --svg shard.svg
  meshlayout shard --shape 8 --mesh 2 --placements "SS(0,2)"
  meshlayout shard --shape 10,6 --mesh dp=2,tp=2 --placements "S(0),S(1)" --format json
  meshlayout shard --shape 16,16 --mesh dp=2,cp=2,tp=2 --placements "[Shard(0), Replicate(), Partial('sum')]"

placements (one per mesh dim, comma-separated, optionally in [...]):
  S(d) | Shard(d)                      split tensor dim d (torch.chunk rule)
  SS(d,sf) | StridedShard(d,sf)        torch's _StridedShard(d, split_factor=sf)
  R | Replicate()                      every rank holds the whole extent
  P | P(op) | Partial(op)              pending reduction (op: sum, avg, min, max, ...)
shard order: TENSOR_DIM:MESH_DIM,...[;TENSOR_DIM:...], mesh dims outermost first
  (e.g. "0:tp,dp" is FSDP over TP on rows). With --placements too, the two must agree.
"""


def _shard_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", required=True, help="global tensor shape, e.g. 7,4")
    p.add_argument("--mesh", required=True, help="mesh dims: NAME=SIZE,... (or SIZE,...)")
    p.add_argument("--ranks", help="global ranks of the mesh: START:STOP[:STEP] or R,R,...")
    p.add_argument("--placements", help='one per mesh dim, e.g. "SS(0,2),S(0)"')
    p.add_argument("--shard-order", metavar="ORDER", help='e.g. "0:tp,dp;1:cp"')
    _add_output(p)


def _shard_spec(args: argparse.Namespace) -> tuple[ShardingSpec, list[Placement] | None]:
    """The user's spec (and the placements as given); errors name the flag."""
    if args.placements is None and args.shard_order is None:
        raise ArgError("give --placements, --shard-order, or both")
    shape = parse_int_list(args.shape, "--shape", minimum=0)
    mesh = build_mesh(args.mesh, args.ranks, shape_flag="--mesh")
    given = None if args.placements is None else parse_placements(args.placements)
    order = None if args.shard_order is None else parse_shard_order(args.shard_order)
    spec = spec_from_flags(
        shape,
        mesh,
        None if given is None else (args.placements, given),
        None if order is None else (args.shard_order, order),
    )
    return spec, given


def _shard_run(args: argparse.Namespace) -> int:
    spec, given = _shard_spec(args)
    with _too_large(f"--shape {shown(args.shape)} --mesh {shown(args.mesh)}"):
        report = render.shard_report(spec, given=given)
    text = render.shard_text(report)
    if args.svg or args.html:
        with _too_large(_picture_flags(args)):
            pictures = [render.sharding_picture(spec)]
            if report["torch_disagrees"]:
                pictures.append(render.sharding_picture(spec, torch_view=True))
        if args.svg:
            _write("--svg", args.svg, render.stack(pictures).to_string())
        if args.html:
            section = render.Section(
                "sharding", notes=report["notes"], text=text, pictures=pictures
            )
            _write("--html", args.html, render.html_page(f"meshlayout shard: {spec!r}", [section]))
    _emit(args, report, text)
    return 0


# ---------------------------------------------------------------------- demo
_DEMO_EPILOG = """\
examples:
  meshlayout demo                      # 4 gloo processes, 20 steps
  meshlayout demo --nproc 4 --steps 3  # the quick version CI runs
  meshlayout demo --nproc 8            # dp_shard=4 x tp=2

Plans the meshes with ParallelDims, starts local CPU processes (gloo on
127.0.0.1), binds the meshes to process groups with meshlayout.torch.build(pd, "cpu"),
trains a 10->6->10 MLP with tensor parallelism + FSDP2 on them, and checks the
losses against a single-process run and every parameter's full_tensor against
torch and the single-process weights. Exit status 1 if any check fails.
Needs the torch extra: pip install 'meshlayout[torch]'.
"""


def _demo_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nproc", type=int, default=4, help="processes to start, 1..8 (default 4)")
    p.add_argument("--steps", type=int, default=20, help="training steps (default 20)")
    p.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        help="seconds before the demo gives up (default 120)",
    )


def _demo_run(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, run_demo

    with user_input(f"--nproc {args.nproc} --steps {args.steps} --timeout {args.timeout}"):
        cfg = DemoConfig(nproc=args.nproc, steps=args.steps, timeout=args.timeout)
    try:
        import torch  # noqa: F401
    except ImportError:
        raise ArgError("the demo needs torch: pip install 'meshlayout[torch]'") from None
    return run_demo(cfg)


COMMANDS: dict[str, Command] = {
    "plan": Command(cli_plan.HELP, cli_plan.add_arguments, cli_plan.run, cli_plan.EPILOG),
    "mesh": Command(
        "a Mesh from the command line: slice, flatten, unflatten, groups, a rank's place",
        _mesh_arguments,
        _mesh_run,
        _MESH_EPILOG,
    ),
    "shard": Command(
        "a sharding: every rank's runs, local shape, offset; torch 2.13's disagreements",
        _shard_arguments,
        _shard_run,
        _SHARD_EPILOG,
    ),
    "reshard": Command(
        cli_reshard.HELP, cli_reshard.add_arguments, cli_reshard.run, cli_reshard.EPILOG
    ),
    "transfer": Command(
        cli_transfer.HELP, cli_transfer.add_arguments, cli_transfer.run, cli_transfer.EPILOG
    ),
    "demo": Command(
        "train a small TP + FSDP2 model on local gloo processes and check it",
        _demo_arguments,
        _demo_run,
        _DEMO_EPILOG,
    ),
    "checkpoint": Command(
        cli_checkpoint.HELP, cli_checkpoint.add_arguments, cli_checkpoint.run, cli_checkpoint.EPILOG
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
