"""Move a spec to another verl release: keys carried to where the target release has them, keys it
removed dropped, and every default the spec relied on that changed pinned to its old value, so the run
behaves as before; what cannot be moved automatically becomes a decision for the user, with its line.

The facts come from the shipped schemas (which keys each release has, and their defaults) plus MOVES,
the renames a schema cannot show. The rewrite is a ruamel round trip of the spec's own file (and, with
`write_bases`, of the bases it extends): comments, key order and quoting stay as written. The result is
checked by the whole compiler against the target release before anyone sees it.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .derive import critic_in_use
from .diagnostics import Diagnostic, SpecError
from .load import Sourced, load
from .spec import Spec
from .validate import validate
from .yaml_edit import Doc
from .verl import determinism
from .overrides import determinism_defaults, verl_values
from .verl.program import MAIN_PPO
from .verl.check import NEEDS_PLUS, NOTE, Selection, all_keys, elsewhere, select, settings
from .verl.hydra import shown, verl_value
from .verl.place import KNOWN
from .verl.moves import carry, placeholder
from .verl.release import DEFAULT_CONFIG, ENGINE_KEY, MISSING, RELEASES, Release, docs as release_docs, snapshot
from .verl.rules import Config

if TYPE_CHECKING:
    from .catalog import Catalog


@dataclass(frozen=True)
class Change:
    """One line of the report."""

    kind: str          # moved, dropped, pinned, review, decision
    key: str           # the key as the source release names it ("" for a whole-spec decision)
    text: str          # what happened, or what the user must decide
    where: str = ""    # file:line:col of the spec line it concerns


@dataclass
class Plan:
    source: str
    target: str
    spec: str
    changes: list[Change] = field(default_factory=list)
    files: dict[Path, tuple[str, str]] = field(default_factory=dict)  # path -> (before, after)
    reformatted: dict[Path, int] = field(default_factory=dict)        # lines the YAML writer changed
    unpinned: int = 0  # changed defaults inside sections that are disabled in the migrated spec
    unused: int = 0  # changed defaults of the critic, which the run does not use
    notes: list[str] = field(default_factory=list)  # what the migration changes that no key shows
    valid: bool = True  # the rewritten spec validates against the target release

    def of(self, kind: str) -> list[Change]:
        return [c for c in self.changes if c.kind == kind]

    @property
    def decisions(self) -> list[Change]:
        return self.of("decision")

    def diff(self) -> str:
        out = []
        for path, (before, after) in self.files.items():
            a, b = (str(path), str(path)) if path.is_absolute() else (f"a/{path}", f"b/{path}")
            out += difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), a, b)
        return "".join(out)


# --- the plan ----------------------------------------------------------------------------------------


def plan(path: Path, target: str, catalog: Catalog, *, write_bases: bool = False) -> Plan:
    """What migrating the spec at `path` to verl `target` changes; raises SpecError on bad input."""
    from .pipeline import compile_spec

    display = str(path)
    if target not in RELEASES:
        raise SpecError([Diagnostic(display, 1, 1, "verl_version", f"--to {target}: verlc has no schema for verl "
                                                                    f"{target}; known: {', '.join(RELEASES)}")])
    try:  # where it starts must be right for its own release, but for the '+' it needs, which migrate writes
        compile_spec(path, catalog, display=display, source=display)
    except SpecError as exc:
        if not all(NEEDS_PLUS in d.message for d in exc.diagnostics):
            raise
    sourced = load(path, display)
    spec = validate(sourced, catalog.spec)
    source = spec.verl_version
    if spec.verl_commit or spec.program != MAIN_PPO:
        raise SpecError([sourced.diagnostic(("verl_commit",) if spec.verl_commit else ("program",),
                                            "migrate moves main_ppo specs between verl's releases; a commit or "
                                            "another program is moved by hand (verlc check says what breaks)")])
    if source not in RELEASES:
        raise SpecError([sourced.diagnostic(("verl_version",), f"verlc has no schema for verl {source}; "
                                                              f"migrate needs the release the spec was written for")])
    old = snapshot(source)
    chosen = select(spec.verl, old, spec.hydra.config_name)
    if isinstance(chosen, str):
        raise SpecError([sourced.diagnostic(("verl",), chosen)])
    out = Plan(source, target, display)
    docs = _docs(sourced)
    new = snapshot(target)
    if source == target:  # only the '+' the spec's keys need (a spec written before verlc required it)
        for s in settings(spec.verl, chosen.walker):
            _carry_setting(s, sourced, chosen, chosen, docs, out)
        if out.changes:
            _finish(out, docs, write_bases)
            problems = _problems(docs[0].path, out, catalog)
            out.valid = not problems
            out.changes += [Change("decision", d.path.removeprefix("verl."), d.message, f"{d.file}:{d.line}:{d.col}")
                            for d in problems]
        return out
    top = docs[0]
    top.put(("verl_version",), target) if "verl_version" in top.tree else _insert_version(top, target)

    engine = _engine(spec, sourced, chosen, new, docs, out)
    if engine is None:
        out.valid = False
        return _finish(out, docs, write_bases)
    goal = Selection(new, spec.hydra.config_name or DEFAULT_CONFIG, engine)
    if spec.reproducible and determinism.available(chosen) != determinism.available(goal):
        out.notes.append(f"reproducible: true: {determinism.describe(goal)} ({determinism.describe(chosen)})")
    for s in settings(spec.verl, chosen.walker):
        _carry_setting(s, sourced, chosen, goal, docs, out)
    for key in spec.sweep.matrix if spec.sweep else ():
        _carry_swept(key, sourced, out, docs)
    if not write_bases:  # a base may be shared by other specs: its lines are the user's to change
        bases = {str(d.path) for d in docs if not d.own}
        out.changes = [Change("decision", c.key, f"{c.kind} in a base spec: {c.text}; rerun with --write-bases to "
                                                 f"rewrite the base", c.where)
                       if c.kind in ("moved", "dropped") and c.where.rsplit(":", 2)[0] in bases else c
                       for c in out.changes]
    _finish(out, docs, write_bases)
    _pin_defaults(out, spec, chosen, goal, docs, write_bases, catalog)
    return out


def _docs(sourced: Sourced) -> list[Doc]:
    """The spec's own file first, then its bases (nearest first), each once."""
    seen: dict[Path, Doc] = {}
    for shown_name, _ in reversed(sourced.layers):
        path = Path(shown_name)
        if path.resolve() not in seen:
            seen[path.resolve()] = Doc(path, own=not seen)
    return list(seen.values())


