"""The ``meshlayout`` command (layer 4): plan a job's meshes, inspect a mesh, a sharding.

Subcommands are registered in :data:`COMMANDS` as ``name -> Command(help,
add_arguments, run, epilog)``; adding one is adding an entry. Bad arguments give
one line on stderr and exit code 2, never a traceback. See ``docs/cli.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from . import render
from .cli_args import (
    ArgError,
    parse_flatten,
    parse_int_list,
    parse_named_sizes,
    parse_names,
    parse_placements,
    parse_ranks,
    parse_shard_order,
    parse_unflatten,
)
from .mesh import Mesh
from .parallel_dims import VIEWS, ParallelDims
from .sharding import ShardingSpec

__all__ = ["COMMANDS", "Command", "main"]

PROG = "meshlayout"


class UsageError(Exception):
    """A bad argument found after parsing; reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (``prog: error: message``) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


@dataclass(frozen=True)
class Command:
    """One subcommand: its one-line help, argument set-up, action and ``--help`` examples."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    epilog: str = ""


# ---------------------------------------------------------------------- shared options
def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _add_output(p: argparse.ArgumentParser, *, html: bool = True) -> None:
    p.add_argument(
        "--format", choices=("text", "json"), default="text", help="stdout format (default text)"
    )
    p.add_argument("--svg", metavar="FILE", help="also write an SVG picture to FILE")
    if html:
        p.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page")


def _write(path: str, content: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(content)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
    print(f"wrote {path} ({len(content.encode())} bytes)", file=sys.stderr)


def _emit(args: argparse.Namespace, report: dict[str, Any], text: str) -> None:
    if args.format == "json":
        print(json.dumps(report, indent=1))
    else:
        print(text)


# ---------------------------------------------------------------------- plan
_PLAN_EPILOG = """\
examples:
  meshlayout plan --world 64 --pp 2 --cp 2 --tp 4 --ep 4
  meshlayout plan --world 64 --pp 2 --cp 2 --tp 4 --ep 4 --ranks-per-host 8 --rank 13
  meshlayout plan --world 4096 --pp 4 --dp-replicate 2 --cp 2 --tp 8 --ep 8 --view tp,fsdp --svg plan.svg
  meshlayout plan --world 16 --dp-shard 4 --tp 4 --order tp,pp,dp_replicate,dp_shard,cp --format json
  meshlayout plan --world 64 --pp 2 --tp 8 --ep 8 --html plan.html

