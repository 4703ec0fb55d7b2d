"""meshlayout.torch.reshard on real gloo processes (spawned), checked element by element.

Every case runs on the ranks of the union of both specs' rank sets; each destination
piece must equal slicing the full tensor (``dst_spec.shard(full, rank)``), bit for
bit, with the source dtype; ``local`` must be untouched; each call makes exactly one
collective (none when nothing moves) and the bytes it sends to other ranks are
exactly the plan's ``elements_moved``. All cases share one spawned process group
(spawn + gloo start-up costs seconds); failures come back as text per case.
"""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

pytest.importorskip("torch")

from meshlayout import Mesh
from meshlayout.sharding import Replicate, Shard, ShardingSpec, StridedShard
from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(300)]

WORLD = 6
DTYPES = ("float32", "bfloat16", "int64")
Case = tuple[str, ShardingSpec, ShardingSpec, str]


def named_cases() -> list[Case]:
    """The scenarios of issue 12, each in several dtypes."""
    fsdp4 = Mesh({"dp": 4})
    tp23 = Mesh({"tp": 2}, ranks=[2, 3])
    fsdp_tp = Mesh({"dp": 3, "tp": 2})
    tp3 = Mesh({"tp": 3})
    out: list[Case] = []
    for shape in ((8, 6), (9, 5)):
        for dtype in ("float32", "bfloat16"):  # the same pair again in another dtype
            out.append(
                (
                    f"fsdp4->tp2@{{2,3}} {shape} {dtype}",
                    ShardingSpec(shape, fsdp4, [Shard(0)]),
                    ShardingSpec(shape, tp23, [Shard(1)]),
                    dtype,
                )
            )
    for rows in (7, 13):
        src = ShardingSpec((rows, 5), fsdp_tp, [StridedShard(0, 2), Shard(0)])
        for d in (0, 1):
            out.append(
                (
                    f"fsdp3-over-tp2 {rows} rows -> tp3 Shard({d})",
                    src,
                    ShardingSpec((rows, 5), tp3, [Shard(d)]),
                    "bfloat16" if d else "int64",
                )
            )
    a, b = Mesh({"x": 2}), Mesh({"y": 2}, ranks=[2, 3])
    out += [
        (
            "disjoint 0-1 -> 2-3 Shard(0)->Shard(1)",
            ShardingSpec((5, 7), a, [Shard(0)]),
            ShardingSpec((5, 7), b, [Shard(1)]),
            "bfloat16",
        ),
        (
            "disjoint 0-1 -> 2-3 Shard(0)->Shard(1) again, int64",
            ShardingSpec((5, 7), a, [Shard(0)]),
            ShardingSpec((5, 7), b, [Shard(1)]),
            "int64",
        ),
        (
            "disjoint 0-1 -> 2-3 Shard(1)->Replicate",
            ShardingSpec((5, 7), a, [Shard(1)]),
            ShardingSpec((5, 7), b, [Replicate()]),
            "int64",
        ),
        (
            "replicate source dp2 x tp2 -> Shard(1) on 4",
            ShardingSpec((6, 9), Mesh({"dp": 2, "tp": 2}), [Replicate(), Shard(0)]),
            ShardingSpec((6, 9), Mesh({"x": 4}, ranks=[3, 1, 0, 2]), [Shard(1)]),
            "float32",
        ),
        (
            "fully replicated source on 0-2 -> Shard(0) on 3-5",
            ShardingSpec((10, 3), Mesh({"r": 3}), [Replicate()]),
            ShardingSpec((10, 3), Mesh({"s": 3}, ranks=[3, 4, 5]), [Shard(0)]),
            "int64",
        ),
        (
            "2-D permuted -> 1-D permuted",
            ShardingSpec(
                (7, 11), Mesh({"dp": 2, "tp": 3}, ranks=[4, 1, 5, 0, 3, 2]), [Shard(1), Shard(0)]
            ),
            ShardingSpec((7, 11), Mesh({"x": 6}, ranks=[5, 3, 1, 0, 2, 4]), [Shard(0)]),
            "float32",
        ),
        (
            "1-D -> 2-D FSDP over TP (training layout from inference)",
            ShardingSpec((13, 4), Mesh({"tp": 3}), [Shard(0)]),
            ShardingSpec((13, 4), fsdp_tp, [StridedShard(0, 2), Shard(0)]),
            "bfloat16",
        ),
        (
            "undecodable StridedShard -> Shard",
            ShardingSpec((8, 3), Mesh({"x": 2}), [StridedShard(0, 2)]),
            ShardingSpec((8, 3), Mesh({"y": 4}, ranks=[1, 2, 3, 4]), [Shard(0)]),
            "int64",
        ),
        (
            "identity (nothing moves)",
            ShardingSpec((6, 4), fsdp4, [Shard(0)]),
            ShardingSpec((6, 4), fsdp4, [Shard(0)]),
            "float32",
        ),
        (
            "0-d tensor replicated -> other ranks",
            ShardingSpec((), Mesh({"x": 2}), [Replicate()]),
            ShardingSpec((), Mesh({"y": 3}, ranks=[2, 3, 4]), [Replicate()]),
            "float32",
        ),
        (
            "empty tensor",
            ShardingSpec((0, 4), Mesh({"x": 2}), [Shard(0)]),
            ShardingSpec((0, 4), Mesh({"y": 2}, ranks=[3, 4]), [Shard(1)]),
            "int64",
        ),
    ]
    return out


