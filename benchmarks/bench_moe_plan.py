"""Planning a Qwen3-30B-A3B-shaped MoE weight sync: every spec and every plan, on one core.

    .venv/bin/python benchmarks/bench_moe_plan.py [--repeats 3] [--cpu 1] [--fsdp both]

Manifest (checkpoint names, as the vLLM engine takes them): 48 layers, each with
q/k/v/o projections (32 heads, 4 KV heads, head_dim 128, hidden 2048), q_norm and
k_norm [128], two layer norms [2048], the router ``mlp.gate.weight`` [128, 2048] and
128 experts x gate/up/down (``[768, 2048]``, ``[768, 2048]``, ``[2048, 768]``);
plus the embedding and lm_head [151936, 2048] and the final norm: 18,867 names.

Trainer: 32 ranks, ``ParallelDims(32, dp_shard=32, ep=8)`` (torchtitan's layout):
expert stacks ``w1``/``w3`` [128, 768, 2048] and ``w2`` [128, 2048, 768] on the
expert mesh ``(efsdp=4, ep=8)`` with ``Shard(0)`` over ``ep`` and FSDP2 over
``efsdp`` either as ``Shard(1)`` (torchtitan's ``shard_placement_fn`` when
``efsdp*ep > experts``) or as FSDP2's default on a dim-0 EP shard,
``_StridedShard(0, split_factor=8)``; both are measured. A per-expert checkpoint
tensor's source is ``view_spec(stack_spec, (e,))``. Dense tensors: ``Shard(0)`` over
the 32-rank ``fsdp`` mesh.

Engine: TP=4 workers (sync ranks 32..35); each name's destination spec is what the
vLLM backend's verdict builds from the workers' boxes (``dst_spec_for``): gate/up,
q/k/v column-parallel, down and o row-parallel, norms and router replicated,
embedding and lm_head vocabulary-parallel. One ``transfer_plan`` per layer group
(``layer_groups``, as the backend groups), bucket 256 MiB, bf16.

Each measurement runs in a fresh interpreter pinned to one core (cold caches, as a
new manifest is): "views" = every ``view_spec`` call, "specs" = every other source
and destination spec, "plans" = every ``transfer_plan``; every spec and plan is kept
alive to the end (the backend holds them). Wall time is the goal's measure; CPU time
(``time.process_time``) is printed beside it, as the machine may be shared. Memory is measured in a separate child
(tracemalloc slows the run): the tracemalloc peak of the Python heap over the build
and the peak RSS growth over the process's RSS before it. Then a brute-force check
of a few random expert names (and dense names) against element ownership.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import numpy as np

from meshlayout import ParallelDims
from meshlayout.sharding import (
    Placement,
    Shard,
    ShardingSpec,
    StridedShard,
    TransferPlan,
    transfer_plan,
    view_spec,
)
from meshlayout.vllm._session import dst_spec_for, layer_groups

LAYERS, EXPERTS, HIDDEN, MOE_INTER = 48, 128, 2048, 768
HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4, 128, 151936
TRAINERS, TP = 32, 4
WORKERS = tuple(range(TRAINERS, TRAINERS + TP))
BUCKET = 256 * 2**20
ITEMSIZE = 2
GOAL_S, GOAL_BYTES = 5.0, 2**30

Box = tuple[tuple[int, int], ...]
# expert projection -> (trainer stack, checkpoint shape, engine split dim)
PROJ = {
    "gate_proj": ("w1", (MOE_INTER, HIDDEN), 0),
    "up_proj": ("w3", (MOE_INTER, HIDDEN), 0),
    "down_proj": ("w2", (HIDDEN, MOE_INTER), 1),
}


def dense_manifest() -> dict[str, tuple[tuple[int, ...], int | None]]:
    """Dense checkpoint name -> (shape, engine split dim or None = replicated)."""
    q, kv = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    out: dict[str, tuple[tuple[int, ...], int | None]] = {
        "model.embed_tokens.weight": ((VOCAB, HIDDEN), 0),
        "model.norm.weight": ((HIDDEN,), None),
        "lm_head.weight": ((VOCAB, HIDDEN), 0),
    }
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        out[p + "self_attn.q_proj.weight"] = ((q, HIDDEN), 0)
        out[p + "self_attn.k_proj.weight"] = ((kv, HIDDEN), 0)
        out[p + "self_attn.v_proj.weight"] = ((kv, HIDDEN), 0)
        out[p + "self_attn.o_proj.weight"] = ((HIDDEN, q), 1)
        out[p + "self_attn.q_norm.weight"] = ((HEAD_DIM,), None)
        out[p + "self_attn.k_norm.weight"] = ((HEAD_DIM,), None)
        out[p + "input_layernorm.weight"] = ((HIDDEN,), None)
        out[p + "post_attention_layernorm.weight"] = ((HIDDEN,), None)
        out[p + "mlp.gate.weight"] = ((EXPERTS, HIDDEN), None)
    return out


def expert_manifest() -> dict[str, tuple[int, str, int]]:
    """Per-expert checkpoint name -> (layer, projection, expert)."""
    return {
        f"model.layers.{layer}.mlp.experts.{e}.{proj}.weight": (layer, proj, e)
        for layer in range(LAYERS)
        for e in range(EXPERTS)
        for proj in PROJ
    }


def engine_box(shape: tuple[int, ...], split: int | None, worker: int) -> Box:
    """The box of the checkpoint tensor TP worker ``worker`` (0-based) loads (vLLM)."""
    full = [(0, n) for n in shape]
    if split is None:
        return tuple(full)
    n = shape[split]
    assert n % TP == 0, (shape, split)
    k = n // TP
    full[split] = (worker * k, (worker + 1) * k)
    return tuple(full)


def stack_placements(fsdp: str) -> list[Placement]:
    """Placements of an expert stack on the expert mesh (efsdp, ep)."""
    if fsdp == "shard1":
        return [Shard(1), Shard(0)]
    return [StridedShard(0, 8), Shard(0)]


def build(fsdp: str) -> tuple[dict[str, Any], dict[str, float]]:
    """Every spec and every plan; returns (kept objects, seconds per phase)."""
    dense = dense_manifest()
    experts = expert_manifest()
    pd = ParallelDims(TRAINERS, dp_shard=TRAINERS, ep=8)
    expert_mesh = pd.mesh(("efsdp", "ep"))
    fsdp_mesh = pd.mesh("fsdp")
    t: dict[str, float] = {}

    t0, c0 = time.perf_counter(), time.process_time()
    src: dict[str, ShardingSpec] = {}
    dst: dict[str, ShardingSpec] = {}
    stacks: dict[tuple[int, str], ShardingSpec] = {}
    placements = stack_placements(fsdp)
    for layer in range(LAYERS):
        for w, shape in (
            ("w1", (EXPERTS, MOE_INTER, HIDDEN)),
            ("w3", (EXPERTS, MOE_INTER, HIDDEN)),
            ("w2", (EXPERTS, HIDDEN, MOE_INTER)),
        ):
            stacks[layer, w] = ShardingSpec(shape, expert_mesh, placements)
    for name, (shape, split) in dense.items():
        src[name] = ShardingSpec(shape, fsdp_mesh, [Shard(0)])
        spec = dst_spec_for(shape, {w: engine_box(shape, split, w - TRAINERS) for w in WORKERS})
        assert spec is not None, name
        dst[name] = spec
    for name, (_, proj, _) in experts.items():
        _, shape, split = PROJ[proj]
        spec = dst_spec_for(shape, {w: engine_box(shape, split, w - TRAINERS) for w in WORKERS})
        assert spec is not None, name
        dst[name] = spec
    t["specs"], t["specs cpu"] = time.perf_counter() - t0, time.process_time() - c0

    t0, c0 = time.perf_counter(), time.process_time()
    for name, (layer, proj, e) in experts.items():
        src[name], _ = view_spec(stacks[layer, PROJ[proj][0]], (e,))
    t["views"], t["views cpu"] = time.perf_counter() - t0, time.process_time() - c0

    t0, c0 = time.perf_counter(), time.process_time()
    groups = layer_groups(list(src))
    plans = []
    for names in groups:
        plans.append(
            transfer_plan(
                {n: src[n] for n in names},
                {n: dst[n] for n in names},
                dict.fromkeys(names, ITEMSIZE),
                bucket_bytes=BUCKET,
            )
        )
    t["plans"], t["plans cpu"] = time.perf_counter() - t0, time.process_time() - c0
    for k in ("", " cpu"):
        t["total" + k] = t["specs" + k] + t["views" + k] + t["plans" + k]
    kept = {"src": src, "dst": dst, "stacks": stacks, "groups": groups, "plans": plans}
    return kept, t


# ---------------------------------------------------------------------- brute force
def _mask(shape: tuple[int, ...], runs: Any) -> Any:
    """Boolean mask of the elements a rank's runs (per dim) hold."""
    m = np.zeros(shape, dtype=bool)
    idx = [
        np.concatenate([np.arange(a, b) for a, b in rs]) if rs else np.zeros(0, int) for rs in runs
    ]
    if all(len(i) for i in idx):
        m[np.ix_(*idx)] = True
    return m


