"""MegatronDims: the dense and expert grids of Megatron-Core, and every view of them.

The class holds the checked configuration (:mod:`._config`) and derives the two
root meshes and each view of :data:`~meshlayout.megatron.MEGATRON_VIEWS` from
them by slicing, flattening and unflattening: no rank arithmetic here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from ..inttuple import check_int
from ..mesh import Mesh
from ..rank_map import RankMap
from ._config import (
    DEFAULT_ORDER,
    DENSE_NAMES,
    EXPERT_NAMES,
    check_instances,
    check_pipeline_rule,
    complete_order,
    infer_degrees,
    parse_tokens,
    pipeline_groups_error,
)
from ._views import MEGATRON_VIEWS, VIEWS, view_name

__all__ = ["MegatronDims"]

IntArray = npt.NDArray[np.int64]


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
        degrees = infer_degrees(world, sizes, given_dp)
        tokens = parse_tokens(order)
        full = complete_order(order, tokens, degrees)
        check_pipeline_rule(order, tokens, degrees)
        rank_map = RankMap(range(world) if ranks is None else ranks)
        if len(rank_map) != world:
            raise ValueError(f"ranks has {len(rank_map)} entries but world_size is {world}")
        check_instances(instances, degrees)
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
            if any(n is not None and d[n] > 1 for n in (DENSE_NAMES[t], EXPERT_NAMES[t]))
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
        return self._root(DENSE_NAMES)

    @functools.cached_property
    def expert(self) -> Mesh:
        """The expert grid: dims ``pp, edp, ep, etp`` in rank-space order, outermost first."""
        return self._root(EXPERT_NAMES)

    def _root(self, names: Mapping[str, str | None]) -> Mesh:
        dims = [names[t] for t in reversed(self._full_order)]
        shape = {n: self._degrees[n] for n in dims if n is not None}
        return Mesh(shape, ranks=self._rank_map)

    def _check_grids(self) -> None:
        # Megatron asserts that both grids give the same pipeline groups.
        if self.dense["pp"] != self.expert["pp"]:
            raise pipeline_groups_error(self._order, self._full_order, self._degrees)

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
        key = view_name(name)
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
        grid_names = DENSE_NAMES if spec.grid == "dense" else EXPERT_NAMES
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
        key = view_name(name)
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


class _NotAMeshError(ValueError):
    """A view whose groups are not congruent layouts (so not a Mesh) for this configuration."""


def _restore(world: int, kwargs: dict[str, Any]) -> MegatronDims:
    return MegatronDims(world, **kwargs)


# ---------------------------------------------------------------------- views


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
