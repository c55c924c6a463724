"""The verl releases verlc knows, and one release's config facts.

A shipped schema is `schemas/<version>.json.gz`, written by `dev/verl_schema.py` from that release's
own files; `schemas/<version>.docs.json.gz` beside it holds verl's descriptions of its keys, which only
`verlc schema` and `verlc explain` read (checks and builds never load them). Trees are stored interned: every mapping appears once in `nodes` and is referenced by its
index as `{"&": i}` ("&" cannot be a Hydra key), so the engines and trainer configs of a release,
which share most of their structure, cost little. Loading one release reads one small file.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

MISSING = "???"
DEFAULT_CONFIG = "ppo_trainer"
ENGINE_KEY = "model_engine"  # the config group that picks verl's model engine (0.7.1 on)
# Every release on PyPI from the first one papers still pin; dev/verl_schema.py writes one schema each.
RELEASES = ("0.3.0.post1", "0.4.0", "0.4.1", "0.5.0", "0.6.0", "0.6.1", "0.7.0", "0.7.1", "0.8.0", "0.9.0",
            "0.9.1")
REF = "&"


@dataclass(frozen=True)
class DataClass:
    """A dataclass verl builds from a config node: its fields' types and the values some fields allow."""

    name: str                          # as verl's source spells it (messages)
    qualname: str                      # module.name: what field types and `_target_`s resolve to
    fields: Mapping[str, str]          # field -> kinds joined by "|" (see extract.read_dataclasses)
    literals: Mapping[str, tuple[Any, ...]]

    def allowed(self, name: str) -> tuple[Any, ...]:
        return self.literals.get(name, ())

    def refused(self, name: str) -> tuple[Any, ...]:
        return self.literals.get(f"!{name}", ())


@dataclass(frozen=True)
class Release:
    """One verl release: its trainer configs (per model_engine choice), dataclasses and closed sets."""

    version: str
    source: str  # "snapshot" or "live"
    configs: Mapping[str, tuple[str, Mapping[str, Any]]]  # config name -> (default engine, engine -> tree)
    classes: Mapping[str, DataClass]
    allowed: Mapping[str, tuple[Any, ...]]
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    worker_allowed: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # only the workers check these
    targets: Mapping[str, str] = field(default_factory=dict)  # `_target_` string -> class qualname
    primary: str = DEFAULT_CONFIG  # the config the program composes when the spec names none
    commit: str | None = None      # the git commit these facts were read from (None: a PyPI release)
    unchecked: tuple[str, ...] = ()  # packages whose keys only Hydra can judge (a program's group choices)
    startup: Mapping[str, Any] = field(default_factory=dict)  # what its workers need at start-up (workers.py)
    loadable: Mapping[str, Any] = field(default_factory=dict)  # what verl imports by a name a spec gives (loadable.py)
    validated: bool = True  # the program runs verl's validate_config (main_ppo does): its consistency rules apply
    programs: Mapping[str, str] = field(default_factory=dict)  # verl's own Hydra programs -> their config
    program_configs: Mapping[str, tuple[str, Mapping[str, Any]]] = field(default_factory=dict)  # not main_ppo's
    # config name -> engine -> the config groups its defaults list chooses (extract._group_choices), each other
    # option's subtree kept interned in `nodes` and built only when a spec chooses it
    choices: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    nodes: Sequence[Mapping[str, Any]] = ()

    @property
    def label(self) -> str:
        """How messages name it: 'verl 0.9.1', or 'verl 0.8.0.dev0 at commit bcb638649a50'."""
        return f"verl {self.version}" + (f" at commit {self.commit[:12]}" if self.commit else "")

    @property
    def replicas_span_nodes(self) -> bool:
        """From 0.6.0 a rollout replica (TP x DP x PP GPUs) may span nodes: verl's RolloutReplica places it on
        world_size // min(gpus_per_node, world_size) nodes (verl/workers/rollout/replica.py)."""
        numbers = [int(p) for p in self.version.split(".")[:3] if p.isdigit()]
        return tuple(numbers) >= (0, 6, 0)

    def target(self, dotted: str) -> DataClass | None:
        qual = self.targets.get(dotted)
        return self.classes.get(qual) if qual else None

    def default_engine(self, config: str) -> str:
        return self.configs[config][0]

    def engines(self, config: str) -> tuple[str, ...]:
        return tuple(self.configs[config][1])

    def tree(self, config: str, engine: str) -> dict[str, Any]:
        return self.configs[config][1][engine]

    def group_choices(self, config: str, engine: str) -> Mapping[str, Any]:
        """The groups `config`'s defaults list chooses with that engine: override key -> {"chosen": option,
        "package": dotted key, "options": {other option: interned subtree, or None}}; empty where the schema
        does not know them (live, or a schema written before they were)."""
        return self.choices.get(config, {}).get(engine, {})

    def composes(self, config: str, engine: str, key: str, option: str) -> bool:
        """Whether `choice` knows what `key=option` puts at its package (nothing is built to answer)."""
        entry = self.group_choices(config, engine).get(key)
        return entry is not None and (option == entry["chosen"] or entry["options"].get(option) is not None)

    def choice(self, config: str, engine: str, key: str, option: str) -> dict[str, Any] | None:
        """What `key=option` puts at its package (the default option: the config's own subtree there), or None
        where verlc cannot compose that choice alone (Hydra can)."""
        entry = self.group_choices(config, engine).get(key)
        if entry is None:
            return None
        if option == entry["chosen"]:
            node: Any = self.tree(config, engine)
            for part in entry["package"].split("."):
                node = node.get(part) if isinstance(node, dict) else None
            return node
        ref = entry["options"].get(option)
        return _build(ref, self.nodes) if ref is not None else None

    def with_choices(self, config: str, engine: str, picks: Mapping[str, str]) -> Release:
        """This release with `config`'s tree for `engine` composed with the group choices `picks` (each one
        `choice` knows), the outer packages first."""
        tree = self.tree(config, engine)
        entries = self.group_choices(config, engine)
        for key in sorted(picks, key=lambda k: (entries[k]["package"].count("."), k)):
            node = self.choice(config, engine, key, picks[key])
            tree = put(tree, entries[key]["package"].split("."), node)
        default, engines = self.configs[config]
        return replace(self, configs={**self.configs, config: (default, {**engines, engine: tree})})


