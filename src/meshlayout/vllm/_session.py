"""One weight update, as both sides run it over the sync group (no vLLM import here).

Per update ``n`` (every trainer rank and every worker, over the sync group's store):

1. **Manifest.** Trainer rank 0 posts what it sends: ``(name, global shape, dtype)``
   per tensor (checkpoint names, after ``rename``).
2. **Derivation.** Each worker reads it, derives from its live model where each
   tensor lands (:mod:`._derive`, cached per manifest) and posts, per name, the box of
   the checkpoint tensor it needs, the names it cannot take and the engine dtypes.
3. **Verdict.** Every rank reads every worker's post and computes the same verdict:
   a name the engine does not know, a parameter no tensor fills, a shape or a
   dtype kind that differs raises ``ValueError`` naming the tensors on every rank,
   before any byte moves and before the engine's model is touched. Otherwise each
   name gets a destination :class:`~meshlayout.sharding.ShardingSpec` over the
   workers (``Shard``/``Replicate`` matching the boxes exactly), or, when no spec
   matches, ``Replicate`` for the per-tensor fallback (each worker receives the whole
   tensor and hands it to vLLM's ``load_weights``).
4. **Transfer,** one :class:`~meshlayout.torch.WeightTransfer` per layer group (vLLM's
   own grouping by layer index), built once per manifest and reused, all sharing one
   pair of ``bucket_bytes`` buffers.
"""

from __future__ import annotations

import functools
import hashlib
import math
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ..mesh import Mesh
from ..sharding import Replicate, Runs, RunsSpec, Shard, ShardingSpec
from ..torch import RankTimeoutError, SyncGroup, WeightTransfer
from ..torch.transfer import dtype_name, dtype_of

__all__ = [
    "Layout",
    "Manifest",
    "agree",
    "dst_spec_for",
    "layer_groups",
    "transfers",
    "uncovered",
]

Box = tuple[tuple[int, int], ...]
Manifest = list[tuple[str, tuple[int, ...], str]]  # (name, global shape, dtype name)
_PREFIX = "meshlayout/vllm"


@dataclass(frozen=True)
class Layout:
    """The verdict of one update: destination spec and dtype per name, the fallbacks,
    the layer groups, and a digest both sides use to reuse their transfers."""

    specs: dict[str, ShardingSpec]
    dtypes: dict[str, str]
    fallback: dict[str, str]  # name -> why
    groups: list[list[str]]
    digest: str


def _post(store: Any, key: str, value: object) -> None:
    store.set(key, pickle.dumps(value))


def _read(store: Any, key: str, timeout: timedelta, message: str, missing: list[int]) -> Any:
    start = time.monotonic()
    try:
        store.wait([key], timeout)
    except Exception as exc:
        raise RankTimeoutError(waited(message, start, timeout, exc), missing=missing) from exc
    return pickle.loads(store.get(key))  # posted by this job's own ranks


def waited(message: str, start: float, timeout: timedelta, exc: BaseException) -> str:
    """``message`` plus the time actually waited and why the wait ended."""
    secs = time.monotonic() - start
    limit = timeout.total_seconds()
    if secs >= 0.95 * limit:
        why = "timed out"
    else:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        why = f"the sync group's store failed: {type(exc).__name__}: {first}"
    return f"{message}: gave up after {secs:.1f}s of a {limit:g}s timeout ({why})"


# Large values (a manifest of tens of thousands of expert names, a worker's post) go
# through the store once per sync group, under their digest; each update posts only the
# digest, and each process keeps what it read (the values are the same update after
# update while the model and its layout do not change).
_SEEN: dict[str, Any] = {}
_LAYOUTS: dict[tuple[str, ...], Layout] = {}


def _digest(value: object) -> str:
    return hashlib.sha1(pickle.dumps(value), usedforsecurity=False).hexdigest()


def _post_large(sg: SyncGroup, key: str, value: object) -> None:
    d = _digest(value)
    if not sg.store.check([f"{_PREFIX}/blob/{d}"]):
        _post(sg.store, f"{_PREFIX}/blob/{d}", value)
    _SEEN.setdefault(d, value)
    sg.store.set(key, d)


def _read_large(sg: SyncGroup, key: str, message: str, missing: list[int]) -> tuple[str, Any]:
    start = time.monotonic()
    try:
        sg.store.wait([key], sg.timeout)
        d = sg.store.get(key).decode()
        if d not in _SEEN:
            if len(_SEEN) > 64:
                _SEEN.clear()
            _SEEN[d] = pickle.loads(sg.store.get(f"{_PREFIX}/blob/{d}"))  # our own ranks'
    except Exception as exc:
        raise RankTimeoutError(waited(message, start, sg.timeout, exc), missing=missing) from exc
    return d, _SEEN[d]


