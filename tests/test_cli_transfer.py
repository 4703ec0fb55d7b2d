"""``meshlayout transfer``: model tensor lists, placement rules, the plan report, errors, docs.

The numbers are checked against a brute-force reference that materialises every
rank's element set with tests/sharding_reference.py (no meshlayout sharding code)
and counts intersections: bytes a destination rank lacks are moved, bytes it
already holds are kept, each source rank's share of a pair is bounded by what it
holds. Inputs are real files written by the real clients (safetensors'
``save_file``, ``torch.distributed.checkpoint.save``).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shlex
import struct
import xml.etree.ElementTree as ET
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshlayout.cli import main
from meshlayout.cli.args import ArgError, parse_placements, parse_size
from meshlayout.cli.model_tensors import (
    DTYPES,
    TensorInfo,
    dtype_name,
    json_tensors,
    read_tensors,
    safetensors_tensors,
)
from meshlayout.cli.rules import parse_rules, rule_for
from sharding_reference import all_coords, reference_indices

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LLAMA = DOCS / "llama-200m-tensors.json"
NS = "{http://www.w3.org/2000/svg}"

# A small model with uneven sizes, mixed dtypes, a 1-D norm, a 0-d scalar.
MODEL = [
    {"name": "emb.weight", "shape": [7, 4], "dtype": "float32"},
    {"name": "layers.0.q.weight", "shape": [6, 4], "dtype": "float32"},
    {"name": "layers.0.o.weight", "shape": [4, 6], "dtype": "bfloat16"},
    {"name": "layers.0.norm.weight", "shape": [5], "dtype": "float32"},
    {"name": "layers.1.q.weight", "shape": [5, 3], "dtype": "float16"},
    {"name": "head.bias", "shape": [3], "dtype": "float32"},
    {"name": "scale", "shape": [], "dtype": "float32"},
]
SRC_RULES = "*.q.weight,emb.weight: SS(0,2),S(0); *.o.weight: S(0),S(1); scale: R,R"
DST_RULES = "*.q.weight,emb.weight: S(0); *.o.weight: S(1)"


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def write_json(path: Path, value: object) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def small_argv(model: Path, *extra: str) -> list[str]:
    """FSDP over TP on dp=3, tp=2 (ranks 0-5, uneven, strided) -> TP 2 on ranks 4-5."""
    return [
        "transfer",
        str(model),
        "--src-mesh",
        "dp=3,tp=2",
        "--src-ranks",
        "0:6",
        "--src-rules",
        SRC_RULES,
        "--src-default",
        "S(0),R",
        "--dst-mesh",
        "tp=2",
        "--dst-ranks",
        "4:6",
        "--dst-rules",
        DST_RULES,
        *extra,
    ]


# ---------------------------------------------------------------------- the reference
def first_match(rules: list[tuple[list[str], str]], default: str, name: str) -> str:
    """The placements text of the first rule with a matching pattern (plain fnmatch loop)."""
    for patterns, placements in rules:
        if any(fnmatchcase(name, p) for p in patterns):
            return placements
    return default


def held(
    shape: list[int], sizes: list[int], ranks: list[int], placements: str
) -> dict[int, set[int]]:
    """rank -> flat indices of the global tensor it holds (brute force)."""
    flat = np.arange(math.prod(shape)).reshape(shape)
    out = {}
    for k, coord in enumerate(all_coords(sizes)):
        idx = reference_indices(shape, sizes, parse_placements(placements), coord)
        out[ranks[k]] = set(flat[np.ix_(*idx)].reshape(-1).tolist()) if idx else {0}
    return out


def reference(
    model: list[dict[str, Any]],
    src: tuple[list[int], list[int], list[tuple[list[str], str]], str],
    dst: tuple[list[int], list[int], list[tuple[list[str], str]], str],
    wire: str | None = None,
) -> dict[str, Any]:
    """Bytes moved, kept, received per rank, per-pair bounds and gather-then-broadcast."""
    moved = kept = gather = 0
    recv: dict[int, int] = {}
    kept_at: dict[int, int] = {}
    pair_bound: dict[tuple[int, int], int] = {}
    per_tensor: dict[str, int] = {}
    placements = {}
    for t in model:
        item = DTYPES[wire or t["dtype"]]
        shape = t["shape"]
        numel = math.prod(shape)
        sp = first_match(src[2], src[3], t["name"])
        dp = first_match(dst[2], dst[3], t["name"])
        placements[t["name"]] = (sp, dp)
        s_held = held(shape, src[0], src[1], sp)
        d_held = held(shape, dst[0], dst[1], dp)
        tensor_moved = 0
        for d, need in d_held.items():
            own = s_held.get(d, set())
            lack = need - own
            tensor_moved += len(lack) * item
            kept += len(need & own) * item
            kept_at[d] = kept_at.get(d, 0) + len(need & own) * item
            recv[d] = recv.get(d, 0) + len(lack) * item
            for s, has in s_held.items():
                if s != d and lack & has:
                    pair_bound[s, d] = pair_bound.get((s, d), 0) + len(lack & has) * item
        moved += tensor_moved
        per_tensor[t["name"]] = tensor_moved
        lacking = sum(numel - len(h) for h in s_held.values())
        outside = len(set(d_held) - set(s_held))
        gather += (lacking + numel * outside) * item
    return {
        "moved": moved,
        "kept": kept,
        "kept_at": {d: n for d, n in sorted(kept_at.items()) if n},
        "recv": recv,
        "pair_bound": pair_bound,
        "per_tensor": per_tensor,
        "gather": gather,
        "placements": placements,
    }


def _rules(text: str) -> list[tuple[list[str], str]]:
    out = []
    for part in text.split(";"):
        patterns, _, placements = part.rpartition(":")
        out.append(([p.strip() for p in patterns.split(",")], placements.strip()))
    return out


SMALL_SRC = ([3, 2], list(range(6)), _rules(SRC_RULES), "S(0),R")
SMALL_DST = ([2], [4, 5], _rules(DST_RULES), "R")


# ---------------------------------------------------------------------- sizes
def test_parse_size_units() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("256MiB") == 256 * 2**20
    assert parse_size("256 mib") == 256 * 2**20
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size("2GB") == 2 * 10**9
    assert parse_size("3KB") == 3000 and parse_size("3KiB") == 3072
    assert parse_size("7B") == 7 and parse_size("1TiB") == 2**40
    assert parse_size("0.5KiB") == 512


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "is not a size"),
        ("MiB", "is not a size"),
        ("-1", "is not a size"),
        ("1e3", "is not a size"),
        ("nan", "is not a size"),
        ("12 parsecs", "unknown unit 'parsecs'"),
        ("0", "at least 1 bytes"),
        ("1.5", "not a whole number of bytes"),
        ("0.1KiB", "not a whole number of bytes"),
        ("٣", "is not a size"),
        ("9" * 30 + "GiB", "more than 9223372036854775807"),
        ("9" * 50, "is not a size"),
    ],
)
def test_parse_size_errors(text: str, message: str) -> None:
    with pytest.raises(ArgError, match=re.escape(message)) as info:
        parse_size(text, "--bucket")
    assert str(info.value).startswith("--bucket: ")


@given(st.integers(1, 2**32), st.sampled_from(["", "B", "KiB", "MiB", "GiB", "KB", "MB", "GB"]))
@settings(max_examples=200, deadline=None)
def test_parse_size_round_trips(n: int, unit: str) -> None:
    scale = {"": 1, "B": 1, "KiB": 1024, "MiB": 2**20, "GiB": 2**30}.get(unit) or {
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
    }[unit]
    assert parse_size(f"{n}{unit}") == n * scale


# ---------------------------------------------------------------------- tensor lists
def test_dtype_names() -> None:
    assert dtype_name("BF16") == dtype_name("bf16") == dtype_name("torch.bfloat16") == "bfloat16"
    assert dtype_name("F8_E4M3") == "float8_e4m3fn" and dtype_name("BOOL") == "bool"
    for bad in ("float7", "", "F4", "torch.", "x" * 100):
        with pytest.raises(ValueError, match="dtype"):
            dtype_name(bad)


def test_json_list_and_map(tmp_path: Path) -> None:
    want = tuple(TensorInfo(t["name"], tuple(t["shape"]), t["dtype"]) for t in MODEL)
    assert json_tensors(write_json(tmp_path / "l.json", MODEL)) == want
    as_map = {t["name"]: {"shape": t["shape"], "dtype": t["dtype"]} for t in MODEL}
    assert json_tensors(write_json(tmp_path / "m.json", as_map)) == want
    assert read_tensors(tmp_path / "m.json") == ("json", want)


def test_safetensors_file_dir_and_index(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    a = {"w": np.zeros((3, 5), np.float32), "b": np.zeros((5,), np.float16)}
    b = {"x": np.zeros((2, 2, 2), np.int8), "flag": np.zeros((4,), np.bool_)}
    save_file(a, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(b, str(tmp_path / "model-00002-of-00002.safetensors"))
    one = safetensors_tensors(tmp_path / "model-00001-of-00002.safetensors")
    assert sorted(one, key=lambda t: t.name) == [
        TensorInfo("b", (5,), "float16"),
        TensorInfo("w", (3, 5), "float32"),
    ]
    kind, tensors = read_tensors(tmp_path)  # no index: every file
    assert kind == "safetensors"
    assert {t.name: (t.shape, t.dtype) for t in tensors} == {
        "w": ((3, 5), "float32"),
        "b": ((5,), "float16"),
        "x": ((2, 2, 2), "int8"),
        "flag": ((4,), "bool"),
    }
    # with an index, only the files it names (a stray consolidated file is ignored)
    save_file({"w": np.zeros((9,), np.float32)}, str(tmp_path / "consolidated.safetensors"))
    with pytest.raises(ValueError, match="'w' is stored in both"):
        read_tensors(tmp_path)
    weight_map = {"w": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors"}
    weight_map.update(x="model-00002-of-00002.safetensors", flag="model-00002-of-00002.safetensors")
    write_json(
        tmp_path / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map}
    )
    assert read_tensors(tmp_path) == ("safetensors", tensors)
    assert read_tensors(tmp_path / "model.safetensors.index.json") == ("safetensors", tensors)


def test_safetensors_header_agrees_with_safe_open(tmp_path: Path) -> None:
    """Our header reader and safetensors' own ``safe_open`` see the same names, shapes, dtypes."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    kinds = [((3, 5), np.float32), ((0, 4), np.float16), ((), np.int64), ((7,), np.uint8)]
    kinds += [((2, 3, 4), np.bool_), ((1,), np.float64), ((6, 1), np.int16)]
    arrays = {f"t{i}": np.zeros(shape, dtype) for i, (shape, dtype) in enumerate(kinds)}
    path = tmp_path / "m.safetensors"
    save_file(arrays, str(path), metadata={"format": "pt"})
    ours = {t.name: (t.shape, t.dtype) for t in safetensors_tensors(path)}
    with safe_open(str(path), framework="numpy") as f:
        theirs = {
            n: (tuple(f.get_slice(n).get_shape()), dtype_name(f.get_slice(n).get_dtype()))
            for n in f.keys()
        }
    assert ours == theirs and len(ours) == len(arrays)


