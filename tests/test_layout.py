"""Property and error tests of the layout algebra against brute-force evaluation.

Every identity is checked on random layouts (nested shapes and strides, and
admissible layouts built from permuted, strided sub-layouts of compact ones so
that the preconditions of compose/complement/inverses often hold) by evaluating
both sides element by element with a reference evaluator written here, independent
of :mod:`meshlayout.layout`.
"""

from __future__ import annotations

import itertools
import math
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from meshlayout import Layout, logical_divide, logical_product, make_layout
from meshlayout.inttuple import IntTuple

SETTINGS = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
MANY = settings(SETTINGS, max_examples=400)

# ---------------------------------------------------------------------- reference


def leaves(t: IntTuple) -> list[int]:
    """Flat integers of a nested tuple (reference, independent of inttuple.flatten)."""
    if isinstance(t, int):
        return [t]
    return [x for e in t for x in leaves(e)]


def ref_values(lay: Layout) -> list[int]:
    """L(i) for i in range(size), by a row-major nested loop over the flat modes."""
    shape, stride = leaves(lay.shape), leaves(lay.stride)
    return [
        sum(c * d for c, d in zip(coord, stride))
        for coord in itertools.product(*(range(s) for s in shape))
    ]


def ref_size(lay: Layout) -> int:
    return math.prod(leaves(lay.shape))


def ref_coord(i: int, shape: IntTuple) -> IntTuple:
    """The nested coordinate of linear index ``i`` in ``shape`` (row-major)."""
    if isinstance(shape, int):
        return i
    out: list[IntTuple] = []
    for sub in reversed(shape):
        n = math.prod(leaves(sub))
        out.append(ref_coord(i % n, sub))
        i //= n
    return tuple(reversed(out))


# ---------------------------------------------------------------------- strategies


@st.composite
def templates(draw: st.DrawFn, n: int, depth: int = 2) -> tuple[Any, ...]:
    """A random top-level nesting of the leaves ``0..n-1`` (in order)."""

    def build(lo: int, hi: int, d: int) -> tuple[Any, ...]:
        elems: list[Any] = []
        i = lo
        while i < hi:
            if d > 0 and draw(st.integers(0, 3)) == 0:
                j = draw(st.integers(i + 1, hi))
                elems.append(build(i, j, d - 1))
                i = j
            else:
                elems.append(i)
                i += 1
        return tuple(elems)

    return build(0, n, depth)


def fill(template: Any, flat: list[int]) -> IntTuple:
    if isinstance(template, int):
        return flat[template]
    return tuple(fill(e, flat) for e in template)


@st.composite
def nested_layouts(draw: st.DrawFn, modes: list[tuple[int, int]]) -> Layout:
    """A layout with the given flat modes (slowest first) and a random nesting."""
    if not modes:
        return Layout(draw(st.sampled_from([1, (1,), ()])), None)
    t = draw(templates(len(modes)))
    if not t:  # pragma: no cover - templates of n >= 1 leaves are never empty
        t = (0,)
    shapes, strides = [s for s, _ in modes], [d for _, d in modes]
    return Layout(fill(t, shapes), fill(t, strides))


@st.composite
def any_layouts(draw: st.DrawFn, max_modes: int = 4, max_stride: int = 24) -> Layout:
    n = draw(st.integers(0, max_modes))
    modes = [(draw(st.integers(1, 5)), draw(st.integers(0, max_stride))) for _ in range(n)]
    return draw(nested_layouts(modes))


@st.composite
def admissible_modes(draw: st.DrawFn, max_modes: int = 4) -> list[tuple[int, int]]:
    """Flat modes of a permuted, strided sub-layout of a compact layout: admissible."""
    n = draw(st.integers(0, max_modes))
    by_stride: list[tuple[int, int]] = []
    span = 1
    for _ in range(n):
        size = draw(st.integers(1, 5))
        stride = span * draw(st.sampled_from([1, 1, 1, 2, 3]))
        by_stride.append((size, stride))
        span = size * stride
    return draw(st.permutations(by_stride))


