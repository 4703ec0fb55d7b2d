"""Every private torch access of meshlayout, in one file.

torch has no public API for a few things the runtime needs: the default
store, a group created by its members only under a name we choose, a group
outside c10d's world over a store of its own (the sync group), a
``DeviceMesh`` over groups that already exist and a rank map shared between
meshes, and per-operation timeouts on collectives. This module wraps each of them
in one small function, so a torch upgrade touches this file only;
``tests/test_torch_private.py`` fails if a private torch name appears anywhere else
under ``src/``.

Supported: torch 2.10 (the first release whose ``DeviceMesh`` is built on CuTe
layouts) to 2.15. Where releases differ, the function holds one path per release
range, each saying where it was checked. Each function says which torch versions it
was checked on: ``2.13.0`` (CPU build) and ``2.10.0``, ``2.11.0``, ``2.12.1``,
``2.14.1``, ``2.15.0`` (CUDA builds run on the CPU), by the torch-side tests of
each version (``make test-torch TORCH=<version>``).

One private name lives elsewhere on purpose: ``sharding/_spec.py`` converts
to and from torch's ``_StridedShard`` placement (layer 2 cannot import this layer-4
module, and torch has no public name for that placement).

>>> CHECKED_ON
('2.10.0', '2.11.0', '2.12.1', '2.13.0', '2.14.1', '2.15.0')
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Store, TCPStore

from ._requirements import TORCH_VERSION

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from ..layout import Layout

__all__ = [
    "CHECKED_ON",
    "FAKE_BACKEND",
    "Store",
    "TCPStore",
    "all_gather_single",
    "all_reduce",
    "all_to_all_single",
    "backend_class_name",
    "broadcast",
    "create_group",
    "default_store",
    "default_timeout",
    "device_mesh_over_groups",
    "dispatch_mode",
    "is_registered",
    "local_tensor",
    "one_member_backend",
    "options_fields",
    "root_mesh",
    "stateless_group",
]

CHECKED_ON = ("2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1", "2.15.0")
"""torch versions on which every function below was checked."""

FAKE_BACKEND: str = str(getattr(dist.Backend, "FAKE", "fake"))
"""The name of torch's local ``fake`` backend: ``dist.Backend.FAKE`` from 2.11; 2.10 has
no constant and registers the backend as ``"fake"`` (checked on 2.10.0 to 2.15.0)."""


def _c10d() -> Any:
    from torch.distributed import distributed_c10d

    return distributed_c10d


# ---------------------------------------------------------------------- the default group


def default_store() -> Store:
    """The default process group's store (c10d's ``_get_default_store``).

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    store: Store = _c10d()._get_default_store()
    return store


def default_timeout(backend: str | None = None) -> timedelta:
    """c10d's default collective timeout for ``backend`` (default: the default group's).

    ``_get_default_timeout``: 30 min for gloo, 10 min for nccl on 2.10 to 2.15.
    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    name = str(dist.get_backend()) if backend is None else backend
    timeout: timedelta = _c10d()._get_default_timeout(dist.Backend(name))
    return timeout


def is_registered(pg: dist.ProcessGroup) -> bool:
    """Whether c10d still knows ``pg`` (False once destroyed): ``_world.pg_map``.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    return pg in _c10d()._world.pg_map


def backend_class_name(pg: dist.ProcessGroup, device: torch.device) -> str:
    """The class of the backend that serves ``pg`` on ``device`` (``_get_backend``), for
    reports: ``ProcessGroupGloo``, ``ProcessGroupNCCL``; on 2.15 ``"nccl"`` builds
    ``ProcessGroupNCCL2`` unless ``TORCH_DIST_USE_NCCL2=0``.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0 (gloo; nccl: by
    ``benchmarks/gpu_check.py``, on a GPU machine).
    """
    return type(pg._get_backend(device)).__name__


# ---------------------------------------------------------------------- group creation


