"""``meshlayout reshard``: the exact plan moving a tensor between two parallel configurations.

A source and a destination (mesh, optional global ranks, placements or shard
order) of one tensor shape; prints the traffic matrix (abridged for many ranks),
totals, the busiest ranks, elements crossing hosts (``--ranks-per-host``) and the
comparison with "all-gather then slice". ``--format json`` gives the complete
plan; ``--svg``/``--html`` draw the heat map and the boxes each destination rank
receives (:mod:`meshlayout.render.reshard_svg`). User mistakes raise
:class:`~meshlayout.cli.args.ArgError` (exit 2, one line). See ``docs/reshard.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..render import Section, check_size, html_page, placement_text, ranks_text
from ..render._fmt import table
from ..render.reshard_svg import reshard_picture
from ..sharding import Partial, ReshardPlan, ShardingSpec, reshard_plan
from .args import (
    ArgError,
    add_world_argument,
    build_mesh,
    check_world_hosts,
    int_arg,
    parse_int_list,
    parse_placements,
    parse_shard_order,
    shown,
    spec_from_flags,
    user_input,
)
from .output import add_output, busiest_rows, json_text, too_large, write

__all__ = ["EPILOG", "HELP", "ITEMSIZE", "add_arguments", "reshard_report", "reshard_text", "run"]

HELP = "the exact plan moving a tensor between two parallel configurations"

EPILOG = """\
examples:
  meshlayout reshard --shape 8,6 --src-mesh dp=4 --src-placements "S(0)" \\
      --dst-mesh tp=2 --dst-ranks 2,3 --dst-placements "S(1)"
  meshlayout reshard --shape 13,8 --src-mesh dp=3,tp=2 --src-shard-order "0:tp,dp" \\
      --dst-mesh tp=3 --dst-placements "S(0)" --svg reshard.svg
  meshlayout reshard --shape 16384,4096 --src-mesh dp=4096 --src-placements "S(0)" \\
      --dst-mesh tp=8 --dst-placements "S(1)" --ranks-per-host 8 --dtype bfloat16
  meshlayout reshard --shape 8,8 --src-mesh rep=2,dp=4 --src-placements "R,S(0)" \\
      --dst-mesh tp=4 --dst-ranks 8:12 --dst-placements "S(1)" --format json

Each side: --X-mesh NAME=SIZE,... [--X-ranks START:STOP[:STEP] | R,R,...] and
--X-placements (one per mesh dim: S(d), SS(d,sf), R) and/or --X-shard-order
("0:tp,dp"), X being src or dst. Partial placements cannot be resharded.
Elements a destination rank already holds are local copies, never sent; among
replicas the sender is the destination itself, then a holder on its host, then
the least-loaded holder.
"""

#: Bytes per element of the ``--dtype`` names.
ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "float8": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
SCHEMA = "meshlayout.reshard/1"
_ROWS_HEAD, _ROWS_TAIL = 12, 2
_COLS_HEAD, _COLS_TAIL = 8, 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``meshlayout reshard``."""
    p.add_argument("--shape", required=True, help="global tensor shape, e.g. 8,6")
    for side, what in (("src", "source"), ("dst", "destination")):
        p.add_argument(
            f"--{side}-mesh", required=True, help=f"{what} mesh dims: NAME=SIZE,... (or SIZE,...)"
        )
        p.add_argument(f"--{side}-ranks", help=f"{what} global ranks: START:STOP[:STEP] or R,R,...")
        p.add_argument(
            f"--{side}-placements", help=f'{what} placements, one per mesh dim, e.g. "S(0)"'
        )
        p.add_argument(
            f"--{side}-shard-order", metavar="ORDER", help=f'{what} shard order, e.g. "0:tp,dp"'
        )
    p.add_argument(
        "--ranks-per-host",
        type=int_arg(minimum=1),
        metavar="N",
        help="ranks [k*N, (k+1)*N) form host k: prefer same-host senders, count cross-host traffic",
    )
    add_world_argument(p)
    p.add_argument("--dtype", choices=tuple(ITEMSIZE), help="also report bytes for this dtype")
    add_output(p)


@contextmanager
def _renamed(flag: str) -> Iterator[None]:
    """The shared parsers name ``--placements``/``--shard-order``; name this side's flag."""
    try:
        yield
    except ArgError as exc:
        text = str(exc)
        for generic in ("--placements", "--shard-order"):
            if text.startswith(generic):
                text = flag + text[len(generic) :]
                break
        raise ArgError(text) from None


