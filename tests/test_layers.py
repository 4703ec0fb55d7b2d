"""The layer rule of DESIGN.md: a module never imports a module of a higher layer.

Every ``import``/``from ... import`` in ``src/meshlayout`` (also the lazy ones inside
functions) is resolved to a meshlayout module and checked against this table.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "meshlayout"

#: Layer of each top-level module or sub-package of meshlayout.
LAYERS = {
    "inttuple": 1,
    "layout": 1,
    "rank_map": 2,
    "mesh": 2,
    "sharding": 2,
    "parallel_dims": 3,
    "megatron": 3,
    "torchtitan_names": 3,
    "render": 3,
    "cli": 4,
    "cli_args": 4,
    "demo": 4,
    "torch": 4,
}
PURE_LAYERS = 3  # layers 1..3 must not import torch at module level


def _module_of(path: Path, root: Path = SRC) -> tuple[str, ...]:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path, root: Path = SRC) -> list[tuple[str, bool]]:
    """(absolute dotted name, at module level?) of every import in ``path``."""
    tree = ast.parse(path.read_text())
    package = ("meshlayout", *_module_of(path, root))
    if path.name != "__init__.py":
        package = package[:-1]
    top_level = {id(node) for node in tree.body}
    out: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, id(node) in top_level) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                name = ".".join(base + ((node.module,) if node.module else ()))
            else:
                name = node.module or ""
            if node.module is None:  # from . import x, y
                out.extend((f"{name}.{a.name}", id(node) in top_level) for a in node.names)
            else:
                out.append((name, id(node) in top_level))
    return out


FILES = sorted(SRC.rglob("*.py"))


def test_every_module_has_a_layer() -> None:
    tops = {_module_of(f)[0] for f in FILES if _module_of(f)}
    assert tops <= set(LAYERS), f"modules without a layer: {sorted(tops - set(LAYERS))}"


def violations(path: Path, root: Path = SRC) -> list[str]:
    """Every import in ``path`` that breaks the layer rule."""
    mod = _module_of(path, root)
    own = LAYERS[mod[0]] if mod else PURE_LAYERS  # the package __init__ re-exports 1-3
    found = []
    for name, at_top in _imports(path, root):
        parts = name.split(".")
        if parts[0] == "meshlayout" and len(parts) > 1 and LAYERS[parts[1]] > own:
            found.append(f"{path.name} (layer {own}) imports {name} (layer {LAYERS[parts[1]]})")
        if parts[0] == "torch" and at_top and own <= PURE_LAYERS:
            found.append(f"{path.name} (layer {own}) imports torch at module level")
    return found


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_import_reaches_a_higher_layer(path: Path) -> None:
    assert violations(path) == []


def test_the_checker_catches_planted_violations(tmp_path: Path) -> None:
    root = tmp_path / "meshlayout"
    (root / "sharding").mkdir(parents=True)
    (root / "layout.py").write_text("from .mesh import Mesh\n")
    (root / "sharding" / "_spec.py").write_text(
        "import torch\n\ndef f():\n    from ..parallel_dims import ParallelDims\n"
    )
    (root / "mesh.py").write_text("def f():\n    import torch\n")  # lazy torch: allowed
    assert violations(root / "layout.py", root) == [
        "layout.py (layer 1) imports meshlayout.mesh (layer 2)"
    ]
    assert violations(root / "sharding" / "_spec.py", root) == [
        "_spec.py (layer 2) imports torch at module level",
        "_spec.py (layer 2) imports meshlayout.parallel_dims (layer 3)",
    ]
    assert violations(root / "mesh.py", root) == []
