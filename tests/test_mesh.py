"""Mesh and RankMap: documented examples, every error case, value semantics, repr."""

from __future__ import annotations

import pickle
import re

import numpy as np
import pytest

from meshlayout import Layout, Mesh, RankMap

PDT = {"pp": 2, "dp": 2, "tp": 4}


# ---------------------------------------------------------------------- construction


def test_construction_forms_agree() -> None:
    by_map = Mesh(PDT)
    by_names = Mesh((2, 2, 4), ("pp", "dp", "tp"))
    by_ranks = Mesh((2, 2, 4), ("pp", "dp", "tp"), ranks=range(16))
    by_nested = Mesh((2, 2, 4), ("pp", "dp", "tp"), ranks=np.arange(16).reshape(2, 2, 4).tolist())
    by_array = Mesh((2, 2, 4), ("pp", "dp", "tp"), ranks=np.arange(16).reshape(2, 2, 4))
    assert by_map == by_names == by_ranks == by_nested == by_array
    assert len({hash(m) for m in (by_map, by_names, by_ranks, by_nested, by_array)}) == 1
    assert by_map.rank_map.is_range and by_nested.rank_map.is_range


def test_properties() -> None:
    m = Mesh(PDT)
    assert m.shape == (2, 2, 4)
    assert m.names == ("pp", "dp", "tp")
    assert m.ndim == 3
    assert m.size() == 16
    assert m.size("tp") == m.size(2) == m.size(-1) == 4
    assert m.axes == (Layout(2, 8), Layout(2, 4), Layout(4, 1))
    assert m.layout == Layout((2, 2, 4), (8, 4, 1))
    assert m.num_submeshes == 1
    assert m.dim_index("dp") == m.dim_index(1) == m.dim_index(-2) == 1
    assert m.dim_index(np.int64(2)) == 2
    assert Mesh((3, 2)).names == ("dim0", "dim1")


def test_offset_and_stepped_ranges_are_not_materialised() -> None:
    m = Mesh({"dp": 1024, "tp": 1024}, ranks=range(2**20, 2**21))
    assert m.rank_map.is_range
    assert m.rank_map.as_range() == range(2**20, 2**21)
    assert m.coordinate(2**20 + 1025) == (1, 1)
    assert m.coordinate(5) is None
    stepped = Mesh((4,), ranks=[1, 4, 7, 10])
    assert stepped.rank_map.as_range() == range(1, 13, 3)
    assert stepped.group(7, 0) == (1, 4, 7, 10)
    assert stepped.coordinate(5) is None


def test_queries_on_a_small_mesh() -> None:
    m = Mesh(PDT)
    assert m.coordinate(13) == (1, 1, 1)
    assert m.local_rank(13, "tp") == 1
    assert m.group(13, "tp") == (12, 13, 14, 15)
    assert m.group(13, "dp") == (9, 13)
    assert m.group(13, "pp") == (5, 13)
    assert m["pp", "tp"].group(13, "tp") == (12, 13, 14, 15)
    np.testing.assert_array_equal(m["tp", "pp"].submesh(6), [[4, 12], [5, 13], [6, 14], [7, 15]])
    np.testing.assert_array_equal(
        m.groups("dp"),
        np.array([[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]]),
    )
    assert m["dp"].num_submeshes == 8
    assert m.submeshes().shape == (1, 2, 2, 4)
    assert 15 in m and 16 not in m and "3" not in m and -1 not in m


def test_permuted_rank_map_group_is_in_coordinate_order() -> None:
    m = Mesh({"dp": 2, "tp": 2}, ranks=[[3, 1], [2, 0]])
    for rank, coord in {3: (0, 0), 1: (0, 1), 2: (1, 0), 0: (1, 1)}.items():
        assert m.coordinate(rank) == coord
        assert tuple(m.local_rank(rank, d) for d in ("dp", "tp")) == coord
        for d in range(2):
            assert m.group(rank, d)[coord[d]] == rank
    assert m.group(1, "tp") == (3, 1)
    assert m.group(1, "dp") == (1, 0)