@st.composite
def admissible_layouts(draw: st.DrawFn, max_modes: int = 4) -> Layout:
    return draw(nested_layouts(draw(admissible_modes(max_modes))))


def layouts() -> st.SearchStrategy[Layout]:
    return st.one_of(any_layouts(), admissible_layouts())


def factorisations(n: int) -> st.SearchStrategy[list[int]]:
    """Random ordered factorisations of ``n`` into factors > 1 (slowest first)."""
    divisors = [d for d in range(2, n + 1) if n % d == 0]
    if not divisors:
        return st.just([])
    return st.sampled_from(divisors).flatmap(
        lambda d: factorisations(n // d).map(lambda rest: [*rest, d])
    )


@st.composite
def compatible_right(draw: st.DrawFn, a: Layout) -> Layout:
    """A right operand ``B`` that satisfies every precondition of ``a ∘ B``.

    Refine the coalesced modes of ``a`` into digits (a compact layout over the
    domain of ``a``), keep a random subset of them, shorten some (a mode may end
    inside a digit), permute, add broadcast modes, and nest at random.
    """
    digits: list[int] = []
    for s, _ in a.coalesce().modes:
        digits.extend(draw(factorisations(s)))
    strides = [math.prod(digits[k + 1 :]) for k in range(len(digits))]
    chosen = [(s, d) for s, d in zip(digits, strides) if draw(st.booleans())]
    if chosen and draw(st.booleans()):
        k = draw(st.integers(0, len(chosen) - 1))
        s, d = chosen[k]
        chosen[k] = (draw(st.integers(1, s)), d)
    if draw(st.integers(0, 4)) == 0:
        chosen.append((draw(st.integers(1, 3)), 0))
    return draw(nested_layouts(draw(st.permutations(chosen))))


@st.composite
def compose_pairs(draw: st.DrawFn) -> tuple[Layout, Layout]:
    a = draw(layouts())
    return a, draw(compatible_right(a))


# ---------------------------------------------------------------------- construction, evaluation


@given(layouts())
@SETTINGS
def test_call_int_and_nested_coordinates(lay: Layout) -> None:
    values = ref_values(lay)
    assert lay.size() == len(values) == ref_size(lay)
    assert lay.cosize() == max(values) + 1
    for i, v in enumerate(values):
        assert lay(i) == v
        assert lay(ref_coord(i, lay.shape)) == v
        # a coordinate may stop at any level: one int per top-level mode
        top_sizes = [math.prod(leaves(m)) for m in lay.shape]
        assert (
            lay(tuple(int(c) for c in np.unravel_index(i, top_sizes))) == v if top_sizes else True
        )


@given(layouts())
@SETTINGS
def test_indices_matches_per_element_loop(lay: Layout) -> None:
    idx = lay.indices()
    assert idx.dtype == np.int64
    assert idx.tolist() == [lay(i) for i in range(lay.size())] == ref_values(lay)
    assert not idx.flags.writeable


def test_indices_large_layout_matches_reference() -> None:
    lay = Layout((2, 3, 2, 5, 2, 7, 3), (1, 420, 2, 84, 840, 12, 4))
    assert lay.indices().tolist() == ref_values(lay)


@given(layouts())
@SETTINGS
def test_len_getitem_iter_make_layout(lay: Layout) -> None:
    assert len(lay) == len(lay.shape)
    modes = list(lay)
    assert [m.size() for m in modes] == [
        ref_size(Layout(s, d)) for s, d in zip(lay.shape, lay.stride)
    ]
    if modes:
        assert make_layout(*modes).equivalent(lay)
        assert lay[-1] == modes[-1]
        assert lay[np.int64(0)] == modes[0]
    assert lay[0 : len(lay)] == lay


# ---------------------------------------------------------------------- value object


@given(layouts())
@SETTINGS
def test_pickle_hash_eq_repr_parse_round_trip(lay: Layout) -> None:
    copy = pickle.loads(pickle.dumps(lay))
    assert copy == lay and hash(copy) == hash(lay)
    assert Layout.parse(repr(lay)) == lay
    assert Layout.parse(str(lay)) == lay
    assert Layout(lay.shape, lay.stride) == lay
    assert {lay: 1}[Layout(lay.shape, lay.stride)] == 1


def test_repr_examples() -> None:
    assert repr(Layout(8)) == "8:1"
    assert repr(Layout((2, 4))) == "(2,4):(4,1)"
    assert repr(Layout(((2, 3),))) == "((2,3),):((3,1),)"
    assert Layout.parse("8") == Layout(8, 1)
    assert Layout.parse(" (2, 4) : (4, 1) ") == Layout((2, 4))
    assert Layout.parse("((2,3),):((3,1),)") == Layout(((2, 3),))
    assert Layout(8) != Layout(8, 2)
    assert Layout(8) != "8:1"


@pytest.mark.parametrize("text", ["", "2:", ":2", "a:b", "(2,3):(1,)", "2.5:1", "1:2:3", "[2"])
def test_parse_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="cannot parse layout"):
        Layout.parse(text)


