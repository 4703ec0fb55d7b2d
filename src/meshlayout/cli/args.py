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
>>> parse_size("256MiB")
268435456
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ..mesh import Mesh, check_whole_hosts
from ..sharding import REDUCE_OPS, Partial, Placement, Replicate, Shard, ShardingSpec, StridedShard

__all__ = [
    "INT64_MAX",
    "SIZE_UNITS",
    "ArgError",
    "add_world_argument",
    "build_mesh",
    "check_world_hosts",
    "int_arg",
    "parse_flatten",
    "parse_int",
    "parse_int_list",
    "parse_named_sizes",
    "parse_names",
    "parse_placements",
    "parse_ranks",
    "parse_shard_order",
    "parse_size",
    "parse_unflatten",
    "range_length",
    "shown",
    "spec_from_flags",
    "split_top_level",
    "user_input",
    "whole_hosts",
]

#: Largest int64: the bound on every size, rank and count given on the command line.
INT64_MAX = 2**63 - 1


class ArgError(ValueError):
    """A user mistake on the command line; the message is one line naming the flag and value.

    The one user-error class of the command: ``meshlayout.cli.main`` prints
    ``meshlayout COMMAND: error: <message>`` and returns 2 for it, and for nothing
    else (any other exception is a bug and shows its traceback). Subcommand
    modules raise it directly, or wrap library calls on user values in
    :func:`user_input`.
    """


def shown(value: object, limit: int = 60) -> str:
    """A user value for a one-line message: ``repr`` (escapes newlines), cut at ``limit``.

    >>> shown("a=2"), shown("x" * 100)[-6:]
    ("'a=2'", 'xxx...')
    """
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def one_line(text: str) -> str:
    """``text`` with control characters (newlines too) escaped, so it prints as one line.

    >>> one_line("a\\nb")
    'a\\\\nb'
    """
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


_NO_VALUE = object()


