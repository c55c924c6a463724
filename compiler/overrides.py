"""The spec's `verl:` section and verlc's derived values as Hydra overrides for verl's ppo_trainer."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .spec import Spec

# Plain Hydra values that need no quoting; anything else is single-quoted.
_BARE = re.compile(r"[A-Za-z_/.][A-Za-z0-9_./+@-]*")
# Bare words Hydra would read as something other than a string.
_NOT_A_STRING = re.compile(r"(?i)(true|false|null|[-+]?(inf|nan)|[-+]?[0-9_.]+(e[-+]?[0-9]+)?)")


@dataclass(frozen=True)
class Setting:
    """One leaf of the `verl:` section: dotted key, value, and where it sits in the spec."""

    key: str
    value: Any
    loc: tuple[str | int, ...]


def flatten(tree: dict[str, Any], loc: tuple[str | int, ...] = ("verl",)) -> Iterator[Setting]:
    """Nested verl settings -> dotted leaves, in file order. Lists and empty mappings are leaves."""
    for key, value in tree.items():
        here = (*loc, key)
        if isinstance(value, dict) and value:
            yield from flatten(value, here)
        else:
            yield Setting(".".join(str(p) for p in here[1:]), value, here)


def hydra_value(value: Any) -> str:
    """A Python value in Hydra override syntax (the grammar of `key=value` on verl's command line)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        if _BARE.fullmatch(value) and not _NOT_A_STRING.fullmatch(value):
            return value
        return _quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Hydra syntax for {type(value).__name__}")


def _key(key: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise ValueError(f"{key!r} cannot be a key in a Hydra dict value")
    return key


def _quote(text: str) -> str:
    # Hydra's quoted strings: backslashes only escape when they precede a quote or end the string.
    out = []
    run = 0
    for ch in text:
        if ch == "\\":
            run += 1
            continue
        if ch == "'":
            out.append("\\" * (2 * run) + "\\'")
        else:
            out.append("\\" * run + ch)
        run = 0
    out.append("\\" * (2 * run))
    return "'" + "".join(out) + "'"


def critic_in_use(verl: dict[str, Any]) -> bool:
    """verl builds a critic for GAE (its default estimator) unless critic.enable says otherwise."""
    enable = verl.get("critic", {}).get("enable") if isinstance(verl.get("critic"), dict) else None
    if enable is not None:
        return bool(enable)
    algorithm = verl.get("algorithm") if isinstance(verl.get("algorithm"), dict) else {}
    return algorithm.get("adv_estimator", "gae") == "gae"


@dataclass(frozen=True)
class Derived:
    """A verl key whose value verlc fills in from another part of the spec."""

    key: str
    value: Any
    source: str  # the spec path it is derived from


def derived(spec: Spec) -> tuple[Derived, ...]:
    """Every verl key verlc sets itself; setting one to another value under `verl:` is an error."""
    items = [
        Derived("trainer.nnodes", spec.cluster.nodes, "cluster.nodes"),
        Derived("trainer.n_gpus_per_node", spec.cluster.gpus_per_node, "cluster.gpus_per_node"),
        Derived("trainer.project_name", spec.project, "project"),
        Derived("trainer.experiment_name", spec.experiment or spec.name,
                "experiment" if spec.experiment else "name"),
        Derived("actor_rollout_ref.model.path", spec.model, "model"),
        Derived("data.train_files", list(spec.data.train_files), "data.train_files"),
        Derived("data.val_files", list(spec.data.val_files), "data.val_files"),
    ]
    if critic_in_use(spec.verl):
        items.append(Derived("critic.model.path", spec.model, "model"))
    return tuple(items)
