"""Exact checkpoints on ``torch.distributed.checkpoint`` (DCP): ``docs/checkpoint.md``.

Every DTensor is saved as the chunks its ranks really hold (the nested shard order
of FSDP2 / TP / redistribute, read by :class:`~meshlayout.sharding.ShardingSpec`),
with true global offsets; loading fills each destination run box from exactly the
saved chunks overlapping it, on any mesh, any number of processes, or into plain
tensors on one process. The files are standard DCP. See ``docs/checkpoint.md``.

:func:`export_safetensors` writes any checkpoint that tiles as Hugging Face
safetensors in one process, streaming; :func:`describe_checkpoint`
and :func:`describe_safetensors` report what a checkpoint or a safetensors model
holds. Everything here that reads a checkpoint (but ``load``, which is DCP's reader)
unpickles with an allow-list: safe on untrusted files.

Usage (every rank)::

    from meshlayout.torch import checkpoint as mlcp

    mlcp.save({"model": model.state_dict()}, "ckpt/step-100")
    mlcp.load(state_dict, "ckpt/step-100")                    # in place
    dcp.save(sd, checkpoint_id=p, planner=mlcp.ExactSavePlanner())   # any DCP caller
    dcp.load(sd, checkpoint_id=p, planner=mlcp.ExactLoadPlanner())

>>> from meshlayout.torch.checkpoint import ExactLoadPlanner, ExactSavePlanner, load, save
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from .._requirements import TORCH_VERSION
from ._export import ExportResult, NotExportableError, export_safetensors
from ._inspect import describe_checkpoint, read_metadata
from ._keys import CheckpointKeyError
from ._plan import Chunk, ChunkIndex, Read, Tiling, replica_dims, tiling, written_boxes
from ._planners import ExactLoadPlanner, ExactSavePlanner, dtensor_spec
from ._safe_pickle import properties_fields
from ._safetensors_load import (
    LoadStats,
    SafetensorsEntry,
    load_safetensors,
    read_safetensors_index,
)
from ._st_describe import describe_safetensors

__all__ = [
    "Chunk",
    "ChunkIndex",
    "ExactLoadPlanner",
    "ExactSavePlanner",
    "ExportResult",
    "LoadStats",
    "NotExportableError",
    "Read",
    "SafetensorsEntry",
    "Tiling",
    "describe_checkpoint",
    "describe_safetensors",
    "dtensor_spec",
    "export_safetensors",
    "load",
    "load_safetensors",
    "read_metadata",
    "read_safetensors_index",
    "replica_dims",
    "save",
    "tiling",
    "written_boxes",
]

CheckpointId = str | os.PathLike[str]


def _check_args(state_dict: object, checkpoint_id: object, storage: object, what: str) -> None:
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict, got {type(state_dict).__name__}")
    if checkpoint_id is None and storage is None:
        raise ValueError(f"{what}: give a checkpoint_id (a directory) or a storage object")
    if checkpoint_id is not None and not isinstance(checkpoint_id, (str, os.PathLike)):
        raise TypeError(
            f"checkpoint_id must be a str or os.PathLike, got {type(checkpoint_id).__name__}"
        )


def _no_dist(no_dist: bool) -> bool:
    return no_dist or not (dist.is_available() and dist.is_initialized())


#: The input errors of our planners that the wrappers re-raise as themselves.
_PLAIN = (ValueError, TypeError, CheckpointKeyError)


def _plain_error(exc: BaseException, where: str = "", ranks: bool = True) -> BaseException:
    """DCP's CheckpointException as one plain error when every rank failed with an input error.

    DCP wraps planning errors of every rank into a ``CheckpointException`` (a
    ``BaseException``); our planners' errors are ordinary input errors
    (``ValueError``, ``TypeError``, ``KeyError`` for keys the checkpoint lacks), so the
    wrappers report the first one, naming the ranks that raised: the same line on
    every rank, since DCP hands every rank the same exception. ``where`` starts the
    message; ``ranks=False`` (one process, no process group) leaves the ranks out.
    """
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return exc
    inner = [f[0] if isinstance(f, tuple) else f for f in failures.values()]
    kinds = {type(e) for e in inner}
    if not kinds <= set(_PLAIN):
        return exc
    kind = kinds.pop() if len(kinds) == 1 else ValueError
    return kind(f"{where}{f'ranks {sorted(failures)}: ' if ranks else ''}{inner[0]}")


def _newer_metadata(checkpoint_id: object) -> ValueError | None:
    """A ValueError naming the fix when the checkpoint in ``checkpoint_id`` has metadata
    written by torch >= 2.15, which DCP's reader on older torch cannot read (its
    ``TensorProperties`` unpack five fields, 2.15 writes six), else None."""
    if TORCH_VERSION >= (2, 15) or not isinstance(checkpoint_id, (str, os.PathLike)):
        return None
    file = Path(checkpoint_id) / ".metadata"
    try:
        with open(file, "rb") as f:
            fields = properties_fields(f, str(file))
    except (OSError, ValueError):
        return None
    if 6 not in fields:
        return None
    import torch

    return ValueError(
        f"{checkpoint_id}: its .metadata was written by torch 2.15 or newer (six-field "
        f"TensorProperties), which the DCP reader of torch {torch.__version__} cannot read. "
        "Load it with torch >= 2.15, or export it to safetensors here (meshlayout "
        "checkpoint export, or export_safetensors: they read it) and load that with "
        "load_safetensors"
    )


@contextlib.contextmanager
def _plain_errors(where: str = "", ranks: bool = True) -> Iterator[None]:
    """Re-raise DCP's CheckpointException of input errors as :func:`_plain_error` says."""
    try:
        yield
    except BaseException as exc:
        plain = _plain_error(exc, where, ranks)
        if plain is exc:
            raise
        raise plain from exc


