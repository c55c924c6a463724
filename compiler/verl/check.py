"""A spec's `verl:` section against one verl release: keys, types, allowed and mandatory values,
interpolations, then verl's consistency rules. Every problem is a positioned Diagnostic."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..diagnostics import Diagnostic, did_you_mean
from ..load import Sourced
from .hydra import KEY, SERVICE_REFERENCE, hydra_value, shown, verl_value
from .moves import PLACEHOLDERS, carry
from .place import KNOWN, UNDER_VALUE, UNKNOWN, Place, Walker
from .release import ENGINE_KEY, MISSING, RELEASES, Release, ranges, snapshot
from .rules import WORKERS, WORKERS_NOTE, Config, absolute, rules
from .workers import startup_rules

NEEDS_PLUS = "so Hydra refuses it without '+'"  # a key verl's YAML lacks, written without Hydra's '+'
NOTE = "note: "  # a message that informs without failing the build (verlc cannot know, or verl would not care)
_INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")
_ENV = re.compile(r"(?:oc\.)?env:([A-Za-z_][A-Za-z0-9_]*)(?:,.*)?")
_SELECT = re.compile(r"oc\.select:(\.*[A-Za-z_][\w.]*)(?:,.*)?")
_KEY_REF = re.compile(r"\.*[A-Za-z_][\w.]*")


PREFIXES = ("++", "+")  # Hydra's add-or-override and add, as a spec writes them on a key of its path


def split_prefix(name: str) -> tuple[str, str]:
    """('++' | '+' | '', the key's name) of one key as the spec writes it."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return prefix, name[len(prefix):]
    return "", name


def without_prefixes(value: Any) -> Any:
    """A mapping passed as one value, its keys as Hydra's dict syntax takes them (a '+' inside adds nothing:
    the mapping replaces what verl's config holds there)."""
    if isinstance(value, dict):
        return {split_prefix(str(k))[1]: without_prefixes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_prefixes(v) for v in value]
    return value


def _prefixed(value: Any) -> bool:
    return isinstance(value, dict) and any(split_prefix(str(k))[0] or _prefixed(v) for k, v in value.items())


@dataclass(frozen=True)
class Setting:
    """One leaf of the `verl:` section as verl's command line will carry it."""

    key: str                       # dotted, without Hydra's prefix
    value: Any
    loc: tuple[str | int, ...]     # where the spec sets it
    prefix: str                    # Hydra's '+' or '++' as the spec wrote it on a key of the path, or ''
    place: Place

    @property
    def explicit(self) -> bool:
        return bool(self.prefix)

    @property
    def arg(self) -> str:
        return f"{self.prefix}{self.key}={hydra_value(verl_value(without_prefixes(self.value)))}"


@dataclass(frozen=True)
class Selection:
    """Which of a release's composed configs a spec uses."""

    release: Release
    config: str
    engine: str

    @property
    def walker(self) -> Walker:
        return Walker(self.release, self.config, self.engine)

    @property
    def tree(self) -> dict[str, Any]:
        return self.release.tree(self.config, self.engine)


def select(verl: dict[str, Any], release: Release, config: str | None = None,
           groups: Mapping[str, str] | None = None) -> Selection | str:
    """The spec's trainer config (None: the program's own) and model_engine in this release, composed with
    the config group choices (`hydra.groups`) the release's schema knows, or a message saying why not."""
    config = config or release.primary
    if config not in release.configs:
        return (f"{release.label} has no trainer config '{config}'; it has "
                f"{', '.join(release.configs)}{did_you_mean(config, release.configs)}")
    engines = release.engines(config)
    engine = verl.get(ENGINE_KEY, release.default_engine(config))
    if engines == ("",):
        if ENGINE_KEY in verl:
            return (f"{release.label} has no model_engine (it came in 0.7.1); choose the engine "
                    f"with its trainer config ({', '.join(release.configs)})")
        return _composed(Selection(release, config, ""), groups or {})
    if not isinstance(engine, str) or engine not in engines:
        return (f"unknown model_engine {shown(engine)}; {release.label} has {', '.join(engines)}"
                + did_you_mean(str(engine), engines))
    return _composed(Selection(release, config, engine), groups or {})


def _composed(chosen: Selection, groups: Mapping[str, str]) -> Selection:
    """`chosen` with each group choice it knows composed into its tree, as Hydra composes `key=option`."""
    release, config, engine = chosen.release, chosen.config, chosen.engine
    picks = {k: v for k, v in groups.items() if release.composes(config, engine, k, v)}
    return replace(chosen, release=release.with_choices(config, engine, picks)) if picks else chosen


def check_groups(groups: dict[str, str], searchpath: tuple[str, ...], release: Release,
                 sourced: Sourced, chosen: Selection | str
                 ) -> tuple[list[Diagnostic], list[Diagnostic], tuple[str, ...]]:
    """(errors, notes, packages whose keys verlc cannot check) for the spec's config group choices.

    The shipped schema holds each release's composition with every single other option of each group its
    configs' defaults lists choose (`select` composes them); a choice it cannot compose alone (one that also
    changes keys elsewhere, or a plugin's group) changes the keys below its package, which only Hydra can
    compose (--verl-config live)."""
    errors, notes, unchecked = [], [], []
    known = chosen.release.group_choices(chosen.config, chosen.engine) if isinstance(chosen, Selection) else {}
    for key, option in groups.items():
        group, _, package = key.partition("@")
        loc = ("hydra", "groups", key)
        if group == ENGINE_KEY:
            errors.append(sourced.diagnostic(loc, "write the model_engine choice as verl.model_engine", at_key=True))
            continue
        package = package or group.replace("/", ".")
        options = release.groups.get(group)
        if options is None and not searchpath:
            errors.append(sourced.diagnostic(loc, f"{release.label} has no config group '{group}'"
                                             + did_you_mean(group, release.groups), at_key=True))
            continue
        if options is not None and option not in options and not searchpath:
            errors.append(sourced.diagnostic(loc, f"config group '{group}' of {release.label} has no option "
                                                  f"'{option}'; it has {', '.join(options)}"
                                             + did_you_mean(option, options)))
            continue
        if known and key not in known and not searchpath:
            # Hydra overrides only a choice the defaults list makes ("Could not override ... No match")
            errors.append(sourced.diagnostic(loc, f"{release.label}'s {chosen.config} does not choose the config "
                                                  f"group '{key}' (Hydra overrides only what its defaults list "
                                                  f"chooses: {', '.join(sorted(known))})"
                                             + did_you_mean(key, sorted(known)), at_key=True))
            continue
        if isinstance(chosen, Selection) and chosen.release.composes(chosen.config, chosen.engine, key, option):
            continue  # composed by select, checked as the rest of the config
        where = "a plugin's" if options is None or option not in options else f"{release.label}'s"
        unchecked.append(package)
        if release.source == "live":
            continue  # Hydra composes the exact overrides with the installed verl (and plugin) next
        notes.append(sourced.diagnostic(loc, f"note: keys under verl.{package} come from {where} '{group}/{option}', "
                                             f"which the shipped schema does not compose: verlc leaves them to "
                                             f"Hydra; `verlc validate --verl-config live` composes them with the "
                                             f"installed verl{' and plugin' if searchpath else ''}", at_key=True))
    return errors, notes, tuple(unchecked)


def settings(verl: dict[str, Any], walker: Walker) -> list[Setting]:
    """The spec's `verl:` leaves in file order, each placed in verl's config.

    A key means what the same Hydra override means: `key` sets what verl's config has, `+key` adds (on any
    key of a new path: its first new key, its leaf, or between; over a mapping verl has, it merges), `++key`
    adds or sets. A mapping is walked into where verl's config has a mapping, or where it has nothing and a
    key on the way carries a prefix; where verl's YAML holds a value (e.g. a null `dict` field), the mapping
    is one value; a mapping under a new key without a prefix is one setting (refused there, as Hydra would)."""
    out: list[Setting] = []

    def walk(tree: dict[str, Any], parts: list[str], loc: tuple[str | int, ...], prefix: str) -> None:
        for raw, value in tree.items():
            if not parts and raw == ENGINE_KEY:
                continue
            mine, name = split_prefix(str(raw))
            key_parts = [*parts, name]
            here = (*loc, raw)
            now = max(prefix, mine, key=len)  # '++' over '+' over none
            place = walker.place(key_parts)
            mapping = isinstance(value, dict) and value
            if mapping and place.status == KNOWN and _free_keys(value) \
                    and walker.place([*key_parts, "-"]).status == KNOWN:
                # keys that are no part of a dotted key (`rope_scaling.type`, `layers.{*}.mlp`) in a mapping
                # that takes any key: one dict value, which Hydra merges there as it is
                out.append(Setting(".".join(key_parts), value, here, now, place))
            elif mapping and place.status == KNOWN and not place.stop and (place.in_yaml or now or _prefixed(value)):
                # `+key: {...}` over a mapping verl has: Hydra merges it, setting what is there, adding the rest
                walk(value, key_parts, here, "++" if mine == "+" and place.in_yaml else now)
            elif mapping and place.status != KNOWN and (now or _prefixed(value)):
                walk(value, key_parts, here, now)
            else:
                out.append(Setting(".".join(key_parts), value, here, now, place))

    walk(verl, [], ("verl",), "")
    return out


def _free_keys(mapping: dict[Any, Any]) -> bool:
    """Whether a mapping has a key that cannot be one part of a dotted key (beyond Hydra's `+`/`~`)."""
    return any(not isinstance(k, str) or not KEY.fullmatch(split_prefix(k)[1].lstrip("~")) for k in mapping)


def check_verl(verl: dict[str, Any], derived: dict[str, Any], sourced: Sourced, chosen: Selection,
               derived_from: dict[str, str], use_critic: bool, unchecked: tuple[str, ...] = ()) -> Iterator[Diagnostic]:
    """Every problem of a `verl:` section against the chosen config, then verl's consistency rules.

    `derived` holds the verl keys verlc fills in itself (already checked against the spec elsewhere);
    keys under `unchecked` packages (swapped config groups) are left to Hydra, and so are the rules."""
    found, config, every = _each_setting(verl, derived, sourced, chosen, unchecked)
    problems = [d for d in every if not d.message.startswith(NOTE)]
    yield from every
    yield from _mandatory(config, chosen, sourced)
    if problems or unchecked or not chosen.release.validated:
        return  # rules over misspelt keys or mistyped values would only repeat the same problem
    where = {s.key: s.loc for s in found}
    try:
        broken = list(rules(config, use_critic, chosen.release.replicas_span_nodes))
    except (TypeError, ZeroDivisionError):  # a value the rules cannot do arithmetic on: reported above
        return
    # what the workers refuse, or will need, once they start: facts read from the release's own code
    broken += [(keys, message if refused else NOTE + message, WORKERS if refused else "") for keys, message, refused
               in startup_rules(chosen.release.startup, config.get, use_critic=use_critic,
                                label=chosen.release.label)]
    for keys, message, when in broken:
        loc = next((where[k] for k in keys if k in where), None) or next(
            (tuple(derived_from[k].split(".")) for k in keys if k in derived_from), ("verl", *keys[0].split(".")))
        if keys[0] not in where and keys[0] not in derived_from and config.get(keys[0]) is not None:
            # the value the rule names was not written: say whose it is
            message += f" ({keys[0]}: {shown(config.get(keys[0]))} is {chosen.release.label}'s default)"
        yield sourced.diagnostic(loc, message + (WORKERS_NOTE if when == WORKERS else ""))


def _each_setting(verl: dict[str, Any], derived: dict[str, Any], sourced: Sourced, chosen: Selection,
                  unchecked: tuple[str, ...]) -> tuple[list[Setting], Config, list[Diagnostic]]:
    """The settings, the config they make, and each one's own problems and notes (keys, types, values)."""
    found = [s for s in settings(verl, chosen.walker)
             if not any(s.key == p or s.key.startswith(p + ".") for p in unchecked)]
    values = {s.key: without_prefixes(s.value) for s in found}
    values.update(derived)
    config = Config(chosen.tree, values)
    spec_keys = frozenset(values)
    return found, config, [d for s in found for d in _setting(s, chosen, sourced, spec_keys, config)]


def check_verl_keys(verl: dict[str, Any], sourced: Sourced, chosen: Selection) -> list[Diagnostic]:
    """Only each setting's own problems: for a spec whose other sections did not validate (nothing can be
    derived from them, so no rules and no mandatory values), so that one run still reports every problem."""
    return [d for d in _each_setting(verl, {}, sourced, chosen, ())[2] if not d.message.startswith(NOTE)]


def _setting(s: Setting, chosen: Selection, sourced: Sourced, spec_keys: frozenset[str],
             config: Config) -> Iterator[Diagnostic]:
    release, place, parts = chosen.release, s.place, s.key.split(".")
    bad = next((p for p in parts if not KEY.fullmatch(p)), None)
    if bad is not None and bad.startswith("~"):
        yield sourced.diagnostic(s.loc, (
            f"'{bad}': Hydra's '~' (delete a key) is not supported in a spec: verl's code reads every key of its "
            f"config; set the value to null, or leave the key out to keep verl's default"), at_key=True)
        return
    if bad is not None:
        yield sourced.diagnostic(s.loc, f"'{bad}' cannot be a key in a verl override", at_key=True)
        return
    if place.status == UNDER_VALUE:
        parent = ".".join(parts[:place.found])
        if s.prefix:  # Hydra's add puts a mapping where the value was
            yield sourced.diagnostic(s.loc, (
                f"{NOTE}'{parent}' is a value in {release.label}'s config ({shown(Config(chosen.tree, {}).get(parent))}); "
                f"'{s.prefix}' replaces it with a mapping, which the code reading it may not expect"), at_key=True)
            return
        yield sourced.diagnostic(s.loc, f"'{parent}' is a value in verl's config, not a section", at_key=True)
        return
    if place.status == UNKNOWN:
        if s.prefix:
            parent = ".".join(parts[:place.found])
            if place.owner is not None and place.built:
                yield sourced.diagnostic(s.loc, (
                    f"{release.label} builds '{parent}' as {place.owner.name}, which has no field "
                    f"'{parts[place.found]}'{did_you_mean(parts[place.found], place.owner.fields)}: Hydra would take "
                    f"the '{s.prefix}' key, then verl would fail with an unexpected keyword argument once the workers "
                    f"start"), at_key=True)
            elif place.owner is not None:
                yield sourced.diagnostic(s.loc, (
                    f"{NOTE}{release.label} hands '{parent}' on as a mapping, described by "
                    f"{place.owner.name}, which has no field '{parts[place.found]}'; verlc cannot tell whether "
                    f"the code reading it expects one"), at_key=True)
            else:
                yield from _near_miss(s, chosen, sourced)
            return
        yield sourced.diagnostic(s.loc, _unknown(parts, place, chosen), at_key=True)
        return
    if not place.in_yaml:
        if not s.prefix:
            yield sourced.diagnostic(s.loc, _needs_plus(parts, chosen), at_key=True)
            return
        yield from _near_miss(s, chosen, sourced)
    elif isinstance(s.value, dict) and _free_keys(s.value) and not s.prefix:
        # one dict value merged into verl's mapping: Hydra's struct config refuses a key it lacks without '+'
        current = Config(chosen.tree, {}).get(s.key)
        new = [k for k in s.value if isinstance(current, dict) and k not in current]
        if isinstance(current, dict) and new:
            yield sourced.diagnostic(s.loc, (
                f"no key {new[0]!r} under '{s.key}' in verl's config: '{s.key}' takes new keys, but "
                f"{release.label}'s YAML does not have this one, {NEEDS_PLUS}; write '+{parts[-1]}' (Hydra's "
                f"+{s.key}={{...}}, which adds the mapping's keys)"), at_key=True)
            return
    elif s.prefix == "+" and not isinstance(s.value, (dict, list)):
        current = Config(chosen.tree, {}).get(s.key)
        if current is not None and current != MISSING:
            yield sourced.diagnostic(s.loc, (
                f"{release.label} has {s.key} already ({shown(current)}), and Hydra's '+' only adds: "
                f"write it without '+' (or with '++' to add or override)"), at_key=True)
            return
    unread = _unread_placeholder(s, chosen)
    if unread:
        yield sourced.diagnostic(s.loc, unread, at_key=True)
    yield from (sourced.diagnostic(s.loc, m) for m in _value(s, chosen, spec_keys, config))


MAIN_PPO = "verl.trainer.main_ppo"


def _unread_placeholder(s: Setting, chosen: Selection) -> str | None:
    """Where main_ppo would drop the setting: a key of a section the release keeps as a null placeholder for old
    specs (moves.PLACEHOLDERS: the old reward sections, beside `reward` from 0.7.1 on) and whose main_ppo does not
    carry to its new place (verl's migrate_legacy_reward_impl: main_ppo called it in 0.7.1 and 0.8.0, only the
    fully async trainer from 0.9.0 on; loadable.py reads who calls it). Hydra takes the key and verl never reads
    it: the run would train without, e.g., the spec's reward function. A note, not a refusal: verl accepts the
    config (verlc's verdict is verl's), and says nothing."""
    release = chosen.release
    migrated = release.loadable.get("migrated_by")
    since = next((v for v, top in PLACEHOLDERS if s.key.split(".")[0] == top), None)
    if (migrated is None or MAIN_PPO in migrated or since is None or s.value is None
            or chosen.config not in release.configs
            or not isinstance(Config(chosen.tree, {}).get("reward.custom_reward_function"), dict)):
        return None
    new, moved = carry(s.key, RELEASES[RELEASES.index(since) - 1], since)
    where = f"set {new}" if moved else "its setting is under `reward` now"
    return (f"{NOTE}{release.label}'s main_ppo never reads '{s.key}': the section is a null placeholder for old specs, "
            f"and main_ppo.py no longer carries it to `reward` (verl's migrate_legacy_reward_impl runs in "
            f"{', '.join(migrated) or 'none of its programs'} only; 0.7.1 and 0.8.0's main_ppo called it), so the run "
            f"would go without it: {where}")


def _first_new(parts: list[str], walker: Walker) -> int:
    """The index of the first key of `parts` that verl's composed YAML does not have."""
    return next((i for i in range(len(parts)) if not walker.place(parts[:i + 1]).in_yaml), len(parts) - 1)


def _needs_plus(parts: list[str], chosen: Selection) -> str:
    """Hydra refuses `key=value` for a key its composed config does not have, even where verl takes it."""
    walker = chosen.walker
    i = _first_new(parts, walker)
    where = ".".join(parts[:i]) or "the top level"
    declared = walker.place(parts[:i + 1]).owner if i else None
    why = (f"{declared.name} declares it, but {chosen.release.label}'s YAML leaves it out"
           if declared is not None and parts[i] in declared.fields else
           f"'{where}' takes new keys, but {chosen.release.label}'s YAML does not have this one")
    near = did_you_mean(parts[i], [k for k in walker.keys(parts[:i]) if walker.place([*parts[:i], k]).in_yaml])
    return (f"no key '{parts[i]}' under '{where}' in verl's config{near}: {why}, {NEEDS_PLUS}; to add it "
            f"write '+{parts[i]}' (Hydra's +{'.'.join(parts)}=...){' or run `verlc migrate`' if not near else ''}")


def _near_miss(s: Setting, chosen: Selection, sourced: Sourced) -> Iterator[Diagnostic]:
    """A key the spec adds with '+' that is one edit away from a key verl's config has: likely a typo."""
    walker, parts = chosen.walker, s.key.split(".")
    i = _first_new(parts, walker)
    known = [k for k in walker.keys(parts[:i]) if walker.place([*parts[:i], k]).in_yaml]
    near = [k for k in known if _one_edit(parts[i], k)]
    if near:
        yield sourced.diagnostic(s.loc, (
            f"{NOTE}'{s.prefix}{parts[i]}' adds a key verl does not read here; did you mean '{near[0]}'? "
            f"({chosen.release.label} has {'.'.join([*parts[:i], near[0]])})"), at_key=True)


def _one_edit(a: str, b: str) -> bool:
    """Whether b is one insertion, deletion, substitution or swap of neighbours away from a."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        return len(diff) == 1 or (len(diff) == 2 and diff[1] == diff[0] + 1 and a[diff[0]] == b[diff[1]]
                                  and a[diff[1]] == b[diff[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _value(s: Setting, chosen: Selection, spec_keys: frozenset[str], config: Config) -> Iterator[str]:
    release, place, value = chosen.release, s.place, s.value
    if isinstance(value, str) and "${" in value:
        broken = list(_interpolations(s, chosen, spec_keys))
        yield from broken
        resolved = config.get(s.key)
        if broken or resolved is None or resolved == MISSING:
            return
        value = resolved  # what verl will see: the referenced setting, or a string with the env var in it
    shape = hydra_shape(place, value)
    if shape:
        yield shape
        return
    problem = type_problem(place.kinds, value)
    if problem and not _typed(s) and (misread := _misread(place.default, value)):
        yield f"{problem} ({release.label}: {_declared(s)}): {misread}"
        return
    if problem and not (_typed(s) and place.built) and place.kinds != ("section",):
        # No dataclass that verl builds types this key: verl reads the value as it comes. A note, not a verdict.
        why = (f"{place.owner.name} describes it as {' | '.join(describe(k) for k in place.kinds)}, but verl hands "
               f"the mapping on as it is" if _typed(s) else
               f"no dataclass types this key; its default is {shown(place.default)}")
        truthy = " (a non-empty string reads as true, even 'false')" if isinstance(place.default, bool) \
            and isinstance(value, str) else ""
        yield f"{NOTE}{release.label}: {why}; verl will read {shown(value)} as it comes{truthy}"
        return
    if problem:
        yield f"{problem} ({release.label}: {_declared(s)})"
        return
    field = s.key.rsplit(".", 1)[-1]
    allowed = release.allowed.get(s.key) or (place.owner.allowed(field) if place.owner else ())
    refused = place.owner.refused(field) if place.owner else ()
    if value is not None and allowed and value not in allowed:
        yield (f"must be one of {', '.join(map(str, allowed))} in {release.label}, got "
               f"{shown(value)}{did_you_mean(str(value), [str(a) for a in allowed])}")
    elif value in refused:
        yield f"{release.label} refuses {shown(value)} here ({place.owner.name}.__post_init__)"
    elif value is not None and (workers := release.worker_allowed.get(s.key)) and value not in workers:
        yield (f"{NOTE}{release.label}'s workers take {', '.join(map(str, workers))} here, not "
               f"{shown(value)}{did_you_mean(str(value).lower(), [str(a) for a in workers])}: the run would fail once "
               f"they start")


def _misread(default: Any, value: Any) -> str | None:
    """Why verl's code cannot use `value` where no dataclass types the key but its default is a number: Hydra
    passes the value on as it is, and verl's trainer then counts and compares with it. (A string where the
    default is true or false stays a note: verl tests it as it comes, and a non-empty one reads as true; its
    own check, Hydra with validate_config, accepts it.)"""
    if isinstance(value, str | list | dict) and isinstance(default, int | float) and not isinstance(default, bool):
        return "verl's trainer uses it as a number, which fails (TypeError) once training starts"
    return None


def hydra_shape(place: Place, value: Any) -> str | None:
    """What Hydra itself refuses: a mapping onto a list node, a list or a value onto a mapping node."""
    default = place.default
    if isinstance(default, list) and isinstance(value, dict):
        return f"is a list in verl's config (default {shown(default)}); Hydra cannot merge a mapping into it"
    if isinstance(default, dict) and default and not isinstance(value, dict):
        return "is a section of verl's config; set the keys under it, not a value"
    return None


def _typed(s: Setting) -> bool:
    """Whether a dataclass declares this key's type (otherwise the type is a YAML default's)."""
    owner = s.place.owner
    return owner is not None and s.key.rsplit(".", 1)[-1] in owner.fields


def _declared(s: Setting) -> str:
    owner = s.place.owner
    field = s.key.rsplit(".", 1)[-1]
    if owner is not None and field in owner.fields:
        return f"{owner.name}.{field} is {' | '.join(describe(k) for k in s.place.kinds)}"
    return f"no dataclass types this key; its default is {shown(s.place.default)}"


_WORDS = {"int": "an integer", "float": "a number", "number": "a number", "bool": "true or false",
          "str": "a string", "list": "a list", "dict": "a mapping", "section": "a section (a mapping)",
          "none": "null", "any": "anything", "L": "one of its listed values"}


def describe(kind: str) -> str:
    if kind.startswith("C:"):
        return f"a {kind[2:]} mapping"
    if kind.startswith("M:"):
        return f"a mapping of named {kind[2:]} entries"
    return _WORDS.get(kind, kind)


def type_problem(kinds: tuple[str, ...], value: Any) -> str | None:
    """Why `value` does not fit any of `kinds`, or None. Python's numeric tower: a float field takes 1."""
    if "any" in kinds or not kinds:
        return None
    for kind in kinds:
        if kind == "none" and value is None:
            return None
        if kind == "bool" and isinstance(value, bool):
            return None
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return None
        if kind in ("float", "number") and isinstance(value, (int, float)) and not isinstance(value, bool):
            return None
        if kind == "str" and isinstance(value, str):
            return None
        if kind == "list" and isinstance(value, list):
            return None
        if (kind in ("dict", "section") or kind[:2] in ("C:", "M:")) and isinstance(value, dict):
            return None
        if kind == "L" and not isinstance(value, (dict, list)):
            return None  # the listed values are checked next
    if any(k in ("section",) or k.startswith("C:") for k in kinds) and not isinstance(value, dict):
        return "is a section of verl's config; set the keys under it, not a value"
    return f"expects {' or '.join(describe(k) for k in kinds)}, got {shown(value)}"


