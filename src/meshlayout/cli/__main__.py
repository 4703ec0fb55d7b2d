"""``python -m meshlayout.cli``: the ``meshlayout`` command."""

from __future__ import annotations

from .main import main

raise SystemExit(main())