def _insert_version(doc: Doc, target: str) -> None:
    keys = list(doc.tree)
    doc.tree.insert(keys.index("name") + 1 if "name" in keys else 0, "verl_version", target)
    doc.touched = True


def _engine(spec: Spec, sourced: Sourced, chosen: Selection, new: Release, docs: list[Doc],
            out: Plan) -> str | None:
    """The model_engine the spec gets in the target release (None: the plan stops at a decision)."""
    config = spec.hydra.config_name or DEFAULT_CONFIG
    if config not in new.configs:
        out.changes.append(Change("decision", "", f"verl {out.target} has no trainer config '{config}' "
                                                  f"(hydra.config_name); it has {', '.join(new.configs)}",
                                  _where(sourced, ("hydra", "config_name"))))
        return None
    engines = new.engines(config)
    written = ENGINE_KEY in spec.verl
    if engines == ("",):
        if written:
            doc = next(d for d in docs if d.node(("verl", ENGINE_KEY))[1])
            if spec.verl[ENGINE_KEY] != chosen.release.default_engine(config):
                out.changes.append(Change("decision", ENGINE_KEY, (
                    f"verl {out.target} has no model_engine; its trainer config chooses the engine: set "
                    f"hydra.config_name to the one for {spec.verl[ENGINE_KEY]} ({', '.join(new.configs)})"),
                    _where(sourced, ("verl", ENGINE_KEY))))
                return None
            doc.delete(("verl", ENGINE_KEY))
            out.changes.append(Change("dropped", ENGINE_KEY, f"verl {out.target} has no model_engine (it came in "
                                                             f"0.7.1); {config} is the {spec.verl[ENGINE_KEY]} "
                                                             f"engine's config", _where(sourced, ("verl", ENGINE_KEY))))
        return ""
    engine = chosen.engine or new.default_engine(config)
    if engine not in engines:
        out.changes.append(Change("decision", ENGINE_KEY, f"verl {out.target} has no model_engine '{engine}'; it "
                                                          f"has {', '.join(engines)}",
                                  _where(sourced, ("verl", ENGINE_KEY))))
        return None
    return engine


def _where(sourced: Sourced, loc: tuple[str | int, ...]) -> str:
    file, line, col = sourced.locate(loc, at_key=True)
    return f"{file}:{line}:{col}"


