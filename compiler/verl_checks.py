"""The spec's `verl:` section checked against verl's config (keys, types, allowed and mandatory values)
and against verl's consistency rules, including those verl only discovers after workers start."""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .diagnostics import Diagnostic
from .load import Sourced
from .overrides import Setting, critic_in_use, derived, flatten, hydra_value
from .spec import Spec
from .verl_schema import MISSING, VerlSchema

# Mappings that take keys verl does not list (new keys need Hydra's `+`): empty ones in the
# config, and these, whose contents are free-form by design.
OPEN_NAMES = ("runtime_env", "env_vars", "override_config", "override_transformer_config", "engine_kwargs",
              "kwargs", "kw_args")

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REFERENCE = re.compile(r"\$\{(\.*[A-Za-z_][\w.]*)\}")
_SELECT = re.compile(r"\$\{oc\.select:(\.*[A-Za-z_][\w.]*),([^}]*)\}")


def engine_of(spec: Spec, schema: VerlSchema) -> str:
    return str(spec.verl.get("model_engine", schema.default_engine))


def _node(tree: Any, parts: list[str]) -> tuple[bool, Any]:
    for part in parts:
        if not isinstance(tree, dict) or part not in tree:
            return False, None
        tree = tree[part]
    return True, tree


def _is_open(tree: dict[str, Any], parts: list[str]) -> bool:
    """Whether the mapping at `parts` accepts keys it does not list."""
    found, node = _node(tree, parts)
    return found and isinstance(node, dict) and (not node or (bool(parts) and parts[-1] in OPEN_NAMES))


def prefix(schema: VerlSchema, engine: str, key: str) -> str:
    """'' for a key verl's config has; '+' for a new key in an open mapping (Hydra's append)."""
    base, parts = schema.engines[engine], key.split(".")
    if key == "model_engine" or _node(base, parts)[0]:
        return ""
    depth = max(i for i in range(len(parts)) if _node(base, parts[:i])[0])
    return "+" if _is_open(base, parts[:depth]) else ""


class Config:
    """verl's config for one engine with the spec's settings applied; resolves simple interpolations."""

    def __init__(self, base: dict[str, Any], settings: dict[str, Any]) -> None:
        self.tree = copy.deepcopy(base)
        for key, value in settings.items():
            node = self.tree
            *parents, last = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value

    def get(self, key: str, depth: int = 0) -> Any:
        found, value = _node(self.tree, key.split("."))
        if not found:
            return None
        if isinstance(value, str) and depth < 10:
            if m := _REFERENCE.fullmatch(value):
                return self.get(_absolute(key, m[1]), depth + 1)
            if m := _SELECT.fullmatch(value):
                chosen = self.get(_absolute(key, m[1]), depth + 1)
                return chosen if chosen is not None else _literal(m[2])
        return value


def _absolute(key: str, reference: str) -> str:
    """OmegaConf's relative references: `.x` is a sibling of `key`, `..x` a sibling of its parent."""
    dots = len(reference) - len(reference.lstrip("."))
    if not dots:
        return reference
    parents = key.split(".")[:-dots]
    return ".".join([*parents, reference[dots:]])


def _literal(text: str) -> Any:
    text = text.strip()
    if text in ("null", ""):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text.strip("'\""))


def _type_problem(default: Any, value: Any) -> str | None:
    """A mismatch between a setting and its default's type, or None. Unknown types pass."""
    if default is None or default == MISSING or value is None:
        return None
    if isinstance(default, str) and "${" in default:
        return None  # an interpolation: the type is whatever it points at
    checks: list[tuple[type, tuple[type, ...], str]] = [
        (bool, (bool,), "true or false"),
        (int, (int,), "an integer"),
        (float, (int, float), "a number"),
        (str, (str,), "a string"),
        (list, (list,), "a list"),
        (dict, (dict,), "a mapping"),
    ]
    for default_type, accepted, words in checks:
        if isinstance(default, default_type):
            ok = isinstance(value, accepted) and not (isinstance(value, bool) and bool not in accepted)
            return None if ok else f"expects {words} (verl's default is {hydra_value(default)}), got {hydra_value(value)}"
    return None


@dataclass(frozen=True)
class _Where:
    """Where each verl key a rule mentions comes from in the spec, for positioning its message."""

    settings: dict[str, Setting]
    derived_from: dict[str, str]

    def loc(self, *keys: str) -> tuple[str | int, ...]:
        """The first key the spec sets, else the one it derives, else where the first key would go."""
        for key in keys:
            if key in self.settings:
                return self.settings[key].loc
        for key in keys:
            if key in self.derived_from:
                return tuple(self.derived_from[key].split("."))
        return ("verl", *keys[0].split("."))


