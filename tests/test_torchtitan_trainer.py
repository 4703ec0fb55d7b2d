"""torchtitan 0.3.0's own ``Trainer`` on CPU gloo processes: drop-in ParallelDims and exact
checkpoints (docs/torchtitan.md, issue 20 items 4 and 5).

Two process launches (``tests/titan_harness.py`` documents the CPU shims, the tiny
llama3 debug model, the generated data set and tokenizer), under torchtitan's
``partial_dtensor`` SPMD backend, plus a third on torch >= 2.14 under its default
``spmd_types`` backend:

* 4 processes, FSDP 2 x TP 2: the job trained with torchtitan's ``ParallelDims`` and
  with ``meshlayout.torch.torchtitan.ParallelDims`` has the same loss at every step
  (bitwise); saved at step 2 by ``ExactCheckpointManager`` (and, next to it, by
  torchtitan's own ``CheckpointManager``) and resumed at FSDP 4 with the data
  loader's state excluded, steps 3 and 4 have the uninterrupted run's losses.
* 6 processes, FSDP 3 x TP 2 with vocabulary 259 (TP halves of 130 and 129 rows,
  FSDP thirds of 44/44/42 and 43/43/43: the embedding, the output projection and
  their Adam moments are uneven FSDP-over-TP DTensors): torchtitan's own
  ``CheckpointManager`` cannot save the state (torch 2.13's DCP planner describes
  two ranks' rows as overlapping), so the job cannot resume from it, nor can it
  load the exact manager's (complete, standard DCP) checkpoint into this layout
  (it reads a row past one rank's piece); the exact manager saves the state and the
  job resumes with the uninterrupted losses, on the same layout and on FSDP 6.

* 4 processes, FSDP 2 x TP 2 under ``spmd_types`` (torch >= 2.14, whose
  ``fully_shard`` takes ``spmd_types`` parameters; torch 2.13's refuses them):
  torchtitan's ``ParallelDims`` and the drop-in have the same loss at every step.

The uninterrupted run is the reference: a resumed run that loaded anything but the
saved model, optimizer, LR-scheduler and step state would leave its losses.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from torch_versions import (
    DCP_NAMES_OVERLAP,
    DCP_OVERLAP,
    TORCH,
    TORCHTITAN_MISSING,
    TORCHTITAN_USABLE,
)

pytest.importorskip("torch")
if not TORCHTITAN_USABLE:
    pytest.skip(TORCHTITAN_MISSING, allow_module_level=True)

import titan_harness
from multiproc import run_multiproc

pytestmark = [pytest.mark.torch]

SEQ_LEN = 32
#: vocab = 1 (mod 6): torch 2.13's DCP misreads FSDP 3 x TP 2 (see module docstring).
UNEVEN_VOCAB = 259
STOCK_PD = "torchtitan.distributed.parallel_dims.ParallelDims"
DROP_IN_PD = "meshlayout.torch.torchtitan._parallel_dims.ParallelDims"
EXACT = "meshlayout.torch.torchtitan._checkpoint.ExactCheckpointManager"
STOCK_CM = "torchtitan.components.checkpointer.dcp.CheckpointManager"
#: The first torch whose FSDP2 ``fully_shard`` takes torchtitan's ``spmd_types`` parameters.
SPMD_TYPES_TORCH = (2, 14)
needs_spmd_types_fsdp = pytest.mark.skipif(
    TORCH is None or TORCH < SPMD_TYPES_TORCH,
    reason=(
        "torchtitan's spmd_types backend needs torch >= 2.14 (the fully_shard of torch "
        f"{'.'.join(map(str, TORCH or ()))} refuses its parameters: 'all parameters must be "
        "DTensors on the full SPMD mesh'); run `make test-torch TORCH=2.14.1` or newer"
    ),
)


def _assets(tmp_path: Path) -> str:
    titan_harness.write_assets(tmp_path / "assets", seq_len=SEQ_LEN, words=200, docs=64)
    return str(tmp_path)


def _rank_zero(results: list[dict[str, titan_harness.Outcome]]) -> dict[str, titan_harness.Outcome]:
    # Losses are global (torchtitan reduces them over the data-parallel ranks), so
    # every rank reports the same outcome.
    assert all(r == results[0] for r in results[1:]), results
    return results[0]


def _print_table(title: str, out: dict[str, titan_harness.Outcome]) -> None:
    """The losses by step as a markdown table (shown by ``pytest -s``; docs/torchtitan.md)."""
    steps = sorted({s for o in out.values() for s in o.losses})
    print(f"\n{title}\n\n| run | " + " | ".join(f"step {s}" for s in steps) + " |")
    print("|---|" + "---|" * len(steps))
    for name, o in out.items():
        cells = [f"{o.losses[s]:.7f}" if s in o.losses else "" for s in steps]
        note = "" if o.error is None else f" ({o.error.split(':')[0]})"
        print(f"| {name}{note} | " + " | ".join(cells) + " |")


def _trained(outcome: titan_harness.Outcome, steps: list[int]) -> None:
    assert outcome.error is None, outcome.error
    assert sorted(outcome.losses) == steps
    assert all(math.isfinite(v) for v in outcome.losses.values())


@pytest.mark.multiprocess
@pytest.mark.xdist_group("torchtitan_trainer")  # one 4- or 6-process job at a time
@pytest.mark.timeout(960)
def test_trainer_drop_in_and_resume_at_fsdp4(tmp_path: Path) -> None:
    root = _assets(tmp_path)
    out = _rank_zero(
        run_multiproc(
            titan_harness.four_process_job, 4, root, timeout=600, startup_timeout=300, init=False
        )
    )
    _print_table("FSDP 2 x TP 2 (4 processes), resumed at FSDP 4", out)
    stock, drop_in = out["stock"], out["drop_in"]
    _trained(stock, [1, 2, 3, 4])
    _trained(drop_in, [1, 2, 3, 4])
    assert (stock.parallel_dims, drop_in.parallel_dims) == (STOCK_PD, DROP_IN_PD)
    assert stock.checkpointer == EXACT
    # it trains: the loss falls every step
    assert all(stock.losses[s + 1] < stock.losses[s] for s in (1, 2, 3)), stock.losses
    # the drop-in's meshes have the same groups in the same order: the same numbers
    assert drop_in.losses == stock.losses

    # resumed at FSDP 4 from step 2: the uninterrupted run's losses
    resumed = out["resumed_exact"]
    _trained(resumed, [3, 4])
    assert resumed.parallel_dims == DROP_IN_PD and resumed.checkpointer == EXACT
    for step in (3, 4):
        assert resumed.losses[step] == pytest.approx(stock.losses[step], rel=1e-6, abs=0)
    # at dp = 2 torch reads FSDP-over-TP right: torchtitan's own checkpoint saves
    # and resumes too (the control for the uneven case below)
    assert stock.stock_save_error is None
    control = out["resumed_stock"]
    _trained(control, [3, 4])
    assert control.checkpointer == STOCK_CM
    for step in (3, 4):
        assert control.losses[step] == pytest.approx(stock.losses[step], rel=1e-6, abs=0)


@pytest.mark.multiprocess
@pytest.mark.xdist_group("torchtitan_trainer")  # one 4- or 6-process job at a time
@pytest.mark.timeout(960)
def test_uneven_fsdp3_tp2_stock_fails_exact_resumes(tmp_path: Path) -> None:
    root = _assets(tmp_path)
    out = _rank_zero(
        run_multiproc(
            titan_harness.six_process_job,
            6,
            root,
            UNEVEN_VOCAB,
            timeout=600,
            startup_timeout=300,
            init=False,
        )
    )
    _print_table(f"FSDP 3 x TP 2 (6 processes), vocab {UNEVEN_VOCAB}", out)
    full = out["uninterrupted"]
    _trained(full, [1, 2, 3, 4])
    assert full.checkpointer == EXACT and full.parallel_dims == DROP_IN_PD

    # torchtitan's CheckpointManager, same state, same step: DCP's own validation
    # refuses the plan (torch 2.13; a torch that fixes it fails this line)
    assert full.stock_save_error is not None
    assert DCP_OVERLAP in full.stock_save_error, full.stock_save_error
    if DCP_NAMES_OVERLAP:
        assert "tok_embeddings.weight" in full.stock_save_error or "lm_head.weight" in (
            full.stock_save_error
        )
    # ... so a job cannot resume from it: no step-2 checkpoint was written
    stock = out["resumed_stock"]
    assert stock.losses == {}
    assert stock.error is not None and ".metadata" in stock.error, stock.error

    # torchtitan's manager cannot load a complete, correct checkpoint into this layout
    # either: torch 2.13's load planner gives rank (2, 0) one row more than it holds
    wrong = out["stock_loads_exact_ckpt"]
    assert wrong.checkpointer == STOCK_CM and wrong.losses == {}
    assert wrong.error is not None and "exceeds dimension size" in wrong.error, wrong.error

    # the exact checkpoint resumes with the uninterrupted losses, bitwise on the
    # same layout, and on FSDP 6 (another mesh, data loader state excluded)
    same = out["resumed_exact"]
    _trained(same, [3, 4])
    assert same.losses == {s: full.losses[s] for s in (3, 4)}
    fsdp6 = out["resumed_exact_fsdp6"]
    _trained(fsdp6, [3, 4])
    for step in (3, 4):
        assert fsdp6.losses[step] == pytest.approx(full.losses[step], rel=1e-6, abs=0)


@needs_spmd_types_fsdp
@pytest.mark.multiprocess
@pytest.mark.xdist_group("torchtitan_trainer")  # one 4- or 6-process job at a time
@pytest.mark.timeout(960)
def test_trainer_drop_in_under_spmd_types(tmp_path: Path) -> None:
    """torchtitan 0.3.0's default SPMD backend: stock and drop-in, the same losses."""
    root = _assets(tmp_path)
    out = _rank_zero(
        run_multiproc(
            titan_harness.spmd_types_job, 4, root, 3, timeout=600, startup_timeout=300, init=False
        )
    )
    _print_table("FSDP 2 x TP 2 (4 processes), spmd_types", out)
    stock, drop_in = out["stock"], out["drop_in"]
    _trained(stock, [1, 2, 3])
    _trained(drop_in, [1, 2, 3])
    assert (stock.parallel_dims, drop_in.parallel_dims) == (STOCK_PD, DROP_IN_PD)
    # spmd_types' FSDP2 storage: parameters are DTensors on the dense mesh's
    # (dp_shard, tp) dims, not on partial_dtensor's fsdp mesh
    assert stock.param_mesh == drop_in.param_mesh == ("dp_shard", "tp")
    assert all(stock.losses[s + 1] < stock.losses[s] for s in (1, 2)), stock.losses
    assert drop_in.losses == stock.losses


