"""torchtitan's ``ParallelDims`` accessors, on meshlayout's pure meshes (layer 3).

:class:`~meshlayout.ParallelDims` inherits :class:`TorchtitanAccessors`, so a
torchtitan trainer's calls keep their names and meaning: ``get_mesh``,
``get_optional_mesh`` (None for a disabled dim), ``get_all_one_dimensional_meshes``,
``seq_len_divisor``, ``non_data_parallel_size``, the degrees as attributes and the
``*_enabled`` flags. They return pure :class:`~meshlayout.mesh.Mesh` objects; the
same names on the built side (``meshlayout.torch``) return process groups.

torchtitan's "exists" rule (its ``_mesh_exist``) decides which dims are disabled:
``fsdp`` and ``dp_shard`` always exist (FSDP2's ``fully_shard`` needs a mesh even at
size 1, for its mixed-precision policy), ``efsdp`` exists exactly when ``ep > 1``,
and every other dim exists when its size is above 1.

>>> from meshlayout import ParallelDims
>>> pd = ParallelDims(8, dp_shard=2, tp=4)
>>> pd.get_mesh("tp").names, pd.get_optional_mesh("cp")
(('tp',), None)
>>> pd.get_optional_mesh("fsdp").size(), pd.get_optional_mesh("efsdp")
(2, None)
>>> list(pd.get_all_one_dimensional_meshes())
['batch', 'loss', 'fsdp', 'dp_shard', 'tp']
>>> pd.seq_len_divisor, pd.non_data_parallel_size, pd.tp, pd.fsdp_enabled
(8, 4, 4, True)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from .inttuple import flatten
from .mesh import Mesh

__all__ = [
    "MESH_AXIS_NAMES",
    "ONE_DIMENSIONAL",
    "SPMD_BACKENDS",
    "SPMD_DENSE_AXES",
    "SPMD_SPARSE_AXES",
    "TORCHTITAN_NAMES",
    "TorchtitanAccessors",
    "TorchtitanMeshes",
    "Views",
    "single_axis_names",
]

#: Every name the accessors take: torchtitan's, then meshlayout's 2-D views.
#: ``dp`` is torchtitan's newer name of ``batch`` (``dp_replicate x dp_shard``).
TORCHTITAN_NAMES: tuple[str, ...] = (
    "pp", "batch", "loss", "dp_replicate", "fsdp", "dp_shard", "dp",
    "cp", "tp", "ep", "efsdp", "etp", "hsdp", "ehsdp",
)  # fmt: skip
#: What ``get_all_one_dimensional_meshes`` looks at, in torchtitan's order
#: (``dp`` is left out: it repeats ``batch``).
ONE_DIMENSIONAL: tuple[str, ...] = (
    "pp", "batch", "loss", "dp_replicate", "fsdp", "dp_shard", "cp", "tp", "ep", "efsdp", "etp",
)  # fmt: skip
_ALWAYS = ("fsdp", "dp_shard")


class TorchtitanAccessors:
    """torchtitan's names on a :class:`~meshlayout.ParallelDims` (see the module docstring)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _degrees: dict[str, int]

        def mesh(self, name_or_names: str | Sequence[str]) -> Mesh: ...

    # ------------------------------------------------------------------ meshes
    def torchtitan(self, spmd_backend: str = "spmd_types") -> TorchtitanMeshes:
        """torchtitan 0.3.0's accessors for one SPMD backend, exactly (:class:`TorchtitanMeshes`).

        The accessors on this object itself are lenient (every backend's names and
        meshlayout's own); this one takes only ``spmd_backend``'s names. Cached.

        >>> from meshlayout import ParallelDims
        >>> ParallelDims(8, dp_shard=2, tp=4).torchtitan("partial_dtensor").get_mesh("fsdp").size()
        2
        """
        cache: dict[str, TorchtitanMeshes] = self.__dict__.setdefault("_torchtitan", {})
        hit = cache.get(spmd_backend)
        if hit is None:
            hit = cache[spmd_backend] = TorchtitanMeshes(self, spmd_backend)  # type: ignore[arg-type]
        return hit

    def mesh_exists(self, name: str) -> bool:
        """torchtitan's rule: is the dim ``name`` enabled (does it get a real group)?

        ``fsdp`` and ``dp_shard``: always; ``efsdp``: when ``ep > 1``; ``hsdp`` and
        ``ehsdp``: when both of their dims exist; any other: when its size is > 1.

        >>> from meshlayout import ParallelDims
        >>> pd = ParallelDims(4, tp=4, ep=2)
        >>> [pd.mesh_exists(n) for n in ("fsdp", "efsdp", "tp", "cp", "hsdp")]
        [True, True, True, False, False]
        """
        key = _check_name(name)
        if key in _ALWAYS:
            return True
        if key == "efsdp":
            return self._degrees["ep"] > 1
        if key == "hsdp":
            return self.mesh_exists("dp_replicate")
        if key == "ehsdp":
            return self.mesh_exists("dp_replicate") and self.mesh_exists("efsdp")
        return self._torchtitan_mesh(key).size() > 1

    def get_optional_mesh(
        self, dims: str | Sequence[str], *, include_singleton_axes: bool = False
    ) -> Mesh | None:
        """The mesh of ``dims`` (one name or several, side by side), or None if one is disabled.

        As torchtitan's ``get_optional_mesh``: None as soon as one of ``dims`` does
        not exist (:meth:`mesh_exists`), unless ``include_singleton_axes``. Names are
        :data:`TORCHTITAN_NAMES`; an unknown name, or dims that overlap, raise
        ValueError (torchtitan's "Invalid mesh dim" / "Invalid mesh name combinations").

        >>> from meshlayout import ParallelDims
        >>> pd = ParallelDims(8, dp_replicate=2, dp_shard=2, tp=2)
        >>> pd.get_optional_mesh(["dp_replicate", "fsdp"]) == pd.mesh("hsdp")
        True
        >>> pd.get_optional_mesh(["dp_replicate", "cp"]) is None
        True
        >>> pd.get_optional_mesh("cp", include_singleton_axes=True).size()
        1
        """
        names = _check_dims(dims)
        if not include_singleton_axes and not all(self.mesh_exists(n) for n in names):
            return None
        meshes = [self._torchtitan_mesh(n) for n in names]
        if len(meshes) == 1:
            return meshes[0]
        try:
            return Mesh.concat(meshes)
        except ValueError as exc:
            raise ValueError(f"invalid mesh name combination {list(names)}: {exc}") from None

    def get_mesh(self, dims: str | Sequence[str]) -> Mesh:
        """The mesh of ``dims``; ValueError if one of them is disabled (torchtitan's ``get_mesh``).

        >>> from meshlayout import ParallelDims
        >>> ParallelDims(8, tp=2).get_mesh("cp")
        Traceback (most recent call last):
        ...
        ValueError: mesh 'cp' is not available: cp has size 1 (disabled); use get_optional_mesh to get None instead
        """
        mesh = self.get_optional_mesh(dims)
        if mesh is None:
            off = [n for n in _check_dims(dims) if not self.mesh_exists(n)]
            raise ValueError(
                f"mesh {dims!r} is not available: {'; '.join(self._why_disabled(n) for n in off)}; "
                "use get_optional_mesh to get None instead"
            )
        return mesh

    def _why_disabled(self, name: str) -> str:
        if name == "efsdp":
            return f"efsdp exists only when ep > 1 (ep={self.ep})"
        if name in ("hsdp", "ehsdp"):
            need = "dp_replicate > 1" + (" and ep > 1" if name == "ehsdp" else "")
            return (
                f"{name} exists only when {need} (dp_replicate={self.dp_replicate}, ep={self.ep})"
            )
        return f"{name} has size {self._torchtitan_mesh(name).size()} (disabled)"

    def get_all_one_dimensional_meshes(self) -> dict[str, Mesh]:
        """Every enabled 1-D mesh by name: size > 1 and existing, in torchtitan's order.

        The names are :data:`ONE_DIMENSIONAL`. As in current torchtitan, a dim that
        does not exist is left out even when its size is > 1 (``efsdp`` without EP).

        >>> from meshlayout import ParallelDims
        >>> list(ParallelDims(8, pp=2, dp_replicate=2, tp=2).get_all_one_dimensional_meshes())
        ['pp', 'batch', 'loss', 'dp_replicate', 'tp']
        """
        out: dict[str, Mesh] = {}
        for name in ONE_DIMENSIONAL:
            mesh = self._torchtitan_mesh(name)
            if mesh.size() > 1 and self.mesh_exists(name):
                out[name] = mesh
        return out

    def _torchtitan_mesh(self, name: str) -> Mesh:
        if name == "dp":
            return self.mesh("batch").flatten("dp")
        return self.mesh(name)

    # ------------------------------------------------------------------ sizes
    @property
    def seq_len_divisor(self) -> int:
        """``tp * cp * 2``: sequence parallel splits the sequence by tp, load-balanced CP by 2*cp."""
        return self._degrees["tp"] * self._degrees["cp"] * 2

    @property
    def non_data_parallel_size(self) -> int:
        """``cp * tp * pp``: the ranks that share one sample (for per-rank throughput)."""
        d = self._degrees
        return d["cp"] * d["tp"] * d["pp"]

    @property
    def pp(self) -> int:
        """The pipeline-parallel degree."""
        return self._degrees["pp"]

    @property
    def dp_replicate(self) -> int:
        """The replicated data-parallel degree."""
        return self._degrees["dp_replicate"]

    @property
    def dp_shard(self) -> int:
        """The sharded data-parallel degree (inferred when given as -1)."""
        return self._degrees["dp_shard"]

    @property
    def cp(self) -> int:
        """The context-parallel degree."""
        return self._degrees["cp"]

    @property
    def tp(self) -> int:
        """The tensor-parallel degree."""
        return self._degrees["tp"]

    @property
    def ep(self) -> int:
        """The expert-parallel degree."""
        return self._degrees["ep"]

    @property
    def etp(self) -> int:
        """The expert tensor-parallel degree."""
        return self._degrees["etp"]

    # ------------------------------------------------------------------ flags
    @property
    def dp_enabled(self) -> bool:
        """``dp_replicate > 1 or dp_shard > 1``."""
        return self.dp_replicate > 1 or self.dp_shard > 1

    @property
    def dp_replicate_enabled(self) -> bool:
        """``dp_replicate > 1``."""
        return self.dp_replicate > 1

    @property
    def dp_shard_enabled(self) -> bool:
        """``dp_shard > 1``."""
        return self.dp_shard > 1

    @property
    def cp_enabled(self) -> bool:
        """``cp > 1``."""
        return self.cp > 1

    @property
    def dp_cp_enabled(self) -> bool:
        """``dp_enabled or cp_enabled``."""
        return self.dp_enabled or self.cp_enabled

    @property
    def fsdp_enabled(self) -> bool:
        """``dp_shard_enabled or cp_enabled``."""
        return self.dp_shard_enabled or self.cp_enabled

    @property
    def tp_enabled(self) -> bool:
        """``tp > 1``."""
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        """``pp > 1``."""
        return self.pp > 1

    @property
    def ep_enabled(self) -> bool:
        """``ep > 1``."""
        return self.ep > 1

    @property
    def etp_enabled(self) -> bool:
        """``etp > 1``."""
        return self.etp > 1


