"""Placement value objects: ``Shard``, ``StridedShard``, ``Replicate``, ``Partial``.

Frozen, hashable, torch-like ``repr`` (evaluable) and a short ``str`` that is the
command-line spelling (``meshlayout shard --placements`` parses it back).

>>> Shard(0), StridedShard(0, 2), Replicate(), Partial()
(Shard(dim=0), StridedShard(dim=0, split_factor=2), Replicate(), Partial(reduce_op='sum'))
>>> print(Shard(1), StridedShard(0, 3), Replicate(), Partial("max"))
S(1) SS(0,3) R P(max)
>>> StridedShard(0, 0)
Traceback (most recent call last):
...
ValueError: StridedShard(dim=0, split_factor=0): split_factor must be >= 1
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from ..inttuple import check_int

__all__ = ["REDUCE_OPS", "Partial", "Placement", "Replicate", "Shard", "StridedShard"]

#: Reduce operations accepted by ``Partial`` (those of ``torch.distributed.ReduceOp``).
REDUCE_OPS = ("sum", "avg", "min", "max", "product", "band", "bor", "bxor")


@dataclass(frozen=True)
class Shard:
    """Split tensor dim ``dim`` over one mesh dim with the ``torch.chunk`` rule.

    With ``n`` elements and ``k`` ranks, chunk ``c = ceil(n / k)`` and coordinate
    ``i`` holds ``[min(i*c, n), min((i+1)*c, n))`` — trailing pieces may be empty.
    Negative dims are normalised by :class:`ShardingSpec` against the tensor's ndim.
    """

    dim: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", check_int(self.dim, "Shard.dim"))

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class StridedShard:
    """torch's ``_StridedShard(dim, split_factor)`` (what FSDP2 reports over TP).

    In a decodable placement list it marks a mesh dim that shards ``dim`` *inside*
    ``split_factor`` pieces made by mesh dims to its right (see :mod:`meshlayout.sharding`).
    """

    dim: int
    split_factor: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "dim", check_int(self.dim, "StridedShard.dim"))
        sf = check_int(self.split_factor, "StridedShard.split_factor")
        object.__setattr__(self, "split_factor", sf)
        if sf < 1:
            raise ValueError(f"{self!r}: split_factor must be >= 1")

    def __str__(self) -> str:
        return f"SS({self.dim},{self.split_factor})"


@dataclass(frozen=True)
class Replicate:
    """Every rank along the mesh dim holds the whole extent."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial:
    """A pending reduction along the mesh dim; every rank holds the full local shape."""

    reduce_op: str = "sum"

    def __post_init__(self) -> None:
        if not isinstance(self.reduce_op, str):
            raise TypeError(f"Partial.reduce_op must be a str, got {self.reduce_op!r}")
        if self.reduce_op not in REDUCE_OPS:
            raise ValueError(
                f"Partial(reduce_op={self.reduce_op!r}): reduce_op must be one of {REDUCE_OPS}"
            )

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


Placement = Union[Shard, StridedShard, Replicate, Partial]  # noqa: UP007 - runtime alias, py3.10
PLACEMENT_TYPES = (Shard, StridedShard, Replicate, Partial)
