"""A short tour of the layout algebra on a realistic 5-D mesh layout (interim demo).

>>> print(table(("a", "bb"), [("1", "2"), ("333", "4")]))
a   | bb
----+---
1   | 2
333 | 4
"""

from __future__ import annotations

from collections.abc import Sequence

from .layout import Layout, logical_divide, make_layout

DIMS: tuple[tuple[str, int], ...] = (
    ("pp", 2),
    ("dp_replicate", 2),
    ("dp_shard", 8),
    ("cp", 2),
    ("tp", 8),
)


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned text table with a header rule."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    rule = "-+-".join("-" * w for w in widths)
    return "\n".join([line(head), rule, *(line(r) for r in rows)])


def preview(lay: Layout, limit: int = 8) -> str:
    """The first values of a layout, e.g. ``0 1 2 … (16)``."""
    values = lay.indices()[:limit].tolist()
    more = f" … ({lay.size()})" if lay.size() > limit else ""
    return " ".join(map(str, values)) + more


def mesh_section(mesh: Layout) -> str:
    rows = [(name, str(size), repr(mode), preview(mode)) for (name, size), mode in zip(DIMS, mesh)]
    return table(("dim", "size", "layout", "ranks of the group of rank 0"), rows)


def algebra_section(mesh: Layout) -> str:
    world = mesh.size()
    dp_shard, cp = mesh[2], mesh[3]
    fsdp = make_layout(dp_shard, cp)
    tp = mesh[4]
    steps: list[tuple[str, Layout]] = [
        ("mesh.coalesce()", mesh.coalesce()),
        ("fsdp = make_layout(dp_shard, cp)", fsdp),
        ("fsdp.coalesce()", fsdp.coalesce()),
        (f"fsdp.complement({world})", fsdp.complement(world)),
        ("dp_shard ∘ (2,4)  (unflatten)", dp_shard.compose(Layout((2, 4)))),
        (f"logical_divide({world}:1, tp)", logical_divide(Layout(world), tp.size())),
        ("tp.right_inverse()", tp.right_inverse()),
    ]
    rows = [(expr, repr(result), str(result.size()), preview(result)) for expr, result in steps]
    return table(("expression", "result", "size", "values"), rows)


def groups_section(mesh: Layout) -> str:
    fsdp = make_layout(mesh[2], mesh[3])
    rest = fsdp.complement(mesh.size())
    groups = make_layout(rest, fsdp).indices().reshape(rest.size(), fsdp.size())
    rows = [(str(g), " ".join(map(str, groups[g].tolist()))) for g in range(3)]
    rows.append(("…", f"({rest.size()} groups of {fsdp.size()})"))
    return table(("fsdp group", "ranks"), rows)


def run() -> None:
    """Print a 5-D mesh layout and its algebra as aligned tables."""
    mesh = Layout(tuple(size for _, size in DIMS))
    names = ", ".join(f"{n}={s}" for n, s in DIMS)
    print(f"Mesh layout for {names}: {mesh}  ({mesh.size()} ranks, tp innermost)\n")
    print(mesh_section(mesh), end="\n\n")
    print(algebra_section(mesh), end="\n\n")
    print(groups_section(mesh))
