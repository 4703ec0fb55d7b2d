"""The demo's checkpoint phase (``meshlayout.demo.checkpoint``): planning, report, 6 processes.

The pure planning is checked against torch 2.13 itself: FSDP2's storage rebuilt with
``torch.chunk`` (TP's chunks, chunked again by FSDP) against torch's own
``_compute_local_shape_and_global_offset``, which DCP's default planners use. The
report is checked on real checkpoints written here (no process group) with outcomes
chosen by each test. One 6-process run (dp=3, tp=2, gloo) runs the worker phase as
the demo does and shows plain DCP failing on the uneven FSDP-over-TP probe while ours
reloads everything exactly; the 1-, 2-, 3- and 4-process demo runs are in
tests/test_demo.py.
"""

from __future__ import annotations

import io
import warnings
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.tensor import Shard as TShard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from meshlayout import ParallelDims
from meshlayout.demo import DemoConfig, demo_parallel_dims
from meshlayout.demo import checkpoint as dc
from meshlayout.demo.model import make_model as _make_model
from meshlayout.torch import checkpoint as mlcp
from multiproc import run_multiproc
from torch_versions import dcp_overlap_refusal

OVERLAP = "dcp.save fails: " + dcp_overlap_refusal("w")
DEMO_NPROCS = [1, 2, 3, 4, 6, 8]  # the sizes DemoConfig accepts (tests/test_demo.py)


# ---------------------------------------------------------------------- pure planning
def _fsdp2_rows(rows: int, fsdp: int, tp: int, i: int, j: int) -> list[int]:
    """The rows FSDP2 over ColwiseParallel stores on mesh coordinate (i, j): torch.chunk twice."""
    tp_chunks = torch.arange(rows).chunk(tp)
    tp_piece = tp_chunks[j] if j < len(tp_chunks) else torch.arange(0)
    fsdp_chunks = tp_piece.chunk(fsdp)
    return (fsdp_chunks[i] if i < len(fsdp_chunks) else torch.arange(0)).tolist()


def _torch_rows(rows: int, fsdp: int, tp: int, i: int, j: int) -> list[int]:
    """The rows torch 2.13's DCP planner says coordinate (i, j) holds."""
    placements = [_StridedShard(0, split_factor=tp), TShard(0)]
    shape, offset = _compute_local_shape_and_global_offset(
        (rows, 3), (fsdp, tp), [i, j], placements
    )
    return list(range(offset[0], offset[0] + shape[0]))


def _first_differing_rows(fsdp: int, tp: int) -> int | None:
    for rows in range(1, dc.MAX_PROBE_ROWS + 1):
        for i in range(fsdp):
            for j in range(tp):
                if _fsdp2_rows(rows, fsdp, tp, i, j) != _torch_rows(rows, fsdp, tp, i, j):
                    return rows
    return None


@pytest.mark.parametrize(("fsdp", "tp"), [(f, t) for f in range(1, 6) for t in (1, 2, 3)])
def test_first_uneven_rows_is_where_torch_misreads_fsdp2_storage(fsdp: int, tp: int) -> None:
    assert dc.first_uneven_rows(fsdp, tp) == _first_differing_rows(fsdp, tp)


def test_first_uneven_rows_for_the_demo_meshes() -> None:
    # issue 13's measurement (7 rows on dp=3, tp=2); dp <= 2 never differs
    assert [dc.first_uneven_rows(f, 2) for f in (1, 2, 3, 4)] == [None, None, 7, 9]


@pytest.mark.parametrize(
    ("bad", "error"),
    [(0, ValueError), (-1, ValueError), (True, TypeError), (2.0, TypeError), ("3", TypeError)],
)
def test_first_uneven_rows_rejects_bad_degrees(bad: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=f"fsdp must be a positive int, got {bad!r}"):
        dc.first_uneven_rows(bad, 2)
    with pytest.raises(error, match=f"tp must be a positive int, got {bad!r}"):
        dc.first_uneven_rows(2, bad)