def test_unflatten_then_flatten_is_identity_and_compact_splits_never_raise() -> None:
    m = Mesh({"pp": 2, "dp": 12, "tp": 4})
    for sizes in [(12,), (2, 6), (6, 2), (3, 4), (4, 3), (2, 3, 2), (1, 12, 1)]:
        names = tuple(f"s{i}" for i in range(len(sizes)))
        u = m.unflatten("dp", sizes, names)
        assert u.shape == (2, *sizes, 4)
        assert u[names].flatten("dp") == m["dp"]
    # a transposed flatten splits only along its own modes
    t = m["tp", "pp"].flatten("tp_pp")  # (4,2):(1,48)
    assert t.unflatten(0, (4, 2), ("a", "b")) == Mesh.concat([m["tp"], m["pp"]]).unflatten(
        "tp", (4,), ("a",)
    ).unflatten("pp", (2,), ("b",))
    assert t.unflatten(0, (2, 4), ("a", "b")).group(0, "b") == (0, 48, 1, 49)
    with pytest.raises(ValueError, match="cannot unflatten dim 'ba'"):
        Mesh({"a": 2, "b": 3})["b", "a"].flatten("ba").unflatten(0, (2, 3), ("x", "y"))


def test_concat_of_slices_equals_slice() -> None:
    m = Mesh({"pp": 2, "dp": 2, "cp": 3, "tp": 4}, ranks=range(100, 148))
    assert Mesh.concat([m["pp"], m["tp"]]) == m["pp", "tp"]
    assert hash(Mesh.concat([m["tp"], m["dp", "pp"]])) == hash(m["tp", "dp", "pp"])
    assert Mesh.concat([m["dp", "cp"].flatten("x"), m["tp"]]) == Mesh.concat(
        [m["dp", "cp"], m["tp"]]
    ).unflatten("tp", (4,), ("tp",))["dp", "cp", "tp"].flatten("x").unflatten(
        "x", (6, 4), ("x", "tp")
    )
    assert Mesh.concat([m]) == m


# ---------------------------------------------------------------------- equality, hash, pickle


def test_equal_meshes_from_different_routes() -> None:
    m = Mesh(PDT)
    assert m["pp", "tp"]["tp"] == m["tp"]
    assert m["tp", "pp"]["pp", "tp"] == m["pp", "tp"]
    assert Mesh((2, 4)).flatten("dim0") == Mesh((8,))
    assert m.flatten("w").unflatten("w", (2, 2, 4), ("pp", "dp", "tp")) == m
    assert m["dp", "tp"].flatten().unflatten(0, (2, 4), ("dp", "tp")) == m["dp", "tp"]
    assert Mesh((4,), ranks=[0, 2, 4, 6]) == Mesh((4,), ranks=range(0, 8, 2))
    assert Mesh((2,), ranks=[5, 3]) == Mesh((2,), ranks=np.array([5, 3]))
    assert RankMap([0, 2, 4]) == RankMap(range(0, 6, 2))
    assert hash(RankMap([0, 2, 4])) == hash(RankMap(range(0, 6, 2)))
    assert RankMap([3, 1, 2]) == RankMap(np.array([3, 1, 2]))
    assert hash(RankMap([3, 1, 2])) == hash(RankMap((3, 1, 2)))


def test_unequal_meshes() -> None:
    m = Mesh(PDT)
    assert m != Mesh({"pp": 2, "dp": 2, "xx": 4})
    assert m != Mesh(PDT, ranks=range(1, 17))
    assert m["pp", "tp"] != m["tp", "pp"]
    assert m["tp"] != Mesh({"tp": 4})  # a family of 4 groups vs a root mesh
    assert m != "Mesh(pp=2, dp=2, tp=4)"
    assert RankMap([3, 1, 2]) != RankMap([3, 2, 1])
    assert RankMap(range(4)) != RankMap([0, 1, 3, 2])