@contextmanager
def user_input(flag: str, value: object = _NO_VALUE) -> Iterator[None]:
    """Blame ``ValueError``/``KeyError``/``TypeError``/``IndexError``/``OverflowError`` on ``flag``.

    Wrap exactly the library call that consumes the user's ``value``: its errors
    become an :class:`ArgError` naming the flag and the value (``flag`` alone when
    no value is given, e.g. ``"--world 64 --tp 3"``). Errors anywhere else stay
    what they are (bugs, with a traceback).

    >>> with user_input("--shape", "a=0"):
    ...     raise ValueError("mesh sizes must be >= 1, got [0]")
    Traceback (most recent call last):
    ...
    meshlayout.cli.args.ArgError: --shape 'a=0': mesh sizes must be >= 1, got [0]
    """
    try:
        yield
    except ArgError:
        raise
    except (ValueError, KeyError, TypeError, IndexError, OverflowError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
        lines = str(message).strip().splitlines() or [type(exc).__name__]
        where = flag if value is _NO_VALUE else f"{flag} {shown(value)}"
        raise ArgError(f"{where}: {one_line(lines[0])}") from None


def whole_hosts(ranks_per_host: int | None, world: int, world_text: str, hint: str = "") -> None:
    """ArgError when ``--ranks-per-host`` does not divide ``world`` (named by ``world_text``).

    >>> whole_hosts(8, 12, "--world 12")
    Traceback (most recent call last):
    ...
    meshlayout.cli.args.ArgError: --ranks-per-host 8 does not divide --world 12: the last host would hold 4 of 8 ranks (every host holds as many ranks)
    """
    if ranks_per_host is None:
        return
    try:
        check_whole_hosts(ranks_per_host, world, f"--ranks-per-host {ranks_per_host}", world_text)
    except ValueError as exc:
        raise ArgError(f"{exc}{hint}") from None


def add_world_argument(p: argparse.ArgumentParser) -> None:
    """``--world N`` of the commands whose meshes may use only part of the job's ranks."""
    p.add_argument(
        "--world",
        type=int_arg(minimum=1),
        metavar="N",
        help="ranks in the job, for --ranks-per-host (default: the highest rank the meshes "
        "use + 1); --ranks-per-host must divide it",
    )


def check_world_hosts(args: argparse.Namespace, highest_rank: int) -> None:
    """``--ranks-per-host`` against ``--world``, or against the ranks 0..``highest_rank``.

    >>> ns = argparse.Namespace(ranks_per_host=8, world=None)
    >>> check_world_hosts(ns, 19)
    Traceback (most recent call last):
    ...
    meshlayout.cli.args.ArgError: --ranks-per-host 8 does not divide the 20 ranks 0-19 the meshes span: the last host would hold 4 of 8 ranks (every host holds as many ranks); if the job has more ranks than the meshes use, give --world N
    """
    rph, world = args.ranks_per_host, args.world
    if world is None:
        span = highest_rank + 1
        hint = "; if the job has more ranks than the meshes use, give --world N"
        whole_hosts(rph, span, f"the {span} ranks 0-{highest_rank} the meshes span", hint)
        return
    if rph is None:
        raise ArgError(f"--world {world} applies with --ranks-per-host (it places the hosts)")
    if world <= highest_rank:
        raise ArgError(
            f"--world {world}: the meshes use rank {highest_rank}, outside ranks 0-{world - 1}"
        )
    whole_hosts(rph, world, f"--world {world}")


_INT_RE = re.compile(r"[+-]?[0-9]+")
_MAX_DIGITS = 40  # beyond any int64, below Python's 4300-digit int() limit
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_int(text: str, what: str, *, minimum: int | None = None, maximum: int = INT64_MAX) -> int:
    """An ASCII integer in ``[minimum, maximum]``, else :class:`ArgError` naming ``what``.

    >>> parse_int(" 8 ", "--world", minimum=1)
    8
    >>> parse_int("9223372036854775808", "--world")
    Traceback (most recent call last):
    ...
    meshlayout.cli.args.ArgError: --world: 9223372036854775808 is more than 9223372036854775807 (int64)
    """
    text = text.strip()
    if not _INT_RE.fullmatch(text):
        raise ArgError(f"{what}: {shown(text)} is not an integer")
    if len(text) > _MAX_DIGITS:
        raise ArgError(f"{what}: {shown(text)} is out of range (at most {maximum})")
    value = int(text)
    if minimum is not None and value < minimum:
        raise ArgError(f"{what}: must be >= {minimum}, got {value}")
    if value > maximum:
        suffix = " (int64)" if maximum == INT64_MAX else ""
        raise ArgError(f"{what}: {value} is more than {maximum}{suffix}")
    return value


#: Bytes per unit of :func:`parse_size` (unit names are case-insensitive).
SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "k": 2**10,  # a bare K/M/G/T is the binary unit, as dd and torchrun read it
    "m": 2**20,
    "g": 2**30,
    "t": 2**40,
}
_SIZE_RE = re.compile(r"([0-9]+)(?:\.([0-9]+))?\s*([A-Za-z]*)")


