"""Run torchtitan 0.3.0's own ``Trainer`` on CPU gloo processes (test harness only).

torchtitan has no CPU switch: it picks CUDA when no accelerator is found, trains with
FlexAttention (compiled by inductor), reads its C4 test set and tokenizer from the
``tests/assets`` folder of its repository (not shipped in the wheel), and imports
triton for MoE kernels; torchtitan 0.3.0 also calls two things torch 2.13 lacks.
Everything below adapts the *test environment* (meshlayout's code is never touched;
torchtitan's only where CPU, gloo or torch 2.13 lack what it calls), and nothing
downloads:

* ``install_cpu_shims()`` (call first in a fresh worker, before any torchtitan import):

  - device: ``torchtitan.tools.utils.device_type`` becomes ``"cpu"`` and its
    ``device_module`` a small CPU stand-in (``_CpuDevice``: device count 1, no-op
    synchronise, a memory monitor reporting zeros), set before the other torchtitan
    modules bind them (``from torchtitan.tools.utils import device_type``). So the
    meshes are CPU meshes and torchtitan's own ``init_distributed`` picks gloo;
  - triton: torchtitan imports its MinimalAsyncEP (MoE all-to-all) triton kernels at
    import time. They are never called by the dense llama3 model, so their module
    ``torchtitan.distributed.minimal_async_ep.kernels`` is replaced by a stub whose
    functions raise. No fake ``triton`` module is installed (torch would then think
    triton is available);
  - gloo has no ``PREMUL_SUM``: torchtitan sets FSDP's gradient divide factor to 1
    (it normalises by the global token count itself), which FSDP2 turns into a
    ``PREMUL_SUM(1.0)`` reduce-scatter. After torchtitan's
    ``disable_fsdp_gradient_division`` the harness also calls FSDP2's public
    ``set_force_sum_reduction_for_comms(True)``: a ``SUM`` reduce-scatter followed by
    a multiplication by 1.0, the same values;
  - torch 2.13 has no ``torch.distributed.set_timeout``, which torchtitan's
    ``set_pg_timeouts`` calls after the first step to shorten every group's
    timeout: there the harness keeps the timeouts (``comm.init_timeout_seconds``)
    and only keeps its barrier;
  - ``HF_HUB_OFFLINE`` / ``HF_DATASETS_OFFLINE`` and a per-run HF cache directory.

* ``run_job`` empties torch's DTensor sharding-propagation caches before it builds
  a trainer (``_fresh_dtensor_caches``), so several trainers can run one after the
  other in one process (a real job has one). Those caches (a Python LRU cache and
  a C++ fast-path cache; emptying the Python one alone does not help) key on
  ``DTensorSpec``, whose mesh compares by value, so in the second trainer's FSDP2
  set-up the parameter made by ``DTensor.from_local(..., mesh)`` and wrapped in
  ``nn.Parameter`` comes back holding the *first* trainer's equal ``DeviceMesh``
  object (``from_local`` itself builds it on ``mesh``). Under ``spmd_types`` on torch 2.14, FSDP2 then refuses
  the parameter ("Expected param's DTensor mesh to be the same mesh passed to
  fully_shard, but got different mesh objects"), with torchtitan's own
  ``ParallelDims`` twice in a row as with the drop-in. The function used,
  ``torch.distributed.tensor.debug._clear_sharding_prop_cache``, is torch's
  (private, test-only here).

* ``write_assets(dir, ...)``: the test tokenizer (a word-level ``tokenizers`` model:
  ``<|begin_of_text|>``, ``<|end_of_text|>`` and words ``w0 .. wN``) and a JSON-lines
  text data set that ``datasets`` loads offline as torchtitan's ``c4_test``.
  Every document has exactly ``seq_len + 1`` tokens (with BOS/EOS), so each sample
  torchtitan packs is one whole document and all documents are the same text:
  every rank sees the same sample at every step, whatever the data-parallel degree,
  and a run resumed with the data loader's state excluded (as torchtitan requires
  when the data-parallel degree changes) sees the data an uninterrupted run sees.
* ``titan_config(...)``: torchtitan's ``llama3_debugmodel()`` job config, with
  its model rebuilt smaller through torchtitan's own llama3 builders (``dim``,
  ``n_layers``, ``vocab``), attention switched from FlexAttention to torchtitan's
  ``ScaledDotProductAttention`` (causal: equal to block-causal here because a sample
  is one document, and needs no inductor compile), CUDA graphs off, float32 mixed
  precision, a fixed seed, and the parallel degrees asked for. The SPMD backend is
  ``partial_dtensor`` by default (torchtitan's DTensor TP + FSDP2 on the ``fsdp``
  mesh, i.e. FSDP2 over TP as torch's own tests use it): 0.3.0's default
  ``spmd_types`` keeps parameters as plain local tensors annotated with
  ``spmd_types`` and passes ``dp_mesh_dims`` to ``fully_shard``, whose torch 2.13
  version refuses them ("all parameters must be DTensors on the full SPMD mesh");
  torch 2.14's ``fully_shard`` turns the annotations into DTensors and trains it
  (``Run(spmd_backend="spmd_types")``, ``spmd_types_job``).
* ``HarnessTrainer``: torchtitan's ``Trainer`` with the ``ParallelDims`` class to
  build (torchtitan's or meshlayout's drop-in) and the per-step global losses
  recorded from its metrics processor.

Workers run through ``tests/multiproc.py`` (``init=False``: torchtitan's own
``init_distributed`` joins the group through ``env://``), every wait bounded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
from pathlib import Path
from typing import Any

#: torchtitan modules that bind ``device_type`` / ``device_module`` at import time.
_BINDERS = (
    "torchtitan.distributed.utils",
    "torchtitan.distributed.parallel_dims",
    "torchtitan.components.metrics",
    "torchtitan.trainer",
)
_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"
_KERNEL_NAMES = (
    "copy_full_counts_to_peers_kernel",
    "copy_rows_to_peers_kernel",
    "expand_topk_grad_kernel",
    "fill_combine_metadata_kernel",
    "fill_dispatch_metadata_kernel",
    "invert_flat_indices_kernel",
    "reduce_topk_slots_kernel",
    "topk_scores_grad_kernel",
)

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


class _CpuDevice:
    """The ``device_module`` torchtitan calls (``torch.cuda``'s surface it uses), on CPU."""

    @staticmethod
    def set_device(device: Any) -> None:
        pass

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "cpu"

    @staticmethod
    def get_device_properties(device: Any = None) -> Any:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return types.SimpleNamespace(name="cpu", total_memory=total)

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        pass

    @staticmethod
    def empty_cache() -> None:
        pass

    @staticmethod
    def memory_stats(device: Any = None) -> dict[str, int]:
        return {}


def _kernel_stub(name: str) -> Any:
    def stub(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name}: triton kernel stubbed out by tests/titan_harness.py")

    return stub


def install_cpu_shims(hf_cache: str | os.PathLike[str]) -> None:
    """Make torchtitan importable and runnable on CPU in this (fresh) process."""
    bound = [m for m in _BINDERS if m in sys.modules]
    if bound:
        raise RuntimeError(f"install_cpu_shims must run before importing {bound}")
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HOME"] = str(hf_cache)
    os.environ["HF_DATASETS_CACHE"] = os.path.join(str(hf_cache), "datasets")
    kernels = types.ModuleType(_KERNELS, "triton kernels stubbed out (tests/titan_harness.py)")
    for name in _KERNEL_NAMES:
        setattr(kernels, name, _kernel_stub(name))
    sys.modules.setdefault(_KERNELS, kernels)

    import torchtitan.tools.utils as tt_utils

    tt_utils.device_type = "cpu"
    tt_utils.device_module = _CpuDevice

    import torchtitan.distributed.fsdp as tt_fsdp
    from torch.distributed.fsdp import FSDPModule

    no_division = tt_fsdp.disable_fsdp_gradient_division

    def no_division_summed(model: Any) -> None:
        no_division(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    tt_fsdp.disable_fsdp_gradient_division = no_division_summed

    import torch.distributed as dist
    import torchtitan.distributed.utils as tt_dist_utils

    if not hasattr(dist, "set_timeout"):

        def keep_timeouts(timeout: Any, parallel_dims: Any) -> None:
            dist.barrier()

        tt_dist_utils.set_pg_timeouts = keep_timeouts


# ---------------------------------------------------------------------- assets
def write_assets(root: str | os.PathLike[str], *, seq_len: int, words: int, docs: int) -> Path:
    """Tokenizer files and a data set under ``root``; returns ``root``.

    The tokenizer has ``words + 2`` ids (``BOS`` 0, ``EOS`` 1, ``w<i>`` at ``i + 2``).
    Each of the ``docs`` documents is the same ``seq_len - 1`` words, so with BOS and
    EOS it has ``seq_len + 1`` tokens: one packed sample.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    root = Path(root)
    tok_dir, data_dir = root / "tokenizer", root / "data"
    tok_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    vocab = {BOS: 0, EOS: 1, **{f"w{i}": i + 2 for i in range(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(tok_dir / "tokenizer.json"))
    (tok_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "add_bos_token": False})
    )
    # A fixed pseudo-random text (LCG), the same for every document.
    state, text = 12345, []
    for _ in range(seq_len - 1):
        state = (state * 1103515245 + 12345) % 2**31
        text.append(f"w{state % words}")
    line = json.dumps({"text": " ".join(text)})
    (data_dir / "train.jsonl").write_text("\n".join([line] * docs) + "\n")
    return root


# ---------------------------------------------------------------------- config
@dataclasses.dataclass(frozen=True)
class Run:
    """One training job: parallel degrees, model size, steps and checkpointing."""

    dp_shard: int
    tp: int
    steps: int = 4
    dim: int = 64
    n_heads: int = 4
    n_layers: int = 2
    vocab: int = 256
    seq_len: int = 32
    local_batch: int = 2
    global_batch: int = -1  # torchtitan's default: local_batch x data-parallel degree
    seed: int = 0
    checkpoint_folder: str | None = None  # absolute; None: checkpointing off
    interval: int = 2
    load_step: int = -1
    load_only: bool = False  # resume without writing checkpoints
    exclude_dataloader: bool = False
    async_mode: str = "disabled"  # CheckpointManager.Config.async_mode
    exact: bool = False  # ExactCheckpointManager instead of torchtitan's
    spmd_backend: str = "partial_dtensor"


def titan_config(run: Run, assets: Path, dump_folder: Path) -> Any:
    """torchtitan's llama3 debug job config, made small and CPU-ready (see module doc)."""
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import ParallelismConfig
    from torchtitan.models.common import Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import decoder_vocab_size
    from torchtitan.models.common.rope import ComplexRoPE
    from torchtitan.models.llama3 import _build_llama3_layers, model_registry
    from torchtitan.models.llama3.config_registry import llama3_debugmodel
    from torchtitan.models.llama3.model import Llama3Model

    config = llama3_debugmodel()
    spec = model_registry("debugmodel")
    debug = spec.model
    dim, vocab = run.dim, run.vocab
    layers = _build_llama3_layers(
        n_layers=run.n_layers,
        dim=dim,
        n_heads=run.n_heads,
        hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=32),
        rope=ComplexRoPE.Config(
            dim=dim // run.n_heads, max_seq_len=4 * run.seq_len, theta=500000, scaling="llama"
        ),
        attn_backend="flex",
    )
    spec.model = Llama3Model.Config(
        dim=dim,
        vocab_size=vocab,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab,
            embedding_dim=dim,
            param_init=debug.tok_embeddings.param_init,
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=debug.norm.param_init),
        lm_head=Linear.Config(
            in_features=dim, out_features=vocab, param_init=debug.lm_head.param_init
        ),
        layers=layers,
    )
    sdpa = ScaledDotProductAttention.Config()
    flex = type(layers[0].attention.inner_attention)
    for _, _, parent, attr in spec.model.traverse(flex):
        setattr(parent, attr, sdpa)  # FlexAttention -> SDPA (see module doc)
    config.model_spec = spec
    config.loss.loss_fn.global_vocab_size = decoder_vocab_size(spec)
    config.hf_assets_path = str(assets / "tokenizer")
    config.dataloader.dataset = "c4_test"
    config.dataloader.dataset_path = str(assets / "data")
    config.dump_folder = str(dump_folder)
    config.training.seq_len = run.seq_len
    config.training.local_batch_size = run.local_batch
    config.training.global_batch_size = run.global_batch
    config.training.steps = run.steps
    config.training.disable_cuda_graphs = True
    config.training.mixed_precision_param = "float32"
    config.training.gc_freq = 1000
    config.lr_scheduler.warmup_steps = 1
    config.validator.enable = False
    config.metrics.log_freq = 1
    config.debug.seed = run.seed
    config.comm.init_timeout_seconds = 180
    config.comm.train_timeout_seconds = 180
    config.parallelism = ParallelismConfig(
        data_parallel_shard_degree=run.dp_shard,
        tensor_parallel_degree=run.tp,
        spmd_backend=run.spmd_backend,
    )
    enable = run.checkpoint_folder is not None
    config.checkpoint = CheckpointManager.Config(
        enable=enable,
        folder=run.checkpoint_folder or "checkpoint",
        interval=run.interval,
        load_step=run.load_step,
        load_only=run.load_only,
        async_mode=run.async_mode,
        last_save_model_only=False,
        exclude_from_loading=["dataloader"] if run.exclude_dataloader else [],
    )
    if run.exact:  # the one line that switches a job to exact checkpoints
        from meshlayout.torch.torchtitan import exact_checkpoint_config

        config.checkpoint = exact_checkpoint_config(config.checkpoint)
    return config