def one_member_backend(backend: str) -> str:
    """The backend of a one-member group that would otherwise use ``backend``.

    torch's ``fake`` backend needs no communicator, and from 2.13 each of its
    collectives on one rank copies the input to the output, as a real one-rank group
    does; meshlayout uses it. The fake backend of 2.10 to 2.12 leaves the output of
    ``reduce_scatter`` (hence FSDP2's gradient reduction) and ``all_to_all``
    untouched, so there a one-member group is a real one-rank group of ``backend``.

    Checked on 2.13.0, 2.14.1, 2.15.0 (fake) and 2.10.0, 2.11.0, 2.12.1 (a real
    group): ``tests/test_torch_groups.py`` runs every collective on such a group.
    """
    return FAKE_BACKEND if TORCH_VERSION >= (2, 13) else backend


def options_fields(options: Any) -> list[tuple[str, str]]:
    """``(name, repr)`` of the data attributes of backend options, sorted by name.

    Public attributes, plus ``_timeout``: the gloo and nccl ``Options`` keep their
    timeout under that private name.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    fields = []
    for attr in sorted(dir(options)):
        if attr.startswith("__") or (attr.startswith("_") and attr != "_timeout"):
            continue
        try:
            value = getattr(options, attr)
        except Exception:
            continue
        if not callable(value):
            fields.append((attr, repr(value)))
    return fields


def create_group(
    members: tuple[int, ...],
    backend: str,
    options: Any,
    timeout: timedelta,
    name: str,
    desc: str,
) -> dist.ProcessGroup:
    """One process group over ``members`` (in that order) with OUR name, members only.

    torch has no public API that both creates a group by its members only and lets
    the caller choose the name (``new_group`` derives the name of a
    ``use_local_synchronization`` group from the number of groups the caller already
    holds, so members with different histories disagree and hang). We call
    ``_new_process_group_helper`` (what ``new_group`` itself calls) and record the
    global -> group rank map in ``_world.pg_group_ranks`` as ``new_group`` does, so
    ``get_process_group_ranks``, ``get_group_rank`` and DeviceMesh work on the result.
    The ``fake`` backend (one-member groups) registers itself when
    ``torch.testing._internal.distributed.fake_pg`` is imported.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0: the helper's parameters
    used here are the same on all (2.14 adds ``enable_reconfigure=False``; unused). On
    2.15 ``"nccl"`` builds ``ProcessGroupNCCL2`` unless ``TORCH_DIST_USE_NCCL2=0``; both
    take ``ProcessGroupNCCL.Options``.
    """
    c10d = _c10d()
    if backend == FAKE_BACKEND and FAKE_BACKEND.upper() not in dist.Backend._plugins:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401

    default_pg = c10d._get_default_group()
    _, store = c10d._world.pg_map[default_pg]
    me = default_pg.rank()
    device_id = default_pg.bound_device_id if backend != FAKE_BACKEND else None
    pg, _ = c10d._new_process_group_helper(
        len(members),
        members.index(me),
        list(members),
        backend,
        store,
        c10d.GroupName(name),
        backend_options=options,
        timeout=timeout,
        device_id=device_id,
        group_desc=desc,
    )
    c10d._world.pg_group_ranks[pg] = {g: i for i, g in enumerate(members)}
    result: dist.ProcessGroup = pg
    return result


def stateless_group(
    store: Store, rank: int, size: int, backend: str, timeout: timedelta, name: str
) -> dist.ProcessGroup:
    """A process group over ``store`` that c10d's world does not know (a sync group).

    What ``_new_process_group_helper`` builds, without registering it anywhere: a
    ``ProcessGroup`` on a ``PrefixStore`` with one gloo (cpu) or nccl (cuda) backend
    (``_set_default_backend``, ``_register_backend``, ``_set_group_name``, nccl's
    ``Options._timeout``). It needs no default group and ignores one that exists;
    ``torch.distributed``'s functions refuse it ("not registered"), its own methods
    (``all_to_all_single``, ``allreduce``, ``broadcast``) work, with per-operation
    timeouts (the functions below).

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0 (gloo: ``tests/test_torch_sync_group.py``;
    nccl is built the way c10d builds it, unchecked here: no GPU).
    """
    from torch._C._distributed_c10d import PrefixStore, ProcessGroup

    prefix = PrefixStore(f"{name}/", store)
    pg = ProcessGroup(prefix, rank, size)
    backend_store = PrefixStore(f"{backend}/", prefix)
    if backend == "gloo":
        kind, device = ProcessGroup.BackendType.GLOO, torch.device("cpu")
        impl: Any = dist.ProcessGroupGloo(backend_store, rank, size, timeout=timeout)
    elif backend == "nccl":
        kind, device = ProcessGroup.BackendType.NCCL, torch.device("cuda")
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = False
        options._timeout = timeout
        impl = dist.ProcessGroupNCCL(backend_store, rank, size, options)
    else:
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    pg._set_default_backend(kind)
    pg._register_backend(device, kind, impl)
    pg._set_group_name(_c10d().GroupName(name))
    return pg


# ---------------------------------------------------------------------- DeviceMesh


def device_mesh_over_groups(
    device_type: str,
    names: Sequence[str],
    axes: Sequence[Layout],
    rank_map: torch.Tensor,
    groups: Sequence[dist.ProcessGroup],
) -> DeviceMesh:
    """A torch ``DeviceMesh`` with our axes over a shared rank map, and our groups.

    The public ``DeviceMesh.from_group`` only takes the rank's own sub-mesh, so two
    meshes built from it never share a rank map and FSDP2 cannot combine a DP mesh
    with a TP mesh. torch's mesh model is ours (per-dim layouts over positions into
    one rank map, both row-major): we pass the axes as a ``_MeshLayout`` (private
    constructor arguments ``_layout``, ``_rank_map``, ``_init_backend``) and attach the
    groups by name (``_dim_group_names``) as ``from_group`` does. torch normalises
    each axis; we check that it enumerates the same positions.

    * 2.13 to 2.15: ``_MeshLayout`` is a sequence of per-dim ``_FlatLayout``; groups
      are also registered in the mesh's ``_pg_registry``.
    * 2.10 to 2.12: ``_MeshLayout`` is one pycute-style layout whose top-level modes
      are the dims, built from (sizes, strides); a dim of one mode is passed as ints
      (``DeviceMesh.__getitem__`` refuses to slice a dim whose stride is a tuple, so a
      flattened non-contiguous dim cannot be sliced there); 2.10 has no
      ``_pg_registry`` (``get_group`` resolves the names through c10d, where our
      groups are registered).

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    from torch.distributed import _mesh_layout as module
    from torch.distributed.device_mesh import DeviceMesh

    mesh_layout: Any = module  # its classes differ between releases
    if hasattr(mesh_layout, "_FlatLayout"):  # 2.13 to 2.15
        dims = [mesh_layout._FlatLayout(axis.shape, axis.stride) for axis in axes]
        layout = mesh_layout._MeshLayout(dims)
    else:  # 2.10 to 2.12: a dim of one mode as ints (torch slices only those)
        modes = [
            (axis.shape[0], axis.stride[0]) if len(axis.shape) == 1 else (axis.shape, axis.stride)
            for axis in axes
        ]
        layout = mesh_layout._MeshLayout(
            tuple(shape for shape, _ in modes), tuple(stride for _, stride in modes)
        )
        dims = [layout[i] for i in range(len(axes))]
    for name, axis, dim in zip(names, axes, dims):
        if dim.all_ranks_from_zero() != axis.indices().tolist():  # pragma: no cover
            raise RuntimeError(f"torch re-normalised axis {name!r} ({axis}) to {dim}")
    tdm = DeviceMesh(
        device_type,
        _layout=layout,
        _rank_map=rank_map,
        mesh_dim_names=tuple(names),
        _init_backend=False,
    )
    tdm._dim_group_names = [g.group_name for g in groups]
    registry = getattr(tdm, "_pg_registry", None)  # absent on 2.10
    if registry is not None:
        for g in groups:
            registry[g.group_name] = g
    return tdm


