"""SVG picture of an N-D mesh, each group of a chosen view outlined and coloured.

The last two dims form a 2-D panel (rows x columns); dims before them nest the
panels, alternately across and down, each panel labelled with its coordinate and
rank range. Size-1 dims are hidden. Beyond ``label_limit`` cells ranks are not
written in the cells; groups that form rectangles get a range label instead, and
beyond ``max_cells`` the trailing dims are merged into blocks of ranks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..mesh import Mesh
from ._fmt import coord_text, range_label, ranks_text
from ._svg import Svg, Swatch, fill_colour, stroke_colour
from .reports import check_size

__all__ = ["mesh_picture", "mesh_svg"]

IntArray = npt.NDArray[np.int64]
MARGIN = 16
LABEL_H = 14
LINE_H = 16
NEUTRAL = "#e8ecf2"
MIXED = "#d0d0d0"


@dataclass
class _Grid:
    """What is drawn: an N-D array of cells, each a block of global ranks."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    blocks: IntArray  # (num_cells, block) global ranks, cells in row-major order
    hidden: tuple[str, ...]
    merged: tuple[str, ...]


def _grid(mesh: Mesh, rank: int | None, max_cells: int) -> _Grid:
    anchor = rank if rank is not None else int(mesh.rank_map[0])
    sub = np.asarray(mesh.submesh(anchor))
    keep = [i for i, s in enumerate(mesh.shape) if s > 1] or [mesh.ndim - 1]
    names = tuple(mesh.names[i] for i in keep)
    shape = tuple(mesh.shape[i] for i in keep)
    hidden = tuple(n for n in mesh.names if n not in names)
    merged: tuple[str, ...] = ()
    while len(shape) > 1 and math.prod(shape) > max_cells:
        merged = (names[-1], *merged)
        names, shape = names[:-1], shape[:-1]
    size = math.prod(shape)
    flat = sub.reshape(-1)
    if size > max_cells:  # one dim left: cut it into equal runs of positions
        block = next(b for b in range(2, size + 1) if size % b == 0 and size // b <= max_cells)
        shape, names = (size // block,), (f"{names[0]}/{block}",)
    blocks = flat.reshape(math.prod(shape), -1).astype(np.int64)
    return _Grid(names, shape, blocks, hidden, merged)


@dataclass
class _Groups:
    """rank -> (group index, index inside the group) by sorted search (no world-sized table)."""

    groups: IntArray
    sorted_ranks: IntArray
    where: IntArray

    @classmethod
    def of(cls, groups: IntArray) -> _Groups:
        flat = groups.reshape(-1)
        order = np.argsort(flat, kind="stable").astype(np.int64)
        return cls(groups, flat[order], order)

    def lookup(self, ranks: IntArray) -> tuple[IntArray, IntArray]:
        i = np.searchsorted(self.sorted_ranks, ranks)
        i = np.minimum(i, len(self.sorted_ranks) - 1)
        found = self.sorted_ranks[i] == ranks
        pos = self.where[i]
        g = np.where(found, pos // self.groups.shape[1], -1)
        return g.astype(np.int64), np.where(found, pos % self.groups.shape[1], -1).astype(np.int64)


def _as_groups(view: Mesh | IntArray | Sequence[Sequence[int]]) -> IntArray:
    if isinstance(view, Mesh):
        check_size(len(view.rank_map), "a picture colours every group of the view")
        return view.group_table()
    arr = np.asarray(view, dtype=np.int64)
    return arr.reshape(arr.shape[0], -1)


def _arrangement(n: int, child: tuple[float, float], gap: float) -> tuple[int, int]:
    """(columns, rows) for ``n`` children of size ``child``: the block closest to 16:10."""
    cw, ch = child
    best: tuple[float, int] = (float("inf"), n)
    for ncol in range(n, 0, -1):
        nrow = -(-n // ncol)
        w = ncol * cw + (ncol - 1) * gap
        h = nrow * (LABEL_H + ch) + (nrow - 1) * gap
        score = abs(math.log(w / h / 1.6))
        if score < best[0] - 1e-9:
            best = (score, ncol)
    return best[1], -(-n // best[1])


def _rectangles(cells: list[tuple[int, int]]) -> list[tuple[int, int, int, int]]:
    """Cells (line, col) as (line0, col0, line1, col1) rectangles: row runs merged downwards."""
    runs: list[tuple[int, int, int]] = []
    for line, col in sorted(cells):
        if runs and runs[-1][0] == line and runs[-1][2] == col:
            runs[-1] = (line, runs[-1][1], col + 1)
        else:
            runs.append((line, col, col + 1))
    rects: list[list[int]] = []
    for line, c0, c1 in runs:
        for r in rects:
            if r[2] == line and r[1] == c0 and r[3] == c1:
                r[2] = line + 1
                break
        else:
            rects.append([line, c0, line + 1, c1])
    return [(a, b, c, d) for a, b, c, d in rects]


def mesh_picture(
    mesh: Mesh,
    view_groups: Mesh | IntArray | Sequence[Sequence[int]] | None = None,
    *,
    rank: int | None = None,
    title: str | None = None,
    view_name: str | None = None,
    ranks_per_host: int | None = None,
    label_limit: int = 512,
    max_cells: int = 8192,
    wrap: int = 64,
) -> Svg:
    """The picture behind :func:`mesh_svg`, as an :class:`Svg` (for stacking)."""
    check_size(len(mesh.rank_map), "a picture draws every rank of the mesh")
    grid = _grid(mesh, rank, max_cells)
    colour_by_host = view_groups is None and ranks_per_host is not None
    if view_groups is not None:
        groups: IntArray | None = _as_groups(view_groups)
    elif colour_by_host:
        assert ranks_per_host is not None
        rmin, rmax = int(grid.blocks.min()), int(grid.blocks.max())
        hosts = np.arange(rmin // ranks_per_host, rmax // ranks_per_host + 1)
        g = hosts[:, None] * ranks_per_host + np.arange(ranks_per_host)[None, :]
        groups = g.astype(np.int64)
        view_name = view_name or "hosts"
    else:
        groups = None
    lookup = _Groups.of(groups) if groups is not None else None
    ncells = grid.blocks.shape[0]
    block = grid.blocks.shape[1]
    cell_group = np.full(ncells, -1, dtype=np.int64)
    cell_local = np.full(ncells, -1, dtype=np.int64)
    if lookup is not None:
        g, loc = lookup.lookup(grid.blocks.reshape(-1))
        g, loc = g.reshape(ncells, block), loc.reshape(ncells, block)
        uniform = (g == g[:, :1]).all(axis=1)
        cell_group = np.where(uniform, g[:, 0], -2)
        cell_local = loc[:, 0]
    crossing: set[int] = set()
    if groups is not None and ranks_per_host is not None and not colour_by_host:
        spans = np.sort(groups // ranks_per_host, axis=1)
        crossing = set(np.flatnonzero((np.diff(spans, axis=1) != 0).any(axis=1)).tolist())
    my_group = -1
    if rank is not None and lookup is not None:
        my_group = int(lookup.lookup(np.array([rank], dtype=np.int64))[0][0])

    # ------------------------------------------------------------ geometry
    names, shape = grid.names, grid.shape
    outer: tuple[int, ...]
    if len(shape) == 1:
        rows, cols, outer = 1, shape[0], ()
    else:
        rows, cols, outer = shape[-2], shape[-1], shape[:-2]
    fold = -(-cols // wrap) if cols > wrap else 1
    pcols = min(cols, wrap)
    plines = rows * fold
    labelled = ncells <= label_limit
    widest = max(len(str(int(grid.blocks.max()))), 2)
    c = max(26, 8 + 7 * widest) if labelled else (12 if ncells <= 4096 else 8)
    pw, ph = pcols * c, plines * c
    k_outer = len(outer)
    sizes: list[tuple[float, float]] = [(pw, ph)] * (k_outer + 1)
    arrangement: list[tuple[int, int]] = [(1, 1)] * k_outer
    for k in range(k_outer - 1, -1, -1):
        cw, ch = sizes[k + 1]
        gap = 6 + 8 * (k_outer - 1 - k)
        ncol, nrow = arrangement[k] = _arrangement(outer[k], sizes[k + 1], gap)
        sizes[k] = (ncol * cw + (ncol - 1) * gap, nrow * (LABEL_H + ch) + (nrow - 1) * gap)
    gw, gh = sizes[0]

    # ------------------------------------------------------------ legend text
    legend = _legend(
        mesh, grid, groups, view_name, rank, my_group, crossing, ranks_per_host, colour_by_host
    )
    head = title or repr(mesh)
    width = max(gw, 8.2 * len(head), 7 * max(len(t) for t, _ in legend) + 40) + 2 * MARGIN
    top = MARGIN + 20
    height = top + gh + 12 + LINE_H * len(legend) + MARGIN
    svg = Svg(width, height)
    svg.parts.append(
        "<style>rect.cell:hover{stroke:#000;stroke-width:2}text{pointer-events:none}</style>"
    )
    svg.text(MARGIN, MARGIN + 8, head, font_size=13, font_weight="bold")

    # ------------------------------------------------------------ panels
    panel_cells: list[tuple[float, float, list[int]]] = []

    def place(k: int, prefix: tuple[int, ...], x: float, y: float) -> None:
        if k == k_outer:
            base = int(np.ravel_multi_index(prefix, outer)) * rows * cols if outer else 0
            panel_cells.append((x, y, list(range(base, base + rows * cols))))
            return
        cw, ch = sizes[k + 1]
        gap = 6 + 8 * (k_outer - 1 - k)
        ncol = arrangement[k][0]
        for i in range(outer[k]):
            cx = x + (i % ncol) * (cw + gap)
            cy = y + (i // ncol) * (LABEL_H + ch + gap)
            label = f"{names[k]}={i}"
            if k == k_outer - 1 and with_ranges:
                base = int(np.ravel_multi_index((*prefix, i), outer)) * rows * cols
                ends = grid.blocks[base : base + rows * cols].reshape(-1)[[0, -1]].tolist()
                label = f"{label} · {ends[0]}-{ends[1]}"
            svg.text(cx, cy + LABEL_H - 4, label, font_size=10, fill="#555")
            place(k + 1, (*prefix, i), cx, cy + LABEL_H)

    longest = (
        len(f"{names[k_outer - 1]}={outer[-1]} · {int(grid.blocks.max())}-{int(grid.blocks.max())}")
        if outer
        else 0
    )
    with_ranges = bool(outer) and longest * 6.2 <= sizes[k_outer][0]
    place(0, (), MARGIN, top)
    tooltips = ncells <= 2048
    for px, py, cells in panel_cells:
        by_group: dict[int, list[tuple[int, int]]] = {}
        at: dict[tuple[int, int], int] = {}
        for j, cell in enumerate(cells):
            r, col = divmod(j, cols)
            line, col = r * fold + col // pcols, col % pcols
            x, y = px + col * c, py + line * c
            gi = int(cell_group[cell])
            fill = fill_colour(gi) if gi >= 0 else (MIXED if gi == -2 else NEUTRAL)
            members = grid.blocks[cell]
            tip = (
                _tooltip(mesh, grid, members, gi, int(cell_local[cell]), view_name, ranks_per_host)
                if tooltips
                else None
            )
            svg.rect(x, y, c, c, tip, fill=fill, stroke="white", stroke_width=1, class_="cell")
            if labelled:
                text = range_label(members.tolist())
                bold = rank is not None and rank in members
                svg.text(
                    x + c / 2,
                    y + c / 2 + 4,
                    text,
                    text_anchor="middle",
                    font_weight="bold" if bold else None,
                    font_size=11 if block == 1 else 8,
                )
            at[line, col] = cell
            if gi >= 0:
                by_group.setdefault(gi, []).append((line, col))
        for gi, where in by_group.items():
            for l0, c0, l1, c1 in _rectangles(where):
                x, y, w, h = px + c0 * c, py + l0 * c, (c1 - c0) * c, (l1 - l0) * c
                mine = gi == my_group
                svg.rect(
                    x + 1.5,
                    y + 1.5,
                    w - 3,
                    h - 3,
                    fill="none",
                    stroke="black" if mine else stroke_colour(gi),
                    stroke_width=3 if mine else 1.6,
                    stroke_dasharray="5 3" if gi in crossing else None,
                    class_="group",
                )
                if not labelled:
                    inside = [at[a, b] for a in range(l0, l1) for b in range(c0, c1)]
                    ranks = grid.blocks[inside].reshape(-1)
                    text = range_label(ranks.tolist())
                    if len(text) * 5.6 + 6 <= w and h >= 11:
                        svg.text(
                            x + w / 2,
                            y + h / 2 + 3.5,
                            text,
                            text_anchor="middle",
                            font_size=9,
                            fill="#111",
                        )
    if rank is not None:
        hit = np.flatnonzero((grid.blocks == rank).any(axis=1))
        for cell in hit.tolist():
            for px, py, cells in panel_cells:
                if cells[0] <= cell <= cells[-1]:
                    r, col = divmod(cell - cells[0], cols)
                    line, col = r * fold + col // pcols, col % pcols
                    svg.rect(
                        px + col * c,
                        py + line * c,
                        c,
                        c,
                        fill="none",
                        stroke="black",
                        stroke_width=2.5,
                    )

    # ------------------------------------------------------------ legend
    svg.legend(MARGIN, top + gh + 12, legend, LINE_H)
    return svg


def _tooltip(
    mesh: Mesh,
    grid: _Grid,
    members: IntArray,
    gi: int,
    local: int,
    view_name: str | None,
    ranks_per_host: int | None,
) -> str:
    if members.size == 1:
        r = int(members[0])
        coord = mesh.coordinate(r)
        text = f"rank {r} · {coord_text(mesh.names, coord or ())}"
    else:
        text = f"ranks {ranks_text(members.tolist())} ({', '.join(grid.merged) or 'block'})"
    if gi >= 0 and view_name:
        text += f" · {view_name} group {gi}" + (f", index {local}" if members.size == 1 else "")
    elif gi == -2:
        text += f" · several {view_name} groups"
    if ranks_per_host and members.size == 1:
        text += f" · host {int(members[0]) // ranks_per_host}"
    return text


Legend = list[tuple[str, Swatch | None]]


def _legend(
    mesh: Mesh,
    grid: _Grid,
    groups: IntArray | None,
    view_name: str | None,
    rank: int | None,
    my_group: int,
    crossing: set[int],
    ranks_per_host: int | None,
    by_host: bool,
) -> Legend:
    out: Legend = []
    names, shape = grid.names, grid.shape
    if len(shape) >= 2:
        where = f"rows: {names[-2]}, columns: {names[-1]}"
        if len(names) > 2:
            where += f"; panels nested by {', '.join(names[:-2])} (outermost first)"
    else:
        where = f"one row: {names[0]}"
    out.append((where, None))
    if grid.hidden:
        out.append((f"size-1 dims hidden: {', '.join(grid.hidden)}", None))
    if grid.merged:
        out.append((f"each cell is a block of ranks over: {', '.join(grid.merged)}", None))
    if mesh.num_submeshes > 1:
        out.append((f"one of {mesh.num_submeshes} congruent sub-meshes shown", None))
    if groups is not None:
        n, size = groups.shape
        what = "hosts" if by_host else f"view {view_name or '?'}"
        out.append((f"{what}: {n} group{'s' * (n != 1)} of {size}", None))
        shown = min(n, 8)
        for gi in range(shown):
            dash = "5 3" if gi in crossing else None
            out.append(
                (
                    f"group {gi}: {ranks_text(groups[gi].tolist())}",
                    (fill_colour(gi), stroke_colour(gi), dash),
                )
            )
        if n > shown:
            out.append(
                (f".. {n - shown} more groups (colours repeat; hover a cell for details)", None)
            )
        if crossing:
            out.append(
                (
                    f"dashed outline: group crosses hosts ({len(crossing)} of {n} groups, {ranks_per_host} ranks per host)",
                    None,
                )
            )
        elif ranks_per_host is not None and not by_host:
            out.append(
                (f"every group stays inside one host ({ranks_per_host} ranks per host)", None)
            )
    if rank is not None:
        coord = mesh.coordinate(rank)
        text = f"rank {rank}: {coord_text(mesh.names, coord or ())}"
        if groups is not None and my_group >= 0:
            text += f"; its group {my_group}: {ranks_text(groups[my_group].tolist())}"
        out.append((text, ("white", "black", None)))
    return out


def mesh_svg(
    mesh: Mesh,
    view_groups: Mesh | IntArray | Sequence[Sequence[int]] | None = None,
    **options: Any,
) -> str:
    """SVG document of ``mesh`` (the sub-mesh holding ``rank``, or the first one).

    ``view_groups``: a :class:`Mesh` whose sub-meshes are the groups to colour (e.g.
    ``pd.mesh("tp")``) or an array ``(num_groups, group_size)`` of global ranks.
    Options: ``rank``, ``title``, ``view_name``, ``ranks_per_host`` (without a view,
    cells are coloured by host), ``label_limit``, ``max_cells``, ``wrap``.

    >>> from meshlayout import Mesh
    >>> m = Mesh({"dp": 2, "tp": 4})
    >>> svg = mesh_svg(m, m["tp"], rank=5)
    >>> svg.count('class="cell"'), svg.count('class="group"')
    (8, 2)
    """
    return mesh_picture(mesh, view_groups, **options).to_string()
