"""Parsers for the ``meshlayout`` command's argument mini-languages (pure, no torch).

Each parser takes the text of one option and returns Python values, raising
:class:`ArgError` (a ``ValueError``) with a one-line message on malformed input.

>>> parse_named_sizes("pp=2,dp=4,tp=8")
((2, 4, 8), ('pp', 'dp', 'tp'))
>>> parse_ranks("2048:2112")
range(2048, 2112)
>>> parse_placements("SS(0,2),S(0)")
[StridedShard(dim=0, split_factor=2), Shard(dim=0)]
>>> parse_shard_order("0:dp,tp;1:cp")
{0: ('dp', 'tp'), 1: ('cp',)}
>>> parse_unflatten("dp=2x2:rep,shard")
('dp', (2, 2), ('rep', 'shard'))
"""

from __future__ import annotations

import re

from .sharding import REDUCE_OPS, Partial, Placement, Replicate, Shard, StridedShard

__all__ = [
    "ArgError",
    "parse_flatten",
    "parse_int_list",
    "parse_named_sizes",
    "parse_names",
    "parse_placements",
    "parse_ranks",
    "parse_shard_order",
    "parse_unflatten",
    "split_top_level",
]


class ArgError(ValueError):
    """A malformed command-line value; the message is one line meant for the user."""


_INT = r"[+-]?\d+"
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _int(text: str, what: str) -> int:
    text = text.strip()
    if not re.fullmatch(_INT, text):
        raise ArgError(f"{what}: {text!r} is not an integer")
    return int(text)


def _name(text: str, what: str) -> str:
    text = text.strip()
    if not _NAME_RE.match(text):
        raise ArgError(f"{what}: {text!r} is not a valid name (letters, digits, _)")
    return text


def parse_int_list(text: str, what: str = "value") -> tuple[int, ...]:
    """``"7,4"`` -> ``(7, 4)``; also accepts ``x`` as a separator (``"7x4"``).

    >>> parse_int_list("7x4")
    (7, 4)
    """
    sep = "," if "," in text else r"[x×]"
    parts = re.split(sep, text.strip())
    if not text.strip() or any(not p.strip() for p in parts):
        raise ArgError(f"{what}: expected comma-separated integers, got {text!r}")
    return tuple(_int(p, what) for p in parts)


def parse_names(text: str, what: str = "names") -> tuple[str, ...]:
    """``"tp,pp"`` -> ``("tp", "pp")``.

    >>> parse_names("tp, pp")
    ('tp', 'pp')
    """
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ArgError(f"{what}: expected comma-separated names, got {text!r}")
    return tuple(_name(p, what) for p in parts)


def parse_named_sizes(text: str, what: str = "--shape") -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``"pp=2,dp=4"`` -> sizes and names; ``"2,4"`` -> sizes and ``dim0, dim1``.

    >>> parse_named_sizes("2,4")
    ((2, 4), ('dim0', 'dim1'))
    """
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise ArgError(f"{what}: expected NAME=SIZE,... or SIZE,..., got {text!r}")
    named = ["=" in p for p in items]
    if any(named) and not all(named):
        raise ArgError(f"{what}: name every dim or none, got {text!r}")
    sizes: list[int] = []
    names: list[str] = []
    for i, item in enumerate(items):
        if "=" in item:
            n, _, s = item.partition("=")
            names.append(_name(n, what))
        else:
            s = item
            names.append(f"dim{i}")
        size = _int(s, what)
        if size < 1:
            raise ArgError(f"{what}: size of {names[-1]!r} must be >= 1, got {size}")
        sizes.append(size)
    if len(set(names)) != len(names):
        raise ArgError(f"{what}: dim names repeat in {text!r}")
    return tuple(sizes), tuple(names)


def parse_ranks(text: str) -> range | list[int]:
    """``"START:STOP[:STEP]"`` -> a range; ``"3,1,2,0"`` -> a list.

    >>> parse_ranks("0:8:2"), parse_ranks("3,1,2,0")
    (range(0, 8, 2), [3, 1, 2, 0])
    """
    text = text.strip()
    if ":" in text:
        parts = text.split(":")
        if len(parts) not in (2, 3):
            raise ArgError(f"--ranks: expected START:STOP[:STEP], got {text!r}")
        nums = [_int(p, "--ranks") for p in parts]
        rng = range(*nums)
        if nums[0] < 0 or (len(nums) == 3 and nums[2] <= 0):
            raise ArgError(f"--ranks: start must be >= 0 and step > 0, got {text!r}")
        if len(rng) == 0:
            raise ArgError(f"--ranks: {text!r} is empty")
        return rng
    ranks = list(parse_int_list(text, "--ranks"))
    if any(r < 0 for r in ranks):
        raise ArgError(f"--ranks: ranks must be >= 0, got {text!r}")
    return ranks


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside parentheses.

    >>> split_top_level("SS(0,2),S(0)")
    ['SS(0,2)', 'S(0)']
    """
    out: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ArgError(f"unbalanced ')' in {text!r}")
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ArgError(f"unbalanced '(' in {text!r}")
    out.append("".join(cur))
    return [p.strip() for p in out]


_PLACEMENT_RE = re.compile(r"^\s*([A-Za-z_]+)\s*(?:\((.*)\))?\s*$")
_SHARD = {"s", "shard"}
_STRIDED = {"ss", "stridedshard", "_s", "_stridedshard"}
_REPLICATE = {"r", "replicate"}
_PARTIAL = {"p", "partial"}