def test_pickle_round_trip_and_size() -> None:
    big = Mesh({"pp": 2, "dp_replicate": 8, "dp_shard": 32, "cp": 16, "tp": 128})
    derived = [big, big["tp", "pp"], big["dp_replicate", "dp_shard", "cp"].flatten(), big["cp"]]
    for m in derived:
        data = pickle.dumps(m)
        assert len(data) < 2048, f"{m!r} pickles to {len(data)} bytes"
        back = pickle.loads(data)
        assert back == m and hash(back) == hash(m)
        assert back.coordinate(777_777) == m.coordinate(777_777)
    perm = Mesh({"dp": 2, "tp": 3}, ranks=[5, 0, 4, 1, 3, 2])
    a, b = pickle.loads(pickle.dumps([perm, perm["tp"]]))
    assert a == perm and b == perm["tp"] and hash(b) == hash(perm["tp"])
    assert a.rank_map is b.rank_map  # sharing survives pickling
    assert pickle.loads(pickle.dumps(perm.rank_map)) == perm.rank_map


def test_meshes_are_immutable() -> None:
    m = Mesh(PDT)
    with pytest.raises(AttributeError):
        m._names = ("a",)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        m.rank_map._n = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        Mesh((4,), ranks=[3, 1, 2, 0]).rank_map.to_numpy()[0] = 7


# ---------------------------------------------------------------------- errors


def test_unknown_name_is_a_keyerror_listing_valid_names() -> None:
    m = Mesh(PDT)
    calls = [
        lambda: m["xx"],
        lambda: m["pp", "xx"],
        lambda: m.size("xx"),
        lambda: m.local_rank(0, "xx"),
        lambda: m.group(0, "xx"),
        lambda: m.groups("xx"),
        lambda: m.unflatten("xx", (1,), ("y",)),
    ]
    for call in calls:
        with pytest.raises(KeyError, match=re.escape("['pp', 'dp', 'tp']")):
            call()
    with pytest.raises(KeyError, match="out of range"):
        m[3]
    with pytest.raises(KeyError, match="out of range"):
        m.group(0, -4)