def _check_name(name: object) -> str:
    if not isinstance(name, str) or name not in TORCHTITAN_NAMES:
        raise ValueError(f"invalid mesh dim {name!r}; valid dims are {list(TORCHTITAN_NAMES)}")
    return name


def _check_dims(dims: object) -> tuple[str, ...]:
    if isinstance(dims, str):
        return (_check_name(dims),)
    if not isinstance(dims, (list, tuple)) or not dims:
        raise ValueError(
            f"dims must be a mesh dim name or a non-empty list of names, got {dims!r}; "
            f"valid dims are {list(TORCHTITAN_NAMES)}"
        )
    return tuple(_check_name(n) for n in dims)


# ====================================================================== torchtitan 0.3.0, exactly

#: torchtitan 0.3.0's SPMD backends (``ParallelismConfig.spmd_backend``), its default first.
SPMD_BACKENDS: tuple[str, ...] = ("spmd_types", "partial_dtensor", "full_dtensor")
#: The values of torchtitan 0.3.0's ``MeshAxisName`` enum.
MESH_AXIS_NAMES: tuple[str, ...] = (
    "dp", "dp_replicate", "dp_shard", "fsdp", "tp", "cp", "pp", "ep", "efsdp",
)  # fmt: skip
_COMMON_AXES = ("pp", "batch", "loss", "dp_replicate", "cp", "tp", "ep", "efsdp")
_BACKEND_AXES = {
    "spmd_types": ("dp", "dp_shard"),
    "partial_dtensor": ("fsdp",),
    "full_dtensor": ("dp_shard",),
}
#: Per backend, torchtitan's dense axes for its SPMD mesh (``candidate_spmd_dense_axes``).
SPMD_DENSE_AXES = {
    "spmd_types": ("dp", "cp", "tp"),
    "partial_dtensor": ("dp_replicate", "fsdp", "tp"),
    "full_dtensor": ("dp_replicate", "dp_shard", "cp", "tp"),
}
SPMD_SPARSE_AXES = ("dp_replicate", "efsdp", "ep")
#: Per backend, the axes ``resolve_mesh`` keeps (None: all, after unfolding ``dp``).
_IN_BAND = {"spmd_types": ("dp", "cp", "tp", "ep"), "partial_dtensor": ("tp", "ep")}