def parse_size(
    text: str, what: str = "--size", *, minimum: int = 1, maximum: int = INT64_MAX
) -> int:
    """A byte count: ``"4096"``, ``"256MiB"``, ``"64M"``, ``"1.5 GiB"``, ``"2GB"`` (:data:`SIZE_UNITS`).

    KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000, a bare K/M/G/T
    the binary unit, B or no unit bytes; units are case-insensitive. A fraction must come to whole bytes. The
    result lies in ``[minimum, maximum]``; anything else is an :class:`ArgError`
    naming ``what``.

    >>> parse_size("1.5 GiB"), parse_size("2GB"), parse_size("512")
    (1610612736, 2000000000, 512)
    >>> parse_size("1.5B", "--bucket")
    Traceback (most recent call last):
    ...
    meshlayout.cli.args.ArgError: --bucket: '1.5B' is not a whole number of bytes
    """
    body = text.strip()
    m = _SIZE_RE.fullmatch(body)
    if not m or len(body) > _MAX_DIGITS:
        raise ArgError(
            f"{what}: {shown(text)} is not a size (expected e.g. 4096, 256MiB, 1.5GiB, 2GB)"
        )
    whole, frac, unit = m.group(1), m.group(2) or "", m.group(3).lower()
    if unit not in SIZE_UNITS:
        raise ArgError(
            f"{what}: unknown unit {m.group(3)!r} in {shown(text)} "
            "(use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB or K, M, G, T)"
        )
    numerator = int(whole + frac) * SIZE_UNITS[unit]
    scale: int = 10 ** len(frac)
    value, rest = divmod(numerator, scale)
    if rest:
        raise ArgError(f"{what}: {shown(text)} is not a whole number of bytes")
    if value < minimum:
        raise ArgError(f"{what}: must be at least {minimum} bytes, got {shown(text)}")
    if value > maximum:
        raise ArgError(f"{what}: {shown(text)} is {value} bytes, more than {maximum}")
    return value


