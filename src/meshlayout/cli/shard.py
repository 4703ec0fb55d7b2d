"""``meshlayout shard``: which rank holds which part of a tensor, and where torch disagrees."""

from __future__ import annotations

import argparse

from .. import render
from ..sharding import Placement, ShardingSpec
from .args import (
    ArgError,
    build_mesh,
    parse_int_list,
    parse_placements,
    parse_shard_order,
    shown,
    spec_from_flags,
)
from .output import add_output, emit, picture_flags, too_large, write

__all__ = ["EPILOG", "HELP", "add_arguments", "run"]

HELP = "a sharding: every rank's runs, local shape, offset; torch 2.13's disagreements"

EPILOG = """\
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shape", required=True, help="global tensor shape, e.g. 7,4")
    p.add_argument("--mesh", required=True, help="mesh dims: NAME=SIZE,... (or SIZE,...)")
    p.add_argument("--ranks", help="global ranks of the mesh: START:STOP[:STEP] or R,R,...")
    p.add_argument("--placements", help='one per mesh dim, e.g. "SS(0,2),S(0)"')
    p.add_argument("--shard-order", metavar="ORDER", help='e.g. "0:tp,dp;1:cp"')
    add_output(p)


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


def run(args: argparse.Namespace) -> int:
    spec, given = _shard_spec(args)
    with too_large(f"--shape {shown(args.shape)} --mesh {shown(args.mesh)}"):
        report = render.shard_report(spec, given=given)
    text = render.shard_text(report)
    if args.svg or args.html:
        with too_large(picture_flags(args)):
            pictures = [render.sharding_picture(spec)]
            if report["torch_disagrees"]:
                pictures.append(render.sharding_picture(spec, torch_view=True))
        if args.svg:
            write("--svg", args.svg, render.stack(pictures).to_string())
        if args.html:
            section = render.Section(
                "sharding", notes=report["notes"], text=text, pictures=pictures
            )
            write("--html", args.html, render.html_page(f"meshlayout shard: {spec!r}", [section]))
    emit(args, report, text)
    return 0