def make_trainer(config: Any, parallel_dims_cls: Any = None) -> Any:
    """torchtitan's ``Trainer`` (a subclass choosing the ParallelDims class), losses kept.

    ``trainer.losses`` maps step -> torchtitan's global average loss of that step.
    """
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.trainer import Trainer

    class HarnessTrainer(Trainer):
        def init_distributed(self) -> Any:
            if parallel_dims_cls is None:
                return super().init_distributed()
            world = dist_utils.init_distributed(self.config.comm)
            return parallel_dims_cls.from_config(self.config.parallelism, world)

    trainer = HarnessTrainer(config)
    trainer.losses = {}
    log = trainer.metrics_processor.log

    def record(step: int, loss: float, *args: Any, **kwargs: Any) -> Any:
        trainer.losses[step] = float(loss)
        return log(step, loss, *args, **kwargs)

    trainer.metrics_processor.log = record
    return trainer


@dataclasses.dataclass
class Outcome:
    """What one training job did: its losses by step, or the error it stopped with."""

    losses: dict[int, float]
    parallel_dims: str = ""  # the ParallelDims class the trainer used (module.name)
    checkpointer: str = ""  # the checkpoint manager class the trainer used
    error: str | None = None  # "ExceptionType: message" when training raised
    stock_save_error: str | None = None  # the tee'd stock save's error, if it raised
    param_mesh: tuple[str, ...] = ()  # dim names of the first parameter's DTensor mesh


