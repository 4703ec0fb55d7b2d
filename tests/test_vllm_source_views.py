"""``ShardedSource(rename=)`` views of trainer tensors (``(checkpoint name, index)`` lists).

Runs where vLLM is installed (``make test`` runs it in ``.venv-vllm``). Each view's
global shape and each rank's piece are checked against indexing the tensor itself; bad
views raise naming the trainer tensor, the checkpoint name and the index.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here (make test runs this in .venv-vllm)", allow_module_level=True
    )

import torch

from meshlayout.vllm import ShardedSource
from meshlayout.vllm._source import View


class OneRank:
    """The parts of a sync group a source reads: this rank and the trainer ranks."""

    rank = 0

    def rank_map(self) -> dict[int, int]:
        return {0: 0}


def _stacked() -> dict[str, torch.Tensor]:
    return {
        "layers.0.moe.experts.w1": torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5),
        "norm.weight": torch.ones(5),
    }


def _rename(name: str) -> Any:
    if name.endswith("w1"):
        return [(f"model.layers.0.mlp.experts.{e}.gate_proj.weight", (e,)) for e in range(4)] + [
            ("odd.rows", (slice(None), slice(1, 6, 2))),
            ("last.expert.tail", (-1, slice(4, None))),
        ]
    return "model.norm.weight"


def test_views_have_the_shapes_and_values_of_indexing() -> None:
    tensors = _stacked()
    source = ShardedSource(tensors, rename=_rename)
    got = source.tensors()
    w1 = tensors["layers.0.moe.experts.w1"]
    want = {f"model.layers.0.mlp.experts.{e}.gate_proj.weight": w1[e] for e in range(4)}
    want["odd.rows"] = w1[:, 1:6:2]
    want["last.expert.tail"] = w1[-1, 4:]
    assert sorted(n for n, t in got.items() if isinstance(t, View)) == sorted(want)
    pieces = source.pieces(sorted(want), OneRank())  # type: ignore[arg-type]
    sources = source.sources(sorted(want), OneRank())  # type: ignore[arg-type]
    for name, ref in want.items():
        assert got[name].shape == tuple(ref.shape), name
        assert torch.equal(pieces[name], ref), name
        local, spec = sources[name]
        assert torch.equal(local, ref) and spec.global_shape == tuple(ref.shape), name
    assert got["model.norm.weight"] is tensors["norm.weight"]


@pytest.mark.parametrize(
    ("index", "error", "words"),
    [
        ((4,), ValueError, "out of range"),
        ((slice(0, 4, 0),), ValueError, "step"),
        ((0, 0, 0, 0), ValueError, "entries"),
        ((slice(2, 2),), ValueError, "no element"),
        (("a",), TypeError, "int or a slice"),
    ],
)
def test_a_bad_view_names_the_tensor_the_view_and_the_index(
    index: Any, error: type[Exception], words: str
) -> None:
    source = ShardedSource(
        _stacked(), rename=lambda n: [("ckpt.name", index)] if n.endswith("w1") else n
    )
    with pytest.raises(error) as info:
        source.tensors()
    message = str(info.value)
    assert "layers.0.moe.experts.w1" in message and "ckpt.name" in message, message
    assert words in message, message


def test_two_views_with_one_name_and_malformed_views_are_refused() -> None:
    clash = ShardedSource(
        _stacked(), rename=lambda n: [("x", (0,)), ("x", (1,))] if n.endswith("w1") else n
    )
    with pytest.raises(ValueError, match="two tensors to 'x'"):
        clash.tensors()
    for bad in ([("x",)], [(0, (0,))], "not-a-list-but-a-name-is-fine"):
        source = ShardedSource(_stacked(), rename=lambda n, bad=bad: bad if n.endswith("w1") else n)
        if isinstance(bad, str):
            assert bad in source.tensors()
            continue
        with pytest.raises(TypeError, match="checkpoint name, index"):
            source.tensors()
