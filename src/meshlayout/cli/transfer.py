"""``meshlayout transfer``: plan moving a whole model between two parallel layouts, before launch.

The model's tensors come from what users have, headers only
(:mod:`meshlayout.cli.model_tensors`: safetensors, a DCP checkpoint, a JSON list);
each side is a mesh on global ranks plus placement rules by name pattern
(:mod:`meshlayout.cli.rules`). The plan is :func:`meshlayout.sharding.transfer_plan`
(``docs/transfer.md``), the one ``meshlayout.torch.WeightTransfer`` runs. Printed: bytes
moved against gather-then-broadcast, rounds for the ``--bucket`` size against their
lower bound, the busiest ranks, bytes across hosts, the byte matrix, the largest
tensors; ``--format json`` the whole report (``docs/cli.md``), ``--svg``/``--html``
the rank-to-rank byte matrix (:mod:`meshlayout.render.transfer_svg`). User mistakes
raise :class:`~meshlayout.cli.args.ArgError` (exit 2, one line).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..mesh import Mesh
from ..render import (
    LIST_LIMIT,
    Section,
    check_size,
    html_page,
    placement_text,
    ranks_text,
)
from ..render._fmt import table
from ..render.transfer_svg import byte_text, transfer_picture
from ..sharding import ShardingSpec
from .args import (
    ArgError,
    add_world_argument,
    build_mesh,
    check_world_hosts,
    int_arg,
    one_line,
    parse_size,
    shown,
    user_input,
)
from .model_tensors import DTYPES, TensorInfo, dtype_name, read_tensors
from .output import add_output, busiest_rows, emit, too_large, write
from .rules import Layout, layout_model, parse_rules

__all__ = ["EPILOG", "HELP", "SCHEMA", "add_arguments", "run", "transfer_report", "transfer_text"]

HELP = "plan moving a whole model between two layouts: bytes, rounds, hosts, vs gather-broadcast"

EPILOG = """\
examples:
  meshlayout transfer --src-mesh dp=8 --src-default "S(0)" \\
      --dst-mesh tp=8 --dst-ranks 8:16 --dst-rules "*proj.weight: S(0)" model/
  meshlayout transfer --src-mesh dp=2,tp=2 --src-ranks 0:4 --src-default "S(0),R" \\
      --src-rules "*.q_proj.weight,*.gate_proj.weight: SS(0,2),S(0); *.o_proj.weight: S(0),S(1)" \\
      --dst-mesh tp=2 --dst-ranks 4:6 \\
      --dst-rules "*.q_proj.weight,*.gate_proj.weight: S(0); *.o_proj.weight: S(1)" \\
      --dst-dtype bf16 --ranks-per-host 4 model.safetensors.index.json
  meshlayout transfer --src-mesh dp=4 --src-default "S(0)" --dst-mesh dp=2 \\
      --dst-default "S(0)" --bucket 1GiB --format json --svg transfer.svg ckpt/step-100

MODEL: a .safetensors file, a directory of them (with or without
model.safetensors.index.json), a DCP checkpoint directory (.metadata; needs torch),
or a JSON list [{"name": ..., "shape": [...], "dtype": "bfloat16"}, ...] (or an
object name -> {"shape", "dtype"}). Only headers are read.

rules (--src-rules / --dst-rules, repeatable):
  RULES := PATTERNS: PLACEMENTS [; PATTERNS: PLACEMENTS ...]
  PATTERNS: fnmatch patterns separated by ',' (case-sensitive); PLACEMENTS: one per
  mesh dim, S(d), SS(d,sf), R. A tensor takes the first matching rule, else
  --X-default (default: R on every mesh dim). A placement that does not fit a
  tensor (S(1) on a 1-D bias) is an error naming the tensor and the rule, and so
  is a rule that takes no tensor (a pattern typo such as *_prj.weight, or a rule
  shadowed by an earlier one): --allow-unmatched-rules turns that into a note.