def _missing_checkpoint(checkpoint_id: CheckpointId | None) -> str | None:
    """Why ``checkpoint_id`` holds no checkpoint DCP's file-system reader can load, or None.

    Only local paths are checked (a URL such as ``s3://...`` goes to DCP's fsspec
    reader as it is); a folder with DCP's per-rank ``__<rank>.metadata`` files passes.
    """
    if checkpoint_id is None or "://" in os.fspath(checkpoint_id):
        return None
    path = os.fspath(checkpoint_id)
    if not os.path.exists(path):
        return f"checkpoint {path!r} does not exist"
    if not os.path.isdir(path):
        return f"checkpoint {path!r} is not a directory (DCP checkpoints are directories)"
    if not os.path.isfile(os.path.join(path, ".metadata")) and not any(
        n.startswith("__") and n.endswith(".metadata") for n in os.listdir(path)
    ):
        return f"{path!r} holds no DCP checkpoint (no .metadata file)"
    return None


def _agreed(problem: str | None, process_group: Any, no_dist: bool) -> str | None:
    """``problem`` as every rank of the load sees it: one all-gather, so that all raise
    together (a rank whose file system lacks the checkpoint must not leave the others
    waiting in DCP's collectives)."""
    if no_dist:
        return problem
    seen: list[str | None] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(seen, problem, group=process_group)
    failed = {r: p for r, p in enumerate(seen) if p is not None}
    if not failed:
        return None
    first = failed[min(failed)]
    if len(failed) == len(seen) and len(set(failed.values())) == 1:
        return first
    return f"ranks {sorted(failed)} (of {len(seen)}): {first}"


def save(
    state_dict: dict[str, Any],
    checkpoint_id: CheckpointId | None = None,
    *,
    storage_writer: Any = None,
    process_group: Any = None,
    no_dist: bool = False,
    **planner_options: Any,
) -> Metadata:
    """``dcp.save`` with :class:`ExactSavePlanner`; returns the checkpoint's metadata.

    Collective over the default group (or ``process_group``) unless ``no_dist`` or no
    process group is initialised. ``planner_options`` go to the planner
    (``DefaultSavePlanner``'s, e.g. ``dedup_save_to_lowest_rank=True``). Input errors
    (e.g. a ``Partial`` DTensor) raise ``ValueError``/``TypeError`` naming the ranks;
    other failures propagate as DCP raises them.
    """
    _check_args(state_dict, checkpoint_id, storage_writer, "save")
    no_dist = _no_dist(no_dist)
    where = "" if checkpoint_id is None else f"save {os.fspath(checkpoint_id)!r}: "
    with _plain_errors(where, ranks=not no_dist):
        metadata: Metadata = dcp_save(
            state_dict,
            checkpoint_id=checkpoint_id,
            storage_writer=storage_writer,
            planner=ExactSavePlanner(**planner_options),
            process_group=process_group,
            no_dist=no_dist,
        )
    return metadata


def load(
    state_dict: dict[str, Any],
    checkpoint_id: CheckpointId | None = None,
    *,
    storage_reader: Any = None,
    process_group: Any = None,
    no_dist: bool = False,
    **planner_options: Any,
) -> None:
    """``dcp.load`` with :class:`ExactLoadPlanner`: fills ``state_dict`` in place.

    Destinations may be DTensors of any sharding on any mesh and number of processes,
    or plain tensors (``no_dist=True`` on one process gives full tensors).
    ``planner_options`` go to the planner (e.g. ``allow_partial_load=True``). A
    destination element the checkpoint does not hold exactly once raises ``ValueError``
    naming the tensor and box, as do other input errors. On torch < 2.15 a checkpoint
    written by torch >= 2.15 raises ``ValueError`` naming the fix (DCP's reader here
    cannot read its metadata; :func:`export_safetensors` and :func:`describe_checkpoint`
    can).

    Mistakes are one line, the same on every rank, ordinary exceptions (DCP's own
    ``CheckpointException`` is a ``BaseException``): a ``checkpoint_id`` that is not a
    checkpoint directory raises ``FileNotFoundError`` before DCP runs (the ranks agree
    on it through one all-gather); a key the checkpoint lacks raises ``KeyError``
    naming it, what the checkpoint holds and, for a flat state dict against a
    checkpoint saved as ``{"model": ...}`` (or the reverse), the nesting.
    """
    _check_args(state_dict, checkpoint_id, storage_reader, "load")
    no_dist = _no_dist(no_dist)
    missing = _agreed(
        _missing_checkpoint(checkpoint_id) if storage_reader is None else None,
        process_group,
        no_dist,
    )
    if missing is not None:
        raise FileNotFoundError(f"load: {missing}")
    where = "" if checkpoint_id is None else f"load {os.fspath(checkpoint_id)!r}: "
    try:
        with _plain_errors(where, ranks=not no_dist):
            dcp_load(
                state_dict,
                checkpoint_id=checkpoint_id,
                storage_reader=storage_reader,
                planner=ExactLoadPlanner(**planner_options),
                process_group=process_group,
                no_dist=no_dist,
            )
    except BaseException as exc:  # DCP's CheckpointException is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        newer = _newer_metadata(checkpoint_id)
        if newer is None:
            raise
        raise newer from exc
