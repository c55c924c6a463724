"""`verlc explain KEY [SPEC]`: what one verl setting is, in the spec's release and in the others, the rules
that read it, and, for a spec, where its value comes from and the override the bundle passes.

Facts come from the shipped schemas (compiler/verl/editor.py describes a key the way the editor schema
does); nothing here imports verl, Hydra or the targets, so it answers in a fraction of a second.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .derive import derived, resume_defaults
from .diagnostics import Diagnostic, SpecError, did_you_mean
from .load import Sourced, load
from .verl.moves import carry
from .spec import Spec
from .validate import validate
from .verl.check import all_keys, describe, select, settings
from .verl.release import ranges
from .verl.editor import Key, describe_key, walkers
from .verl.hydra import hydra_value, shown, verl_value
from .verl.place import KNOWN, Walker
from .verl.release import DEFAULT_CONFIG, MISSING, RELEASES, Release, snapshot
from .verl.rules import RULES

if TYPE_CHECKING:
    from .catalog import Catalog

DEFAULT_VERSION = Spec.model_fields["verl_version"].default


@dataclass(frozen=True)
class Origin:
    """Where a spec's value of the key comes from."""

    value: Any
    source: str    # "spec", "base", "sweep", "derived", "verlc", "default"
    where: str     # file:line:col, or the spec path it derives from
    override: str  # the exact Hydra override the bundle passes ("" when none)


def explain(key: str, catalog: Catalog, version: str | None = None, spec_path: Path | None = None,
            profile: str | None = None) -> str:
    """The text `verlc explain` prints; SpecError for a bad spec, an unknown release or key. `profile`: the site
    profile composed under the spec, as `verlc build --profile` does."""
    key = ".".join(part.lstrip("+") for part in key.removeprefix("verl.").split("."))
    sourced = spec = None
    if spec_path is not None:
        from . import profile as profiles
        from .pipeline import compile_spec, program_for, verl_release_for

        # a spec verlc would build
        compile_spec(spec_path, catalog, display=str(spec_path), source=str(spec_path), profile=profile)
        sourced = load(spec_path, str(spec_path))
        if profile is not None:
            sourced = profiles.under(sourced, spec_path, profile, catalog)[0]
        spec = validate(sourced, catalog.spec)
        # the config the spec's program composes, over its release or commit
        spec, program, _ = program_for(spec, sourced, verl_release_for(spec, sourced, "snapshot", spec_path),
                                       spec_path)
        release = program.release
        version = spec.verl_version
    else:
        version = version or DEFAULT_VERSION
        if version not in RELEASES:
            raise SpecError([Diagnostic("<command line>", 1, 1, "--verl-version",
                                        f"verlc has no schema for verl {version}; known: {', '.join(RELEASES)}")])
        release = snapshot(version)
    every = walkers(release)
    if spec is not None:  # the spec's own trainer config and engine first
        chosen = select(spec.verl, release, spec.hydra.config_name, spec.hydra.groups)
        assert not isinstance(chosen, str)
        every.sort(key=lambda w: (w.config, w.engine) != (chosen.config, chosen.engine))
    facts = describe_key(release, key, every)
    if facts is None:
        raise SpecError([Diagnostic("<command line>", 1, 1, "KEY", _unknown(key, release, every))])
    lines = [f"{key}  ({release.label}" + (f", {spec.program} with {release.primary}" if spec is not None
                                            and release.primary != DEFAULT_CONFIG else "") + ")"]
    if facts.description:
        lines.append(f"  {facts.description}")
    lines += _facts(facts, release, every)
    if release.commit is None and release.primary == DEFAULT_CONFIG:
        lines.append(f"  releases: {_releases(key, version)}")
    involved = [text for keys, text in RULES if key in keys]
    for i, text in enumerate(involved):
        lines.append(f"  {'rules:   ' if i == 0 else '         '} {text}")
    if spec is not None and sourced is not None and not facts.mapping:
        origin = _origin(key, spec, sourced, release)
        lines.append(f"  in {spec_path}: {_shown_origin(origin)}")
        lines.append(f"  override: {origin.override or '(none: verl uses its default)'}")
    return "\n".join(lines) + "\n"