def _carry_setting(s: Any, sourced: Sourced, chosen: Selection, goal: Selection, docs: list[Doc],
                   out: Plan) -> None:
    """One `verl:` leaf of the spec: kept, moved to its new name (with the Hydra prefix it needs there), or
    dropped."""
    key, moves = carry(s.key, chosen.release.version, goal.release.version)
    parts = key.split(".")
    place = goal.walker.place(parts)
    where = _where(sourced, s.loc)
    if place.status != KNOWN and not (s.explicit and not moves):
        hint = elsewhere(parts, goal.tree)
        out.changes.append(Change("dropped", s.key, f"{goal.release.label} has no {key}" + (
            f"; it has {hint}: if that is the same setting, set it there" if hint else ""), where))
        for doc in _holding(docs, s.loc):
            doc.delete(s.loc)
        return
    prefix, why = _prefix_needed(s, key, place, goal)
    if not moves and not why:
        return  # kept as written
    new_loc = ("verl", *_with_prefix(parts, prefix, goal))
    if new_loc == s.loc:
        return
    depth = next(i for i, (a, b) in enumerate(zip(s.loc, new_loc)) if a != b)
    for doc in _holding(docs, s.loc):
        near = (depth, doc.position(s.loc[:depth + 1]))
        value, comment = doc.delete(s.loc)
        doc.put(new_loc, value, near=near, carried=comment)
    shown_key = ".".join(new_loc[1:])
    if moves:
        out.changes.append(Change("moved", s.key, f"-> {shown_key} (" + ", ".join(f"verl {m.release}" for m in moves)
                                  + ")" + (f"; {why}" if why else ""), where))
    else:
        out.changes.append(Change("moved", s.key, f"-> {shown_key}: {why}", where))


def _prefix_needed(s: Any, key: str, place: Any, goal: Selection) -> tuple[str, str]:
    """(the Hydra prefix the key needs in the target release, why it differs from the spec's; '' if it does
    not): a key its YAML lacks is added with '+'; a '+' over a value it has set is refused by Hydra."""
    version = goal.release.version
    if place.status == KNOWN and not place.in_yaml and not s.prefix:
        return "+", f"verl {version}'s YAML does not have it, so Hydra adds it only with '+'"
    if s.prefix == "+" and place.status == KNOWN and place.in_yaml and not isinstance(s.value, (dict, list)) \
            and Config(goal.tree, {}).get(key) not in (None, MISSING):
        return "", f"verl {version} has it, so no '+'"
    return s.prefix, ""


def _with_prefix(parts: list[str], prefix: str, goal: Selection) -> list[str]:
    """The key's parts with the prefix on its first key that the target's YAML lacks (else on its leaf)."""
    if not prefix:
        return list(parts)
    at = next((i for i in range(len(parts)) if not goal.walker.place(parts[:i + 1]).in_yaml), len(parts) - 1)
    return [*parts[:at], prefix + parts[at], *parts[at + 1:]]


def _carry_swept(key: str, sourced: Sourced, out: Plan, docs: list[Doc]) -> None:
    """A sweep's `verl.<key>` under its new name, in place (a key the target lacks: the check says so)."""
    new, moves = carry(key.removeprefix("verl."), out.source, out.target)
    if not moves:
        return
    loc = ("sweep", "matrix", key)
    for doc in _holding(docs, loc):
        matrix, _ = doc.node(loc[:-1])
        matrix.insert(list(matrix).index(key), f"verl.{new}", matrix.pop(key))
        doc.touched = True
    out.changes.append(Change("moved", key, f"-> verl.{new} (" + ", ".join(f"verl {m.release}" for m in moves)
                              + ")", _where(sourced, loc)))


def _holding(docs: list[Doc], loc: tuple[str | int, ...]) -> Iterator[Doc]:
    yield from (d for d in docs if d.node(loc)[1])


def _finish(out: Plan, docs: list[Doc], write_bases: bool) -> Plan:
    """Record each file's new text; a base (`extends:`) is rewritten only when asked."""
    out.files.clear()
    for doc in docs:
        after = _modeline(doc.after(), out.source, out.target)
        if after == doc.before or (not doc.own and not write_bases):
            continue
        out.files[doc.path] = (doc.before, after)
        if doc.style_loss:
            out.reformatted[doc.path] = doc.style_loss
    return out


def _modeline(text: str, source: str, target: str) -> str:
    """The editor's schema follows the release: `$schema=.../verl-<source>.json` -> verl-<target>.json."""
    return re.sub(rf"^(# yaml-language-server: \$schema=\S*verl-){re.escape(source)}(\.json)$",
                  rf"\g<1>{target}\g<2>", text, flags=re.M)


def _values(spec: Spec, chosen: Selection) -> dict[str, Any]:
    """Every verl key the spec or verlc sets, as lowering passes them."""
    values = {**verl_values(spec, chosen), **determinism_defaults(spec, chosen)}
    return {k: verl_value(v) for k, v in values.items()}


