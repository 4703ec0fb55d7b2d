"""Nested integer tuples: validation, flatten/product/suffix products, structure."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshlayout.inttuple import (
    IntTuple,
    check_int_tuple,
    congruent,
    flatten,
    product,
    suffix_product,
    unflatten_like,
)

int_tuples = st.recursive(
    st.integers(1, 9), lambda inner: st.lists(inner, max_size=4).map(tuple), max_leaves=10
)


@given(int_tuples)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_flatten_unflatten_product_round_trip(t: IntTuple) -> None:
    flat = flatten(t)
    assert all(isinstance(x, int) for x in flat)
    assert unflatten_like(flat, t) == t
    assert congruent(unflatten_like(tuple(range(len(flat))), t), t)
    assert product(t) == math.prod(flat)
    assert check_int_tuple(t, "x") == t


@given(st.lists(st.integers(1, 9), max_size=6))
@settings(max_examples=200, deadline=None, derandomize=True)
def test_suffix_product_is_row_major(shape: list[int]) -> None:
    strides = suffix_product(tuple(shape))
    assert len(strides) == len(shape)
    if shape:
        assert strides[-1] == 1
        assert strides[0] * shape[0] == math.prod(shape)
    for k in range(len(shape) - 1):
        assert strides[k] == strides[k + 1] * shape[k + 1]


def test_congruent() -> None:
    assert congruent((2, (3, 4)), (1, (5, 6)))
    assert not congruent((2, (3, 4)), (1, 5, 6))
    assert not congruent(2, (2,))
    assert congruent((), ())


def test_check_int_tuple_normalises() -> None:
    assert check_int_tuple([2, [3, np.int64(4)]], "x") == (2, (3, 4))
    assert type(check_int_tuple(np.int32(3), "x")) is int


@pytest.mark.parametrize("bad", [1.0, "2", True, np.True_, None, (1, 2.5), [1, [None]], {1}])
def test_check_int_tuple_rejects(bad: Any) -> None:
    with pytest.raises(TypeError, match="what"):
        check_int_tuple(bad, "what")


def test_check_int_accepts_ints_and_numpy_ints_exactly() -> None:
    from meshlayout.inttuple import check_int

    assert check_int(7, "x") == 7
    assert check_int(-7, "x") == -7
    assert check_int(2**80, "x") == 2**80
    for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint32, np.uint64):
        v = check_int(t(5), "x")
        assert v == 5 and type(v) is int
    assert check_int(np.uint64(2**64 - 1), "x") == 2**64 - 1  # never wrapped
    assert check_int(3, "x", minimum=3) == 3
    with pytest.raises(ValueError, match="x must be >= 4, got 3"):
        check_int(3, "x", minimum=4)


@pytest.mark.parametrize(
    "bad",
    [
        True,
        False,
        np.bool_(True),
        1.5,
        2.0,
        float("nan"),
        float("inf"),
        np.float64(2.0),
        "3",
        b"3",
        None,
        [1],
        (1,),
        np.array([1, 2]),
        np.array(3),
        1 + 0j,
    ],
)
def test_check_int_rejects_non_integers_naming_the_value(bad: Any) -> None:
    from meshlayout.inttuple import check_int, is_int

    assert not is_int(bad)
    with pytest.raises(TypeError, match="what must be an int, got") as info:
        check_int(bad, "what")
    assert repr(bad) in str(info.value)
