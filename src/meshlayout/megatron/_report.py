"""What :meth:`MegatronDims.describe` and :meth:`MegatronDims.to_dict` show.

Every view of a :class:`~meshlayout.megatron.MegatronDims` with its size, number
of groups, one rank's group, the hosts it spans and Megatron's getter, as an
aligned text table or a JSON-ready dict.

>>> from meshlayout import MegatronDims
>>> print(describe_text(MegatronDims(4, tp=2), rank=3).splitlines()[3])
tp              2     2       [2, 3]           get_tensor_model_parallel_group()
>>> report_dict(MegatronDims(4, tp=2), rank=3)["views"]["dp"]["group"]
[1, 3]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..inttuple import check_int
from ..rank_map import RankMap
from ..rank_map import _abridge as abridge
from ._views import MEGATRON_VIEWS

if TYPE_CHECKING:
    from ._dims import MegatronDims

__all__ = ["describe_text", "report_dict"]


def describe_text(
    md: MegatronDims, *, rank: int | None = None, ranks_per_host: int | None = None
) -> str:
    """The table of :meth:`MegatronDims.describe` (see there)."""
    rank = default_rank(md.rank_map, rank)
    hosts = (
        None if ranks_per_host is None else check_int(ranks_per_host, "ranks_per_host", minimum=1)
    )
    header = ["view", "size", "groups", f"group of rank {rank}"]
    header += ["hosts"] if hosts is not None else []
    rows = [[*header, "Megatron"]]
    for name, mesh in md.views().items():
        group = mesh.submesh(rank).reshape(-1)
        row = [name, str(mesh.size()), str(mesh.num_submeshes), abridge(group)]
        if hosts is not None:
            k = int(mesh.hosts_spanned(hosts).max())
            row.append("stays within a host" if k == 1 else f"crosses {k} hosts")
        rows.append([*row, MEGATRON_VIEWS[name].getter])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        repr(md),
        f"order {md.full_order} (innermost first): dense ({', '.join(md.dense.names)}), "
        f"expert ({', '.join(md.expert.names)})",
    ]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def report_dict(md: MegatronDims, *, rank: int | None = None) -> dict[str, Any]:
    """The summary of :meth:`MegatronDims.to_dict` (see there)."""
    rank = default_rank(md.rank_map, rank)
    views: dict[str, Any] = {}
    for name, mesh in md.views().items():
        spec = MEGATRON_VIEWS[name]
        views[name] = {
            "grid": spec.grid,
            "token": spec.token,
            "group_desc": spec.group_desc,
            "getter": spec.getter,
            "purpose": spec.purpose,
            "dims": list(mesh.names),
            "shape": list(mesh.shape),
            "group_size": mesh.size(),
            "num_groups": mesh.num_submeshes,
            "group": mesh.submesh(rank).reshape(-1).tolist(),
        }
    rng = md.rank_map.as_range()
    return {
        "world_size": md.world_size,
        "degrees": md.degrees,
        "order": md.order,
        "full_order": md.full_order,
        "num_distributed_optimizer_instances": md.num_distributed_optimizer_instances,
        "rank_map": (
            {"start": rng.start, "stop": rng.stop, "step": rng.step}
            if rng is not None
            else {"ranks": [int(r) for r in md.rank_map]}
        ),
        "rank": rank,
        "views": views,
    }


def default_rank(rank_map: RankMap, rank: int | None) -> int:
    """``rank`` checked to be in ``rank_map``; None: rank 0 if there, else the first rank."""
    if rank is None:
        return 0 if 0 in rank_map else rank_map[0]
    r = check_int(rank, "rank")
    if r not in rank_map:
        raise ValueError(f"rank {r} is not in this world ({rank_map!r})")
    return r