def random_cases(n: int, seed: int) -> list[Case]:
    """Random specs on random subsets/permutations of the world: uneven, strided (also
    undecodable), replicated, mesh families (one copy per sub-mesh)."""
    rng = random.Random(seed)
    out: list[Case] = []
    while len(out) < n:
        shape = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
        try:
            src, dst = _random_spec(rng, shape), _random_spec(rng, shape)
        except ValueError:
            continue  # a placement list ShardingSpec rejects
        out.append((f"random #{len(out)}", src, dst, rng.choice(DTYPES)))
    return out


def _random_spec(rng: random.Random, shape: tuple[int, ...]) -> ShardingSpec:
    size = rng.randint(1, WORLD)
    ranks = rng.sample(range(WORLD), size)
    sizes = [d for d in range(1, size + 1) if size % d == 0]
    first = rng.choice(sizes)
    dims = (first, size // first) if first not in (1, size) and rng.random() < 0.6 else (size,)
    mesh = Mesh(dims, ranks=ranks)
    if mesh.ndim == 2 and rng.random() < 0.5:
        mesh = mesh[rng.randrange(2)]  # a family: one full copy per sub-mesh
    placements: list[Any] = []
    for _ in range(mesh.ndim):
        kind = rng.random()
        d = rng.randrange(len(shape))
        if kind < 0.25:
            placements.append(Replicate())
        elif kind < 0.8:
            placements.append(Shard(d))
        else:
            placements.append(StridedShard(d, rng.randint(2, 3)))
    return ShardingSpec(shape, mesh, placements)


def _union(src: ShardingSpec, dst: ShardingSpec) -> set[int]:
    return {int(r) for r in src.mesh.rank_map} | {int(r) for r in dst.mesh.rank_map}  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- child side
def _full(shape: tuple[int, ...], dtype: str) -> Any:
    """A tensor whose elements all have distinct bit patterns (compared bitwise)."""
    import torch

    n = math.prod(shape)
    if dtype == "bfloat16":
        bits = (torch.arange(n, dtype=torch.int32) * 7 + 1) % 32768
        return bits.to(torch.int16).view(torch.bfloat16).reshape(shape)
    if dtype == "float32":
        return (torch.arange(n, dtype=torch.float32) * 0.5 - 3).reshape(shape)
    return (torch.arange(n, dtype=torch.int64) * 1_000_003 - 17).reshape(shape)


def _bits(t: Any) -> Any:
    import torch

    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t


def _instrument() -> dict[str, Any]:
    """Log every c10d operation (collective or point-to-point) this process dispatches.

    Every ``torch.distributed`` communication, whichever API issues it, is a ``c10d``
    operator; a dispatch mode sees each one with its arguments. For
    ``alltoall_base_`` the bytes sent to other ranks are the input split sizes
    without this rank's own slot.
    """
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    log: dict[str, Any] = {"calls": [], "sent": 0}

    class CommLog(TorchDispatchMode):
        def __torch_dispatch__(
            self, func: Any, types: Any, args: Any = (), kwargs: Any = None
        ) -> Any:
            if func.namespace in ("c10d", "_c10d_functional", "c10d_functional"):
                log["calls"].append(func.overloadpacket.__name__)
                if func.overloadpacket.__name__ == "alltoall_base_":
                    me = dist.ProcessGroup.unbox(args[2]).rank()
                    log["sent"] += sum(n for i, n in enumerate(args[4]) if i != me)
            return func(*args, **(kwargs or {}))

    log["mode"] = CommLog
    return log


def _run_case(rank: int, case: Case, log: dict[str, Any]) -> dict[str, Any]:
    import torch

    from meshlayout.torch import reshard

    _, src, dst, dtype = case
    full = _full(src.global_shape, dtype)
    local = src.shard(full, rank) if rank in src.mesh else None
    before = local.clone() if local is not None else None
    calls0, sent0 = len(log["calls"]), log["sent"]
    with log["mode"]():
        out = reshard(local, src, dst, timeout=60)
    result: dict[str, Any] = {
        "calls": log["calls"][calls0:],
        "sent": log["sent"] - sent0,
        "problems": [],
    }
    problems = result["problems"]
    if local is not None and not torch.equal(_bits(local), _bits(before)):
        problems.append("local was modified")
    if rank in dst.mesh:
        want = dst.shard(full, rank)
        if not isinstance(out, torch.Tensor):
            problems.append(f"expected a tensor, got {out!r}")
        elif out.dtype != full.dtype or tuple(out.shape) != tuple(want.shape):
            problems.append(f"got {out.dtype} {tuple(out.shape)}, want {full.dtype} {want.shape}")
        elif not torch.equal(_bits(out), _bits(want)):
            problems.append(f"wrong values:\n{out}\nwant\n{want}")
        elif not out.is_contiguous():
            problems.append("result is not contiguous")
        elif local is not None and out.numel() and out.data_ptr() == local.data_ptr():
            problems.append("result aliases local")
    elif out is not None:
        problems.append(f"rank outside the destination got {out!r}")
    return result


def _body(rank: int, world: int, cases: list[Case]) -> dict[str, Any]:
    log = _instrument()
    results: dict[str, Any] = {}
    for case in cases:
        if rank in _union(case[1], case[2]):
            try:
                results[case[0]] = _run_case(rank, case, log)
            except Exception as exc:  # report, keep going: later cases need this rank
                results[case[0]] = {"calls": [], "sent": 0, "problems": [repr(exc)]}
    results["errors"] = _error_cases(rank)
    results["timeout"] = _timeout_case(rank)
    return results


def _error_cases(rank: int) -> dict[str, str]:
    """Bad inputs fail fast with a precise error, on each rank, before any communication."""
    import torch

    from meshlayout.sharding import Partial
    from meshlayout.torch import MeshMismatchError, reshard

    out: dict[str, str] = {}
    world6 = Mesh({"w": 6})
    src = ShardingSpec((6, 4), world6, [Shard(0)])
    dst = ShardingSpec((6, 4), world6, [Shard(1)])

    def attempt(key: str, fn: Any) -> None:
        try:
            fn()
            out[key] = "no error"
        except Exception as exc:
            out[key] = f"{type(exc).__name__}: {exc}"

    attempt("shape", lambda: reshard(torch.zeros(2, 2), src, dst, timeout=30))
    attempt("none", lambda: reshard(None, src, dst, timeout=30))
    attempt(
        "global",
        lambda: reshard(
            torch.zeros(1, 4), src, ShardingSpec((6, 5), world6, [Shard(1)]), timeout=30
        ),
    )
    attempt(
        "partial",
        lambda: reshard(
            torch.zeros(6, 4),
            ShardingSpec((6, 4), world6, [Partial()]),
            dst,
            timeout=30,
        ),
    )
    attempt("spec type", lambda: reshard(torch.zeros(1, 4), src, "Shard(1)", timeout=30))  # type: ignore[arg-type]
    small = ShardingSpec((4,), Mesh({"x": 2}), [Shard(0)])
    small_dst = ShardingSpec((4,), Mesh({"y": 2}, ranks=[1, 2]), [Replicate()])
    if rank >= 3:  # outside the union {0, 1, 2}
        attempt("outsider", lambda: reshard(None, small, small_dst, timeout=30))
    # Ranks disagree on the dtype: every rank of the union raises MeshMismatchError.
    x = torch.zeros(1, 4, dtype=torch.int64 if rank == 4 else torch.float32)
    try:
        reshard(x, src, dst, timeout=60)
        out["dtype"] = "no error"
    except MeshMismatchError as exc:
        out["dtype"] = f"MeshMismatchError {sorted(exc.ranks)} {exc.fields}"
    # Ranks disagree on the destination spec.
    other = ShardingSpec((6, 4), world6, [Shard(0) if rank == 2 else Shard(1)])
    try:
        reshard(src.shard(torch.zeros(6, 4), rank), src, other, timeout=60)
        out["specs"] = "no error"
    except MeshMismatchError as exc:
        out["specs"] = f"MeshMismatchError {sorted(exc.ranks)} {exc.fields}"
    # Everything still works afterwards.
    full = _full((6, 4), "float32")
    got = reshard(src.shard(full, rank), src, dst, timeout=60)
    out["after"] = "ok" if got is not None and torch.equal(got, dst.shard(full, rank)) else "bad"
    return out


def _timeout_case(rank: int) -> dict[str, Any]:
    """Rank 3 stops calling: ranks 0-2 fail within the timeout, naming rank 3.

    First in the collective (the spec pair was checked by an earlier call), then in
    the first-call check of a new pair (no collective is reached).
    """
    import torch

    from meshlayout.torch import RankTimeoutError, reshard

    fsdp = Mesh({"dp": 4})
    tp = Mesh({"tp": 2}, ranks=[2, 3])
    checked = (ShardingSpec((8, 4), fsdp, [Shard(0)]), ShardingSpec((8, 4), tp, [Shard(1)]))
    fresh = (ShardingSpec((8, 4), fsdp, [Shard(0)]), ShardingSpec((8, 4), tp, [Shard(0)]))
    out: dict[str, Any] = {}
    if rank in (4, 5):
        return _dtype_change_case(rank)
    reshard(torch.zeros(2, 4), *checked, timeout=60)  # all four: the pair is checked
    if rank == 3:
        return out
    for key, (src, dst) in (("collective", checked), ("check", fresh)):
        try:
            reshard(torch.zeros(2, 4), src, dst, timeout=8)  # margin for a loaded machine
            out[key] = ("no error", (), False)
        except RankTimeoutError as exc:
            out[key] = ("RankTimeoutError", exc.missing, "[3]" in str(exc))
        except Exception as exc:
            out[key] = (type(exc).__name__, (), str(exc))
    return out


def _dtype_change_case(rank: int) -> dict[str, Any]:
    """Ranks 4, 5: after a checked call, rank 5 alone switches dtype. Rank 5 re-checks
    (its dtype for the pair changed) while rank 4 goes to the collective: both fail
    within the timeout naming the other, instead of exchanging mismatched bytes."""
    import torch

    from meshlayout.torch import RankTimeoutError, reshard

    src = ShardingSpec((4, 4), Mesh({"x": 2}, ranks=[4, 5]), [Shard(0)])
    dst = ShardingSpec((4, 4), Mesh({"y": 2}, ranks=[4, 5]), [Shard(1)])
    reshard(torch.zeros(2, 4), src, dst, timeout=60)
    x = torch.zeros(2, 4, dtype=torch.float64 if rank == 5 else torch.float32)
    try:
        reshard(x, src, dst, timeout=8)
    except RankTimeoutError as exc:
        return {"dtype change": ("RankTimeoutError", exc.missing)}
    except Exception as exc:
        return {"dtype change": (type(exc).__name__, str(exc))}
    return {"dtype change": ("no error", ())}


# ---------------------------------------------------------------------- parent side
@pytest.fixture(scope="module")
def outcome() -> tuple[list[Case], list[dict[str, Any]]]:
    cases = named_cases() + random_cases(40, seed=12)
    results = run_multiproc(_body, WORLD, cases, timeout=240, start_method="spawn")
    return cases, results


def test_every_case_is_exact(outcome: tuple[list[Case], list[dict[str, Any]]]) -> None:
    cases, results = outcome
    bad = []
    for name, src, dst, _ in cases:
        for r in sorted(_union(src, dst)):
            for p in results[r][name]["problems"]:
                bad.append(f"{name} rank {r}: {p}\n  {src!r}\n  -> {dst!r}")
    assert not bad, "\n".join(bad)


def test_one_collective_and_minimal_bytes(
    outcome: tuple[list[Case], list[dict[str, Any]]],
) -> None:
    from meshlayout.sharding import reshard_plan

    cases, results = outcome
    bad = []
    ran = 0
    for name, src, dst, dtype in cases:
        plan = reshard_plan(src, dst)
        size = {"float32": 4, "bfloat16": 2, "int64": 8}[dtype]
        union = sorted(_union(src, dst))
        want_calls = ["alltoall_base_"] if plan.elements_moved else []
        for r in union:
            if results[r][name]["calls"] != want_calls:
                bad.append(f"{name} rank {r}: {results[r][name]['calls']} != {want_calls}")
        sent = sum(results[r][name]["sent"] for r in union)
        if sent != plan.elements_moved * size:
            bad.append(f"{name}: sent {sent} bytes, plan moves {plan.elements_moved} x {size}")
        ran += bool(plan.elements_moved)
    assert not bad, "\n".join(bad)
    assert ran >= len(cases) - 5  # nearly every case really communicates


def test_bad_inputs_fail_fast_and_precisely(
    outcome: tuple[list[Case], list[dict[str, Any]]],
) -> None:
    _, results = outcome
    for r in range(WORLD):
        err = results[r]["errors"]
        assert err["shape"].startswith("ValueError: local piece of rank"), err["shape"]
        assert "(1, 4)" in err["shape"]
        assert err["none"].startswith("TypeError: rank"), err["none"]
        assert err["global"].startswith("ValueError") and "(6, 5)" in err["global"]
        assert err["partial"].startswith("ValueError") and "Partial" in err["partial"]
        assert err["spec type"].startswith("TypeError") and "dst_spec" in err["spec type"]
        if r >= 3:
            assert err["outsider"].startswith("ValueError") and "[0, 1, 2]" in err["outsider"]
        assert err["dtype"] == "MeshMismatchError [4] ('dtype',)", err["dtype"]
        assert err["specs"] == "MeshMismatchError [2] ('dst_spec',)", err["specs"]
        assert err["after"] == "ok"


def test_absent_rank_is_named(outcome: tuple[list[Case], list[dict[str, Any]]]) -> None:
    _, results = outcome
    assert results[4]["timeout"]["dtype change"] == ("RankTimeoutError", (5,))
    assert results[5]["timeout"]["dtype change"] == ("RankTimeoutError", (4,))
    for r in (0, 1, 2):
        for key in ("collective", "check"):
            got = results[r]["timeout"][key]
            assert got == ("RankTimeoutError", (3,), True), (r, key, got)


def test_buffers_are_views_where_the_layout_allows() -> None:
    """FSDP(dp=4) -> TP(tp=2 on {2, 3}): each TP rank receives straight into its result.

    Row blocks arrive in peer order and tile the (rows, cols/2) piece, so the receive
    buffer is (part of) the result. Rank 2's own rows sit between received ones: they
    ride in the collective's self slot. Rank 3's own rows come last: a direct copy.
    The reverse direction sends a view of ``local`` without packing (and unpacks).
    """
    from meshlayout.torch._reshard import _schedule

    fsdp = ShardingSpec((8, 6), Mesh({"dp": 4}), [Shard(0)])
    tp = ShardingSpec((8, 6), Mesh({"tp": 2}, ranks=[2, 3]), [Shard(1)])
    two, three = _schedule(fsdp, tp, 2), _schedule(fsdp, tp, 3)
    assert two.recv_flat == (0, 24) and two.copies == ()
    assert two.recv_counts == (6, 6, 6, 6) and two.send_counts == (0, 0, 6, 6)
    assert three.recv_flat == (0, 18) and three.recv_counts == (6, 6, 6, 0)
    assert three.copies == (((slice(0, 2), slice(3, 6)), (slice(6, 8), slice(0, 3))),)
    assert _schedule(fsdp, tp, 0).send_counts == (0, 0, 3 * 2, 3 * 2)
    back = _schedule(tp, fsdp, 2)  # TP -> FSDP: rank 2 sends 2 rows x 3 cols to each
    assert back.send_flat == (0, 24) and back.send_counts == (6, 6, 6, 6)
    assert back.recv_flat is None  # column halves of a row block: unpacked
