"""Pictures of meshes, views and shardings: text, JSON-ready reports, SVG and HTML (layer 3).

Pure: numpy only, no torch, no network. The ``meshlayout`` command
(:mod:`meshlayout.cli`) is a thin layer over these functions.

- :func:`mesh_svg` — an N-D mesh, each group of a view outlined and coloured;
- :func:`sharding_svg` — tensor cells coloured by the ranks that hold them, runs outlined;
- :func:`html_page` — one self-contained page of sections (tables, text, inline SVG);
- :func:`plan_report` / :func:`mesh_report` / :func:`shard_report` — JSON-ready dicts
  (keys documented in ``docs/cli.md``), and :func:`plan_text` / :func:`mesh_text` /
  :func:`shard_text` — their plain-text tables; ``complete=False`` gives the sampled
  plan and mesh reports of the text output (any world size: the groups shown are
  computed one by one, as :class:`RankSample`);
- :data:`LIST_LIMIT` — most numbers a complete answer (JSON, host counts, pictures)
  may enumerate; beyond it :class:`TooLargeError`;
- :mod:`~meshlayout.render.torch_view` — what torch 2.13 reports for a placement list.
"""

from ._fmt import RankSample, range_label, ranks_text
from ._svg import Svg, stack
from .html import Section, html_page
from .mesh_svg import mesh_picture, mesh_svg
from .reports import (
    LIST_LIMIT,
    TooLargeError,
    check_size,
    mesh_report,
    placement_text,
    plan_report,
    runs_bound,
    same_groups,
    shard_report,
)
from .sharding_svg import sharding_picture, sharding_svg
from .text import mesh_grid_text, mesh_text, plan_text, shard_grid_text, shard_text
from .torch_view import torch_local_shape_and_offset, torch_spec_runs

__all__ = [
    "LIST_LIMIT",
    "RankSample",
    "Section",
    "Svg",
    "TooLargeError",
    "check_size",
    "html_page",
    "mesh_grid_text",
    "mesh_picture",
    "mesh_report",
    "mesh_svg",
    "mesh_text",
    "placement_text",
    "plan_report",
    "plan_text",
    "range_label",
    "ranks_text",
    "runs_bound",
    "same_groups",
    "shard_grid_text",
    "shard_report",
    "shard_text",
    "sharding_picture",
    "sharding_svg",
    "stack",
    "torch_local_shape_and_offset",
    "torch_spec_runs",
]
