"""Fail early, and clearly, when torch is missing or too old for this runtime.

Imported first by :mod:`meshlayout.torch`, which runs :func:`require_torch` on import.
Supported: torch 2.10 (the first release whose ``DeviceMesh`` is built on CuTe
layouts) and newer; the differences between releases live in :mod:`._c10d`.
"""

from __future__ import annotations

import importlib.util
import re

MIN_TORCH = (2, 10)


def parse_version(text: str) -> tuple[int, int]:
    """``(major, minor)`` of a torch version string such as ``"2.13.0+cpu"``.

    >>> parse_version("2.13.0+cpu")
    (2, 13)
    """
    m = re.match(r"(\d+)\.(\d+)", text)
    if m is None:
        raise ValueError(f"cannot read a torch version from {text!r}")
    return int(m.group(1)), int(m.group(2))


def require_torch() -> tuple[int, int]:
    """``(major, minor)`` of the installed torch; ImportError naming the fix if torch is
    absent or older than 2.10."""
    wanted = f"{MIN_TORCH[0]}.{MIN_TORCH[1]}"
    if importlib.util.find_spec("torch") is None:
        raise ImportError(
            f"meshlayout.torch needs PyTorch >= {wanted}; install it with "
            "pip install 'meshlayout[torch]' (the pure layers work without it)"
        )
    import torch

    version = parse_version(torch.__version__)
    if version < MIN_TORCH:
        raise ImportError(
            f"meshlayout.torch needs PyTorch >= {wanted} (the first release whose "
            f"DeviceMesh is built on CuTe layouts), found {torch.__version__}; upgrade "
            f"with pip install 'torch>={wanted}' (the pure layers work without torch)"
        )
    return version


TORCH_VERSION = require_torch()
"""``(major, minor)`` of the installed torch."""

TORCHTITAN_MIN_TORCH = (2, 13)
"""The drop-in needs torch >= 2.13 under torchtitan 0.3.0: pip cannot install torchtitan
on 2.10 (its ``torch_checkpointing`` dependency needs 2.11); on 2.11 its FSDP code fails
to import (``torch.distributed.fsdp.DataParallelMeshDims`` is new in 2.12); on 2.12
torchtitan's own ``build_mesh`` raises ``KeyError`` for some meshes of its
``spmd_types`` backend and our CPU runs of its trainer died with SIGSEGV, so the
drop-in cannot be checked against it there."""


def require_torchtitan() -> None:
    """ImportError naming the fix when torchtitan (the ``torchtitan`` extra) is missing
    or the installed torch is too old for torchtitan 0.3.0 (see
    :data:`TORCHTITAN_MIN_TORCH`)."""
    import torch

    if TORCH_VERSION < TORCHTITAN_MIN_TORCH:
        raise ImportError(
            "meshlayout.torch.torchtitan needs torchtitan 0.3.0 on torch >= 2.13 (2.10: pip "
            "cannot install it, torch_checkpointing needs 2.11; 2.11: its FSDP code imports "
            "torch.distributed.fsdp.DataParallelMeshDims, new in 2.12; 2.12: its own "
            "build_mesh fails for some meshes), found "
            f"{torch.__version__}: upgrade torch, then pip install 'meshlayout[torchtitan]'"
        )
    if importlib.util.find_spec("torchtitan") is not None:
        return
    raise ImportError(
        "meshlayout.torch.torchtitan needs torchtitan 0.3.0: pip install 'meshlayout[torchtitan]'"
    )