class Views(Protocol):
    """What :class:`TorchtitanMeshes` reads of a ``ParallelDims`` (no import of it: no cycle)."""

    @property
    def dense(self) -> Mesh: ...

    @property
    def sparse(self) -> Mesh: ...

    @property
    def dataloading(self) -> Mesh: ...

    @property
    def ep(self) -> int: ...

    @property
    def etp(self) -> int: ...

    def mesh(self, name_or_names: str | Sequence[str]) -> Mesh: ...


def single_axis_names(spmd_backend: str) -> tuple[str, ...]:
    """The names torchtitan 0.3.0's accessors take under ``spmd_backend``, in its order.

    >>> single_axis_names("partial_dtensor")
    ('pp', 'batch', 'loss', 'dp_replicate', 'cp', 'tp', 'ep', 'efsdp', 'fsdp')
    """
    return _COMMON_AXES + _BACKEND_AXES[_check_backend(spmd_backend)]


def _check_backend(spmd_backend: object) -> str:
    if not isinstance(spmd_backend, str) or spmd_backend not in SPMD_BACKENDS:
        raise ValueError(
            f"spmd_backend {spmd_backend!r} is not one of torchtitan 0.3.0's {list(SPMD_BACKENDS)}"
        )
    return spmd_backend


class TorchtitanMeshes:
    """torchtitan 0.3.0's ``ParallelDims`` accessors for one SPMD backend, on pure meshes.

    ``pd.torchtitan(spmd_backend)`` (default ``"spmd_types"``, 0.3.0's default) makes
    one. Unlike the lenient accessors of :class:`TorchtitanAccessors` (every name of
    every backend plus meshlayout's own), these take exactly torchtitan's names for
    that backend (:func:`single_axis_names`) and answer exactly as its
    ``ParallelDims`` after ``build_mesh``: the same meshes (dim names included:
    ``loss`` is the flattened ``loss_mesh``), None for the same requests, the same
    exception types for unknown names (ValueError), unknown combinations (ValueError)
    and dims out of rank order (KeyError, torch's slicing rule). The drop-in
    ``meshlayout.torch.torchtitan.ParallelDims`` binds :meth:`global_meshes`.

    >>> from meshlayout import ParallelDims
    >>> titan = ParallelDims(8, dp_shard=2, tp=4).torchtitan()
    >>> list(titan.get_all_one_dimensional_meshes())
    ['batch', 'loss', 'tp', 'dp', 'dp_shard']
    >>> titan.get_mesh("loss").names, titan.get_mesh(["dp_shard", "tp"]).shape
    (('loss_mesh',), (2, 4))
    >>> titan.resolve_mesh(["dp", "cp", "tp"]).names
    ('dp', 'tp')
    >>> titan.get_optional_mesh("fsdp")
    Traceback (most recent call last):
    ...
    ValueError: Invalid mesh dim: 'fsdp'. Valid dimensions are: ['pp', 'batch', 'loss', 'dp_replicate', 'cp', 'tp', 'ep', 'efsdp', 'dp', 'dp_shard']
    """

    __slots__ = ("_globals", "_pd", "_single", "spmd_backend")

    def __init__(self, pd: Views, spmd_backend: str = "spmd_types") -> None:
        self.spmd_backend = _check_backend(spmd_backend)
        if pd.etp != 1:
            raise ValueError(
                f"torchtitan 0.3.0 has no expert tensor parallelism (etp); got etp={pd.etp}: "
                "use the lenient accessors (pd.get_mesh) for meshlayout's etp"
            )
        self._pd = pd
        self._globals = _global_meshes(pd, self.spmd_backend)
        self._single = _single_axis_meshes(self._globals, self.spmd_backend)

    def __repr__(self) -> str:
        return f"TorchtitanMeshes({self._pd!r}, spmd_backend={self.spmd_backend!r})"

    # ------------------------------------------------------------------ meshes
    def global_meshes(self) -> dict[str, Mesh]:
        """``"world"`` and torchtitan's ``_global_meshes``, in its order (a copy).

        ``dataloading`` ``(pp, batch, cp, tp)``; ``loss`` ``(loss_mesh,)``; ``dense``
        ``(pp, dp_replicate, fsdp, tp)`` under ``partial_dtensor``, else ``(pp,
        dp_replicate, dp_shard, cp, tp)``; ``sparse`` ``(pp, dp_replicate, efsdp, ep)``;
        under ``spmd_types`` also ``spmd_dense_for_fwdbwd`` ``(dp, cp, tp)`` and, when
        ``ep > 1``, ``spmd_sparse_for_fwdbwd`` ``(dp_replicate, efsdp, ep)``.
        """
        return dict(self._globals)

    @property
    def world_mesh(self) -> Mesh:
        """The 1-D ``("world",)`` mesh."""
        return self._globals["world"]

    def mesh_exists(self, name: str) -> bool:
        """torchtitan's ``_mesh_exist``: ``fsdp`` and ``dp_shard`` always, ``efsdp`` when
        ``ep > 1``, any other name when its size is > 1."""
        if name not in self._single:
            raise ValueError(self._invalid(name))
        return _exists(name, self._single[name].size(), self._pd.ep)

    def _invalid(self, name: object) -> str:
        return f"Invalid mesh dim: '{name}'. Valid dimensions are: {list(self._single)}"

    def get_optional_mesh(
        self, dims: str | Sequence[str], *, include_singleton_axes: bool = False
    ) -> Mesh | None:
        """torchtitan's ``get_optional_mesh``; see the class docstring for the rules."""
        names = [dims] if isinstance(dims, str) else list(dims)
        for name in names:
            if not isinstance(name, str) or name not in self._single:
                raise ValueError(self._invalid(name))
        if not include_singleton_axes and not all(self.mesh_exists(n) for n in names):
            return None
        if len(names) == 1:
            return self._single[names[0]]
        for mesh in list(self._globals.values())[1:]:  # torchtitan's candidates: not world
            if set(names) <= set(mesh.names):
                return _slice_in_rank_order(mesh, tuple(names))
        raise ValueError(f"Invalid mesh name combinations {names}.")

    def get_mesh(self, dims: str | Sequence[str]) -> Mesh:
        """torchtitan's ``get_mesh``: ValueError when a dim does not exist (message as its)."""
        mesh = self.get_optional_mesh(dims)
        if mesh is None:
            enabled = "enabled (size > 1)" if isinstance(dims, str) else "all enabled"
            raise ValueError(
                f"Mesh '{dims}' is not available. "
                f"Ensure the corresponding parallelism dimension is {enabled}."
            )
        return mesh

    def get_all_one_dimensional_meshes(self) -> dict[str, Mesh]:
        """Every existing 1-D mesh of size > 1, in torchtitan's order."""
        return {
            k: v
            for k, v in self._single.items()
            if v.ndim == 1 and v.size() > 1 and self.mesh_exists(k)
        }

    def get_activated_mesh(self, axes: Sequence[str]) -> Mesh | None:
        """The mesh of the ``axes`` that exist (None if none does); torchtitan's rules."""
        kept = [a for a in axes if a in self._single and self.get_optional_mesh(a) is not None]
        return self.get_optional_mesh(kept) if kept else None

    def spmd_meshes(self) -> list[Mesh]:
        """The activated dense and sparse SPMD meshes (torchtitan's ``spmd_meshes``)."""
        dense = self.get_activated_mesh(SPMD_DENSE_AXES[self.spmd_backend])
        sparse = self.get_activated_mesh(SPMD_SPARSE_AXES)
        return [m for m in (dense, sparse) if m is not None]

    def spmd_dense_mesh(self) -> Mesh:
        """``(dp, cp, tp)`` under ``spmd_types``; KeyError under other backends (as torchtitan)."""
        return self._globals["spmd_dense_for_fwdbwd"]

    def spmd_sparse_mesh(self) -> Mesh | None:
        """``(dp_replicate, efsdp, ep)`` under ``spmd_types`` with ``ep > 1``, else None."""
        return self._globals.get("spmd_sparse_for_fwdbwd")

    def get_dense_tp_mesh(self) -> Mesh:
        """The ``tp`` mesh of dense forward/backward (torchtitan's ``get_dense_tp_mesh``)."""
        if self.spmd_backend == "spmd_types":
            return self.spmd_dense_mesh()["tp"]
        if self.spmd_backend == "full_dtensor":
            mesh = self.spmd_meshes()[0]
            if "tp" not in mesh.names:
                raise KeyError(f"Invalid mesh_dim_names ('tp',) specified for {mesh.names}")
            return mesh["tp"]
        return self.get_mesh("tp")

    def resolve_mesh(self, axes: Iterable[str]) -> Mesh | None:
        """torchtitan's ``resolve_mesh``: the SPMD mesh of ``axes`` (``MeshAxisName`` values).

        ``partial_dtensor`` keeps only ``tp``, ``ep``; ``spmd_types`` keeps ``dp``, ``cp``,
        ``tp``, ``ep``; ``full_dtensor`` unfolds ``dp`` into ``dp_replicate, dp_shard``
        and raises ValueError when the result is not one of :meth:`spmd_meshes`.
        """
        names = [str(getattr(a, "value", a)) for a in axes]
        if self.spmd_backend == "full_dtensor":
            for a in names:
                if a not in MESH_AXIS_NAMES:
                    raise ValueError(f"'{a}' is not a valid MeshAxisName")
            names = [
                u for a in names for u in (("dp_replicate", "dp_shard") if a == "dp" else (a,))
            ]
        else:
            names = [a for a in names if a in _IN_BAND[self.spmd_backend]]
        mesh = self.get_activated_mesh(names)
        if mesh is None:
            return None
        if self.spmd_backend == "full_dtensor" and mesh not in self.spmd_meshes():
            raise ValueError(
                f"Resolved mesh {list(mesh.names)} does not match any SPMD mesh. Valid "
                f"meshes: {[list(m.names) for m in self.spmd_meshes()]}."
            )
        return mesh