def _interpolations(s: Setting, chosen: Selection, spec_keys: frozenset[str]) -> Iterator[str]:
    """Every ${...} must resolve in verl's config: an env var, or a key verl has."""
    text = s.value
    for match in _INTERPOLATION.finditer(text):
        body = match[1].strip()
        if _ENV.fullmatch(body) or SERVICE_REFERENCE.fullmatch(match[0]):  # a service's: compiler/services.py
            continue
        select = _SELECT.fullmatch(body)
        ref = select[1] if select else body if _KEY_REF.fullmatch(body) else None
        if ref is None:
            yield (f"'{match[0]}' is not an interpolation verl can resolve: write ${{env:NAME}} for an environment "
                   f"variable of the node, ${{a.b}} for another verl setting, or \\${{...}} for the text itself")
            continue
        target = absolute(s.key, ref).split(".")
        found = chosen.walker.place(target)
        if not (found.status == KNOWN and found.in_yaml) and ".".join(target) not in spec_keys:
            yield (f"'{match[0]}' refers to a key {chosen.release.label} does not have; "
                   f"for the environment variable on the node write ${{env:{ref.lstrip('.')}}}"
                   if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", ref) else
                   f"'{match[0]}' refers to '{'.'.join(target)}', which {chosen.release.label} does not have")


