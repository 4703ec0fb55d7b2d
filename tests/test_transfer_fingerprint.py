"""meshlayout.torch.transfer._fingerprint (WeightTransfer's verify) against a brute-force reference.

The reference works element by element in Python integers from the definition: the
element's bytes (numpy, little-endian), its global row (flat over all dims but the
last) and byte position in the row, the 8-byte limb that position falls in, and
splitmix64 written out in Python. The fast implementation (``torch.mv`` over int64
views, a scratch for casts and unaligned boxes) must agree with it for every dtype,
shape and box, give the same sum for any split of a tensor into boxes, and change for
permuted, shifted and stale data.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from meshlayout.torch.transfer._fingerprint import (  # noqa: E402
    COL_SALT,
    ROW_SALT,
    Fingerprinter,
    fingerprint,
)

pytestmark = pytest.mark.torch

M64 = (1 << 64) - 1
DTYPES = ("bfloat16", "float32", "float64", "int64", "int8", "bool", "complex128")


def _splitmix(i: int, salt: int) -> int:
    x = (i * 0x9E3779B97F4A7C15 + salt) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return (x ^ (x >> 31)) | 1


def reference(full: Any, box: tuple[tuple[int, int], ...], dtype: Any) -> int:
    """Sum over the box's elements of bits << 8*(byte in limb) * Wr[row] * Wc[limb]."""
    values = full.to(dtype)
    shape = tuple(values.shape) or (1,)
    if not box:
        box = ((0, 1),)
    data = values.reshape(shape).numpy() if dtype != torch.bfloat16 else None
    size = values.element_size()
    total = 0
    for index in itertools.product(*(range(a, b) for a, b in box)):
        if data is not None:
            raw = data[index].tobytes()
        else:  # numpy has no bfloat16: its bits through int16
            raw = values.reshape(shape)[index].view(torch.int16).numpy().tobytes()
        bits = int.from_bytes(raw, "little")
        row = 0
        for d in range(len(shape) - 1):
            row = row * shape[d] + index[d]
        row_index = row if len(shape) > 1 else 0
        pos = index[-1] * size
        for byte in range(size):  # byte by byte: an element may straddle two limbs
            b = (bits >> (8 * byte)) & 0xFF
            p = pos + byte
            total += (
                (b << (8 * (p % 8))) * _splitmix(row_index, ROW_SALT) * _splitmix(p // 8, COL_SALT)
            )
    return total & M64


def _full(shape: tuple[int, ...], dtype: str, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    if dtype == "bool":
        return (torch.randint(0, 2, (n,), generator=g) == 1).reshape(shape)
    if dtype in ("int64", "int8"):
        return torch.randint(-100, 100, (n,), generator=g).to(getattr(torch, dtype)).reshape(shape)
    if dtype == "complex128":
        return (
            torch.randn(n, 2, generator=g, dtype=torch.float64)
            .view(torch.complex128)
            .reshape(shape)
        )
    return torch.randn(n, generator=g).to(getattr(torch, dtype)).reshape(shape)


def _region(full: Any, box: tuple[tuple[int, int], ...]) -> Any:
    return full[tuple(slice(a, b) for a, b in box)]


shapes = st.lists(st.integers(1, 7), min_size=0, max_size=3).map(tuple)


@st.composite
def shape_and_box(draw: Any) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    shape = draw(shapes)
    box = []
    for n in shape:
        a = draw(st.integers(0, n - 1))
        box.append((a, draw(st.integers(a + 1, n))))
    return shape, tuple(box)


@settings(max_examples=120, deadline=None)
@given(sb=shape_and_box(), dtype=st.sampled_from(DTYPES), seed=st.integers(0, 10**6))
def test_matches_the_brute_force_reference(sb: Any, dtype: str, seed: int) -> None:
    shape, box = sb
    full = _full(shape, dtype, seed)
    want = reference(full, box, getattr(torch, dtype))
    region = _region(full, box)
    assert fingerprint(region, box, shape, getattr(torch, dtype)) == want
    # a tiny scratch forces the blocked and column-cut paths
    assert Fingerprinter(scratch_limbs=2).box(region, box, shape, getattr(torch, dtype)) == want


@settings(max_examples=60, deadline=None)
@given(sb=shape_and_box(), seed=st.integers(0, 10**6))
def test_cast_matches_the_reference_of_the_cast_tensor(sb: Any, seed: int) -> None:
    """fp32 pieces hashed as bf16 (the sender's cast) equal the bf16 tensor's sum."""
    shape, box = sb
    full = _full(shape, "float32", seed)
    want = reference(full.to(torch.bfloat16), box, torch.bfloat16)
    assert fingerprint(_region(full, box), box, shape, torch.bfloat16) == want


def _random_split(shape: tuple[int, ...], rng: Any) -> list[tuple[tuple[int, int], ...]]:
    """A grid of boxes covering the tensor (random cut points per dim)."""
    per_dim = []
    for n in shape:
        cuts = sorted(rng.sample(range(1, n), k=rng.randint(0, n - 1))) if n > 1 else []
        edges = [0, *cuts, n]
        per_dim.append(list(itertools.pairwise(edges)))
    return [tuple(b) for b in itertools.product(*per_dim)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int8", "complex128"])
@pytest.mark.parametrize("shape", [(13, 9), (5, 3, 7), (31,), ()])
def test_any_split_into_boxes_sums_to_the_whole(dtype: str, shape: tuple[int, ...]) -> None:
    import random

    rng = random.Random(f"{dtype}{shape}")  # deterministic (str seeds are hashed stably)
    dt = getattr(torch, dtype)
    full = _full(shape, dtype, 1)
    whole_box = tuple((0, n) for n in shape)
    whole = fingerprint(full, whole_box, shape, dt)
    fp = Fingerprinter(scratch_limbs=3)
    for _ in range(5):
        boxes = _random_split(shape, rng)
        total = sum(fp.box(_region(full, b), b, shape, dt) for b in boxes)
        assert total & M64 == whole
    # non-contiguous copies of the same values (a transposed layout) hash the same
    if len(shape) == 2:
        strided = full.t().contiguous().t()
        assert fingerprint(strided, whole_box, shape, dt) == whole


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_corruptions_change_it(dtype: str) -> None:
    dt = getattr(torch, dtype)
    shape = (16, 12)
    full = _full(shape, "float32", 3).to(dt)
    box = ((0, 16), (0, 12))
    base = fingerprint(full, box, shape, dt)
    permuted = full[[1, 0, *range(2, 16)]]  # two rows swapped
    assert fingerprint(permuted, box, shape, dt) != base
    swapped = full.clone()
    swapped[3, 4], swapped[3, 5] = full[3, 5], full[3, 4]  # two neighbours in a row
    assert fingerprint(swapped, box, shape, dt) != base
    shifted = full.reshape(-1).roll(1).reshape(shape)  # wrong offset by one element
    assert fingerprint(shifted, box, shape, dt) != base
    stale = full.clone()
    stale[8:] = (full[8:].float() - 0.001).to(dt)  # a slab from the previous step
    assert fingerprint(stale, box, shape, dt) != base
    # one wrong element anywhere: always detected (odd weights, a nonzero limb delta)
    for i, j in ((0, 0), (7, 11), (15, 5)):
        one = full.clone()
        one.view(torch.int16 if dtype == "bfloat16" else torch.int32)[i, j] ^= 1 << 3
        assert fingerprint(one, box, shape, dt) != base
    # the same box at another position of the tensor: a different sum
    bigger = (32, 12)
    assert fingerprint(full, ((16, 32), (0, 12)), bigger, dt) != fingerprint(
        full, ((0, 16), (0, 12)), bigger, dt
    )


def test_bad_region_shape() -> None:
    with pytest.raises(ValueError, match="does not match box"):
        fingerprint(torch.zeros(2, 3), ((0, 2), (0, 4)), (2, 4), torch.float32)
    with pytest.raises(ValueError, match="scratch_limbs"):
        Fingerprinter(scratch_limbs=1)