def test_safetensors_header_checked_against_the_file_size(tmp_path: Path) -> None:
    """Only the header is read, but a file whose data is cut off is named, not planned."""
    from safetensors.numpy import save_file

    path = tmp_path / "big.safetensors"
    save_file({"w": np.ones((256, 256), np.float32)}, str(path))
    assert safetensors_tensors(path) == (TensorInfo("w", (256, 256), "float32"),)
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[: 8 + n])
    with pytest.raises(ValueError, match=r"cut\.safetensors.*tensor 'w' data_offsets"):
        safetensors_tensors(cut)


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_checkpoint_metadata(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {
        "w": torch.zeros(5, 3),
        "b": torch.zeros(7, dtype=torch.bfloat16),
        "step": 3,  # a non-tensor value: skipped
    }
    dcp.save(state, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    kind, tensors = read_tensors(tmp_path / "ckpt")
    assert kind == "dcp"
    assert sorted(tensors, key=lambda t: t.name) == [
        TensorInfo("b", (7,), "bfloat16"),
        TensorInfo("w", (5, 3), "float32"),
    ]


@pytest.mark.torch
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_cli_reads_a_dcp_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    dcp.save({"w": torch.zeros(6, 4)}, checkpoint_id=str(tmp_path / "c"), no_dist=True)
    argv = ["transfer", str(tmp_path / "c"), "--src-mesh", "dp=2", "--src-default", "S(0)"]
    code, out, err = run([*argv, "--dst-mesh", "tp=2", "--dst-default", "S(1)"], capsys)
    assert code == 0 and err == ""
    assert out.startswith("transfer 1 tensor, 24 elements: 96 B as stored (float32), from dcp ")


# ---------------------------------------------------------------------- rules
def test_rules_first_match_wins() -> None:
    rules = parse_rules(["a.*: S(0)", "a.b,*.c: S(1);  *: R"], "--src-rules")
    assert [r.patterns for r in rules] == [("a.*",), ("a.b", "*.c"), ("*",)]
    assert [rule_for(rules, n) for n in ("a.b", "x.c", "zzz")] == [0, 1, 2]
    assert rule_for(parse_rules(["A*: R"], "--r"), "a") is None  # case-sensitive


# ---------------------------------------------------------------------- the report
def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run([*argv, "--format", "json"], capsys)
    assert code == 0 and err == "", err
    report: dict[str, Any] = json.loads(out)
    return report


@pytest.mark.parametrize("wire", [None, "bfloat16"])
@pytest.mark.parametrize("bucket", ["40", "1KiB", "256MiB"])
def test_small_model_against_brute_force(
    wire: str | None, bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    extra = ["--bucket", bucket, "--ranks-per-host", "2"]
    extra += ["--dst-dtype", wire] if wire else []
    rep = _json(small_argv(model, *extra), capsys)
    check_report(rep, MODEL, SMALL_SRC, SMALL_DST, wire, rph=2)


def check_report(
    rep: dict[str, Any],
    model: list[dict[str, Any]],
    src: tuple[list[int], list[int], list[tuple[list[str], str]], str],
    dst: tuple[list[int], list[int], list[tuple[list[str], str]], str],
    wire: str | None,
    rph: int | None,
) -> None:
    """The report against the brute-force reference (replicas allowed at the source)."""
    ref = reference(model, src, dst, wire)
    s = rep["summary"]
    assert s["tensors"] == len(model)
    assert s["elements"] == sum(math.prod(t["shape"]) for t in model)
    assert s["bytes"] == sum(math.prod(t["shape"]) * DTYPES[wire or t["dtype"]] for t in model)
    assert s["bytes_moved"] == ref["moved"] and s["local_copy_bytes"] == ref["kept"]
    assert {d: n for d, n in rep["kept"]} == ref["kept_at"]
    assert (
        s["bytes_moved"] + s["local_copy_bytes"]
        == s["bytes_delivered"]
        == sum(
            len(h) * DTYPES[wire or t["dtype"]]  # every destination piece, once
            for t in model
            for h in held(t["shape"], dst[0], dst[1], ref["placements"][t["name"]][1]).values()
        )
    )
    assert s["gather_broadcast_bytes"] == ref["gather"]
    if ref["moved"]:
        assert s["gather_broadcast_ratio"] == pytest.approx(ref["gather"] / ref["moved"])
    else:
        assert s["gather_broadcast_ratio"] is None
    # placements per tensor, by the first matching rule
    for t in rep["tensors"]:
        sp, dp = ref["placements"][t["name"]]
        assert ",".join(t["src_placements"]) == sp.replace(" ", "")
        assert ",".join(t["dst_placements"]) == dp
        assert t["bytes_moved"] == ref["per_tensor"][t["name"]]
    # pairs: receivers get exactly what they lack; a sender sends only what it holds
    recv: dict[int, int] = {}
    for a, b, n in rep["pairs"]:
        assert a != b and n > 0
        assert n <= ref["pair_bound"][a, b]
        recv[b] = recv.get(b, 0) + n
    assert recv == {d: n for d, n in ref["recv"].items() if n}
    assert s["max_recv_bytes"] == max(ref["recv"].values())
    if rph is not None:
        assert s["across_host_bytes"] == sum(n for a, b, n in rep["pairs"] if a // rph != b // rph)
    # rounds: every rank within the bucket each way, at least the lower bound
    bucket_bytes = s["bucket_bytes"]
    assert len(rep["rounds"]) == s["rounds"] >= s["rounds_lower_bound"]
    assert s["rounds_lower_bound"] == -(
        -max(s["max_send_bytes"], s["max_recv_bytes"]) // bucket_bytes
    )
    assert sum(r[1] for r in rep["rounds"]) == s["bytes_moved"]
    assert sum(r[0] for r in rep["rounds"]) == s["transfers"]
    assert all(r[2] <= bucket_bytes and r[3] <= bucket_bytes for r in rep["rounds"])
    assert s["max_round_send_bytes"] == max((r[2] for r in rep["rounds"]), default=0)
    assert s["max_round_recv_bytes"] == max((r[3] for r in rep["rounds"]), default=0)


@pytest.mark.parametrize("bucket", ["24", "4KiB"])
def test_hsdp_source_against_brute_force(
    bucket: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HSDP at the source (every piece on 2 ranks): replicas share the sending."""
    model = write_json(tmp_path / "model.json", MODEL)
    argv = ["transfer", str(model), "--src-mesh", "rep=2,dp=3", "--src-default", "R,S(0)"]
    argv += ["--src-rules", "scale: R,R", "--dst-mesh", "tp=3", "--dst-ranks", "2,5,6"]
    argv += ["--dst-rules", DST_RULES, "--dst-dtype", "f32", "--bucket", bucket]
    rep = _json([*argv, "--ranks-per-host", "3", "--world", "9"], capsys)
    src = ([2, 3], list(range(6)), [(["scale"], "R,R")], "R,S(0)")
    dst = ([3], [2, 5, 6], _rules(DST_RULES), "R")
    check_report(rep, MODEL, src, dst, "float32", rph=3)
    assert rep["summary"]["rounds"] == rep["summary"]["rounds_lower_bound"] or bucket == "24"


def test_unique_holders_give_the_exact_matrix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No replica at the source: every pair's bytes are determined; compare them all."""
    model = [
        {"name": "a", "shape": [9, 5], "dtype": "float32"},
        {"name": "b", "shape": [5, 11], "dtype": "bfloat16"},
        {"name": "c", "shape": [13], "dtype": "int8"},
    ]
    path = write_json(tmp_path / "m.json", model)
    argv = ["transfer", str(path), "--src-mesh", "dp=3,tp=2", "--src-default", "SS(0,2),S(0)"]
    argv += ["--src-rules", "b: S(1),S(0)", "--dst-mesh", "2,2", "--dst-ranks", "3:7"]
    argv += ["--dst-rules", "c: S(0),R", "--dst-default", "S(1),S(0)", "--bucket", "64"]
    rep = _json(argv, capsys)
    src = ([3, 2], list(range(6)), [(["b"], "S(1),S(0)")], "SS(0,2),S(0)")
    dst = ([2, 2], [3, 4, 5, 6], [(["c"], "S(0),R")], "S(1),S(0)")
    ref = reference(model, src, dst)
    check_report(rep, model, src, dst, None, rph=None)
    assert {(a, b): n for a, b, n in rep["pairs"]} == ref["pair_bound"]
    assert rep["summary"]["bytes_moved"] == ref["moved"]
    assert rep["summary"]["local_copy_bytes"] == ref["kept"] > 0
    assert {d: n for d, n in rep["kept"]} == ref["kept_at"]


def test_json_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    argv = small_argv(model, "--dst-dtype", "bf16", "--ranks-per-host", "4", "--world", "8")
    rep = _json(argv, capsys)
    assert list(rep) == [
        "schema",
        "model",
        "src",
        "dst",
        "wire_dtype",
        "summary",
        "rounds",
        "pairs",
        "kept",
        "tensors",
        "notes",
    ]
    assert rep["schema"] == "meshlayout.transfer/1"
    assert rep["model"] == {"path": str(model), "kind": "json"}
    assert rep["wire_dtype"] == "bfloat16"
    assert rep["src"] == {
        "mesh": "dp=3,tp=2",
        "names": ["dp", "tp"],
        "sizes": [3, 2],
        "ranks": [0, 1, 2, 3, 4, 5],
        "rules": [
            {
                "patterns": ["*.q.weight", "emb.weight"],
                "placements": ["SS(0,2)", "S(0)"],
                "tensors": 3,
            },
            {"patterns": ["*.o.weight"], "placements": ["S(0)", "S(1)"], "tensors": 1},
            {"patterns": ["scale"], "placements": ["R", "R"], "tensors": 1},
        ],
        "default": ["S(0)", "R"],
        "default_tensors": 2,
        "label": "source",
    }
    assert rep["dst"]["default"] == ["R"] and rep["dst"]["default_tensors"] == 3
    assert list(rep["summary"]) == [
        "tensors",
        "elements",
        "bytes",
        "stored_bytes",
        "bytes_moved",
        "local_copy_bytes",
        "bytes_delivered",
        "transfers",
        "bucket_bytes",
        "rounds",
        "rounds_lower_bound",
        "max_round_send_bytes",
        "max_round_recv_bytes",
        "max_send_bytes",
        "max_send_rank",
        "max_recv_bytes",
        "max_recv_rank",
        "ranks_per_host",
        "across_host_bytes",
        "gather_broadcast_bytes",
        "gather_broadcast_ratio",
    ]
    assert rep["summary"]["stored_bytes"] == sum(
        math.prod(t["shape"]) * DTYPES[t["dtype"]] for t in MODEL
    )
    first = rep["tensors"][0]
    assert first == {
        "name": "emb.weight",
        "shape": [7, 4],
        "dtype": "float32",
        "wire_dtype": "bfloat16",
        "bytes": 56,
        "bytes_moved": first["bytes_moved"],
        "src_placements": ["SS(0,2)", "S(0)"],
        "dst_placements": ["S(0)"],
        "src_rule": 0,
        "dst_rule": 0,
    }
    assert [t["name"] for t in rep["tensors"]] == [t["name"] for t in MODEL]  # stored order
    assert rep["notes"] == []


def test_a_rule_that_matches_no_tensor_is_an_error_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    code, out, err = run(small_argv(model, "--dst-rules", "*.q_prj.weight: S(0)"), capsys)
    assert code == 2 and out == ""
    assert err == (
        "meshlayout transfer: error: --dst-rules '*.q_prj.weight: S(0)': rule 3 takes no "
        "tensor: it matches no tensor name (the 7 names look like 'emb.weight'); fix the "
        "pattern or the order, or pass --allow-unmatched-rules\n"
    )


def test_a_rule_shadowed_by_an_earlier_one_is_an_error_naming_both(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    argv = small_argv(model, "--src-rules", "layers.1.q.weight: R,S(0)")
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    assert err.startswith("meshlayout transfer: error: --src-rules 'layers.1.q.weight: R,S(0)': ")
    assert (
        "rule 4 takes no tensor: every tensor it matches (1, e.g. 'layers.1.q.weight') takes "
        "rule 1 ('*.q.weight,emb.weight: SS(0,2),S(0)') first" in err
    )


def test_allow_unmatched_rules_turns_the_error_into_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    argv = small_argv(model, "--dst-rules", "*.q_prj.weight: S(0)", "--allow-unmatched-rules")
    code, out, err = run(argv, capsys)
    assert code == 0 and err == ""
    assert (
        "note: --dst-rules rule 3 (*.q_prj.weight: S(0)) takes no tensor: it matches no "
        "tensor name (the 7 names look like 'emb.weight')" in out
    )
    code, out, err = run([*argv, "--format", "json"], capsys)
    assert code == 0 and err == ""
    assert json.loads(out)["notes"] == [
        "--dst-rules rule 3 (*.q_prj.weight: S(0)) takes no tensor: it matches no tensor "
        "name (the 7 names look like 'emb.weight')"
    ]


def test_text_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    ref = reference(MODEL, SMALL_SRC, SMALL_DST)
    code, out, err = run(small_argv(model, "--ranks-per-host", "2", "--largest", "2"), capsys)
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert lines[0] == (
        "transfer 7 tensors, 100 elements: 322 B as stored (bfloat16, float16, float32), "
        f"from json {model}"
    )
    assert "  source       dp=3,tp=2 on ranks [0, 1, 2, 3, 4, 5]" in lines
    assert "    rule 1: *.q.weight,emb.weight: SS(0,2),S(0)  (3 tensors)" in lines
    assert "    default: S(0),R  (2 tensors)" in lines
    assert "    default: R  (3 tensors)" in lines
    moved = next(line for line in lines if line.startswith("bytes moved"))
    assert f" {ref['moved']} B in " in moved and f"(kept locally: {ref['kept']} B)" in moved
    gather = next(line for line in lines if line.startswith("gather + broadcast"))
    assert gather.endswith(f": {ref['gather'] / ref['moved']:.2f}x the plan")
    head = "bytes sent (rows: source rank, columns: destination rank; [n]: kept locally, not sent)"
    matrix = out.split(head + "\n")[1].splitlines()
    assert matrix[0].split() == ["src\\dst", "4", "5"]
    kept = dict(ref["kept_at"])
    assert matrix[5].split() == ["4", f"[{kept[4]}", "B]", "."]  # rank 4 keeps, sends nothing
    assert matrix[6].split()[:3] == ["5", ".", f"[{kept[5]}"]
    assert "largest tensors (2 of 7: " in out
    assert re.search(r"\n  emb\.weight +7x4 +112 B +34\.8% ", out)


def test_large_worlds_are_abridged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_json(tmp_path / "m.json", [{"name": "w", "shape": [64, 32], "dtype": "bf16"}])
    argv = ["transfer", str(model), "--src-mesh", "dp=32", "--src-default", "S(0)"]
    argv += ["--dst-mesh", "tp=16", "--dst-ranks", "32:48", "--dst-default", "S(1)"]
    code, out, err = run(argv, capsys)
    assert code == 0 and err == ""
    matrix = out.split("not sent)\n")[1].split("\n\n")[0].splitlines()
    assert len(matrix) == 1 + 12 + 1 + 2
    assert matrix[0].split() == ["src\\dst", *map(str, range(32, 40)), "...", "46", "47"]
    assert matrix[13].strip() == "..." and matrix[-1].split()[0] == "31"


def test_pictures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    svg, html = tmp_path / "t.svg", tmp_path / "t.html"
    code, _out, err = run(small_argv(model, "--svg", str(svg), "--html", str(html)), capsys)
    assert code == 0
    assert err.splitlines()[0].startswith(f"wrote {svg} (")
    assert err.splitlines()[1].startswith(f"wrote {html} (")
    root = ET.fromstring(svg.read_text())
    cells = [r for r in root.iter(f"{NS}rect") if r.get("class") == "cell"]
    assert len(cells) == 6 * 2  # source ranks x destination ranks
    tips = {c.findtext(f"{NS}title") for c in cells}
    rep = _json(small_argv(model), capsys)
    for src, dst, n in rep["pairs"]:
        assert f"rank {src} -> rank {dst}: {n} bytes" in {(t or "").split(";")[0] for t in tips}
    locals_ = [r for r in root.iter(f"{NS}rect") if r.get("class") == "local"]
    assert len(locals_) == 2  # ranks 4 and 5 keep what they hold
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<svg" in page and "bytes moved" in page


def test_llama_example_runs_fast_enough_to_be_useful(capsys: pytest.CaptureFixture[str]) -> None:
    """The docs' example model (about 200M parameters, 111 tensors)."""
    argv = ["transfer", str(LLAMA), "--src-mesh", "dp=4", "--src-default", "S(0)"]
    rep = _json([*argv, "--dst-mesh", "tp=4", "--dst-default", "R", "--dst-dtype", "bf16"], capsys)
    s = rep["summary"]
    assert s["tensors"] == 111 and s["elements"] == 200_829_952
    # every rank lacks three quarters of every tensor (rows it does not hold)
    assert s["bytes_moved"] == 3 * s["bytes"] and s["local_copy_bytes"] == s["bytes"]


# ---------------------------------------------------------------------- errors
def _errors(tmp: Path) -> list[tuple[list[str], str]]:
    model = write_json(tmp / "model.json", MODEL)
    write_json(tmp / "dtype.json", [{"name": "w", "shape": [2], "dtype": "float7"}])
    write_json(tmp / "key.json", [{"name": "w", "shape": [2]}])
    write_json(tmp / "shape.json", {"w": {"shape": [2, -1], "dtype": "f32"}})
    write_json(tmp / "dup.json", [{"name": "w", "shape": [2], "dtype": "f32"}] * 2)
    write_json(tmp / "empty.json", [])
    (tmp / "bad.json").write_text("[{", encoding="utf-8")
    (tmp / "junk.safetensors").write_bytes(b"\xff" * 64)
    (tmp / "emptydir").mkdir(exist_ok=True)
    base = small_argv(model)

    def with_flag(flag: str, value: str) -> list[str]:
        argv = list(base)
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
        return argv

    def model_argv(name: str) -> list[str]:
        return ["transfer", str(tmp / name), *base[2:]]

    return [
        (model_argv("nope.json"), "MODEL: '" + str(tmp / "nope.json") + "' does not exist"),
        (model_argv("bad.json"), "is not valid JSON"),
        (model_argv("dtype.json"), "tensor 'w': unknown dtype 'float7'"),
        (model_argv("key.json"), "missing key 'dtype'"),
        (model_argv("shape.json"), "shape sizes must lie in [0, 2**63)"),
        (model_argv("dup.json"), "tensor 'w' is listed twice"),
        (model_argv("empty.json"), "holds no tensors"),
        (model_argv("junk.safetensors"), "is not a safetensors file"),
        (model_argv("emptydir"), "holds neither a DCP checkpoint"),
        (with_flag("--bucket", "12 parsecs"), "--bucket: unknown unit 'parsecs'"),
        (with_flag("--bucket", "0"), "--bucket: must be at least 1 bytes"),
        (with_flag("--bucket", "3B"), "--bucket '3B': smaller than one element of 'emb.weight'"),
        (
            ["transfer", str(LLAMA), "--src-mesh", "4", "--dst-mesh", "2", "--bucket", "64"],
            "--bucket '64': the destination pieces hold 1606639616 bytes, up to 25103744",
        ),
        (with_flag("--dst-dtype", "float7"), "--dst-dtype 'float7': unknown dtype"),
        (with_flag("--src-rules", "*.weight S(0)"), "expected PATTERN[,PATTERN...]: PLACEMENTS"),
        (with_flag("--src-rules", ": S(0),R"), "empty name pattern"),
        (with_flag("--src-rules", "*: "), "no placements after ':'"),
        (with_flag("--src-rules", "*: Q(0),R"), "unknown placement 'Q'"),
        (with_flag("--src-rules", "*: S(0)"), "1 placements, but --src-mesh dp=3,tp=2 has 2 dims"),
        (with_flag("--src-rules", "*: P,R"), "is a pending reduction"),
        (with_flag("--src-rules", ";"), "no rule"),
        (
            with_flag("--dst-rules", "*.weight,*.bias: S(1)"),
            "--dst-rules '*.weight,*.bias: S(1)': tensor 'layers.0.norm.weight' of shape (5,) "
            "cannot take it",
        ),
        (with_flag("--src-rules", "*.q.weight: S(0),S(0)"), "tensor 'scale' of shape ()"),
        (with_flag("--src-default", "S(0)"), "--src-default 'S(0)': 1 placements"),
        (with_flag("--src-default", "S(0"), "--src-default 'S(0': unbalanced"),
        (with_flag("--src-ranks", "0:4"), "--src-ranks '0:4' gives 4 ranks"),
        (with_flag("--dst-mesh", "tp=0"), "--dst-mesh size of 'tp': must be >= 1"),
        (
            [
                a
                for a in with_flag("--src-mesh", "dp=4096,tp=2048")
                if a not in ("--src-ranks", "0:6")
            ],
            "a transfer plan looks at every rank",
        ),
        (with_flag("--svg", str(tmp)), "cannot write: Is a directory"),
        (with_flag("--ranks-per-host", "0"), "--ranks-per-host: must be >= 1"),
        (
            with_flag("--ranks-per-host", "4"),
            "--ranks-per-host 4 does not divide the 6 ranks 0-5 the meshes span: the last host "
            "would hold 2 of 4 ranks",
        ),
        ([*with_flag("--ranks-per-host", "4"), "--world", "10"], "does not divide --world 10"),
        (with_flag("--world", "8"), "--world 8 applies with --ranks-per-host"),
    ]


def test_every_error_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for argv, message in _errors(tmp_path):
        code, out, err = run(argv, capsys)
        assert code == 2, (argv, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("meshlayout transfer: error: "), err
        assert message in lines[0], (message, lines[0])
        assert out == ""


# ---------------------------------------------------------------------- docs
def _doc_commands(page: Path) -> list[tuple[list[str], str]]:
    """Every ``$ meshlayout transfer ...`` block (backslash-continued lines) with its output."""
    text = page.read_text(encoding="utf-8")
    blocks = re.findall(
        r"```text\n\$ meshlayout (transfer (?:[^\n]*\\\n)*[^\n]*)\n(.*?)```", text, re.S
    )
    return [(shlex.split(cmd.replace("\\\n", " ")), out) for cmd, out in blocks]


def test_docs_cli_output_is_what_the_command_prints(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)
    commands = _doc_commands(DOCS / "cli.md")
    assert len(commands) >= 2
    for argv, want in commands:
        code, out, err = run(argv, capsys)
        if want.startswith("meshlayout transfer: error: "):  # an error shown in the docs
            assert (code, out, err) == (2, "", want)
        else:
            assert code == 0 and err == ""
            assert out == want


def test_readme_tour_lines_are_real(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's abridged example: every line shown is a line the command prints."""
    monkeypatch.chdir(ROOT)
    [(argv, shown)] = _doc_commands(ROOT / "README.md")
    code, out, err = run(argv, capsys)
    assert code == 0 and err == ""
    printed = out.splitlines()
    for line in shown.splitlines():
        assert line == "..." or line in printed, line


def test_same_layout_moves_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_json(tmp_path / "model.json", MODEL)
    argv = ["transfer", str(model), "--src-mesh", "dp=2", "--src-rules", "scale: R"]
    argv += ["--src-default", "S(0)", "--dst-mesh", "dp=2", "--dst-rules", "scale: R"]
    code, out, err = run([*argv, "--dst-default", "S(0)"], capsys)
    assert code == 0 and err == ""
    assert "bytes moved         0 B in 0 pieces (kept locally: 326 B)" in out
    assert ": the plan moves nothing" in out and "busiest ranks       nothing is sent" in out
    assert "rounds              0 of at most 256.0 MiB" in out
    rep = _json([*argv, "--dst-default", "S(0)"], capsys)
    assert rep["rounds"] == [] and rep["pairs"] == [] and rep["summary"]["rounds"] == 0
    assert rep["summary"]["gather_broadcast_ratio"] is None
    assert sum(n for _, n in rep["kept"]) == 322 + 4  # the scale is on both ranks


@st.composite
def random_transfer(draw: st.DrawFn) -> dict[str, Any]:
    """A small random model and two random layouts (ranks equal, overlapping or disjoint)."""
    names = ["a", "b", "c"][: draw(st.integers(1, 3))]
    model = [
        {
            "name": n,
            "shape": draw(st.lists(st.integers(0, 7), min_size=0, max_size=2)),
            "dtype": draw(st.sampled_from(["float32", "bfloat16", "int8"])),
        }
        for n in names
    ]

    def side() -> tuple[list[int], list[int], list[tuple[list[str], str]], str]:
        sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
        start = draw(st.integers(0, 5))
        ranks = list(range(start, start + math.prod(sizes)))
        rules = []
        for t in model:
            nd = len(t["shape"])
            choices = ["R"] + [f"S({d})" for d in range(nd)] + [f"SS({d},2)" for d in range(nd)]
            placements = [draw(st.sampled_from(choices)) for _ in sizes]
            rules.append(([t["name"]], ",".join(placements)))
        return sizes, ranks, rules, ",".join("R" for _ in sizes)

    return {
        "model": model,
        "src": side(),
        "dst": side(),
        "bucket": draw(st.sampled_from([4, 8, 24, 1000])),
        "rph": draw(st.sampled_from([None, 2, 3])),
    }


@given(case=random_transfer())
@settings(max_examples=60, deadline=None)
def test_random_transfers_against_brute_force(
    case: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> None:
    path = write_json(tmp_path_factory.mktemp("rand") / "m.json", case["model"])
    argv = ["transfer", str(path), "--bucket", str(case["bucket"]), "--format", "json"]
    for flag, (sizes, ranks, rules, _) in (("src", case["src"]), ("dst", case["dst"])):
        argv += [f"--{flag}-mesh", ",".join(map(str, sizes)), f"--{flag}-ranks"]
        argv += [f"{ranks[0]}:{ranks[-1] + 1}"]
        argv += [f"--{flag}-rules", "; ".join(f"{p[0]}: {pl}" for p, pl in rules)]
    if case["rph"]:
        span = max(case["src"][1][-1], case["dst"][1][-1]) + 1
        argv += [
            "--ranks-per-host",
            str(case["rph"]),
            "--world",
            str(-(-span // case["rph"]) * case["rph"]),
        ]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    check_report(
        json.loads(out.getvalue()), case["model"], case["src"], case["dst"], None, case["rph"]
    )


def test_unreadable_model_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file the system refuses (root ignores permissions, so the refusal is simulated)."""
    import meshlayout.cli.transfer as cli_transfer

    monkeypatch.chdir(tmp_path)
    model = write_json(Path("model.json"), MODEL)

    def refuse(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(cli_transfer, "read_tensors", refuse)
    code, out, err = run(small_argv(model), capsys)
    assert (code, out) == (2, "")
    assert (
        err == "meshlayout transfer: error: MODEL: 'model.json': cannot read: Permission denied\n"
    )


def test_text_is_abridged_json_is_limited(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text needs only the pairs it shows; JSON lists every piece, so it has a limit."""
    import meshlayout.render.reports as reports

    model = write_json(tmp_path / "m.json", [{"name": "w", "shape": [64, 32], "dtype": "bf16"}])
    argv = ["transfer", str(model), "--src-mesh", "dp=32", "--src-default", "S(0)"]
    argv += ["--dst-mesh", "tp=16", "--dst-ranks", "32:48", "--dst-default", "S(1)"]
    rep = _json(argv, capsys)
    assert len(rep["pairs"]) == 32 * 16 and rep["rounds"] is not None
    code, out, err = run(argv, capsys)
    head = "bytes sent (rows: source rank, columns: destination rank; [n]: kept locally, not sent)"
    matrix = out.split(head + "\n")[1].split("\n\n")[0].splitlines()
    cols = [int(c) for c in matrix[0].split()[1:] if c != "..."]
    sent = {(a, b): n for a, b, n in rep["pairs"]}
    for line in matrix[1:]:
        cells = line.split()
        if cells[0] == "...":
            continue
        shown = [c for c in re.findall(r"\S+(?: [KMG]?i?B)?", line)[1:] if c != "..."]
        assert shown == [f"{sent[int(cells[0]), d]} B" for d in cols]
    monkeypatch.setattr(reports, "LIST_LIMIT", 100)
    code, out, err = run([*argv, "--format", "json"], capsys)
    assert code == 2 and out == ""
    assert err == (
        "meshlayout transfer: error: --format json: --format json lists every pair: 512 pieces, "
        "more than the limit of 100 (meshlayout.render.LIST_LIMIT); the text output abridges "
        "any size\n"
    )
    assert run(argv, capsys)[0] == 0
