"""Exact checkpoints in torchtitan: its ``CheckpointManager`` through our DCP planners.

torchtitan 0.3.0's ``CheckpointManager`` calls ``dcp.save`` / ``dcp.async_save`` /
``dcp.load`` without a planner, so DCP's default planners describe every DTensor. For
FSDP2 over tensor parallelism with uneven shards (dp >= 3) they describe some ranks'
pieces at the wrong offsets or sizes: the save fails, or the load fails or fills
parameters with permuted rows (``docs/checkpoint.md``).

:class:`ExactCheckpointManager` is that ``CheckpointManager`` with the same
configuration, files, steps, folders, async modes and retention, whose DCP calls take
:class:`~meshlayout.torch.checkpoint.ExactSavePlanner` and
:class:`~meshlayout.torch.checkpoint.ExactLoadPlanner`: every DTensor is saved as the
chunks its ranks really hold and loaded into any other parallel layout (another
data- or tensor-parallel degree, another number of processes). Hugging Face
safetensors export/import (``last_save_in_hf`` / ``initial_load_in_hf``) keeps
torchtitan's own path.

Switching a job (one line, on the job's ``Trainer.Config``)::

    from meshlayout.torch.torchtitan import exact_checkpoint_config

    config.checkpoint = exact_checkpoint_config(config.checkpoint)

or construct ``ExactCheckpointManager.Config(...)`` with the same fields as
``CheckpointManager.Config``; ``config.checkpoint.build(...)`` (what torchtitan's
``Trainer`` calls) then builds an :class:`ExactCheckpointManager`.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict_loader import load as _dcp_load
from torch.distributed.checkpoint.state_dict_saver import (
    AsyncCheckpointerType,
    AsyncSaveResponse,
)
from torch.distributed.checkpoint.state_dict_saver import async_save as _dcp_async_save
from torch.distributed.checkpoint.state_dict_saver import save as _dcp_save
from torchtitan.components.checkpointer import MODEL, AsyncMode, CheckpointManager
from torchtitan.tools.utils import GarbageCollection

from ..checkpoint import ExactLoadPlanner, ExactSavePlanner

__all__ = ["ExactCheckpointManager", "exact_checkpoint_config"]


class ExactCheckpointManager(CheckpointManager):  # type: ignore[misc]
    """torchtitan's ``CheckpointManager`` saving and loading with our exact planners.

    Same constructor and configuration (``ExactCheckpointManager.Config`` has the
    fields of ``CheckpointManager.Config``); only :meth:`dcp_save` and
    :meth:`dcp_load` differ, and only for DCP checkpoints: the DCP call gets
    ``planner=ExactSavePlanner()`` / ``ExactLoadPlanner()``. Hugging Face
    safetensors saves and loads (``to_hf`` / ``from_hf``) go through torchtitan's
    own code unchanged.
    """

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):  # type: ignore[misc]
        """``CheckpointManager.Config`` whose ``build()`` makes an ExactCheckpointManager."""

    @torch.no_grad()
    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Future[Any] | AsyncSaveResponse | None:
        """Save ``state_dict`` as DCP with :class:`ExactSavePlanner` (``to_hf``: torchtitan's)."""
        if to_hf:
            result: Future[Any] | AsyncSaveResponse | None = super().dcp_save(
                state_dict, checkpoint_id, async_mode, enable_garbage_collection, to_hf
            )
            return result
        planner = ExactSavePlanner()
        if async_mode == AsyncMode.ASYNC:
            result = _dcp_async_save(
                state_dict, checkpoint_id=checkpoint_id, process_group=self.pg, planner=planner
            )
        elif async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM:
            result = _dcp_async_save(
                state_dict,
                checkpoint_id=checkpoint_id,
                process_group=self.pg,
                planner=planner,
                async_checkpointer_type=AsyncCheckpointerType.PROCESS,
                async_stager=self.stager,
            )
        else:
            _dcp_save(state_dict, checkpoint_id=checkpoint_id, planner=planner)
            result = None
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return result

    def dcp_load(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        from_hf: bool,
        from_quantized: bool,
    ) -> None:
        """Load DCP into ``state_dict`` with :class:`ExactLoadPlanner` (``from_hf``: torchtitan's)."""
        if from_hf:
            super().dcp_load(state_dict, checkpoint_id, from_hf, from_quantized)
            return
        _dcp_load(state_dict, checkpoint_id=checkpoint_id, planner=ExactLoadPlanner())
        # As torchtitan does: the model's states are flattened into state_dict, so the
        # model wrapper loads them back into the modules.
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(state_dict)


def exact_checkpoint_config(config: Any) -> Any:
    """The ``ExactCheckpointManager.Config`` with every field of ``config``.

    ``config`` is a torchtitan ``CheckpointManager.Config`` (e.g. a job's
    ``config.checkpoint``); the result builds an :class:`ExactCheckpointManager`.

    >>> from torchtitan.components.checkpoint import CheckpointManager
    >>> cfg = exact_checkpoint_config(CheckpointManager.Config(enable=True, interval=5))
    >>> type(cfg).__qualname__, cfg.enable, cfg.interval
    ('ExactCheckpointManager.Config', True, 5)
    """
    if not isinstance(config, CheckpointManager.Config):
        raise TypeError(
            "exact_checkpoint_config expects torchtitan's CheckpointManager.Config "
            f"(a job's config.checkpoint), got {type(config).__name__}"
        )
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return ExactCheckpointManager.Config(**fields)