def _unknown(parts: list[str], place: Place, chosen: Selection) -> str:
    release, walker = chosen.release, chosen.walker
    depth = place.found
    parent = ".".join(parts[:depth])
    engine = f" ({chosen.engine} engine)" if chosen.engine else ""
    where = f"under '{parent}'" if parent else "at the top level"
    if other := other_config(parts, chosen):
        return other
    hint = did_you_mean(parts[depth], walker.keys(parts[:depth]))
    if not hint:  # the right name in the wrong place (a key that moved)?
        moved = elsewhere(parts, chosen.tree)
        hint = f" (did you mean '{moved}'?)" if moved else ""
    return f"{release.label}{engine} has no key '{parts[depth]}' {where}{hint}{other_releases(parts, release)}"


def other_config(parts: list[str], chosen: Selection) -> str | None:
    """The key belongs to another of this release's configs or engines (e.g. FSDP settings in a Megatron
    run): say so, rather than which releases have it."""
    release = chosen.release
    others = [(c, e) for c in release.configs for e in release.engines(c) if (c, e) != (chosen.config, chosen.engine)
              and (p := Walker(release, c, e).place(parts)).status == KNOWN and p.in_yaml]
    if not others:
        return None
    key = ".".join(parts)
    section = ".".join(parts[:-1]) or key
    defaults = Config(chosen.tree, {})
    strategy = (defaults.get(f"{parts[0]}.{parts[1]}.strategy") if len(parts) > 2 else None) \
        or defaults.get("actor_rollout_ref.actor.strategy")
    if strategy == "megatron" and any("fsdp" in p for p in parts):
        return (f"{key} belongs to the FSDP engine; this spec uses megatron (configure {section} with its "
                f"megatron.* settings)")
    config, engine = others[0]
    return (f"{key} is not in {release.label}'s {chosen.config}"
            f"{f' ({chosen.engine} engine)' if chosen.engine else ''}, which this spec uses; it belongs to "
            f"{config}{f' ({engine} engine)' if engine else ''}")