def _exists(name: str, size: int, ep: int) -> bool:
    """torchtitan 0.3.0's ``_mesh_exist`` (``dp_shard`` only reaches it where it always exists)."""
    if name in _ALWAYS:
        return True
    if name == "efsdp":
        return ep > 1
    return size > 1


def _global_meshes(pd: Views, spmd_backend: str) -> dict[str, Mesh]:
    """torchtitan's global meshes (``build_mesh``), from ``pd``'s views, plus ``world``."""
    dense = pd.dense
    out = {
        "world": dense.flatten("world"),
        "dataloading": pd.dataloading,
        "loss": dense["dp_replicate", "dp_shard", "cp"].flatten("loss_mesh"),
    }
    if spmd_backend == "partial_dtensor":
        out["dense"] = Mesh.concat([dense["pp", "dp_replicate"], pd.mesh("fsdp"), dense["tp"]])
    else:
        out["dense"] = dense
    sparse = pd.sparse
    out["sparse"] = sparse["pp", "dp_replicate", "efsdp", "ep"]
    if spmd_backend == "spmd_types":
        dp = dense["dp_replicate", "dp_shard"].flatten("dp")
        out["spmd_dense_for_fwdbwd"] = Mesh.concat([dp, dense["cp", "tp"]])
        if pd.ep > 1:
            out["spmd_sparse_for_fwdbwd"] = sparse["dp_replicate", "efsdp", "ep"]
    return out