def _build(value: Any, nodes: Sequence[Mapping[str, Any]]) -> Any:
    """An interned value (pack's {"&": i} references) as plain data, each mapping its own object."""
    if isinstance(value, dict):
        return {k: _build(v, nodes) for k, v in nodes[value[REF]].items()}
    if isinstance(value, list):
        return [_build(v, nodes) for v in value]
    return value


def put(tree: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """A copy of `tree` with `value` at `path` (the mappings on the way copied, the rest shared)."""
    head, *rest = path
    return {**tree, head: put(tree.get(head) or {}, rest, value) if rest else value}


def ranges(versions: list[str]) -> str:
    """Consecutive releases as 'A-B', others listed: '0.3.0.post1-0.6.1, 0.8.0'."""
    index = {v: i for i, v in enumerate(RELEASES)}
    runs: list[list[str]] = []
    for v in versions:
        if runs and index[v] == index[runs[-1][-1]] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


@cache
def snapshot(version: str) -> Release:
    """The shipped schema of one verl release; KeyError when verlc has none for it."""
    if version not in RELEASES:
        raise KeyError(version)
    blob = resources.files("verlc.compiler.verl").joinpath("schemas", f"{version}.json.gz").read_bytes()
    return from_data(version, unpack(json.loads(zlib.decompress(blob, wbits=31))), "snapshot")


@cache
def live() -> Release:
    """The installed verl's facts, read from its files (Hydra composes; verl is not imported)."""
    from importlib.metadata import version

    from .extract import extract

    return from_data(version("verl"), extract(installed_package(), lazy=True), "live")


def installed_package() -> Any:
    """The installed verl's package folder, found without running verl/__init__ (which imports torch)."""
    import importlib.util
    from pathlib import Path

    found = importlib.util.find_spec("verl")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("verl is not installed; use the shipped schema (drop --verl-config live)")
    return Path(next(iter(found.submodule_search_locations)))


def from_data(version: str, data: dict[str, Any], source: str, commit: str | None = None) -> Release:
    return Release(
        version=version, source=source, commit=commit,
        configs={name: (c["default_engine"], c["engines"]) for name, c in data["configs"].items()},
        classes={qual: DataClass(c["name"], qual, c["fields"], {k: tuple(v) for k, v in c["literals"].items()})
                 for qual, c in data["classes"].items()},
        targets=data["targets"],
        allowed={k: tuple(v) for k, v in data["allowed"].items()},
        worker_allowed={k: tuple(v) for k, v in data.get("worker_allowed", {}).items()},
        groups={k: tuple(v) for k, v in data.get("groups", {}).items()},
        startup=data.get("startup", {}),
        loadable={**data.get("loadable", {}), "objects": frozenset(data.get("loadable", {}).get("objects", ()))},
        programs=data.get("programs", {}),
        program_configs={name: (c["default_engine"], c["engines"]) for name, c in data.get("program_configs", {}).items()},
        choices=data.get("choices", {}),
        nodes=data.get("nodes", ()),
    )


@cache
def docs(version: str) -> dict[str, Any]:
    """verl's own descriptions for one release: {"keys": {dotted key: text}, "fields": {class qualname:
    {field: text}}} (from its YAML comments and its dataclasses' documentation)."""
    blob = resources.files("verlc.compiler.verl").joinpath("schemas", f"{version}.docs.json.gz").read_bytes()
    return json.loads(zlib.decompress(blob, wbits=31))


def pack_docs(data: dict[str, Any]) -> bytes:
    return _gzip(json.dumps(data["docs"], ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode())


def _gzip(text: bytes) -> bytes:
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)  # gzip framing, no timestamp: the same bytes every time
    return squeeze.compress(text) + squeeze.flush()


def pack(version: str, data: dict[str, Any]) -> bytes:
    """A release's extracted facts as the bytes of its shipped file: interned, sorted, gzip'd, stable."""
    nodes: list[dict[str, Any]] = []
    index: dict[str, int] = {}

    def intern(tree: Any) -> Any:
        if isinstance(tree, dict):
            node = {k: intern(v) for k, v in tree.items()}
            key = json.dumps(node, sort_keys=True)
            if key not in index:
                index[key] = len(nodes)
                nodes.append(node)
            return {REF: index[key]}
        if isinstance(tree, list):
            return [intern(v) for v in tree]
        return tree

    def interned(configs: dict[str, Any]) -> dict[str, Any]:
        return {name: {"default_engine": c["default_engine"], "engines": {e: intern(t) for e, t in c["engines"].items()}}
                for name, c in configs.items()}

    configs = interned(data["configs"])
    # every config's group choices: each other option's subtree interned with the trees (unpack leaves them so)
    choices = {name: {e: {key: {**entry, "options": {o: None if t is None else intern(t)
                                                     for o, t in entry["options"].items()}}
                          for key, entry in groups.items()}
                      for e, groups in c.get("groups", {}).items()}
               for name, c in {**data["configs"], **data["program_configs"]}.items()}
    doc = {"verl_version": version, "configs": configs, "choices": choices, "programs": data["programs"],
           "program_configs": interned(data["program_configs"]), "nodes": nodes, "groups": data["groups"],
           "targets": data["targets"], "classes": data["classes"], "allowed": data["allowed"],
           "worker_allowed": data["worker_allowed"], "startup": data["startup"],
           "loadable": data["loadable"]}
    return _gzip(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode())


def unpack(doc: dict[str, Any]) -> dict[str, Any]:
    """The inverse of pack(): trees rebuilt from the node table, each place its own object (a caller
    that edits one engine's tree, or one of two equal sections, must not edit the other)."""
    nodes = doc["nodes"]

    def built(configs: dict[str, Any]) -> dict[str, Any]:
        return {name: {"default_engine": c["default_engine"],
                       "engines": {e: _build(t, nodes) for e, t in c["engines"].items()}}
                for name, c in configs.items()}

    return {
        "configs": built(doc["configs"]),
        "programs": doc.get("programs", {}),
        "program_configs": built(doc.get("program_configs", {})),
        "groups": doc["groups"], "targets": doc["targets"], "classes": doc["classes"], "allowed": doc["allowed"],
        "worker_allowed": doc.get("worker_allowed", {}),
        "startup": doc.get("startup", {}),
        "loadable": doc.get("loadable", {}),
        "choices": doc.get("choices", {}), "nodes": nodes,  # the choices' subtrees: built when chosen
    }
