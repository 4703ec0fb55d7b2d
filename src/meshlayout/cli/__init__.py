"""The ``meshlayout`` command (layer 4): one module per subcommand.

- :mod:`.main`: the entry point :func:`main` and the registry of subcommands;
- :mod:`.plan`, :mod:`.mesh`, :mod:`.shard`, :mod:`.reshard`, :mod:`.checkpoint`,
  :mod:`.demo`: one subcommand each (``HELP``, ``EPILOG``, ``add_arguments``, ``run``);
- :mod:`.args`: the argument mini-languages (placements, meshes, rank lists, sizes);
- :mod:`.output`: ``--format``/``--svg``/``--html``, writing files, JSON text.

Subcommand modules import :mod:`.args` and :mod:`.output`, which import none of them.
See ``docs/cli.md``.
"""

from __future__ import annotations

from .main import COMMANDS, Command, main

__all__ = ["COMMANDS", "Command", "main"]
