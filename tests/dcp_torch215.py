"""DCP checkpoints as torch 2.15 writes them, made under any torch (a test helper).

torch 2.15 added a ``strides`` field to DCP's ``TensorProperties``, whose
``__getstate__`` therefore pickles six fields (dtype, layout, requires_grad, memory
format encoding, pin_memory, strides) where torch 2.10 to 2.14 pickle five, and whose
``__setstate__`` there unpacks exactly five: a ``.metadata`` written by 2.15 cannot be
read by older torch. :func:`metadata_as_torch_215` writes the bytes torch 2.15's
``FileSystemWriter`` writes (``pickle.dump`` of the ``Metadata``), from the installed
torch's ``Metadata`` and each tensor's strides; ``tests/test_checkpoint_torch215.py``
checks that they equal, byte for byte, what torch 2.15 itself writes.

:func:`sample_tensors` is the state dict both sides save: values from integer
arithmetic (identical on every torch), many dtypes, 0-d, empty, non-contiguous.
"""

from __future__ import annotations

import copyreg
import io
import pickle
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    _MEM_FORMAT_ENCODING,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)

__all__ = ["metadata_as_torch_215", "sample_tensors", "strides_of"]

_ENCODING = {
    torch.contiguous_format: _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT,
    torch.channels_last: _MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST,
    torch.preserve_format: _MEM_FORMAT_ENCODING.TORCH_PRESERVE_FORMAT,
}


def _values(n: int) -> torch.Tensor:
    """``n`` float64 values in [0, 1) from integer arithmetic: the same on every torch."""
    return (torch.arange(n, dtype=torch.int64) * 2654435761 % 1000003).double() / 1000003


def sample_tensors() -> dict[str, torch.Tensor]:
    """Plain tensors of many dtypes and layouts (the saved state dict's tensor values)."""

    def filled(*shape: int) -> torch.Tensor:
        n = 1
        for s in shape:
            n *= s
        return _values(n).reshape(shape) * 8 - 4

    return {
        "a": filled(3, 4).float(),
        "b.ids": torch.arange(5),
        "c.scalar": torch.tensor(2.5, dtype=torch.bfloat16),
        "d.half": filled(7, 3).half(),
        "e.empty": torch.empty(0, 3),
        "f.mask": _values(6) > 0.5,
        "g.t": filled(5, 3).float().t(),  # stored with transposed strides
        "h.cl": filled(2, 3, 4, 5).float().to(memory_format=torch.channels_last),
        "i.bf16": filled(9, 10).bfloat16(),
        "j.f8": filled(4, 4).float().to(torch.float8_e4m3fn),
    }


def strides_of(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """What torch 2.15 records as each plain tensor's ``strides``: ``tensor.stride()``."""
    return {name: tuple(t.stride()) for name, t in tensors.items()}


class _Pickler215(pickle.Pickler):
    """Pickles ``TensorProperties`` with torch 2.15's six-field state."""

    def __init__(self, file: io.BytesIO, strides: dict[int, Any], extra: tuple[Any, ...]) -> None:
        super().__init__(file)
        self._strides = strides
        self._extra = extra

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not TensorProperties:
            return NotImplemented
        state = (
            obj.dtype,
            obj.layout,
            obj.requires_grad,
            _ENCODING[obj.memory_format],
            obj.pin_memory,
            self._strides[id(obj)],
            *self._extra,
        )
        return copyreg.__newobj__, (TensorProperties,), state


def metadata_as_torch_215(
    md: Metadata, strides: Mapping[str, Any], *, extra_fields: tuple[Any, ...] = ()
) -> bytes:
    """The ``.metadata`` bytes torch 2.15 writes for ``md`` (``strides``: per tensor name,
    the strides 2.15 recorded, as :func:`strides_of` says for plain tensors).

    ``extra_fields`` are appended to each state (no torch writes any: for refusal tests).
    """
    by_object = {
        id(entry.properties): strides[name]
        for name, entry in md.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }
    out = io.BytesIO()
    _Pickler215(out, by_object, extra_fields).dump(md)
    return out.getvalue()
