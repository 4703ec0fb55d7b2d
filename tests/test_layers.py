"""The layer rule (docs/design.md): a module never imports a module of a higher layer,
and no two modules import each other, directly or through others (no import cycle).

Every ``import``/``from ... import`` in ``src/meshlayout`` (also the lazy ones inside
functions and methods) and every ``importlib.import_module(...)`` / ``__import__(...)``
call is resolved to a meshlayout module and checked against this table. A dynamic
import whose module name is not a string literal cannot be checked and is refused.
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
    "demo": 4,
    "torch": 4,
    "vllm": 4,
}
PURE_LAYERS = 3  # layers 1..3 must not import torch at module level


def _module_of(path: Path, root: Path = SRC) -> tuple[str, ...]:
    rel = path.relative_to(root).with_suffix("")
    parts = rel.parts
    return parts[:-1] if parts[-1] == "__init__" else parts


def _imports(path: Path, root: Path = SRC) -> list[tuple[str, bool]]:
    """(absolute dotted name, at module level?) of every import in ``path``.

    A dynamic import with a computed name is reported as ``"<dynamic>"``.
    """
    tree = ast.parse(path.read_text())
    package = ("meshlayout", *_module_of(path, root))
    if path.name != "__init__.py":
        package = package[:-1]
    top_level = _run_at_import(tree)
    out: list[tuple[str, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, id(node) in top_level) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            name = _resolve(node.module or "", node.level, package)
            if node.module is None:  # from . import x, y
                out.extend((f"{name}.{a.name}", id(node) in top_level) for a in node.names)
            else:
                out.append((name, id(node) in top_level))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node.func):
            target = node.args[0] if node.args else None
            if isinstance(target, ast.Constant) and isinstance(target.value, str):
                text = target.value
                level = len(text) - len(text.lstrip("."))
                out.append((_resolve(text[level:], level, package), id(node) in top_level))
            else:
                out.append(("<dynamic>", id(node) in top_level))
    return out


def _run_at_import(tree: ast.Module) -> set[int]:
    """Ids of the nodes executed when the module is imported: outside function bodies
    and outside ``if TYPE_CHECKING:`` blocks."""
    out: set[int] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        out.add(id(node))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def _resolve(module: str, level: int, package: tuple[str, ...]) -> str:
    """The absolute name of ``from <level dots><module> import ...`` inside ``package``."""
    if not level:
        return module
    base = package[: len(package) - level + 1]
    return ".".join(base + ((module,) if module else ()))


def _is_dynamic_import(func: ast.expr) -> bool:
    """``importlib.import_module``, ``import_module``, ``__import__`` (any receiver)."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__")


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
        if name == "<dynamic>":
            found.append(f"{path.name} (layer {own}) imports a computed module name")
            continue
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


def test_the_checker_catches_dynamic_and_lazy_upward_imports(tmp_path: Path) -> None:
    root = tmp_path / "meshlayout"
    root.mkdir()
    (root / "parallel_dims.py").write_text(
        "import importlib\n\n"
        "class ParallelDims:\n"
        "    def build(self):\n"
        '        return importlib.import_module("meshlayout.torch").build(self)\n'
        "    def lazy(self):\n"
        "        from .torch import build\n"
        "        return build(self)\n"
        "    def dunder(self):\n"
        '        return __import__("meshlayout.cli")\n'
        "    def relative(self):\n"
        '        return importlib.import_module(".demo", __package__)\n'
        "    def computed(self, name):\n"
        "        return importlib.import_module(name)\n"
    )
    (root / "mesh.py").write_text(
        'import importlib\nnp = importlib.import_module("numpy")\n'
        "if TYPE_CHECKING:\n    import torch\n"
    )
    (root / "layout.py").write_text('import importlib\nt = importlib.import_module("torch")\n')
    assert violations(root / "parallel_dims.py", root) == [
        "parallel_dims.py (layer 3) imports meshlayout.torch (layer 4)",
        "parallel_dims.py (layer 3) imports meshlayout.cli (layer 4)",
        "parallel_dims.py (layer 3) imports meshlayout.demo (layer 4)",
        "parallel_dims.py (layer 3) imports a computed module name",
        "parallel_dims.py (layer 3) imports meshlayout.torch (layer 4)",
    ]
    assert violations(root / "mesh.py", root) == []  # not meshlayout; torch only for typing
    assert violations(root / "layout.py", root) == [
        "layout.py (layer 1) imports torch at module level"
    ]


# ---------------------------------------------------------------------- sealed packages

#: Packages used from outside through their public names only (their ``__init__``):
#: a module outside the package never imports one of its ``_private`` modules.
SEALED = ("meshlayout.torch.transfer",)

#: (importer, private module) allowed anyway, and why.
SEALED_ALLOWED = {
    # Bounded names SyncGroup for typing only; the package's __init__ imports
    # _collectives, so importing the package from there would close a cycle.
    ("meshlayout.torch._collectives", "meshlayout.torch.transfer._sync"),
}