def _side_spec(args: argparse.Namespace, side: str, shape: tuple[int, ...]) -> ShardingSpec:
    """One side's spec from its flags; every error names the flag and the value."""
    mesh_flag, ranks_flag = f"--{side}-mesh", f"--{side}-ranks"
    placements_text = getattr(args, f"{side}_placements")
    order_text = getattr(args, f"{side}_shard_order")
    pflag, oflag = f"--{side}-placements", f"--{side}-shard-order"
    if placements_text is None and order_text is None:
        raise ArgError(f"give {pflag}, {oflag}, or both")
    mesh = build_mesh(
        getattr(args, f"{side}_mesh"),
        getattr(args, f"{side}_ranks"),
        shape_flag=mesh_flag,
        ranks_flag=ranks_flag,
    )
    with too_large(f"{mesh_flag} {shown(getattr(args, f'{side}_mesh'))}"):
        check_size(len(mesh.rank_map), "a reshard plan looks at every rank")
    order = None
    if order_text is not None:
        with _renamed(oflag):
            order = (order_text, parse_shard_order(order_text))
    given = None
    if placements_text is not None:
        with _renamed(pflag):
            given = (placements_text, parse_placements(placements_text))
    return spec_from_flags(shape, mesh, given, order, flags=(pflag, oflag))


def _plan(args: argparse.Namespace) -> ReshardPlan:
    shape = parse_int_list(args.shape, "--shape", minimum=0)
    src = _side_spec(args, "src", shape)
    dst = _side_spec(args, "dst", shape)
    for side, spec in (("src", src), ("dst", dst)):
        partial = [p for p in spec.placements() if isinstance(p, Partial)]
        if partial:
            flag = f"--{side}-placements" if getattr(args, f"{side}_placements") else f"--{side}"
            raise ArgError(
                f"{flag}: {placement_text(partial[0])} is a pending reduction; "
                "reduce it to R or S(d) first, a Partial tensor cannot be resharded"
            )
    highest = max(int(np.max(spec.mesh.submeshes())) for spec in (src, dst))
    check_world_hosts(args, highest)
    with user_input("--shape/--src-*/--dst-*"):
        return reshard_plan(src, dst, ranks_per_host=args.ranks_per_host)


# ---------------------------------------------------------------------- report
def _side(spec: ShardingSpec, ranks: tuple[int, ...]) -> dict[str, Any]:
    mesh = spec.mesh
    return {
        "mesh": ",".join(f"{n}={s}" for n, s in zip(mesh.names, mesh.shape)),
        "names": list(mesh.names),
        "sizes": list(mesh.shape),
        "ranks": list(ranks),
        "placements": [placement_text(p) for p in spec.placements()],
        "shard_order": (
            {str(d): [mesh.names[m] for m in ms] for d, ms in spec.shard_order().items()}
            if spec.decodable
            else None
        ),
    }