def post_manifest(sg: SyncGroup, n: int, manifest: Manifest) -> None:
    _post_large(sg, f"{_PREFIX}/{n}/manifest", manifest)


def read_manifest(sg: SyncGroup, n: int) -> Manifest:
    _, value = _read_large(
        sg,
        f"{_PREFIX}/{n}/manifest",
        f"meshlayout vLLM update {n}: worker (sync rank {sg.rank}) waited for the trainer's "
        "manifest (trainer rank 0 posts it in send_weights)",
        [0],
    )
    return value  # type: ignore[no-any-return]


def post_worker(sg: SyncGroup, n: int, post: dict[str, Any]) -> None:
    _post_large(sg, f"{_PREFIX}/{n}/worker/{sg.rank}", post)


def agree(sg: SyncGroup, n: int, trainers: int, manifest: Manifest) -> Layout:
    """Every rank: read every worker's post and compute the same :class:`Layout`.

    Before any byte moves, every element of every trainer tensor must be read by some
    worker and every engine parameter the update covers must be written whole (padding
    aside): a wrong shape, a tensor the engine's model has no place for, and a tensor
    missing from the trainer raise ``ValueError`` on every rank naming exactly those
    tensors and what the engine expects, whether they would go the exact way or fall back.
    """
    workers = list(range(trainers, sg.world_size))
    posts: dict[int, dict[str, Any]] = {}
    digests = [_digest((manifest, trainers, sg.world_size))]
    for w in workers:
        d, posts[w] = _read_large(
            sg,
            f"{_PREFIX}/{n}/worker/{w}",
            f"meshlayout vLLM update {n}: sync rank {sg.rank} waited for the derivation of "
            f"worker sync rank {w}",
            [w],
        )
        digests.append(d)
    key = tuple(digests)
    if key in _LAYOUTS:  # the same manifest and the same derivations: the same verdict
        return _LAYOUTS[key]
    _check(n, manifest, posts)
    specs: dict[str, ShardingSpec] = {}
    dtypes: dict[str, str] = {}
    fallback: dict[str, str] = {}
    for name, shape, _ in manifest:
        runs = {w: posts[w]["runs"].get(name) for w in workers}
        reasons = [posts[w]["fallback"][name] for w in workers if name in posts[w]["fallback"]]
        dtypes[name] = next(posts[w]["dtypes"][name] for w in workers if name in posts[w]["dtypes"])
        spec = None if reasons else _dst_spec(shape, runs)
        if spec is None:
            fallback[name] = reasons[0] if reasons else "its workers' pieces overlap unevenly"
            spec = ShardingSpec(
                shape, Mesh({"workers": len(workers)}, ranks=workers), [Replicate()]
            )
        specs[name] = spec
    digest = _digest(key)
    layout = Layout(specs, dtypes, fallback, layer_groups([m[0] for m in manifest]), digest)
    if len(_LAYOUTS) > 16:
        _LAYOUTS.clear()
    _LAYOUTS[key] = layout
    return layout


def _check(n: int, manifest: Manifest, posts: Mapping[int, dict[str, Any]]) -> None:
    """Raise ``ValueError`` naming every tensor that would not arrive whole (see :func:`agree`)."""
    problems: list[str] = []
    bad: set[str] = set()
    shapes = {name: shape for name, shape, _ in manifest}
    src_dtypes = {name: dt for name, _, dt in manifest}
    expected: dict[str, tuple[int, ...]] = {}
    for post in posts.values():
        expected.update({k: tuple(v) for k, v in (post.get("expected") or {}).items()})
    unknown: dict[str, str] = {}  # names no worker takes anything of
    for name, _, _ in manifest:
        whys = [post["unknown"].get(name) for post in posts.values()]
        if all(whys):
            unknown[name] = str(whys[0])
    for name, why in sorted(unknown.items()):
        bad.add(name)
        problems.append(
            f"{name!r} {shapes[name]}: the engine's model takes no tensor of this name ({why})"
        )
    for name, _, _ in manifest:  # a loader that raised on some workers only: a wrong shape
        raised = [
            str(post["unknown"][name])
            for post in posts.values()
            if str(post["unknown"].get(name, "")).startswith("its load_weights raised")
        ]
        if raised and name not in unknown:
            bad.add(name)
            problems.append(
                f"{name!r}: the trainer sends shape {shapes[name]}, which the engine's loader "
                f"refuses ({raised[0]}; the engine expects {expected.get(name, 'another shape')})"
            )
    for name, shape, _ in manifest:
        if name in unknown:
            continue
        reads = [
            () if name in post["unknown"] else post["reads"].get(name, ())
            for post in posts.values()
        ]
        if any(r is None for r in reads):
            continue  # a loader that does not read boxes: checked by vLLM's own loader
        boxes = [b for r in reads for b in r]
        lost = uncovered(shape, boxes)
        if lost:
            want = expected.get(name) or _extent(shape, boxes)
            bad.add(name)
            problems.append(
                f"{name!r}: the trainer sends shape {shape}, the engine expects {want}: "
                f"{lost} of its elements would never be read (a wrong shape)"
            )
    underfilled: dict[str, tuple[int, int]] = {}
    for post in posts.values():
        underfilled.update(post["underfilled"])
    if underfilled:
        missing = sorted(set(expected) - set(shapes))
        if missing:
            bad.update(missing)
            for name in missing:
                problems.append(
                    f"{name!r} {expected[name]}: missing from the trainer's tensors (the "
                    "engine's checkpoint has it)"
                )
        elif not problems:  # else the tensors named already explain it
            params = sorted(underfilled)
            bad.update(params)
            problems.append(
                "engine parameters the trainer's tensors do not fill whole (written/loadable "
                f"elements): {[(p, *underfilled[p]) for p in params[:20]]}"
            )
    for post in posts.values():
        for name, dst in post["dtypes"].items():
            if not _castable(src_dtypes[name], dst):
                bad.add(name)
                problems.append(
                    f"{name!r}: the trainer sends {src_dtypes[name]}, the engine holds {dst} "
                    "(only floating-point dtypes are cast into each other)"
                )
    if problems:
        unique = list(dict.fromkeys(problems))
        shown = unique[:12] + ([f"... and {len(unique) - 12} more"] if len(unique) > 12 else [])
        raise ValueError(
            f"meshlayout vLLM weight update {n}: the trainer's tensors do not match the "
            f"engine's model (nothing was sent; the engine keeps its weights): tensors "
            f"{sorted(bad)[:20]}\n  " + "\n  ".join(shown)
        )


