"""``meshlayout plan``: every view of a job's dims, as ParallelDims or as Megatron-Core.

By default the degrees are those of :class:`~meshlayout.ParallelDims`
(torchtitan's ``pp, dp_replicate, dp_shard, cp, tp, ep, etp``, placed by
``--order``, outermost first). ``--megatron-order ORDER`` (e.g.
``tp-cp-ep-dp-pp``, innermost first) plans Megatron-Core's groups instead:
:class:`~meshlayout.MegatronDims` with ``tp, pp, cp, ep, etp`` and that order,
its views named as Megatron's (``dp_cp``, ``tp_ep_pp``, ...). Both kinds give
the report :func:`meshlayout.render.plan_report` reads (:class:`~meshlayout.render.reports.PlanDims`), so everything below the construction is shared.
User mistakes raise :class:`~meshlayout.cli.args.ArgError` (exit 2, one line).
See ``docs/cli.md`` and ``docs/megatron.md``.
"""

from __future__ import annotations

import argparse

from .. import megatron, render
from ..megatron import MegatronDims
from ..parallel_dims import VIEWS, ParallelDims
from ..render.reports import PlanDims
from .args import ArgError, int_arg, parse_names, shown, user_input, whole_hosts
from .output import add_output, emit, picture_flags, too_large, write

__all__ = ["EPILOG", "HELP", "add_arguments", "plan_dims", "run"]

HELP = "every view of a ParallelDims or Megatron job: shapes, groups, hosts, one rank's place"

EPILOG = (
    """\
examples:
  meshlayout plan --world 64 --pp 2 --cp 2 --tp 4 --ep 4
  meshlayout plan --world 64 --pp 2 --cp 2 --tp 4 --ep 4 --ranks-per-host 8 --rank 13
  meshlayout plan --world 4096 --pp 4 --dp-replicate 2 --cp 2 --tp 8 --ep 8 --view tp,fsdp --svg plan.svg
  meshlayout plan --world 16 --dp-shard 4 --tp 4 --order tp,pp,dp_replicate,dp_shard,cp --format json
  meshlayout plan --world 64 --pp 2 --tp 8 --ep 8 --html plan.html
  meshlayout plan --world 32 --tp 2 --cp 2 --pp 2 --ep 4 --etp 1 --megatron-order tp-cp-ep-dp-pp
  meshlayout plan --world 16 --tp 2 --pp 2 --megatron-order tp-pp-dp --view dp,pp --rank 5

views: """
    + ", ".join(VIEWS)
    + """
Megatron views (with --megatron-order): """
    + ", ".join(megatron.VIEWS)
    + "\n"
)