@pytest.mark.parametrize("nproc", DEMO_NPROCS)
def test_every_demo_size_has_a_probe_or_says_what_it_needs(nproc: int) -> None:
    DemoConfig(nproc=nproc)  # a size the demo accepts
    pd = demo_parallel_dims(nproc)
    probe = dc.probe_for(pd)
    fsdp, tp = pd.mesh("fsdp").size(), pd.degrees["tp"]
    if fsdp >= 3 and tp == 2:  # 6 and 8 processes: the real FSDP2 + TP failure
        assert probe.kind == "fsdp_tp" and probe.rows == {3: 7, 4: 9}[fsdp]
        assert probe.view == ("fsdp", "tp") and probe.note == ""
        assert probe.title == (
            f"nn.Linear(3, {probe.rows}) under fully_shard over ColwiseParallel "
            f"on (fsdp={fsdp}, tp=2)"
        )
    elif nproc == 1:
        assert probe.kind == "none" and probe.needs == "2 or more processes"
    else:  # several runs per rank: one (offset, size) per rank cannot describe them
        size = pd.mesh(probe.view[0]).size()
        assert probe.kind == "strided" and probe.rows == 4 * size
        assert probe.view == (("tp",) if tp > 1 else ("fsdp",))
        pieces, _ = _StridedShard(0, split_factor=2)._split_tensor(
            torch.arange(probe.rows), size, with_padding=False
        )
        held = ",".join(str(r) for r in pieces[0].tolist())
        assert f"(rank 0 holds rows {held})" in probe.title
        assert "meshlayout demo --nproc 6" in probe.note


@pytest.mark.parametrize("nproc", DEMO_NPROCS)
def test_reload_dims_is_another_sharding_of_the_same_processes(nproc: int) -> None:
    pd = demo_parallel_dims(nproc)
    other = dc.reload_dims(pd)
    if nproc == 1:
        assert other is None
        return
    assert other is not None and other.world_size == nproc
    assert dc.config_name(other) != dc.config_name(pd)
    assert (other.degrees["tp"] == 1) == (pd.degrees["tp"] > 1)  # TP <-> FSDP alone


def test_config_title_names_the_sharding() -> None:
    titles = [dc.config_title(ParallelDims(n, tp=t)) for n, t in [(4, 2), (4, 1), (2, 2), (1, 1)]]
    assert titles == [
        "FSDP over TP (fsdp=2, tp=2)",
        "FSDP alone (fsdp=4, tp=1)",
        "TP alone (fsdp=1, tp=2)",
        "unsharded (fsdp=1, tp=1)",
    ]
    with pytest.raises(TypeError, match="pd must be a ParallelDims, got int"):
        dc.config_title(4)  # type: ignore[arg-type]


def test_worker_phase_checks_its_arguments_before_any_collective(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="pd must be a ParallelDims"):
        dc.worker_phase(None, None, "4", str(tmp_path), _make_model)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="root must be an existing directory, got '/no/such'"):
        dc.worker_phase(None, None, ParallelDims(1), "/no/such", _make_model)


# ---------------------------------------------------------------------- the report
def _trained() -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in _make_model().state_dict().items()}


def _write(root: Path, params: dict[str, torch.Tensor]) -> None:
    """Both checkpoints of ``params`` as the workers name them: ``ours`` and ``plain``."""
    with warnings.catch_warnings():  # DCP: no_dist means a single process (we know)
        warnings.simplefilter("ignore", UserWarning)
        mlcp.save({"model": params}, str(root / "ours"), no_dist=True)
        dcp_save({"model": params}, checkpoint_id=str(root / "plain"), no_dist=True)


def _summary(nproc: int = 4, **changes: str) -> dict[str, Any]:
    pd = demo_parallel_dims(nproc)
    outcome = {
        f"{step} {who}": dc.EXACT for step in ("save", "reload") for who in ("ours", "plain")
    }
    outcome |= {"probe ours": dc.EXACT, "probe plain": OVERLAP}
    outcome |= {k.replace("_", " "): v for k, v in changes.items()}
    trained = {k: v.tolist() for k, v in _trained().items()}
    return dc.make_summary(pd, trained, outcome)


def _report(summary: dict[str, Any] | None, root: Path) -> tuple[bool, list[str]]:
    buf = io.StringIO()
    ok = dc.report(summary, str(root), _trained(), 1e-5, buf)
    return ok, buf.getvalue().splitlines()