def check_verl(spec: Spec, sourced: Sourced, schema: VerlSchema) -> Iterator[Diagnostic]:
    """Every problem of `verl:` against the schema, then verl's consistency rules."""
    engine = engine_of(spec, schema)
    if engine not in schema.engines:
        yield sourced.diagnostic(("verl", "model_engine"), f"unknown model_engine '{engine}'; verl "
                                 f"{schema.version} has {', '.join(schema.engines)}" +
                                 _near(engine, list(schema.engines)))
        return
    base = schema.engines[engine]
    settings = {s.key: s for s in flatten(spec.verl) if s.key != "model_engine"}
    key_problems = list(_keys(settings, base, schema, engine, sourced))
    yield from key_problems
    values = {k: s.value for k, s in settings.items()}
    values.update({d.key: d.value for d in derived(spec)})
    config = Config(base, values)
    yield from _mandatory(config, base, sourced, schema)
    if key_problems:
        return  # rules over misspelt keys would only repeat the same problem
    where = _Where(settings, {d.key: d.source for d in derived(spec)})
    for keys, message, when in rules(config, critic_in_use(spec.verl)):
        yield sourced.diagnostic(where.loc(*keys), message + (WORKERS_NOTE if when == WORKERS else ""))


def _near(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _all_keys(tree: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in tree.items():
        path = f"{prefix}.{key}" if prefix else key
        yield path
        if isinstance(value, dict):
            yield from _all_keys(value, path)


def _keys(settings: dict[str, Setting], base: dict[str, Any], schema: VerlSchema, engine: str,
          sourced: Sourced) -> Iterator[Diagnostic]:
    for key, s in settings.items():
        parts = key.split(".")
        found, default = _node(base, parts)
        if found:
            if isinstance(default, dict) and default and not isinstance(s.value, dict):
                yield sourced.diagnostic(s.loc, "is a section of verl's config; set the keys under it, not a value")
                continue
            problem = _type_problem(default, s.value)
            allowed = schema.allowed.get(key)
            if problem:
                yield sourced.diagnostic(s.loc, problem)
            elif allowed and s.value not in allowed:
                yield sourced.diagnostic(s.loc, f"must be one of {', '.join(map(str, allowed))} in verl {schema.version}, "
                                   f"got {hydra_value(s.value)}" + _near(str(s.value), [str(a) for a in allowed]))
            continue
        depth = max(i for i in range(len(parts)) if _node(base, parts[:i])[0])
        if _is_open(base, parts[:depth]):
            bad = next((p for p in parts[depth:] if not _KEY.fullmatch(p)), None)
            if bad is not None:
                yield sourced.diagnostic(s.loc, f"'{bad}' cannot be a key in a verl override", at_key=True)
            continue
        parent = ".".join(parts[:depth])
        _, node = _node(base, parts[:depth])
        if not isinstance(node, dict):
            yield sourced.diagnostic(s.loc, f"'{parent}' is a value in verl's config, not a section")
            continue
        siblings = [k for k in node]
        hint = _near(parts[depth], siblings)
        if not hint:  # the right name in the wrong place?
            elsewhere = [k for k in _all_keys(base) if k.rsplit(".", 1)[-1] == parts[-1]]
            hint = f" (did you mean '{elsewhere[0]}'?)" if len(elsewhere) == 1 else ""
        where = f"under '{parent}'" if parent else "at the top level"
        yield sourced.diagnostic(s.loc, f"verl {schema.version} ({engine} engine) has no key "
                                        f"'{parts[depth]}' {where}{hint}", at_key=True)


def _mandatory(config: Config, base: dict[str, Any], sourced: Sourced, schema: VerlSchema) -> Iterator[Diagnostic]:
    for key in _all_keys(base):
        if config.get(key) != MISSING:
            continue
        parts = key.split(".")
        # `???` inside a disabled section (e.g. reward.reward_model with enable: false) is not needed.
        if any(config.get(".".join(parts[:i] + ["enable"])) is False for i in range(1, len(parts))):
            continue
        allowed = schema.allowed.get(key)
        choices = f" ({', '.join(map(str, allowed))})" if allowed else ""
        yield sourced.diagnostic(("verl",) if "verl" in sourced.data else (),
                                 f"verl.{key} is mandatory in verl {schema.version}; set it{choices}", at_key=True)


START, WORKERS = "start", "workers"
WORKERS_NOTE = " (verl itself only finds this once the workers start)"


def rules(cfg: Config, use_critic: bool) -> Iterator[tuple[tuple[str, ...], str, str]]:
    """verl's consistency rules: (keys involved, message, START or WORKERS) for each one broken.

    validate_config (verl/utils/config.py) and the worker configs check some at start-up; the
    GPU-layout ones only fail once the workers are placed (verl #606, #1191, #1785)."""
    actor, rollout, ref, critic = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout",
                                   "actor_rollout_ref.ref", "critic")
    g = cfg.get
    nnodes, per_node = g("trainer.nnodes"), g("trainer.n_gpus_per_node")
    ints = [nnodes, per_node, g("data.train_batch_size"), g(f"{rollout}.n"), g(f"{actor}.ppo_mini_batch_size")]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        return  # a type problem is reported elsewhere; arithmetic on it would mislead
    n_gpus = nnodes * per_node
    train, n, mini = g("data.train_batch_size"), g(f"{rollout}.n"), g(f"{actor}.ppo_mini_batch_size")
    dynamic = bool(g(f"{actor}.use_dynamic_bsz"))
    megatron = g(f"{actor}.strategy") == "megatron"

    if not dynamic:
        micro_global, micro = g(f"{actor}.ppo_micro_batch_size"), g(f"{actor}.ppo_micro_batch_size_per_gpu")
        if micro_global is None and micro is None:
            yield (f"{actor}.ppo_micro_batch_size_per_gpu",), (
                f"{actor}.ppo_micro_batch_size_per_gpu is not set: verl needs a micro batch size for the "
                f"actor unless {actor}.use_dynamic_bsz is true"), START
        elif micro_global is not None and micro is not None:
            yield (f"{actor}.ppo_micro_batch_size",), (
                f"set only {actor}.ppo_micro_batch_size_per_gpu; ppo_micro_batch_size is deprecated and "
                f"verl refuses both together"), START
        if megatron:
            mp = g(f"{actor}.megatron.tensor_model_parallel_size") * g(f"{actor}.megatron.pipeline_model_parallel_size")
            cp = g(f"{actor}.megatron.context_parallel_size")
            if n_gpus % (mp * cp):
                yield ("trainer.nnodes", f"{actor}.megatron.tensor_model_parallel_size"), (
                    f"{n_gpus} GPUs are not divisible by Megatron TP x PP x CP = {mp * cp}"), START
                return
            minimal = n_gpus // (mp * cp) * (micro or 1)
        else:
            minimal = n_gpus
        if (train * n) % minimal:
            yield ("data.train_batch_size", f"{rollout}.n", "trainer.nnodes"), (
                f"data.train_batch_size x rollout.n = {train} x {n} = {train * n} must be divisible by "
                f"{minimal} ({'the data-parallel batch' if megatron else f'{n_gpus} GPUs'})"), START
        if train < mini:
            yield (f"{actor}.ppo_mini_batch_size", "data.train_batch_size"), (
                f"{actor}.ppo_mini_batch_size ({mini}) must be <= data.train_batch_size ({train})"), START
        sp = g(f"{actor}.ulysses_sequence_parallel_size") or 1
        if micro_global is not None:
            if mini % micro_global:
                yield (f"{actor}.ppo_micro_batch_size",), (
                    f"{actor}.ppo_mini_batch_size ({mini}) must be divisible by ppo_micro_batch_size ({micro_global})"), START
            if micro_global * sp < n_gpus:
                yield (f"{actor}.ppo_micro_batch_size",), (
                    f"{actor}.ppo_micro_batch_size ({micro_global}) x sequence parallel ({sp}) must be >= "
                    f"{n_gpus} GPUs"), START
        if micro and not megatron and isinstance(sp, int) and sp >= 1 and n_gpus % sp == 0:
            # What verl's FSDP workers compute at start-up (verl #606, #473, #1004, #1524).
            normalized = mini * n // (n_gpus // sp)
            if normalized <= 0:
                yield (f"{actor}.ppo_mini_batch_size", "trainer.nnodes"), (
                    f"ppo_mini_batch_size x rollout.n / (GPUs / sequence parallel) = {mini} x {n} / "
                    f"{n_gpus // sp} is 0 per GPU; raise {actor}.ppo_mini_batch_size"), WORKERS
            elif normalized % micro:
                yield (f"{actor}.ppo_micro_batch_size_per_gpu", f"{actor}.ppo_mini_batch_size"), (
                    f"the per-GPU mini batch ({mini} x {n} / {n_gpus // sp} = {normalized}) must be "
                    f"divisible by {actor}.ppo_micro_batch_size_per_gpu ({micro})"), WORKERS
        for section, needed in ((rollout, True), (ref, bool(g(f"{actor}.use_kl_loss")) or
                                                  bool(g("algorithm.use_kl_in_reward")))):
            a, b = g(f"{section}.log_prob_micro_batch_size"), g(f"{section}.log_prob_micro_batch_size_per_gpu")
            if needed and a is None and b is None:
                yield (f"{section}.log_prob_micro_batch_size_per_gpu",), (
                    f"{section}.log_prob_micro_batch_size_per_gpu is not set: verl needs it"
                    + ("" if section == rollout else " when a reference policy is used (KL loss or KL in reward)")), START
            elif needed and a is not None and b is not None:
                yield (f"{section}.log_prob_micro_batch_size",), (
                    f"set only {section}.log_prob_micro_batch_size_per_gpu; verl refuses both"), START

    if not megatron and (g(f"{actor}.ulysses_sequence_parallel_size") or 1) > 1 \
            and not g("actor_rollout_ref.model.use_remove_padding"):
        yield (f"{actor}.ulysses_sequence_parallel_size",), (
            "sequence parallelism needs actor_rollout_ref.model.use_remove_padding: true"), START

    loss_agg = g(f"{actor}.loss_agg_mode")
    if loss_agg is not None and not isinstance(loss_agg, str):
        yield (f"{actor}.loss_agg_mode",), f"{actor}.loss_agg_mode must be a string", START

    if use_critic and not bool(g(f"{critic}.use_dynamic_bsz")):
        c_micro, c_micro_gpu = g(f"{critic}.ppo_micro_batch_size"), g(f"{critic}.ppo_micro_batch_size_per_gpu")
        c_mini = g(f"{critic}.ppo_mini_batch_size")
        if c_micro is None and c_micro_gpu is None:
            yield (f"{critic}.ppo_micro_batch_size_per_gpu",), (
                f"{critic}.ppo_micro_batch_size_per_gpu is not set: the GAE critic needs a micro batch size "
                f"(or critic.use_dynamic_bsz: true)"), START
        elif c_micro is not None and c_micro_gpu is not None:
            yield (f"{critic}.ppo_micro_batch_size",), (
                f"set only {critic}.ppo_micro_batch_size_per_gpu; verl refuses both"), START
        elif c_micro is not None and isinstance(c_mini, int) and c_mini % c_micro:
            yield (f"{critic}.ppo_micro_batch_size",), (
                f"{critic}.ppo_mini_batch_size ({c_mini}) must be divisible by ppo_micro_batch_size ({c_micro})"), START
        if isinstance(c_mini, int) and train < c_mini:
            yield (f"{critic}.ppo_mini_batch_size",), (
                f"{critic}.ppo_mini_batch_size ({c_mini}) must be <= data.train_batch_size ({train})"), START
        c_sp = g(f"{critic}.ulysses_sequence_parallel_size") or 1
        if c_micro is not None and not megatron and c_micro * c_sp < n_gpus:
            yield (f"{critic}.ppo_micro_batch_size",), (
                f"{critic}.ppo_micro_batch_size ({c_micro}) x sequence parallel ({c_sp}) must be >= {n_gpus} GPUs"), START

    if g(f"{rollout}.val_kwargs.do_sample") and not (g(f"{rollout}.temperature") or 0) > 0:
        yield (f"{rollout}.temperature",), "validation sampling (val_kwargs.do_sample) needs rollout.temperature > 0", START

    tp = g(f"{rollout}.tensor_model_parallel_size") or 1
    dp = g(f"{rollout}.data_parallel_size") or 1
    pp = g(f"{rollout}.pipeline_model_parallel_size") or 1
    if all(isinstance(v, int) for v in (tp, dp, pp)):
        if pp > 1:
            yield (f"{rollout}.pipeline_model_parallel_size",), "verl's rollout does not support pipeline parallelism", WORKERS
        if tp > per_node:
            yield (f"{rollout}.tensor_model_parallel_size",), (
                f"rollout tensor parallel size {tp} spans more than one node ({per_node} GPUs per node)"), WORKERS
        elif n_gpus % (tp * dp * pp):
            yield (f"{rollout}.tensor_model_parallel_size", "trainer.nnodes"), (
                f"{n_gpus} GPUs are not divisible by rollout TP x DP x PP = {tp} x {dp} x {pp} "
                f"(verl #1191, #1785: fails once the workers start)"), WORKERS