def _pin_defaults(out: Plan, spec: Spec, chosen: Selection, goal: Selection, docs: list[Doc],
                  write_bases: bool, catalog: Catalog) -> None:
    """Pin every default the spec relied on whose value the target changed; keep only pins the target takes."""
    top = docs[0]
    texts = {p.resolve(): after for p, (_, after) in out.files.items()}
    moved = _load_spec(top.path, texts, out, catalog)
    if moved is None:
        return
    set_before = _values(spec, chosen)
    before = Config(chosen.tree, set_before)
    set_after = _values(moved, goal)
    after = Config(goal.tree, set_after)
    pins: dict[str, tuple[Any, Any]] = {}
    review: list[Change] = []
    unchecked = [(k.partition("@")[2] or k.partition("@")[0].replace("/", ".")) for k in spec.hydra.groups]
    for key in all_keys(chosen.tree):
        if ("_target_" in key or isinstance(_raw(chosen.tree, key), dict) or _set(key, set_before)
                or placeholder(key, out.source)):
            continue
        new_key, _ = carry(key, out.source, out.target)
        if _set(new_key, set_after):
            continue
        if new_key.startswith("critic.") and not critic_in_use(moved.verl):
            out.unused += 1  # no critic runs: its settings do nothing, before or after
            continue
        place = goal.walker.place(new_key.split("."))
        if (place.status != KNOWN or not place.in_yaml or isinstance(place.default, dict)
                or placeholder(new_key, out.target) or any(new_key.startswith(p + ".") for p in unchecked)):
            continue
        was, now = before.get(key), after.get(new_key)
        if was == MISSING or _same(was, now):
            continue
        if was is None:  # the old release decided in its code; what it decided, verlc cannot know
            review.append(Change("review", new_key, f"verl {out.source} leaves it null (its code decides); verl "
                                                    f"{out.target}'s default is {shown(now)}: not pinned, check it"))
            continue
        unknown = _unnamed_value(new_key, was, now, out.target)
        if unknown:
            out.changes.append(Change("decision", new_key, f"the spec relied on verl {out.source}'s default "
                                                           f"{shown(was)}; {out.target}'s is {shown(now)}, and {unknown}: "
                                                           f"choose a value {out.target} takes"))
            continue
        raw = _raw(chosen.tree, key)  # an interpolation stays one: it follows the key it names
        pins[new_key] = (raw if isinstance(raw, str) and "${" in raw else was, now)
    pinned = Config(goal.tree, {**set_after, **{k: v for k, (v, _) in pins.items()}})
    for key in [k for k in pins if _disabled(pinned, k)]:  # settings of a feature that is off do nothing
        del pins[key]
        out.unpinned += 1
    for c in review:
        if _disabled(pinned, c.key):
            out.unpinned += 1
        else:
            out.changes.append(c)
    for key, (was, now) in pins.items():
        top.put(("verl", *key.split(".")), was, f"verl {out.source}'s default; {out.target}'s is {shown(now)}")
    for _ in range(3):  # a pin the target refuses is a decision; taking it out may show the next one
        _finish(out, docs, write_bases)
        problems = _problems(top.path, out, catalog)
        refused = {k for k in pins if any(d.path == f"verl.{k}" for d in problems)}
        for key in refused:
            was, now = pins.pop(key)
            top.delete(("verl", *key.split(".")))
            message = next(d.message for d in problems if d.path == f"verl.{key}")
            out.changes.append(Change("decision", key, f"the spec relied on verl {out.source}'s default "
                                                       f"{shown(was)}; {out.target}'s is {shown(now)} and it "
                                                       f"refuses the old one ({message}): choose a value"))
        if not refused:
            break
    _finish(out, docs, write_bases)
    for key, (was, now) in pins.items():
        out.changes.append(Change("pinned", key, f"{shown(was)} (verl {out.target}'s default: {shown(now)})"))
    problems = _problems(top.path, out, catalog)
    out.valid = not problems
    for d in problems:
        out.changes.append(Change("decision", d.path.removeprefix("verl."), d.message, f"{d.file}:{d.line}:{d.col}"))


def _unnamed_value(key: str, was: Any, now: Any, target: str) -> str | None:
    """Why an old default is not a value the target takes, or None. verl's description of a key lists the
    values its code knows (e.g. rollout.load_format: "dummy, hf, megatron, ..."): where it names the new
    default and not the old one, the old one means nothing to that release (0.4.1's dummy_dtensor)."""
    if not (isinstance(was, str) and isinstance(now, str)):
        return None
    text = release_docs(target)["keys"].get(key) or ""

    def names(value: str) -> bool:
        return re.search(rf"(?<![\w-]){re.escape(value)}(?![\w-])", text) is not None

    if text and names(now) and not names(was):
        return f"verl {target}'s description of it names no {shown(was)} (\"{text[:120]}\")"
    return None


