"""SVG picture of one checkpointed tensor: its saved chunks, coloured by writing rank.

Input is one tensor entry of a checkpoint report (``meshlayout checkpoint --format
json``: name, shape, dtype, chunks with offsets, sizes, file and rank, holes,
overlaps). A 2-D tensor is drawn as rows x columns to scale, a 1-D tensor as one
row; for more dims the first two are drawn (chunks that differ only in later dims
then cover each other, which the caption says). Chunks whose writing rank is not
recorded are coloured by storage file. Holes are drawn dashed red, overlaps red.

>>> entry = {"name": "w", "shape": [4, 2], "dtype": "float32", "tiling": "exact",
...          "chunks": [{"offsets": [0, 0], "sizes": [2, 2], "rank": 0, "file": "__0_0.distcp"},
...                     {"offsets": [2, 0], "sizes": [2, 2], "rank": 1, "file": "__1_0.distcp"}],
...          "holes": [], "overlaps": []}
>>> svg = checkpoint_svg(entry)
>>> svg.startswith("<svg") and "rank 1" in svg
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._svg import Svg, fill_colour, stroke_colour

__all__ = ["checkpoint_picture", "checkpoint_svg"]

MARGIN = 16
LINE_H = 16
HOLE = "#d62728"
_LEGEND_LIMIT = 12


def _rect_of(offsets: Sequence[int], sizes: Sequence[int], ndim: int) -> tuple[int, int, int, int]:
    """(row, col, rows, cols) of a box in the drawn dims."""
    if ndim == 0:
        return 0, 0, 1, 1
    if ndim == 1:
        return 0, int(offsets[0]), 1, int(sizes[0])
    return int(offsets[0]), int(offsets[1]), int(sizes[0]), int(sizes[1])


def _writer(chunk: Mapping[str, Any], i: int) -> tuple[str, str]:
    """(legend key, short label) of a chunk's writer: rank, else file, else chunk index."""
    if chunk.get("rank") is not None:
        return f"rank {chunk['rank']}", f"r{chunk['rank']}"
    if chunk.get("file"):
        return f"file {chunk['file']}", f"#{i}"
    return f"chunk {i}", f"#{i}"


@dataclass(frozen=True)
class _Frame:
    """Where the drawn dims of a tensor go: element scale and the grid's top-left corner."""

    ndim: int
    n_rows: int
    n_cols: int
    sx: float
    sy: float
    top: float

    def place(self, rect: tuple[int, int, int, int]) -> tuple[float, float, float, float]:
        """(x, y, width, height) of a (row, col, rows, cols) rectangle of elements."""
        row, col, rows, cols = rect
        return MARGIN + col * self.sx, self.top + row * self.sy, cols * self.sx, rows * self.sy


def _box_rect(box: Sequence[Sequence[int]], ndim: int) -> tuple[int, int, int, int]:
    """(row, col, rows, cols) of a box given as half-open ``(start, stop)`` per dim."""
    return _rect_of([a for a, _ in box], [b - a for a, b in box], ndim)


def _box_text(box: Sequence[Sequence[int]]) -> str:
    return str(tuple(tuple(iv) for iv in box))


def _notes(entry: Mapping[str, Any], shape: Sequence[int]) -> list[str]:
    """The caption lines: name, shape, dtype, chunk count, tiling; what is drawn of > 2 dims."""
    ndim = len(shape)
    notes = [
        f"{entry['name']}: shape {tuple(shape)} {entry.get('dtype', '')}, "
        f"{len(entry['chunks'])} chunks",
        f"tiling: {entry.get('tiling', '?')}",
    ]
    if ndim > 2:
        notes.append(
            f"dims 0 and 1 drawn; chunks differing only in dims 2..{ndim - 1} overlap here"
        )
    return notes


def _frame(shape: Sequence[int], size: float, n_notes: int) -> _Frame:
    """The drawn grid: dims 0 and 1 (one row for 1-D), at most 40 px an element."""
    ndim = len(shape)
    n_rows = shape[0] if ndim >= 2 else 1
    n_cols = shape[1] if ndim >= 2 else (shape[0] if ndim == 1 else 1)
    sx = min(40.0, size / max(n_cols, 1))
    sy = min(40.0, size / max(n_rows, 1))
    return _Frame(ndim, n_rows, n_cols, sx, sy, MARGIN + LINE_H * n_notes + 4)