def _pairs(plan: ReshardPlan) -> list[list[int]]:
    """``[src, dst, elements sent, elements kept]`` per pair with either, sorted."""
    c = plan.arrays()
    if not len(c["src"]):
        return []
    key = np.stack([c["src"], c["dst"]], axis=1)
    pairs, inverse = np.unique(key, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    local = c["src"] == c["dst"]
    sent = np.zeros(len(pairs), dtype=np.int64)
    kept = np.zeros(len(pairs), dtype=np.int64)
    np.add.at(sent, inverse[~local], c["numel"][~local])
    np.add.at(kept, inverse[local], c["numel"][local])
    return [[int(a), int(b), int(s), int(k)] for (a, b), s, k in zip(pairs.tolist(), sent, kept)]


def reshard_report(plan: ReshardPlan, *, dtype: str | None = None) -> dict[str, Any]:
    """The JSON report (``"schema": "meshlayout.reshard/1"``): specs, summary, pairs, transfers.

    ``transfers`` lists every transfer as ``[src, dst, [[start, stop], ...]]``, local
    copies included (``src == dst``); ``pairs`` aggregates them per (src, dst).

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Shard, ShardingSpec, reshard_plan
    >>> src = ShardingSpec((4,), Mesh({"dp": 2}), [Shard(0)])
    >>> rep = reshard_report(reshard_plan(src, ShardingSpec((4,), Mesh({"tp": 4}), [Shard(0)])))
    >>> rep["pairs"], rep["transfers"][1]
    ([[0, 0, 0, 1], [0, 1, 1, 0], [1, 2, 1, 0], [1, 3, 1, 0]], [0, 1, [[1, 2]]])
    """
    summary = plan.summary()
    itemsize = ITEMSIZE[dtype] if dtype is not None else None
    if itemsize is not None:
        for key in ("elements_moved", "max_send_elements", "max_recv_elements"):
            summary[key.replace("elements", "bytes")] = summary[key] * itemsize
        summary["allgather_bytes"] = summary["allgather_elements"] * itemsize
        if summary["across_host_elements"] is not None:
            summary["across_host_bytes"] = summary["across_host_elements"] * itemsize
    c = plan.arrays()
    boxes = np.stack([c["start"], c["stop"]], axis=2).tolist()
    return {
        "schema": SCHEMA,
        "shape": list(plan.src_spec.global_shape),
        "dtype": dtype,
        "itemsize": itemsize,
        "src": _side(plan.src_spec, plan.src_ranks),
        "dst": _side(plan.dst_spec, plan.dst_ranks),
        "summary": summary,
        "pairs": _pairs(plan),
        "transfers": [[s, d, b] for s, d, b in zip(c["src"].tolist(), c["dst"].tolist(), boxes)],
    }


def _abridged(ranks: tuple[int, ...], head: int, tail: int) -> list[int | None]:
    """The ranks shown as matrix rows or columns; None marks the cut."""
    if len(ranks) <= head + tail + 1:
        return list(ranks)
    return [*ranks[:head], None, *ranks[-tail:]]


def _matrix_rows(plan: ReshardPlan) -> list[list[str]]:
    rows = _abridged(plan.src_ranks, _ROWS_HEAD, _ROWS_TAIL)
    cols = _abridged(plan.dst_ranks, _COLS_HEAD, _COLS_TAIL)
    shown_rows = [r for r in rows if r is not None]
    shown_cols = [r for r in cols if r is not None]
    c = plan.arrays()
    keep = np.isin(c["src"], shown_rows) & np.isin(c["dst"], shown_cols)
    ri = {r: i for i, r in enumerate(shown_rows)}
    ci = {r: i for i, r in enumerate(shown_cols)}
    sent = np.zeros((len(shown_rows), len(shown_cols)), dtype=np.int64)
    kept = np.zeros_like(sent)
    for s, d, n in zip(c["src"][keep].tolist(), c["dst"][keep].tolist(), c["numel"][keep].tolist()):
        (kept if s == d else sent)[ri[s], ci[d]] += n
    out = [["src\\dst", *("..." if r is None else str(r) for r in cols)]]
    for r in rows:
        if r is None:
            out.append(["...", *("" for _ in cols)])
            continue
        line = [str(r)]
        for d in cols:
            if d is None:
                line.append("...")
                continue
            n, k = int(sent[ri[r], ci[d]]), int(kept[ri[r], ci[d]])
            line.append(f"[{k}]" if k and not n else (str(n) if n else "."))
        out.append(line)
    return out


def _amount(n: int | None, itemsize: int | None) -> str:
    """``n`` elements, with their bytes when the dtype is known: ``4096 (8.0 KiB)``."""
    if n is None:
        return "-"
    return f"{n}" + (f" ({_bytes(n * itemsize)})" if itemsize else "")


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def reshard_text(plan: ReshardPlan, *, dtype: str | None = None) -> str:
    """The plain-text report: both specs, the abridged matrix, totals, the comparison."""
    s = plan.summary()
    itemsize = ITEMSIZE[dtype] if dtype is not None else None
    lines = [f"reshard a {plan.src_spec.global_shape} tensor ({s['numel']} elements)"]
    for label, spec, ranks in (
        ("source", plan.src_spec, plan.src_ranks),
        ("destination", plan.dst_spec, plan.dst_ranks),
    ):
        side = _side(spec, ranks)
        placements = ", ".join(side["placements"])
        lines.append(f"  {label:<12} {side['mesh']} on ranks {ranks_text(ranks)}: {placements}")
    lines += [
        "",
        "elements sent (rows: source rank, columns: destination rank; "
        "[n]: n elements kept locally, not sent)",
    ]
    lines.append(table(_matrix_rows(plan), indent="  "))
    rows = [
        ["transfers", f"{s['transfers']} boxes sent, {s['local_copies']} local copies"],
        [
            "elements moved",
            f"{_amount(s['elements_moved'], itemsize)} (kept locally: "
            f"{s['local_copy_elements']}, delivered: {s['elements_delivered']})",
        ],
    ]
    rows += busiest_rows(s, "elements", lambda n: _amount(n, itemsize))
    ratio = f"{s['allgather_ratio']:.2f}x the plan" if s["allgather_ratio"] else "nothing moves"
    rows.append(
        [
            "all-gather then slice",
            f"{_amount(s['allgather_elements'], itemsize)} received, at most "
            f"{_amount(s['allgather_max_recv_elements'], itemsize)} per rank: {ratio}",
        ]
    )
    lines += ["", table(rows)]
    return "\n".join(lines)


# ---------------------------------------------------------------------- run
def run(args: argparse.Namespace) -> int:
    """``meshlayout reshard``: build the plan, print it, write the pictures asked for."""

    plan = _plan(args)
    text = reshard_text(plan, dtype=args.dtype)
    if args.svg or args.html:
        picture = reshard_picture(plan)
        if args.svg:
            write("--svg", args.svg, picture.to_string())
        if args.html:
            section = Section("reshard plan", text=text, pictures=[picture])
            title = f"meshlayout reshard: {plan.src_spec.global_shape}"
            write("--html", args.html, html_page(title, [section]))
    if args.format == "json":
        with too_large("--format json"):
            check_size(len(plan), "--format json lists every transfer", "transfers")
        print(json_text(reshard_report(plan, dtype=args.dtype)))
    else:
        print(text)
    return 0