views: """ + ", ".join(VIEWS)


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--world", type=_positive, required=True, help="number of ranks")
    p.add_argument("--pp", type=_positive, default=1, help="pipeline stages")
    p.add_argument("--dp-replicate", type=_positive, default=1, help="HSDP replicas")
    p.add_argument("--dp-shard", type=int, default=-1, help="FSDP degree; -1 (default): inferred")
    p.add_argument("--cp", type=_positive, default=1, help="context parallel")
    p.add_argument("--tp", type=_positive, default=1, help="tensor parallel")
    p.add_argument("--ep", type=_positive, default=1, help="expert parallel")
    p.add_argument("--etp", type=_positive, default=1, help="expert tensor parallel")
    p.add_argument(
        "--order",
        help="placement of the dense dims in rank space, outermost first "
        "(default pp,dp_replicate,dp_shard,cp,tp: tp on consecutive ranks)",
    )
    p.add_argument(
        "--ranks-per-host",
        type=_positive,
        metavar="N",
        help="ranks [k*N, (k+1)*N) form host k; mark groups that cross hosts",
    )
    p.add_argument("--rank", type=int, help="show this rank's coordinate and group in every view")
    p.add_argument(
        "--view",
        action="append",
        metavar="VIEWS",
        help="only these views (comma-separated, repeatable); pictures draw them in order",
    )
    p.add_argument(
        "--all-groups", action="store_true", help="text: list every group (no abridging)"
    )
    _add_output(p)


def _plan_views(args: argparse.Namespace) -> list[str] | None:
    if not args.view:
        return None
    names = [n for v in args.view for n in parse_names(v, "--view")]
    for n in names:
        if n not in VIEWS:
            raise UsageError(f"unknown view {n!r}; valid views are {', '.join(VIEWS)}")
    return list(dict.fromkeys(names))


def _picture_views(pd: ParallelDims, chosen: list[str] | None) -> list[tuple[str, str]]:
    """(view, note) to draw: the chosen ones, or every view with groups > 1, deduplicated."""
    if chosen is not None:
        return [(v, "") for v in chosen]
    out: list[tuple[str, str]] = []
    seen: dict[bytes, str] = {}
    for name in VIEWS:
        mesh = pd.mesh(name)
        if mesh.size() == 1:
            continue
        groups = render.view_groups(mesh)
        key = groups.tobytes() + bytes(str(groups.shape), "ascii")
        if key in seen:
            continue
        seen[key] = name
        out.append((name, ""))
    for i, (name, _) in enumerate(out):
        same = [
            v
            for v in VIEWS
            if v != name
            and pd.mesh(v).size() > 1
            and v not in dict(out)
            and _same_groups(pd, v, name)
        ]
        if same:
            out[i] = (name, f" (same groups: {', '.join(same)})")
    return out


def _same_groups(pd: ParallelDims, a: str, b: str) -> bool:
    ga, gb = render.view_groups(pd.mesh(a)), render.view_groups(pd.mesh(b))
    return bool(ga.shape == gb.shape and (ga == gb).all())


def _plan_pictures(
    pd: ParallelDims, args: argparse.Namespace, chosen: list[str] | None
) -> list[render.Svg]:
    return [
        render.mesh_picture(
            pd.dense,
            pd.mesh(name),
            rank=args.rank,
            view_name=name,
            ranks_per_host=args.ranks_per_host,
            title=f"{name}{note}: {VIEWS[name]}",
        )
        for name, note in _picture_views(pd, chosen)
    ]


def _plan_run(args: argparse.Namespace) -> int:
    if args.dp_shard < 1 and args.dp_shard != -1:
        raise UsageError(f"--dp-shard must be >= 1 or -1 (inferred), got {args.dp_shard}")
    pd = ParallelDims(
        args.world,
        pp=args.pp,
        dp_replicate=args.dp_replicate,
        dp_shard=args.dp_shard,
        cp=args.cp,
        tp=args.tp,
        ep=args.ep,
        etp=args.etp,
        order=args.order,
    )
    if args.rank is not None and args.rank not in pd.rank_map:
        raise UsageError(f"--rank {args.rank} is outside the world of {args.world} ranks")
    chosen = _plan_views(args)
    report = render.plan_report(
        pd, views=chosen, rank=args.rank, ranks_per_host=args.ranks_per_host
    )
    text = render.plan_text(report, all_groups=args.all_groups)
    _emit(args, report, text)
    if args.svg or args.html:
        pictures = _plan_pictures(pd, args, chosen)
        if args.svg:
            _write(args.svg, render.stack(pictures).to_string())
        if args.html:
            sections = [render.Section("plan", text=text)]
            sections += [render.Section(p_title(p), pictures=[p]) for p in pictures]
            _write(args.html, render.html_page(f"meshlayout plan: {pd!r}", sections))
    return 0


def p_title(picture: render.Svg) -> str:
    """The bold title text of a picture (its first text element)."""
    for part in picture.parts:
        if part.startswith("<text"):
            return part.split(">", 1)[1].rsplit("<", 1)[0].split(":", 1)[0]
    return ""


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
    p.add_argument("--rank", type=int, help="this rank's coordinate, groups and sub-mesh")
    p.add_argument(
        "--view",
        metavar="DIMS",
        help="pictures: colour the groups along these dims (default: the last dim)",
    )
    p.set_defaults(ops=[])
    _add_output(p)


def _build_mesh(shape_text: str, ranks_text: str | None) -> Mesh:
    sizes, names = parse_named_sizes(shape_text)
    ranks = None if ranks_text is None else parse_ranks(ranks_text)
    return Mesh(sizes, names, ranks=ranks)


def _apply(mesh: Mesh, op: str, arg: str) -> Mesh:
    if op == "slice":
        return mesh[parse_names(arg, "--slice")]
    if op == "flatten":
        dims, name = parse_flatten(arg)
        if dims is None:
            return mesh.flatten(name)
        for d in dims:
            mesh.dim_index(d)
        parts = []
        for n in mesh.names:
            if n == dims[0]:
                parts.append(mesh[dims].flatten(name))
            elif n not in dims:
                parts.append(mesh[n])
        return Mesh.concat(parts)
    dim, sizes, names = parse_unflatten(arg)
    return mesh.unflatten(dim, sizes, names)


def _mesh_run(args: argparse.Namespace) -> int:
    mesh = _build_mesh(args.shape, args.ranks)
    for op, arg in args.ops:
        mesh = _apply(mesh, op, arg)
    if args.rank is not None and args.rank not in mesh:
        raise UsageError(f"--rank {args.rank} is not in the mesh (ranks {mesh.rank_map!r})")
    view = mesh[parse_names(args.view, "--view")] if args.view else mesh[mesh.ndim - 1]
    report = render.mesh_report(mesh, operations=args.ops, rank=args.rank)
    text = render.mesh_text(report)
    _emit(args, report, text)
    if args.svg or args.html:
        picture = render.mesh_picture(
            mesh, view, rank=args.rank, view_name=",".join(view.names), title=repr(mesh)
        )
        if args.svg:
            _write(args.svg, picture.to_string())
        if args.html:
            page = render.html_page(
                f"meshlayout mesh: {mesh!r}",
                [render.Section("mesh", text=text, pictures=[picture])],
            )
            _write(args.html, page)
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


def _shard_run(args: argparse.Namespace) -> int:
    if args.placements is None and args.shard_order is None:
        raise UsageError("give --placements, --shard-order, or both")
    shape = parse_int_list(args.shape, "--shape")
    mesh = _build_mesh(args.mesh, args.ranks)
    given = None if args.placements is None else parse_placements(args.placements)
    order = None if args.shard_order is None else parse_shard_order(args.shard_order)
    if given is not None:
        spec = ShardingSpec(shape, mesh, given)
        if order is not None:
            wanted = ShardingSpec.from_shard_order(shape, mesh, order)
            if not spec.decodable or spec.shard_order() != wanted.shard_order():
                have = spec.shard_order() if spec.decodable else "none (not decodable)"
                raise UsageError(
                    f"--placements decode to shard order {have}, but --shard-order "
                    f"says {wanted.shard_order()}"
                )
    else:
        assert order is not None
        spec = ShardingSpec.from_shard_order(shape, mesh, order)
    report = render.shard_report(spec, given=given)
    _emit(args, report, render.shard_text(report))
    if args.svg or args.html:
        pictures = [render.sharding_picture(spec)]
        if report["torch_disagrees"]:
            pictures.append(render.sharding_picture(spec, torch_view=True))
        if args.svg:
            _write(args.svg, render.stack(pictures).to_string())
        if args.html:
            section = render.Section(
                "sharding",
                notes=report["notes"],
                text=render.shard_text(report),
                pictures=pictures,
            )
            _write(args.html, render.html_page(f"meshlayout shard: {spec!r}", [section]))
    return 0


# ---------------------------------------------------------------------- demo
_DEMO_EPILOG = """\
examples:
  meshlayout demo                      # 4 gloo processes, 20 steps
  meshlayout demo --nproc 4 --steps 3  # the quick version CI runs
  meshlayout demo --nproc 8            # dp_shard=4 x tp=2

Plans the meshes with ParallelDims, starts local CPU processes (gloo on
127.0.0.1), binds the meshes to process groups with ParallelDims.build("cpu"),
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

    try:
        cfg = DemoConfig(nproc=args.nproc, steps=args.steps, timeout=args.timeout)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    try:
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("the demo needs torch: pip install 'meshlayout[torch]'") from None
    return run_demo(cfg)


COMMANDS: dict[str, Command] = {
    "plan": Command(
        "every view of a ParallelDims job: shapes, groups, hosts, one rank's place",
        _plan_arguments,
        _plan_run,
        _PLAN_EPILOG,
    ),
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
    "demo": Command(
        "train a small TP + FSDP2 model on local gloo processes and check it",
        _demo_arguments,
        _demo_run,
        _DEMO_EPILOG,
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
    except (UsageError, ArgError, ValueError, KeyError, TypeError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        first = str(message).strip().splitlines()[0] if str(message).strip() else type(exc).__name__
        print(f"{PROG} {args.command}: error: {first}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `meshlayout plan ... | head`
        return 0
    return code


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