def uncovered(shape: Sequence[int], boxes: Sequence[Box]) -> int:
    """Elements of a tensor of ``shape`` that no box covers (coordinate compression).

    >>> uncovered((4, 3), [((0, 2), (0, 3)), ((2, 4), (0, 2))])
    2
    >>> uncovered((4, 3), [((0, 4), (0, 3))])
    0
    """
    import numpy as np

    total = math.prod(shape)
    if not boxes:
        return total
    cuts = []
    for d, n in enumerate(shape):
        cuts.append(sorted({0, n} | {a for b in boxes for a in b[d]}))
    covered = np.zeros([len(c) - 1 for c in cuts], dtype=bool)
    for box in boxes:
        index = tuple(slice(c.index(a), c.index(b)) for c, (a, b) in zip(cuts, box))
        covered[index] = True
    sizes = [np.diff(np.array(c, dtype=np.int64)) for c in cuts]
    cell: Any = np.ones(covered.shape, dtype=np.int64)
    for d, s in enumerate(sizes):
        cell = cell * s.reshape([-1 if i == d else 1 for i in range(len(sizes))])
    return int(total - cell[covered].sum())


def _extent(shape: Sequence[int], boxes: Sequence[Box]) -> tuple[int, ...]:
    """What the engine reads: the bounding extent of the boxes along each dim."""
    if not boxes:
        return ()
    return tuple(max(b[d][1] for b in boxes) for d in range(len(shape)))


def _castable(src: str, dst: str) -> bool:
    if src == dst:
        return True
    a, b = dtype_of(src), dtype_of(dst)
    return a.is_floating_point and b.is_floating_point


def dst_spec_for(shape: tuple[int, ...], boxes: Mapping[int, Box | None]) -> ShardingSpec | None:
    """A spec over the workers whose every rank holds exactly its box, or None.

    ``Replicate`` when every box is the whole tensor; ``Shard(d)`` over ``k`` groups of
    equal size (``Replicate`` inside a group: vLLM's replicated KV heads) when the
    boxes split one dim into torch-style chunks. Checked rank by rank against the
    spec's own offsets and shapes.

    >>> dst_spec_for((10, 4), {2: ((0, 5), (0, 4)), 3: ((5, 10), (0, 4))})
    ShardingSpec(global_shape=(10, 4), mesh=Mesh(shard=2, rep=1, ranks=range(2, 4)), placements=(Shard(dim=0), Replicate()))
    >>> dst_spec_for((10, 4), {2: ((0, 6), (0, 4)), 3: ((6, 10), (0, 4))}) is None
    True

    Cached per ``(shape, boxes)``: a model repeats a few layouts over thousands of
    names (per-expert MoE names), which then share one immutable spec.
    """
    try:
        key = (tuple(shape), tuple(sorted(boxes.items())))
        hash(key)
    except TypeError:  # unhashable boxes (lists): not cached
        return _torch_style_spec(tuple(shape), boxes)
    return _dst_spec_cached(*key)


