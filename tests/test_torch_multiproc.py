"""The multi-process harness itself: results, errors and hangs are all bounded."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from multiproc import MultiProcError, MultiProcTimeout, run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(600)]


def _sum_ranks(rank: int, world_size: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.tensor([rank])
    dist.all_reduce(t)
    return int(t)


def _fail_on_one(rank: int, world_size: int) -> int:
    if rank == 1:
        raise ValueError("boom on rank 1")
    return rank


def _hang_on_two(rank: int, world_size: int) -> int:
    if rank == 2:
        time.sleep(3600)
    return rank


def test_results_collected_in_rank_order() -> None:
    assert run_multiproc(_sum_ranks, 4, timeout=120) == [6, 6, 6, 6]


def test_spawn_start_method_works_too() -> None:
    assert run_multiproc(_sum_ranks, 2, timeout=120, start_method="spawn") == [1, 1]


def test_exception_propagates_with_traceback() -> None:
    with pytest.raises(MultiProcError) as info:
        run_multiproc(_fail_on_one, 3, timeout=120)
    assert set(info.value.errors) == {1}
    assert isinstance(info.value.errors[1], ValueError)
    assert "boom on rank 1" in info.value.tracebacks[1]


def test_hang_is_killed_and_named() -> None:
    # Rank 2 sleeps far beyond the run budget (counted once every rank has started):
    # the run is stopped, rank 2 killed and named, the others' results kept.
    with pytest.raises(MultiProcTimeout) as info:
        run_multiproc(_hang_on_two, 3, timeout=15)
    assert info.value.missing == [2]
    assert "run budget of 15s ran out" in str(info.value)