def elsewhere(parts: list[str], tree: dict[str, Any]) -> str | None:
    """The one key of `tree` ending like `parts` does, with the longest shared ending (at least the leaf):
    reward_model.micro_batch_size_per_gpu -> reward.reward_model.micro_batch_size_per_gpu."""
    def shared(key: str) -> int:
        other = key.split(".")
        n = 0
        while n < min(len(other), len(parts)) and other[-1 - n] == parts[-1 - n]:
            n += 1
        return n

    scored: dict[int, list[str]] = {}
    for key in all_keys(tree):
        n = shared(key)
        if n and key != ".".join(parts):
            scored.setdefault(n, []).append(key)
    if not scored:
        return None
    best = scored[max(scored)]
    return best[0] if len(best) == 1 else None


def other_releases(parts: list[str], release: Release) -> str:
    """'; it exists in verl 0.6.0, 0.6.1' for a key that other shipped releases have."""
    key = ".".join(parts)
    having = []
    own = release.primary if release.primary in release.program_configs else None  # an SFT program's config
    for version in RELEASES:
        if version == release.version:
            continue
        other = snapshot(version)
        if own is not None:  # the same program's config in the other release, not main_ppo's
            if own not in other.program_configs:
                continue
            other = replace(other, configs={own: other.program_configs[own]})
        places = (Walker(other, c, e).place(parts) for c in other.configs for e in other.engines(c))
        if any(p.status == KNOWN and p.in_yaml for p in places):
            having.append(version)
    if not having:
        return ""
    return f"; {key} exists in verl {ranges(having)}"