def test_report_passes_ours_and_shows_plain_dcp_failing_on_the_probe(tmp_path: Path) -> None:
    _write(tmp_path, _trained())
    ok, lines = _report(_summary(), tmp_path)
    assert ok
    assert lines == [
        "== checkpoint: meshlayout.torch.checkpoint vs plain torch.distributed.checkpoint ==",
        "PASS saved the trained model with ExactSavePlanner on 4 processes, FSDP over TP "
        "(fsdp=2, tp=2): 4 tensors in 4 chunks, every tensor tiles exactly",
        "PASS reloaded it with ExactLoadPlanner as FSDP alone (fsdp=4, tp=1) on the same "
        "4 processes: every parameter equals the trained one, bitwise",
        "PASS reloaded it as plain tensors in this process (no_dist=True): every parameter "
        "equals the trained one, bitwise, and the single-process run within 1e-05",
        "compare  ours PASS  plain DCP PASS  the demo model saved on FSDP over TP "
        "(fsdp=2, tp=2), loaded into FSDP alone (fsdp=4, tp=1) and plain tensors",
        "compare  ours PASS  plain DCP FAIL  a [_StridedShard(0, 2)] DTensor of 8 rows on the "
        "2-rank tp mesh (rank 0 holds rows 0,1,4,5): " + OVERLAP,
        "         (on (fsdp=2, tp=2) plain DCP reads uneven FSDP over TP correctly; it fails "
        "on uneven FSDP over TP from fsdp = 3 on: meshlayout demo --nproc 6)",
    ]


def test_report_fails_when_a_saved_value_differs_from_the_trained_one(tmp_path: Path) -> None:
    params = _trained()
    params["2.bias"][3] += 1.0  # the checkpoint holds another value than the workers trained
    _write(tmp_path, params)
    ok, lines = _report(_summary(), tmp_path)
    assert not ok
    assert lines[3] == (
        "FAIL reloaded it as plain tensors in this process (no_dist=True): every parameter "
        "equals the trained one, bitwise: loads wrong values: 2.bias: 1 of 10 elements "
        "differ (first at (3,)), and the single-process run within 1e-05"
    )
    assert lines[4].startswith("compare  ours FAIL  plain DCP FAIL  the demo model")
    assert lines[4].endswith(
        "and plain tensors: loads wrong values: 2.bias: 1 of 10 elements differ (first at (3,))"
    )


def test_report_fails_when_trained_parameters_are_far_from_the_single_process_run(
    tmp_path: Path,
) -> None:
    summary = _summary()
    summary["trained"]["0.bias"][0] += 0.5  # the workers trained something else
    params = {k: torch.tensor(v) for k, v in summary["trained"].items()}
    _write(tmp_path, params)
    ok, lines = _report(summary, tmp_path)
    assert not ok
    assert lines[3].startswith("FAIL reloaded it as plain tensors")
    assert lines[3].endswith("bitwise; the trained parameters differ from the single-process run")


@pytest.mark.parametrize(
    ("changes", "line", "expected"),
    [
        # a worker-side failure of ours fails the demo and is shown with its message
        (
            {"reload_ours": "dcp.load fails: boom"},
            2,
            "FAIL reloaded it with ExactLoadPlanner as FSDP alone (fsdp=4, tp=1) on the same "
            "4 processes: every parameter equals the trained one, bitwise: dcp.load fails: boom",
        ),
        (
            {"probe_ours": "loads wrong values: w: 2 of 8 elements differ (first at (6,))"},
            5,
            "compare  ours FAIL  plain DCP FAIL  a [_StridedShard(0, 2)] DTensor of 8 rows on the "
            "2-rank tp mesh (rank 0 holds rows 0,1,4,5): " + OVERLAP + " [ours: loads wrong "
            "values: w: 2 of 8 elements differ (first at (6,))]",
        ),
        (
            {"save_ours": "dcp.save fails: ranks [0, 1]: Partial"},
            1,
            "FAIL saved the trained model with ExactSavePlanner on 4 processes, FSDP over TP "
            "(fsdp=2, tp=2): dcp.save fails: ranks [0, 1]: Partial",
        ),
    ],
)
def test_report_fails_when_ours_fails(
    changes: dict[str, str], line: int, expected: str, tmp_path: Path
) -> None:
    _write(tmp_path, _trained())
    ok, lines = _report(_summary(4, **changes), tmp_path)
    assert not ok
    assert lines[line] == expected


