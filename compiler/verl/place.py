"""Where a dotted key lands in one release's config, and what verl builds there.

A key is walked from the top of the composed config. Each mapping on the way is one of:
- a node of the composed YAML (its keys exist: Hydra takes `key=value`);
- a dataclass verl builds (its `_target_`, or the type of the field holding it): fields it declares
  that the YAML leaves out are known keys too, passed as `+key=value`;
- a keyed map (`dict[str, SomeConfig]`): a new entry is passed with `+` and checked as SomeConfig;
- open (`dict[str, Any]` fields, empty YAML mappings, free-form sections): any key, passed with `+`;
- closed: an unknown key is refused by Hydra; written with an explicit `+`, Hydra takes it, and verl
  takes it only where it keeps the mapping as a plain DictConfig (no dataclass built from it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .release import MISSING, DataClass, Release

# Free-form mappings that no dataclass describes (0.3-0.4 have no dataclasses at all): verl hands
# their contents to Ray, transformers or an engine as they are.
OPEN_NAMES = ("runtime_env", "env_vars", "override_config", "override_transformer_config", "engine_kwargs",
              "kwargs", "kw_args")

KNOWN, UNKNOWN, UNDER_VALUE = "known", "unknown", "under-value"


@dataclass(frozen=True)
class Scope:
    """The mapping a walk is in: its YAML node (None when the YAML has none) and what verl builds from it."""

    node: dict[str, Any] | None
    cls: DataClass | None = None       # the dataclass that describes it
    entries: DataClass | None = None   # a keyed map of these
    open: bool = False
    is_mapping: bool = True
    built: bool = False                # verl builds `cls` from it (a `_target_`, or a keyed-map entry);
                                       # otherwise verl hands the mapping on as a dict and `cls` only informs


@dataclass(frozen=True)
class Place:
    """What one dotted key is in one config.

    status KNOWN: every part exists or is allowed; UNKNOWN: `parts[found]` is not a key of the mapping
    `parts[:found]`; UNDER_VALUE: `parts[:found]` is a value, not a mapping."""

    status: str
    found: int
    kinds: tuple[str, ...] = ("any",)  # the leaf's accepted types
    default: Any = None                # the leaf's YAML default (None when not in the YAML)
    in_yaml: bool = True               # every part is in the composed YAML (no `+` needed)
    owner: DataClass | None = None     # the dataclass that describes the last mapping
    stop: bool = False                 # the YAML has a non-mapping value here: a spec mapping is one value
    built: bool = False                # verl builds `owner` from that mapping (see Scope.built)


class Walker:
    """Walks keys through one (release, trainer config, model_engine) combination."""

    def __init__(self, release: Release, config: str, engine: str) -> None:
        self.release, self.config, self.engine = release, config, engine
        self.tree = release.tree(config, engine)

    def built(self, node: Any) -> DataClass | None:
        """The dataclass verl builds from a YAML mapping: its `_target_`, when the mapping's own keys all
        fit it (0.6's global_profiler names ProfilerConfig yet has keys it lacks: verl reads it as is)."""
        target = node.get("_target_") if isinstance(node, dict) else None
        cls = self.release.target(target) if isinstance(target, str) else None
        if cls is None or not set(node) - {"_target_"} <= set(cls.fields):
            return None
        return cls

    def enter(self, at: Scope, part: str) -> tuple[Scope | None, tuple[str, ...], Any, bool]:
        """(the child's context, its kinds, its YAML default, whether the YAML has it); None if unknown."""
        in_yaml = at.node is not None and part in at.node
        field = at.cls.fields.get(part) if at.cls else None
        if not in_yaml and field is None:
            if at.entries is not None:  # a new named entry of a keyed map: verl builds each entry
                return Scope(None, cls=at.entries, built=True), (f"C:{at.entries.qualname}",), None, False
            if at.open:
                return Scope(None, open=True), ("any",), None, False
            return None, (), None, False
        child = at.node[part] if in_yaml and at.node is not None else None
        kinds = tuple(field.split("|")) if field else ("any",) if at.open else kinds_of(child)
        cls = self.built(child)
        built = cls is not None or (at.entries is not None and in_yaml)
        entries = None
        is_open = False
        for kind in kinds:
            if kind.startswith("C:") and cls is None:
                cls = self.release.classes.get(kind[2:])
            elif kind.startswith("M:"):
                entries = self.release.classes.get(kind[2:])
            elif kind in ("dict", "any") and (field is not None or at.open):
                is_open = True
        if field is None and isinstance(child, dict) and cls is None:
            # a mapping no dataclass describes: open when empty, free-form by name, or inside an open one
            is_open = is_open or not child or part in OPEN_NAMES
        is_mapping = isinstance(child, dict) or cls is not None or entries is not None or is_open
        node = child if isinstance(child, dict) else None
        return (Scope(node, cls, entries, is_open and cls is None and entries is None, is_mapping, built),
                kinds, child, in_yaml)

    def place(self, parts: list[str]) -> Place:
        at = Scope(self.tree)
        kinds: tuple[str, ...] = ("section",)
        default: Any = self.tree
        all_yaml = True
        for depth, part in enumerate(parts):
            if not at.is_mapping:
                return Place(UNDER_VALUE, depth, kinds, default, all_yaml, at.cls)
            owner, built = at.cls, at.built
            child, kinds, default, in_yaml = self.enter(at, part)
            if child is None:
                return Place(UNKNOWN, depth, (), None, all_yaml, owner, built=built)
            if not in_yaml and at.open and depth < len(parts) - 1:  # inside a free-form mapping: anything
                return Place(KNOWN, len(parts), ("any",), None, False, None)
            all_yaml = all_yaml and in_yaml
            if depth == len(parts) - 1:
                return Place(KNOWN, len(parts), kinds, default, all_yaml, owner,
                             stop=in_yaml and not isinstance(default, dict), built=built)
            at = child
        return Place(KNOWN, len(parts), kinds, default, all_yaml, at.cls)

    def context(self, parts: list[str]) -> Scope | None:
        """The mapping at `parts` (None when it is not a known mapping)."""
        at: Scope | None = Scope(self.tree)
        for part in parts:
            if at is None or not at.is_mapping:
                return None
            at = self.enter(at, part)[0]
        return at

    def keys(self, parts: list[str]) -> list[str]:
        """The keys verl knows in the mapping at `parts` (YAML keys and declared fields)."""
        at = self.context(parts)
        if at is None:
            return []
        names = set(at.node or ()) | set(at.cls.fields if at.cls else ())
        return sorted(n for n in names if not n.startswith("_"))


def kinds_of(default: Any) -> tuple[str, ...]:
    """Types from a YAML default, for nodes no dataclass describes (verl reads them as they come)."""
    if default is None or default == MISSING or (isinstance(default, str) and "${" in default):
        return ("any",)
    if isinstance(default, bool):
        return ("bool",)
    if isinstance(default, (int, float)):
        return ("number",)  # verl does arithmetic on it: an int default takes 0.5, a float default takes 1
    if isinstance(default, str):
        return ("str",)
    if isinstance(default, list):
        return ("list",)
    return ("section",)