@pytest.mark.parametrize(
    ("make", "pattern"),
    [
        (lambda: Mesh((2, 2), ("a", "a")), r"unique; \['a'\] repeat"),
        (lambda: Mesh(PDT).unflatten("tp", (2, 2), ("pp", "x")), r"\['pp'\] repeat"),
        (lambda: Mesh(PDT).unflatten("tp", (2, 2), ("x", "x")), r"\['x'\] repeat"),
        (lambda: Mesh.concat([Mesh(PDT)["tp"], Mesh(PDT)["tp", "dp"]]), r"\['tp'\] repeat"),
        (lambda: Mesh(PDT)["tp", 2], "the same dim twice"),
        (lambda: Mesh(PDT).unflatten("tp", (3, 2), ("a", "b")), r"size 4 into \(3, 2\)"),
        (lambda: Mesh(PDT).unflatten("tp", (8,), ("a",)), r"size 4 into \(8,\)"),
        (lambda: Mesh(PDT).unflatten("tp", (2, 2), ("a",)), "one name per size"),
        (lambda: Mesh((2, 0)), r"sizes must be >= 1, got \[2, 0\]"),
        (lambda: Mesh({"a": -1}), r"sizes must be >= 1, got \[-1\]"),
        (lambda: Mesh(()), "at least one dim"),
        (lambda: Mesh(PDT).unflatten("tp", (0, 4), ("a", "b")), "must be >= 1, got 0"),
        (lambda: Mesh(PDT).unflatten("tp", (-2, -2), ("a", "b")), "must be >= 1, got -2"),
        (lambda: Mesh((2, 2), ranks=[0, 1, 1, 2]), r"distinct, but \[1\] appear"),
        (lambda: Mesh((2, 2), ranks=[9, 10**9, 9, 10**9]), r"\[9, 1000000000\] appear"),
        (lambda: Mesh((2, 2), ranks=[0, -1, 2, 3]), r"non-negative, got \[-1\]"),
        (lambda: Mesh((4,), ranks=range(-2, 2)), "non-negative"),
        (lambda: Mesh((2, 4), ranks=range(4)), "needs 8 ranks, but 4 were given"),
        (lambda: Mesh((2, 4), ranks=RankMap(range(16))), "needs 8 ranks, but 16"),
        (lambda: Mesh((2, 4), ranks=[[0, 1], [2, 3], [4, 5], [6, 7]]), r"shape \(4, 2\)"),
        (lambda: Mesh((2, 2), ranks=[[0, 1], [2]]), "ragged"),
        (lambda: Mesh((2,), ranks=[]), "at least one rank"),
        (
            lambda: Mesh.concat([Mesh(PDT)["pp", "dp"], Mesh(PDT)["tp", "dp"].flatten("x")]),
            "overlap",
        ),
        (
            lambda: Mesh.concat([Mesh(PDT)["tp"], Mesh(PDT, ranks=range(1, 17))["pp"]]),
            "same rank map",
        ),
        (lambda: Mesh.concat([]), "at least one mesh"),
        (
            lambda: Mesh._from_parts(("a", "b"), (Layout(2, 4), Layout(4, 1)), RankMap(range(4))),
            "needs a multiple of 8 ranks, but it has 4",
        ),
        (
            lambda: Mesh._from_parts(("a",), (Layout(4, 1),), RankMap(range(6))),
            "multiple of 4 ranks, but it has 6",
        ),
        (lambda: Mesh(PDT)[()], "zero dims"),
        (lambda: Mesh({"a": 2}, ("b",)), "not both"),
        (lambda: Mesh((2,), ("a", "b")), "2 names"),
        (lambda: Mesh((2,), ("not a name",)), "identifiers"),
    ],
)
def test_value_errors(make: object, pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    "make",
    [
        lambda: Mesh((2.0, 2)),  # type: ignore[arg-type]
        lambda: Mesh("22"),  # type: ignore[arg-type]
        lambda: Mesh((2,), ranks=[0.0, 1.0]),
        lambda: Mesh((2,), ranks="01"),
        lambda: Mesh(PDT)[1.0],  # type: ignore[index]
        lambda: Mesh(PDT).coordinate("1"),  # type: ignore[arg-type]
        lambda: Mesh(PDT).group(1.0, 0),  # type: ignore[arg-type]
        lambda: Mesh.concat([Mesh(PDT), "tp"]),  # type: ignore[list-item]
    ],
)
def test_type_errors(make: object) -> None:
    with pytest.raises(TypeError):
        make()  # type: ignore[operator]


@pytest.mark.parametrize(
    "mesh",
    [
        Mesh(PDT),
        Mesh(PDT, ranks=range(2048, 2064)),
        Mesh(PDT, ranks=range(3, 51, 3)),
        Mesh(PDT, ranks=np.random.default_rng(1).permutation(16) + 5),
        Mesh(PDT, ranks=np.random.default_rng(2).permutation(10**6)[:16]),  # sparse inverse
    ],
)
def test_rank_outside_the_mesh(mesh: Mesh) -> None:
    inside = set(mesh.rank_map)
    for rank in (0, 1, 4, 16, 2047, 2064, -1, -2049, 10**7, 2**70, -(2**70)):
        if rank in inside:
            continue
        assert rank not in mesh
        assert mesh.coordinate(rank) is None
        for view in (mesh, mesh["tp", "pp"], mesh.flatten()):
            for query in ("group", "local_rank"):
                with pytest.raises(ValueError, match=rf"{query}: rank {rank} is not in Mesh\("):
                    getattr(view, query)(rank, 0)
            with pytest.raises(ValueError, match=rf"submesh: rank {rank} is not in"):
                view.submesh(rank)
    for rank in inside:
        assert mesh.submesh(rank).shape == mesh.shape


# ---------------------------------------------------------------------- rank map