def test_parse_rejects_non_str() -> None:
    with pytest.raises(TypeError):
        Layout.parse(8)  # type: ignore[arg-type]


def test_immutable() -> None:
    lay = Layout((2, 4))
    with pytest.raises(AttributeError, match="immutable"):
        lay.shape = (8,)  # type: ignore[misc]
    with pytest.raises(AttributeError, match="immutable"):
        del lay.stride
    with pytest.raises(AttributeError):
        lay.extra = 1  # type: ignore[attr-defined]
    assert lay == Layout((2, 4), (4, 1))


def test_normalisation() -> None:
    assert Layout(8).shape == (8,) and Layout(8).stride == (1,)
    assert Layout([2, [3, 4]]) == Layout((2, (3, 4)), (12, (4, 1)))
    assert Layout(np.int64(4), np.int32(2)) == Layout(4, 2)
    assert type(Layout(np.int64(4)).shape[0]) is int


# ---------------------------------------------------------------------- simplification


@given(layouts())
@SETTINGS
def test_coalesce_preserves_function_and_is_minimal(lay: Layout) -> None:
    c = lay.coalesce()
    assert ref_values(c) == ref_values(lay)
    assert c.coalesce() == c
    flat = c.modes
    assert all(isinstance(s, int) for s in c.shape)
    if flat != ((1, 0),):
        assert all(s > 1 for s, _ in flat)
    for (_s0, d0), (s1, d1) in itertools.pairwise(flat):
        assert d0 != s1 * d1, f"{c} is not fully coalesced"


@given(layouts())
@SETTINGS
def test_flatten_preserves_function(lay: Layout) -> None:
    f = lay.flatten()
    assert ref_values(f) == ref_values(lay)
    assert all(isinstance(s, int) for s in f.shape)
    assert f.shape == tuple(leaves(lay.shape))


@given(layouts())
@SETTINGS
def test_filter_is_the_image(lay: Layout) -> None:
    f = lay.filter()
    assert set(ref_values(f)) == set(ref_values(lay))
    assert all(d != 0 for s, d in f.modes if s > 1)
    if lay.is_injective():
        assert f.equivalent(lay.coalesce())


# ---------------------------------------------------------------------- predicates


@given(layouts())
@SETTINGS
def test_is_injective_vs_brute_force(lay: Layout) -> None:
    values = ref_values(lay)
    assert lay.is_injective() == (len(set(values)) == len(values))


@given(layouts())
@SETTINGS
def test_is_admissible_definition(lay: Layout) -> None:
    span, ok = 1, True
    for s, d in sorted(
        (m for m in zip(leaves(lay.shape), leaves(lay.stride)) if m[0] > 1), key=lambda m: m[1]
    ):
        ok = ok and d > 0 and d % span == 0
        span = s * d
    assert lay.is_admissible() == ok
    if ok:
        assert lay.is_injective()


@given(admissible_layouts())
@SETTINGS
def test_built_admissible_layouts_are_admissible(lay: Layout) -> None:
    assert lay.is_admissible()


