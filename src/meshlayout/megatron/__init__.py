"""Megatron-Core's process groups, exactly, as meshes over one rank map (layer 3).

Megatron-Core (``megatron.core.parallel_state.initialize_model_parallel``) places
ranks by an order string such as the default ``"tp-cp-ep-dp-pp"``, which lists
the parallel dims **innermost first**: consecutive ranks differ in ``tp``, then
``cp``, and so on. It lays out two grids over the same world with that one
string:

- the **dense** grid ``tp, cp, dp, pp`` (``ep`` is 1 there), for attention and
  dense layers, and
- the **expert** grid ``etp, ep, edp, pp`` (``tp`` in the string stands for the
  expert tensor-parallel size ``etp``, ``dp`` for the expert data-parallel size
  ``edp``; ``cp`` is 1 there), for MoE layers.

Each grid is a layout over rank space whose strides follow the order, so
:class:`MegatronDims` holds the two as root :class:`~meshlayout.mesh.Mesh`
objects (dims outermost first, i.e. the order string reversed) over one shared
rank map, and every group Megatron creates is a view of one of them: its
members, their order and the order of the groups are Megatron's.

>>> md = MegatronDims(16, tp=2, pp=2, ep=4)
>>> md.dense, md.expert
(Mesh(pp=2, dp=4, cp=1, tp=2), Mesh(pp=2, edp=1, ep=4, etp=2))
>>> md.mesh("dp").group(0, "dp"), md.mesh("ep").group(0, "ep")
((0, 2, 4, 6), (0, 2, 4, 6))

The expert dims follow the order string too: with ``ep`` outside ``dp``, an
expert-parallel group strides over the data-parallel ranks.

>>> MegatronDims(8, ep=2, order="tp-dp-cp-ep-pp").mesh("ep").group(0, "ep")
(0, 4)

The package: ``_views`` (the table of Megatron's groups, :data:`MEGATRON_VIEWS`),
``_config`` (order strings and the configurations Megatron accepts), ``_dims``
(:class:`MegatronDims`: the grids and their views). Text and JSON reports of its
views come from :mod:`meshlayout.render` (``plan_report`` / ``plan_text``), as for
``ParallelDims``.
"""

from __future__ import annotations

from ._config import DEFAULT_ORDER, ORDER_TOKENS, parallel_dims_order
from ._dims import MegatronDims
from ._dims import _restore as _restore  # pickles made before the split name it here
from ._views import ALIASES, MEGATRON_VIEWS, VIEWS, MegatronView

__all__ = [
    "ALIASES",
    "DEFAULT_ORDER",
    "MEGATRON_VIEWS",
    "ORDER_TOKENS",
    "VIEWS",
    "MegatronDims",
    "MegatronView",
    "parallel_dims_order",
]
