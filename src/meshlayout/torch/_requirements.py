"""Fail early, and clearly, when torch is missing or too old for this runtime.

Imported first by :mod:`meshlayout.torch`, which runs :func:`require_torch` on import.
"""

from __future__ import annotations

import importlib.util
import re

MIN_TORCH = (2, 13)


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``"2.13.0+cpu"``.

    >>> parse_version("2.13.0+cpu")
    (2, 13)
    """
    m = re.match(r"(\d+)\.(\d+)", text)
    if m is None:
        raise ValueError(f"cannot read a torch version from {text!r}")
    return int(m.group(1)), int(m.group(2))


def require_torch() -> None:
    """Raise ImportError naming the fix if torch is absent or older than 2.13."""
    if importlib.util.find_spec("torch") is None:
        raise ImportError(
            "meshlayout.torch needs PyTorch >= 2.13; install it with "
            "pip install 'meshlayout[torch]' (the pure layers work without it)"
        )
    import torch

    if parse_version(torch.__version__) < MIN_TORCH:
        raise ImportError(
            f"meshlayout.torch needs PyTorch >= {MIN_TORCH[0]}.{MIN_TORCH[1]}, found "
            f"{torch.__version__}; upgrade with pip install 'torch>=2.13'"
        )


require_torch()
