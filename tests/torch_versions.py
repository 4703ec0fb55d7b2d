"""Which torch versions the torch-behaviour assertions of the tests describe.

Tests compare meshlayout with torch and sometimes pin torch's own behaviour (a bug,
a naming rule). Those pinned facts were checked on the versions in
:data:`KNOWN_TORCH`; on any other torch, tests assert only meshlayout's own
guarantees (``describes_torch`` skips a test that is only about torch, and
``TORCH_IS_KNOWN`` guards a torch assertion inside a larger test).
``make test-torch TORCH=<version>`` runs the torch-side tests on each supported torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

import pytest

KNOWN_TORCH = frozenset({(2, 10), (2, 11), (2, 12), (2, 13), (2, 14), (2, 15)})
"""Checked: 2.13.0 (CPU build); 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0 (CUDA builds)."""


def torch_version() -> tuple[int, int] | None:
    """(major, minor) of the installed torch, or None without torch (torch not imported)."""
    try:
        text = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


TORCH = torch_version()
TORCH_IS_KNOWN = TORCH in KNOWN_TORCH

#: The torchtitan drop-in needs torch >= 2.13 (``meshlayout.torch._requirements``: 2.10 cannot
#: install torchtitan 0.3.0, 2.11 cannot import it, on 2.12 its own build_mesh fails).
TORCHTITAN_MIN_TORCH = (2, 13)
TORCHTITAN_USABLE = importlib.util.find_spec("torchtitan") is not None and (
    TORCH is None or TORCH >= TORCHTITAN_MIN_TORCH
)
"""Whether the torchtitan comparisons can run here."""
TORCHTITAN_MISSING = (
    f"the torchtitan drop-in needs torch >= 2.13; torch here is {'.'.join(map(str, TORCH))}"
    if TORCH is not None and TORCH < TORCHTITAN_MIN_TORCH
    else "needs the `torchtitan` extra"
)
"""Why the torchtitan comparisons skip here."""


#: The backend of meshlayout's one-member groups in a gloo world: torch's local "fake"
#: backend where it copies for every collective (2.13 and newer), else a real one-rank
#: gloo group (2.10 to 2.12: tests/test_torch_groups.py shows why).
ONE_MEMBER_BACKEND = "fake" if TORCH is None or TORCH >= (2, 13) else "gloo"

#: Whether DCP's refusal of overlapping chunks names the tensor: "Failed to validate
#: global plan: key:<name> has overlapping chunks" from torch 2.12 on; 2.10 and 2.11
#: say only "Failed to validate global plan".
DCP_NAMES_OVERLAP = TORCH is None or TORCH >= (2, 12)
DCP_OVERLAP = "overlapping chunks" if DCP_NAMES_OVERLAP else "Failed to validate global plan"
"""A part of DCP's refusal of overlapping chunks every supported torch prints."""


def dcp_overlap_refusal(key: str) -> str:
    """DCP's whole refusal message for overlapping chunks of tensor ``key``."""
    if DCP_NAMES_OVERLAP:
        return f"Failed to validate global plan: key:{key} has overlapping chunks"
    return "Failed to validate global plan"


describes_torch = pytest.mark.skipif(
    not TORCH_IS_KNOWN,
    reason=f"pins torch behaviour checked on {sorted(KNOWN_TORCH)}; torch here is {TORCH}",
)