def _imported_names(path: Path, root: Path = SRC) -> list[str]:
    """``pkg.name`` for every ``from pkg import name`` in ``path`` (absolute names)."""
    package = ("meshlayout", *_module_of(path, root))
    if path.name != "__init__.py":
        package = package[:-1]
    return [
        f"{_resolve(node.module or '', node.level, package)}.{alias.name}"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and node.module is not None
        for alias in node.names
    ]


def sealed_violations(path: Path, root: Path = SRC) -> list[str]:
    """Every import in ``path`` of a private module of a sealed package it is not in
    (``from package._module import x``, ``from package import _module``, dynamic)."""
    me = _module_name(path, root)
    found = []
    names = [name for name, _ in _imports(path, root)] + _imported_names(path, root)
    for name in dict.fromkeys(names):
        for package in SEALED:
            inside = me == package or me.startswith(package + ".")
            rest = name.removeprefix(package + ".")
            if inside or rest == name or not rest.startswith("_"):
                continue
            private = f"{package}.{rest.split('.')[0]}"
            if (me, private) not in SEALED_ALLOWED:
                found.append(f"{me} imports {private}: use {package}'s public names")
    return list(dict.fromkeys(found))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_sealed_packages_are_used_through_their_public_names(path: Path) -> None:
    assert sealed_violations(path) == []


def test_the_sealed_checker_catches_a_private_import(tmp_path: Path) -> None:
    root = tmp_path / "meshlayout"
    (root / "vllm").mkdir(parents=True)
    (root / "torch" / "transfer").mkdir(parents=True)
    (root / "torch" / "checkpoint").mkdir()
    (root / "vllm" / "_worker.py").write_text(
        "from ..torch.transfer import open_store\n"  # public: fine
        "from ..torch.transfer._meta import dtype_of\n"
        "def f():\n"
        "    from ..torch.transfer import _sync\n"
        '    return __import__("meshlayout.torch.transfer._execute")\n'
    )
    (root / "torch" / "checkpoint" / "_plan.py").write_text(
        "from ..transfer._fingerprint import Fingerprinter\n"
    )
    (root / "torch" / "transfer" / "_execute.py").write_text("from ._meta import exchange\n")
    assert sealed_violations(root / "vllm" / "_worker.py", root) == [
        f"meshlayout.vllm._worker imports meshlayout.torch.transfer.{m}: use "
        "meshlayout.torch.transfer's public names"
        for m in ("_meta", "_execute", "_sync")
    ]
    assert sealed_violations(root / "torch" / "checkpoint" / "_plan.py", root) == [
        "meshlayout.torch.checkpoint._plan imports meshlayout.torch.transfer._fingerprint: "
        "use meshlayout.torch.transfer's public names"
    ]
    assert sealed_violations(root / "torch" / "transfer" / "_execute.py", root) == []


# ---------------------------------------------------------------------- import cycles


def _module_name(path: Path, root: Path) -> str:
    return ".".join(("meshlayout", *_module_of(path, root)))


def import_graph(root: Path = SRC) -> dict[str, set[str]]:
    """Module -> the meshlayout modules it imports (lazy imports too).

    A package's ``__init__`` is the module named like the package. ``from pkg import
    name`` points at ``pkg.name`` when that is a module, else at ``pkg``; importing a
    submodule is an edge to the submodule only (its package's ``__init__`` runs
    first, but that is not a dependency of the importing module's code).
    """
    files = sorted(root.rglob("*.py"))
    modules = {_module_name(f, root) for f in files}
    graph: dict[str, set[str]] = {}
    for f in files:
        me = _module_name(f, root)
        targets = set()
        for name, _ in _imports(f, root):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != me and name.startswith("meshlayout"):
                targets.add(name)
        graph[me] = targets
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_import_cycle_between_modules() -> None:
    assert import_cycles(import_graph()) == []


def test_the_cycle_checker_catches_a_planted_cycle(tmp_path: Path) -> None:
    root = tmp_path / "meshlayout"
    (root / "cli").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "cli" / "__init__.py").write_text("from .main import main\n")
    (root / "cli" / "main.py").write_text("from . import plan\n\ndef main(): ...\n")
    (root / "cli" / "output.py").write_text("def emit(): ...\n")
    # a lazy import back into the registry closes plan -> main -> plan
    (root / "cli" / "plan.py").write_text(
        "from .output import emit\n\ndef run():\n    from .main import main\n"
    )
    (root / "mesh.py").write_text("from .rank_map import RankMap\n")
    (root / "rank_map.py").write_text("from . import mesh\n")  # a second, separate cycle
    graph = import_graph(root)
    assert graph["meshlayout.cli.plan"] == {"meshlayout.cli.output", "meshlayout.cli.main"}
    assert import_cycles(graph) == [
        ["meshlayout.cli.main", "meshlayout.cli.plan"],
        ["meshlayout.mesh", "meshlayout.rank_map"],
    ]
    (root / "cli" / "plan.py").write_text("from .output import emit\n")  # the cycle broken
    (root / "rank_map.py").write_text("")
    assert import_cycles(import_graph(root)) == []
