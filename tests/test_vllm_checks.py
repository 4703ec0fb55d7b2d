"""The engine/trainer agreement of the vLLM backend (``meshlayout.vllm._session``),
without an engine: coverage against brute force, and each refusal naming exactly the
tensors at fault, on the exact and on the fallback path."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch")

from meshlayout.vllm._session import _check, uncovered

pytestmark = pytest.mark.torch


@st.composite
def shapes_and_boxes(draw: Any) -> tuple[tuple[int, ...], list[tuple[tuple[int, int], ...]]]:
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    boxes = []
    for _ in range(draw(st.integers(0, 5))):
        box = []
        for n in shape:
            a = draw(st.integers(0, n - 1))
            b = draw(st.integers(a + 1, n))
            box.append((a, b))
        boxes.append(tuple(box))
    return shape, boxes


@settings(max_examples=300, deadline=None)
@given(shapes_and_boxes())
def test_uncovered_counts_like_brute_force(case: Any) -> None:
    shape, boxes = case
    hit = np.zeros(shape, dtype=bool)
    for box in boxes:
        hit[tuple(slice(a, b) for a, b in box)] = True
    assert uncovered(shape, boxes) == int((~hit).sum())


def _post(
    reads: dict[str, Any],
    *,
    unknown: dict[str, str] | None = None,
    underfilled: dict[str, tuple[int, int]] | None = None,
    expected: dict[str, tuple[int, ...]] | None = None,
    fallback: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "boxes": {},
        "reads": reads,
        "fallback": fallback or {},
        "unknown": unknown or {},
        "underfilled": underfilled or {},
        "expected": expected or {},
        "dtypes": {n: "float32" for n in reads},
    }


ROW = "layers.0.down.weight"  # [128, 250], split by columns over 2 workers
COL = "layers.0.gate.weight"  # [250, 128], split by rows


def _row_reads(w: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    return (((0, 128), (125 * w, 125 * w + 125)),)


def _col_reads(w: int) -> tuple[tuple[tuple[int, int], ...], ...]:
    return (((125 * w, 125 * w + 125), (0, 128)),)


@pytest.mark.parametrize("path", ["exact", "fallback"])
def test_a_wrong_shape_is_named_alone_on_either_path(path: str) -> None:
    manifest = [(ROW, (128, 251), "float32"), (COL, (251, 128), "float32")]
    fallback = {ROW: "its loader makes 2 copies"} if path == "fallback" else None
    posts = {
        4 + w: _post({ROW: _row_reads(w), COL: _col_reads(w)}, fallback=fallback) for w in (0, 1)
    }
    with pytest.raises(ValueError) as info:
        _check(0, manifest, posts)
    message = str(info.value)
    assert f"tensors {sorted([ROW, COL])}" in message
    assert "(128, 250)" in message and "(250, 128)" in message
    # the right shapes pass
    good = [(ROW, (128, 250), "float32"), (COL, (250, 128), "float32")]
    _check(0, good, posts)


def test_a_fallback_whose_reads_are_not_boxes_is_left_to_vllm() -> None:
    posts = {4: _post({ROW: None}, fallback={ROW: "transposes"})}
    _check(0, [(ROW, (128, 251), "float32")], posts)


def test_a_missing_tensor_is_named_alone_and_an_extra_one_too() -> None:
    expected = {ROW: (128, 250), COL: (250, 128), "q.weight": (64, 128)}
    manifest = [(ROW, (128, 250), "float32"), (COL, (250, 128), "float32")]
    posts = {
        4 + w: _post(
            {ROW: _row_reads(w), COL: _col_reads(w)},
            underfilled={"layers.0.qkv.weight": (64, 96)},
            expected=expected if w == 0 else {},
        )
        for w in (0, 1)
    }
    with pytest.raises(ValueError, match=r"tensors \['q.weight'\]") as info:
        _check(0, manifest, posts)
    assert "missing from the trainer" in str(info.value)
    extra = [*manifest, ("layers.9.x.weight", (3, 4), "float32")]
    posts = {
        4 + w: _post(
            {ROW: _row_reads(w), COL: _col_reads(w)},
            unknown={"layers.9.x.weight": "the model's load_weights does not know this name"},
        )
        for w in (0, 1)
    }
    with pytest.raises(ValueError, match=r"tensors \['layers.9.x.weight'\]"):
        _check(0, extra, posts)


def test_every_combination_of_mistakes_names_exactly_them() -> None:
    names = [f"t{i}" for i in range(4)]
    good = {n: (8, 4) for n in names}
    for k in range(1, 4):
        for wrong in itertools.combinations(names, k):
            manifest = [(n, (9, 4) if n in wrong else good[n], "float32") for n in names]
            posts = {
                2 + w: _post({n: (((4 * w, 4 * w + 4), (0, 4)),) for n in names}) for w in (0, 1)
            }
            with pytest.raises(ValueError) as info:
                _check(0, manifest, posts)
            assert f"tensors {sorted(wrong)}" in str(info.value)


def test_a_loader_that_raises_on_some_workers_names_the_tensor_alone() -> None:
    """q_proj with half its rows: worker 0's slice fits, worker 1's loader raises; the
    qkv parameter left half-filled on worker 1 is not blamed besides it."""
    q = "layers.1.q.weight"
    manifest = [(q, (64, 128), "float32")]
    posts = {
        4: _post({q: (((0, 64), (0, 128)),)}, expected={q: (128, 128)}),
        5: _post(
            {},
            unknown={q: "its load_weights raised RuntimeError: start (64) + length (64) exceeds"},
            underfilled={"layers.1.qkv.weight": (8192, 16384)},
        ),
    }
    with pytest.raises(ValueError) as info:
        _check(0, manifest, posts)
    message = str(info.value)
    assert f"tensors {[q]}" in message and "(128, 128)" in message, message
    assert "qkv" not in message, message
