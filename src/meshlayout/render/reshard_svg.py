"""SVG pictures of a reshard plan: the traffic heat map and what each destination receives.

- :func:`traffic_picture`: source ranks (rows) x destination ranks (columns), each
  cell shaded by the elements sent; local copies outlined (they are not sent).
  Past ``max_cells`` ranks per axis, consecutive ranks are merged into bins.
- :func:`receive_picture`: one panel per destination rank (the first
  ``max_ranks``) with the tensor drawn to scale (dims 0 x 1; a 1-D tensor as one
  row) and every box it receives filled in its sender's colour; local copies are
  dashed.
- :func:`reshard_picture` stacks both; :func:`reshard_svg` is its SVG document.

The heat map itself is generic: :func:`binned_traffic` bins any (src, dst, amount)
columns and :func:`traffic_matrix_picture` draws them (``meshlayout transfer``
draws a whole model's bytes with it, :mod:`meshlayout.render.transfer_svg`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..sharding import ReshardPlan, Transfer, run_boxes
from ._fmt import range_label
from ._svg import Svg, Swatch, fill_colour, stack, stroke_colour

__all__ = [
    "Traffic",
    "binned_traffic",
    "receive_picture",
    "reshard_picture",
    "reshard_svg",
    "short_count",
    "traffic_legend",
    "traffic_matrix_picture",
    "traffic_picture",
]

MARGIN = 16
LINE_H = 16
LOCAL_STROKE = "hsl(140,60%,30%)"
GREY, GREY_STROKE = "#9aa5b1", "#5a6570"


def short_count(n: int) -> str:
    """A count in at most 4-5 characters: ``950``, ``12k``, ``3.4M``, ``1.1G``.

    >>> [short_count(n) for n in (950, 12_345, 3_400_000, 1_100_000_000)]
    ['950', '12k', '3.4M', '1.1G']
    """
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return str(n)


def _bins(ranks: Sequence[int], limit: int) -> tuple[list[list[int]], Any]:
    """Consecutive ranks (sorted) merged into at most ``limit`` bins; (members, bin of rank pos)."""
    n = len(ranks)
    count = min(n, limit)
    of_pos = (np.arange(n, dtype=np.int64) * count) // max(n, 1)
    members: list[list[int]] = [[] for _ in range(count)]
    for r, b in zip(ranks, of_pos.tolist()):
        members[b].append(int(r))
    return members, of_pos


def _shade(value: int, top: int) -> str:
    if value <= 0:
        return "white"
    light = 90 - 58 * (value / top) ** 0.5
    return f"hsl(215,75%,{light:.0f}%)"


@dataclass(frozen=True)
class Traffic:
    """A traffic matrix binned for drawing: rank bins per axis, amounts sent and kept.

    ``unit`` names the amount in tooltips (``elements``, ``bytes``); ``short``
    writes it in a cell (at most about 5 characters).
    """

    rows: list[list[int]]
    cols: list[list[int]]
    sent: Any
    kept: Any
    unit: str = "elements"
    short: Callable[[int], str] = short_count

    @property
    def top(self) -> int:
        """The most one cell sends (0 if nothing is sent)."""
        return int(self.sent.max()) if self.sent.size else 0

    @property
    def binned(self) -> bool:
        """Whether some bin merges several ranks."""
        return any(len(m) > 1 for m in self.rows) or any(len(m) > 1 for m in self.cols)

    @property
    def shade_swatch(self) -> Swatch:
        """The legend swatch of the darkest cell."""
        return (_shade(self.top, self.top or 1), "#999", None)


def binned_traffic(
    src_ranks: Sequence[int],
    dst_ranks: Sequence[int],
    columns: tuple[Any, Any, Any],
    max_cells: int,
    *,
    unit: str = "elements",
    short: Callable[[int], str] = short_count,
) -> Traffic:
    """Amounts sent and kept per (source bin, destination bin).

    ``src_ranks``/``dst_ranks``: sorted global ranks (the axes); ``columns``: int64
    arrays (src rank, dst rank, amount) per transfer, local copies (src == dst)
    included; past ``max_cells`` ranks per axis, consecutive ranks share a bin.
    """
    src, dst, amount = (np.asarray(c, dtype=np.int64) for c in columns)
    rows, row_of = _bins(src_ranks, max_cells)
    cols, col_of = _bins(dst_ranks, max_cells)
    src_pos = np.searchsorted(np.array(src_ranks, dtype=np.int64), src)
    dst_pos = np.searchsorted(np.array(dst_ranks, dtype=np.int64), dst)
    local = src == dst
    sent = np.zeros((len(rows), len(cols)), dtype=np.int64)
    kept = np.zeros_like(sent)
    if len(local):
        np.add.at(sent, (row_of[src_pos[~local]], col_of[dst_pos[~local]]), amount[~local])
        np.add.at(kept, (row_of[src_pos[local]], col_of[dst_pos[local]]), amount[local])
    return Traffic(rows, cols, sent, kept, unit, short)


def _binned_traffic(plan: ReshardPlan, max_cells: int) -> Traffic:
    """Elements sent and kept per (source bin, destination bin) of a reshard plan."""
    arrays = plan.arrays()
    columns = (arrays["src"], arrays["dst"], arrays["numel"])
    return binned_traffic(plan.src_ranks, plan.dst_ranks, columns, max_cells)


def traffic_legend(traffic: Traffic, darkest: str) -> list[tuple[str, Swatch | None]]:
    """The first legend lines under a heat map: the darkest shade, local copies, bins."""
    notes: list[tuple[str, Swatch | None]] = [
        (f"darkest: {darkest}" if traffic.top else "nothing is sent", traffic.shade_swatch),
        ("local copy (kept, not sent)", ("white", LOCAL_STROKE, "4,2")),
    ]
    if traffic.binned:
        notes.append(("consecutive ranks merged into bins (labels: rank ranges)", None))
    return notes


def _traffic_notes(plan: ReshardPlan, traffic: Traffic) -> list[tuple[str, Swatch | None]]:
    """The legend under the heat map: the darkest shade, local copies, bins, totals."""
    notes = traffic_legend(traffic, f"{traffic.top} elements")
    s = plan.summary()
    notes.append(
        (
            f"{s['elements_moved']} elements moved, {s['local_copy_elements']} kept; "
            f"all-gather then slice: {s['allgather_elements']}",
            None,
        )
    )
    return notes


def _column_labels(svg: Svg, cols: list[list[int]], left: float, top_y: float, cell: float) -> None:
    """Destination rank ranges above the columns (every few columns when cells are small)."""
    every_col = max(1, int(np.ceil(30 / cell)))
    for j, members in enumerate(cols):
        if j % every_col == 0:
            x = left + j * cell + cell / 2
            svg.text(x, top_y - 6, range_label(members), text_anchor="middle", font_size=9)


def _traffic_cell(
    svg: Svg,
    x: float,
    y: float,
    cell: float,
    src: list[int],
    dst: list[int],
    n: int,
    k: int,
    traffic: Traffic,
) -> None:
    """One cell: shaded by the amount ``n`` sent, outlined if ``k`` are kept locally."""
    top, short = traffic.top, traffic.short
    tip = f"rank {range_label(src)} -> rank {range_label(dst)}: {n} {traffic.unit}"
    if k:
        tip += f"; {k} kept locally"
    svg.rect(x, y, cell, cell, tip, fill=_shade(n, top or 1), stroke="#ddd", class_="cell")
    if k:
        svg.rect(
            x + 1.5,
            y + 1.5,
            cell - 3,
            cell - 3,
            fill="none",
            stroke=LOCAL_STROKE,
            stroke_width=2,
            stroke_dasharray="4,2",
            class_="local",
        )
    label = short(n) if n else (f"({short(k)})" if k else "")
    if label and cell >= 7 * len(label) + 4 and cell >= 16:
        dark = n and n / (top or 1) > 0.45
        svg.text(
            x + cell / 2,
            y + cell / 2 + 4,
            label,
            text_anchor="middle",
            font_size=10,
            fill="white" if dark else "#222",
        )


def _traffic_rows(svg: Svg, traffic: Traffic, left: float, top_y: float, cell: float) -> None:
    """Every row of the heat map: its source rank range (every few rows) and its cells."""
    every_row = max(1, int(np.ceil(12 / cell)))
    for i, members in enumerate(traffic.rows):
        y = top_y + i * cell
        if i % every_row == 0:
            svg.text(
                left - 6, y + cell / 2 + 4, range_label(members), text_anchor="end", font_size=9
            )
        for j, dst_members in enumerate(traffic.cols):
            n, k = int(traffic.sent[i, j]), int(traffic.kept[i, j])
            _traffic_cell(svg, left + j * cell, y, cell, members, dst_members, n, k, traffic)


def traffic_matrix_picture(
    traffic: Traffic, head: str, notes: Sequence[tuple[str, Swatch | None]]
) -> Svg:
    """A binned traffic matrix as a heat map under ``head``, with ``notes`` as its legend."""
    rows, cols = traffic.rows, traffic.cols
    cell = max(6.0, min(40.0, 520.0 / max(len(rows), len(cols), 1)))
    label_w = 7 * max([len(range_label(m)) for m in rows] + [3]) + 8
    left = MARGIN + label_w
    top_y = MARGIN + 44
    width = max(left + cell * len(cols), 8.2 * len(head), 7 * max(len(t) for t, _ in notes) + 40)
    height = top_y + cell * len(rows) + 20 + LINE_H * len(notes) + MARGIN
    svg = Svg(width + 2 * MARGIN, height)
    svg.parts.append("<style>rect.cell:hover{stroke:#000;stroke-width:2}</style>")
    svg.text(MARGIN, MARGIN + 8, head, font_size=13, font_weight="bold")
    svg.text(MARGIN, MARGIN + 24, "source \\ destination", fill="#555")
    _column_labels(svg, cols, left, top_y, cell)
    _traffic_rows(svg, traffic, left, top_y, cell)
    end = svg.legend(MARGIN, top_y + cell * len(rows) + 22, notes, LINE_H)
    svg.height = end - LINE_H + MARGIN
    return svg


def traffic_picture(plan: ReshardPlan, *, max_cells: int = 48, title: str | None = None) -> Svg:
    """The traffic matrix as a heat map (see the module docstring).

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Shard, ShardingSpec, reshard_plan
    >>> src = ShardingSpec((8, 6), Mesh({"dp": 4}), [Shard(0)])
    >>> dst = ShardingSpec((8, 6), Mesh({"tp": 2}, ranks=[2, 3]), [Shard(1)])
    >>> svg = traffic_picture(reshard_plan(src, dst)).to_string()
    >>> svg.count('class="cell"'), svg.count('class="local"')
    (8, 2)
    """
    if max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")
    traffic = _binned_traffic(plan, max_cells)
    head = title or "elements sent: source rank (rows) -> destination rank (columns)"
    return traffic_matrix_picture(traffic, head, _traffic_notes(plan, traffic))


def _drawn_dims(shape: tuple[int, ...]) -> tuple[int | None, int | None]:
    """(row dim or None, column dim or None) of the tensor drawing."""
    if not shape:
        return None, None
    if len(shape) == 1:
        return None, 0
    return 0, 1


@dataclass(frozen=True)
class _TensorDrawing:
    """How the tensor is drawn in every panel: the drawn dims, the scale, the drawn size."""

    rdim: int | None
    cdim: int | None
    scale: float
    width: float
    height: float

    @classmethod
    def of(cls, shape: tuple[int, ...], panel: float) -> _TensorDrawing:
        """Dims 0 x 1 (a 1-D tensor as one row) scaled to fit ``panel`` points."""
        rdim, cdim = _drawn_dims(shape)
        n_rows = shape[rdim] if rdim is not None else 1
        n_cols = shape[cdim] if cdim is not None else 1
        scale = min(panel / max(n_cols, 1), (panel if rdim is not None else 28) / max(n_rows, 1))
        return cls(rdim, cdim, scale, max(n_cols * scale, 1), max(n_rows * scale, 1))

    def box(
        self,
        svg: Svg,
        box: tuple[tuple[int, int], ...],
        origin: tuple[float, float],
        style: tuple[str, str, str | None],
        tip: str,
        cls: str,
    ) -> tuple[float, float]:
        """Draw ``box`` (projected on the drawn dims) at ``origin``; returns its drawn (w, h).

        ``style`` is (fill, stroke, dash or None).
        """
        gx, gy = origin
        fill, stroke, dash = style
        a, b = _span(box, self.rdim)
        c, d = _span(box, self.cdim)
        w, h = (d - c) * self.scale, (b - a) * self.scale
        svg.rect(
            gx + c * self.scale,
            gy + a * self.scale,
            max(w, 0.5),
            max(h, 0.5),
            tip,
            fill=fill,
            stroke=stroke,
            stroke_width=1.5 if dash else 0.8,
            stroke_dasharray=dash,
            class_=cls,
        )
        return w, h


def _receive_notes(plan: ReshardPlan, drawing: _TensorDrawing, shown: int) -> list[str]:
    """Notes on what the panels leave out: 0-d or projected tensors, ranks not drawn."""
    shape = plan.dst_spec.global_shape
    notes: list[str] = []
    if drawing.rdim is None and drawing.cdim is None:
        notes.append("0-d tensor: nothing to draw")
    elif len(shape) > 2:
        notes.append(f"dims 0 x 1 drawn; dims 2.. of shape {shape} are projected")
    if len(plan.dst_ranks) > shown:
        notes.append(f".. {len(plan.dst_ranks) - shown} more destination ranks not drawn")
    return notes


@dataclass
class _Receives:
    """What :func:`receive_picture` draws, gathered panel by panel for the legend."""

    plan: ReshardPlan
    drawing: _TensorDrawing
    max_boxes: int
    src_index: dict[int, int]
    svg: Svg = field(default_factory=lambda: Svg(0, 0))
    senders: dict[int, None] = field(default_factory=dict)  # in order of first drawing
    many: bool = False  # some panel had too many boxes to draw one by one

    def panel(self, dst: int, x0: float, y0: float) -> None:
        """Destination ``dst``'s panel at ``(x0, y0)``: a heading, the tensor, its boxes."""
        plan, drawing, svg = self.plan, self.drawing, self.svg
        shape = plan.dst_spec.global_shape
        recv = plan.receives(dst)
        kept = plan.local_copies(dst)
        n_recv = sum(t.numel for t in recv)
        n_kept = sum(t.numel for t in kept)
        svg.text(x0, y0 + 12, f"rank {dst}: receives {n_recv}, keeps {n_kept}", font_size=10)
        origin = (x0, y0 + 20)
        tip = f"tensor {shape}"
        svg.rect(*origin, drawing.width, drawing.height, tip, fill="#f3f3f3", stroke="#999")
        boxes = kept + recv
        if len(boxes) > self.max_boxes:
            self._grey_piece(dst, recv, origin)
            boxes = kept
        for t in boxes:
            self._transfer_box(dst, t, origin)

    def _grey_piece(self, dst: int, recv: Sequence[Transfer], origin: tuple[float, float]) -> None:
        """Too many boxes to tell apart: the rank's piece in grey (local copies go on top)."""
        self.many = True
        note = f"{len(recv)} boxes, {len({t.src_rank for t in recv})} senders"
        for rb in run_boxes(self.plan.dst_spec, dst):
            tip = f"rank {dst}: {note} (too many to draw)"
            self.drawing.box(self.svg, rb.box, origin, (GREY, GREY_STROKE, None), tip, "box many")
        gx, gy = origin
        self.svg.text(gx, gy + self.drawing.height + 12, note + " (grey)", font_size=9, fill="#555")

    def _transfer_box(self, dst: int, t: Transfer, origin: tuple[float, float]) -> None:
        """One box ``dst`` receives (or keeps), in its sender's colour, labelled if it fits."""
        i = self.src_index.get(t.src_rank, 0)
        if not t.is_local:
            self.senders.setdefault(t.src_rank)
        what = "kept (local copy)" if t.is_local else f"from rank {t.src_rank}"
        style = (
            fill_colour(i),
            LOCAL_STROKE if t.is_local else stroke_colour(i),
            "4,2" if t.is_local else None,
        )
        tip = f"rank {dst}: box {t.box} {what} ({t.numel} elements)"
        cls = "box local" if t.is_local else "box"
        w, h = self.drawing.box(self.svg, t.box, origin, style, tip, cls)
        label = "kept" if t.is_local else f"r{t.src_rank}"
        (a, _), (c, _) = _span(t.box, self.drawing.rdim), _span(t.box, self.drawing.cdim)
        if w >= 6.5 * len(label) + 4 and h >= 13:
            gx, gy = origin
            scale = self.drawing.scale
            self.svg.text(gx + c * scale + 3, gy + a * scale + 11, label, font_size=9, fill="#111")

    def legend(self, notes: Sequence[str]) -> list[tuple[str, Swatch | None]]:
        """The notes, the first senders' colours, grey and local-copy swatches."""
        entries: list[tuple[str, Swatch | None]] = [(n, None) for n in notes]
        listed = sorted(self.senders)[:24]
        colour = [self.src_index.get(r, 0) for r in listed]
        entries += [
            (f"sent by rank {r}", (fill_colour(i), stroke_colour(i), None))
            for r, i in zip(listed, colour)
        ]
        if len(self.senders) > len(listed):
            entries.append((f".. {len(self.senders) - len(listed)} more senders", None))
        if self.many:
            text = "grey: from too many senders to draw one by one"
            entries.append((text, (GREY, GREY_STROKE, None)))
        entries.append(
            ("kept: a local copy (the rank already holds it)", ("white", LOCAL_STROKE, "4,2"))
        )
        return entries