def _draw_chunks(svg: Svg, chunks: Sequence[Mapping[str, Any]], frame: _Frame) -> dict[str, int]:
    """One rectangle per non-empty chunk, coloured by writer; the writers' colour indices."""
    keys: dict[str, int] = {}
    for i, chunk in enumerate(chunks):
        row, col, rows, cols = _rect_of(chunk["offsets"], chunk["sizes"], frame.ndim)
        if rows == 0 or cols == 0 or 0 in chunk["sizes"]:
            continue  # an empty chunk holds nothing to draw
        key, label = _writer(chunk, i)
        colour = keys.setdefault(key, len(keys))
        x, y, w, h = frame.place((row, col, rows, cols))
        title = (
            f"chunk {i}: offsets {tuple(chunk['offsets'])}, sizes {tuple(chunk['sizes'])}, "
            f"{key}" + (f", {chunk['file']}" if chunk.get("file") else "")
        )
        svg.rect(
            x, y, w, h, title, fill=fill_colour(colour), stroke=stroke_colour(colour), opacity=0.9
        )
        if w >= 8 * len(label) and h >= 12:
            svg.text(x + w / 2, y + h / 2 + 4, label, text_anchor="middle")
    return keys


def _draw_holes_and_overlaps(svg: Svg, entry: Mapping[str, Any], frame: _Frame) -> None:
    """Holes dashed red over white, then overlaps filled half-transparent red."""
    for box in entry.get("holes", []):
        svg.rect(
            *frame.place(_box_rect(box, frame.ndim)),
            f"hole {_box_text(box)}",
            fill="white",
            stroke=HOLE,
            stroke_width=2,
            stroke_dasharray="4,3",
        )
    for overlap in entry.get("overlaps", []):
        box = overlap["box"]
        i, j = overlap["chunks"]
        svg.rect(
            *frame.place(_box_rect(box, frame.ndim)),
            f"chunks {i} and {j} overlap on {_box_text(box)}",
            fill=HOLE,
            fill_opacity=0.55,
            stroke=HOLE,
            stroke_width=2,
        )


def _legend(
    entry: Mapping[str, Any], keys: Mapping[str, int]
) -> list[tuple[str, tuple[str, str, str | None] | None]]:
    """The first writers' swatches (then their count), and the hole / overlap marks used."""
    legend: list[tuple[str, tuple[str, str, str | None] | None]] = [
        (key, (fill_colour(c), stroke_colour(c), None))
        for key, c in list(keys.items())[:_LEGEND_LIMIT]
    ]
    if len(keys) > _LEGEND_LIMIT:
        legend.append((f"... {len(keys)} writers in all", None))
    if entry.get("holes"):
        legend.append(("hole (no chunk holds it)", ("white", HOLE, "4,3")))
    if entry.get("overlaps"):
        legend.append(("overlap (several chunks hold it)", (HOLE, HOLE, None)))
    return legend


def checkpoint_picture(entry: Mapping[str, Any], *, size: float = 560) -> Svg:
    """The picture behind :func:`checkpoint_svg`, as an :class:`Svg`."""
    shape = [int(n) for n in entry["shape"]]
    notes = _notes(entry, shape)
    frame = _frame(shape, size, len(notes))
    grid_w, grid_h = frame.n_cols * frame.sx, frame.n_rows * frame.sy
    width = max(MARGIN * 2 + grid_w, 360.0, MARGIN * 2 + 7.0 * max(len(n) for n in notes))
    svg = Svg(width, 0)
    for k, note in enumerate(notes):
        svg.text(MARGIN, MARGIN + LINE_H * k + 10, note, font_weight="bold" if k == 0 else None)
    svg.rect(MARGIN, frame.top, grid_w, grid_h, fill="#f4f4f4", stroke="#999")
    keys = _draw_chunks(svg, entry["chunks"], frame)
    _draw_holes_and_overlaps(svg, entry, frame)
    y = svg.legend(MARGIN, frame.top + grid_h + 22, _legend(entry, keys), LINE_H)
    svg.height = y + MARGIN - LINE_H + 8
    return svg


def checkpoint_svg(entry: Mapping[str, Any], *, size: float = 560) -> str:
    """A standalone SVG document of one tensor entry of a checkpoint report."""
    return checkpoint_picture(entry, size=size).to_string()
