"""verl's own config as the schema of a spec's `verl:` section.

Two sources, one shape:
- snapshot: `compiler/verl_schemas/<version>.json`, shipped in the package and written by
  `dev/verl_schema.py` from an installed verl. Building needs nothing but this file.
- live: composed from the installed verl's YAML files with Hydra (without importing verl, which
  would import torch). Used with `--verl-config live`.

Both hold, per `model_engine` choice, the composed (unresolved) ppo_trainer config, in which
`???` marks a mandatory value, plus the allowed values of the settings verl restricts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

MISSING = "???"
TRAINER_CONFIG = "ppo_trainer"

# Settings with a closed set of values, and where in verl 0.9.1 that set is defined.
# Enumerated by dev/verl_schema.py when it can import verl; these are the fallback facts.
ALLOWED_FACTS: dict[str, tuple[str, ...]] = {
    # verl/workers/rollout/__init__.py registry; hf was removed (verl #4424)
    "actor_rollout_ref.rollout.name": ("vllm", "sglang", "trtllm"),
    # verl/workers/config/rollout.py: sync mode was removed (verl #4424)
    "actor_rollout_ref.rollout.mode": ("async",),
    # verl/workers/config/actor.py ActorConfig.__post_init__
    "actor_rollout_ref.actor.loss_agg_mode": (
        "token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
}


@dataclass(frozen=True)
class VerlSchema:
    version: str
    default_engine: str
    engines: Mapping[str, dict[str, Any]]  # model_engine choice -> composed config
    allowed: dict[str, tuple[Any, ...]]
    source: str  # "snapshot" or "live"


def known_versions() -> list[str]:
    folder = resources.files("verlc.compiler").joinpath("verl_schemas")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


@cache
def snapshot(version: str) -> VerlSchema:
    """The shipped schema of one verl release; KeyError when verlc has none for it."""
    if version not in known_versions():
        raise KeyError(version)
    path = resources.files("verlc.compiler").joinpath("verl_schemas", f"{version}.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    return VerlSchema(
        version=data["verl_version"], default_engine=data["default_engine"], engines=data["engines"],
        allowed={k: tuple(v) for k, v in data["allowed"].items()}, source="snapshot",
    )


def config_dir() -> str:
    """The installed verl's config folder, found without running verl/__init__ (torch)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("verl is not installed; use the shipped snapshot (drop --verl-config live)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def installed_version() -> str:
    from importlib.metadata import version

    return version("verl")


def compose(overrides: list[str]) -> dict[str, Any]:
    """Hydra's composition of ppo_trainer with these overrides, unresolved; raises on a bad key."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = hydra_compose(TRAINER_CONFIG, overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


def engine_choices() -> list[str]:
    from pathlib import Path

    return sorted(p.stem for p in (Path(config_dir()) / "model_engine").glob("*.yaml"))


def _default_engine() -> str:
    from pathlib import Path

    import yaml  # PyYAML comes with hydra

    top = yaml.safe_load((Path(config_dir()) / f"{TRAINER_CONFIG}.yaml").read_text())
    for entry in top.get("defaults", []):
        if isinstance(entry, dict) and "model_engine" in entry:
            return str(entry["model_engine"])
    raise RuntimeError("no model_engine default in ppo_trainer.yaml")


class _Composed(Mapping[str, dict[str, Any]]):
    """Engine name -> verl's config for it, composed by Hydra the first time a check asks (~0.6 s each)."""

    def __init__(self, names: list[str]) -> None:
        self._names = names
        self._configs: dict[str, dict[str, Any]] = {}

    def __getitem__(self, name: str) -> dict[str, Any]:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._configs:
            self._configs[name] = compose([f"model_engine={name}"])
        return self._configs[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@cache
def live() -> VerlSchema:
    """The schema of the installed verl, each engine composed when first needed."""
    return VerlSchema(installed_version(), _default_engine(), _Composed(engine_choices()), _allowed(), "live")


def _allowed() -> dict[str, tuple[Any, ...]]:
    allowed = dict(ALLOWED_FACTS)
    estimators = _enum_values("trainer/ppo/core_algos.py", "AdvantageEstimator")
    if estimators:
        allowed["algorithm.adv_estimator"] = estimators
    return allowed


def _enum_values(module: str, enum: str) -> tuple[str, ...]:
    """String values of an Enum class in verl's source, read with ast: importing it would import torch."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(config_dir()).parent.parent / module).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == enum:
            return tuple(sorted(stmt.value.value for stmt in node.body if isinstance(stmt, ast.Assign)
                                and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)))
    return ()


def snapshot_json(schema: VerlSchema) -> str:
    """The text of a snapshot file, stable byte for byte for the same verl."""
    data = {
        "verl_version": schema.version,
        "default_engine": schema.default_engine,
        "allowed": {k: list(v) for k, v in sorted(schema.allowed.items())},
        "engines": dict(schema.engines),
    }
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"
