"""The process groups Megatron-Core creates: one :class:`MegatronView` per kind, and names.

:data:`MEGATRON_VIEWS` is the table every other part of :mod:`meshlayout.megatron`
reads: which grid a view lives on, the ``RankGenerator.get_ranks`` token that
selects its dims, Megatron's ``group_desc`` and ``parallel_state`` getter, and
what the groups are for. :func:`view_name` reads a user's spelling of a view.

>>> MEGATRON_VIEWS["ep"].grid, MEGATRON_VIEWS["ep"].token
('expert', 'ep')
>>> view_name("tp-pp"), view_name("Expert_DP")
('mp', 'edp')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALIASES", "MEGATRON_VIEWS", "VIEWS", "MegatronView", "view_name"]


@dataclass(frozen=True)
class MegatronView:
    """One kind of process group Megatron-Core creates, as a view of :class:`MegatronDims`.

    ``grid`` is ``"dense"`` or ``"expert"``; ``token`` is the
    ``RankGenerator.get_ranks`` token on that grid (empty for the distributed-
    optimizer views, which split another view); ``group_desc`` is the name
    Megatron gives the groups; ``getter`` is the ``parallel_state`` call that
    returns a rank's group.
    """

    name: str
    grid: str
    token: str
    group_desc: str
    getter: str
    purpose: str


def _views(*rows: tuple[str, str, str, str, str, str]) -> dict[str, MegatronView]:
    return {r[0]: MegatronView(*r) for r in rows}


#: Every view, in the order :meth:`MegatronDims.views` returns them.
MEGATRON_VIEWS: dict[str, MegatronView] = _views(
    ("tp", "dense", "tp", "TENSOR_MODEL_PARALLEL_GROUP", "get_tensor_model_parallel_group()",
     "tensor parallel: activation all-reduce / all-gather / reduce-scatter in a layer"),
    ("cp", "dense", "cp", "CONTEXT_PARALLEL_GROUP", "get_context_parallel_group()",
     "context parallel: sequence chunks exchange K/V"),
    ("dp", "dense", "dp", "DATA_PARALLEL_GROUP", "get_data_parallel_group()",
     "data parallel: ranks that read different samples"),
    ("pp", "dense", "pp", "PIPELINE_MODEL_PARALLEL_GROUP", "get_pipeline_model_parallel_group()",
     "pipeline stages: send/recv of activations; the embedding groups are its first and last rank"),
    ("dp_cp", "dense", "dp-cp", "DATA_PARALLEL_GROUP_WITH_CP",
     "get_data_parallel_group(with_context_parallel=True)",
     "gradient all-reduce / reduce-scatter and the distributed optimizer (dp x cp)"),
    ("tp_cp", "dense", "tp-cp", "TENSOR_AND_CONTEXT_PARALLEL_GROUP",
     "get_tensor_and_context_parallel_group()", "tensor and context parallel together"),
    ("tp_dp", "dense", "tp-dp", "TENSOR_AND_DATA_PARALLEL_GROUP",
     "get_tensor_and_data_parallel_group()", "tensor and data parallel together"),
    ("tp_dp_cp", "dense", "tp-dp-cp", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP",
     "get_tensor_and_data_parallel_group(with_context_parallel=True)",
     "tensor, data and context parallel together (e.g. MoE router token counts, FP8 amax)"),
    ("mp", "dense", "tp-pp", "MODEL_PARALLEL_GROUP", "get_model_parallel_group()",
     "model parallel (tp x pp): e.g. gradient-norm and overflow reductions"),
    ("ep", "expert", "ep", "EXPERT_MODEL_PARALLEL_GROUP", "get_expert_model_parallel_group()",
     "expert parallel: token dispatch / combine all-to-all"),
    ("etp", "expert", "tp", "EXPERT_TENSOR_PARALLEL_GROUP", "get_expert_tensor_parallel_group()",
     "expert tensor parallel: tensor parallel inside each expert"),
    ("edp", "expert", "dp", "EXPERT_DATA_PARALLEL_GROUP", "get_expert_data_parallel_group()",
     "expert data parallel: gradient reduction of expert weights"),
    ("tp_ep", "expert", "tp-ep", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP",
     "get_expert_tensor_and_model_parallel_group()", "expert tensor and expert parallel together"),
    ("tp_ep_pp", "expert", "tp-ep-pp", "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP",
     "get_expert_tensor_model_pipeline_parallel_group()",
     "expert model parallel (etp x ep x pp): model-parallel reductions of MoE models"),
    ("intra_dp_cp", "dense", "", "INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP",
     "get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)",
     "one distributed-optimizer instance's share of each dp_cp group"),
    ("intra_edp", "expert", "", "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L0",
     "get_expert_data_parallel_group(partial_expert_data_parallel=True)",
     "one distributed-optimizer instance's share of each edp group"),
    ("inter_edp", "expert", "", "HIERARCHICAL_EXPERT_DATA_PARALLEL_GROUP_L1",
     "get_inter_distributed_optimizer_instance_group()",
     "the same edp slot across distributed-optimizer instances"),
    ("intra_dist_opt", "expert", "", "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
     "get_intra_distributed_optimizer_instance_group()",
     "every rank of one distributed-optimizer instance (edp share x tp_ep_pp)"),
)  # fmt: skip

#: What each view is for (as :data:`meshlayout.parallel_dims.VIEWS` for ParallelDims).
VIEWS: dict[str, str] = {name: view.purpose for name, view in MEGATRON_VIEWS.items()}

#: Other spellings accepted by :meth:`MegatronDims.mesh` (hyphens also read as underscores).
ALIASES: dict[str, str] = {
    "tp_pp": "mp",
    "model_parallel": "mp",
    "etp_ep": "tp_ep",
    "etp_ep_pp": "tp_ep_pp",
    "expert_tp": "etp",
    "expert_dp": "edp",
}


def view_name(name: object) -> str:
    """The key of :data:`MEGATRON_VIEWS` that ``name`` spells (case, hyphens, :data:`ALIASES`)."""
    if not isinstance(name, str):
        raise TypeError(
            f"a view name is a str, got {name!r}; valid views are {list(MEGATRON_VIEWS)}"
        )
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in MEGATRON_VIEWS:
        raise KeyError(
            f"unknown view {name!r}; valid views are {list(MEGATRON_VIEWS)} "
            f"(also {sorted(ALIASES)})"
        )
    return key
