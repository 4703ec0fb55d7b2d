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


def _view_mesh(view: Mesh | IntArray | Sequence[Sequence[int]]) -> Mesh:
    """The view as a Mesh whose groups are its sub-meshes (an array: one group per row)."""
    if isinstance(view, Mesh):
        return view
    arr = np.asarray(view, dtype=np.int64)
    arr = arr.reshape(arr.shape[0], -1)
    return Mesh(arr.shape, ("group", "member"), ranks=arr)["member"]


@dataclass
class _Colouring:
    """Which group colours each cell, and which groups are outlined how."""

    groups: IntArray | None  # (num_groups, group_size) global ranks, or None: no colours
    cell_group: IntArray  # per cell: group index, -1 in no group, -2 in several
    cell_local: IntArray  # per cell: index of its first rank inside its group
    crossing: frozenset[int]  # groups that cross hosts (dashed)
    my_group: int  # the group of ``rank``, or -1
    view_name: str | None
    by_host: bool  # no view given: the groups are the hosts


def _colouring(
    grid: _Grid,
    view_groups: Mesh | IntArray | Sequence[Sequence[int]] | None,
    rank: int | None,
    view_name: str | None,
    ranks_per_host: int | None,
) -> _Colouring:
    by_host = view_groups is None and ranks_per_host is not None
    groups: IntArray | None = None
    crossing: frozenset[int] = frozenset()
    if view_groups is not None:
        view = _view_mesh(view_groups)
        check_size(len(view.rank_map), "a picture colours every group of the view")
        groups = view.group_table()
        if ranks_per_host is not None:
            crossing = frozenset(np.flatnonzero(view.hosts_spanned(ranks_per_host) > 1).tolist())
    elif ranks_per_host is not None:  # colour by host: the hosts the drawn ranks live on
        first, last = int(grid.blocks.min()), int(grid.blocks.max())
        hosts = np.arange(first // ranks_per_host, last // ranks_per_host + 1)
        groups = (hosts[:, None] * ranks_per_host + np.arange(ranks_per_host)[None, :]).astype(
            np.int64
        )
        view_name = view_name or "hosts"
    ncells, block = grid.blocks.shape
    cell_group = np.full(ncells, -1, dtype=np.int64)
    cell_local = np.full(ncells, -1, dtype=np.int64)
    my_group = -1
    if groups is not None:
        lookup = _Groups.of(groups)
        g, loc = lookup.lookup(grid.blocks.reshape(-1))
        g, loc = g.reshape(ncells, block), loc.reshape(ncells, block)
        cell_group = np.where((g == g[:, :1]).all(axis=1), g[:, 0], -2)
        cell_local = loc[:, 0]
        if rank is not None:
            my_group = int(lookup.lookup(np.array([rank], dtype=np.int64))[0][0])
    return _Colouring(groups, cell_group, cell_local, crossing, my_group, view_name, by_host)


@dataclass
class _Geometry:
    """Where cells go: panels of ``rows x cols`` cells (long rows folded), nested by ``outer``."""

    rows: int
    cols: int
    outer: tuple[int, ...]  # sizes of the dims that nest the panels, outermost first
    fold: int  # a panel row of ``cols`` cells is drawn as ``fold`` lines of ``pcols``
    pcols: int
    cell: float  # side of one cell
    labelled: bool  # ranks written in the cells
    sizes: list[tuple[float, float]]  # (width, height) of one block at each nesting level
    arrangement: list[tuple[int, int]]  # (columns, rows) of the children at each level

    def gap(self, k: int) -> float:
        """Space between the children of nesting level ``k`` (wider further out)."""
        return 6 + 8 * (len(self.outer) - 1 - k)

    def where(self, j: int) -> tuple[int, int]:
        """(line, column) inside its panel of the ``j``-th cell of a panel."""
        r, col = divmod(j, self.cols)
        return r * self.fold + col // self.pcols, col % self.pcols


def _geometry(grid: _Grid, label_limit: int, wrap: int) -> _Geometry:
    shape = grid.shape
    rows, cols, outer = (1, shape[0], ()) if len(shape) == 1 else (shape[-2], shape[-1], shape[:-2])
    fold = -(-cols // wrap) if cols > wrap else 1
    pcols = min(cols, wrap)
    ncells = grid.blocks.shape[0]
    labelled = ncells <= label_limit
    widest = max(len(str(int(grid.blocks.max()))), 2)
    c = max(26, 8 + 7 * widest) if labelled else (12 if ncells <= 4096 else 8)
    k_outer = len(outer)
    sizes: list[tuple[float, float]] = [(pcols * c, rows * fold * c)] * (k_outer + 1)
    arrangement: list[tuple[int, int]] = [(1, 1)] * k_outer
    geo = _Geometry(rows, cols, outer, fold, pcols, c, labelled, sizes, arrangement)
    for k in range(k_outer - 1, -1, -1):
        cw, ch = sizes[k + 1]
        gap = geo.gap(k)
        ncol, nrow = arrangement[k] = _arrangement(outer[k], sizes[k + 1], gap)
        sizes[k] = (ncol * cw + (ncol - 1) * gap, nrow * (LABEL_H + ch) + (nrow - 1) * gap)
    return geo


@dataclass
class _Panel:
    """One 2-D panel: its top-left corner and the index of its first cell."""

    x: float
    y: float
    first: int


def _panels(
    geo: _Geometry, grid: _Grid, x: float, y: float
) -> tuple[list[_Panel], list[tuple[float, float, str]]]:
    """Every panel and every panel label ``(x, y, text)``, outermost level first."""
    outer, names = geo.outer, grid.names
    cells_per_panel = geo.rows * geo.cols
    top = int(grid.blocks.max())
    longest = len(f"{names[len(outer) - 1]}={outer[-1]} · {top}-{top}") if outer else 0
    with_ranges = bool(outer) and longest * 6.2 <= geo.sizes[len(outer)][0]
    panels: list[_Panel] = []
    labels: list[tuple[float, float, str]] = []

    def place(k: int, prefix: tuple[int, ...], x: float, y: float) -> None:
        if k == len(outer):
            base = int(np.ravel_multi_index(prefix, outer)) if outer else 0
            panels.append(_Panel(x, y, base * cells_per_panel))
            return
        cw, ch = geo.sizes[k + 1]
        ncol = geo.arrangement[k][0]
        for i in range(outer[k]):
            cx = x + (i % ncol) * (cw + geo.gap(k))
            cy = y + (i // ncol) * (LABEL_H + ch + geo.gap(k))
            label = f"{names[k]}={i}"
            if k == len(outer) - 1 and with_ranges:
                base = int(np.ravel_multi_index((*prefix, i), outer)) * cells_per_panel
                ends = grid.blocks[base : base + cells_per_panel].reshape(-1)[[0, -1]].tolist()
                label = f"{label} · {ends[0]}-{ends[1]}"
            labels.append((cx, cy + LABEL_H - 4, label))
            place(k + 1, (*prefix, i), cx, cy + LABEL_H)

    place(0, (), x, y)
    return panels, labels


@dataclass
class _Scene:
    """Everything one panel's drawing needs."""

    mesh: Mesh
    grid: _Grid
    geo: _Geometry
    colours: _Colouring
    rank: int | None
    ranks_per_host: int | None


def _draw_panel(svg: Svg, scene: _Scene, panel: _Panel) -> None:
    """The cells of one panel, then an outline around each rectangle of a group."""
    grid, geo, colours, c = scene.grid, scene.geo, scene.colours, scene.geo.cell
    tooltips = grid.blocks.shape[0] <= 2048
    block = grid.blocks.shape[1]
    by_group: dict[int, list[tuple[int, int]]] = {}
    at: dict[tuple[int, int], int] = {}
    for j in range(geo.rows * geo.cols):
        cell = panel.first + j
        line, col = geo.where(j)
        x, y = panel.x + col * c, panel.y + line * c
        gi = int(colours.cell_group[cell])
        fill = fill_colour(gi) if gi >= 0 else (MIXED if gi == -2 else NEUTRAL)
        members = grid.blocks[cell]
        tip = _tooltip(scene, members, gi, int(colours.cell_local[cell])) if tooltips else None
        svg.rect(x, y, c, c, tip, fill=fill, stroke="white", stroke_width=1, class_="cell")
        if geo.labelled:
            bold = scene.rank is not None and scene.rank in members
            svg.text(
                x + c / 2,
                y + c / 2 + 4,
                range_label(members.tolist()),
                text_anchor="middle",
                font_weight="bold" if bold else None,
                font_size=11 if block == 1 else 8,
            )
        at[line, col] = cell
        if gi >= 0:
            by_group.setdefault(gi, []).append((line, col))
    for gi, where in by_group.items():
        for rect in _rectangles(where):
            _draw_outline(svg, scene, panel, gi, rect, at)


def _draw_outline(
    svg: Svg,
    scene: _Scene,
    panel: _Panel,
    gi: int,
    rect: tuple[int, int, int, int],
    at: dict[tuple[int, int], int],
) -> None:
    """One rectangle of group ``gi``; labelled with its rank range when cells are not."""
    c, colours = scene.geo.cell, scene.colours
    l0, c0, l1, c1 = rect
    x, y, w, h = panel.x + c0 * c, panel.y + l0 * c, (c1 - c0) * c, (l1 - l0) * c
    mine = gi == colours.my_group
    svg.rect(
        x + 1.5,
        y + 1.5,
        w - 3,
        h - 3,
        fill="none",
        stroke="black" if mine else stroke_colour(gi),
        stroke_width=3 if mine else 1.6,
        stroke_dasharray="5 3" if gi in colours.crossing else None,
        class_="group",
    )
    if scene.geo.labelled:
        return
    inside = [at[a, b] for a in range(l0, l1) for b in range(c0, c1)]
    text = range_label(scene.grid.blocks[inside].reshape(-1).tolist())
    if len(text) * 5.6 + 6 <= w and h >= 11:
        svg.text(x + w / 2, y + h / 2 + 3.5, text, text_anchor="middle", font_size=9, fill="#111")


def _draw_rank(svg: Svg, scene: _Scene, panels: list[_Panel]) -> None:
    """A black frame around every cell holding ``rank``."""
    grid, geo, c = scene.grid, scene.geo, scene.geo.cell
    per_panel = geo.rows * geo.cols
    for cell in np.flatnonzero((grid.blocks == scene.rank).any(axis=1)).tolist():
        for panel in panels:
            if panel.first <= cell < panel.first + per_panel:
                line, col = geo.where(cell - panel.first)
                svg.rect(
                    panel.x + col * c,
                    panel.y + line * c,
                    c,
                    c,
                    fill="none",
                    stroke="black",
                    stroke_width=2.5,
                )


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
    colours = _colouring(grid, view_groups, rank, view_name, ranks_per_host)
    geo = _geometry(grid, label_limit, wrap)
    legend = _legend(mesh, grid, colours, rank, ranks_per_host)
    head = title or repr(mesh)
    gw, gh = geo.sizes[0]
    width = max(gw, 8.2 * len(head), 7 * max(len(t) for t, _ in legend) + 40) + 2 * MARGIN
    top = MARGIN + 20
    svg = Svg(width, top + gh + 12 + LINE_H * len(legend) + MARGIN)
    svg.parts.append(
        "<style>rect.cell:hover{stroke:#000;stroke-width:2}text{pointer-events:none}</style>"
    )
    svg.text(MARGIN, MARGIN + 8, head, font_size=13, font_weight="bold")
    panels, labels = _panels(geo, grid, MARGIN, top)
    for x, y, text in labels:
        svg.text(x, y, text, font_size=10, fill="#555")
    scene = _Scene(mesh, grid, geo, colours, rank, ranks_per_host)
    for panel in panels:
        _draw_panel(svg, scene, panel)
    if rank is not None:
        _draw_rank(svg, scene, panels)
    svg.legend(MARGIN, top + gh + 12, legend, LINE_H)
    return svg


def _tooltip(scene: _Scene, members: IntArray, gi: int, local: int) -> str:
    mesh, view_name, rph = scene.mesh, scene.colours.view_name, scene.ranks_per_host
    if members.size == 1:
        r = int(members[0])
        text = f"rank {r} · {coord_text(mesh.names, mesh.coordinate(r) or ())}"
    else:
        text = f"ranks {ranks_text(members.tolist())} ({', '.join(scene.grid.merged) or 'block'})"
    if gi >= 0 and view_name:
        text += f" · {view_name} group {gi}" + (f", index {local}" if members.size == 1 else "")
    elif gi == -2:
        text += f" · several {view_name} groups"
    if rph and members.size == 1:
        text += f" · host {int(members[0]) // rph}"
    return text


Legend = list[tuple[str, Swatch | None]]


def _legend(
    mesh: Mesh, grid: _Grid, colours: _Colouring, rank: int | None, ranks_per_host: int | None
) -> Legend:
    out: Legend = [(_axes_note(grid.names), None)]
    if grid.hidden:
        out.append((f"size-1 dims hidden: {', '.join(grid.hidden)}", None))
    if grid.merged:
        out.append((f"each cell is a block of ranks over: {', '.join(grid.merged)}", None))
    if mesh.num_submeshes > 1:
        out.append((f"one of {mesh.num_submeshes} congruent sub-meshes shown", None))
    if colours.groups is not None:
        out += _group_legend(colours, ranks_per_host)
    if rank is not None:
        coord = mesh.coordinate(rank)
        text = f"rank {rank}: {coord_text(mesh.names, coord or ())}"
        if colours.groups is not None and colours.my_group >= 0:
            mine = colours.groups[colours.my_group].tolist()
            text += f"; its group {colours.my_group}: {ranks_text(mine)}"
        out.append((text, ("white", "black", None)))
    return out


def _axes_note(names: Sequence[str]) -> str:
    if len(names) < 2:
        return f"one row: {names[0]}"
    where = f"rows: {names[-2]}, columns: {names[-1]}"
    if len(names) > 2:
        where += f"; panels nested by {', '.join(names[:-2])} (outermost first)"
    return where


def _group_legend(colours: _Colouring, ranks_per_host: int | None) -> Legend:
    assert colours.groups is not None
    n, size = colours.groups.shape
    what = "hosts" if colours.by_host else f"view {colours.view_name or '?'}"
    out: Legend = [(f"{what}: {n} group{'s' * (n != 1)} of {size}", None)]
    shown = min(n, 8)
    for gi in range(shown):
        dash = "5 3" if gi in colours.crossing else None
        swatch = (fill_colour(gi), stroke_colour(gi), dash)
        out.append((f"group {gi}: {ranks_text(colours.groups[gi].tolist())}", swatch))
    if n > shown:
        out.append((f".. {n - shown} more groups (colours repeat; hover a cell for details)", None))
    crossing = len(colours.crossing)
    if crossing:
        out.append(
            (
                f"dashed outline: the group spans several hosts ({crossing}/{n} groups; "
                f"{ranks_per_host} ranks per host)",
                None,
            )
        )
    elif ranks_per_host is not None and not colours.by_host:
        out.append((f"every group in one host ({ranks_per_host} ranks per host)", None))
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