@given(layouts(), layouts())
@SETTINGS
def test_equivalent_vs_brute_force(a: Layout, b: Layout) -> None:
    assert a.equivalent(b) == (ref_values(a) == ref_values(b))
    assert a.equivalent(a.flatten()) and a.equivalent(a.coalesce())
    assert a.coalesce().equivalent(a)


# ---------------------------------------------------------------------- composition


@given(compose_pairs())
@MANY
def test_compose_identity_on_compatible_operands(pair: tuple[Layout, Layout]) -> None:
    a, b = pair
    r = a.compose(b)
    assert r.size() == b.size()
    av = ref_values(a)
    assert ref_values(r) == [av[j] for j in ref_values(b)]
    assert len(r) == len(b)
    assert (a @ b) == r


@given(layouts(), any_layouts(max_modes=3))
@MANY
def test_compose_raises_or_is_right(a: Layout, b: Layout) -> None:
    try:
        r = a.compose(b)
    except ValueError as exc:
        assert repr(a) in str(exc) and repr(b) in str(exc)
        return
    av = ref_values(a)
    assert max(ref_values(b)) < len(av)
    assert ref_values(r) == [av[j] for j in ref_values(b)]


@given(layouts(), st.integers(1, 30))
@SETTINGS
def test_compose_with_int_means_compact(a: Layout, n: int) -> None:
    assume(n <= a.size())
    try:
        r = a.compose(n)
    except ValueError:
        return
    assert r.equivalent(a.compose(Layout(n, 1)))
    assert ref_values(r) == ref_values(a)[:n]


@given(compose_pairs(), compose_pairs())
@SETTINGS
def test_compose_by_mode(p: tuple[Layout, Layout], q: tuple[Layout, Layout]) -> None:
    a = make_layout(p[0], q[0])
    a0, a1 = a[0], a[1]  # make_layout unwraps single-mode layouts
    assert a0.equivalent(p[0]) and a1.equivalent(q[0])
    r = a.compose((p[1], q[1]))
    assert r == make_layout(a0.compose(p[1]), a1.compose(q[1]))
    assert r[0].equivalent(p[0].compose(p[1])) and r[1].equivalent(q[0].compose(q[1]))
    assert a.compose((p[1],)) == make_layout(a0.compose(p[1]), a1)
    assert a.compose((None, q[1])) == make_layout(a0, a1.compose(q[1]))


def test_compose_examples() -> None:
    assert Layout((4, 6)).compose(Layout((3, 2), (2, 1))) == Layout((3, 2), (2, 1))
    assert Layout((3, 4), (8, 1)).compose(Layout(8)) == Layout(((2, 4),), ((8, 1),))
    assert Layout((2, 6), (12, 1)).compose(4) == Layout(4, 1)  # ends inside a mode
    assert Layout(8, 2).compose(Layout(4, 0)) == Layout(4, 0)


# ---------------------------------------------------------------------- complement


@given(admissible_layouts(), st.integers(1, 400))
@MANY
def test_complement_disjoint_increasing_and_covering(a: Layout, cotarget: int) -> None:
    c = a.complement(cotarget)
    cv = ref_values(c)
    assert cv == sorted(cv) and len(set(cv)) == len(cv), "complement must be increasing"
    assert set(cv) & set(ref_values(a)) == {0}
    both = make_layout(c, a)
    bv = ref_values(both)
    assert len(set(bv)) == len(bv), "complement overlaps the layout"
    span = 1
    for s, d in sorted((m for m in a.modes if m[0] > 1), key=lambda m: m[1]):
        span = s * d
    # the pair covers an initial segment containing [0, cotarget), minimally
    assert set(bv) == set(range(len(bv)))
    assert len(bv) >= cotarget
    assert len(bv) < cotarget + span or c.size() == 1
    if cotarget % span == 0:
        assert set(bv) == set(range(cotarget))


@given(admissible_layouts())
@SETTINGS
def test_complement_default_cotarget_is_cosize(a: Layout) -> None:
    assert a.complement() == a.complement(a.cosize())


