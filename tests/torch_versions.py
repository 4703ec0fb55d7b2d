"""Which torch versions the torch-behaviour assertions of the tests describe.

Tests compare meshlayout with torch and sometimes pin torch's own behaviour (a bug,
a naming rule). Those pinned facts were checked on the versions in
:data:`KNOWN_TORCH`; on any other torch, tests assert only meshlayout's own
guarantees (``describes_torch`` skips a test that is only about torch, and
``TORCH_IS_KNOWN`` guards a torch assertion inside a larger test).
``make test-torch-latest`` runs the torch-side tests on the newest torch.
"""

from __future__ import annotations

import importlib.metadata
import re

import pytest

KNOWN_TORCH = frozenset({(2, 13), (2, 14)})  # checked: 2.13.0 (CPU), 2.14.1 (CUDA build)


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

describes_torch = pytest.mark.skipif(
    not TORCH_IS_KNOWN,
    reason=f"pins torch behaviour checked on {sorted(KNOWN_TORCH)}; torch here is {TORCH}",
)
