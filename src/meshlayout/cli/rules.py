"""Placement rules by tensor-name pattern: how a whole model is laid out on one mesh.

The mini-language of ``meshlayout transfer --src-rules/--dst-rules``, written the
way parallelize plans are (column-parallel here, row-parallel there, FSDP on the
rest):

    RULES      := RULE [";" RULE]...                (or repeat the flag)
    RULE       := PATTERNS ":" PLACEMENTS
    PATTERNS   := PATTERN ["," PATTERN]...          fnmatch, case-sensitive: * ? [abc]
    PLACEMENTS := one per mesh dim: S(d), SS(d,sf), R (as in meshlayout shard)

A tensor takes the placements of the **first** rule with a matching pattern, else
the default (``--src-default``/``--dst-default``; all ``R`` when not given). A rule
or default whose placements do not suit a tensor (``S(1)`` on a 1-D bias, a count
that differs from the mesh's dims, a pending ``P``) is an error naming the tensor,
its shape and the rule; nothing falls back silently.

>>> rules = parse_rules(["*.q_proj.weight,*.k_proj.weight: S(0); *.o_proj.weight: S(1)"], "--r")
>>> [(r.patterns, r.placements_text) for r in rules]
[(('*.q_proj.weight', '*.k_proj.weight'), 'S(0)'), (('*.o_proj.weight',), 'S(1)')]
>>> rule_for(rules, "layers.0.o_proj.weight")
1
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

from ..mesh import Mesh
from ..sharding import Partial, Placement, Replicate, ShardingSpec
from .args import ArgError, parse_placements, shown, split_top_level
from .model_tensors import TensorInfo

__all__ = ["Layout", "Rule", "layout_model", "parse_rules", "rule_for"]


@dataclass(frozen=True)
class Rule:
    """One rule: name patterns, the placements they get, and the text as typed (for errors)."""

    patterns: tuple[str, ...]
    placements: tuple[Placement, ...]
    placements_text: str
    text: str

    def matches(self, name: str) -> bool:
        """Whether any pattern matches ``name`` (``fnmatch``, case-sensitive)."""
        return any(fnmatchcase(name, p) for p in self.patterns)


def _placements(text: str, where: str) -> tuple[Placement, ...]:
    try:
        return tuple(parse_placements(text))
    except ArgError as exc:
        raise ArgError(f"{where}: {str(exc).removeprefix('--placements').lstrip(': ')}") from None


def parse_rule(text: str, flag: str) -> Rule:
    """One ``PATTERNS: PLACEMENTS`` rule; ArgError naming ``flag`` and the rule otherwise."""
    where = f"{flag} {shown(text.strip())}"
    patterns_text, colon, placements_text = text.rpartition(":")
    if not colon:
        raise ArgError(f"{where}: expected PATTERN[,PATTERN...]: PLACEMENTS")
    patterns = tuple(p.strip() for p in patterns_text.split(","))
    if not patterns_text.strip() or any(not p for p in patterns):
        raise ArgError(f"{where}: empty name pattern (expected PATTERN[,PATTERN...]: PLACEMENTS)")
    if not placements_text.strip():
        raise ArgError(f"{where}: no placements after ':'")
    placements = _placements(placements_text, where)
    return Rule(patterns, placements, placements_text.strip(), text.strip())


def parse_rules(texts: Iterable[str], flag: str) -> tuple[Rule, ...]:
    """Every rule of the flag's values, in order (each value may hold several, ``;``-separated)."""
    rules: list[Rule] = []
    for text in texts:
        parts = split_top_level(text, ";", what=flag)
        if not any(parts):
            raise ArgError(f"{flag} {shown(text)}: no rule (expected PATTERNS: PLACEMENTS[; ...])")
        rules.extend(parse_rule(p, flag) for p in parts if p)
    return tuple(rules)


def rule_for(rules: Sequence[Rule], name: str) -> int | None:
    """Index of the first rule matching ``name``, or None (the default applies)."""
    for i, rule in enumerate(rules):
        if rule.matches(name):
            return i
    return None