def all_keys(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path
        if isinstance(value, dict):
            yield from all_keys(value, path)


_KEYS: dict[int, tuple[dict[str, Any], tuple[str, ...]]] = {}  # id(tree) -> (that tree, its keys)


def tree_keys(tree: dict[str, Any]) -> tuple[str, ...]:
    """all_keys(tree), listed once per tree: a sweep checks every variant against the same composed config."""
    known = _KEYS.get(id(tree))
    if known is None or known[0] is not tree:
        known = _KEYS[id(tree)] = (tree, tuple(all_keys(tree)))
    return known[1]


def _mandatory(config: Config, chosen: Selection, sourced: Sourced) -> Iterator[Diagnostic]:
    for key in tree_keys(chosen.tree):
        if config.get(key) != MISSING:
            continue
        parts = key.split(".")
        # `???` inside a disabled section (e.g. reward.reward_model with enable: false) is not needed.
        if any(config.get(".".join(parts[:i] + ["enable"])) is False for i in range(1, len(parts))):
            continue
        allowed = chosen.release.allowed.get(key)
        choices = f" ({', '.join(map(str, allowed))})" if allowed else ""
        yield sourced.diagnostic(("verl",) if "verl" in sourced.data else (),
                                 f"verl.{key} is mandatory in {chosen.release.label}; set it{choices}",
                                 at_key=True)