def _load_spec(path: Path, texts: dict[Path, str], out: Plan, catalog: Catalog) -> Spec | None:
    try:
        return validate(load(path, str(path), texts=texts), catalog.spec)
    except SpecError as exc:
        for d in exc.diagnostics:
            out.changes.append(Change("decision", d.path, d.message, f"{d.file}:{d.line}:{d.col}"))
        out.valid = False
        return None


def _problems(path: Path, out: Plan, catalog: Catalog) -> list[Diagnostic]:
    """What the whole compiler says about the rewritten spec, against the target release (notes aside)."""
    from .pipeline import compile_spec

    texts = {p.resolve(): after for p, (_, after) in out.files.items()}
    try:
        compile_spec(path, catalog, display=str(path), source=str(path), texts=texts)
    except SpecError as exc:
        return [d for d in exc.diagnostics if not d.message.startswith(NOTE)]
    return []


def _raw(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def _set(key: str, values: dict[str, Any]) -> bool:
    """Whether the spec (or verlc) sets this key, a section holding it, or a key below it."""
    return any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for k in values)


def _same(a: Any, b: Any) -> bool:
    """Equal as verl would use them: True is not 1, 1 is 1.0, lists item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _disabled(config: Config, key: str) -> bool:
    """Inside a section whose `enable` is false: its settings do nothing (the switch itself counts)."""
    parts = key.split(".")
    switches = {".".join([*parts[:i], "enable"]) for i in range(1, len(parts))} - {key}
    return any(config.get(k) is False for k in switches)


def write(p: Plan) -> None:
    """Rewrite the plan's files: every new text is written beside its file first, then each replaces its
    file, so an interrupted write leaves each file whole (old or new)."""
    staged = []
    try:
        for path, (_, after) in p.files.items():
            temp = path.with_name(f".{path.name}.verlc-migrate")
            temp.write_text(after, encoding="utf-8")
            shutil.copymode(path, temp)
            staged.append((temp, path))
        for temp, path in staged:
            os.replace(temp, path)
    finally:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)


# --- the report ----------------------------------------------------------------------------------------

_TITLES = {"moved": "Moved", "dropped": "Dropped (the target release has no such key)",
           "pinned": "Defaults pinned to the old release's value (the spec relied on them)",
           "review": "Changed defaults verlc cannot pin (check them)",
           "decision": "Decisions for you (not migrated automatically)"}


def report(p: Plan, markdown: bool = False) -> str:
    lines: list[str] = []
    head = f"verlc migrate {p.spec}: verl {p.source} -> {p.target}"
    lines += [f"# {head}"] if markdown else [head]
    if p.source == p.target and not p.changes:
        lines += ["", f"the spec already targets verl {p.target}; nothing to do"] if markdown else [
            f"the spec already targets verl {p.target}; nothing to do"]
        return "\n".join(lines) + "\n"
    for kind in ("moved", "dropped", "pinned", "review", "decision"):
        items = p.of(kind)
        if not items:
            continue
        lines += ["", f"## {_TITLES[kind]}", ""] if markdown else [f"{_TITLES[kind]}:"]
        for c in items:
            where = f" ({c.where})" if c.where else ""
            key = f"`{c.key}`" if markdown and c.key else c.key
            text = f"{key}: {c.text}" if c.key else c.text
            lines.append(f"- {text}{where}" if markdown else f"  {text}{where}")
    notes = []
    if p.unpinned:
        notes.append(f"{p.unpinned} changed default(s) inside sections the migrated spec leaves disabled (enable: false) were not pinned")
    if p.unused:
        notes.append(f"{p.unused} changed default(s) of the critic were not pinned: this run uses none (only gae does)")
    notes += p.notes
    notes += [f"{path}: the YAML writer also reformats {n} line(s) of this file" for path, n in p.reformatted.items()]
    if not p.changes:
        notes.append("no key moved, none dropped, no default the spec relies on changed")
    if notes:
        lines += ["", "## Notes", ""] if markdown else ["Notes:"]
        lines += [f"- {n}" if markdown else f"  {n}" for n in notes]
    verdict = f"the migrated spec {'validates' if p.valid else 'does not validate'} against verl {p.target}"
    if p.decisions:
        verdict = f"{len(p.decisions)} decision(s) left for you; {verdict}"
    lines += ["", verdict] if markdown else [verdict]
    return "\n".join(lines) + "\n"