def _single_axis_meshes(globals_: Mapping[str, Mesh], spmd_backend: str) -> dict[str, Mesh]:
    """torchtitan's ``_single_axis_meshes``: each name sliced from its global mesh."""
    sources = {
        "pp": "dataloading", "batch": "dataloading", "dp_replicate": "dense",
        "cp": "dataloading", "tp": "dataloading", "ep": "sparse", "efsdp": "sparse",
        "dp": "spmd_dense_for_fwdbwd", "dp_shard": "dense", "fsdp": "dense",
    }  # fmt: skip
    out = {}
    for name in single_axis_names(spmd_backend):
        out[name] = globals_["loss"] if name == "loss" else globals_[sources[name]][name]
    return out


def _slice_in_rank_order(mesh: Mesh, names: tuple[str, ...]) -> Mesh:
    """``mesh[names]`` under torch's ``DeviceMesh`` slicing rules (torch 2.13, 2.14).

    torch joins the axes of ``names`` into one layout, coalesces it (size-1 modes
    dropped, neighbours merged where the outer stride is the inner span), and refuses
    it with KeyError unless its strides go from the largest to the smallest ("Mesh dim
    indices should be in ascending order"), then with RuntimeError if two coordinates
    land on one position ("Slicing overlapping dim_names").
    """
    modes = [
        (s, d)
        for axis in (mesh.axes[mesh.dim_index(n)] for n in names)
        for s, d in zip(flatten(axis.shape), flatten(axis.stride))
    ]
    merged: list[list[int]] = []  # innermost first
    for s, d in reversed(modes):
        if s == 1:
            continue
        if merged and merged[-1][0] * merged[-1][1] == d:
            merged[-1][0] *= s
        else:
            merged.append([s, d])
    strides = [d for _, d in reversed(merged)]
    if strides != sorted(strides, reverse=True):
        raise KeyError(
            f"Invalid mesh_dim_names {names} specified. "
            "Mesh dim indices should be in ascending order."
        )
    # Distinct dims of one mesh never share a position: only a repeated dim overlaps.
    if any(names.count(n) > 1 and mesh.size(n) > 1 for n in names):
        raise RuntimeError(f"Slicing overlapping dim_names {names} is not allowed.")
    return mesh[names]