def _stock_tee(trainer: Any, folder: str, dump: Path, outcome: Outcome) -> None:
    """Also save every checkpoint ``trainer`` saves with torchtitan's own manager.

    The same states (model, optimizers, LR schedulers, data loader, train state),
    saved by torchtitan's ``CheckpointManager`` into ``folder`` right after the
    trainer's own save, so both checkpoints hold one training state.
    """
    from torchtitan.components.checkpoint import CheckpointManager

    cfg = trainer.config.checkpoint
    stock = CheckpointManager.Config(
        enable=True, folder=folder, interval=cfg.interval, last_save_model_only=False
    ).build(
        dataloader=trainer.dataloader,
        model_parts=trainer.model_parts,
        optimizers=trainer.optimizers,
        lr_schedulers=trainer.lr_schedulers,
        states={"train_state": trainer},
        sd_adapter=None,
        base_folder=str(dump),
    )
    save = trainer.checkpointer.save

    def both(curr_step: int, last_step: bool = False) -> Any:
        saved = save(curr_step, last_step=last_step)
        if outcome.stock_save_error is None:
            try:
                stock.save(curr_step, last_step=last_step)
            except BaseException as exc:  # DCP raises CheckpointException (BaseException)
                outcome.stock_save_error = _describe(exc)
        return saved

    trainer.checkpointer.save = both