def _src_mask(kept: dict[str, Any], name: str, rank: int) -> Any:
    """Brute-force ownership of ``name``'s elements by trainer ``rank``: for an expert,
    cut out of the stack spec's own local runs (not through view_spec)."""
    parts = name.split(".")
    if ".mlp.experts." in name:
        layer, e, proj = int(parts[2]), int(parts[5]), parts[6]
        w, shape, _ = PROJ[proj]
        runs = kept["stacks"][layer, w].local_runs(rank)
        if not any(a <= e < b for a, b in runs[0]):
            return np.zeros(shape, dtype=bool)
        return _mask(shape, runs[1:])
    spec = kept["src"][name]
    return _mask(spec.global_shape, spec.local_runs(rank))


def check(kept: dict[str, Any], names: list[str]) -> list[str]:
    """For each name: every destination element arrives exactly once, from a rank that
    holds it; bytes moved = numel x itemsize x (workers holding each element)."""
    dense = dense_manifest()
    plan_of: dict[str, TransferPlan] = {}
    for plan in kept["plans"]:
        for n in plan.names:
            plan_of[n] = plan
    report = []
    for name in names:
        plan = plan_of[name]
        shape = kept["dst"][name].global_shape
        if name in dense:
            split = dense[name][1]
        else:
            split = PROJ[name.split(".")[6]][2]
        got = {w: np.zeros(shape, dtype=np.int64) for w in WORKERS}
        owned: dict[int, Any] = {}
        moved = 0
        for rnd in plan.rounds:
            for tr in rnd.transfers:
                if tr.name != name:
                    continue
                sl = tuple(slice(a, b) for a, b in tr.box)
                if tr.src_rank not in owned:
                    owned[tr.src_rank] = _src_mask(kept, name, tr.src_rank)
                assert owned[tr.src_rank][sl].all(), (name, tr)
                got[tr.dst_rank][sl] += 1
                moved += int(np.prod([b - a for a, b in tr.box])) * ITEMSIZE
        assert not [b for n, b in plan.local_copies() if n == name], name
        holders = 0
        for w in WORKERS:
            want = np.zeros(shape, dtype=np.int64)
            want[tuple(slice(a, b) for a, b in engine_box(shape, split, w - TRAINERS))] = 1
            assert np.array_equal(got[w], want), (name, w)
            assert int(got[w].sum()) == int(np.prod(kept["dst"][name].local_shape(w))), (name, w)
            holders += int(want.sum())
        numel = int(np.prod(shape))
        assert moved == holders * ITEMSIZE, (name, moved, holders)
        report.append(
            f"{name}: {moved} bytes = {moved // (numel * ITEMSIZE)} x {numel} x {ITEMSIZE}"
        )
    return report


