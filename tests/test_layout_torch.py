"""Cross-check against torch's private port of pycute (``torch.distributed._pycute``,
``torch.distributed._mesh_layout``) where torch's answer is valid, and document where
it is silently wrong and we are right.

Convention: the torch port is already *lexicographic* (row-major, last mode fastest,
``Layout((2, 3)).stride == (3, 1)``), unlike upstream CUTLASS pycute, so shapes and
strides map one to one; no mode reversal is needed. Only the mode order of
divide/product results differs (torch puts the tile / ``A`` first).

A mesh dim's layout: from torch 2.13 a ``_FlatLayout`` (normalised: flattened,
coalesced, size-1 modes dropped); in 2.10 to 2.12 a ``_MeshLayout`` built from
(sizes, strides), whose ``coalesce`` does the same but keeps the pycute form.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from meshlayout import Layout, logical_product
from test_layout import (
    SETTINGS,
    admissible_layouts,
    compose_pairs,
    layouts,
    ref_values,
)

pycute = pytest.importorskip("torch.distributed._pycute")
mesh_layout = pytest.importorskip("torch.distributed._mesh_layout")

pytestmark = pytest.mark.torch

#: torch 2.13 and newer: a dim is a ``_FlatLayout``; 2.10 to 2.12: a ``_MeshLayout``.
FLAT = hasattr(mesh_layout, "_FlatLayout")


def dim_layout(shape: Any, stride: Any) -> Any:
    """torch's layout of one mesh dim, in the release's own class."""
    if FLAT:
        return mesh_layout._FlatLayout(shape, stride)
    return mesh_layout._MeshLayout(shape, stride)


def has_empty(t: Any) -> bool:
    return isinstance(t, tuple) and (not t or any(has_empty(e) for e in t))


def to_torch(lay: Layout) -> Any:
    return pycute.Layout(lay.shape, lay.stride)


def from_torch(t: Any) -> Layout:
    return Layout(t.shape, t.stride)


def test_torch_port_is_lexicographic() -> None:
    assert pycute.Layout((2, 3)).stride == Layout((2, 3)).stride == (3, 1)


@given(layouts())
@SETTINGS
def test_coalesce_matches_torch(lay: Layout) -> None:
    assume(not has_empty(lay.shape))  # pycute cannot represent an empty tuple mode
    theirs = from_torch(pycute.coalesce(to_torch(lay)))
    assert theirs == lay.coalesce()
    dim = dim_layout(lay.shape, lay.stride)
    if FLAT:
        assert dim.shape == tuple(s for s, _ in lay.coalesce().modes if s > 1)
    else:
        # 2.11 and 2.12 then reset every stride 0 to 1 (``_MeshLayout.coalesce``; 2.10
        # does not): the same map for size-1 modes, and a broadcast mode (size > 1,
        # stride 0) is no mesh dim. So both sides are compared with that reset.
        theirs, ours = from_torch(dim.coalesce()), lay.coalesce()
        assert Layout(theirs.shape, _zero_to_one(theirs.stride)) == Layout(
            ours.shape, _zero_to_one(ours.stride)
        )


def _zero_to_one(stride: Any) -> Any:
    if isinstance(stride, tuple):
        return tuple(_zero_to_one(s) for s in stride)
    return 1 if stride == 0 else stride


@given(compose_pairs())
@SETTINGS
def test_composition_matches_torch_where_valid(pair: tuple[Layout, Layout]) -> None:
    a, b = pair
    assume(not has_empty(a.shape) and not has_empty(b.shape))
    ours = a.compose(b)
    theirs = from_torch(pycute.composition(to_torch(a), to_torch(b)))
    assert theirs.equivalent(ours)
    assert ref_values(theirs) == ref_values(ours)


@given(admissible_layouts(), st.integers(1, 300))
@SETTINGS
def test_complement_matches_torch(a: Layout, cotarget: int) -> None:
    assume(not has_empty(a.shape))
    ours = a.complement(cotarget)
    theirs = from_torch(pycute.complement(to_torch(a), cotarget))
    assert theirs.coalesce() == ours
    dim = dim_layout(a.shape, a.stride)
    if FLAT:
        assert dim_layout(ours.shape, ours.stride) == dim.complement(cotarget)
    else:
        assert from_torch(dim.complement(cotarget)).coalesce() == ours


def test_mesh_layout_global_ranks_match_divide() -> None:
    # torch's rank groups of tp=4 in a world of 16 == the rows of our logical_divide
    from meshlayout import logical_divide

    dim = dim_layout((4,), (1,))
    ours = logical_divide(Layout(16), 4)
    rows = ours.indices().reshape(4, 4).tolist()
    assert dim.global_ranks(16) == rows


# ---------------------------------------------------------------------- torch silently wrong


def test_torch_composition_skips_shape_divisibility() -> None:
    a, b = Layout((2, 3), (6, 1)), Layout(4)
    theirs = from_torch(pycute.composition(to_torch(a), to_torch(b)))
    assert theirs == Layout(3, 1)  # size 3: B had 4 elements
    assert theirs.size() != b.size()
    right = (
        mesh_layout._MeshLayout.from_sizes_strides((4,), (1,))
        if FLAT
        else mesh_layout._MeshLayout((4,), (1,))
    )
    via_mesh = dim_layout((2, 3), (6, 1)).composition(right)
    assert via_mesh.numel() == 3
    with pytest.raises(ValueError, match="shape divisibility"):
        a.compose(b)


def test_torch_complement_of_int_ignores_cotarget() -> None:
    theirs = from_torch(pycute.complement(4, 24))
    assert theirs == Layout(1, 0)  # M = 24 ignored
    assert Layout(4, 1).complement(24) == Layout(6, 4)


def test_torch_logical_product_with_int_tiler_divides() -> None:
    theirs = from_torch(pycute.logical_product(pycute.Layout(4, 1), 3))
    assert theirs == Layout((3, 2), (1, 3))  # a divide, size 6, not 12
    assert theirs.size() != 4 * 3
    ours = logical_product(Layout(4), 3)
    assert ours == Layout((3, 4), (4, 1)) and ours.size() == 12


@pytest.mark.parametrize(
    ("shape", "stride", "garbage"),
    [
        ((2, 2), (1, 1), ((16, 0), (2, 2))),  # not injective
        ((2, 4), (3, 1), ((6, 0), (6, 4))),  # not injective
        ((4, 2), (1, 1), ((8, 0), (4, 2))),  # not injective
    ],
)
def test_torch_complement_of_bad_layout_is_garbage(
    shape: tuple[int, ...], stride: tuple[int, ...], garbage: tuple[Any, Any]
) -> None:
    theirs = pycute.complement(pycute.Layout(shape, stride), 32)
    assert (theirs.shape, theirs.stride) == garbage  # a stride-0 "complement"
    with pytest.raises(ValueError, match="not injective"):
        Layout(shape, stride).complement(32)


def test_torch_complement_of_inadmissible_layout_is_not_a_complement() -> None:
    a = Layout((2, 2), (3, 1))  # injective, but the strides do not nest
    theirs = from_torch(pycute.complement(to_torch(a), 12))
    pair = ref_values(Layout((theirs.shape, a.shape), (theirs.stride, a.stride)))
    assert len(set(pair)) != len(pair) or set(pair) != set(range(len(pair)))
    with pytest.raises(ValueError, match="not admissible"):
        a.complement(12)
