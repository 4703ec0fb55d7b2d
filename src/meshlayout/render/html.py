"""One self-contained HTML page: text, tables and inline SVG pictures (no network, no scripts)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ._svg import Svg

__all__ = ["Section", "html_page"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:24px;color:#222}
h1{font-size:20px}h2{font-size:16px;margin-top:28px;border-bottom:1px solid #ddd}
pre{background:#f6f8fa;padding:10px;overflow-x:auto;font-size:12px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 8px;text-align:left}
th{background:#f0f3f7}tr:hover td{background:#fffbe6}
.pic{overflow-x:auto}.pic svg{max-width:none}
p.note{color:#7a4b00;background:#fff4e0;padding:6px 10px}
"""


@dataclass
class Section:
    """A heading with any of: paragraphs of notes, a table, preformatted text, pictures."""

    heading: str
    notes: Sequence[str] = ()
    table: Sequence[Sequence[str]] = ()
    text: str = ""
    pictures: Sequence[Svg] = ()


def _table(rows: Sequence[Sequence[str]]) -> str:
    head, *body = rows
    out = ["<table><tr>" + "".join(f"<th>{escape(c)}</th>" for c in head) + "</tr>"]
    for r in body:
        out.append("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>")
    return "\n".join(out) + "</table>"


def html_page(title: str, sections: Sequence[Section]) -> str:
    """A complete HTML document; hover a cell of a picture for its details (SVG titles).

    >>> page = html_page("t", [Section("s", notes=["n"], text="x < y")])
    >>> "x &lt; y" in page and "http" not in page
    True
    """
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        "<p>Hover a cell for its rank, coordinate and group.</p>",
    ]
    for s in sections:
        parts.append(f"<h2>{escape(s.heading)}</h2>")
        parts += [f'<p class="note">{escape(n)}</p>' for n in s.notes]
        if s.table:
            parts.append(_table(s.table))
        if s.text:
            parts.append(f"<pre>{escape(s.text)}</pre>")
        for pic in s.pictures:
            parts.append(f'<div class="pic">{pic.to_string(standalone=False)}</div>')
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