_positive = int_arg(minimum=1)
#: ParallelDims' own flags: refused with --megatron-order (Megatron infers dp).
_PARALLEL_DIMS_ONLY = ("dp_replicate", "dp_shard", "order")
#: Flag -> the value it means when not given, for ParallelDims.
_PARALLEL_DIMS_DEFAULTS = {
    "pp": 1,
    "dp_replicate": 1,
    "dp_shard": -1,
    "cp": 1,
    "tp": 1,
    "ep": 1,
    "etp": 1,
}
_MEGATRON_DEGREES = ("tp", "pp", "cp", "ep", "etp")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``plan`` flags (the output flags are the command's shared ones)."""

    p.add_argument("--world", type=_positive, required=True, help="number of ranks")
    p.add_argument("--pp", type=_positive, default=1, help="pipeline stages")
    p.add_argument("--dp-replicate", type=_positive, help="HSDP replicas (default 1)")
    p.add_argument(
        "--dp-shard", type=int_arg(minimum=-1), help="FSDP degree; -1 (default): inferred"
    )
    p.add_argument("--cp", type=_positive, default=1, help="context parallel")
    p.add_argument("--tp", type=_positive, default=1, help="tensor parallel")
    p.add_argument("--ep", type=_positive, default=1, help="expert parallel")
    p.add_argument(
        "--etp",
        type=_positive,
        help="expert tensor parallel (default 1; with --megatron-order: tp, as Megatron)",
    )
    p.add_argument(
        "--order",
        help="placement of the dense dims in rank space, outermost first "
        "(default pp,dp_replicate,dp_shard,cp,tp: tp on consecutive ranks)",
    )
    p.add_argument(
        "--megatron-order",
        metavar="ORDER",
        help="plan Megatron-Core's groups (MegatronDims) laid out by this order string, "
        "innermost first, e.g. tp-cp-ep-dp-pp (Megatron's default); dp is inferred",
    )
    p.add_argument(
        "--ranks-per-host",
        type=_positive,
        metavar="N",
        help="ranks [k*N, (k+1)*N) form host k (N divides --world); mark crossing groups",
    )
    p.add_argument(
        "--rank",
        type=int_arg(minimum=0),
        help="show this rank's coordinate and group in every view",
    )
    p.add_argument(
        "--view",
        action="append",
        metavar="VIEWS",
        help="only these views (comma-separated, repeatable); pictures draw them in order",
    )
    p.add_argument(
        "--all-groups", action="store_true", help="text: list every group (no abridging)"
    )
    add_output(p)


# ---------------------------------------------------------------------- the dims
def plan_dims(args: argparse.Namespace) -> ParallelDims | MegatronDims:
    """The user's dims: MegatronDims with ``--megatron-order``, else ParallelDims.

    Library errors become one-line usage errors naming the flags that were given.
    """
    if args.megatron_order is not None:
        return _megatron_dims(args)
    return _parallel_dims(args)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parallel_dims(args: argparse.Namespace) -> ParallelDims:
    if args.dp_shard == 0:
        raise ArgError("--dp-shard: must be >= 1 or -1 (inferred), got 0")
    degrees = {
        k: default if getattr(args, k) is None else getattr(args, k)
        for k, default in _PARALLEL_DIMS_DEFAULTS.items()
    }
    given = [f"--world {args.world}"]
    given += [f"{_flag(k)} {v}" for k, v in degrees.items() if v != _PARALLEL_DIMS_DEFAULTS[k]]
    if args.order is not None:
        given.append(f"--order {shown(args.order)}")
    with user_input(" ".join(given)):
        return ParallelDims(args.world, **degrees, order=args.order)


def _megatron_dims(args: argparse.Namespace) -> MegatronDims:
    order = args.megatron_order
    refused = [
        f"{_flag(k)} {shown(getattr(args, k)) if k == 'order' else getattr(args, k)}"
        for k in _PARALLEL_DIMS_ONLY
        if getattr(args, k) is not None
    ]
    if refused:
        raise ArgError(
            f"--megatron-order {shown(order)} cannot be combined with {', '.join(refused)}: "
            "those are ParallelDims flags (Megatron infers dp = world/(tp*cp*pp) and places "
            "the dims by the order string)"
        )
    degrees = {k: getattr(args, k) for k in _MEGATRON_DEGREES}
    given = [f"--world {args.world}"]
    given += [f"--{k} {v}" for k, v in degrees.items() if v is not None and (v != 1 or k == "etp")]
    given.append(f"--megatron-order {shown(order)}")
    with user_input(" ".join(given)):
        return MegatronDims(args.world, **degrees, order=order)


def _chosen_views(args: argparse.Namespace, dims: PlanDims) -> list[str] | None:
    """The ``--view`` names (deduplicated, in order); Megatron's also as ``dp-cp`` or aliases."""
    if not args.view:
        return None
    megatron_names = args.megatron_order is not None
    valid = dims.view_purposes
    names: list[str] = []
    for text in args.view:
        for n in parse_names(text.replace("-", "_") if megatron_names else text, "--view"):
            name = megatron.ALIASES.get(n.lower(), n.lower()) if megatron_names else n
            if name not in valid:
                raise ArgError(
                    f"--view: unknown view {n!r}; valid views are {', '.join(valid)}"
                    + (f" (also {', '.join(megatron.ALIASES)})" if megatron_names else "")
                )
            names.append(name)
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------- pictures
def _picture_views(dims: PlanDims, chosen: list[str] | None) -> list[tuple[str, str]]:
    """(view, note) to draw: the chosen ones, or every view with groups > 1, deduplicated."""
    if chosen is not None:
        return [(v, "") for v in chosen]
    drawn: list[str] = []
    same: dict[str, list[str]] = {}
    for name in dims.view_purposes:
        mesh = dims.mesh(name)
        if mesh.size() == 1:
            continue
        first = next((d for d in drawn if render.same_groups(dims.mesh(d), mesh)), None)
        if first is None:
            drawn.append(name)
            same[name] = []
        else:
            same[first].append(name)
    return [(n, f" (same groups: {', '.join(same[n])})" if same[n] else "") for n in drawn]


def _pictures(
    dims: PlanDims, args: argparse.Namespace, chosen: list[str] | None
) -> list[tuple[str, render.Svg]]:
    """(heading, picture) for every view to draw, each on the dense grid; every rank."""
    views = _picture_views(dims, chosen)
    purposes = dims.view_purposes
    render.check_size(dims.world_size * len(views), f"{len(views)} pictures of every rank", "ranks")
    return [
        (
            f"{name}{note}",
            render.mesh_picture(
                dims.dense,
                dims.mesh(name),
                rank=args.rank,
                view_name=name,
                ranks_per_host=args.ranks_per_host,
                title=f"{name}{note}: {purposes[name]}",
            ),
        )
        for name, note in views
    ]


# ---------------------------------------------------------------------- the command
def run(args: argparse.Namespace) -> int:
    """``meshlayout plan``: the report as text or JSON, and the pictures asked for."""

    if args.order is not None and args.megatron_order is None:
        with too_large(f"--order {shown(args.order)}"):  # it permutes every rank: check first
            render.check_size(args.world, f"--world {args.world}: the order permutes every rank")
    dims = plan_dims(args)
    if args.rank is not None and args.rank not in dims.rank_map:
        raise ArgError(f"--rank {args.rank} is outside the world of {args.world} ranks")
    whole_hosts(args.ranks_per_host, args.world, f"--world {args.world}")
    chosen = _chosen_views(args, dims)
    complete = args.all_groups or args.format == "json"
    flags = ["--format json"] if args.format == "json" else []
    flags += ["--all-groups"] if args.all_groups else []
    flags += [] if args.ranks_per_host is None else [f"--ranks-per-host {args.ranks_per_host}"]
    with too_large(" ".join(flags)):
        report = render.plan_report(
            dims,
            views=chosen,
            rank=args.rank,
            ranks_per_host=args.ranks_per_host,
            complete=complete,
        )
    text = render.plan_text(report, all_groups=args.all_groups)
    if args.svg or args.html:
        with too_large(picture_flags(args)):
            pictures = _pictures(dims, args, chosen)
        if args.svg:
            write("--svg", args.svg, render.stack([p for _, p in pictures]).to_string())
        if args.html:
            sections = [render.Section("plan", text=text)]
            sections += [render.Section(name, pictures=[p]) for name, p in pictures]
            write("--html", args.html, render.html_page(f"meshlayout plan: {dims!r}", sections))
    emit(args, report, text)
    return 0
