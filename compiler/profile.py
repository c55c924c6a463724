"""Site profiles: the settings of one cluster, kept apart from the experiment and composed under it.

A profiles file (`verlc-profiles.yaml` at the spec's repository root, else the user's under
$XDG_CONFIG_HOME/verlc/) names profiles of site settings:

    profiles:
      lab-a:
        cluster: {slurm: {partition: gpu, account: rl}}
        container: {runtime: apptainer, image: docker://ghcr.io/lab/verl:0.9.1}

`verlc build SPEC --profile lab-a` composes the profile under the spec (the spec, with what it extends, on top):
a value the profile sets is its default, a value both set is the spec's, and that overlap is reported. Messages
about a profile's values point at the profile's own lines. A profile holds site sections only (site_keys).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ruamel.yaml.comments import CommentedMap

from .diagnostics import Diagnostic, SpecError
from .load import Sourced, merge, plain, read_yaml

if TYPE_CHECKING:
    from .catalog import Catalog

FILE = "verlc-profiles.yaml"


def site_keys(catalog: Catalog) -> tuple[str, ...]:
    """What differs between clusters: scheduler, containers and registry, storage and mounts, network,
    environment, and each target's own top-level section."""
    return ("cluster", "container", *catalog.top_sections, "network", "env", "secrets", "ray")


@dataclass(frozen=True)
class Profile:
    name: str
    file: str  # as the bundle's header and manifest name it: the same on every machine
    sha256: str  # of the profile's own settings (canonical JSON): other profiles in the file do not change it


def files(spec: Path) -> list[tuple[Path, str]]:
    """Where profiles are looked up, in order: the spec's repository root (its folder outside git), the user's;
    each with the name the bundle records (the same on every machine)."""
    folder = spec.resolve().parent
    root = next((f for f in (folder, *folder.parents) if (f / ".git").exists()), folder)
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return [(root / FILE, FILE), (config / "verlc" / FILE, f"$XDG_CONFIG_HOME/verlc/{FILE}")]


def _shown(path: Path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)


def under(sourced: Sourced, spec: Path, name: str, catalog: Catalog, texts: Mapping[Path, str] | None = None,
          ) -> tuple[Sourced, Profile, list[Diagnostic]]:
    """The spec composed on top of profile `name`, the profile, and a note for each value both set."""
    looked = []
    for path, label in files(spec):
        if not path.is_file() and path.resolve() not in (texts or {}):
            continue
        shown = _shown(path)
        tree, _ = read_yaml(path, shown, texts or {}, "a profiles file", "`profiles:`")
        profiles = tree.get("profiles")
        if not isinstance(profiles, CommentedMap):
            raise SpecError([_at(shown, tree, ("profiles",), "profiles",
                                 "a profiles file holds `profiles:`, a mapping of profile names to site settings")])
        if name not in profiles:
            looked.append(f"{shown} has {', '.join(map(str, profiles)) or 'none'}")
            continue
        return _compose(sourced, shown, label, profiles, name, site_keys(catalog))
    where = "; ".join(looked) or "there is no {} at {} or {}".format(FILE, *(_shown(p) for p, _ in files(spec)))
    raise SpecError([Diagnostic(sourced.file, 1, 1, "<profile>", f"no profile {name!r}: {where}")])


def _compose(sourced: Sourced, shown: str, label: str, profiles: CommentedMap, name: str, keys: tuple[str, ...],
             ) -> tuple[Sourced, Profile, list[Diagnostic]]:
    own = profiles[name]
    if not isinstance(own, CommentedMap):
        raise SpecError([_at(shown, profiles, (name,), f"profiles.{name}",
                             "a profile is a mapping of site settings (cluster, container, network, env, ...)")])
    problems: list[Diagnostic] = []
    data = plain(own, (), shown, problems)
    problems += [_at(shown, own, (key,), key, f"a profile holds site settings ({', '.join(keys)}); "
                                               f"`{key}` belongs in the spec") for key in data if key not in keys]
    if problems:
        raise SpecError(problems)
    composed = replace(sourced, data=merge(data, sourced.data), layers=((shown, own), *sourced.layers))
    profile = Profile(name, label, hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest())
    both = [loc for loc in _leaves(data) if _has(sourced.data, loc)]
    notes = [sourced.diagnostic(loc, f"note: profile {name} ({shown}:{':'.join(map(str, _where(own, loc)))}) "
                                     "sets this too; the spec's value is used") for loc in both]
    return composed, profile, notes


def _leaves(data: Any, loc: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    """Each setting of a profile: a scalar or a list (lists replace whole), by its location."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from _leaves(value, (*loc, key))
    else:
        yield loc


def _has(data: Any, loc: tuple[str | int, ...]) -> bool:
    for part in loc:
        if not isinstance(data, dict) or part not in data:
            return False
        data = data[part]
    return True


def _where(tree: CommentedMap, loc: tuple[str | int, ...]) -> tuple[int, int]:
    node: Any = tree
    line, col = 0, 0
    for part in loc:
        line, col = node.lc.value(part)
        node = node[part]
    return line + 1, col + 1


def _at(shown: str, tree: CommentedMap, loc: tuple[str, ...], path: str, message: str) -> Diagnostic:
    line, col = tree.lc.key(loc[0]) if loc[0] in tree else (0, 0)
    return Diagnostic(shown, line + 1, col + 1, path, message)
