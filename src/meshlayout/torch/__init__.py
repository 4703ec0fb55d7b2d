"""meshlayout on ``torch.distributed``: real process groups for pure meshes.

Needs torch and an initialised default process group (``torchrun`` or
``torch.distributed.init_process_group``). See ``docs/runtime.md``.
"""

from __future__ import annotations

from ._errors import MeshMismatchError, RankTimeoutError

__all__ = ["MeshMismatchError", "RankTimeoutError"]
