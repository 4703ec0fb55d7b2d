"""The weight transfer: a whole model moved between two parallel layouts, exactly.

One thing in four parts (``docs/transfer.md``). :class:`WeightTransfer` is built once
per pair of layouts and run after every step; :func:`transfer` is the one-shot form.

1. **Metadata exchange** (``_meta.py``): each side's inputs are read and checked (a
   source piece is a DTensor or ``(local, ShardingSpec)``, a destination a spec or
   ``(spec, dtype)``), then every rank posts what it holds to the store and waits,
   bounded by the timeout, for the ranks of both sides; the lowest rank checks that
   they agree and posts the verdict, so a disagreement raises on every rank before
   any data moves, and absent ranks are named.
2. **Plan execution over rounds** (``_execute.py``): the pure plan
   (:func:`meshlayout.sharding.transfer_plan`) becomes this rank's schedule; each
   round packs its boxes (cast to the destination dtype) into one byte buffer, runs
   one ``all_to_all_single`` and unpacks into the destination pieces. Plan,
   schedule and buffers are made once and reused by every run.
3. **Fingerprints for verify** (``_fingerprint.py``): ``run(verify=True)`` compares
   order-independent, position-aware fingerprints of the source elements, of every
   source replica and of every destination piece, with one small all-reduce.
4. **Sync groups for two worlds** (``_sync.py``): :func:`sync_group` joins two
   separately launched worlds (an RL trainer under torchrun, vLLM's workers) in a
   process group over its own ``TCPStore``, which the transfer then runs over
   (``group=``).

Modules:

* ``_execute.py``: :class:`WeightTransfer`, :func:`transfer`; the schedule,
  ``pack_round`` / ``unpack_round``;
* ``_meta.py``: source and destination entries (``source_piece``, ``dest_entry``,
  ``check_piece``, dtype names) and the bounded metadata ``exchange``;
* ``_fingerprint.py``: ``Fingerprinter`` (and the reference ``fingerprint``);
* ``_sync.py``: :class:`SyncGroup`, :func:`sync_group`, ``open_store``.

What stays outside, because the rest of ``meshlayout.torch`` shares it: the package
uses ``torch/_collectives.py`` for bounded collectives (shared with the tensor
operations: ``full_tensor``, ``redistribute``, ``reshard``), ``torch/_store.py`` for
bounded store waits (shared with the mesh checks and group creation),
``torch/_groups.py`` for members-only groups, ``torch/_check.py``,
``torch/_errors.py`` (``TransferVerificationError`` with the other errors) and
``torch/_c10d.py`` (every private torch access). ``_collectives.Bounded`` names
:class:`SyncGroup` for typing only.

Other packages (``meshlayout.vllm``, ``meshlayout.torch.checkpoint``) import the names
below, never the private modules (``tests/test_layers.py`` checks it). Note that
``meshlayout.torch.transfer`` as an *attribute* of :mod:`meshlayout.torch` is the
function :func:`transfer` (its public API), so reach this package and its modules with
``from meshlayout.torch.transfer import ...`` / ``from meshlayout.torch.transfer._meta
import ...``; ``import meshlayout.torch.transfer as m`` and dotted strings for
``monkeypatch``/``mock.patch`` walk the attributes and find the function.

>>> from meshlayout.torch.transfer import WeightTransfer, sync_group, transfer
>>> from meshlayout.torch import transfer as one_shot
>>> one_shot is transfer
True
"""

from __future__ import annotations

from ._execute import WeightTransfer, transfer
from ._meta import dtype_name, dtype_of, is_dtensor, source_piece
from ._sync import SyncGroup, open_store, sync_group

__all__ = [
    "SyncGroup",
    "WeightTransfer",
    "dtype_name",
    "dtype_of",
    "is_dtensor",
    "open_store",
    "source_piece",
    "sync_group",
    "transfer",
]