def dispatch_mode() -> Any:
    """torch's ``TorchDispatchMode`` base class (``torch.utils._python_dispatch``): the
    vLLM backend records weight loaders' copies with it.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


def root_mesh(device_mesh: Any) -> Any:
    """The mesh ``device_mesh`` was sliced from (itself if none): ``_get_root_mesh``.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    return device_mesh._get_root_mesh()


def local_tensor(dtensor: Any) -> torch.Tensor:
    """The tensor a DTensor wraps (``_local_tensor``), without ``to_local()``'s autograd
    wrapper, so its type (a tensor subclass with its own checkpoint protocol) shows.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    local: torch.Tensor = dtensor._local_tensor
    return local


# ---------------------------------------------------------------------- collectives with a timeout
#
# The ``torch.distributed`` collectives take no timeout: they use the group's, fixed
# at creation (the default group's comes from ``init_process_group``). The
# ProcessGroup methods they call take an options object whose ``timeout`` bounds the
# operation itself; gloo honours it (checked: a missing peer fails the op after that
# timeout, and the group's worker thread is free again). ``AllgatherOptions`` is not
# re-exported by ``torch.distributed``. Tensors must be real (callers view complex
# tensors as real) and contiguous; group ranks are positions in the group.


def all_gather_single(
    out: torch.Tensor, inp: torch.Tensor, group: dist.ProcessGroup, timeout: timedelta
) -> None:
    """``out`` = every member's ``inp`` concatenated in group-rank order.

    Checked on 2.13.0, 2.14.1, 2.15.0 (``all_gather_single``) and 2.10.0, 2.11.0,
    2.12.1 (``_allgather_base``).
    """
    opts = _c10d().AllgatherOptions()
    opts.timeout = timeout
    if TORCH_VERSION >= (2, 13):
        group.all_gather_single(out, inp, opts).wait()
    else:
        group._allgather_base(out, inp, opts).wait()


def all_reduce(
    tensor: torch.Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup, timeout: timedelta
) -> None:
    """Reduce ``tensor`` in place over ``group``.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    opts = dist.AllreduceOptions()
    opts.reduceOp = op  # type: ignore[assignment]  # pybind converts RedOpType
    opts.timeout = timeout
    group.allreduce([tensor], opts).wait()


