"""Why a load's keys are not in a checkpoint, in one line: the keys, what exists, the nesting.

DCP flattens a nested state dict into dotted keys (``{"model": {"w": t}}`` is stored
as ``model.w``). Loading with a key the checkpoint lacks is usually one of three
mistakes, each named by :func:`missing_keys_message`:

* a flat state dict against a checkpoint saved nested (``{"model": model.state_dict()}``):
  every missing key is stored under one prefix;
* the reverse, a nested state dict against a flat checkpoint;
* a misspelt or renamed key: the message lists what the checkpoint holds and the
  closest stored key.

>>> print(missing_keys_message(["w", "b"], ["model.b", "model.w", "step"]))
keys 'w', 'b' are not in the checkpoint, which holds them under 'model' (model.w, model.b): it was saved as {'model': state_dict}; load {'model': state_dict} the same way
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

__all__ = ["CheckpointKeyError", "missing_keys_message"]

_SHOWN = 4


class CheckpointKeyError(KeyError):
    """A key of the state dict to load is not in the checkpoint (a ``KeyError`` whose
    text is the message itself, not its ``repr``)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _listed(names: Sequence[str], limit: int = _SHOWN, quote: bool = True) -> str:
    shown = [repr(n) if quote else n for n in names[:limit]]
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(shown) + more


def _common_prefix(missing: Sequence[str], stored: set[str]) -> str | None:
    """The one prefix ``p`` with ``p + "." + key`` stored for every missing key, if any."""
    first = missing[0]
    for name in sorted(stored):
        if name.endswith("." + first):
            prefix = name[: -len(first) - 1]
            if all(f"{prefix}.{k}" in stored for k in missing):
                return prefix
    return None


def _stripped_prefix(missing: Sequence[str], stored: set[str]) -> str | None:
    """The one leading level ``p`` with every missing ``p.key`` stored as ``key``, if any."""
    head, dot, _ = missing[0].partition(".")
    if not dot:
        return None
    start = head + "."
    if all(k.startswith(start) and k[len(start) :] in stored for k in missing):
        return head
    return None


def missing_keys_message(missing: Sequence[str], stored: Sequence[str]) -> str:
    """One line: the keys a checkpoint lacks, what it holds instead, and the likely fix.

    ``missing``: the (flattened) state-dict keys not in the checkpoint, in state-dict
    order; ``stored``: the checkpoint's keys.

    >>> print(missing_keys_message(["model.w"], ["w", "b"]))
    key 'model.w' is not in the checkpoint, which holds it at the top level (w): it was saved without the 'model' level; load state_dict['model'] instead
    >>> print(missing_keys_message(["attn.wq.weiht"], ["attn.wq.weight", "attn.wk.weight"]))
    key 'attn.wq.weiht' is not in the checkpoint (it holds 2 keys: 'attn.wk.weight', 'attn.wq.weight'; closest: 'attn.wq.weight'); fix the key, or pass allow_partial_load=True to load only the keys it holds
    """
    names = set(stored)
    what = f"key {missing[0]!r}" if len(missing) == 1 else f"keys {_listed(missing)}"
    verb = "is" if len(missing) == 1 else "are"
    it = "it" if len(missing) == 1 else "them"
    prefix = _common_prefix(missing, names)
    if prefix is not None:
        where = _listed([f"{prefix}.{k}" for k in missing], quote=False)
        nested = f"{{{prefix!r}: state_dict}}" if "." not in prefix else f"nested as {prefix!r}"
        return (
            f"{what} {verb} not in the checkpoint, which holds {it} under {prefix!r} ({where}): "
            f"it was saved as {nested}; load {nested} the same way"
        )
    level = _stripped_prefix(missing, names)
    if level is not None:
        where = _listed([k[len(level) + 1 :] for k in missing], quote=False)
        return (
            f"{what} {verb} not in the checkpoint, which holds {it} at the top level ({where}): "
            f"it was saved without the {level!r} level; load state_dict[{level!r}] instead"
        )
    ordered = sorted(names)
    close = difflib.get_close_matches(missing[0], ordered, n=1, cutoff=0.6)
    closest = f"; closest: {close[0]!r}" if close else ""
    return (
        f"{what} {verb} not in the checkpoint (it holds {len(ordered)} keys: "
        f"{_listed(ordered)}{closest}); fix the key, or pass allow_partial_load=True to "
        "load only the keys it holds"
    )
