"""SVG picture of a sharding: tensor cells coloured by the ranks holding them, runs outlined.

A 2-D tensor is drawn as rows x columns, a 1-D tensor as one row; for more dims
the first two are drawn. Up to ``cell_limit`` elements per dim every element is
a cell; beyond that the tensor is drawn to scale as blocks between run bounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..sharding import ShardingSpec
from ._fmt import coord_text, held_by_text, runs_text
from ._svg import Svg, fill_colour, stroke_colour
from .reports import check_size, placement_text, runs_bound
from .torch_view import torch_spec_runs

__all__ = ["sharding_picture", "sharding_svg"]

MARGIN = 16
LINE_H = 16
Run = tuple[int, int]
RunsOf = Callable[[int], Sequence[Sequence[Run]]]


def _bounds(n: int, runs: list[Sequence[Run]]) -> list[int]:
    cuts = {0, n}
    for rs in runs:
        for a, b in rs:
            cuts.update((a, b))
    return sorted(cuts)


@dataclass
class _Pieces:
    """What each rank holds of the drawn (first two) dims, cut into blocks between run bounds."""

    ranks: list[int]
    pieces: dict[int, tuple[Sequence[Run], Sequence[Run]]]  # rank -> (row runs, column runs)
    row_bounds: list[int]
    col_bounds: list[int]
    holders: dict[tuple[int, int], list[int]]  # block (i, j) -> ranks holding it
    sets: dict[tuple[int, ...], int]  # each distinct holder set -> its colour index
    n_rows: int
    n_cols: int
    drawn_rows: bool  # False: a 1-D tensor drawn as one row
    col_dim: int


def _pieces(spec: ShardingSpec, runs_of: RunsOf) -> _Pieces:
    mesh, shape = spec.mesh, spec.global_shape
    ranks = [int(r) for r in np.asarray(mesh.submeshes()).reshape(-1)]
    col_dim = 0 if len(shape) == 1 else 1
    drawn_rows = len(shape) > 1
    n_rows, n_cols = (shape[0] if drawn_rows else 1), shape[col_dim]

    def rect_runs(r: int) -> tuple[Sequence[Run], Sequence[Run]]:
        runs = runs_of(r)
        rows: Sequence[Run] = runs[0] if drawn_rows else [(0, 1)]
        if any(not runs[d] for d in range(col_dim + 1, len(shape))):
            return [], []  # holds nothing along an undrawn dim
        return rows, runs[col_dim]

    pieces = {r: rect_runs(r) for r in ranks}
    rb = _bounds(n_rows, [p[0] for p in pieces.values()])
    cb = _bounds(n_cols, [p[1] for p in pieces.values()])
    check_size((len(rb) - 1) * (len(cb) - 1), "a sharding picture draws every block", "blocks")
    row_at = {b: i for i, b in enumerate(rb)}
    col_at = {b: j for j, b in enumerate(cb)}
    holders: dict[tuple[int, int], list[int]] = {}
    for r, (rows, cols) in pieces.items():
        for a, b in rows:
            for c, d in cols:
                for i in range(row_at[a], row_at[b]):
                    for j in range(col_at[c], col_at[d]):
                        holders.setdefault((i, j), []).append(r)
    sets: dict[tuple[int, ...], int] = {}
    for key in sorted(holders, key=lambda k: holders[k][0]):
        sets.setdefault(tuple(holders[key]), len(sets))
    return _Pieces(ranks, pieces, rb, cb, holders, sets, n_rows, n_cols, drawn_rows, col_dim)


@dataclass
class _Frame:
    """Scale and origin: element (i, j) is at ``(left + j * sx, top + i * sy)``."""

    cells: bool  # one rectangle per element (else blocks between run bounds, to scale)
    sx: float
    sy: float
    left: float
    top: float


def _frame(p: _Pieces, cell_limit: int, size: float) -> _Frame:
    cells = p.n_rows <= cell_limit and p.n_cols <= cell_limit
    if cells:
        sx = sy = max(14.0, min(40.0, size / max(p.n_rows, p.n_cols, 1)))
    else:
        sx = float(size) / max(p.n_cols, 1)
        sy = min(size / max(p.n_rows, 1), max(sx, 4.0)) if p.drawn_rows else 40.0
    return _Frame(cells, sx, sy, MARGIN + 34, MARGIN + 30)


def _colour(p: _Pieces, key: tuple[int, int]) -> str:
    h = p.holders.get(key)
    return fill_colour(p.sets[tuple(h)]) if h else "white"


def _held(p: _Pieces, key: tuple[int, int]) -> str:
    return held_by_text(p.holders.get(key, []))


def _draw_cells(svg: Svg, p: _Pieces, f: _Frame) -> None:
    """One rectangle per element (and row numbers), coloured by the ranks holding it."""
    for i in range(p.n_rows):
        bi = np.searchsorted(p.row_bounds, i, side="right") - 1
        for j in range(p.n_cols):
            bj = np.searchsorted(p.col_bounds, j, side="right") - 1
            key = (int(bi), int(bj))
            where = f"[{i}, {j}]" if p.drawn_rows else f"[{j}]"
            svg.rect(
                f.left + j * f.sx,
                f.top + i * f.sy,
                f.sx,
                f.sy,
                f"element {where} {_held(p, key)}",
                fill=_colour(p, key),
                stroke="white",
                stroke_width=1,
                class_="cell",
            )
    for i in range(0, p.n_rows, max(1, p.n_rows // 16)) if p.drawn_rows else ():
        y = f.top + i * f.sy + f.sy / 2 + 4
        svg.text(f.left - 4, y, i, text_anchor="end", font_size=9, fill="#555")


def _draw_blocks(svg: Svg, p: _Pieces, f: _Frame) -> None:
    """One rectangle per block between run bounds, to scale."""
    rb, cb = p.row_bounds, p.col_bounds
    every = {(i, j) for i in range(len(rb) - 1) for j in range(len(cb) - 1)}
    for i, j in sorted(set(p.holders) | every):
        svg.rect(
            f.left + cb[j] * f.sx,
            f.top + rb[i] * f.sy,
            (cb[j + 1] - cb[j]) * f.sx,
            (rb[i + 1] - rb[i]) * f.sy,
            f"rows [{rb[i]}:{rb[i + 1]}) cols [{cb[j]}:{cb[j + 1]}) {_held(p, (i, j))}",
            fill=_colour(p, (i, j)),
            stroke="white",
            stroke_width=0.5,
            class_="block",
        )


def _draw_runs(svg: Svg, p: _Pieces, f: _Frame) -> None:
    """One outline per distinct rectangle of runs, labelled with the ranks that hold it."""
    boxes: dict[tuple[Run, Run], list[str]] = {}
    for r, (rows, cols) in p.pieces.items():
        nrun = len(rows) * len(cols)
        for k, (a, b) in enumerate(rows):
            for m, (c, d) in enumerate(cols):
                tag = f"r{r}" + (f"#{k * len(cols) + m + 1}/{nrun}" if nrun > 1 else "")
                boxes.setdefault(((a, b), (c, d)), []).append(tag)
    for ((a, b), (c, d)), tags in boxes.items():
        x, y, w, h = f.left + c * f.sx, f.top + a * f.sy, (d - c) * f.sx, (b - a) * f.sy
        gi = p.sets.get(tuple(int(t[1:].split("#")[0]) for t in tags), 0)
        svg.rect(
            x + 1,
            y + 1,
            w - 2,
            h - 2,
            f"{' '.join(tags)}: rows [{a}:{b}) cols [{c}:{d})",
            fill="none",
            stroke=stroke_colour(gi),
            stroke_width=2,
            class_="run",
        )
        label = ",".join(tags) if len(tags) <= 3 else f"{tags[0]}+{len(tags) - 1}"
        if len(label) * 6.2 + 4 <= w and h >= 13:
            svg.text(x + 4, y + 12, label, font_size=10, font_weight="bold", fill="#111")


def sharding_picture(
    spec: ShardingSpec,
    *,
    torch_view: bool = False,
    title: str | None = None,
    cell_limit: int = 64,
    size: float = 560,
) -> Svg:
    """The picture behind :func:`sharding_svg`, as an :class:`Svg`."""
    check_size(runs_bound(spec), "a sharding picture draws every run of every rank", "runs")
    runs_of: RunsOf = (lambda r: torch_spec_runs(spec, r)) if torch_view else spec.local_runs
    p = _pieces(spec, runs_of)
    f = _frame(p, cell_limit, size)
    mesh, shape = spec.mesh, spec.global_shape
    placements = ", ".join(placement_text(q) for q in spec.placements())
    dims = " x ".join(f"{n}={s}" for n, s in zip(mesh.names, mesh.shape))
    head = title or f"tensor {shape} on {dims}: {placements}"
    if torch_view:
        head += "  (as torch 2.13 computes it)"
    legend = _legend(spec, p.ranks, runs_of, p.sets)
    if len(shape) > 2:
        legend.insert(0, (f"dims 0 x 1 drawn; dims 2.. of shape {shape} not shown", None))
    gw, gh = p.n_cols * f.sx, p.n_rows * f.sy
    width = max(f.left + gw, 8.2 * len(head), 7 * max(len(t) for t, _ in legend) + 40) + 2 * MARGIN
    svg = Svg(width, f.top + gh + 14 + LINE_H * len(legend) + MARGIN)
    svg.parts.append("<style>rect.cell:hover,rect.block:hover{stroke:#000;stroke-width:2}</style>")
    svg.text(MARGIN, MARGIN + 8, head, font_size=13, font_weight="bold")
    axis = f"rows: dim 0 ({p.n_rows}), columns: dim {p.col_dim} ({p.n_cols})"
    svg.text(MARGIN, MARGIN + 24, axis if p.drawn_rows else f"dim 0 ({p.n_cols})", fill="#555")
    (_draw_cells if f.cells else _draw_blocks)(svg, p, f)
    _draw_runs(svg, p, f)
    entries = [
        (text, None if lg is None else (fill_colour(lg), stroke_colour(lg), None))
        for text, lg in legend
    ]
    svg.legend(MARGIN, f.top + gh + 18, entries, LINE_H)
    return svg


def _legend(
    spec: ShardingSpec, ranks: list[int], runs_of: RunsOf, sets: dict[tuple[int, ...], int]
) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    colour_of: dict[int, int] = {}
    for held_by, gi in sets.items():
        for r in held_by:
            colour_of.setdefault(r, gi)
    for r in ranks[:24]:
        runs = runs_of(r)
        where = " x ".join(runs_text(x) for x in runs)
        coord = coord_text(spec.mesh.names, spec.mesh.coordinate(r) or ())
        box = "" if all(len(x) <= 1 for x in runs) else "  (not a box)"
        if any(not x for x in runs):
            box += "  (holds nothing)"
        out.append((f"rank {r} ({coord}): {where}{box}", colour_of.get(r)))
    if len(ranks) > 24:
        out.append((f".. {len(ranks) - 24} more ranks", None))
    return out


def sharding_svg(spec: ShardingSpec, **options: object) -> str:
    """SVG document of ``spec``: cells coloured by holder ranks, every run outlined.

    Options: ``torch_view=True`` draws what torch 2.13's
    ``compute_local_shape_and_global_offset`` assumes; ``title``; ``cell_limit``.

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Shard, ShardingSpec, StridedShard
    >>> spec = ShardingSpec((7, 4), Mesh({"dp": 3, "tp": 2}), [StridedShard(0, 2), Shard(0)])
    >>> svg = sharding_svg(spec)
    >>> svg.count('class="cell"'), svg.count('class="run"')
    (28, 5)
    """
    return sharding_picture(spec, **options).to_string()  # type: ignore[arg-type]