def test_exact_checkpoint_config_keeps_fields_and_refuses_other_configs() -> None:
    from torchtitan.components.checkpoint import CheckpointManager

    from meshlayout.torch.torchtitan import ExactCheckpointManager, exact_checkpoint_config

    cfg = CheckpointManager.Config(
        enable=True, folder="ck", interval=7, keep_latest_k=3, exclude_from_loading=["dataloader"]
    )
    exact = exact_checkpoint_config(cfg)
    assert isinstance(exact, ExactCheckpointManager.Config)
    assert exact.to_dict() == cfg.to_dict()
    assert ExactCheckpointManager.Config._owner is ExactCheckpointManager
    with pytest.raises(TypeError, match=r"CheckpointManager\.Config"):
        exact_checkpoint_config({"enable": True})


@pytest.mark.parametrize("mode", ["disabled", "async", "async_with_pinned_mem"])
def test_every_dcp_call_of_the_manager_takes_our_planners(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each save mode and the load hand DCP an Exact planner (DCP itself replaced)."""
    from torchtitan.components.checkpointer import MODEL, AsyncMode

    from meshlayout.torch.checkpoint import ExactLoadPlanner, ExactSavePlanner
    from meshlayout.torch.torchtitan import ExactCheckpointManager
    from meshlayout.torch.torchtitan import _checkpoint as module

    calls: list[tuple[str, dict[str, object]]] = []
    for name in ("_dcp_save", "_dcp_async_save", "_dcp_load"):
        monkeypatch.setattr(
            module, name, lambda sd, _n=name, **kw: calls.append((_n, kw)) or "future"
        )
    loaded: list[object] = []

    class Model:
        def load_state_dict(self, sd: object) -> None:
            loaded.append(sd)

    manager = object.__new__(ExactCheckpointManager)  # no torchtitan set-up needed
    manager.pg, manager.stager, manager.states = "pg", "stager", {MODEL: Model()}
    result = manager.dcp_save({"w": 1}, "ckpt/step-2", AsyncMode(mode))
    name, kw = calls.pop()
    assert isinstance(kw["planner"], ExactSavePlanner) and kw["checkpoint_id"] == "ckpt/step-2"
    if mode == "disabled":
        assert (name, result) == ("_dcp_save", None)
    else:
        assert (name, result, kw["process_group"]) == ("_dcp_async_save", "future", "pg")
        assert kw.get("async_stager", "stager") == "stager"
    sd = {"w": 2}
    manager.dcp_load(sd, "ckpt/step-2", from_hf=False, from_quantized=False)
    name, kw = calls.pop()
    assert name == "_dcp_load" and isinstance(kw["planner"], ExactLoadPlanner)
    assert loaded == [sd]  # the model's flattened states go back into the model