def broadcast(
    tensor: torch.Tensor, root: int, group: dist.ProcessGroup, timeout: timedelta
) -> None:
    """Copy the group rank ``root``'s ``tensor`` to every member.

    Checked on 2.13.0, 2.10.0, 2.11.0, 2.12.1, 2.14.1, 2.15.0.
    """
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    opts.rootTensor = 0
    opts.timeout = timeout
    group.broadcast([tensor], opts).wait()


def all_to_all_single(
    out: torch.Tensor,
    inp: torch.Tensor,
    out_sizes: Sequence[int],
    in_sizes: Sequence[int],
    group: dist.ProcessGroup,
    timeout: timedelta,
) -> None:
    """Send ``in_sizes[j]`` elements of ``inp`` to group rank ``j``, receive into ``out``.

    Checked on 2.13.0, 2.14.1, 2.15.0 (``all_to_all_single``) and 2.10.0, 2.11.0,
    2.12.1 (``alltoall_base``).
    """
    opts = dist.AllToAllOptions()
    opts.timeout = timeout
    if TORCH_VERSION >= (2, 13):
        group.all_to_all_single(out, inp, list(out_sizes), list(in_sizes), opts).wait()
    else:
        group.alltoall_base(out, inp, list(out_sizes), list(in_sizes), opts).wait()
