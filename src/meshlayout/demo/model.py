"""The demo's model, its data and the single-process run every result is checked against."""

from __future__ import annotations

from typing import Any

from .config import GLOBAL_BATCH, HIDDEN, IN_FEATURES, LEARNING_RATE, OUT_FEATURES

__all__ = ["global_batch", "make_model", "reference"]


def make_model() -> Any:
    """The 10 -> 6 -> 10 MLP, seeded: every process builds the same weights."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(IN_FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, OUT_FEATURES))


def global_batch(step: int) -> tuple[Any, Any]:
    """The global batch of ``step`` (inputs, targets), the same in every process."""
    import torch

    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(GLOBAL_BATCH, IN_FEATURES, generator=gen)
    y = torch.randn(GLOBAL_BATCH, OUT_FEATURES, generator=gen)
    return x, y


def reference(steps: int) -> tuple[list[float], dict[str, Any]]:
    """Single-process training on the global batch: the ground truth."""
    import torch

    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for step in range(steps):
        x, y = global_batch(step)
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}
