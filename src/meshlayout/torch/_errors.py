"""Errors raised by :mod:`meshlayout.torch`."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["MeshMismatchError", "RankTimeoutError", "TransferVerificationError"]


class MeshMismatchError(ValueError):
    """Ranks disagree about a mesh; raised on *every* participating rank.

    ``ranks``: the ranks outside the largest agreeing set (on a tie, the set holding
    the lowest rank), ascending;
    ``fields``: the names of the fingerprint fields that differ. The message lists
    every variant with the ranks holding it.

    >>> err = MeshMismatchError("...", ranks=[2], fields=["names"])
    >>> err.ranks, err.fields
    ((2,), ('names',))
    """

    def __init__(
        self,
        message: str,
        *,
        ranks: Sequence[int] = (),
        fields: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.ranks = tuple(ranks)
        self.fields = tuple(fields)


class RankTimeoutError(TimeoutError):
    """Some ranks did not answer in time; ``missing`` lists them (global ranks)."""

    def __init__(self, message: str, *, missing: Sequence[int] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


def format_ranks(ranks: Sequence[int], limit: int = 16) -> str:
    """Short, readable list of ranks: ``[0, 1, 5]`` or ``[0, 1, ... (+998 more)]``.

    >>> format_ranks([3, 1])
    '[3, 1]'
    >>> format_ranks(range(40), limit=3)
    '[0, 1, 2, ... (+37 more)]'
    """
    ranks = list(ranks)
    if len(ranks) <= limit:
        return "[" + ", ".join(map(str, ranks)) + "]"
    head = ", ".join(map(str, ranks[:limit]))
    return f"[{head}, ... (+{len(ranks) - limit} more)]"


class TransferVerificationError(RuntimeError):
    """A weight transfer's fingerprints disagree; raised on *every* participating rank.

    ``tensors``: names whose destination pieces differ from the source (a wrong,
    missing or stale element somewhere); ``replicas``: names whose source replicas
    (ranks holding the same elements) hold different values.

    >>> err = TransferVerificationError("...", tensors=["w"], replicas=[])
    >>> err.tensors, err.replicas
    (('w',), ())
    """

    def __init__(
        self, message: str, *, tensors: Sequence[str] = (), replicas: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.tensors = tuple(tensors)
        self.replicas = tuple(replicas)