def test_report_says_when_plain_dcp_unexpectedly_succeeds(tmp_path: Path) -> None:
    # a torch that reads the probe correctly is news, not a failure of the demo
    _write(tmp_path, _trained())
    ok, lines = _report(_summary(probe_plain=dc.EXACT), tmp_path)
    assert ok
    assert lines[5] == (
        "compare  ours PASS  plain DCP PASS  a [_StridedShard(0, 2)] DTensor of 8 rows on the "
        "2-rank tp mesh (rank 0 holds rows 0,1,4,5) (torch 2.13 fails here: a fixed torch?)"
    )


def test_report_on_one_process_says_what_the_comparison_needs(tmp_path: Path) -> None:
    _write(tmp_path, _trained())
    summary = _summary(1)
    ok, lines = _report(summary, tmp_path)
    assert ok
    assert not any("ExactLoadPlanner" in line for line in lines)  # no other sharding on 1
    assert lines[-1] == (
        "compare  ours n/a   plain DCP n/a   an uneven sharding (needs 2 or more processes; "
        "meshlayout demo --nproc 6 shows plain DCP failing on uneven FSDP over TP)"
    )
    assert lines[1].startswith("PASS saved the trained model with ExactSavePlanner on 1 process,")


def test_report_without_a_summary_fails(tmp_path: Path) -> None:
    ok, lines = _report(None, tmp_path)
    assert not ok and lines[-1] == "FAIL checkpoint: no worker reported the checkpoint phase"


def test_report_fails_when_the_checkpoint_is_missing(tmp_path: Path) -> None:
    ok, lines = _report(_summary(), tmp_path)  # nothing was written
    assert not ok
    assert lines[1].startswith("FAIL saved the trained model") and "cannot read it back" in lines[1]
    assert lines[3].startswith("FAIL reloaded it as plain tensors") and "dcp.load fails" in lines[3]


# ---------------------------------------------------------------------- 6 processes
def _six(rank: int, world: int, root: str) -> dict[str, Any] | None:
    """The demo's worker phase on (fsdp=3, tp=2), on the untrained model."""
    from meshlayout.torch import build

    pd = demo_parallel_dims(world)
    built = build(pd, "cpu")
    model = _make_model()
    dc.parallelize(model, built, pd)
    return dc.worker_phase(model, built, pd, root, _make_model)


@pytest.mark.multiprocess
@pytest.mark.timeout(600)
def test_six_processes_plain_dcp_fails_on_uneven_fsdp_over_tp_ours_is_exact(
    tmp_path: Path,
) -> None:
    summary, *others = run_multiproc(_six, 6, str(tmp_path), timeout=400)
    assert others == [None] * 5
    assert summary is not None
    outcome = summary["outcome"]
    # ours: saved on (3, 2), reloaded exactly as FSDP alone on 6 ranks, probe exact
    assert {k: v for k, v in outcome.items() if "ours" in k} == {
        "save ours": "exact",
        "reload ours": "exact",
        "probe ours": "exact",
    }
    # plain DCP: the demo model (rows 6 and 10) is read right; the 7-row probe is not
    assert outcome["save plain"] == outcome["reload plain"] == "exact"
    assert outcome["probe plain"] == (
        "dcp.load fails: req MetadataIndex(fqn='w', offset=torch.Size([6, 0]), index=4) "
        "mismatch sizes torch.Size([1, 3]) vs torch.Size([0, 3])"
    )
    # the parent side: plain tensors from both checkpoints, then the printed lines
    reference = _trained()
    assert {k: torch.tensor(v) for k, v in summary["trained"].items()}.keys() == reference.keys()
    for name, value in summary["trained"].items():
        assert torch.equal(torch.tensor(value), reference[name]), name
    buf = io.StringIO()
    assert dc.report(summary, str(tmp_path), reference, 1e-5, buf)
    text = buf.getvalue()
    assert (
        "PASS saved the trained model with ExactSavePlanner on 6 processes, FSDP over TP "
        "(fsdp=3, tp=2): 4 tensors in 21 chunks, every tensor tiles exactly\n"
    ) in text
    assert "PASS reloaded it with ExactLoadPlanner as FSDP alone (fsdp=6, tp=1)" in text
    assert "PASS reloaded it as plain tensors in this process (no_dist=True)" in text
    assert (
        "compare  ours PASS  plain DCP FAIL  nn.Linear(3, 7) under fully_shard over "
        "ColwiseParallel on (fsdp=3, tp=2): dcp.load fails: "
    ) in text
    assert [
        line for line in text.splitlines() if "FAIL" in line and "plain DCP FAIL" not in line
    ] == []