--bucket: bytes each rank may send (and receive) per round: 4096, 256MiB, 1GiB,
  2GB (default 256MiB). --dst-dtype: the dtype on the wire and at the destination
  (default: each tensor's stored dtype).
"""

SCHEMA = "meshlayout.transfer/1"
DEFAULT_BUCKET = "256MiB"
_ROWS_HEAD, _ROWS_TAIL = 12, 2
_COLS_HEAD, _COLS_TAIL = 8, 2


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of ``meshlayout transfer``."""
    p.add_argument(
        "model",
        metavar="MODEL",
        help="safetensors file or directory, DCP checkpoint directory, or JSON tensor list",
    )
    for side, what in (("src", "source"), ("dst", "destination")):
        p.add_argument(
            f"--{side}-mesh", required=True, help=f"{what} mesh dims: NAME=SIZE,... (or SIZE,...)"
        )
        p.add_argument(f"--{side}-ranks", help=f"{what} global ranks: START:STOP[:STEP] or R,R,...")
        p.add_argument(
            f"--{side}-rules",
            action="append",
            metavar="RULES",
            help=f'{what} placements by name: "PATTERN,...: PLACEMENTS; ..." (repeatable)',
        )
        p.add_argument(
            f"--{side}-default",
            metavar="PLACEMENTS",
            help=f"{what} placements of tensors no rule matches (default: R on every dim)",
        )
    p.add_argument(
        "--allow-unmatched-rules",
        action="store_true",
        help="accept rules that take no tensor (default: an error naming the rule)",
    )
    p.add_argument(
        "--dst-dtype", metavar="DTYPE", help="dtype on the wire and at the destination, e.g. bf16"
    )
    p.add_argument(
        "--bucket",
        default=DEFAULT_BUCKET,
        metavar="SIZE",
        help=f"bytes per rank per round, each way (default {DEFAULT_BUCKET})",
    )
    p.add_argument(
        "--ranks-per-host",
        type=int_arg(minimum=1),
        metavar="N",
        help="ranks [k*N, (k+1)*N) form host k: prefer same-host senders, count cross-host bytes",
    )
    add_world_argument(p)
    p.add_argument(
        "--largest",
        type=int_arg(minimum=0, maximum=10**6),
        default=5,
        metavar="N",
        help="list the N largest tensors (default 5)",
    )
    add_output(p)


# ---------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Side:
    """One side of the transfer: its mesh, global ranks (sorted), and every tensor's spec."""

    mesh: Mesh
    ranks: tuple[int, ...]
    layout: Layout


@dataclass(frozen=True)
class TransferInputs:
    """Everything the plan and the report are made from."""

    model: str
    kind: str
    tensors: tuple[TensorInfo, ...]
    src: Side
    dst: Side
    wire_dtype: str | None
    bucket_bytes: int
    bucket_text: str
    ranks_per_host: int | None

    def itemsize(self, t: TensorInfo) -> int:
        """Bytes per element of ``t`` on the wire (the destination dtype's)."""
        return DTYPES[self.wire_dtype or t.dtype]


def _read_model(path: str) -> tuple[str, tuple[TensorInfo, ...]]:
    """The model's tensors; a missing or unreadable file is a one-line error naming it."""
    try:
        return read_tensors(path)
    except OSError as exc:
        if not exc.strerror:  # ours: the message names the path
            raise ArgError(f"MODEL: {one_line(str(exc))}") from None
        where = exc.filename if exc.filename is not None else path
        raise ArgError(f"MODEL: {shown(str(where))}: cannot read: {exc.strerror}") from None
    except ValueError as exc:
        raise ArgError(f"MODEL: {one_line(str(exc).strip().splitlines()[0])}") from None


def _side(args: argparse.Namespace, tensors: Sequence[TensorInfo], side: str) -> Side:
    mesh_flag, ranks_flag = f"--{side}-mesh", f"--{side}-ranks"
    mesh = build_mesh(
        getattr(args, f"{side}_mesh"),
        getattr(args, f"{side}_ranks"),
        shape_flag=mesh_flag,
        ranks_flag=ranks_flag,
    )
    with too_large(f"{mesh_flag} {shown(getattr(args, f'{side}_mesh'))}"):
        check_size(len(mesh.rank_map), "a transfer plan looks at every rank")
    rules = parse_rules(getattr(args, f"{side}_rules") or [], f"--{side}-rules")
    layout = layout_model(
        tensors,
        mesh,
        rules,
        getattr(args, f"{side}_default"),
        flags=(f"--{side}-rules", f"--{side}-default", mesh_flag),
    )
    return Side(mesh, tuple(sorted(int(r) for r in mesh.rank_map)), layout)


def transfer_inputs(args: argparse.Namespace) -> TransferInputs:
    """Parse every flag (one-line :class:`ArgError` naming the flag on any mistake)."""
    bucket = parse_size(args.bucket, "--bucket")
    wire = None
    if args.dst_dtype is not None:
        with user_input("--dst-dtype", args.dst_dtype):
            wire = dtype_name(args.dst_dtype)
    kind, tensors = _read_model(args.model)
    src = _side(args, tensors, "src")
    dst = _side(args, tensors, "dst")
    check_world_hosts(args, max(src.ranks[-1], dst.ranks[-1]))
    if not args.allow_unmatched_rules:
        for side, layout in (("src", src.layout), ("dst", dst.layout)):
            for i in layout.unused_rules():
                raise ArgError(
                    f"--{side}-rules {shown(layout.rules[i].text)}: rule {i + 1} takes no "
                    f"tensor: {layout.why_unused(i)}; fix the pattern or the order, or pass "
                    "--allow-unmatched-rules"
                )
    return TransferInputs(
        args.model, kind, tensors, src, dst, wire, bucket, args.bucket, args.ranks_per_host
    )


def build_plan(inputs: TransferInputs) -> Any:
    """:func:`meshlayout.sharding.transfer_plan` of the inputs."""
    from ..sharding import transfer_plan

    itemsizes = {t.name: inputs.itemsize(t) for t in inputs.tensors}
    widest = max(inputs.tensors, key=inputs.itemsize)
    if inputs.bucket_bytes < itemsizes[widest.name]:
        raise ArgError(
            f"--bucket {shown(inputs.bucket_text)}: smaller than one element of "
            f"{widest.name!r} ({inputs.wire_dtype or widest.dtype}, {itemsizes[widest.name]} "
            "bytes); a bucket holds at least one element"
        )
    delivered = 0  # bytes of every destination piece: the plan sends at most this
    held: dict[ShardingSpec, int] = {}  # tensors of one shape and rule share a spec
    for t in inputs.tensors:
        spec = inputs.dst.layout.specs[t.name]
        if spec not in held:
            held[spec] = sum(math.prod(spec.local_shape(r)) for r in inputs.dst.ranks)
        delivered += held[spec] * itemsizes[t.name]
    slabs = -(-delivered // inputs.bucket_bytes)
    if slabs > LIST_LIMIT:
        raise ArgError(
            f"--bucket {shown(inputs.bucket_text)}: the destination pieces hold {delivered} "
            f"bytes, up to {slabs} bucket-sized slabs, more than {LIST_LIMIT} "
            "(meshlayout.render.LIST_LIMIT); choose a larger --bucket"
        )
    with user_input("MODEL/--src-*/--dst-*/--bucket"):
        return transfer_plan(
            dict(inputs.src.layout.specs),
            dict(inputs.dst.layout.specs),
            itemsizes,
            bucket_bytes=inputs.bucket_bytes,
            ranks_per_host=inputs.ranks_per_host,
        )


# ---------------------------------------------------------------------- the numbers
#: The plan's summary keys the report keeps (``TransferPlan.summary``; docs/cli.md).
PLAN_KEYS = (
    "bytes_moved",
    "local_copy_bytes",
    "bytes_delivered",
    "transfers",
    "bucket_bytes",
    "rounds",
    "rounds_lower_bound",
    "max_round_send_bytes",
    "max_round_recv_bytes",
    "max_send_bytes",
    "max_send_rank",
    "max_recv_bytes",
    "max_recv_rank",
    "ranks_per_host",
    "across_host_bytes",
    "gather_broadcast_bytes",
    "gather_broadcast_ratio",
)


@dataclass(frozen=True)
class _Sent:
    """The plan's sent pieces as int64 columns: round, tensor (index into the model), src,
    dst, bytes; ``kept``: ``[rank, bytes]`` destination ranks keep (local copies)."""

    round: Any
    tensor: Any
    src: Any
    dst: Any
    nbytes: Any
    kept: list[list[int]]

    @classmethod
    def of(cls, plan: Any, inputs: TransferInputs) -> _Sent:
        ours = {t.name: i for i, t in enumerate(inputs.tensors)}
        to_ours = np.array([ours[n] for n in plan.names], dtype=np.int64)
        a = plan.arrays()
        local = plan.local_arrays()
        itemsize = np.array([inputs.itemsize(inputs.tensors[i]) for i in to_ours], dtype=np.int64)
        local_bytes = np.prod(local["stop"] - local["start"], axis=1) * itemsize[local["tid"]]
        ranks, inverse = np.unique(local["rank"], return_inverse=True)
        per_rank = np.zeros(len(ranks), dtype=np.int64)
        np.add.at(per_rank, inverse.reshape(-1), local_bytes)
        kept = [[int(r), int(n)] for r, n in zip(ranks.tolist(), per_rank.tolist()) if n]
        tensor = to_ours[a["tid"]] if len(a["tid"]) else np.zeros(0, dtype=np.int64)
        return cls(a["round"], tensor, a["src"], a["dst"], a["nbytes"], kept)


def _group_sums(keys: Any, amounts: Any) -> tuple[Any, Any]:
    """(distinct keys, int64 sum of ``amounts`` per key) for a 1-D int64 ``keys``."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    totals = np.zeros(len(distinct), dtype=np.int64)
    np.add.at(totals, inverse.reshape(-1), amounts)
    return distinct, totals


def _round_rank_max(rounds: int, c: _Sent, ranks: Any) -> Any:
    """Per round, the most bytes one rank (of ``ranks``: each piece's src or dst) moves."""
    out = np.zeros(rounds, dtype=np.int64)
    if not len(ranks):
        return out
    distinct, position = np.unique(ranks, return_inverse=True)
    keys, totals = _group_sums(c.round * len(distinct) + position.reshape(-1), c.nbytes)
    np.maximum.at(out, keys // len(distinct), totals)
    return out


def _rounds(plan: Any, c: _Sent) -> list[list[int]]:
    """Per round: ``[pieces, bytes, most one rank sends, most one rank receives]``."""
    n = len(plan.rounds)
    pieces = np.bincount(c.round, minlength=n) if len(c.round) else np.zeros(n, dtype=np.int64)
    nbytes = np.zeros(n, dtype=np.int64)
    np.add.at(nbytes, c.round, c.nbytes)
    send, recv = _round_rank_max(n, c, c.src), _round_rank_max(n, c, c.dst)
    return np.stack([pieces, nbytes, send, recv], axis=1).astype(np.int64).tolist()  # type: ignore[no-any-return]


def _pairs(c: _Sent) -> list[list[int]]:
    """``[src, dst, bytes]`` per pair that sends anything, sorted."""
    if not len(c.src):
        return []
    srcs, src_pos = np.unique(c.src, return_inverse=True)
    dsts, dst_pos = np.unique(c.dst, return_inverse=True)
    keys, totals = _group_sums(src_pos.reshape(-1) * len(dsts) + dst_pos.reshape(-1), c.nbytes)
    a, b = srcs[keys // len(dsts)].tolist(), dsts[keys % len(dsts)].tolist()
    return [[s, d, n] for s, d, n in zip(a, b, totals.tolist())]


def _summary(inputs: TransferInputs, plan: Any) -> dict[str, Any]:
    """The model's totals, then the plan's (:data:`PLAN_KEYS`)."""
    plan_summary = plan.summary()
    return {
        "tensors": len(inputs.tensors),
        "elements": sum(t.numel for t in inputs.tensors),
        "bytes": sum(t.numel * inputs.itemsize(t) for t in inputs.tensors),
        "stored_bytes": sum(t.nbytes for t in inputs.tensors),
        **{k: plan_summary[k] for k in PLAN_KEYS},
    }


def _side_report(side: Side, label: str) -> dict[str, Any]:
    mesh, layout = side.mesh, side.layout
    counts = [0] * (len(layout.rules) + 1)
    for i in layout.rule_of.values():
        counts[-1 if i is None else i] += 1
    return {
        "mesh": ",".join(f"{n}={s}" for n, s in zip(mesh.names, mesh.shape)),
        "names": list(mesh.names),
        "sizes": list(mesh.shape),
        "ranks": [int(r) for r in mesh.rank_map],
        "rules": [
            {
                "patterns": list(r.patterns),
                "placements": [placement_text(p) for p in r.placements],
                "tensors": n,
            }
            for r, n in zip(layout.rules, counts)
        ],
        "default": [placement_text(p) for p in layout.default],
        "default_tensors": counts[-1],
        "label": label,
    }


def _tensor_rows(inputs: TransferInputs, c: _Sent) -> list[dict[str, Any]]:
    moved = np.zeros(len(inputs.tensors), dtype=np.int64)
    np.add.at(moved, c.tensor, c.nbytes)
    out = []
    for i, t in enumerate(inputs.tensors):
        src_spec, dst_spec = inputs.src.layout.specs[t.name], inputs.dst.layout.specs[t.name]
        out.append(
            {
                "name": t.name,
                "shape": list(t.shape),
                "dtype": t.dtype,
                "wire_dtype": inputs.wire_dtype or t.dtype,
                "bytes": t.numel * inputs.itemsize(t),
                "bytes_moved": int(moved[i]),
                "src_placements": [placement_text(p) for p in src_spec.placements()],
                "dst_placements": [placement_text(p) for p in dst_spec.placements()],
                "src_rule": inputs.src.layout.rule_of[t.name],
                "dst_rule": inputs.dst.layout.rule_of[t.name],
            }
        )
    return out


def _notes(inputs: TransferInputs) -> list[str]:
    notes = []
    for flag, side in (("--src-rules", inputs.src), ("--dst-rules", inputs.dst)):
        for i in side.layout.unused_rules():
            rule = side.layout.rules[i]
            notes.append(
                f"{flag} rule {i + 1} ({rule.text}) takes no tensor: {side.layout.why_unused(i)}"
            )
    return notes


def _shown(ranks: Sequence[int], head: int, tail: int) -> list[int]:
    """The ranks the text matrix shows along one axis."""
    return [r for r in _abridged(ranks, head, tail) if r is not None]


def transfer_report(inputs: TransferInputs, plan: Any, *, complete: bool = True) -> dict[str, Any]:
    """The JSON report (``"schema": "meshlayout.transfer/1"``, keys in ``docs/cli.md``).

    ``complete=False`` is what the text is made from: ``pairs`` only between the
    ranks the abridged matrix shows, ``rounds`` None, so any world size stays small.
    """
    c = _Sent.of(plan, inputs)
    pairs_of = c
    if not complete:
        rows = _shown(inputs.src.ranks, _ROWS_HEAD, _ROWS_TAIL)
        cols = _shown(inputs.dst.ranks, _COLS_HEAD, _COLS_TAIL)
        keep = np.isin(c.src, rows) & np.isin(c.dst, cols)
        pairs_of = _Sent(
            c.round[keep], c.tensor[keep], c.src[keep], c.dst[keep], c.nbytes[keep], c.kept
        )
    return {
        "schema": SCHEMA,
        "model": {"path": inputs.model, "kind": inputs.kind},
        "src": _side_report(inputs.src, "source"),
        "dst": _side_report(inputs.dst, "destination"),
        "wire_dtype": inputs.wire_dtype,
        "summary": _summary(inputs, plan),
        "rounds": _rounds(plan, c) if complete else None,
        "pairs": _pairs(pairs_of),
        "kept": c.kept,
        "tensors": _tensor_rows(inputs, c),
        "notes": _notes(inputs),
    }


# ---------------------------------------------------------------------- text
def _abridged(ranks: Sequence[int], head: int, tail: int) -> list[int | None]:
    if len(ranks) <= head + tail + 1:
        return list(ranks)
    return [*ranks[:head], None, *ranks[-tail:]]


def _matrix_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = _abridged(sorted(set(report["src"]["ranks"])), _ROWS_HEAD, _ROWS_TAIL)
    cols = _abridged(sorted(set(report["dst"]["ranks"])), _COLS_HEAD, _COLS_TAIL)
    sent = {(s, d): byte_text(n) for s, d, n in report["pairs"]}
    sent.update({(r, r): f"[{byte_text(n)}]" for r, n in report["kept"]})
    out = [["src\\dst", *("..." if d is None else str(d) for d in cols)]]
    for r in rows:
        if r is None:
            out.append(["...", *("" for _ in cols)])
            continue
        line = [str(r)]
        line += ["..." if d is None else sent.get((r, d), ".") for d in cols]
        out.append(line)
    return out


def _count(n: int, word: str) -> str:
    """``1 tensor``, ``3 tensors``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _side_lines(side: dict[str, Any]) -> list[str]:
    lines = [f"  {side['label']:<12} {side['mesh']} on ranks {ranks_text(side['ranks'])}"]
    for i, rule in enumerate(side["rules"]):
        placements, took = ",".join(rule["placements"]), _count(rule["tensors"], "tensor")
        lines.append(f"    rule {i + 1}: {','.join(rule['patterns'])}: {placements}  ({took})")
    lines.append(
        f"    default: {','.join(side['default'])}  ({_count(side['default_tensors'], 'tensor')})"
    )
    return lines


def _largest(report: dict[str, Any], n: int) -> list[str]:
    tensors = sorted(report["tensors"], key=lambda t: (-t["bytes"], t["name"]))[:n]
    if not tensors:
        return []
    total = report["summary"]["bytes"] or 1
    rows = [["tensor", "shape", "bytes", "share", "moved", "source", "destination"]]
    for t in tensors:
        rows.append(
            [
                t["name"],
                "x".join(map(str, t["shape"])) or "()",
                byte_text(t["bytes"]),
                f"{100 * t['bytes'] / total:.1f}%",
                byte_text(t["bytes_moved"]),
                ",".join(t["src_placements"]),
                ",".join(t["dst_placements"]),
            ]
        )
    share = sum(t["bytes"] for t in tensors) / total
    head = f"largest tensors ({len(tensors)} of {len(report['tensors'])}: {100 * share:.1f}% of the bytes)"
    return ["", head, table(rows, indent="  ")]


def transfer_text(report: dict[str, Any], *, largest: int = 5) -> str:
    """The plain-text report of :func:`transfer_report`."""
    s = report["summary"]
    dtypes = sorted({t["dtype"] for t in report["tensors"]})
    wire = report["wire_dtype"]
    as_what = (
        f"as {wire} (stored {', '.join(dtypes)})" if wire else f"as stored ({', '.join(dtypes)})"
    )
    lines = [
        f"transfer {_count(s['tensors'], 'tensor')}, {_count(s['elements'], 'element')}: "
        f"{byte_text(s['bytes'])} "
        f"{as_what}, from {report['model']['kind']} {report['model']['path']}",
        *_side_lines(report["src"]),
        *_side_lines(report["dst"]),
    ]
    ratio = s["gather_broadcast_ratio"]
    compare = f"{ratio:.2f}x the plan" if ratio else "the plan moves nothing"
    rows = [
        [
            "bytes moved",
            f"{byte_text(s['bytes_moved'])} in {_count(s['transfers'], 'piece')} "
            f"(kept locally: {byte_text(s['local_copy_bytes'])})",
        ],
        ["gather + broadcast", f"{byte_text(s['gather_broadcast_bytes'])}: {compare}"],
        [
            "rounds",
            f"{s['rounds']} of at most {byte_text(s['bucket_bytes'])} per rank each way "
            f"(lower bound {s['rounds_lower_bound']}; fullest: sends "
            f"{byte_text(s['max_round_send_bytes'])}, receives {byte_text(s['max_round_recv_bytes'])})",
        ],
    ]
    rows += busiest_rows(s, "bytes", byte_text)
    lines += ["", table(rows)]
    lines += [
        "",
        "bytes sent (rows: source rank, columns: destination rank; [n]: kept locally, not sent)",
    ]
    lines.append(table(_matrix_rows(report), indent="  "))
    lines += _largest(report, largest)
    lines += [f"note: {n}" for n in report["notes"]]
    return "\n".join(lines)


# ---------------------------------------------------------------------- run
def _picture(report: dict[str, Any], inputs: TransferInputs, plan: Any) -> Any:
    """The byte matrix of every piece sent, and what ranks keep (outlined)."""
    s = report["summary"]
    a = plan.arrays()
    kept = np.array(report["kept"], dtype=np.int64).reshape(-1, 2)
    src = np.concatenate([a["src"], kept[:, 0]])
    dst = np.concatenate([a["dst"], kept[:, 0]])
    nbytes = np.concatenate([a["nbytes"], kept[:, 1]])
    ratio = s["gather_broadcast_ratio"]
    totals = [
        f"{byte_text(s['bytes_moved'])} moved in {_count(s['rounds'], 'round')} of at most "
        f"{byte_text(s['bucket_bytes'])}; gather + broadcast: "
        f"{byte_text(s['gather_broadcast_bytes'])}" + (f" ({ratio:.2f}x)" if ratio else "")
    ]
    return transfer_picture(inputs.src.ranks, inputs.dst.ranks, (src, dst, nbytes), totals=totals)


def run(args: argparse.Namespace) -> int:
    """``meshlayout transfer``: read the model, plan, print, write the pictures asked for."""
    inputs = transfer_inputs(args)
    plan = build_plan(inputs)
    report = transfer_report(inputs, plan, complete=False)
    text = transfer_text(report, largest=args.largest)
    if args.format == "json":
        with too_large("--format json"):
            check_size(len(plan.arrays()["src"]), "--format json lists every pair", "pieces")
        report = transfer_report(inputs, plan)
    if args.svg or args.html:
        picture = _picture(report, inputs, plan)
        if args.svg:
            write("--svg", args.svg, picture.to_string())
        if args.html:
            section = Section("transfer plan", text=text, pictures=[picture])
            write("--html", args.html, html_page(f"meshlayout transfer: {args.model}", [section]))
    emit(args, report, text)
    return 0
