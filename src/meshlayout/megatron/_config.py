"""Megatron-Core's configuration rules: order strings, inferred sizes and what it refuses.

Pure checks on the arguments of ``initialize_model_parallel`` (no meshes): the
tokens of an order string, the root-mesh dim each token stands for on the dense
and the expert grid, the inferred ``dp`` and ``edp``, Megatron's completion of
an order that leaves dims out, and its rules for ``pp`` and the distributed-
optimizer instances. Every refusal is a ValueError that says why.

>>> degrees = infer_degrees(16, {"tp": 2, "cp": 1, "pp": 2, "ep": 4, "etp": 2}, -1)
>>> degrees["dp"], degrees["edp"]
(4, 1)
>>> complete_order("tp-ep-dp-pp", parse_tokens("tp-ep-dp-pp"), degrees)
('tp', 'ep', 'dp', 'pp', 'cp')
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = [
    "DEFAULT_ORDER",
    "DENSE_NAMES",
    "EXPERT_NAMES",
    "ORDER_TOKENS",
    "check_instances",
    "check_pipeline_rule",
    "complete_order",
    "infer_degrees",
    "parallel_dims_order",
    "parse_tokens",
    "pipeline_groups_error",
]

#: The tokens of a Megatron order string.
ORDER_TOKENS: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
#: Megatron-Core's default order (``initialize_model_parallel(order=...)``), innermost first.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
# Megatron's RankGenerator appends the dims an order leaves out in this order.
APPEND_ORDER: tuple[str, ...] = ("tp", "pp", "dp", "ep", "cp")
# Token -> dim name of the root mesh, per grid (None: the token has size 1 there).
DENSE_NAMES: dict[str, str | None] = {"tp": "tp", "cp": "cp", "ep": None, "dp": "dp", "pp": "pp"}
EXPERT_NAMES: dict[str, str | None] = {
    "tp": "etp",
    "cp": None,
    "ep": "ep",
    "dp": "edp",
    "pp": "pp",
}


def parallel_dims_order(order: str = DEFAULT_ORDER) -> tuple[str, ...]:
    """The :class:`~meshlayout.ParallelDims` ``order`` (outermost first) of a Megatron order.

    Reverses the string, writes ``dp`` as ``dp_replicate, dp_shard`` and drops
    ``ep`` (ParallelDims carves experts out of ``dp_shard*cp*tp``). The dense
    groups of ``ParallelDims(..., dp_shard=dp, order=parallel_dims_order(o))``
    are Megatron's as sets of ranks; for Megatron's exact member order and its
    expert layout use :class:`MegatronDims`.

    >>> parallel_dims_order("tp-cp-ep-dp-pp")
    ('pp', 'dp_replicate', 'dp_shard', 'cp', 'tp')
    >>> parallel_dims_order("tp-dp-pp")
    ('pp', 'dp_replicate', 'dp_shard', 'tp')
    """
    out: list[str] = []
    for token in reversed(parse_tokens(order)):
        if token == "dp":
            out += ["dp_replicate", "dp_shard"]
        elif token != "ep":
            out.append(token)
    return tuple(out)


def parse_tokens(order: object) -> tuple[str, ...]:
    """The tokens of a Megatron order string (lower-cased), validated."""
    if not isinstance(order, str):
        raise TypeError(
            f"a Megatron order is a string of {list(ORDER_TOKENS)} joined by '-' (innermost "
            f"first), e.g. {DEFAULT_ORDER!r}; got {order!r} of type {type(order).__name__}"
        )
    tokens = tuple(order.strip().lower().split("-"))
    unknown = [t for t in tokens if t not in ORDER_TOKENS]
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if unknown or repeated:
        problem = f"unknown {unknown}" if unknown else f"repeated {repeated}"
        raise ValueError(
            f"order {order!r}: {problem}; a Megatron order joins distinct names from "
            f"{list(ORDER_TOKENS)} with '-', innermost first, e.g. {DEFAULT_ORDER!r}"
        )
    return tokens


def infer_degrees(world: int, sizes: Mapping[str, int], given_dp: int) -> dict[str, int]:
    """All seven degrees: ``sizes`` (tp, cp, pp, ep, etp) plus the inferred ``dp`` and ``edp``.

    ``given_dp`` is -1 (infer) or the ``dp`` the caller expects, checked here.
    """
    tp, cp, pp, ep, etp = (sizes[k] for k in ("tp", "cp", "pp", "ep", "etp"))
    model = tp * cp * pp
    if world % model:
        raise ValueError(
            f"world_size {world} is not divisible by tp*cp*pp = {tp}*{cp}*{pp} = {model}"
        )
    dp = world // model
    if given_dp not in (-1, dp):
        raise ValueError(
            f"dp={given_dp} does not match world_size/(tp*cp*pp) = {world}/{model} = {dp}"
        )
    expert = etp * ep * pp
    if world % expert:
        raise ValueError(
            f"world_size {world} is not divisible by etp*ep*pp = {etp}*{ep}*{pp} = {expert}, "
            "so the expert grid has no integer expert data-parallel size"
        )
    return {"tp": tp, "cp": cp, "dp": dp, "pp": pp, "ep": ep, "etp": etp, "edp": world // expert}


def complete_order(
    order: str, tokens: tuple[str, ...], degrees: Mapping[str, int]
) -> tuple[str, ...]:
    """Megatron's completion: dims left out of the order (all of size 1) appended outermost."""
    missing = [t for t in APPEND_ORDER if t not in tokens]
    for t in missing:
        big = [
            f"{name}={degrees[name]}"
            for name in (DENSE_NAMES[t], EXPERT_NAMES[t])
            if name is not None and degrees[name] > 1
        ]
        if big:
            fixed = [x for x in ORDER_TOKENS if x in tokens or x == t]
            raise ValueError(
                f"order {order!r} leaves out {t!r}, but {' and '.join(dict.fromkeys(big))}; "
                "Megatron places only dims of size 1 itself (it appends them outermost): name "
                f"every dim of size > 1, e.g. {'-'.join(_insert(tokens, t, fixed))!r}"
            )
    return tokens + tuple(missing)