def _describe(exc: BaseException, limit: int = 600) -> str:
    """``Type: message`` (DCP's CheckpointException: the ranks and the first rank's error)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        inner = first[0] if isinstance(first, tuple) else first
        text = f"{type(exc).__name__} on ranks {sorted(failures)}: {type(inner).__name__}: {inner}"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return text[:limit]


def run_job(
    run: Run, root: Path, parallel_dims_cls: Any = None, stock_tee: str | None = None
) -> Outcome:
    """Build torchtitan's trainer for ``run``, train, close; never raises on a training error.

    Errors DCP raises are collective (every rank raises), so catching them keeps the
    ranks in step. ``stock_tee``: a folder where torchtitan's own ``CheckpointManager``
    saves the same states next to the trainer's checkpoints.
    """
    outcome = Outcome(losses={})
    dump = root / "dump"
    _fresh_dtensor_caches()
    trainer = make_trainer(titan_config(run, root / "assets", dump), parallel_dims_cls)
    if stock_tee is not None:
        _stock_tee(trainer, stock_tee, dump, outcome)
    try:
        trainer.train()
    except BaseException as exc:
        outcome.error = _describe(exc)
    finally:
        trainer.close()
    outcome.losses = dict(trainer.losses)
    outcome.parallel_dims = _qualname(type(trainer.parallel_dims))
    outcome.checkpointer = _qualname(type(trainer.checkpointer))
    outcome.param_mesh = _param_mesh(trainer)
    return outcome


def _fresh_dtensor_caches() -> None:
    """Empty torch's DTensor sharding-propagation caches (see module doc)."""
    from torch.distributed.tensor import debug

    clear = getattr(debug, "_clear_sharding_prop_cache", None)
    if clear is not None:
        clear()


