"""The verl overrides a spec makes, below lowering: what the trainer gets on its command line, and the verl
values behind them. Lowering writes them into the IR; `verlc explain` and `verlc migrate` read them here."""

from __future__ import annotations

from typing import Any

from .derive import derived, resume_defaults
from .ir import Override
from .spec import Spec
from .verl import determinism
from .verl.check import Selection, settings, without_prefixes
from .verl.hydra import hydra_value, verl_value
from .verl.place import KNOWN
from .verl.program import MAIN_PPO
from .verl.release import DEFAULT_CONFIG


def overrides(spec: Spec, chosen: Selection) -> tuple[Override, ...]:
    """Derived keys plus the spec's `verl:` leaves, sorted by key: one stable line each.

    What selects the config comes first, in the order Hydra reads it: `--config-name` (when not main_ppo's
    default; always for another program, so the argv names its config), the plugin search path, then config
    group choices (model_engine among them)."""
    head: list[Override] = []
    if spec.hydra.config_dir is not None:
        head.append(Override("--config-dir", spec.hydra.config_dir, "hydra.config_dir"))
    if chosen.config != DEFAULT_CONFIG or spec.program != MAIN_PPO:
        head.append(Override("--config-name", chosen.config, "hydra.config_name"))
    if spec.hydra.searchpath:
        head.append(Override("hydra.searchpath", hydra_value(list(spec.hydra.searchpath)), "hydra.searchpath"))
    groups = {k: Override(k, v, f"hydra.groups.{k}") for k, v in spec.hydra.groups.items()}
    if "model_engine" in spec.verl:
        groups["model_engine"] = Override("model_engine", hydra_value(spec.verl["model_engine"]), "verl.model_engine")
    head += [groups[k] for k in sorted(groups)]
    out = {d.key: Override(d.key, hydra_value(verl_value(d.value)), d.source) for d in derived(spec, chosen.tree)}
    for s in settings(spec.verl, chosen.walker):
        out.setdefault(s.key, Override(s.key, hydra_value(verl_value(without_prefixes(s.value))),
                                       ".".join(map(str, s.loc)), s.prefix))
    for key, value in resume_defaults(spec, chosen.tree).items():
        out.setdefault(key, Override(key, hydra_value(verl_value(value)),
                                     "verlc: a requeued job resumes from its checkpoints"))
    for key, value in determinism_defaults(spec, chosen).items():
        out.setdefault(key, Override(key, hydra_value(value), "reproducible"))
    for key, value in device_defaults(spec, chosen).items():
        out.setdefault(key, Override(key, hydra_value(value), "cluster.accelerator"))
    return (*head, *(out[k] for k in sorted(out)))


def device_defaults(spec: Spec, chosen: Selection) -> dict[str, Any]:
    """trainer.device=npu on Ascend NPUs, where the release's config has the key (verl 0.4 on)."""
    if spec.cluster.accelerator != "npu" or chosen.walker.place(["trainer", "device"]).status != KNOWN:
        return {}
    return {"trainer.device": "npu"}


def determinism_defaults(spec: Spec, chosen: Selection) -> dict[str, Any]:
    """With `reproducible: true`, verl's determinism settings that the spec's release and engine have."""
    return determinism.available(chosen) if spec.reproducible else {}


def verl_values(spec: Spec, chosen: Selection) -> dict[str, Any]:
    """Every verl key the spec sets, derived ones included, as dotted key -> value."""
    values = {**resume_defaults(spec, chosen.tree), **{s.key: without_prefixes(s.value) for s in settings(spec.verl, chosen.walker)}}
    values.update({d.key: d.value for d in derived(spec, chosen.tree)})
    return values