def _insert(tokens: tuple[str, ...], token: str, canonical: list[str]) -> list[str]:
    """``tokens`` with ``token`` inserted after its nearest predecessor in ``canonical``."""
    out = list(tokens)
    before = canonical[: canonical.index(token)]
    at = max((out.index(b) + 1 for b in before if b in out), default=0)
    out.insert(at, token)
    return out


def check_pipeline_rule(order: str, tokens: tuple[str, ...], degrees: Mapping[str, int]) -> None:
    """Megatron's rule: with pp not last, pp > 1 needs the same dp on both grids."""
    if tokens[-1] != "pp" and degrees["pp"] > 1 and degrees["edp"] != degrees["dp"]:
        raise ValueError(
            f"order {order!r} does not end with pp, so with pp={degrees['pp']} Megatron needs "
            f"the same data-parallel size on both grids, but dp={degrees['dp']} and "
            f"edp={degrees['edp']} (tp*cp = {degrees['tp'] * degrees['cp']} != etp*ep = "
            f"{degrees['etp'] * degrees['ep']}); put pp last or make tp*cp equal etp*ep"
        )


def check_instances(instances: int, degrees: Mapping[str, int]) -> None:
    """The distributed-optimizer instances must divide both ``dp*cp`` and ``edp``."""
    dp_cp = degrees["dp"] * degrees["cp"]
    for what, size in (("dp*cp", dp_cp), ("edp", degrees["edp"])):
        if size % instances:
            raise ValueError(
                f"num_distributed_optimizer_instances={instances} does not divide {what} = {size}"
            )


def pipeline_groups_error(
    order: str, full_order: tuple[str, ...], degrees: Mapping[str, int]
) -> ValueError:
    """Why the dense and expert grids of ``full_order`` give different pipeline groups.

    Megatron asserts that they coincide; they differ when the dims inside ``pp``
    multiply to different sizes on the two grids.
    """
    inner = full_order[: full_order.index("pp")]
    expert_dims = [name for name in (EXPERT_NAMES[t] for t in inner) if name]
    dense = "*".join(f"{t}={degrees[t]}" for t in inner if DENSE_NAMES[t]) or "1"
    expert = "*".join(f"{name}={degrees[name]}" for name in expert_dims) or "1"
    return ValueError(
        f"order {order!r} gives different pipeline groups to the dense and the "
        f"expert grid: the dims inside pp multiply to {dense} (dense) but {expert} "
        "(expert); Megatron requires the same pipeline groups (put pp last)"
    )
