"""``meshlayout mesh``: the Mesh API from the command line (slice, flatten, unflatten, groups)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import render
from ..mesh import Mesh
from .args import (
    ArgError,
    build_mesh,
    int_arg,
    parse_flatten,
    parse_names,
    parse_unflatten,
    user_input,
)
from .output import add_output, emit, picture_flags, too_large, write

__all__ = ["EPILOG", "HELP", "add_arguments", "run"]

HELP = "a Mesh from the command line: slice, flatten, unflatten, groups, a rank's place"
_rank_arg = int_arg(minimum=0)

EPILOG = """\
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


def add_arguments(p: argparse.ArgumentParser) -> None:
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
    add_output(p)


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


def run(args: argparse.Namespace) -> int:
    mesh = build_mesh(args.shape, args.ranks)
    for op, arg in args.ops:
        mesh = _apply(mesh, op, arg)
    if args.rank is not None and args.rank not in mesh:
        raise ArgError(f"--rank {args.rank} is not in the mesh (ranks {mesh.rank_map!r})")
    view = mesh[mesh.ndim - 1]
    if args.view:
        with user_input("--view", args.view):
            view = mesh[parse_names(args.view, "--view")]
    with too_large("--format json"):
        report = render.mesh_report(
            mesh, operations=args.ops, rank=args.rank, complete=args.format == "json"
        )
    text = render.mesh_text(report)
    if args.svg or args.html:
        with too_large(picture_flags(args)):
            picture = render.mesh_picture(
                mesh, view, rank=args.rank, view_name=",".join(view.names), title=repr(mesh)
            )
        if args.svg:
            write("--svg", args.svg, picture.to_string())
        if args.html:
            page = render.html_page(
                f"meshlayout mesh: {mesh!r}",
                [render.Section("mesh", text=text, pictures=[picture])],
            )
            write("--html", args.html, page)
    emit(args, report, text)
    return 0