def int_arg(minimum: int | None = None, maximum: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse ``type=`` for bounded ints; argparse prefixes the flag to the message.

    >>> int_arg(1)("4")
    4
    """

    def convert(text: str) -> int:
        try:
            return parse_int(text, "value", minimum=minimum, maximum=maximum)
        except ArgError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("value: ")) from None

    convert.__name__ = "int"  # argparse names the type in some messages
    return convert


def _name(text: str, what: str) -> str:
    text = text.strip()
    if not _NAME_RE.match(text):
        raise ArgError(f"{what}: {shown(text)} is not a valid name (letters, digits, _)")
    return text


def parse_int_list(
    text: str, what: str = "value", *, minimum: int | None = None, times: bool = True
) -> tuple[int, ...]:
    """``"7,4"`` -> ``(7, 4)``; with ``times`` also ``x`` as a separator (``"7x4"``).

    >>> parse_int_list("7x4")
    (7, 4)
    """
    sep = "," if "," in text or not times else r"[x×]"
    parts = re.split(sep, text.strip())
    if not text.strip() or any(not p.strip() for p in parts):
        raise ArgError(f"{what}: expected comma-separated integers, got {shown(text)}")
    return tuple(parse_int(p, what, minimum=minimum) for p in parts)


def parse_names(text: str, what: str = "names") -> tuple[str, ...]:
    """``"tp,pp"`` -> ``("tp", "pp")``.

    >>> parse_names("tp, pp")
    ('tp', 'pp')
    """
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ArgError(f"{what}: expected comma-separated names, got {shown(text)}")
    return tuple(_name(p, what) for p in parts)


def parse_named_sizes(text: str, what: str = "--shape") -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``"pp=2,dp=4"`` -> sizes and names; ``"2,4"`` -> sizes and ``dim0, dim1``.

    The product of the sizes (the number of ranks) must fit in int64.

    >>> parse_named_sizes("2,4")
    ((2, 4), ('dim0', 'dim1'))
    """
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise ArgError(f"{what}: expected NAME=SIZE,... or SIZE,..., got {shown(text)}")
    named = ["=" in p for p in items]
    if any(named) and not all(named):
        raise ArgError(f"{what}: name every dim or none, got {shown(text)}")
    sizes: list[int] = []
    names: list[str] = []
    for i, item in enumerate(items):
        if "=" in item:
            n, _, s = item.partition("=")
            names.append(_name(n, what))
        else:
            s = item
            names.append(f"dim{i}")
        sizes.append(parse_int(s, f"{what} size of {names[-1]!r}", minimum=1))
    if len(set(names)) != len(names):
        raise ArgError(f"{what}: dim names repeat in {shown(text)}")
    total = math.prod(sizes)
    if total > INT64_MAX:
        raise ArgError(f"{what} {shown(text)}: {total} ranks, more than {INT64_MAX} (int64)")
    return tuple(sizes), tuple(names)


def parse_ranks(text: str, what: str = "--ranks") -> range | list[int]:
    """``"START:STOP[:STEP]"`` -> a range; ``"3,1,2,0"`` -> a list (ranks in ``[0, 2**63)``).

    >>> parse_ranks("0:8:2"), parse_ranks("3,1,2,0")
    (range(0, 8, 2), [3, 1, 2, 0])
    """
    text = text.strip()
    if ":" not in text:
        return list(parse_int_list(text, what, minimum=0, times=False))
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ArgError(f"{what}: expected START:STOP[:STEP], got {shown(text)}")
    where = f"{what} {shown(text)}"
    start = parse_int(parts[0], f"{where} START", minimum=0)
    stop = parse_int(parts[1], f"{where} STOP", minimum=0, maximum=INT64_MAX + 1)
    step = parse_int(parts[2], f"{where} STEP", minimum=1) if len(parts) == 3 else 1
    if stop <= start:
        raise ArgError(f"{where}: empty (STOP must be > START)")
    return range(start, stop, step)  # every rank < STOP <= 2**63; len() may still overflow


def range_length(r: range) -> int:
    """``len(r)`` without the ``OverflowError`` of ranges longer than ``sys.maxsize``.

    >>> range_length(range(0, 2**70, 2))
    590295810358705651712
    """
    return max(0, (r.stop - r.start + r.step - (1 if r.step > 0 else -1)) // r.step)


def build_mesh(
    shape_text: str,
    ranks_text: str | None,
    *,
    shape_flag: str = "--shape",
    ranks_flag: str = "--ranks",
) -> Mesh:
    """A :class:`Mesh` from ``NAME=SIZE,...`` and optional ``--ranks``; errors name the flag.

    >>> build_mesh("dp=2,tp=2", "8:12").group(9, "tp")
    (8, 9)
    """
    sizes, names = parse_named_sizes(shape_text, shape_flag)
    total = math.prod(sizes)
    ranks: range | list[int] | None = None
    if ranks_text is not None:
        ranks = parse_ranks(ranks_text, ranks_flag)
        count = range_length(ranks) if isinstance(ranks, range) else len(ranks)
        if count != total:
            raise ArgError(
                f"{ranks_flag} {shown(ranks_text)} gives {count} ranks, but {shape_flag} "
                f"{shown(shape_text)} needs {total}"
            )
    with user_input(ranks_flag if ranks_text is not None else shape_flag, ranks_text or shape_text):
        return Mesh(sizes, names, ranks=ranks)


def spec_from_flags(
    shape: Sequence[int],
    mesh: Mesh,
    placements: tuple[str, list[Placement]] | None,
    shard_order: tuple[str, dict[int, tuple[str | int, ...]]] | None,
    *,
    flags: tuple[str, str] = ("--placements", "--shard-order"),
) -> ShardingSpec:
    """The spec of ``--placements`` and/or ``--shard-order``, each given as (text, parsed value).

    With both, the placements must decode to that shard order. Every error is an
    :class:`ArgError` naming the flag (``flags``: the placements' and the order's)
    and the text the user typed.

    >>> mesh = build_mesh("dp=2,tp=2", None)
    >>> spec_from_flags((8,), mesh, ("S(0),S(0)", parse_placements("S(0),S(0)")), None)
    ShardingSpec(global_shape=(8,), mesh=Mesh(dp=2, tp=2), placements=(Shard(dim=0), Shard(dim=0)))
    >>> spec_from_flags((8,), mesh, ("S(0),R", parse_placements("S(0),R")),
    ...                 ("0:tp", parse_shard_order("0:tp")))
    Traceback (most recent call last):
    ...
    meshlayout.cli.args.ArgError: --placements 'S(0),R' decode to shard order {0: (0,)}, but --shard-order '0:tp' says {0: (1,)}
    """
    if placements is None and shard_order is None:
        raise ArgError(f"give {flags[0]}, {flags[1]}, or both")
    wanted = None
    if shard_order is not None:
        with user_input(flags[1], shard_order[0]):
            wanted = ShardingSpec.from_shard_order(shape, mesh, shard_order[1])
    if placements is None:
        assert wanted is not None
        return wanted
    with user_input(flags[0], placements[0]):
        spec = ShardingSpec(shape, mesh, placements[1])
    if shard_order is None or wanted is None:
        return spec
    if not spec.decodable or spec.shard_order() != wanted.shard_order():
        have = spec.shard_order() if spec.decodable else "none (not decodable)"
        raise ArgError(
            f"{flags[0]} {shown(placements[0])} decode to shard order {have}, but "
            f"{flags[1]} {shown(shard_order[0])} says {wanted.shard_order()}"
        )
    return spec


def split_top_level(text: str, sep: str = ",", *, what: str = "value") -> list[str]:
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
                raise ArgError(f"{what}: unbalanced ')' in {shown(text)}")
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth != 0:
        raise ArgError(f"{what}: unbalanced '(' in {shown(text)}")
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
        raise ArgError(f"--placements: cannot parse {shown(token)}")
    kind, body = m.group(1).lower(), m.group(2)
    args = _args(body)
    where = f"--placements {shown(token)}"
    if kind in _SHARD:
        if len(args) != 1 or args[0][0] not in (None, "dim"):
            raise ArgError(f"{where}: expected S(dim)")
        return Shard(parse_int(args[0][1], where))
    if kind in _STRIDED:
        if len(args) != 2 or args[1][0] not in (None, "split_factor", "sf"):
            raise ArgError(f"{where}: expected SS(dim, split_factor)")
        sf = parse_int(args[1][1], f"{where} split_factor", minimum=1)
        return StridedShard(parse_int(args[0][1], where), sf)
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
    tokens = split_top_level(body, what="--placements")
    if not tokens or any(not t for t in tokens):
        raise ArgError(f"--placements: empty placement in {shown(text)}")
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
            raise ArgError(
                f"--shard-order: expected TENSOR_DIM:MESH_DIM,...[;...], got {shown(part)}"
            )
        d = parse_int(dim_text, "--shard-order")
        if d in out:
            raise ArgError(f"--shard-order: tensor dim {d} given twice")
        dims: list[str | int] = []
        for x in dims_text.split(","):
            x = x.strip()
            dims.append(
                parse_int(x, "--shard-order") if _INT_RE.fullmatch(x) else _name(x, "--shard-order")
            )
        out[d] = tuple(dims)
    if not out:
        raise ArgError(f"--shard-order: nothing to parse in {shown(text)}")
    return out


def parse_unflatten(text: str) -> tuple[str, tuple[int, ...], tuple[str, ...]]:
    """``"dp=2x2"`` -> ``("dp", (2, 2), ("dp0", "dp1"))``; names after a colon.

    >>> parse_unflatten("dp=2x2")
    ('dp', (2, 2), ('dp0', 'dp1'))
    """
    dim, eq, rest = text.partition("=")
    if not eq:
        raise ArgError(f"--unflatten: expected DIM=SIZExSIZE[:NAME,NAME], got {shown(text)}")
    sizes_text, colon, names_text = rest.partition(":")
    sizes = parse_int_list(sizes_text.replace(",", "x"), "--unflatten", minimum=1)
    dim_name = _name(dim, "--unflatten")
    if colon:
        names = parse_names(names_text, "--unflatten")
    else:
        names = tuple(f"{dim_name}{i}" for i in range(len(sizes)))
    if len(names) != len(sizes):
        raise ArgError(f"--unflatten: {len(sizes)} sizes but {len(names)} names in {shown(text)}")
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
