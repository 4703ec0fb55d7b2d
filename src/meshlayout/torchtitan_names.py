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

from collections.abc import Sequence
from typing import TYPE_CHECKING

from .mesh import Mesh

__all__ = ["ONE_DIMENSIONAL", "TORCHTITAN_NAMES", "TorchtitanAccessors"]

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