def test_complement_examples() -> None:
    assert Layout(4, 1).complement(24) == Layout(6, 4)
    assert Layout((2, 2), (8, 2)).complement(32) == Layout((2, 2, 2), (16, 4, 1))
    assert Layout(4, 1).complement(10) == Layout(3, 4)  # ceil(10 / 4)
    assert Layout(4, 1).complement(4) == Layout(1, 0)


# ---------------------------------------------------------------------- inverses


@given(layouts())
@SETTINGS
def test_right_inverse(a: Layout) -> None:
    r = a.right_inverse()
    av = ref_values(a)
    rv = ref_values(r)
    assert [av[j] for j in rv] == list(range(r.size()))
    if a.is_injective():
        # largest: the right inverse stops only where the image has a hole
        assert r.size() not in set(av)


@given(admissible_layouts())
@SETTINGS
def test_left_inverse(a: Layout) -> None:
    inv = a.left_inverse()
    iv = ref_values(inv)
    assert [iv[v] for v in ref_values(a)] == list(range(a.size()))


# ---------------------------------------------------------------------- divide, product


@st.composite
def divide_pairs(draw: st.DrawFn) -> tuple[Layout, Layout]:
    """(A, tiler): a tiler that is a permuted strided sub-layout of a compact layout of size(A)."""
    a = draw(layouts())
    digits = draw(factorisations(a.size())) if a.size() > 1 else []
    strides = [math.prod(digits[k + 1 :]) for k in range(len(digits))]
    chosen = [(s, d) for s, d in zip(digits, strides) if draw(st.booleans())]
    tiler = draw(nested_layouts(draw(st.permutations(chosen))))
    return a, tiler


@given(divide_pairs())
@MANY
def test_logical_divide_rows_are_tiles(pair: tuple[Layout, Layout]) -> None:
    a, b = pair
    compact = logical_divide(Layout(a.size()), b)  # a compact layout is always divisible
    assert ref_values(compact) == [
        r + t for r in ref_values(b.complement(a.size())) for t in ref_values(b)
    ]
    try:
        d = logical_divide(a, b)
    except ValueError as exc:  # only a divisibility conflict with a's modes may refuse
        assert "cannot compose" in str(exc)
        return
    rest = b.complement(a.size())
    assert len(d) == 2
    assert d.size() == a.size()
    av = ref_values(a)
    rv, bv = ref_values(rest), ref_values(b)
    assert ref_values(d[1]) == [av[j] for j in bv]
    assert ref_values(d) == [av[r + t] for r in rv for t in bv]
    # rows partition the layout's index set: each row is one tile
    rows = [sorted(d((i, j)) for j in range(b.size())) for i in range(rest.size())]
    assert sorted(x for row in rows for x in row) == sorted(av)