def _facts(facts: Key, release: Release, every: list[Walker]) -> list[str]:
    place = facts.place
    out = []
    if facts.mapping:
        children = sorted({n for w in every for n in w.keys(facts.key.split("."))})
        out.append(f"  section:  {len(children)} keys: {', '.join(children[:12])}"
                   + (", ..." if len(children) > 12 else ""))
    else:
        out.append(f"  type:     {' or '.join(dict.fromkeys(describe(k) for k in place.kinds))}")
        default = place.default
        out.append(f"  default:  {'mandatory (???)' if default == MISSING else shown(default)}"
                   + ("" if place.in_yaml else " (not in verl's YAML: the dataclass's default applies)"))
    if facts.allowed:
        out.append(f"  allowed:  {', '.join(map(str, facts.allowed))}")
    if place.owner is not None:
        built = "builds" if place.built else "describes"
        out.append(f"  verl {built} it as {place.owner.name}.{facts.key.rsplit('.', 1)[-1]} ({place.owner.qualname})")
    variants = {f"{w.config}/{w.engine}" if w.engine else w.config for w in every}
    if set(facts.configs) != variants:
        out.append(f"  only in:  {', '.join(facts.configs)}")
    return out


def _has(release: Release, key: str) -> bool:
    parts = key.split(".")
    for w in walkers(release):
        p = w.place(parts)
        if p.status == KNOWN and (p.in_yaml or (p.owner is not None and parts[-1] in p.owner.fields)):
            return True
    return False


def _releases(key: str, version: str) -> str:
    """Every release's name for the key: 'A-B as x.y; C-D as z' (moves followed through MOVES)."""
    runs: dict[str, list[str]] = {}
    for other in RELEASES:
        name = key if other == version else carry(key, version, other)[0]
        if _has(snapshot(other), name):
            runs.setdefault(name, []).append(other)
        elif name != key and _has(snapshot(other), key):
            runs.setdefault(key, []).append(other)
    if not runs:
        return "none"
    parts = [f"{ranges(vs)}" + ("" if name == key else f" as {name}") for name, vs in runs.items()]
    missing = [v for v in RELEASES if not any(v in vs for vs in runs.values())]
    return "; ".join(parts) + (f"; not in {ranges(missing)}" if missing else "")


def _unknown(key: str, release: Release, every: list[Walker]) -> str:
    keys = {k for w in every for k in all_keys(w.tree)}
    hint = did_you_mean(key, keys)
    elsewhere = [v for v in RELEASES if v != release.version and _has(snapshot(v), key)]
    return (f"{release.label} has no key '{key}'{hint}"
            + (f"; verl {ranges(elsewhere)} has it (verlc explain {key} --verl-version {elsewhere[-1]})"
               if elsewhere else ""))


def _origin(key: str, spec: Spec, sourced: Sourced, release: Release) -> Origin:
    chosen = select(spec.verl, release, spec.hydra.config_name, spec.hydra.groups)
    assert not isinstance(chosen, str)
    from .lower import overrides

    passed = {o.key: o for o in overrides(spec, chosen)}
    override = passed[key].arg if key in passed else ""
    swept = spec.sweep.matrix.get(f"verl.{key}") if spec.sweep else None
    if swept is not None:
        where = _where(sourced, ("sweep", "matrix", f"verl.{key}"))
        each = " | ".join(f"{key}={hydra_value(verl_value(v))}" for v in swept)
        return Origin(list(swept), "sweep", where, f"{each} (one variant each)")
    for d in derived(spec, chosen.tree):
        if d.key == key:
            return Origin(d.value, "derived", f"{d.source} ({_where(sourced, tuple(d.source.split('.')))})", override)
    for s in settings(spec.verl, chosen.walker):
        if s.key == key:
            where = _where(sourced, s.loc)
            source = "spec" if where.rsplit(":", 2)[0] == sourced.file else "base"
            return Origin(s.value, source, where, override)
    if key in passed and (key in resume_defaults(spec, chosen.tree) or passed[key].origin == "reproducible"
                          or passed[key].origin.startswith("verlc")):
        return Origin(passed[key].value, "verlc", passed[key].origin, override)
    place = chosen.walker.place(key.split("."))
    return Origin(place.default, "default", "", override)


def _where(sourced: Sourced, loc: tuple[str | int, ...]) -> str:
    file, line, col = sourced.locate(loc, at_key=True)
    return f"{file}:{line}:{col}"


def _shown_origin(o: Origin) -> str:
    value = json.dumps(o.value) if o.source == "sweep" else shown(o.value)
    return {
        "spec": f"{value}, set at {o.where}",
        "base": f"{value}, set in a base spec at {o.where} (extends:)",
        "sweep": f"swept over {value} (sweep.matrix at {o.where})",
        "derived": f"{value}, derived by verlc from {o.where}",
        "verlc": f"{value}, set by verlc ({o.where})",
        "default": f"{value}, verl's default (the spec does not set it)",
    }[o.source]