def test_rank_map_sequence_protocol() -> None:
    r = RankMap([3, 1, 2, 0])
    assert len(r) == 4 and list(r) == [3, 1, 2, 0] and r[-1] == 0 and r[1:3] == [1, 2]
    assert r.position(2) == 2 and r.position(7) is None and r.position(-1) is None
    assert not r.is_range and r.as_range() is None
    np.testing.assert_array_equal(r.take(np.array([0, 3])), [3, 0])
    s = RankMap(range(10, 20, 2))
    assert s[1] == 12 and s.position(14) == 2 and s.position(15) is None and 18 in s
    np.testing.assert_array_equal(s.take(np.array([4, 0])), [18, 10])
    np.testing.assert_array_equal(s.to_numpy(), np.arange(10, 20, 2))
    assert RankMap(range(5, -1, -1)).position(0) == 5
    assert RankMap([7]).as_range() == range(7, 8)
    with pytest.raises(IndexError):
        r[4]


def test_explicit_inverse_is_built_once_and_shared() -> None:
    perm = np.random.default_rng(3).permutation(4096)
    m = Mesh({"dp": 64, "tp": 64}, ranks=perm)
    assert m.rank_map._inverse is None  # lazy
    derived = [m["tp"], m["tp", "dp"], m.flatten(), m.unflatten("dp", (8, 8), ("a", "b"))]
    assert all(d.rank_map is m.rank_map for d in derived)
    m.coordinate(int(perm[5]))
    inverse = m.rank_map._inverse
    assert inverse is not None
    for d in derived:
        d.group(int(perm[77]), 0)
        assert d.rank_map._inverse is inverse
    again = Mesh({"dp": 64, "tp": 64}, ranks=m.rank_map)
    assert again.rank_map is m.rank_map


# ---------------------------------------------------------------------- repr


@pytest.mark.parametrize(
    ("mesh", "text"),
    [
        (Mesh(PDT), "Mesh(pp=2, dp=2, tp=4)"),
        (Mesh((2, 4)), "Mesh(dim0=2, dim1=4)"),
        (
            Mesh({"dp": 2, "tp": 4}, ranks=range(2048, 2056)),
            "Mesh(dp=2, tp=4, ranks=range(2048, 2056))",
        ),
        (Mesh({"dp": 2, "tp": 2}, ranks=[[3, 1], [2, 0]]), "Mesh(dp=2, tp=2, ranks=[3, 1, 2, 0])"),
        (
            Mesh({"dp": 64, "tp": 64}, ranks=np.arange(4096)[::-1].copy()),
            "Mesh(dp=64, tp=64, ranks=range(4095, -1, -1))",
        ),
        (
            Mesh({"dp": 64, "tp": 64}, ranks=np.r_[1, 0, 2:4096]),
            "Mesh(dp=64, tp=64, ranks=[1, 0, 2, 3, 4, 5, 6, 7, … (4096 ranks)])",
        ),
        (Mesh(PDT)["tp", "pp"], "Mesh(tp=4, pp=2; layout (4,2):(1,8); ranks range(0, 16))"),
        (Mesh(PDT)["tp"], "Mesh(tp=4; layout 4:1; ranks range(0, 16))"),
        (Mesh(PDT)["pp", "tp"].flatten(), "Mesh(pp_tp=8; layout (2,4):(8,1); ranks range(0, 16))"),
        (
            Mesh({"dp": 2, "tp": 2}, ranks=[[3, 1], [2, 0]])["tp"],
            "Mesh(tp=2; layout 2:1; ranks [3, 1, 2, 0])",
        ),
    ],
)
def test_repr(mesh: Mesh, text: str) -> None:
    assert repr(mesh) == text
    assert len(repr(mesh)) < 120


# ---------------------------------------------------------------------- group table, hosts, flatten(dims=)


def test_group_table_rows_are_the_submeshes_brute_force() -> None:
    m = Mesh(PDT, ranks=[5, 3, 1, 7, 0, 2, 4, 6, 8, 9, 10, 11, 15, 14, 13, 12])
    for key in ("tp", "dp", ("tp", "pp"), ("pp", "dp", "tp"), "pp"):
        view = m[key]
        table = view.group_table()
        assert table.shape == (view.num_submeshes, view.size())
        # brute force: every rank's submesh, flattened, once per distinct row
        rows = {tuple(view.submesh(r).reshape(-1).tolist()) for r in range(16)}
        assert sorted(map(tuple, table.tolist())) == sorted(rows)
        assert sorted(table.reshape(-1).tolist()) == list(range(16))


