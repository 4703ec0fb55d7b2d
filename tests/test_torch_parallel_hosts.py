"""``build``'s hosts: from ``ranks_per_host`` or torchrun's environment, checked, reported.

On 4 gloo processes, each rank sets torchrun's variables (``LOCAL_WORLD_SIZE``,
``GROUP_RANK``) as an agent would before ``build``, so one machine plays several
hosts. The expectations are written out by hand for these 4 ranks: the host of each
rank, which views cross hosts, who raises what. ``tests/test_torchrun.py`` runs the
same code under real torchrun agents.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import pytest

pytest.importorskip("torch")

from meshlayout import ParallelDims
from meshlayout.torch._hosts import Hosts, hosts_from_environment

TP_OUTERMOST = "tp,pp,dp_replicate,dp_shard,cp"


def _as_torchrun(local_world_size: int | str, group_rank: int) -> None:
    os.environ["LOCAL_WORLD_SIZE"] = str(local_world_size)
    os.environ["GROUP_RANK"] = str(group_rank)


def _not_torchrun() -> None:
    os.environ.pop("LOCAL_WORLD_SIZE", None)
    os.environ.pop("GROUP_RANK", None)


def _build(pd: ParallelDims, **kwargs: Any) -> tuple[Any, list[str], str | None]:
    """(meshes or None, HostLayoutWarning messages, "ErrorType: message" or None)."""
    from meshlayout.torch import HostLayoutWarning, build

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            meshes = build(pd, "cpu", timeout=120, **kwargs)
            error = None
        except (ValueError, TypeError) as exc:
            meshes, error = None, f"{type(exc).__name__}: {exc}"
    host_warnings = [str(w.message) for w in caught if issubclass(w.category, HostLayoutWarning)]
    return meshes, host_warnings, error


def _scenarios(rank: int, world: int) -> dict[str, Any]:
    from meshlayout.torch import RankTimeoutError
    from meshlayout.torch._hosts import check_hosts

    res: dict[str, Any] = {}
    pd = ParallelDims(4, tp=2)

    _as_torchrun(2, rank // 2)  # two agents of two workers
    meshes, warned, error = _build(pd)
    res["two_hosts"] = {
        "error": error,
        "warned": warned,
        "hosts": meshes.hosts,
        "report": meshes.host_report(["tp", "fsdp", "batch", "cp"]),
        "spanned": [meshes.hosts_spanned(v) for v in ("tp", "fsdp", "batch", ("fsdp", "tp"))],
    }
    meshes, warned, error = _build(ParallelDims(4, tp=2, order=TP_OUTERMOST))
    res["tp_outermost"] = {
        "error": error,
        "warned": warned,
        "report": meshes.host_report(["tp", "fsdp"]),
    }
    _as_torchrun(4, 0)  # one agent of four workers
    meshes, warned, error = _build(ParallelDims(4, tp=2, order=TP_OUTERMOST))
    res["one_host_any_order"] = {"error": error, "warned": warned, "hosts": meshes.hosts}

    _as_torchrun(2, rank % 2)  # ranks numbered across the agents: not torchrun's numbering
    res["interleaved"] = _build(pd)[2]
    _as_torchrun(2, rank // 2)
    res["too_few_per_host"] = _build(pd, ranks_per_host=1)[2]
    res["too_many_per_host"] = _build(pd, ranks_per_host=4)[2]
    _as_torchrun(4 if rank == 0 else 2, rank // 2)  # agents that disagree on their size
    res["disagree"] = _build(pd)[2]
    _as_torchrun("two", rank // 2)
    res["bad_env"] = _build(pd)[2]
    res["bad_argument"] = _build(pd, ranks_per_host=0)[2]
    res["partial_host"] = _build(pd, ranks_per_host=3, check=False)[2]  # hosts of 3 and 1

    _as_torchrun(2, rank // 2)
    meshes, warned, error = _build(pd, check=False)
    res["unchecked"] = {"error": error, "hosts": meshes.hosts, "report": meshes.host_report([])}
    _not_torchrun()
    meshes, warned, error = _build(pd)
    res["unknown"] = {
        "error": error,
        "hosts": meshes.hosts,
        "report": meshes.host_report(),
        "spanned": meshes.hosts_spanned("tp"),
    }
    meshes, warned, error = _build(pd, ranks_per_host=4)  # one machine: one host of 4
    res["explicit"] = {"error": error, "hosts": meshes.hosts}
    res["explicit_two"] = _build(pd, ranks_per_host=2)[2]  # but all 4 are on this machine

    # rank 3 never reports its node: the others name it after the timeout
    from meshlayout.rank_map import RankMap

    if rank != 3:
        hosts = Hosts(2, "ranks_per_host=2", f"node {rank // 2}")
        try:
            check_hosts(hosts, RankMap(range(4)), timeout=_seconds(10), what="test")
            res["absent"] = "no error"
        except RankTimeoutError as exc:
            res["absent"] = (list(exc.missing), str(exc))
    return res


def _seconds(s: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=s)


@pytest.mark.torch
@pytest.mark.multiprocess
@pytest.mark.timeout(900)
def test_hosts_from_torchrun_environment_checked_and_reported() -> None:
    from multiproc import run_multiproc

    out = run_multiproc(_scenarios, 4, timeout=600)
    for rank, res in enumerate(out):
        two = res["two_hosts"]
        assert two["error"] is None and two["warned"] == []
        assert two["hosts"] == Hosts(
            2, "torchrun: LOCAL_WORLD_SIZE=2", two["hosts"].node, checked=True
        )
        assert two["hosts"].node.startswith(f"GROUP_RANK={rank // 2} (host ")
        assert two["report"].splitlines() == [
            "hosts: 2 x 2 ranks (torchrun: LOCAL_WORLD_SIZE=2); "
            "checked: every rank of a host reports the same node",
            "tp: every group in one host",  # (0, 1), (2, 3)
            "fsdp: 2/2 groups span 2 hosts",  # (0, 2), (1, 3)
            "batch: 2/2 groups span 2 hosts",
            "cp: every group in one host",  # size 1
        ]
        assert two["spanned"] == [1, 2, 2, 2]

        outer = res["tp_outermost"]  # tp groups (0, 2), (1, 3): across the two agents
        assert outer["error"] is None
        [message] = outer["warned"]
        assert "the rank order puts tp across hosts (2 ranks per host, torchrun" in message
        assert "2 of 2 tp groups span up to 2 hosts, e.g. [0, 2] on hosts [0, 1]" in message
        assert outer["report"].splitlines()[1:] == [
            "tp: 2/2 groups span 2 hosts  (warning: should stay inside a host)",
            "fsdp: every group in one host",
        ]
        assert res["one_host_any_order"]["error"] is None
        assert res["one_host_any_order"]["warned"] == []

        assert res["interleaved"] == out[0]["interleaved"]  # every rank, the same message
        assert res["interleaved"].startswith("ValueError: build(ParallelDims(4, ")
        assert "but they are on 2 different nodes" in res["interleaved"]
        assert (
            "ranks [0, 1] on host 0" in res["interleaved"]
            or "ranks [2, 3] on host 1" in (res["interleaved"])
        )
        assert res["too_few_per_host"] == out[0]["too_few_per_host"]
        assert "ranks_per_host=1 puts rank " in res["too_few_per_host"]
        assert "a host has more than 1 ranks" in res["too_few_per_host"]
        assert res["too_many_per_host"] == out[0]["too_many_per_host"]
        assert (
            "ranks_per_host=4 puts ranks [0, 1, 2, 3] on host 0, but they are on 2 different nodes"
        ) in res["too_many_per_host"]
        assert res["disagree"].startswith("MeshMismatchError: build(")
        assert "ranks disagree on ranks_per_host" in res["disagree"]
        assert "ranks [1, 2, 3]: ranks_per_host=torchrun: LOCAL_WORLD_SIZE=2" in res["disagree"]
        assert res["bad_env"] == (
            "ValueError: torchrun's environment variable LOCAL_WORLD_SIZE='two' is not a "
            "positive integer"
        )
        assert res["bad_argument"] == "ValueError: ranks_per_host must be >= 1, got 0"
        assert res["partial_host"] == (
            "ValueError: ranks_per_host=3 does not divide the world of 4 ranks: the last host "
            "would hold 1 of 3 ranks (every host holds as many ranks)"
        )

        unchecked = res["unchecked"]
        assert unchecked["error"] is None and not unchecked["hosts"].checked
        assert unchecked["report"] == (
            "hosts: 2 x 2 ranks (torchrun: LOCAL_WORLD_SIZE=2); not checked (build(check=False))"
        )
        unknown = res["unknown"]
        assert unknown["error"] is None and unknown["hosts"] is None
        assert unknown["report"].startswith("hosts: unknown (not launched by torchrun")
        assert unknown["spanned"] is None
        explicit = res["explicit"]
        assert explicit["error"] is None
        assert explicit["hosts"].source == "ranks_per_host=4" and explicit["hosts"].checked
        assert "ranks_per_host=2 puts rank " in res["explicit_two"]  # hosts 0 and 1: one node
        if rank != 3:
            missing, message = res["absent"]
            assert missing == [3], message
            assert "never reported" in message or "did not answer" in message


# ---------------------------------------------------------------------- pure parts


def test_hosts_from_environment() -> None:
    env = {"LOCAL_WORLD_SIZE": "8", "GROUP_RANK": "3"}
    assert hosts_from_environment(None, env, "h") == Hosts(
        8, "torchrun: LOCAL_WORLD_SIZE=8", "GROUP_RANK=3 (host h)"
    )
    assert hosts_from_environment(4, env, "h") == Hosts(
        4, "ranks_per_host=4", "GROUP_RANK=3 (host h)"
    )
    assert hosts_from_environment(4, {}, "h") == Hosts(4, "ranks_per_host=4", "h")
    assert hosts_from_environment(None, {}, "h") is None
    assert hosts_from_environment(None, {"LOCAL_WORLD_SIZE": "8"}, "h") is None  # no node


@pytest.mark.parametrize(
    ("ranks_per_host", "env", "error", "message"),
    [
        (0, {}, ValueError, "ranks_per_host must be >= 1, got 0"),
        (True, {}, TypeError, "ranks_per_host must be an int, got True"),
        (2.0, {}, TypeError, "ranks_per_host must be an int, got 2.0"),
        (None, {"LOCAL_WORLD_SIZE": "0", "GROUP_RANK": "0"}, ValueError, "LOCAL_WORLD_SIZE='0'"),
        (None, {"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "-1"}, ValueError, "GROUP_RANK='-1'"),
        (None, {"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "x"}, ValueError, "GROUP_RANK='x'"),
    ],
)
def test_hosts_from_environment_refuses(
    ranks_per_host: Any, env: dict[str, str], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message.replace("(", r"\(").replace(")", r"\)")):
        hosts_from_environment(ranks_per_host, env, "h")


def test_host_of_and_describe() -> None:
    hosts = Hosts(3, "ranks_per_host=3", "h", checked=True)
    assert [hosts.host_of(r) for r in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    assert hosts.describe(7).startswith("hosts: 3 x 3 ranks (ranks_per_host=3); checked")
