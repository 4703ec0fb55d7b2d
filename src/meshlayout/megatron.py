"""Megatron-Core's process groups, exactly, as meshes over one rank map (layer 3).

Megatron-Core (``megatron.core.parallel_state.initialize_model_parallel``) places
ranks by an order string such as the default ``"tp-cp-ep-dp-pp"``, which lists
the parallel dims **innermost first**: consecutive ranks differ in ``tp``, then
``cp``, and so on. It lays out two grids over the same world with that one
string:

- the **dense** grid ``tp, cp, dp, pp`` (``ep`` is 1 there), for attention and
  dense layers, and
- the **expert** grid ``etp, ep, edp, pp`` (``tp`` in the string stands for the
  expert tensor-parallel size ``etp``, ``dp`` for the expert data-parallel size
  ``edp``; ``cp`` is 1 there), for MoE layers.

Each grid is a layout over rank space whose strides follow the order, so
:class:`MegatronDims` holds the two as root :class:`~meshlayout.mesh.Mesh`
objects (dims outermost first, i.e. the order string reversed) over one shared
rank map, and every group Megatron creates is a view of one of them: its
members, their order and the order of the groups are Megatron's.

>>> md = MegatronDims(16, tp=2, pp=2, ep=4)
>>> md.dense, md.expert
(Mesh(pp=2, dp=4, cp=1, tp=2), Mesh(pp=2, edp=1, ep=4, etp=2))
>>> md.mesh("dp").group(0, "dp"), md.mesh("ep").group(0, "ep")
((0, 2, 4, 6), (0, 2, 4, 6))

The expert dims follow the order string too: with ``ep`` outside ``dp``, an
expert-parallel group strides over the data-parallel ranks.

>>> MegatronDims(8, ep=2, order="tp-dp-cp-ep-pp").mesh("ep").group(0, "ep")
(0, 4)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .inttuple import check_int
from .mesh import Mesh
from .rank_map import RankMap

__all__ = [
    "ALIASES",
    "DEFAULT_ORDER",
    "MEGATRON_VIEWS",
    "ORDER_TOKENS",
    "VIEWS",
    "MegatronDims",
    "MegatronView",
    "parallel_dims_order",
]

IntArray = npt.NDArray[np.int64]

#: The tokens of a Megatron order string.
ORDER_TOKENS: tuple[str, ...] = ("tp", "cp", "ep", "dp", "pp")
#: Megatron-Core's default order (``initialize_model_parallel(order=...)``), innermost first.
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
# Megatron's RankGenerator appends the dims an order leaves out in this order.
_APPEND_ORDER: tuple[str, ...] = ("tp", "pp", "dp", "ep", "cp")
# Token -> dim name of the root mesh, per grid (None: the token has size 1 there).
_DENSE_NAMES: dict[str, str | None] = {"tp": "tp", "cp": "cp", "ep": None, "dp": "dp", "pp": "pp"}
_EXPERT_NAMES: dict[str, str | None] = {
    "tp": "etp",
    "cp": None,
    "ep": "ep",
    "dp": "edp",
    "pp": "pp",
}


@dataclass(frozen=True)
class MegatronView:
    """One kind of process group Megatron-Core creates, as a view of :class:`MegatronDims`.

    ``grid`` is ``"dense"`` or ``"expert"``; ``token`` is the
    ``RankGenerator.get_ranks`` token on that grid (empty for the distributed-
    optimizer views, which split another view); ``group_desc`` is the name
    Megatron gives the groups; ``getter`` is the ``parallel_state`` call that
    returns a rank's group.
    """

    name: str
    grid: str
    token: str
    group_desc: str
    getter: str
    purpose: str


def _views(*rows: tuple[str, str, str, str, str, str]) -> dict[str, MegatronView]:
    return {r[0]: MegatronView(*r) for r in rows}


#: Every view, in the order :meth:`MegatronDims.views` returns them.
MEGATRON_VIEWS: dict[str, MegatronView] = _views(
    ("tp", "dense", "tp", "TENSOR_MODEL_PARALLEL_GROUP", "get_tensor_model_parallel_group()",
     "tensor parallel: activation all-reduce / all-gather / reduce-scatter in a layer"),
    ("cp", "dense", "cp", "CONTEXT_PARALLEL_GROUP", "get_context_parallel_group()",
     "context parallel: sequence chunks exchange K/V"),
    ("dp", "dense", "dp", "DATA_PARALLEL_GROUP", "get_data_parallel_group()",
     "data parallel: ranks that read different samples"),
    ("pp", "dense", "pp", "PIPELINE_MODEL_PARALLEL_GROUP", "get_pipeline_model_parallel_group()",
     "pipeline stages: send/recv of activations; the embedding groups are its first and last rank"),
    ("dp_cp", "dense", "dp-cp", "DATA_PARALLEL_GROUP_WITH_CP",
     "get_data_parallel_group(with_context_parallel=True)",
     "gradient all-reduce / reduce-scatter and the distributed optimizer (dp x cp)"),
    ("tp_cp", "dense", "tp-cp", "TENSOR_AND_CONTEXT_PARALLEL_GROUP",
     "get_tensor_and_context_parallel_group()", "tensor and context parallel together"),
    ("tp_dp", "dense", "tp-dp", "TENSOR_AND_DATA_PARALLEL_GROUP",
     "get_tensor_and_data_parallel_group()", "tensor and data parallel together"),
    ("tp_dp_cp", "dense", "tp-dp-cp", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
     "get_tensor_and_data_parallel_group(with_context_parallel=True)",
     "tensor, data and context parallel together (e.g. MoE router token counts, FP8 amax)"),
    ("mp", "dense", "tp-pp", "MODEL_PARALLEL_GROUP", "get_model_parallel_group()",
     "model parallel (tp x pp): e.g. gradient-norm and overflow reductions"),
    ("ep", "expert", "ep", "EXPERT_MODEL_PARALLEL_GROUP", "get_expert_model_parallel_group()",
     "expert parallel: token dispatch / combine all-to-all"),
    ("etp", "expert", "tp", "EXPERT_TENSOR_PARALLEL_GROUP", "get_expert_tensor_parallel_group()",
     "expert tensor parallel: tensor parallel inside each expert"),
    ("edp", "expert", "dp", "EXPERT_DATA_PARALLEL_GROUP", "get_expert_data_parallel_group()",
     "expert data parallel: gradient reduction of expert weights"),
    ("tp_ep", "expert", "tp-ep", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
     "get_expert_tensor_and_model_parallel_group()", "expert tensor and expert parallel together"),
    ("tp_ep_pp", "expert", "tp-ep-pp", "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
     "get_expert_tensor_model_pipeline_parallel_group()",
     "expert model parallel (etp x ep x pp): model-parallel reductions of MoE models"),
    ("intra_dp_cp", "dense", "", "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
     "get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)",
     "one distributed-optimizer instance's share of each dp_cp group"),
    ("intra_edp", "expert", "", "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0",
     "get_expert_data_parallel_group(partial_expert_data_parallel=True)",
     "one distributed-optimizer instance's share of each edp group"),
    ("inter_edp", "expert", "", "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L1",
     "get_inter_distributed_optimizer_instance_group()",
     "the same edp slot across distributed-optimizer instances"),
    ("intra_dist_opt", "expert", "", "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
     "get_intra_distributed_optimizer_instance_group()",
     "every rank of one distributed-optimizer instance (edp share x tp_ep_pp)"),
)  # fmt: skip

#: What each view is for (as :data:`meshlayout.parallel_dims.VIEWS` for ParallelDims).
VIEWS: dict[str, str] = {name: view.purpose for name, view in MEGATRON_VIEWS.items()}

#: Other spellings accepted by :meth:`MegatronDims.mesh` (hyphens also read as underscores).
ALIASES: dict[str, str] = {
    "tp_pp": "mp",
    "model_parallel": "mp",
    "etp_ep": "tp_ep",
    "etp_ep_pp": "tp_ep_pp",
    "expert_tp": "etp",
    "expert_dp": "edp",
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
    for token in reversed(_parse_tokens(order)):
        if token == "dp":
            out += ["dp_replicate", "dp_shard"]
        elif token != "ep":
            out.append(token)
    return tuple(out)


def _parse_tokens(order: object) -> tuple[str, ...]:
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


class MegatronDims:
    """Megatron-Core's dense and expert process groups as meshes over one world.

    ``MegatronDims(world_size, *, tp=1, pp=1, cp=1, ep=1, etp=None, dp=-1,
    order="tp-cp-ep-dp-pp", num_distributed_optimizer_instances=1, ranks=None)``
    takes the arguments of ``initialize_model_parallel`` under short names:
    ``tp`` = ``tensor_model_parallel_size``, ``pp``, ``cp``, ``ep`` =
    ``expert_model_parallel_size``, ``etp`` = ``expert_tensor_parallel_size``
    (default ``tp``), ``order`` and ``num_distributed_optimizer_instances``.
    ``dp = world/(tp*cp*pp)`` and ``edp = world/(etp*ep*pp)`` are inferred (give
    ``dp`` to have it checked). ``ranks`` are the global ranks in Megatron's rank
    order (default ``range(world_size)``; ``range(k, k + world_size)`` is
    Megatron's ``rank_offset=k``).

    It accepts exactly the configurations ``initialize_model_parallel`` accepts:
    the order may leave out dims of size 1 (Megatron appends them), and when
    ``pp`` is not last, ``pp > 1`` needs ``edp == dp`` and the pipeline groups of
    the two grids must coincide. Every refusal is a ValueError that says why.

    >>> md = MegatronDims(32, tp=2, cp=2, pp=2, ep=4, etp=1)
    >>> md.degrees
    {'tp': 2, 'cp': 2, 'dp': 4, 'pp': 2, 'ep': 4, 'etp': 1, 'edp': 4}
    >>> md.mesh("dp_cp").group(0, "dp_cp")
    (0, 2, 4, 6, 8, 10, 12, 14)
    >>> md.mesh("tp_ep_pp").group(0, "tp_ep_pp")
    (0, 1, 2, 3, 16, 17, 18, 19)
    >>> MegatronDims(8, tp=2, cp=2, order="tp-dp-pp")
    Traceback (most recent call last):
    ...
    ValueError: order 'tp-dp-pp' leaves out 'cp', but cp=2; Megatron places only dims of size 1 itself (it appends them outermost): name every dim of size > 1, e.g. 'tp-cp-dp-pp'
    """

    __slots__ = ("__dict__", "_degrees", "_full_order", "_instances", "_order", "_rank_map")

    _degrees: dict[str, int]
    _order: str
    _full_order: tuple[str, ...]
    _instances: int
    _rank_map: RankMap

    def __init__(
        self,
        world_size: int,
        *,
        tp: int = 1,
        pp: int = 1,
        cp: int = 1,
        ep: int = 1,
        etp: int | None = None,
        dp: int = -1,
        order: str = DEFAULT_ORDER,
        num_distributed_optimizer_instances: int = 1,
        ranks: Any = None,
    ) -> None:
        world = check_int(world_size, "world_size", minimum=1)
        sizes = {
            "tp": check_int(tp, "tp", minimum=1),
            "cp": check_int(cp, "cp", minimum=1),
            "pp": check_int(pp, "pp", minimum=1),
            "ep": check_int(ep, "ep", minimum=1),
            "etp": check_int(tp if etp is None else etp, "etp", minimum=1),
        }
        given_dp = check_int(dp, "dp")
        if given_dp != -1 and given_dp < 1:
            raise ValueError(f"dp must be >= 1 (or -1 to infer it), got {given_dp}")
        instances = check_int(
            num_distributed_optimizer_instances, "num_distributed_optimizer_instances", minimum=1
        )
        degrees = _infer_degrees(world, sizes, given_dp)
        tokens = _parse_tokens(order)
        full = _complete_order(order, tokens, degrees)
        _check_pipeline_rule(order, tokens, degrees)
        rank_map = RankMap(range(world) if ranks is None else ranks)
        if len(rank_map) != world:
            raise ValueError(f"ranks has {len(rank_map)} entries but world_size is {world}")
        _check_instances(instances, degrees)
        object.__setattr__(self, "_degrees", degrees)
        object.__setattr__(self, "_order", "-".join(tokens))
        object.__setattr__(self, "_full_order", full)
        object.__setattr__(self, "_instances", instances)
        object.__setattr__(self, "_rank_map", rank_map)
        self._check_grids()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"MegatronDims is immutable; cannot set {name!r}")

    def __reduce__(self) -> tuple[Any, ...]:
        d = self._degrees
        kwargs: dict[str, Any] = {k: d[k] for k in ("tp", "pp", "cp", "ep", "etp", "dp")}
        kwargs.update(
            order=self._order,
            num_distributed_optimizer_instances=self._instances,
            ranks=self._rank_map,
        )
        return (_restore, (self.world_size, kwargs))

    # ------------------------------------------------------------------ configuration
    @property
    def world_size(self) -> int:
        """Number of ranks."""
        return len(self._rank_map)

    @property
    def degrees(self) -> dict[str, int]:
        """``tp, cp, dp, pp, ep, etp, edp`` (inferred ones filled in; a copy)."""
        return dict(self._degrees)

    @property
    def order(self) -> str:
        """The order string as given (lower-cased), innermost first."""
        return self._order

    @property
    def full_order(self) -> str:
        """The order Megatron's RankGenerator uses: the given one with left-out dims appended."""
        return "-".join(self._full_order)

    @property
    def num_distributed_optimizer_instances(self) -> int:
        """How many distributed-optimizer instances split the data-parallel ranks."""
        return self._instances

    @property
    def rank_map(self) -> RankMap:
        """The one rank map every view shares: Megatron rank index -> global rank."""
        return self._rank_map

    @property
    def rank_order(self) -> tuple[str, ...]:
        """The order's tokens outermost first: :attr:`full_order` reversed.

        >>> MegatronDims(8, tp=2, order="tp-dp-pp").rank_order
        ('cp', 'ep', 'pp', 'dp', 'tp')
        """
        return tuple(reversed(self._full_order))

    @property
    def view_purposes(self) -> dict[str, str]:
        """What each view's groups are for (:data:`VIEWS`), for the views :meth:`views` returns."""
        return {name: VIEWS[name] for name in self.views()}

    def enabled(self, name: str) -> bool:
        """True if the degree or view ``name`` has more than one rank per group.

        >>> md = MegatronDims(8, tp=2, ep=2)
        >>> md.enabled("tp"), md.enabled("cp"), md.enabled("edp"), md.enabled("dp_cp")
        (True, False, True, True)
        """
        if name in self._degrees:
            return self._degrees[name] > 1
        return self.mesh(name).size() > 1

    def __repr__(self) -> str:
        degs = ", ".join(f"{k}={v}" for k, v in self._degrees.items() if k != "edp")
        extra = "" if self._order == DEFAULT_ORDER else f", order={self._order!r}"
        if self._instances != 1:
            extra += f", num_distributed_optimizer_instances={self._instances}"
        if self._rank_map.as_range() != range(self.world_size):
            extra += f", ranks={self._rank_map!r}"
        return f"MegatronDims({self.world_size}, {degs}{extra})"

    def _key(self) -> tuple[Any, ...]:
        # Dims of size 1 on both grids move no rank: where the order puts them does not matter.
        d = self._degrees
        placed = tuple(
            t
            for t in self._full_order
            if any(n is not None and d[n] > 1 for n in (_DENSE_NAMES[t], _EXPERT_NAMES[t]))
        )
        return (tuple(d.items()), placed, self._instances, self._rank_map)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MegatronDims):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # ------------------------------------------------------------------ meshes
    @functools.cached_property
    def dense(self) -> Mesh:
        """The dense grid: dims ``pp, dp, cp, tp`` in rank-space order, outermost first."""
        return self._root(_DENSE_NAMES)

    @functools.cached_property
    def expert(self) -> Mesh:
        """The expert grid: dims ``pp, edp, ep, etp`` in rank-space order, outermost first."""
        return self._root(_EXPERT_NAMES)

    def _root(self, names: Mapping[str, str | None]) -> Mesh:
        dims = [names[t] for t in reversed(self._full_order)]
        shape = {n: self._degrees[n] for n in dims if n is not None}
        return Mesh(shape, ranks=self._rank_map)

    def _check_grids(self) -> None:
        # Megatron asserts that both grids give the same pipeline groups.
        if self.dense["pp"] != self.expert["pp"]:
            d = self._degrees
            inner = self._full_order[: self._full_order.index("pp")]
            dense = "*".join(f"{t}={d[t]}" for t in inner if _DENSE_NAMES[t]) or "1"
            expert = "*".join(f"{_EXPERT_NAMES[t]}={d[str(_EXPERT_NAMES[t])]}"
                              for t in inner if _EXPERT_NAMES[t]) or "1"  # fmt: skip
            raise ValueError(
                f"order {self._order!r} gives different pipeline groups to the dense and the "
                f"expert grid: the dims inside pp multiply to {dense} (dense) but {expert} "
                "(expert); Megatron requires the same pipeline groups (put pp last)"
            )

    def mesh(self, name_or_names: str | Sequence[str]) -> Mesh:
        """One view by name, or several non-overlapping views of one grid side by side.

        Names are those of :data:`MEGATRON_VIEWS` (hyphens read as underscores,
        plus :data:`ALIASES`).

        >>> md = MegatronDims(16, tp=2, cp=2, pp=2)
        >>> md.mesh("dp-cp") == md.mesh("dp_cp")
        True
        >>> md.mesh(("pp", "dp_cp", "tp")).names
        ('pp', 'dp_cp', 'tp')
        """
        if isinstance(name_or_names, str):
            return self._view(name_or_names)
        if not isinstance(name_or_names, Sequence) or not name_or_names:
            raise TypeError(
                "mesh() takes a view name or a non-empty sequence of view names, got "
                f"{name_or_names!r}; valid views are {list(MEGATRON_VIEWS)}"
            )
        names = tuple(name_or_names)
        meshes = [self._view(n) for n in names]
        if len(meshes) == 1:
            return meshes[0]
        try:
            return Mesh.concat(meshes)
        except ValueError as exc:
            raise ValueError(f"views {list(names)} overlap and cannot be combined: {exc}") from None

    def views(self) -> dict[str, Mesh]:
        """Every view that is a mesh, in the order of :data:`MEGATRON_VIEWS`.

        One view may be missing: ``intra_dp_cp`` when the distributed-optimizer
        instances cut each ``dp_cp`` group into chunks that are not congruent
        layouts (e.g. ``dp=3, cp=2`` in 2 instances); :meth:`groups` still lists
        its groups.
        """
        out: dict[str, Mesh] = {}
        for name in MEGATRON_VIEWS:
            try:
                out[name] = self._view(name)
            except _NotAMeshError:
                continue
        return out

    def _view(self, name: str) -> Mesh:
        key = _view_name(name)
        cache: dict[str, Mesh] = self.__dict__.setdefault("_views", {})
        mesh = cache.get(key)
        if mesh is None:
            mesh = cache[key] = _BUILDERS[key](self)
        return mesh

    def _grid(self, grid: str) -> Mesh:
        return self.dense if grid == "dense" else self.expert

    def _token_view(self, name: str) -> Mesh:
        """The groups of ``get_ranks(token)``: the token's dims in grid order, flattened."""
        spec = MEGATRON_VIEWS[name]
        grid_names = _DENSE_NAMES if spec.grid == "dense" else _EXPERT_NAMES
        root = self._grid(spec.grid)
        wanted = {grid_names[t] for t in spec.token.split("-")}
        chosen = tuple(n for n in root.names if n in wanted)
        return root[chosen].flatten(name)

    def _split(self, parent: str, outer: str, inner: str) -> Mesh:
        """``parent`` cut into ``num_distributed_optimizer_instances`` consecutive chunks."""
        mesh = self._view(parent)
        n = self._instances
        try:
            return mesh.unflatten(0, (n, mesh.size() // n), (outer, inner))
        except ValueError:
            raise _NotAMeshError(
                f"num_distributed_optimizer_instances={n} cuts each {parent} group of "
                f"{mesh.size()} ranks (in order {self.full_order!r}) into chunks that are not "
                "congruent layouts, so they are not a mesh; choose a number of instances that "
                f"divides the outermost dim of {parent} (or is a multiple of it)"
            ) from None

    def _intra_dist_opt(self) -> Mesh:
        n = self._instances
        edp = self._degrees["edp"]
        split = self.expert.unflatten("edp", (n, edp // n), ("edp_inter", "edp_intra"))
        dims = ("edp_intra", *(d for d in split.names if d in ("pp", "ep", "etp")))
        return split[dims].flatten("intra_dist_opt")

    # ------------------------------------------------------------------ groups
    def groups(self, name: str) -> IntArray:
        """Every group of a view, as Megatron creates them: shape ``(num_groups, size)``.

        Rows are in Megatron's creation order and members in Megatron's order.
        For the views of one grid that is the order of their first rank (as
        :meth:`Mesh.group_table`); the distributed-optimizer splits list the chunks
        of each parent group in turn. O(world).

        >>> MegatronDims(8, tp=2, cp=2).groups("dp_cp").tolist()
        [[0, 2, 4, 6], [1, 3, 5, 7]]
        >>> MegatronDims(8, tp=2, cp=2, num_distributed_optimizer_instances=2).groups("intra_dp_cp").tolist()
        [[0, 2], [4, 6], [1, 3], [5, 7]]
        """
        key = _view_name(name)
        n = self._instances
        if key in ("intra_dp_cp", "intra_edp"):  # each parent group cut into n chunks
            parent = self.groups("dp_cp" if key == "intra_dp_cp" else "edp")
            return parent.reshape(-1, parent.shape[1] // n)
        if key == "inter_edp":  # the same slot of each chunk
            parent = self.groups("edp")
            inter: IntArray = parent.reshape(parent.shape[0], n, -1).transpose(0, 2, 1)
            return inter.reshape(-1, n)
        return self._view(key).group_table()

    def embedding_groups(self) -> IntArray:
        """Megatron's default embedding groups: the first and last rank of each pp group.

        >>> MegatronDims(8, tp=2, pp=4).embedding_groups().tolist()
        [[0, 6], [1, 7]]
        """
        pp = self.groups("pp")
        out: IntArray = pp[:, [0, -1]] if pp.shape[1] > 1 else pp
        return out

    # ------------------------------------------------------------------ reports
    def describe(self, *, rank: int | None = None, ranks_per_host: int | None = None) -> str:
        """A plain-text table: every view, its shape, number of groups and ``rank``'s group.

        >>> print(MegatronDims(8, tp=2, ep=2).describe(ranks_per_host=4))  # doctest: +ELLIPSIS
        MegatronDims(8, tp=2, cp=1, dp=4, pp=1, ep=2, etp=2)
        order tp-cp-ep-dp-pp (innermost first): dense (pp, dp, cp, tp), expert (pp, edp, ep, etp)
        view            size  groups  group of rank 0           hosts                Megatron
        tp              2     4       [0, 1]                    stays within a host  get_tensor_model_parallel_group()
        cp              1     8       [0]                       stays within a host  get_context_parallel_group()
        dp              4     2       [0, 2, 4, 6]              crosses 2 hosts      get_data_parallel_group()
        ...
        """
        rank = _default_rank(self._rank_map, rank)
        hosts = (
            None
            if ranks_per_host is None
            else check_int(ranks_per_host, "ranks_per_host", minimum=1)
        )
        header = ["view", "size", "groups", f"group of rank {rank}"]
        header += ["hosts"] if hosts is not None else []
        rows = [[*header, "Megatron"]]
        for name, mesh in self.views().items():
            row = [name, str(mesh.size()), str(mesh.num_submeshes), _abridge(mesh.submesh(rank))]
            if hosts is not None:
                k = int(mesh.hosts_spanned(hosts).max())
                row.append("stays within a host" if k == 1 else f"crosses {k} hosts")
            rows.append([*row, MEGATRON_VIEWS[name].getter])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = [
            repr(self),
            f"order {self.full_order} (innermost first): dense ({', '.join(self.dense.names)}), "
            f"expert ({', '.join(self.expert.names)})",
        ]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
        return "\n".join(lines)

    def to_dict(self, *, rank: int | None = None) -> dict[str, Any]:
        """A JSON-ready summary: degrees, orders, and every view with ``rank``'s group.

        >>> d = MegatronDims(8, tp=2, ep=2).to_dict(rank=3)
        >>> d["views"]["ep"]["group"], d["views"]["ep"]["getter"]
        ([1, 3], 'get_expert_model_parallel_group()')
        """
        rank = _default_rank(self._rank_map, rank)
        views: dict[str, Any] = {}
        for name, mesh in self.views().items():
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
        rng = self._rank_map.as_range()
        return {
            "world_size": self.world_size,
            "degrees": self.degrees,
            "order": self._order,
            "full_order": self.full_order,
            "num_distributed_optimizer_instances": self._instances,
            "rank_map": (
                {"start": rng.start, "stop": rng.stop, "step": rng.step}
                if rng is not None
                else {"ranks": [int(r) for r in self._rank_map]}
            ),
            "rank": rank,
            "views": views,
        }


class _NotAMeshError(ValueError):
    """A view whose groups are not congruent layouts (so not a Mesh) for this configuration."""


def _restore(world: int, kwargs: dict[str, Any]) -> MegatronDims:
    return MegatronDims(world, **kwargs)


# ---------------------------------------------------------------------- views


def _view_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(
            f"a view name is a str, got {name!r}; valid views are {list(MEGATRON_VIEWS)}"
        )
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in MEGATRON_VIEWS:
        raise KeyError(
            f"unknown view {name!r}; valid views are {list(MEGATRON_VIEWS)} "
            f"(also {sorted(ALIASES)})"
        )
    return key


def _token_builder(name: str) -> Callable[[MegatronDims], Mesh]:
    return lambda md: md._token_view(name)


_BUILDERS: dict[str, Callable[[MegatronDims], Mesh]] = {
    **{n: _token_builder(n) for n, v in MEGATRON_VIEWS.items() if v.token},
    "intra_dp_cp": lambda md: md._split("dp_cp", "inter_dp_cp", "intra_dp_cp")["intra_dp_cp"],
    "intra_edp": lambda md: md._split("edp", "inter_edp", "intra_edp")["intra_edp"],
    "inter_edp": lambda md: md._split("edp", "inter_edp", "intra_edp")["inter_edp"],
    "intra_dist_opt": lambda md: md._intra_dist_opt(),
}
assert set(_BUILDERS) == set(MEGATRON_VIEWS)


# ---------------------------------------------------------------------- validation


def _infer_degrees(world: int, sizes: Mapping[str, int], given_dp: int) -> dict[str, int]:
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


def _complete_order(
    order: str, tokens: tuple[str, ...], degrees: Mapping[str, int]
) -> tuple[str, ...]:
    """Megatron's completion: dims left out of the order (all of size 1) appended outermost."""
    missing = [t for t in _APPEND_ORDER if t not in tokens]
    for t in missing:
        big = [
            f"{name}={degrees[name]}"
            for name in (_DENSE_NAMES[t], _EXPERT_NAMES[t])
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


def _check_pipeline_rule(order: str, tokens: tuple[str, ...], degrees: Mapping[str, int]) -> None:
    """Megatron's rule: with pp not last, pp > 1 needs the same dp on both grids."""
    if tokens[-1] != "pp" and degrees["pp"] > 1 and degrees["edp"] != degrees["dp"]:
        raise ValueError(
            f"order {order!r} does not end with pp, so with pp={degrees['pp']} Megatron needs "
            f"the same data-parallel size on both grids, but dp={degrees['dp']} and "
            f"edp={degrees['edp']} (tp*cp = {degrees['tp'] * degrees['cp']} != etp*ep = "
            f"{degrees['etp'] * degrees['ep']}); put pp last or make tp*cp equal etp*ep"
        )


def _check_instances(instances: int, degrees: Mapping[str, int]) -> None:
    dp_cp = degrees["dp"] * degrees["cp"]
    for what, size in (("dp*cp", dp_cp), ("edp", degrees["edp"])):
        if size % instances:
            raise ValueError(
                f"num_distributed_optimizer_instances={instances} does not divide {what} = {size}"
            )


def _default_rank(rank_map: RankMap, rank: int | None) -> int:
    if rank is None:
        return 0 if 0 in rank_map else rank_map[0]
    r = check_int(rank, "rank")
    if r not in rank_map:
        raise ValueError(f"rank {r} is not in this world ({rank_map!r})")
    return r


def _abridge(group: Any, limit: int = 8) -> str:
    flat = np.asarray(group).reshape(-1).tolist()
    if len(flat) <= limit:
        return str(flat)
    return f"[{', '.join(map(str, flat[:limit]))}, … ({len(flat)} ranks)]"
