"""Every private torch access lives in ``meshlayout/torch/_c10d.py`` (so a torch upgrade
touches one file). The checker reads code, not comments or docstrings, and flags:

* imports of a private torch module (``torch._C``, ``torch.testing._internal``,
  ``torch.distributed._mesh_layout``, ...) or of a private name from torch
  (``from torch... import _StridedShard``), and imports of ``distributed_c10d``;
* attribute chains rooted at a name imported from torch that reach a private
  attribute (``c10d._world``, ``dist.Backend._plugins``, ``DeviceMesh._concatenate``);
* private keyword arguments to torch callables (``DeviceMesh(..., _layout=...)``);
* the private names torch keeps on its objects that meshlayout is known to need
  (``_dim_group_names``, ``_pg_registry``, ``pg_group_ranks``, ...), on any object.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "meshlayout"
HOME = SRC / "torch" / "_c10d.py"

#: Private names on torch objects, whatever the variable holding them is called.
KNOWN_PRIVATE = {
    "_dim_group_names",
    "_pg_registry",
    "_world",
    "pg_group_ranks",
    "pg_map",
    "pg_names",
    "_new_process_group_helper",
    "_get_default_store",
    "_get_default_group",
    "_get_default_timeout",
    "_hash_ranks_to_str",
    "_plugins",
    "_set_default_timeout",
    "_FlatLayout",
    "_MeshLayout",
    "_local_tensor",
    "_StridedShard",
}

#: (file relative to src/meshlayout, private name) allowed outside the home, and why.
ALLOWED = {
    # Layer 2 converts torch placements to and from its own; it cannot import the
    # layer-4 home, and torch has no public name for the strided placement.
    ("sharding/_spec.py", "_StridedShard"),
    ("sharding/_spec.py", "torch.distributed.tensor.placement_types._StridedShard"),
}


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _root(expr: ast.expr) -> str | None:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def private_uses(source: str) -> list[str]:
    """The private torch accesses in ``source`` (code only), as short descriptions."""
    tree = ast.parse(source)
    torch_names: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "torch":
                    torch_names.add((alias.asname or alias.name).split(".")[0])
                    if any(_private(p) or p == "distributed_c10d" for p in alias.name.split(".")):
                        found.append(alias.name)
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level  # ``from .torch... import`` is meshlayout's own package
            and (node.module or "").split(".")[0] == "torch"
        ):
            parts = (node.module or "").split(".")
            for alias in node.names:
                torch_names.add(alias.asname or alias.name)
                if any(_private(p) for p in parts) or _private(alias.name):
                    found.append(f"{node.module}.{alias.name}")
                elif alias.name == "distributed_c10d" or "distributed_c10d" in parts:
                    found.append(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = [node.attr]
            base: ast.expr = node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if node.attr in KNOWN_PRIVATE:
                found.append(node.attr)
            elif isinstance(base, ast.Name) and base.id in torch_names and _private(node.attr):
                found.append(".".join([base.id, *reversed(chain)]))
        elif isinstance(node, ast.Call) and _root(node.func) in torch_names:
            found.extend(f"{k.arg}=" for k in node.keywords if k.arg and _private(k.arg))
        elif isinstance(node, ast.Name) and node.id in KNOWN_PRIVATE:
            found.append(node.id)
    return found


def violations(path: Path) -> list[str]:
    rel = path.relative_to(SRC).as_posix()
    return [
        f"{rel}: {use}"
        for use in dict.fromkeys(private_uses(path.read_text()))
        if (rel, use) not in ALLOWED
    ]


FILES = [f for f in sorted(SRC.rglob("*.py")) if f != HOME]


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SRC)))
def test_no_private_torch_access_outside_c10d(path: Path) -> None:
    assert violations(path) == [], "move these into meshlayout/torch/_c10d.py"


def test_the_home_exists_and_says_which_torch_versions_it_was_checked_on() -> None:
    text = HOME.read_text()
    assert private_uses(text), "the home should hold the private accesses"
    tree = ast.parse(text)
    checked = next(
        ast.literal_eval(node.value)
        for node in tree.body
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "CHECKED_ON" for t in node.targets)
    )
    assert {"2.10.0", "2.13.0", "2.15.0"} <= set(checked)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            doc = ast.get_docstring(node) or ""
            assert "Checked on 2.13.0" in doc, f"{node.name}: say which torch versions"
            missing = [v for v in checked if v not in doc]
            assert not missing, f"{node.name}: not said to be checked on {missing}"


def test_the_checker_catches_planted_private_uses() -> None:
    planted = '''
"""Docstrings may mention c10d._world and _StridedShard freely."""
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d
from torch.distributed._mesh_layout import _MeshLayout
from torch._C._distributed_c10d import Store
from torch.distributed.tensor.placement_types import _StridedShard
import torch.testing._internal.distributed.fake_pg
from torch.distributed.device_mesh import DeviceMesh

def f(tdm, pg):
    # a comment naming _pg_registry is fine
    c10d._get_default_store()
    dist.Backend._plugins
    tdm._dim_group_names = []
    DeviceMesh("cpu", _layout=None)
    return dist.get_rank(), pg.rank(), "_world"
'''
    assert sorted(set(private_uses(planted))) == sorted(
        [
            "torch.distributed.distributed_c10d",
            "torch.distributed._mesh_layout._MeshLayout",
            "torch._C._distributed_c10d.Store",
            "torch.distributed.tensor.placement_types._StridedShard",
            "torch.testing._internal.distributed.fake_pg",
            "_get_default_store",
            "_plugins",
            "_dim_group_names",
            "_layout=",
        ]
    )
    assert private_uses("import torch\nimport torch.distributed as dist\ndist.get_rank()\n") == []
    assert private_uses("def f(x):\n    return g(x, _cols=2), x._rank_map\n") == []  # ours
    assert private_uses("from .torch.checkpoint._inspect import describe\n") == []  # ours
    assert private_uses("import torch\ntorch.cuda._lazy_init()\n") == ["torch.cuda._lazy_init"]


def test_dispatch_mode_sees_an_in_place_copy() -> None:
    """``_c10d.dispatch_mode`` (the vLLM backend records weight loaders' copies with it)
    works on this torch: a mode made from it sees ``copy_`` and its source."""
    torch = pytest.importorskip("torch")
    from meshlayout.torch._c10d import dispatch_mode

    seen: list[tuple[str, object]] = []

    class Recorder(dispatch_mode()):  # type: ignore[misc]
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            seen.append((str(func), args[1] if len(args) > 1 else None))
            return func(*args, **(kwargs or {}))

    dest, src = torch.zeros(3), torch.arange(3.0)
    with Recorder():
        dest.copy_(src)
    assert torch.equal(dest, src)
    assert [name for name, _ in seen] == ["aten.copy_.default"]
    assert seen[0][1] is src