# ---------------------------------------------------------------------- driver
def child(mode: str, fsdp: str, cpu: int) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {cpu})
    rss0 = _rss_bytes()
    if mode == "mem":
        tracemalloc.start()
    kept, t = build(fsdp)
    out: dict[str, Any] = {"t": t}
    if mode == "mem":
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out["trace_peak"] = peak
    out["rss_delta"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0
    plans = kept["plans"]
    out["names"] = sum(len(p.names) for p in plans)
    out["experts"] = sum(1 for n in kept["src"] if ".mlp.experts." in n)
    out["groups"] = len(plans)
    out["rounds"] = sum(len(p.rounds) for p in plans)
    out["bytes_moved"] = sum(p.bytes_moved for p in plans)
    out["transfers"] = sum(len(p.arrays()["tid"]) for p in plans)
    if mode == "check":
        rng = random.Random(0)
        expert_names = [n for n in kept["src"] if ".mlp.experts." in n]
        pick = [
            *rng.sample(expert_names, 4),
            "model.layers.7.self_attn.k_proj.weight",
            "model.layers.7.self_attn.o_proj.weight",
            "model.layers.7.self_attn.q_norm.weight",
            "model.layers.7.mlp.gate.weight",
            "lm_head.weight",
        ]
        out["check"] = check(kept, pick)
    print(json.dumps(out))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_child(mode: str, fsdp: str, cpu: int) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", mode, "--fsdp", fsdp, "--cpu", str(cpu)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=1)
    ap.add_argument("--fsdp", choices=("shard1", "strided", "both"), default="both")
    ap.add_argument("--child", choices=("time", "mem", "check"))
    args = ap.parse_args()
    if args.child:
        child(args.child, args.fsdp, args.cpu)
        return
    load = os.getloadavg()
    print(
        f"one core (cpu {args.cpu}), {args.repeats} fresh interpreters per case; "
        f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f} on {os.cpu_count()} cores"
    )
    ok = True
    for fsdp in ("shard1", "strided") if args.fsdp == "both" else (args.fsdp,):
        label = {"shard1": "[Shard(1), Shard(0)]", "strided": "[_StridedShard(0, 8), Shard(0)]"}
        runs = [run_child("time", fsdp, args.cpu) for _ in range(args.repeats)]
        mem = run_child("mem", fsdp, args.cpu)
        chk = run_child("check", fsdp, args.cpu)
        r = runs[0]
        print(
            f"\nexpert stacks on (efsdp=4, ep=8) as {label[fsdp]}: {r['names']} names "
            f"({r['experts']} per-expert), {r['groups']} layer groups, {r['transfers']} "
            f"transfers in {r['rounds']} rounds, {r['bytes_moved'] / 1e9:.2f} GB moved"
        )
        print(f"{'phase':<8} {'wall min s':>10} {'median':>7} {'cpu min s':>10} {'median':>7}")
        for phase in ("specs", "views", "plans", "total"):
            xs = [x["t"][phase] for x in runs]
            cs = [x["t"][phase + " cpu"] for x in runs]
            goal = f"   goal <= {GOAL_S:g} s" if phase == "total" else ""
            print(
                f"{phase:<8} {min(xs):>10.2f} {statistics.median(xs):>7.2f} "
                f"{min(cs):>10.2f} {statistics.median(cs):>7.2f}{goal}"
            )
        total = min(x["t"]["total"] for x in runs)
        rss = max(x["rss_delta"] for x in [*runs, mem])
        print(
            f"memory: tracemalloc peak {mem['trace_peak'] / 2**20:.0f} MiB, peak RSS growth "
            f"{rss / 2**20:.0f} MiB (largest of {len(runs) + 1} runs)   goal <= 1 GiB"
        )
        print(f"(under tracemalloc the build took {mem['t']['total']:.2f} s)")
        print("brute-force check (every destination element once, from a holder):")
        for line in chk["check"]:
            print(f"  ok  {line}")
        met = total <= GOAL_S and max(mem["trace_peak"], rss) <= GOAL_BYTES
        ok &= met
        print(f"goal {'met' if met else 'NOT met'}")
    load = os.getloadavg()
    print(f"\nload average at the end: {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
