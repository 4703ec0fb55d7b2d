"""SVG picture of a whole-model transfer plan: the rank-to-rank byte matrix.

The heat map of :mod:`meshlayout.render.reshard_svg` (source ranks as rows,
destination ranks as columns, consecutive ranks binned past ``max_cells``), shaded
by the bytes each pair moves summed over every tensor and round; bytes a rank keeps
(it already holds them) are outlined, not shaded. The legend gives the totals.
Input is plain columns, so this stays pure (no plan object, no torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._svg import Svg
from .reshard_svg import binned_traffic, traffic_legend, traffic_matrix_picture

__all__ = ["byte_text", "short_bytes", "transfer_picture"]


def byte_text(n: int) -> str:
    """Bytes in binary units with one decimal: ``512 B``, ``1.5 KiB``, ``32.0 MiB``.

    >>> byte_text(512), byte_text(1536), byte_text(3 * 2**40)
    ('512 B', '1.5 KiB', '3.0 TiB')
    """
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def short_bytes(n: int) -> str:
    """Bytes in at most 5 characters for a heat-map cell: ``512B``, ``12K``, ``3.4M``, ``1.1G``.

    >>> [short_bytes(n) for n in (512, 12 * 2**10, 3.4 * 2**20, 1.1 * 2**30)]
    ['512B', '12K', '3.4M', '1.1G']
    """
    for unit, size in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.1f}{unit}" if value < 10 else f"{value:.0f}{unit}"
    return f"{int(n)}B"


def transfer_picture(
    src_ranks: Sequence[int],
    dst_ranks: Sequence[int],
    columns: tuple[Any, Any, Any],
    *,
    totals: Sequence[str] = (),
    max_cells: int = 48,
    title: str | None = None,
) -> Svg:
    """The byte matrix of a transfer: ``columns`` = (src rank, dst rank, bytes) arrays.

    Local copies (src == dst) may be included: they are outlined, not shaded.
    ``totals`` are extra legend lines (e.g. bytes moved vs gather-then-broadcast).

    >>> svg = transfer_picture([0, 1], [2, 3], ([0, 0, 1], [2, 3, 3], [64, 64, 128])).to_string()
    >>> svg.count('class="cell"'), "128 bytes" in svg
    (4, True)
    """
    if max_cells < 1:
        raise ValueError(f"max_cells must be >= 1, got {max_cells}")
    src_sorted, dst_sorted = sorted(set(src_ranks)), sorted(set(dst_ranks))
    traffic = binned_traffic(
        src_sorted, dst_sorted, columns, max_cells, unit="bytes", short=short_bytes
    )
    notes = traffic_legend(traffic, f"{byte_text(traffic.top)} between one pair")
    notes += [(line, None) for line in totals]
    head = title or "bytes sent: source rank (rows) -> destination rank (columns), all tensors"
    return traffic_matrix_picture(traffic, head, notes)
