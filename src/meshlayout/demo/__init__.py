"""``meshlayout demo``: train a small model with TP + FSDP2 on local gloo processes (layer 4).

The demo is the end-to-end check a user runs first:

1. plan the meshes with :class:`~meshlayout.parallel_dims.ParallelDims` and print them;
2. start ``nproc`` CPU processes (gloo on 127.0.0.1), each a fresh Python
   interpreter (never ``fork``: the caller may already have used torch's thread
   pools, stores or process groups, and a forked child of such a process can
   hang; and not multiprocessing's ``spawn`` either, which re-runs the caller's
   main script), bind the meshes to real process groups with ``meshlayout.torch.build(pd, "cpu")`` and hand them to torch's
   tensor parallelism (``ColwiseParallel``/``RowwiseParallel``) and FSDP2
   (``fully_shard``) through ``DistributedMesh.to_torch()``;
3. train a 10 -> 6 -> 10 MLP (uneven FSDP-over-TP shards) for ``steps`` steps,
   printing the loss of every step;
4. check that the losses match a single-process run of the same model on the
   same data, and that :func:`meshlayout.torch.full_tensor` of every parameter
   (one all-gather, reassembled from our sharding spec) equals both torch's
   ``DTensor.full_tensor()`` and the single-process parameters. With ``tp=1``
   (odd ``nproc``) the parameters are sharded by FSDP alone, over the 1-D
   ``fsdp`` mesh, unevenly when ``nproc`` does not divide their rows;
5. save a checkpoint of the trained model with our exact DCP planners and with plain
   DCP, reload it into another configuration and into plain tensors, and compare
   plain DCP with ours on a layer torch 2.13 gets wrong (:mod:`.checkpoint`).

It returns 0 if every check passes, 1 otherwise. torch is imported lazily so
that ``meshlayout --help`` stays fast and torch-free. The same training body
(:func:`.worker.worker`) runs under torchrun, on one host or several, as
``python -m meshlayout.demo.train`` (:mod:`.train`).

The package: :mod:`.config` (what runs: :class:`DemoConfig`, the plan), :mod:`.model`
(the model, its data, the single-process reference), :mod:`.worker` (one process's
body), :mod:`.parent` (:func:`run_demo`: start the workers, collect, check),
:mod:`.checks` (the PASS/FAIL lines), :mod:`.train` (the torchrun entry),
:mod:`.checkpoint` and :mod:`.checkpoint_report` (the checkpoint phase).
"""

from __future__ import annotations

from .config import DemoConfig, demo_parallel_dims
from .parent import run_demo

__all__ = ["DemoConfig", "demo_parallel_dims", "run_demo"]