@functools.lru_cache(maxsize=1024)
def _dst_spec_cached(
    shape: tuple[int, ...], items: tuple[tuple[int, Box | None], ...]
) -> ShardingSpec | None:
    return _torch_style_spec(shape, dict(items))


def _torch_style_spec(
    shape: tuple[int, ...], boxes: Mapping[int, Box | None]
) -> ShardingSpec | None:
    if any(b is None for b in boxes.values()) or not boxes:
        return None
    full = tuple((0, n) for n in shape)
    workers = sorted(boxes)
    if all(boxes[w] == full for w in workers):
        return ShardingSpec(shape, Mesh({"workers": len(workers)}, ranks=workers), [Replicate()])
    dims = {d for w in workers for d, iv in enumerate(boxes[w] or ()) if iv != full[d]}
    if len(dims) != 1:
        return None
    d = dims.pop()
    intervals = sorted({(boxes[w] or full)[d] for w in workers})
    k = len(intervals)
    if len(workers) % k:
        return None
    rep = len(workers) // k
    order = [w for iv in intervals for w in workers if (boxes[w] or full)[d] == iv]
    if any(sum(1 for w in workers if (boxes[w] or full)[d] == iv) != rep for iv in intervals):
        return None
    spec = ShardingSpec(shape, Mesh({"shard": k, "rep": rep}, ranks=order), [Shard(d), Replicate()])
    for w in workers:
        box = boxes[w] or full
        want_shape = tuple(b - a for a, b in box)
        want_offset = tuple(a for a, _ in box)
        if spec.local_shape(w) != want_shape or spec.local_offset(w) != want_offset:
            return None
    return spec


def _dst_spec(
    shape: tuple[int, ...], runs: Mapping[int, tuple[Runs, ...] | None]
) -> ShardingSpec | None:
    """The destination spec over the workers holding part of a tensor: torch-style
    ``Shard``/``Replicate`` where the pieces are (:func:`dst_spec_for`), else a
    :class:`~meshlayout.sharding.RunsSpec` of the pieces (vLLM's padded vocabulary
    split: rows [0, 416) and [416, 777) of 777; every expert's gate and up rows of a
    stacked ``gate_up_proj``; the experts of an expert-parallel worker), or None
    when the pieces cannot form one (overlaps that are not replicas)."""
    held = {w: r for w, r in runs.items() if r is not None}
    if not held:
        return None
    if len(held) == len(runs) and all(all(len(d) == 1 for d in r) for r in held.values()):
        spec = dst_spec_for(shape, {w: tuple(d[0] for d in r) for w, r in held.items()})
        if spec is not None:
            return spec
    try:
        return RunsSpec(shape, held)
    except ValueError:
        return None


def layer_groups(names: Sequence[str]) -> list[list[str]]:
    """Names grouped by their outermost layer index (as vLLM's ``layerwise_groups``
    keys them), layers in order, then the names under no layer; a pure function of
    the name set, so both sides
    agree. A group is what one transfer moves before its layers are processed; the
    names under no layer (embeddings, final norm, head: the largest tensors) are a group
    each, so a worker materialises one of them at a time.

    >>> layer_groups(["lm_head.w", "model.layers.10.a", "model.embed.w", "model.layers.2.b"])
    [['model.layers.2.b'], ['model.layers.10.a'], ['lm_head.w'], ['model.embed.w']]
    """
    rest: list[str] = []
    stacks: dict[tuple[str, int], list[str]] = {}
    for name in sorted(names):
        parts = name.split(".")
        idx = next((i for i, p in enumerate(parts) if p.isdigit()), None)
        if idx is None:
            rest.append(name)
        else:
            stacks.setdefault((".".join(parts[:idx]), int(parts[idx])), []).append(name)
    return [stacks[k] for k in sorted(stacks)] + [[name] for name in rest]


Transfers = list[tuple[list[str], WeightTransfer]]


def transfers(
    layout: Layout,
    sg: SyncGroup,
    bucket_bytes: int,
    buffers: tuple[torch.Tensor, torch.Tensor],
    src_of: Callable[[list[str]], dict[str, Any] | None],
    dst_of: Callable[[list[str]], dict[str, Any] | None],
) -> Transfers:
    """One :class:`~meshlayout.torch.WeightTransfer` per layer group, in group order, all
    sharing ``buffers`` (a side passes its sources or destinations per group)."""
    return [
        (
            names,
            WeightTransfer(
                src_of(names),
                dst_of(names),
                bucket_bytes=bucket_bytes,
                timeout=sg.timeout,
                group=sg,
                buffers=buffers,
            ),
        )
        for names in layout.groups
    ]


def manifest_of(named: Mapping[str, torch.Tensor]) -> Manifest:
    return [(n, tuple(int(s) for s in t.shape), dtype_name(t.dtype)) for n, t in named.items()]