def test_hosts_spanned_brute_force_and_validation() -> None:
    m = Mesh({"dp": 4, "tp": 4}, ranks=range(100, 116))
    for per_host in range(1, 18):
        for name in ("dp", "tp"):
            got = m[name].hosts_spanned(per_host).tolist()
            want = [len({r // per_host for r in row}) for row in m[name].group_table().tolist()]
            assert got == want
    assert m["tp"].hosts_spanned(4).tolist() == [1, 1, 1, 1]
    assert m["dp"].hosts_spanned(np.int64(4)).tolist() == [4, 4, 4, 4]
    for huge in (2**63 - 1, 2**63, 2**64, np.uint64(2**64 - 1)):  # one host; no OverflowError
        assert m["dp"].hosts_spanned(huge).tolist() == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="ranks_per_host must be >= 1, got 0"):
        m.hosts_spanned(0)
    with pytest.raises(TypeError, match=r"ranks_per_host must be an int, got 1\.5"):
        m.hosts_spanned(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got True of type bool"):
        m.hosts_spanned(True)


def test_flatten_a_subset_of_dims() -> None:
    m = Mesh({"pp": 2, "dp": 2, "cp": 2, "tp": 2})
    assert m.flatten(dims=("dp", "cp")) == Mesh({"pp": 2, "dp_cp": 4, "tp": 2})
    assert m.flatten(dims=["pp", "dp", "cp", "tp"]) == m.flatten()
    assert m.flatten("x", dims=[0, -1]).names == ("x", "dp", "cp")
    assert m.flatten("x", dims=[-1, 0]).names == ("dp", "cp", "x")
    assert m.flatten("x", dims=[-1, 0]).group(1, "x") == (0, 8, 1, 9)
    assert m.flatten(dims="tp") == m
    fsdp = m.flatten("fsdp", dims=("cp", "dp"))
    assert fsdp.group(0, "fsdp") == (0, 4, 2, 6)
    for bad, exc, msg in (
        ((), ValueError, "at least one"),
        (("dp", "dp"), ValueError, "same dim twice"),
        (("dp", 1), ValueError, "same dim twice"),
        (("ep",), KeyError, "unknown mesh dim 'ep'"),
        ((7,), KeyError, "out of range"),
        ((1.5,), TypeError, "1.5"),
    ):
        with pytest.raises(exc, match=msg):
            m.flatten(dims=bad)
    with pytest.raises(ValueError, match="unique"):
        m.flatten("pp", dims=("dp", "cp"))


# ---------------------------------------------------------------------- hostile input (issue 10)


def test_rank_map_index_and_position_reject_non_ints_naming_the_value() -> None:
    with pytest.raises(TypeError, match=r"got 1\.5 of type float"):
        RankMap(range(4))[1.5]  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="got True of type bool"):
        RankMap(range(4))[True]  # type: ignore[call-overload]
    assert RankMap(range(4))[np.int64(-1)] == 3
    explicit = RankMap([3, 1, 2, 0])
    with pytest.raises(TypeError, match=r"rank must be an int, got 1\.5 of type float"):
        explicit.position(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"rank must be an int, got nan"):
        RankMap(range(4)).position(float("nan"))  # type: ignore[arg-type]
    assert explicit.position(np.uint64(2)) == 2
    assert explicit.position(2**100) is None and RankMap(range(4)).position(2**100) is None
    assert 1.5 not in explicit and True not in explicit and 2**100 not in explicit


def test_rank_map_names_huge_ranks_with_their_true_value() -> None:
    big = 2**63 + 5
    with pytest.raises(ValueError, match=str(big)):
        RankMap(np.array([big, 1], dtype=np.uint64))
    with pytest.raises(ValueError, match=str(2**70)):
        RankMap([2**70, 1])
    with pytest.raises(ValueError, match=f"reaches {2**63 + 4}"):
        RankMap(range(2**63 - 5, 2**63 + 5))
    assert RankMap(np.array([2**63 - 1, 0], dtype=np.uint64))[0] == 2**63 - 1
    with pytest.raises(TypeError, match="got None of type NoneType"):
        RankMap([1, None])
    with pytest.raises(ValueError, match="ragged"):
        RankMap([[1, 2], [3]])


def test_world_sizes_beyond_int64_are_value_errors_not_overflow() -> None:
    from meshlayout.rank_map import MAX_WORLD

    assert MAX_WORLD == 2**63 - 1
    with pytest.raises(ValueError, match=r"range\(0, 100000000000000000000\) holds 10{20} ranks"):
        RankMap(range(0, 10**20))
    with pytest.raises(ValueError, match="9223372036854775808 positions, more than MAX_WORLD"):
        Mesh({"a": 2**63})
    with pytest.raises(ValueError, match="more than MAX_WORLD"):
        Mesh({"a": 2**62, "b": 2})
    top = RankMap(range(2**63 - 1))
    assert len(top) == 2**63 - 1 and top[-1] == 2**63 - 2 and top.position(2**63 - 2) == 2**63 - 2
    assert (2**63 - 1) % (7 * 73) == 0
    edge = Mesh({"a": (2**63 - 1) // (7 * 73), "b": 7, "c": 73})  # exactly MAX_WORLD ranks
    last = 2**63 - 2
    assert edge.coordinate(last) == ((2**63 - 1) // (7 * 73) - 1, 6, 72)
    assert edge.group(last, "b") == tuple(last - 73 * k for k in range(6, -1, -1))
    assert edge.local_rank(last, "a") == (2**63 - 1) // (7 * 73) - 1
    with pytest.raises(ValueError, match="would hold 18049651735527937 elements"):
        edge.group(5, "a")


def test_whole_world_answers_refuse_past_max_elements(monkeypatch: pytest.MonkeyPatch) -> None:
    import meshlayout.inttuple as inttuple

    m = Mesh((1048576, 1048576))  # 2**40 ranks: building and per-rank queries are fine
    assert m.group(2**40 - 1, 0)[:2] == (1048575, 2 * 1048576 - 1)
    for call in (lambda: m.groups(0), m.submeshes, m.group_table, lambda: m.hosts_spanned(8)):
        with pytest.raises(ValueError, match=r"1099511627776 elements.*MAX_ELEMENTS = 134217728"):
            call()
    with pytest.raises(ValueError, match="1099511627776 elements"):
        m.rank_map.to_numpy()
    with pytest.raises(ValueError, match="1099511627776 elements"):
        m.flatten().group(0, 0)
    monkeypatch.setattr(inttuple, "MAX_ELEMENTS", 16)
    small = Mesh({"a": 4, "b": 4})
    assert small.groups("a").shape == (4, 4)
    with pytest.raises(ValueError, match="would hold 32 elements"):
        Mesh({"a": 4, "b": 8}).group_table()


def test_messages_name_the_bad_argument() -> None:
    with pytest.raises(TypeError, match=r"Mesh\.concat takes a sequence of Mesh objects, got 5"):
        Mesh.concat(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got Mesh"):
        Mesh.concat(Mesh(PDT))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes Mesh objects, got 'tp' of type str"):
        Mesh.concat(["tp"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"unflatten sizes must be a sequence of ints, got 4"):
        Mesh({"a": 4}).unflatten("a", 4, ("x",))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"unflatten size must be an int, got 2\.0"):
        Mesh({"a": 4}).unflatten("a", (2.0, 2), ("x", "y"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unflatten names must be a sequence of str, got 7"):
        Mesh({"a": 4}).unflatten("a", (4,), 7)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"mesh size must be an int, got nan"):
        Mesh((2, float("nan")))  # type: ignore[arg-type]