def _param_mesh(trainer: Any) -> tuple[str, ...]:
    """Mesh dim names of the model's first parameter as FSDP2 stores it (a DTensor)."""
    param = next(trainer.model_parts[0].parameters())
    mesh = getattr(param, "device_mesh", None)
    return tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()


def _qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _worker_setup(rank: int, root: Path) -> Any:
    os.environ["LOCAL_RANK"] = str(rank)
    install_cpu_shims(root / f"hf-cache-{rank}")
    from meshlayout.torch.torchtitan import ParallelDims

    return ParallelDims


def four_process_job(rank: int, world: int, root: str) -> dict[str, Outcome]:
    """FSDP 2 x TP 2: stock vs drop-in ParallelDims, then resume at FSDP 4 (4 processes).

    ``stock``: torchtitan's ParallelDims, exact checkpoints at step 2 saved with
    ``async_mode="async"`` (and torchtitan's own manager saving the same state next to
    them, synchronously); ``drop_in``: the same job with
    meshlayout's ParallelDims; ``resumed_exact`` / ``resumed_stock``: FSDP 4 (local
    batch 1, so the same global batch) resumed from step 2 of each checkpoint with
    the data loader's state excluded.
    """
    drop_in = _worker_setup(rank, Path(root))
    base = Run(dp_shard=2, tp=2, vocab=256)
    exact, stock = f"{root}/ckpt-exact", f"{root}/ckpt-stock"
    out = {
        "stock": run_job(
            dataclasses.replace(base, checkpoint_folder=exact, exact=True, async_mode="async"),
            Path(root),
            stock_tee=stock,
        ),
        "drop_in": run_job(base, Path(root), drop_in),
    }
    resume = dataclasses.replace(
        base, dp_shard=4, tp=1, local_batch=1, load_step=2, load_only=True,
        exclude_dataloader=True,
    )  # fmt: skip
    out["resumed_exact"] = run_job(
        dataclasses.replace(resume, checkpoint_folder=exact, exact=True), Path(root), drop_in
    )
    out["resumed_stock"] = run_job(
        dataclasses.replace(resume, checkpoint_folder=stock), Path(root), drop_in
    )
    return out