@given(layouts(), st.integers(1, 6))
@SETTINGS
def test_logical_divide_compact_layouts(a: Layout, tile: int) -> None:
    assume(a.size() % tile == 0)
    c = Layout(a.size())
    d = logical_divide(c, tile)
    assert d.shape == (a.size() // tile, tile)
    assert d.equivalent(Layout((a.size() // tile, tile)))
    if a.size() // tile > 1 and tile > 1:
        assert d == Layout((a.size() // tile, tile))


@given(admissible_layouts(max_modes=3), layouts())
@SETTINGS
def test_logical_product_values(a: Layout, b: Layout) -> None:
    assume(a.size() * b.cosize() <= 2000)
    try:
        p = logical_product(a, b)
    except ValueError as exc:
        assert "overlap" in str(exc) or "cannot compose" in str(exc)
        assume(False)
        return
    c = a.complement(a.size() * b.cosize())
    cv, av, bv = ref_values(c), ref_values(a), ref_values(b)
    assert len(p) == 2 and p.size() == a.size() * b.size()
    assert ref_values(p) == [av[i] + cv[bv[j]] for j in range(b.size()) for i in range(a.size())]
    for j in range(b.size()):
        for i in range(a.size()):
            assert p((j, i)) == a(i) + c(b(j))
    if b.is_injective():
        assert p.is_injective()


def test_logical_product_int_tiler_is_a_product() -> None:
    assert logical_product(Layout(4), 3) == Layout((3, 4), (4, 1))
    assert logical_product(Layout((2, 2), (4, 1)), Layout(2)) == Layout((2, (2, 2)), (2, (4, 1)))


def test_logical_divide_examples() -> None:
    assert logical_divide(Layout(24), Layout(4)) == Layout((6, 4), (4, 1))
    assert logical_divide(Layout(24), 4) == Layout((6, 4))
    assert logical_divide(Layout(24), Layout(4, 6)) == Layout((6, 4), (1, 6))


# ---------------------------------------------------------------------- errors


def _raises(exc: type[Exception], fn: Callable[[], object], *needles: str) -> str:
    with pytest.raises(exc) as info:
        fn()
    msg = str(info.value)
    for needle in needles:
        assert needle in msg, msg
    return msg


def test_error_compose_stride_divisibility() -> None:
    a, b = Layout((3, 4), (1, 3)), Layout(2, 6)
    _raises(ValueError, lambda: a.compose(b), "(3,4):(1,3)", "2:6", "stride divisibility")


def test_error_compose_shape_divisibility() -> None:
    a = Layout((2, 3), (6, 1))
    _raises(ValueError, lambda: a.compose(Layout(4)), "(2,3):(6,1)", "4:1", "shape divisibility")
    _raises(ValueError, lambda: a.compose(4), "shape divisibility")


def test_error_compose_domain() -> None:
    _raises(ValueError, lambda: Layout(6).compose(Layout(4, 2)), "6:1", "4:2", "domain")


def test_error_compose_overlapping_modes() -> None:
    b = Layout((2, 2), (1, 1))
    _raises(ValueError, lambda: Layout(8).compose(b), "8:1", "(2,2):(1,1)", "overlap")


def test_error_compose_type() -> None:
    _raises(TypeError, lambda: Layout(8).compose("4:1"), "compose")  # type: ignore[arg-type]
    _raises(TypeError, lambda: Layout(8).compose(2.0), "compose")  # type: ignore[arg-type]


def test_error_complement_not_injective() -> None:
    a = Layout((2, 2), (1, 1))
    _raises(ValueError, lambda: a.complement(8), "(2,2):(1,1)", "not injective")
    _raises(ValueError, lambda: Layout(4, 0).complement(8), "4:0", "not injective")


def test_error_complement_not_admissible() -> None:
    a = Layout((2, 2), (3, 1))  # injective (0,1,3,4) but the strides do not nest
    assert a.is_injective() and not a.is_admissible()
    _raises(ValueError, lambda: a.complement(12), "(2,2):(3,1)", "not admissible")


def test_error_complement_cotarget() -> None:
    _raises(ValueError, lambda: Layout(4).complement(0), "cotarget")
    _raises(TypeError, lambda: Layout(4).complement(2.0), "cotarget")  # type: ignore[arg-type]
    _raises(TypeError, lambda: Layout(4).complement(True), "cotarget")


def test_error_left_inverse_not_admissible() -> None:
    _raises(ValueError, lambda: Layout((2, 2), (3, 1)).left_inverse(), "(2,2):(3,1)", "admissible")
    _raises(ValueError, lambda: Layout((2, 2), (1, 1)).left_inverse(), "injective")


def test_error_logical_divide_does_not_tile() -> None:
    _raises(ValueError, lambda: logical_divide(Layout(6), 4), "6:1", "4:1", "tile")


@pytest.mark.parametrize("shape", [0, -1, (2, 0), (2, (3, -4))])
def test_error_non_positive_sizes(shape: Any) -> None:
    _raises(ValueError, lambda: Layout(shape), "non-positive")


def test_error_negative_stride() -> None:
    _raises(ValueError, lambda: Layout(4, -1), "negative")


@pytest.mark.parametrize(
    ("shape", "stride"), [((2, 3), 1), ((2, 3), (1, 2, 3)), ((2, (3, 4)), (1, 2, 3)), (4, (1,) * 2)]
)
def test_error_structure_mismatch(shape: Any, stride: Any) -> None:
    _raises(ValueError, lambda: Layout(shape, stride), "same structure")


@pytest.mark.parametrize(
    "bad", [2.0, "4", True, np.True_, (2, 3.0), (2, "3"), (False,), None, {2: 3}]
)
def test_error_type_of_sizes(bad: Any) -> None:
    _raises(TypeError, lambda: Layout(bad), "Layout shape")


@pytest.mark.parametrize("bad", [2.0, "4", True, (2, 3.0), (2, "3"), (False, 1), {2: 3}])
def test_error_type_of_strides(bad: Any) -> None:
    shape = (2, 3) if isinstance(bad, tuple) else 4
    _raises(TypeError, lambda: Layout(shape, bad), "Layout stride")


def test_error_call() -> None:
    lay = Layout((2, 3))
    _raises(ValueError, lambda: lay(6), "out of range")
    _raises(ValueError, lambda: lay(-1), "out of range")
    _raises(ValueError, lambda: lay((1, 2, 0)), "does not match")
    _raises(ValueError, lambda: lay((2, 0)), "out of range")
    _raises(TypeError, lambda: lay(1.0), "coordinate")
    _raises(TypeError, lambda: lay(True), "coordinate")
    _raises(IndexError, lambda: lay[2], "out of range")
    _raises(TypeError, lambda: lay["0"], "index")  # type: ignore[index]


def test_error_make_layout_and_equivalent_types() -> None:
    _raises(TypeError, lambda: make_layout(Layout(2), 3), "make_layout")  # type: ignore[arg-type]
    _raises(TypeError, lambda: Layout(2).equivalent(2), "equivalent")  # type: ignore[arg-type]
    _raises(TypeError, lambda: logical_divide(8, 2), "logical_divide")  # type: ignore[arg-type]
    _raises(TypeError, lambda: logical_product(8, 2), "logical_product")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- hostile input (issue 10)


def test_indices_never_wrap_around_int64() -> None:
    big = Layout((4,), (2**62,))
    assert [big(i) for i in range(4)] == [0, 2**62, 2**63, 3 * 2**62]  # exact, one by one
    with pytest.raises(ValueError, match=r"largest value 13835058055282163712 does not fit"):
        big.indices()
    edge = Layout((2,), (2**63 - 1,))  # the largest value that fits
    assert edge.indices().tolist() == [0, 2**63 - 1]
    with pytest.raises(ValueError, match="does not fit in int64"):
        Layout((2, 2), (2**62, 2**62)).indices()


def test_indices_refuses_more_than_max_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    import meshlayout.inttuple as inttuple

    with pytest.raises(ValueError, match=r"would hold 1099511627776 elements.*MAX_ELEMENTS"):
        Layout((2**20, 2**20)).indices()
    monkeypatch.setattr(inttuple, "MAX_ELEMENTS", 11)
    assert Layout(11).indices().size == 11
    with pytest.raises(ValueError, match="would hold 12 elements, more than the limit"):
        Layout((3, 4), (1, 3)).indices()


def test_deep_nesting_is_a_value_error_not_a_recursion_error() -> None:
    deep: Any = 4
    for _ in range(600):
        deep = (deep,)
    with pytest.raises(ValueError, match="nested more than 64 levels deep"):
        Layout(deep)
    with pytest.raises(ValueError, match="nested more than 64 levels deep"):
        Layout(4, deep)
    with pytest.raises(ValueError, match="cannot parse layout"):
        Layout.parse("(" * 600 + "4" + ",)" * 600)
    ok: Any = 4
    for _ in range(60):
        ok = (ok,)
    assert Layout(ok).size() == 4


def test_numpy_arrays_are_accepted_as_shapes_and_strides() -> None:
    assert Layout(np.array([2, 3])) == Layout((2, 3))
    assert Layout(np.array([2, 3]), np.array([1, 2])) == Layout((2, 3), (1, 2))
    assert Layout(np.array(5, dtype=np.int64).reshape(1)) == Layout(5)
    with pytest.raises(TypeError, match="must hold ints, got a numpy array of float64"):
        Layout(np.array([2.0, 3.0]))
    with pytest.raises(TypeError, match="array of bool"):
        Layout(np.array([True]))
