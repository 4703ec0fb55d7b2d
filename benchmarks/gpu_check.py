"""meshlayout's torch layer on one GPU, in one call: checks and throughputs, one report.

    make gpu-check                                            # cuda:0, NCCL, world size 1
    PYTHONPATH=src python3 benchmarks/gpu_check.py            # the same, without make
    PYTHONPATH=src python3 benchmarks/gpu_check.py --device cpu --small   # gloo (the suite)

Needs torch >= 2.10 (with CUDA for the default device), numpy and safetensors; meshlayout
comes from this checkout (``PYTHONPATH=src`` or ``pip install -e . --no-deps``). One
process, world size 1, its store a ``TCPStore`` on 127.0.0.1 (free port); every wait
is bounded and the whole run stops after ``--time-limit`` seconds (default 280) with
every thread's stack on stderr. Exit status 0 when every check passed, 1 otherwise.

Checks, in order (each exact; a failure is reported and the later checks still run
where they can):

1. **groups**: the default group (``init_process_group`` with ``device_id``) is what
   meshlayout's ``get_group`` returns for the world; a group created by meshlayout's
   members-only path (``_c10d.create_group``, our name; NCCL with
   ``ProcessGroupNCCL.Options``) and its four collectives with a timeout (all-gather,
   all-reduce, broadcast, all-to-all) on device tensors;
2. **mesh**: ``init_mesh`` of a (dp=1, tp=1) mesh, ``to_torch()``'s ``DeviceMesh``, a
   ``DTensor`` on it, meshlayout's ``full_tensor``;
3. **fsdp2+dcp**: FSDP2 (``fully_shard`` on that mesh) trains one step; meshlayout's
   exact DCP save, ``describe_checkpoint(verify=True)``, load into a fresh FSDP2 model:
   parameters and a forward pass equal bitwise;
4. **safetensors**: ``export_safetensors`` of that checkpoint, read back by the
   safetensors library onto the device; ``load_safetensors`` into a fresh FSDP2 model
   and into plain device tensors;
5. **transfer**: ``WeightTransfer`` of the FSDP2 parameters into preallocated bf16
   device tensors with ``verify=True``, twice (after another optimizer step);
   fingerprints on the device equal those on the CPU (fp32 hashed as bf16, bf16,
   unaligned boxes);
6. **pack/unpack**: a two-rank FSDP (dp=2) -> TP (tp=2) fp32 -> bf16 transfer plan,
   both ranks' rounds packed, exchanged and unpacked on this one device with
   ``WeightTransfer``'s own pack and unpack: every destination piece exact;
7. **throughput** (best of ``--repeats``, the device synchronised around each run):
   fingerprint (destination and source side), pack (with the fp32 -> bf16 cast),
   unpack, and torch's own cast, as GB/s and as multiples of the time of a device
   memcpy (``copy_`` bf16 -> bf16) of the same bytes, measured in the same run.

The report names the torch, CUDA and NCCL versions, the device, the NCCL backend class
(torch 2.15 builds ``ProcessGroupNCCL2`` for ``"nccl"`` unless
``TORCH_DIST_USE_NCCL2=0``) and the NCCL environment it ran with.
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any


@dataclass
class Report:
    """The lines of the report, filled as the checks run."""

    header: list[str] = field(default_factory=list)
    rows: list[tuple[str, bool, float, str]] = field(default_factory=list)
    throughput: list[str] = field(default_factory=list)

    def run(self, name: str, fn: Callable[[], str]) -> bool:
        print(f"[gpu-check] {name} ...", file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        try:
            detail, ok = fn(), True
        except Exception as exc:
            traceback.print_exc()
            detail, ok = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}", False
        self.rows.append((name, ok, time.perf_counter() - t0, detail))
        print(f"[gpu-check] {name}: {'PASS' if ok else 'FAIL'}", file=sys.stderr, flush=True)
        return ok

    def text(self, total: float) -> str:
        lines = ["meshlayout GPU check", *self.header, ""]
        lines.append("| check | result | s | details |")
        lines.append("|---|---|---:|---|")
        for name, ok, secs, detail in self.rows:
            lines.append(f"| {name} | {'PASS' if ok else 'FAIL'} | {secs:.1f} | {detail} |")
        if self.throughput:
            lines += ["", *self.throughput]
        failed = [name for name, ok, _, _ in self.rows if not ok]
        verdict = (
            f"FAILED: {', '.join(failed)}" if failed else f"all {len(self.rows)} checks passed"
        )
        lines += ["", f"{verdict} in {total:.1f} s"]
        return "\n".join(lines)


class Check:
    """The state the checks share: device, backend, timeout, the trained model."""

    def __init__(self, args: argparse.Namespace, workdir: Path, report: Report) -> None:
        import torch

        self.args = args
        self.workdir = workdir
        self.report = report  # the backend class and the throughput table are added to it
        self.device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
        self.backend = "nccl" if args.device == "cuda" else "gloo"
        self.timeout = timedelta(seconds=args.timeout)
        self.model: Any = None
        self.optimizer: Any = None
        self.mesh: Any = None
        self.sync: Callable[[], None] = (
            torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        )

    # ------------------------------------------------------------------ set-up
    def init(self) -> str:
        import torch
        import torch.distributed as dist

        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=self.timeout)
        dist.init_process_group(
            self.backend,
            store=store,
            rank=0,
            world_size=1,
            timeout=self.timeout,
            device_id=self.device if self.device.type == "cuda" else None,
        )
        return f"init_process_group({self.backend!r}), TCPStore 127.0.0.1:{store.port}"

    # ------------------------------------------------------------------ 1. groups
    def groups(self) -> str:
        import torch
        import torch.distributed as dist

        from meshlayout.torch import _c10d
        from meshlayout.torch._groups import get_group, group_name

        world = get_group([0])
        if world is not dist.group.WORLD:
            raise AssertionError("get_group over the world did not return the default group")
        options = dist.ProcessGroupNCCL.Options() if self.backend == "nccl" else None
        name = group_name((0,), self.backend, "gpu-check")
        pg = _c10d.create_group((0,), self.backend, options, self.timeout, name, "gpu_check")
        if pg.group_name != name or dist.get_process_group_ranks(pg) != [0]:
            raise AssertionError(f"group {pg.group_name} {dist.get_process_group_ranks(pg)}")
        dev, td = self.device, self.timeout
        x = torch.arange(1000, dtype=torch.float32, device=dev)
        out = torch.empty_like(x)
        _c10d.all_gather_single(out, x, pg, td)
        gathered = torch.equal(out, x)
        y = x.clone()
        _c10d.all_reduce(y, dist.ReduceOp.SUM, pg, td)
        reduced = torch.equal(y, x)
        z = x.clone()
        _c10d.broadcast(z, 0, pg, td)
        sent = torch.arange(256, dtype=torch.uint8, device=dev)
        got = torch.zeros_like(sent)
        _c10d.all_to_all_single(got, sent, [256], [256], pg, td)
        if not (gathered and reduced and torch.equal(z, x) and torch.equal(got, sent)):
            raise AssertionError(
                f"collectives: all_gather {gathered}, all_reduce {reduced}, "
                f"broadcast {torch.equal(z, x)}, all_to_all {torch.equal(got, sent)}"
            )
        kind = _c10d.backend_class_name(pg, dev)
        world_kind = _c10d.backend_class_name(world, dev)
        self.report.header.append(
            f"backend: {self.backend} ({world_kind}; meshlayout's group: {kind})"
        )
        return (
            f"world reused; {kind} group {name} created members-only"
            f"{' with ProcessGroupNCCL.Options' if options is not None else ''}; "
            "all_gather, all_reduce, broadcast, all_to_all exact"
        )

    # ------------------------------------------------------------------ 2. mesh
    def device_mesh(self) -> str:
        import torch
        from torch.distributed.tensor import Shard, distribute_tensor

        from meshlayout import Mesh
        from meshlayout.sharding import Shard as MlShard
        from meshlayout.sharding import ShardingSpec
        from meshlayout.torch import full_tensor, init_mesh

        dm = init_mesh(Mesh({"dp": 1, "tp": 1}), self.device.type, timeout=self.args.timeout)
        tdm = dm.to_torch()
        if tdm.mesh_dim_names != ("dp", "tp") or list(tdm.get_coordinate() or ()) != [0, 0]:
            raise AssertionError(f"DeviceMesh {tdm}")
        groups = [tdm.get_group("dp"), tdm.get_group("tp")]
        x = torch.arange(24.0, device=self.device).reshape(4, 6)
        dt = distribute_tensor(x, tdm["tp"], [Shard(1)])
        spec = ShardingSpec((4, 6), dm["tp"].mesh, [MlShard(1)])
        ours = full_tensor(dt.to_local(), dm["tp"], spec)
        if not (torch.equal(dt.full_tensor(), x) and torch.equal(ours, x)):
            raise AssertionError("DTensor round trip differs")
        self.mesh = dm
        return (
            f"init_mesh (dp=1, tp=1) -> DeviceMesh {tuple(tdm.shape)} on {tdm.device_type}, "
            f"{len(groups)} dim groups; DTensor and meshlayout full_tensor exact"
        )

    # ------------------------------------------------------------------ 3. FSDP2 + DCP
    def _model(self, seed: int) -> Any:
        import torch
        from torch import nn
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(seed)
        model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128)).to(self.device)
        dp = self.mesh["dp"].to_torch()
        fully_shard(model[0], mesh=dp)
        fully_shard(model[2], mesh=dp)
        fully_shard(model, mesh=dp)
        return model

    def _step(self) -> None:
        import torch

        g = torch.Generator(device=self.device).manual_seed(7)
        batch = torch.randn(16, 256, device=self.device, generator=g)
        loss = self.model(batch).square().mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()

    def _full(self, model: Any) -> dict[str, Any]:
        return {k: v.full_tensor().detach().clone() for k, v in model.state_dict().items()}

    def fsdp_dcp(self) -> str:
        import torch

        from meshlayout.torch import checkpoint as mlcp

        self.model = self._model(0)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-2)
        self._step()
        ckpt = self.workdir / "ckpt"
        mlcp.save({"model": self.model.state_dict()}, ckpt)
        report = mlcp.describe_checkpoint(ckpt, verify=True)
        if not report["ok"]:
            raise AssertionError(f"describe_checkpoint: {report}")
        fresh = self._model(1)
        before = self._full(fresh)
        sd = {"model": fresh.state_dict()}
        mlcp.load(sd, ckpt)
        want, got = self._full(self.model), self._full(fresh)
        differ = [k for k in want if not torch.equal(want[k], got[k])]
        changed = any(not torch.equal(before[k], got[k]) for k in want)
        x = torch.randn(4, 256, device=self.device)
        with torch.no_grad():
            same_out = torch.equal(self.model(x), fresh(x))
        if differ or not changed or not same_out:
            raise AssertionError(f"loaded parameters differ: {differ}, forward equal {same_out}")
        dtype = next(iter(self.model.parameters())).dtype
        return (
            f"FSDP2 step on {self.device.type}; save: {len(report['tensors'])} tensors exact "
            f"(verified); load into a fresh model: {len(want)} {str(dtype)[6:]} tensors and a "
            "forward pass bitwise equal"
        )

    # ------------------------------------------------------------------ 4. safetensors
    def safetensors(self) -> str:
        import torch
        from safetensors.torch import load_file

        from meshlayout.torch.checkpoint import export_safetensors, load_safetensors

        out = self.workdir / "hf"
        result = export_safetensors(self.workdir / "ckpt", out)
        want = {f"model.{k}": v for k, v in self._full(self.model).items()}
        library = load_file(str(out / "model.safetensors"), device=str(self.device))
        if sorted(library) != sorted(want) or any(
            not torch.equal(library[k], want[k]) for k in want
        ):
            raise AssertionError("the safetensors library reads other tensors than were saved")
        fresh = self._model(2)
        stats = load_safetensors(fresh.state_dict(), out, rename=lambda n: f"model.{n}")
        got = {f"model.{k}": v for k, v in self._full(fresh).items()}
        plain = {k: torch.empty_like(v) for k, v in want.items()}
        load_safetensors(plain, out)
        bad = [
            k for k in want if not (torch.equal(got[k], want[k]) and torch.equal(plain[k], want[k]))
        ]
        if bad or any(t.device != self.device for t in plain.values()):
            raise AssertionError(f"load_safetensors differs for {bad}")
        return (
            f"export: {len(result.tensors)} tensors, {result.total_bytes} bytes; the "
            f"safetensors library reads them onto {self.device.type} bitwise; load_safetensors "
            f"into FSDP2 DTensors ({stats.bytes_read} bytes read) and plain "
            f"{self.device.type} tensors exact"
        )

    # ------------------------------------------------------------------ 5. transfer
    def transfer(self) -> str:
        import torch

        from meshlayout import Mesh
        from meshlayout.sharding import Replicate, ShardingSpec
        from meshlayout.torch import WeightTransfer

        params = dict(self.model.named_parameters())
        serving = Mesh({"tp": 1})
        dst = {
            n: (ShardingSpec(tuple(p.shape), serving, [Replicate()]), torch.bfloat16)
            for n, p in params.items()
        }
        out = {
            n: torch.empty(tuple(p.shape), dtype=torch.bfloat16, device=self.device)
            for n, p in params.items()
        }
        wt = WeightTransfer(params, dst, timeout=self.args.timeout)
        runs = 0
        for _ in range(2):
            wt.run(out=out, verify=True)
            runs += 1
            want = {n: p.full_tensor().detach().to(torch.bfloat16) for n, p in params.items()}
            bad = [n for n in want if not torch.equal(out[n], want[n])]
            if bad:
                raise AssertionError(f"run {runs}: destination differs for {bad}")
            self._step()  # the parameters change in place; the next run moves the new ones
        agree = self._fingerprints_agree_with_cpu()
        return (
            f"{len(params)} FSDP2 parameters -> bf16 {self.device.type} tensors, "
            f"2 runs with verify=True exact; {agree}"
        )

    def _fingerprints_agree_with_cpu(self) -> str:
        import torch

        from meshlayout.torch.transfer._fingerprint import Fingerprinter

        g = torch.Generator().manual_seed(3)
        x = torch.randn(67, 131, generator=g)
        cases = [
            (x, ((0, 67), (0, 131)), torch.bfloat16),  # fp32 hashed as bf16 (a cast)
            (x.bfloat16(), ((0, 67), (0, 131)), torch.bfloat16),
            (x[5:40, 3:100].bfloat16(), ((5, 40), (3, 100)), torch.bfloat16),  # unaligned
            (x[:, 7:], ((0, 67), (7, 131)), torch.float32),
            (x.double()[1:2, :], ((1, 2), (0, 131)), torch.float64),
        ]
        dev, cpu = Fingerprinter(), Fingerprinter()
        for region, box, dtype in cases:
            shape = (67, 131)
            a = dev.box(region.to(self.device), box, shape, dtype)
            b = cpu.box(region, box, shape, dtype)
            if a != b:
                raise AssertionError(f"fingerprint of {box} as {dtype}: device {a}, cpu {b}")
        return f"fingerprints on {self.device.type} = on cpu ({len(cases)} cases)"

    # ------------------------------------------------------------------ 6. pack/unpack
    def _two_rank_plan(self, rows: int, cols: int) -> tuple[Any, ...]:
        import torch

        from meshlayout import Mesh
        from meshlayout.sharding import Shard, ShardingSpec, transfer_plan

        fsdp, tp = Mesh({"dp": 2}), Mesh({"tp": 2})
        shapes = {"a": (rows, cols), "b": (cols, rows)}
        src = {n: ShardingSpec(s, fsdp, [Shard(0)]) for n, s in shapes.items()}
        dst = {n: ShardingSpec(s, tp, [Shard(1)]) for n, s in shapes.items()}
        values = {  # exact in bf16 and distinct along each row: i mod 251 over 256
            n: (torch.arange(math.prod(s), device=self.device) % 251).float().div(256).reshape(s)
            for n, s in shapes.items()
        }
        # rows -> columns: each rank sends half of its pieces (rows * cols bf16 bytes in
        # all), in two rounds
        plan = transfer_plan(src, dst, {n: 2 for n in shapes}, bucket_bytes=rows * cols * 2 // 3)
        return src, dst, values, plan

    def _emulate(
        self, src: Any, dst: Any, values: Any, plan: Any
    ) -> tuple[list[Any], list[dict[str, Any]], list[dict[str, Any]]]:
        """Both ranks' local copies and rounds on this device; returns (schedules, srcs, outs)."""
        import torch

        from meshlayout.sharding import local_slices
        from meshlayout.torch.transfer._execute import pack_round, schedule, unpack_round

        bf16 = {n: torch.bfloat16 for n in values}
        ranks = (0, 1)
        scheds = [schedule(plan, src, dst, r) for r in ranks]
        srcs = [{n: src[n].shard(v, r) for n, v in values.items()} for r in ranks]
        outs = [
            {
                n: torch.full(dst[n].local_shape(r), -1.0, dtype=torch.bfloat16, device=self.device)
                for n in values
            }
            for r in ranks
        ]
        for r in ranks:
            for name, box in plan.local_copies(r):
                d = local_slices(dst[name], r, box)
                outs[r][name][d].copy_(srcs[r][name][local_slices(src[name], r, box)])
        for i in range(len(plan.rounds)):
            sends = []
            for r in ranks:
                rnd = scheds[r][i]
                buf = torch.empty(sum(rnd.send_sizes), dtype=torch.uint8, device=self.device)
                pack_round(rnd, srcs[r], buf, bf16)
                sends.append(buf)
            for r in ranks:
                parts = []
                for j in ranks:  # what rank j sends rank r: its r-th chunk
                    start = sum(scheds[j][i].send_sizes[:r])
                    parts.append(sends[j][start : start + scheds[j][i].send_sizes[r]])
                recv = torch.cat(parts)
                if recv.numel() != sum(scheds[r][i].recv_sizes):
                    raise AssertionError(f"round {i}: rank {r} receives {recv.numel()} bytes")
                unpack_round(scheds[r][i], recv, outs[r])
        return scheds, srcs, outs

    def pack_unpack(self) -> str:
        import torch

        src, dst, values, plan = self._two_rank_plan(96, 40)
        _, _, outs = self._emulate(src, dst, values, plan)
        bad = [
            (n, r)
            for r in (0, 1)
            for n, v in values.items()
            if not torch.equal(outs[r][n], dst[n].shard(v.to(torch.bfloat16), r))
        ]
        if bad:
            raise AssertionError(f"destination pieces differ: {bad}")
        return (
            f"FSDP dp=2 -> TP tp=2, fp32 -> bf16, {len(plan.rounds)} rounds: both ranks' "
            f"pieces exact on {self.device.type}"
        )

    # ------------------------------------------------------------------ 7. throughput
    def _best(self, fn: Callable[[], Any]) -> float:
        fn()
        self.sync()
        best = math.inf
        for _ in range(self.args.repeats):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            best = min(best, time.perf_counter() - t0)
        return best

    def throughput(self) -> str:
        import torch

        from meshlayout.torch.transfer._execute import pack_round, unpack_round
        from meshlayout.torch.transfer._fingerprint import Fingerprinter

        n = self.args.elements
        cols = 1024
        rows = max(1, n // cols)
        shape = (rows, cols)
        g = torch.Generator(device=self.device).manual_seed(5)
        src32 = torch.randn(shape, device=self.device, generator=g)
        piece = src32.to(torch.bfloat16)
        dst = torch.empty_like(piece)
        box = ((0, rows), (0, cols))
        fp = Fingerprinter()
        # pack / unpack: rank 0's rounds of a two-rank FSDP -> TP transfer of two such tensors
        p_src, p_dst, values, plan = self._two_rank_plan(rows, cols)
        scheds, srcs, outs = self._emulate(p_src, p_dst, values, plan)
        bf16 = {k: torch.bfloat16 for k in values}
        rounds = scheds[0]
        sends = [
            torch.empty(sum(r.send_sizes), dtype=torch.uint8, device=self.device) for r in rounds
        ]
        recvs = [
            torch.empty(sum(r.recv_sizes), dtype=torch.uint8, device=self.device) for r in rounds
        ]
        packed = sum(b.numel() for b in sends)
        unpacked = sum(b.numel() for b in recvs)

        def pack() -> None:
            for rnd, buf in zip(rounds, sends):
                pack_round(rnd, srcs[0], buf, bf16)

        def unpack() -> None:
            for rnd, buf in zip(rounds, recvs):
                unpack_round(rnd, buf, outs[0])

        nbytes = piece.numel() * 2
        timings = {
            "device memcpy (copy_ bf16 -> bf16)": (self._best(lambda: dst.copy_(piece)), nbytes),
            "fingerprint, destination side (bf16)": (
                self._best(lambda: fp.box(piece, box, shape, torch.bfloat16)),
                nbytes,
            ),
            "fingerprint, source side (fp32 hashed as bf16)": (
                self._best(lambda: fp.box(src32, box, shape, torch.bfloat16)),
                nbytes,
            ),
            "cast fp32 -> bf16 (torch copy_)": (self._best(lambda: dst.copy_(src32)), nbytes),
            "pack, fp32 -> bf16 (WeightTransfer, rank 0 of dp=2 -> tp=2)": (
                self._best(pack),
                packed,
            ),
            "unpack, bf16 (WeightTransfer, rank 0)": (self._best(unpack), unpacked),
        }
        memcpy, memcpy_bytes = timings["device memcpy (copy_ bf16 -> bf16)"]
        floor = memcpy / memcpy_bytes  # seconds per byte of a memcpy
        mib = nbytes / 2**20
        lines = [
            f"Throughput on {self.device.type}: a {rows} x {cols} fp32 tensor and its bf16 "
            f"copy ({mib:.2f} MiB in bf16); best of {self.args.repeats}, the device "
            "synchronised around each run. x memcpy: the time over that of a device memcpy "
            "of the same number of bytes (written in the destination dtype), measured in "
            "this run.",
            "",
            "| operation | bytes | ms | GB/s | x memcpy |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, (secs, size) in timings.items():
            lines.append(
                f"| {name} | {size} | {secs * 1e3:.3f} | {size / secs / 1e9:.1f} | "
                f"{secs / (size * floor):.2f} |"
            )
        self.report.throughput = lines
        worst = max(s / (b * floor) for s, b in timings.values())
        return f"{len(timings) - 1} operations timed against a device memcpy (worst {worst:.1f}x)"


def _environment(check: Check) -> list[str]:
    import torch

    import meshlayout

    lines = [
        f"torch {torch.__version__} (CUDA {torch.version.cuda}), Python "
        f"{platform.python_version()}, meshlayout from {Path(meshlayout.__file__).parent}",
    ]
    if check.device.type == "cuda":
        props = torch.cuda.get_device_properties(check.device)
        try:
            nccl = ".".join(str(v) for v in torch.cuda.nccl.version())
        except Exception as exc:  # reported, not fatal
            nccl = f"unknown ({type(exc).__name__})"
        lines.append(
            f"device: {props.name} (capability {props.major}.{props.minor}, "
            f"{props.total_memory / 2**30:.0f} GiB), {torch.cuda.device_count()} visible; "
            f"NCCL {nccl}"
        )
        env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_"))}
        lines.append(
            "environment: "
            + (", ".join(f"{k}={v}" for k, v in env.items()) or "(no NCCL_/TORCH_ variables)")
        )
    else:
        lines.append(f"device: cpu ({os.cpu_count()} cores), backend gloo")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument(
        "--elements",
        type=int,
        default=None,
        help="elements of the throughput tensor (default 2^26 on cuda, 2^22 on cpu)",
    )
    parser.add_argument("--small", action="store_true", help="2^16 elements, 2 repeats (tests)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per wait")
    parser.add_argument("--time-limit", type=float, default=280.0, help="seconds for the run")
    args = parser.parse_args(argv)
    if args.small:
        args.elements, args.repeats = args.elements or 2**16, 2
    if args.elements is None:
        args.elements = 2**26 if args.device == "cuda" else 2**22
    faulthandler.dump_traceback_later(args.time_limit, exit=True)
    start = time.perf_counter()

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; run with --device cpu", file=sys.stderr)
        return 2
    if args.device == "cuda":
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # world size 1: loopback only
    with tempfile.TemporaryDirectory(prefix="meshlayout-gpu-check-") as tmp:
        report = Report()
        check = Check(args, Path(tmp), report)
        report.header.extend(_environment(check))
        if report.run("init", check.init):
            report.run("groups", check.groups)
            if report.run("mesh", check.device_mesh):
                if report.run("fsdp2+dcp", check.fsdp_dcp):
                    report.run("safetensors", check.safetensors)
                    report.run("transfer", check.transfer)
            report.run("pack/unpack", check.pack_unpack)
            report.run("throughput", check.throughput)
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    print(report.text(time.perf_counter() - start), flush=True)
    faulthandler.cancel_dump_traceback_later()
    return 0 if all(ok for _, ok, _, _ in report.rows) else 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: backend threads can abort it after a verdict