@dataclass(frozen=True)
class Layout:
    """One side of a transfer: a spec per tensor, which rule gave it, and unused rules."""

    specs: Mapping[str, ShardingSpec]
    rule_of: Mapping[str, int | None]  # None: the default
    rules: tuple[Rule, ...]
    default: tuple[Placement, ...]

    def unused_rules(self) -> list[int]:
        """Indices of rules no tensor took (a pattern typo, or shadowed by an earlier rule)."""
        used = set(self.rule_of.values())
        return [i for i in range(len(self.rules)) if i not in used]

    def why_unused(self, i: int) -> str:
        """Why rule ``i`` took no tensor: no name matches it, or earlier rules took them all.

        >>> from meshlayout import Mesh
        >>> t = [TensorInfo("a.weight", (4,), "float32"), TensorInfo("a.bias", (4,), "float32")]
        >>> rules = parse_rules(["*.weight: S(0); a.weight: R; *_prj.weight: R"], "--r")
        >>> layout = layout_model(t, Mesh({"dp": 2}), rules, None, flags=("--r", "--d", "--m"))
        >>> layout.unused_rules()
        [1, 2]
        >>> layout.why_unused(1)
        "every tensor it matches (1, e.g. 'a.weight') takes rule 1 ('*.weight: S(0)') first"
        >>> layout.why_unused(2)
        "it matches no tensor name (the 2 names look like 'a.weight')"
        """
        rule = self.rules[i]
        matched = [name for name in self.rule_of if rule.matches(name)]
        if not matched:
            example = next(iter(self.rule_of), None)
            look = (
                "" if example is None else f" (the {len(self.rule_of)} names look like {example!r})"
            )
            return f"it matches no tensor name{look}"
        first = self.rule_of[matched[0]]
        assert first is not None and first < i
        return (
            f"every tensor it matches ({len(matched)}, e.g. {matched[0]!r}) takes rule "
            f"{first + 1} ({self.rules[first].text!r}) first"
        )


def _check_count(placements: Sequence[Placement], mesh: Mesh, where: str, mesh_flag: str) -> None:
    if len(placements) != mesh.ndim:
        dims = ",".join(f"{n}={s}" for n, s in zip(mesh.names, mesh.shape))
        raise ArgError(
            f"{where}: {len(placements)} placements, but {mesh_flag} {dims} has "
            f"{mesh.ndim} dims (give one placement per mesh dim)"
        )
    partial = [p for p in placements if isinstance(p, Partial)]
    if partial:
        raise ArgError(f"{where}: {partial[0]!r} is a pending reduction; a transfer moves R or S")


def layout_model(
    tensors: Sequence[TensorInfo],
    mesh: Mesh,
    rules: tuple[Rule, ...],
    default: str | None,
    *,
    flags: tuple[str, str, str],
) -> Layout:
    """The spec of every tensor on ``mesh`` (first matching rule, else ``default``, else all R).

    ``default`` is the default flag's text (placements), or None. ``flags`` names
    (rules flag, default flag, mesh flag) for the errors, which are
    :class:`ArgError` naming the tensor, its shape and the rule or default.
    """
    rules_flag, default_flag, mesh_flag = flags
    for rule in rules:
        _check_count(rule.placements, mesh, f"{rules_flag} {shown(rule.text)}", mesh_flag)
    if default is not None:
        default_where = f"{default_flag} {shown(default)}"
        fallback = _placements(default, default_where)
        _check_count(fallback, mesh, default_where, mesh_flag)
    else:
        fallback = tuple(Replicate() for _ in mesh.shape)
    specs: dict[str, ShardingSpec] = {}
    rule_of: dict[str, int | None] = {}
    cache: dict[tuple[int | None, tuple[int, ...]], ShardingSpec] = {}
    for t in tensors:
        i = rule_for(rules, t.name)
        key = (i, t.shape)
        if key not in cache:
            placements = fallback if i is None else rules[i].placements
            try:
                cache[key] = ShardingSpec(t.shape, mesh, list(placements))
            except (ValueError, TypeError) as exc:
                if i is not None:
                    source = f"{rules_flag} {shown(rules[i].text)}"
                elif default is not None:
                    source = f"{default_flag} {shown(default)}"
                else:
                    source = f"the default (all R; give {default_flag})"
                reason = (
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                )
                raise ArgError(
                    f"{source}: tensor {t.name!r} of shape {t.shape} cannot take it: {reason}"
                ) from None
        specs[t.name] = cache[key]
        rule_of[t.name] = i
    return Layout(specs, rule_of, rules, fallback)