def receive_picture(
    plan: ReshardPlan,
    *,
    max_ranks: int = 8,
    max_boxes: int = 256,
    panel: float = 220,
    title: str | None = None,
) -> Svg:
    """One panel per destination rank: the boxes it receives, coloured by sender.

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Shard, ShardingSpec, reshard_plan
    >>> src = ShardingSpec((8, 6), Mesh({"dp": 4}), [Shard(0)])
    >>> dst = ShardingSpec((8, 6), Mesh({"tp": 2}, ranks=[2, 3]), [Shard(1)])
    >>> svg = receive_picture(reshard_plan(src, dst)).to_string()
    >>> svg.count('class="box"'), svg.count('class="box local"')
    (6, 2)
    """
    if max_ranks < 1 or max_boxes < 1:
        raise ValueError(f"max_ranks and max_boxes must be >= 1, got {max_ranks}, {max_boxes}")
    shape = plan.dst_spec.global_shape
    drawing = _TensorDrawing.of(shape, panel)
    shown = list(plan.dst_ranks[:max_ranks])
    pw, ph = max(drawing.width, 200) + 30, drawing.height + 46
    per_row = max(1, int(900 // pw))
    head = title or f"boxes each destination rank receives, coloured by sender (tensor {shape})"
    notes = _receive_notes(plan, drawing, len(shown))
    src_index = {r: i for i, r in enumerate(plan.src_ranks)}
    receives = _Receives(plan, drawing, max_boxes, src_index)
    n_panels = len(shown) if drawing.cdim is not None else 0
    top = MARGIN + 26
    body_h = -(-n_panels // per_row) * ph
    for k, dst in enumerate(shown[:n_panels]):
        receives.panel(dst, MARGIN + (k % per_row) * pw, top + (k // per_row) * ph)
    entries = receives.legend(notes)
    width = max(MARGIN * 2 + min(n_panels, per_row) * pw, 8.2 * len(head) + 2 * MARGIN, 420)
    height = top + body_h + 10 + LINE_H * len(entries) + MARGIN
    svg = Svg(width, height)
    svg.parts.append("<style>rect.box:hover{stroke:#000;stroke-width:2}</style>")
    svg.text(MARGIN, MARGIN + 8, head, font_size=13, font_weight="bold")
    svg.parts.extend(receives.svg.parts)
    end = svg.legend(MARGIN, top + body_h + 14, entries, LINE_H)
    svg.height = end - LINE_H + MARGIN
    return svg


def _span(box: tuple[tuple[int, int], ...], dim: int | None) -> tuple[int, int]:
    return box[dim] if dim is not None else (0, 1)


def reshard_picture(plan: ReshardPlan, **options: Any) -> Svg:
    """:func:`traffic_picture` above :func:`receive_picture` (options go to the latter)."""
    return stack([traffic_picture(plan), receive_picture(plan, **options)])


def reshard_svg(plan: ReshardPlan, **options: Any) -> str:
    """SVG document of :func:`reshard_picture`.

    >>> from meshlayout import Mesh
    >>> from meshlayout.sharding import Shard, ShardingSpec, reshard_plan
    >>> plan = reshard_plan(
    ...     ShardingSpec((4,), Mesh((2,)), [Shard(0)]), ShardingSpec((4,), Mesh((4,)), [Shard(0)])
    ... )
    >>> reshard_svg(plan).startswith("<svg")
    True
    """
    return reshard_picture(plan, **options).to_string()
