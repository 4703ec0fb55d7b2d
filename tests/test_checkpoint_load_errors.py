"""``mlcp.load`` mistakes are one line, the same on every rank, and ordinary Exceptions.

A missing folder, a file instead of a folder, a folder with no checkpoint, a misspelt
key, a flat state dict against a checkpoint saved as ``{"model": ...}`` (and the
reverse), a key misspelt on one rank only (as pipeline stages hold different keys):
on 3 gloo processes each rank catches ``Exception`` (torch's own
``CheckpointException`` is a ``BaseException``, which ``except Exception`` misses) and
returns what it caught; none waits for the others. Then the same on one process
without a process group (``no_dist=True``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch]

WORLD = 3


def _saved(root: str, distributed: bool) -> str:
    """``{"model": {...}, "step": 7}`` with a DTensor sharded over the ranks (or plain)."""
    import torch

    from meshlayout.torch import checkpoint as mlcp

    model: dict[str, Any] = {"embed.weight": torch.arange(40.0).view(10, 4), "norm": torch.ones(4)}
    if distributed:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        mesh = init_device_mesh("cpu", (WORLD,))
        model["embed.weight"] = distribute_tensor(model["embed.weight"], mesh, [Shard(0)])
    path = f"{root}/ckpt"
    mlcp.save({"model": model, "step": 7}, path, no_dist=not distributed)
    return path


def _mistakes(root: str, path: str, rank: int, no_dist: bool) -> dict[str, str]:
    """Every mistake: what the rank caught (type and message), or 'loaded'."""
    import torch

    from meshlayout.torch import checkpoint as mlcp

    (Path(root) / "file").write_text("x")
    (Path(root) / "empty").mkdir(exist_ok=True)

    def model(**extra: Any) -> dict[str, Any]:
        return {"embed.weight": torch.zeros(10, 4), "norm": torch.zeros(4), **extra}

    cases: dict[str, tuple[dict[str, Any], str]] = {
        "missing folder": ({"model": model()}, f"{root}/nope"),
        "a file": ({"model": model()}, f"{root}/file"),
        "no checkpoint": ({"model": model()}, f"{root}/empty"),
        "misspelt key": ({"model": {"embed.weight": torch.zeros(10, 4), "nrom": 0}}, path),
        "flat": (model(), path),
        "nested twice": ({"trainer": {"model": model()}}, path),
        "rank 1 misspelt": (
            {"model": {"norm" if rank != 1 else "norms": torch.zeros(4)}, "step": 0},
            path,
        ),
    }
    out: dict[str, str] = {}
    for name, (state_dict, where) in cases.items():
        try:
            mlcp.load(state_dict, where, no_dist=no_dist)
            out[name] = "loaded"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _on_ranks(rank: int, world: int, root: str) -> dict[str, str]:
    import torch.distributed as dist

    path = _saved(root, distributed=True)
    dist.barrier()
    return _mistakes(root, path, rank, no_dist=False)


def _alone(rank: int, world: int, root: str) -> dict[str, str]:
    return _mistakes(root, _saved(root, distributed=False), 1, no_dist=True)  # as rank 1


def _expected(root: str, ranks: str) -> dict[str, str]:
    """What every rank must catch; ``ranks`` is the prefix naming the failing ranks."""
    ckpt = f"{root}/ckpt"
    return {
        "missing folder": f"FileNotFoundError: load: checkpoint '{root}/nope' does not exist",
        "a file": (
            f"FileNotFoundError: load: checkpoint '{root}/file' is not a directory (DCP "
            "checkpoints are directories)"
        ),
        "no checkpoint": (
            f"FileNotFoundError: load: '{root}/empty' holds no DCP checkpoint (no .metadata file)"
        ),
        "misspelt key": (
            f"CheckpointKeyError: load '{ckpt}': {ranks}key 'model.nrom' is not in the "
            "checkpoint (it holds 3 keys: 'model.embed.weight', 'model.norm', 'step'; closest: "
            "'model.norm'); fix the key, or pass allow_partial_load=True to load only the keys "
            "it holds"
        ),
        "flat": (
            f"CheckpointKeyError: load '{ckpt}': {ranks}keys 'embed.weight', 'norm' are not in "
            "the checkpoint, which holds them under 'model' (model.embed.weight, model.norm): it "
            "was saved as {'model': state_dict}; load {'model': state_dict} the same way"
        ),
        "nested twice": (
            f"CheckpointKeyError: load '{ckpt}': {ranks}keys 'trainer.model.embed.weight', "
            "'trainer.model.norm' are not in the checkpoint, which holds them at the top level "
            "(model.embed.weight, model.norm): it was saved without the 'trainer' level; load "
            "state_dict['trainer'] instead"
        ),
    }


def _check(got: dict[str, str], root: str, ranks: str, rank_1: str) -> None:
    want = _expected(root, ranks)
    for name, message in want.items():
        assert got[name] == message, (name, got[name])
        assert "\n" not in got[name]
    assert got["rank 1 misspelt"] == (
        f"CheckpointKeyError: load '{root}/ckpt': {rank_1}key 'model.norms' is not in the "
        "checkpoint (it holds 3 keys: 'model.embed.weight', 'model.norm', 'step'; closest: "
        "'model.norm'); fix the key, or pass allow_partial_load=True to load only the keys it "
        "holds"
    )


def test_load_mistakes_on_3_processes_are_one_line_on_every_rank(tmp_path: Path) -> None:
    results = run_multiproc(_on_ranks, WORLD, str(tmp_path), timeout=240)
    assert results[0] == results[1] == results[2]  # the same line on every rank
    _check(results[0], str(tmp_path), "ranks [0, 1, 2]: ", "ranks [1]: ")


def test_load_mistakes_without_a_process_group(tmp_path: Path) -> None:
    (alone,) = run_multiproc(_alone, 1, str(tmp_path), timeout=240, init=False)
    _check(alone, str(tmp_path), "", "")


def _rank_2_without(rank: int, world: int, root: str) -> str:
    import shutil

    import torch
    import torch.distributed as dist

    from meshlayout.torch import checkpoint as mlcp

    path = _saved(root, distributed=True)
    dist.barrier()
    if rank == 0:  # every rank but 2 finds a checkpoint at the path it is given
        shutil.copytree(path, f"{root}/ckpt-0")
        shutil.copytree(path, f"{root}/ckpt-1")
    dist.barrier()
    try:
        mlcp.load({"model": {"norm": torch.zeros(4)}}, f"{root}/ckpt-{rank}")
        return "loaded"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


def test_a_rank_whose_file_system_lacks_the_checkpoint_fails_with_the_others(
    tmp_path: Path,
) -> None:
    """Node-local disks: rank 2 does not see the folder; no rank waits in DCP's collectives."""
    results = run_multiproc(_rank_2_without, WORLD, str(tmp_path), timeout=240)
    for got in results:
        assert got == (
            f"FileNotFoundError: load: ranks [2] (of 3): checkpoint '{tmp_path}/ckpt-2' does "
            "not exist"
        )
