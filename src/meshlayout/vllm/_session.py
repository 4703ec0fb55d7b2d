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

import hashlib
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from ..mesh import Mesh
from ..sharding import Replicate, Shard, ShardingSpec
from ..torch import RankTimeoutError, SyncGroup, WeightTransfer
from ..torch._transfer_meta import dtype_name, dtype_of

__all__ = ["Layout", "Manifest", "agree", "dst_spec_for", "layer_groups", "transfers"]

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
    try:
        store.wait([key], timeout)
    except Exception as exc:
        raise RankTimeoutError(message, missing=missing) from exc
    return pickle.loads(store.get(key))  # posted by this job's own ranks


def post_manifest(sg: SyncGroup, n: int, manifest: Manifest) -> None:
    _post(sg.store, f"{_PREFIX}/{n}/manifest", manifest)


def read_manifest(sg: SyncGroup, n: int) -> Manifest:
    secs = sg.timeout.total_seconds()
    value: Manifest = _read(
        sg.store,
        f"{_PREFIX}/{n}/manifest",
        sg.timeout,
        f"meshlayout vLLM update {n}: worker (sync rank {sg.rank}) waited {secs:g}s for the "
        "trainer's manifest (trainer rank 0 posts it in send_weights)",
        [0],
    )
    return value


def post_worker(sg: SyncGroup, n: int, post: dict[str, Any]) -> None:
    _post(sg.store, f"{_PREFIX}/{n}/worker/{sg.rank}", post)


def agree(sg: SyncGroup, n: int, trainers: int, manifest: Manifest) -> Layout:
    """Every rank: read every worker's post and compute the same :class:`Layout`."""
    workers = list(range(trainers, sg.world_size))
    posts: dict[int, dict[str, Any]] = {}
    secs = sg.timeout.total_seconds()
    for w in workers:
        key = f"{_PREFIX}/{n}/worker/{w}"
        posts[w] = _read(
            sg.store,
            key,
            sg.timeout,
            f"meshlayout vLLM update {n}: sync rank {sg.rank} waited {secs:g}s for the "
            f"derivation of worker sync rank {w}",
            [w],
        )
    problems: list[str] = []
    bad: set[str] = set()
    shapes = {name: shape for name, shape, _ in manifest}
    src_dtypes = {name: dt for name, _, dt in manifest}
    for post in posts.values():
        for name, why in sorted(post["unknown"].items()):
            bad.add(name)
            problems.append(f"{name!r} {shapes[name]}: the engine cannot load it ({why})")
        if post["unfilled"]:
            problems.append(
                f"engine parameters no trainer tensor fills: {sorted(post['unfilled'])[:20]}"
            )
            bad.update(post["unfilled"])
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
    specs: dict[str, ShardingSpec] = {}
    dtypes: dict[str, str] = {}
    fallback: dict[str, str] = {}
    for name, shape, _ in manifest:
        boxes = {w: posts[w]["boxes"].get(name) for w in workers}
        reasons = [posts[w]["fallback"][name] for w in workers if name in posts[w]["fallback"]]
        dtypes[name] = next(posts[w]["dtypes"][name] for w in workers if name in posts[w]["dtypes"])
        spec = None if reasons else dst_spec_for(shape, boxes)
        if spec is None:
            fallback[name] = reasons[0] if reasons else "vLLM's split is not a torch-style one"
            spec = ShardingSpec(
                shape, Mesh({"workers": len(workers)}, ranks=workers), [Replicate()]
            )
        specs[name] = spec
    digest = hashlib.sha1(
        pickle.dumps(
            (manifest, sorted((w, repr(sorted(p["boxes"].items()))) for w, p in posts.items()))
        ),
        usedforsecurity=False,
    ).hexdigest()
    return Layout(specs, dtypes, fallback, layer_groups([m[0] for m in manifest]), digest)


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
    """
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
