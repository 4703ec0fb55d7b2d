"""Plain-text pictures of the reports in :mod:`meshlayout.render.reports`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ._fmt import (
    RankSample,
    coord_text,
    holders_text,
    hosts_text,
    rank_map_text,
    ranks_text,
    runs_text,
    table,
)
from ._groups import SHOW_GROUPS, shown_group_indices
from .reports import GRID_CELLS

__all__ = ["mesh_grid_text", "mesh_text", "plan_text", "shard_grid_text", "shard_text"]

Ranks = Sequence[int] | RankSample


def _shape_text(dims: Sequence[str], shape: Sequence[int]) -> str:
    return " x ".join(f"{n}={s}" for n, s in zip(dims, shape))


def _hosts_cell(v: dict[str, Any]) -> str:
    if v["hosts_spanned"] is None:
        return ""
    crossing, total = v["crossing_groups"], v["num_groups"]
    return hosts_text(crossing, total, v["crossing_hosts_min"], v["hosts_spanned"])


def _listed_groups(v: dict[str, Any], all_groups: bool) -> list[tuple[int, Ranks, int | None]]:
    """(index, ranks, hosts touched or None) of the groups to list for one view."""
    groups = v["groups"]
    if groups is None:  # a sampled report
        if all_groups:
            raise ValueError("all_groups=True needs a complete report: plan_report(complete=True)")
        return [(g["index"], g["ranks"], g["hosts"]) for g in v["sample_groups"]]
    hosts = v.get("group_hosts")
    n = len(groups)
    shown = range(n) if all_groups else shown_group_indices(n)
    return [(i, groups[i], None if hosts is None else hosts[i]) for i in shown]


def _plan_table(report: dict[str, Any]) -> str:
    hosts = report["ranks_per_host"] is not None
    head = ["view", "shape", "size", "groups"] + (["hosts"] if hosts else []) + ["purpose"]
    rows = [head]
    for name, v in report["views"].items():
        row = [name, _shape_text(v["dims"], v["shape"]), str(v["group_size"]), str(v["num_groups"])]
        if hosts:
            row.append(_hosts_cell(v))
        rows.append([*row, v["purpose"]])
    return table(rows)


def _plan_groups(report: dict[str, Any], all_groups: bool) -> list[str]:
    hosts = report["ranks_per_host"] is not None
    lines = ["groups" + ("  (* = spans several hosts)" if hosts else "") + ":"]
    for name, v in report["views"].items():
        n = v["num_groups"]
        heading = f"  {name}: {n} group{'s' * (n != 1)} of {v['group_size']}"
        if v["group_size"] == 1 and not all_groups:
            lines.append(f"{heading} (every rank alone)")
            continue
        if v["same_groups_as"] is not None and not all_groups:
            lines.append(f"{heading}: the same groups as {v['same_groups_as']}")
            continue
        lines.append(heading)
        prev = -1
        for i, ranks, touched in _listed_groups(v, all_groups):
            if i != prev + 1:
                lines.append(f"      .. {i - prev - 1} more ..")
            mark = " *" if touched is not None and touched > 1 else ""
            lines.append(f"    {i:>4}: {ranks_text(ranks)}{mark}")
            prev = i
    return lines


def _plan_rank(report: dict[str, Any]) -> list[str]:
    rows = [["view", "coordinate", "group #", "group"]]
    for name, v in report["views"].items():
        me = v["rank"]
        mark = " *" if me["hosts"] is not None and me["hosts"] > 1 else ""
        rows.append(
            [
                name,
                coord_text(v["dims"], me["coordinate"]),
                str(me["group_index"]),
                ranks_text(me["group"], 16) + mark,
            ]
        )
    return [f"rank {report['rank']}:", table(rows, indent="  ")]


def _parallel_dims_header(report: dict[str, Any]) -> list[str]:
    d = report["degrees"]
    degs = ", ".join(f"{k}={v}" for k, v in d.items() if k != "efsdp")
    return [
        f"ParallelDims({report['world_size']}, {degs})  ->  efsdp={d['efsdp']}",
        f"order {' > '.join(report['order'])} (outermost first)",
    ]


def _megatron_header(report: dict[str, Any]) -> list[str]:
    return [
        f"{report['dims']}  ->  edp={report['degrees']['edp']}",
        f"order {'-'.join(reversed(report['order']))} (innermost first)",
    ]


#: The first two lines of a plan, by the ``kind`` of dims (their own order convention).
_PLAN_HEADERS = {"ParallelDims": _parallel_dims_header, "MegatronDims": _megatron_header}


def plan_text(report: dict[str, Any], *, all_groups: bool = False) -> str:
    """The ``plan`` report as text: a view table, each view's groups, ``rank``'s place.

    Takes a complete or a sampled report (:func:`~meshlayout.render.plan_report`);
    ``all_groups`` needs a complete one. The header names the dims and their
    order the way their class spells it: ParallelDims outermost first,
    MegatronDims as Megatron's order string, innermost first.
    """
    lines = _PLAN_HEADERS[report.get("kind", "ParallelDims")](report)
    rph = report["ranks_per_host"]
    if rph is not None:
        lines[-1] += f"; {rph} ranks per host, {report['num_hosts']} hosts"
    lines += ["", _plan_table(report), ""]
    lines += _plan_groups(report, all_groups)
    if report["rank"] is not None:
        lines += ["", *_plan_rank(report)]
    return "\n".join(lines)


def mesh_grid_text(dims: Sequence[str], sub: Any, *, mark: int | None = None) -> str:
    """An N-D array of ranks as 2-D tables (rows: second-last dim, columns: last dim).

    >>> print(mesh_grid_text(("dp", "tp"), np.arange(4).reshape(2, 2), mark=3))
    dp\\tp    0    1
    0        0    1
    1        2  [3]
    """
    arr = np.asarray(sub)
    if arr.ndim == 1:
        arr, dims = arr.reshape(1, -1), ("", *dims)
    width = max(len(str(int(arr.max()))) + 2, 3)
    blocks = []
    for lead in np.ndindex(*arr.shape[:-2]):
        panel = arr[lead]
        head = coord_text(dims[:-2], lead)
        rows = [[f"{dims[-2]}\\{dims[-1]}" if dims[-2] else dims[-1]]]
        rows[0] += [str(c).rjust(width) for c in range(panel.shape[1])]
        for i, line in enumerate(panel):
            cells = [f"[{v}]" if mark is not None and v == mark else str(v) for v in line]
            rows.append([str(i) if dims[-2] else "", *[c.rjust(width) for c in cells]])
        text = table(rows)
        blocks.append(f"{head}:\n{text}" if head else text)
    return "\n\n".join(blocks)


def mesh_text(report: dict[str, Any], *, max_cells: int = GRID_CELLS) -> str:
    """The ``mesh`` report as text: dims, layout, groups per dim, a grid of the sub-mesh.

    Takes a complete or a sampled report (:func:`~meshlayout.render.mesh_report`).
    """
    dims, shape = report["dims"], report["shape"]
    lines = [f"Mesh({_shape_text(dims, shape).replace(' x ', ', ')})"]
    lines.append(f"  layout      {report['layout']}  (coordinate -> position)")
    lines.append(f"  rank map    {rank_map_text(report['rank_map_range'], report['rank_map'])}")
    subs = report["num_submeshes"]
    lines.append(f"  sub-meshes  {subs} of {report['size']} ranks each")
    for op in report["operations"]:
        lines.append(f"  applied     --{op['op']} {op['arg']}")
    lines += ["", "groups per dim:"]
    for i, (n, groups) in enumerate(report["groups"].items()):
        k = report["num_groups"][n]
        shown = groups[: min(k, SHOW_GROUPS)]
        body = "; ".join(ranks_text(g) for g in shown)
        more = f"; .. +{k - len(shown)} more" if k > len(shown) else ""
        lines.append(f"  {n} ({k} groups of {shape[i]}): {body}{more}")
    r = report["rank"]
    if r is not None:
        lines += ["", f"rank {r['rank']}: coordinate {coord_text(dims, r['coordinate'])}"]
        lines.append(table([[n, ranks_text(g, 16)] for n, g in r["groups"].items()], "  "))
        sub, title = r["submesh"], f"sub-mesh of rank {r['rank']}"
    else:
        first = report["first_submesh"] if report["submeshes"] is None else report["submeshes"][0]
        sub, title = first, "sub-mesh 0" if subs > 1 else "ranks"
    if report["size"] <= max_cells and sub is not None:
        mark = None if r is None else r["rank"]
        lines += ["", f"{title}:", mesh_grid_text(dims, sub, mark=mark)]
    else:
        lines += ["", f"{title}: {report['size']} ranks (grid omitted; use --format json or --svg)"]
    return "\n".join(lines)


def shard_grid_text(report: dict[str, Any], *, max_rows: int = 32, max_cols: int = 16) -> str:
    """Which ranks hold each element of a 1-D/2-D tensor ("." none, "a+k" a and k more)."""
    shape = report["global_shape"]
    if len(shape) not in (1, 2) or shape[0] > max_rows or shape[-1] > max_cols:
        return ""
    rows, cols = (1, shape[0]) if len(shape) == 1 else (shape[0], shape[1])
    owners: list[list[list[int]]] = [[[] for _ in range(cols)] for _ in range(rows)]
    for r in report["ranks"]:
        runs = r["runs"] if len(shape) == 2 else [[[0, 1]], r["runs"][0]]
        for a, b in runs[0]:
            for i in range(a, b):
                for c, e in runs[1]:
                    for j in range(c, e):
                        owners[i][j].append(r["rank"])
    grid = (
        [["row\\col", *map(str, range(cols))]]
        if len(shape) == 2
        else [["", *map(str, range(cols))]]
    )
    for i in range(rows):
        grid.append([str(i) if len(shape) == 2 else "ranks", *(holders_text(o) for o in owners[i])])
    return table(grid)


def shard_text(report: dict[str, Any]) -> str:
    """The ``shard`` report as text: per-rank table, shard order, torch notes, a grid."""
    mesh = report["mesh"]
    lines = [
        f"tensor {tuple(report['global_shape'])} on mesh {_shape_text(mesh['dims'], mesh['shape'])}",
        f"  placements   {', '.join(report['given_placements'])}",
    ]
    if report["placements"] != report["given_placements"]:
        lines.append(f"  canonical    {', '.join(report['placements'])}")
    order = report["shard_order"]
    if order is None:
        lines.append("  shard order  none (not decodable: literal _StridedShard meaning)")
    elif not order:
        lines.append("  shard order  {} (nothing sharded)")
    else:
        parts = [f"dim {d} <- {' then '.join(ms)}" for d, ms in order.items()]
        lines.append(f"  shard order  {'; '.join(parts)}  (outermost first)")
    rows = [["rank", "coordinate", "runs per dim", "local shape", "offset", "box", "torch 2.13"]]
    for r in report["ranks"]:
        t = r["torch"]
        torch_cell = "same"
        if not r["torch_agrees"]:
            torch_cell = (
                f"DIFFERS: shape {tuple(t['local_shape'])} offset {tuple(t['global_offset'])}"
            )
            torch_cell += f" runs {' ; '.join(runs_text(x) for x in t['runs'])}"
        off = r["global_offset"]
        rows.append(
            [
                str(r["rank"]),
                coord_text(mesh["dims"], r["coordinate"]),
                " ; ".join(runs_text(x) for x in r["runs"]),
                str(tuple(r["local_shape"])),
                "-" if off is None else str(tuple(off)),
                "yes" if r["is_box"] else "NO",
                torch_cell,
            ]
        )
    lines += ["", table(rows)]
    grid = shard_grid_text(report)
    if grid:
        lines += ["", "holders of each element:", grid]
    for note in report["notes"]:
        lines += ["", f"note: {note}"]
    return "\n".join(lines)
