"""One verl release's config as JSON Schema, for the `verl:` section of a spec: what editors complete,
check and show on hover (yaml-language-server), and what `verlc explain` says about a key.

Every key of every trainer config and model_engine of the release is described: its types (from the
dataclass verl builds, else from its YAML default), default, allowed values and verl's own words for it
(the comment its YAML gives it, else the dataclass field's documentation). A mapping verl builds a
dataclass from, or that its YAML closes, refuses unknown keys; as in Hydra, a key verl's YAML lacks (a
declared field, a new entry, a key of a free-form mapping) is written `+key`, and any `+key` is let through,
as the checks judge it; below a `+key`, free-form mappings take anything. Interpolations
(`${...}`) are strings wherever a key takes no string: `pattern` restricts only strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from .place import KNOWN, Place, Walker
from .release import MISSING, Release, docs

_JSON = {"int": "integer", "float": "number", "number": "number", "bool": "boolean", "str": "string",
         "list": "array", "dict": "object", "section": "object", "none": "null"}
INTERPOLATION = r"\$\{"


@dataclass(frozen=True)
class Key:
    """What a release says about one dotted key (the default config's view when configs differ)."""

    key: str
    place: Place
    allowed: tuple[Any, ...]
    description: str
    mapping: bool          # a section (its keys are set, not it)
    configs: tuple[str, ...]  # "config/engine" variants that have it


def walkers(release: Release) -> list[Walker]:
    """The default trainer config and engine first, then every other combination."""
    first = (next(iter(release.configs)), "")
    combos = [(c, e) for c in release.configs for e in release.engines(c)]
    combos.sort(key=lambda ce: (ce[0] != first[0], ce[1] != release.default_engine(ce[0])))
    return [Walker(release, c, e) for c, e in combos]


def describe_key(release: Release, key: str, every: list[Walker] | None = None) -> Key | None:
    """The release's facts about `key`, or None when no config of it has the key."""
    every = every or walkers(release)
    parts = key.split(".")
    found = [(w, p) for w in every if (p := w.place(parts)).status == KNOWN]
    if not found:
        return None
    walker, place = found[0]
    kinds = {k for _, p in found for k in p.kinds}  # what any config or engine takes, its YAML default too
    kinds |= {"none" for _, p in found if p.default is None and p.in_yaml}
    place = replace(place, kinds=("any",) if "any" in kinds else tuple(sorted(kinds)))
    scope = walker.context(parts)
    mapping = bool(scope is not None and (scope.node is not None and scope.node or scope.cls or scope.entries)
                   and isinstance(place.default, (dict, type(None))) and not place.stop) or place.kinds == ("section",)
    field = parts[-1]
    allowed = release.allowed.get(key) or (place.owner.allowed(field) if place.owner else ())
    known = docs(release.version) if release.source == "snapshot" else {"keys": {}, "fields": {}}
    text = known["keys"].get(key) or (known["fields"].get(place.owner.qualname, {}).get(field, "")
                                      if place.owner else "")
    names = tuple(f"{w.config}/{w.engine}" if w.engine else w.config for w, _ in found)
    return Key(key, place, tuple(allowed), text, mapping, names)


def verl_schema(release: Release) -> dict[str, Any]:
    """The JSON Schema of a spec's `verl:` section for this release; repeated sections become $defs."""
    every = walkers(release)
    schema = _section(release, every, [], 0)
    schema["properties"] = {"model_engine": {"enum": list(release.engines(next(iter(release.configs))))},
                            **schema["properties"]} if release.engines(next(iter(release.configs))) != ("",) \
        else schema["properties"]
    return schema


def _section(release: Release, every: list[Walker], parts: list[str], depth: int, added: bool = False) -> dict[str, Any]:
    """A mapping's schema. As in Hydra, a key verl's YAML lacks is written with '+' (`+name`), and any key below
    a '+' is plain; `added`: this mapping is such a key's value."""
    names = sorted({n for w in every for n in w.keys(parts)})
    props: dict[str, Any] = {}
    for name in names:
        key = ".".join([*parts, name])
        facts = describe_key(release, key, every)
        if facts is None:
            continue
        in_yaml = added or any((p := w.place([*parts, name])).status == KNOWN and p.in_yaml for w in every)
        if facts.mapping and depth < 12:
            sub = _section(release, every, [*parts, name], depth + 1, not in_yaml)
            if facts.description:
                sub["description"] = facts.description
            props[name if in_yaml else f"+{name}"] = sub
        else:
            props[name if in_yaml else f"+{name}"] = leaf(facts, release.version)
    scopes = [s for w in every if (s := w.context(parts)) is not None]
    out: dict[str, Any] = {"type": "object", "properties": props, "patternProperties": {r"^\+": {}}}
    entries = next((s.entries for s in scopes if s.entries is not None), None)
    if added and entries is not None:
        out["additionalProperties"] = {"type": "object"}
    elif not (added and any(s.open for s in scopes)):
        out["additionalProperties"] = False
    return out


def leaf(facts: Key, version: str) -> dict[str, Any]:
    kinds = facts.place.kinds
    out: dict[str, Any] = {}
    types = sorted({_JSON[k] for k in kinds if k in _JSON})
    if "any" not in kinds and kinds and not any(k[:2] in ("C:", "M:") for k in kinds):
        if "L" in kinds and facts.allowed:
            out["enum"] = [*facts.allowed, *([None] if "none" in kinds else [])]
            out["anyOf"] = [{"enum": out.pop("enum")}, {"type": "string", "pattern": INTERPOLATION}]
        else:
            if "string" not in types:
                types.append("string")
                out["pattern"] = INTERPOLATION
            out["type"] = types[0] if len(types) == 1 else types
            if facts.allowed:
                out["anyOf"] = [{"enum": list(facts.allowed)}, {"pattern": INTERPOLATION}]
    default = facts.place.default
    if default is not None and default != MISSING and not isinstance(default, dict):
        out["default"] = default
    notes = [f"verl {version}"]
    if default == MISSING:
        notes.append("mandatory")
    elif not isinstance(default, dict):
        notes.append(f"default {json.dumps(default)}")
    if facts.allowed:
        notes.append(f"one of {', '.join(map(str, facts.allowed))}")
    out["description"] = (facts.description + " " if facts.description else "") + f"({'; '.join(notes)})"
    return out