def six_process_job(rank: int, world: int, root: str, vocab: int) -> dict[str, Outcome]:
    """FSDP 3 x TP 2 with an uneven vocabulary (6 processes, the drop-in ParallelDims).

    ``uninterrupted``: 4 steps, exact checkpoints at step 2 and torchtitan's own
    manager saving the same state; ``resumed_exact`` / ``resumed_stock``: the same
    layout resumed from step 2 of each checkpoint; ``stock_loads_exact_ckpt``: the
    same layout, torchtitan's own manager resuming from the (complete, standard DCP)
    exact checkpoint; ``resumed_exact_fsdp6``: FSDP 6
    (local batch 1) resumed from the exact checkpoint, data loader state excluded.
    """
    drop_in = _worker_setup(rank, Path(root))
    base = Run(dp_shard=3, tp=2, vocab=vocab)
    exact, stock = f"{root}/ckpt-exact", f"{root}/ckpt-stock"
    out = {
        "uninterrupted": run_job(
            dataclasses.replace(base, checkpoint_folder=exact, exact=True),
            Path(root),
            drop_in,
            stock_tee=stock,
        )
    }
    resume = dataclasses.replace(base, load_step=2, load_only=True)
    out["resumed_exact"] = run_job(
        dataclasses.replace(resume, checkpoint_folder=exact, exact=True), Path(root), drop_in
    )
    out["resumed_stock"] = run_job(
        dataclasses.replace(resume, checkpoint_folder=stock), Path(root), drop_in
    )
    out["stock_loads_exact_ckpt"] = run_job(
        dataclasses.replace(resume, checkpoint_folder=exact), Path(root), drop_in
    )
    out["resumed_exact_fsdp6"] = run_job(
            dataclasses.replace(
                resume, dp_shard=6, tp=1, local_batch=1, checkpoint_folder=exact, exact=True,
                exclude_dataloader=True,
            ),
            Path(root),
            drop_in,
        )  # fmt: skip
    return out


def spmd_types_job(rank: int, world: int, root: str, steps: int) -> dict[str, Outcome]:
    """FSDP 2 x TP 2 under torchtitan 0.3.0's default ``spmd_types`` backend (4 processes).

    ``stock``: torchtitan's ParallelDims; ``drop_in``: meshlayout's. Needs a torch
    whose ``fully_shard`` takes ``spmd_types`` parameters (2.14).
    """
    drop_in = _worker_setup(rank, Path(root))
    base = Run(dp_shard=2, tp=2, vocab=256, steps=steps, spmd_backend="spmd_types")
    return {
        "stock": run_job(base, Path(root)),
        "drop_in": run_job(base, Path(root), drop_in),
    }
