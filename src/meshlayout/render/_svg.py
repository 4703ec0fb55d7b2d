"""A tiny SVG writer: escaped elements, group colours, stacking (no dependencies)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from xml.sax.saxutils import escape, quoteattr

__all__ = ["Svg", "Swatch", "esc", "fill_colour", "stack", "stroke_colour"]

FONT = "DejaVu Sans Mono, Menlo, Consolas, monospace"
_GOLDEN = 137.508


def esc(text: object) -> str:
    """``text`` escaped for XML character data."""
    return escape(str(text))


def fill_colour(index: int) -> str:
    """A light fill for group ``index``: golden-angle hues, so neighbours differ."""
    hue = (index * _GOLDEN) % 360
    light = (78, 86, 70)[index % 3]
    return f"hsl({hue:.0f},70%,{light}%)"


def stroke_colour(index: int) -> str:
    """A dark outline in the hue of :func:`fill_colour`."""
    return f"hsl({(index * _GOLDEN) % 360:.0f},65%,30%)"


Swatch = tuple[str, str, str | None]
"""A legend entry's colours: (fill, stroke, stroke dash pattern or None)."""


def _attrs(attrs: dict[str, object]) -> str:
    out = []
    for k, v in attrs.items():
        if v is None:
            continue
        if isinstance(v, float):
            v = f"{v:.2f}".rstrip("0").rstrip(".")
        out.append(f" {k.rstrip('_').replace('_', '-')}={quoteattr(str(v))}")
    return "".join(out)


@dataclass
class Svg:
    """An SVG document under construction; coordinates in pixels."""

    width: float
    height: float
    parts: list[str] = field(default_factory=list)

    def rect(
        self, x: float, y: float, w: float, h: float, title: str | None = None, **attrs: object
    ) -> None:
        a = _attrs({"x": float(x), "y": float(y), "width": float(w), "height": float(h), **attrs})
        if title is None:
            self.parts.append(f"<rect{a}/>")
        else:
            self.parts.append(f"<rect{a}><title>{esc(title)}</title></rect>")

    def text(self, x: float, y: float, content: object, **attrs: object) -> None:
        a = _attrs({"x": float(x), "y": float(y), **attrs})
        self.parts.append(f"<text{a}>{esc(content)}</text>")

    def line(self, x1: float, y1: float, x2: float, y2: float, **attrs: object) -> None:
        a = _attrs({"x1": float(x1), "y1": float(y1), "x2": float(x2), "y2": float(y2), **attrs})
        self.parts.append(f"<line{a}/>")

    def legend(
        self, x: float, y: float, entries: Sequence[tuple[str, Swatch | None]], line_h: float
    ) -> float:
        """One line per entry from baseline ``y``: a swatch and its text, or a plain note.

        Returns the baseline after the last line.
        """
        for text, swatch in entries:
            if swatch is None:
                self.text(x, y, text, fill="#333")
            else:
                fill, stroke, dash = swatch
                self.rect(
                    x,
                    y - 10,
                    14,
                    12,
                    fill=fill,
                    stroke=stroke,
                    stroke_width=2,
                    stroke_dasharray=dash,
                )
                self.text(x + 20, y, text)
            y += line_h
        return y

    def body(self) -> str:
        return "\n".join(self.parts)

    def to_string(self, *, standalone: bool = True) -> str:
        """The complete SVG document; ``standalone=False`` omits the namespace (inline HTML)."""
        w, h = round(self.width), round(self.height)
        ns = ' xmlns="http://www.w3.org/2000/svg"' if standalone else ""
        return (
            f'<svg{ns} width="{w}" height="{h}" '
            f'viewBox="0 0 {w} {h}" font-family="{FONT}" font-size="11">\n'
            f'<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>\n'
            f"{self.body()}\n</svg>\n"
        )


def stack(pictures: Sequence[Svg], gap: float = 24) -> Svg:
    """Pictures one below the other in one document (nested ``<svg>`` elements)."""
    width = max((p.width for p in pictures), default=0)
    out = Svg(width, 0)
    y = 0.0
    for p in pictures:
        out.parts.append(
            f'<svg x="0" y="{y:.0f}" width="{p.width:.0f}" height="{p.height:.0f}">\n{p.body()}\n</svg>'
        )
        y += p.height + gap
    out.height = max(y - gap, 0)
    return out
