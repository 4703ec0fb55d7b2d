"""The demo's checkpoint outcomes: how a check is worded, and the parent's report (layer 4).

Every check of :mod:`.checkpoint` ends as one *outcome* string: :data:`EXACT`,
or what went wrong (``"dcp.save fails: ..."``, ``"dcp.load fails: ..."``, ``"loads
wrong values: ..."``). The workers word them with :func:`error_message` and
:func:`differences`; the calling process hands rank 0's summary to :func:`report`,
which also loads both checkpoints into plain tensors itself (``no_dist=True``: one
process, no process group), compares them with the trained parameters and the
single-process run, and prints ``PASS``/``FAIL`` lines and the plain-DCP comparison.
Only our planners' results decide the demo's exit status: plain DCP failing is the
point of the comparison, and plain DCP succeeding on the probe (a torch fix) is
reported, not failed.

>>> error_message(ValueError("bad chunk: ChunkStorageMetadata(offsets=...)"))
'bad chunk'
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["EXACT", "MESSAGE_LIMIT", "differences", "error_message", "report"]

#: Error messages in the report are cut to this many characters.
MESSAGE_LIMIT = 150
EXACT = "exact"


# ---------------------------------------------------------------------- outcomes (both sides)
def error_message(exc: BaseException) -> str:
    """The first line of the underlying error (DCP wraps every rank's error)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        inner = next(iter(failures.values()))
        exc = inner[0] if isinstance(inner, tuple) else inner
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    text = lines[0].split(": ChunkStorageMetadata(")[0]  # DCP then lists every chunk
    return text if len(text) <= MESSAGE_LIMIT else text[: MESSAGE_LIMIT - 3] + "..."


def differences(got: Mapping[str, Any], want: Mapping[str, Any]) -> str:
    """``EXACT``, or which tensors of ``got`` differ from ``want`` and where (bitwise)."""
    bad = []
    for name, expect in want.items():
        value = got.get(name)
        if value is None:
            bad.append(f"{name} missing")
            continue
        if value.shape != expect.shape or value.dtype != expect.dtype:
            bad.append(f"{name} is {tuple(value.shape)} {value.dtype}")
            continue
        differ = (value != expect).nonzero()
        if len(differ):
            at = tuple(int(i) for i in differ[0].tolist())
            bad.append(f"{name}: {len(differ)} of {expect.numel()} elements differ (first at {at})")
    return EXACT if not bad else "loads wrong values: " + "; ".join(bad)


# ---------------------------------------------------------------------- the parent's report
def report(
    summary: Mapping[str, Any] | None,
    root: str,
    reference: Mapping[str, Any],
    tolerance: float,
    out: IO[str],
) -> bool:
    """Print the checkpoint section; True if every check of our planners passed.

    ``summary`` is rank 0's :func:`.checkpoint.worker_phase` result (None: no
    worker reported one), ``root`` the directory the workers saved into,
    ``reference`` the single-process run's parameters, ``tolerance`` the demo's
    ``PARAM_TOLERANCE``. This process loads both checkpoints into plain tensors
    itself (``no_dist=True``). Plain DCP's results are shown on ``compare`` lines and
    never fail the demo.
    """
    import torch

    print(
        "== checkpoint: meshlayout.torch.checkpoint vs plain torch.distributed.checkpoint ==",
        file=out,
    )
    if summary is None:
        print("FAIL checkpoint: no worker reported the checkpoint phase", file=out)
        return False
    trained = {k: torch.tensor(v, dtype=torch.float32) for k, v in summary["trained"].items()}
    outcome = _with_plain_tensor_loads(summary["outcome"], root, trained)
    ok = _model_checks(summary, outcome, root, trained, reference, tolerance, out)
    _model_comparison(summary, outcome, out)
    ok &= _probe_comparison(summary, outcome, out)
    return ok


def _with_plain_tensor_loads(
    outcome: Mapping[str, str], root: str, trained: Mapping[str, Any]
) -> dict[str, str]:
    """``outcome`` plus ``"plain tensors ours"``/``"plain tensors plain"``, loaded here."""
    merged = dict(outcome)
    for who in ("ours", "plain"):  # this process: no process group, full tensors
        merged[f"plain tensors {who}"] = (
            _plain_tensor_check(root, who, trained)
            if merged.get(f"save {who}") == EXACT
            else "not saved"
        )
    return merged


def _model_checks(
    summary: Mapping[str, Any],
    outcome: Mapping[str, str],
    root: str,
    trained: Mapping[str, Any],
    reference: Mapping[str, Any],
    tolerance: float,
    out: IO[str],
) -> bool:
    """The PASS/FAIL lines of our planners on the trained model: save, reload, plain tensors."""
    import torch

    nproc, saved_on, other = summary["nproc"], summary["saved_on"], summary["reloaded_on"]
    save_ok, detail = False, outcome.get("save ours") or "no result"
    if outcome.get("save ours") == EXACT:
        save_ok, detail = _chunk_summary(root)
    _line(
        out,
        f"{'PASS' if save_ok else 'FAIL'} saved the trained model with ExactSavePlanner on "
        f"{_processes(nproc)}, {saved_on}: {detail}",
    )
    ok = save_ok
    if other is not None:
        mine = outcome.get("reload ours")
        ok &= mine == EXACT
        _line(
            out,
            f"{_verdict(mine)} reloaded it with ExactLoadPlanner as {other} on the same "
            f"{_processes(nproc)}: every parameter equals the trained one, bitwise{_failed(mine)}",
        )
    mine = outcome["plain tensors ours"]
    close = set(trained) == set(reference) and all(
        torch.allclose(value, reference[name], atol=tolerance) for name, value in trained.items()
    )
    ok &= mine == EXACT and close
    _line(
        out,
        f"{'PASS' if mine == EXACT and close else 'FAIL'} reloaded it as plain tensors in this "
        f"process (no_dist=True): every parameter equals the trained one, bitwise{_failed(mine)}"
        + ("" if close else "; the trained parameters differ from the single-process run")
        + (f", and the single-process run within {tolerance:g}" if close else ""),
    )
    return ok


def _model_comparison(summary: Mapping[str, Any], outcome: Mapping[str, str], out: IO[str]) -> None:
    """The ``compare`` line of ours vs plain DCP on the demo model (never fails the demo)."""
    other = summary["reloaded_on"]
    keys = ["save", "plain tensors"] + (["reload"] if other is not None else [])
    ours_model = all(outcome.get(f"{k} ours") == EXACT for k in keys)
    plain = [outcome.get(f"{k} plain") for k in keys]
    plain_bad = [p or "no result" for p in plain if p != EXACT]
    into = f"{other} and plain tensors" if other is not None else "plain tensors"
    _line(
        out,
        f"compare  ours {'PASS' if ours_model else 'FAIL'}  "
        f"plain DCP {'FAIL' if plain_bad else 'PASS'}  the demo model saved on "
        f"{summary['saved_on']}, loaded into {into}" + (f": {plain_bad[0]}" if plain_bad else ""),
    )


def _probe_comparison(summary: Mapping[str, Any], outcome: Mapping[str, str], out: IO[str]) -> bool:
    """The ``compare`` line(s) of the probe; True unless our planners failed on it."""
    probe = summary["probe"]
    if probe["kind"] == "none":
        _line(
            out,
            f"compare  ours n/a   plain DCP n/a   {probe['title']} (needs {probe['needs']}; "
            "meshlayout demo --nproc 6 shows plain DCP failing on uneven FSDP over TP)",
        )
        return True
    mine, theirs = outcome.get("probe ours"), outcome.get("probe plain")
    if theirs == EXACT:
        verdict = f"plain DCP PASS  {probe['title']} (torch 2.13 fails here: a fixed torch?)"
    else:
        verdict = f"plain DCP FAIL  {probe['title']}: {theirs or 'no result'}"
    _line(
        out,
        f"compare  ours {_verdict(mine)}  {verdict}"
        + (f" [ours{_failed(mine)}]" if mine != EXACT else ""),
    )
    if summary.get("probe_note"):
        _line(out, f"         ({summary['probe_note']})")
    return mine == EXACT


def _load_plain(root: str, who: str, like: Mapping[str, Any]) -> dict[str, Any]:
    """Load ``root/who`` into zeroed plain tensors shaped like ``like``, in this process."""
    import warnings

    import torch
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from ..torch import checkpoint as mlcp

    state = {"model": {k: torch.zeros_like(v) for k, v in like.items()}}
    path = os.path.join(root, who)
    with warnings.catch_warnings():  # DCP warns that no_dist means one process: we know
        warnings.simplefilter("ignore", UserWarning)
        if who == "ours":
            mlcp.load(state, path, no_dist=True)
        else:
            dcp_load(state, checkpoint_id=path, no_dist=True)
    return dict(state["model"])


def _plain_tensor_check(root: str, who: str, trained: Mapping[str, Any]) -> str:
    try:
        got = _load_plain(root, who, trained)
    except BaseException as exc:
        return f"dcp.load fails: {error_message(exc)}"
    return differences(got, trained)


def _chunk_summary(root: str) -> tuple[bool, str]:
    """Our checkpoint as ``meshlayout checkpoint`` sees it: tensors, chunks, exact tiling."""
    from ..torch.checkpoint import describe_checkpoint

    try:
        described = describe_checkpoint(os.path.join(root, "ours"))
    except (OSError, ValueError) as exc:
        return False, f"cannot read it back ({exc})"
    tensors = described["tensors"]
    chunks = sum(len(t["chunks"]) for t in tensors)
    if described["ok"]:
        return True, f"{len(tensors)} tensors in {chunks} chunks, every tensor tiles exactly"
    bad = ", ".join(f"{t['name']}: {t['tiling']}" for t in tensors if not t["exact"])
    return False, f"{len(tensors)} tensors in {chunks} chunks; NOT EXACT: {bad}"


def _line(out: IO[str], text: str) -> None:
    print(text, file=out)


def _verdict(outcome: str | None) -> str:
    return "PASS" if outcome == EXACT else "FAIL"


def _processes(n: int) -> str:
    return f"{n} process" + ("" if n == 1 else "es")


def _failed(outcome: str | None) -> str:
    return "" if outcome == EXACT else f": {outcome or 'no result'}"
