"""A Llama-shaped model's tensors for the transfer benchmarks: name -> (shape, kind).

``kind`` says how tensor parallelism splits the tensor: ``"col"`` (rows: q, k, v,
gate, up, embeddings, output), ``"row"`` (columns: o, down) or ``"rep"`` (norms,
replicated). torchtitan's parameter names; ``kv_dim`` is the rows of k and v
(grouped-query attention), ``hidden`` by default.
"""

from __future__ import annotations

Shapes = dict[str, tuple[tuple[int, ...], str]]


def llama_shapes(
    vocab: int, hidden: int, intermediate: int, layers: int, kv_dim: int | None = None
) -> Shapes:
    """Every weight of an untied Llama: embeddings, ``layers`` blocks, final norm, output."""
    kv = hidden if kv_dim is None else kv_dim
    out: Shapes = {
        "tok_embeddings.weight": ((vocab, hidden), "col"),
        "norm.weight": ((hidden,), "rep"),
        "output.weight": ((vocab, hidden), "col"),
    }
    for i in range(layers):
        p = f"layers.{i}."
        out |= {
            p + "attention.wq.weight": ((hidden, hidden), "col"),
            p + "attention.wk.weight": ((kv, hidden), "col"),
            p + "attention.wv.weight": ((kv, hidden), "col"),
            p + "attention.wo.weight": ((hidden, hidden), "row"),
            p + "feed_forward.w1.weight": ((intermediate, hidden), "col"),
            p + "feed_forward.w3.weight": ((intermediate, hidden), "col"),
            p + "feed_forward.w2.weight": ((hidden, intermediate), "row"),
            p + "attention_norm.weight": ((hidden,), "rep"),
            p + "ffn_norm.weight": ((hidden,), "rep"),
        }
    return out
