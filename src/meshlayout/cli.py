"""The ``meshlayout`` command (layer 4)."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``meshlayout`` command."""
    from .demo_layout import run

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] not in ("demo",):
        print(f"meshlayout: unknown command {args[0]!r}; valid: demo", file=sys.stderr)
        return 2
    run()
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