def _args(body: str | None) -> list[tuple[str | None, str]]:
    if body is None or not body.strip():
        return []
    out: list[tuple[str | None, str]] = []
    for part in body.split(","):
        key, eq, value = part.partition("=")
        out.append((key.strip(), value.strip()) if eq else (None, part.strip()))
    return out


def _placement(token: str) -> Placement:
    m = _PLACEMENT_RE.match(token)
    if not m:
        raise ArgError(f"--placements: cannot parse {token!r}")
    kind, body = m.group(1).lower(), m.group(2)
    args = _args(body)
    where = f"--placements: {token!r}"
    if kind in _SHARD:
        if len(args) != 1 or args[0][0] not in (None, "dim"):
            raise ArgError(f"{where}: expected S(dim)")
        return Shard(_int(args[0][1], where))
    if kind in _STRIDED:
        if len(args) != 2 or args[1][0] not in (None, "split_factor", "sf"):
            raise ArgError(f"{where}: expected SS(dim, split_factor)")
        sf = _int(args[1][1], where)
        if sf < 1:
            raise ArgError(f"{where}: split_factor must be >= 1, got {sf}")
        return StridedShard(_int(args[0][1], where), sf)
    if kind in _REPLICATE:
        if args:
            raise ArgError(f"{where}: Replicate takes no arguments")
        return Replicate()
    if kind in _PARTIAL:
        if len(args) > 1:
            raise ArgError(f"{where}: expected P or P(reduce_op)")
        op = args[0][1].strip("'\"") if args else "sum"
        if op not in REDUCE_OPS:
            raise ArgError(f"{where}: reduce_op must be one of {', '.join(REDUCE_OPS)}")
        return Partial(op)
    raise ArgError(
        f"{where}: unknown placement {m.group(1)!r}; use S(d), SS(d,sf), R or P(op) "
        "(or Shard, StridedShard, Replicate, Partial)"
    )


def parse_placements(text: str) -> list[Placement]:
    """``"SS(0,2),S(0)"`` -> placements; also ``Shard(1)``, ``R``, ``P(max)``, ``[...]``.

    >>> parse_placements("[Shard(dim=1), Replicate(), Partial('max')]")
    [Shard(dim=1), Replicate(), Partial(reduce_op='max')]
    """
    body = text.strip()
    if (body[:1], body[-1:]) in (("[", "]"), ("(", ")")):
        body = body[1:-1]  # a Python-style list or tuple of placements
    tokens = split_top_level(body)
    if not tokens or any(not t for t in tokens):
        raise ArgError(f"--placements: empty placement in {text!r}")
    return [_placement(t) for t in tokens]


def parse_shard_order(text: str) -> dict[int, tuple[str | int, ...]]:
    """``"0:tp,dp;1:cp"`` -> ``{0: ("tp", "dp"), 1: ("cp",)}`` (outermost first).

    Mesh dims are names or indices.

    >>> parse_shard_order("0:1,0")
    {0: (1, 0)}
    """
    out: dict[int, tuple[str | int, ...]] = {}
    for part in [p for p in text.split(";") if p.strip()]:
        dim_text, colon, dims_text = part.partition(":")
        if not colon or not dims_text.strip():
            raise ArgError(f"--shard-order: expected TENSOR_DIM:MESH_DIM,...[;...], got {part!r}")
        d = _int(dim_text, "--shard-order")
        if d in out:
            raise ArgError(f"--shard-order: tensor dim {d} given twice")
        dims: list[str | int] = []
        for x in dims_text.split(","):
            x = x.strip()
            dims.append(int(x) if re.fullmatch(_INT, x) else _name(x, "--shard-order"))
        out[d] = tuple(dims)
    if not out:
        raise ArgError(f"--shard-order: nothing to parse in {text!r}")
    return out


def parse_unflatten(text: str) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """``"dp=2x2"`` -> ``("dp", (2, 2), ("dp0", "dp1"))``; names after a colon.

    >>> parse_unflatten("dp=2x2")
    ('dp', (2, 2), ('dp0', 'dp1'))
    """
    dim, eq, rest = text.partition("=")
    if not eq:
        raise ArgError(f"--unflatten: expected DIM=SIZExSIZE[:NAME,NAME], got {text!r}")
    sizes_text, colon, names_text = rest.partition(":")
    sizes = parse_int_list(sizes_text.replace(",", "x"), "--unflatten")
    if any(s < 1 for s in sizes):
        raise ArgError(f"--unflatten: sizes must be >= 1, got {sizes_text!r}")
    dim_name = _name(dim, "--unflatten")
    if colon:
        names = parse_names(names_text, "--unflatten")
    else:
        names = tuple(f"{dim_name}{i}" for i in range(len(sizes)))
    if len(names) != len(sizes):
        raise ArgError(f"--unflatten: {len(sizes)} sizes but {len(names)} names in {text!r}")
    return dim_name, sizes, names


def parse_flatten(text: str) -> tuple[tuple[str, ...] | None, str]:
    """``"NAME"`` (every dim) or ``"DIM,DIM=NAME"`` (those dims, in place of the first).

    >>> parse_flatten("world"), parse_flatten("dp,cp=fsdp")
    ((None, 'world'), (('dp', 'cp'), 'fsdp'))
    """
    dims_text, eq, name = text.rpartition("=")
    if not eq:
        return None, _name(text, "--flatten")
    return parse_names(dims_text, "--flatten"), _name(name, "--flatten")
