"""verl's consistency rules over a whole config, and the config they read (defaults + the spec's settings)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_REFERENCE = re.compile(r"\$\{(\.*[A-Za-z_][\w.]*)\}")
_SELECT = re.compile(r"\$\{oc\.select:(\.*[A-Za-z_][\w.]*),([^}]*)\}")

START, WORKERS = "start", "workers"
WORKERS_NOTE = " (verl itself only finds this once the workers start)"


class Config:
    """verl's config for one engine with settings applied; resolves simple interpolations."""

    def __init__(self, base: dict[str, Any], settings: dict[str, Any]) -> None:
        # `base` (a release's shared tree) is never changed: each setting copies only the mappings on
        # its own path, and the rest of the tree is shared.
        self.tree = dict(base)
        for key, value in settings.items():
            node = self.tree
            *parents, last = key.split(".")
            for part in parents:
                child = node.get(part)  # not a mapping: a null default that the spec fills with keys
                node[part] = child = dict(child) if isinstance(child, dict) else {}
                node = child
            node[last] = value

    def get(self, key: str, depth: int = 0) -> Any:
        value: Any = self.tree
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        if isinstance(value, str) and depth < 10:
            if m := _REFERENCE.fullmatch(value):
                return self.get(absolute(key, m[1]), depth + 1)
            if m := _SELECT.fullmatch(value):
                chosen = self.get(absolute(key, m[1]), depth + 1)
                return chosen if chosen is not None else _literal(m[2])
        return value


def absolute(key: str, reference: str) -> str:
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


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)

_A, _R, _REF, _C = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic"
_GPUS = ("trainer.nnodes", "trainer.n_gpus_per_node")
# What rules() checks, in words, with every key each rule reads: `verlc explain KEY` lists those naming
# KEY (tests/test_explain.py holds it to the keys rules() yields).
RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    ((f"{_A}.ppo_micro_batch_size_per_gpu", f"{_R}.log_prob_micro_batch_size_per_gpu",
      f"{_REF}.log_prob_micro_batch_size_per_gpu", f"{_C}.ppo_micro_batch_size_per_gpu"),
     "micro batch sizes are positive whole numbers: the workers divide by them (found once the workers start)"),
    ((f"{_A}.ppo_micro_batch_size_per_gpu", f"{_A}.ppo_micro_batch_size", f"{_A}.use_dynamic_bsz"),
     "unless actor.use_dynamic_bsz, the actor needs ppo_micro_batch_size_per_gpu (or the deprecated "
     "ppo_micro_batch_size, never both)"),
    ((*_GPUS, f"{_A}.megatron.tensor_model_parallel_size", f"{_A}.megatron.pipeline_model_parallel_size",
      f"{_A}.megatron.context_parallel_size", f"{_A}.strategy"),
     "Megatron: the GPU count must be divisible by TP x PP x CP"),
    (("data.train_batch_size", f"{_R}.n", *_GPUS, f"{_A}.ppo_micro_batch_size_per_gpu"),
     "data.train_batch_size x rollout.n must be divisible by the GPU count (Megatron: by the data-parallel "
     "size x the micro batch)"),
    ((f"{_A}.ppo_mini_batch_size", "data.train_batch_size"), "actor.ppo_mini_batch_size <= data.train_batch_size"),
    ((f"{_A}.ppo_micro_batch_size", f"{_A}.ppo_mini_batch_size", f"{_A}.ulysses_sequence_parallel_size", *_GPUS),
     "the deprecated actor.ppo_micro_batch_size must divide ppo_mini_batch_size, and times the sequence "
     "parallel size be >= the GPU count"),
    ((f"{_A}.ppo_mini_batch_size", f"{_R}.n", *_GPUS, f"{_A}.ulysses_sequence_parallel_size",
      f"{_A}.ppo_micro_batch_size_per_gpu"),
     "per GPU, ppo_mini_batch_size x rollout.n / (GPUs / sequence parallel) must be > 0 and divisible by "
     "actor.ppo_micro_batch_size_per_gpu (found once the workers start)"),
    ((f"{_R}.log_prob_micro_batch_size_per_gpu", f"{_R}.log_prob_micro_batch_size",
      f"{_REF}.log_prob_micro_batch_size_per_gpu", f"{_REF}.log_prob_micro_batch_size", f"{_A}.use_kl_loss",
      "algorithm.use_kl_in_reward"),
     "the rollout (and the reference policy, when a KL term uses it) needs log_prob_micro_batch_size_per_gpu, "
     "not together with the deprecated log_prob_micro_batch_size"),
    ((f"{_A}.ulysses_sequence_parallel_size", "actor_rollout_ref.model.use_remove_padding"),
     "sequence parallelism (> 1) needs actor_rollout_ref.model.use_remove_padding: true"),
    ((f"{_A}.loss_agg_mode",), "actor.loss_agg_mode must be a string"),
    ((f"{_C}.ppo_micro_batch_size_per_gpu", f"{_C}.ppo_micro_batch_size", f"{_C}.ppo_mini_batch_size",
      f"{_C}.use_dynamic_bsz", f"{_C}.ulysses_sequence_parallel_size", "data.train_batch_size", *_GPUS),
     "a GAE critic needs ppo_micro_batch_size_per_gpu unless critic.use_dynamic_bsz (not with the deprecated "
     "ppo_micro_batch_size, which must divide ppo_mini_batch_size and times sequence parallel be >= the GPU "
     "count); critic.ppo_mini_batch_size <= data.train_batch_size"),
    ((f"{_R}.val_kwargs.do_sample", f"{_R}.temperature"), "validation sampling needs rollout.temperature > 0"),
    ((f"{_R}.tensor_model_parallel_size", f"{_R}.data_parallel_size", f"{_R}.pipeline_model_parallel_size",
      *_GPUS),
     "the rollout has no pipeline parallelism, the GPU count is divisible by TP x DP x PP, and a replica's "
     "TP x DP x PP fills whole nodes (before 0.6.0: its TP fits in one node) (found once the workers start)"),
)


def rules(cfg: Config, use_critic: bool, replicas_span_nodes: bool = True
          ) -> Iterator[tuple[tuple[str, ...], str, str]]:
    """verl's consistency rules: (keys involved, message, START or WORKERS) for each one broken.

    validate_config (verl/utils/config.py) and the worker configs check some at start-up; the
    GPU-layout ones only fail once the workers are placed (verl #606, #1191, #1785). `replicas_span_nodes`:
    the release places a rollout replica on several nodes (0.6.0 on), so its TP may exceed a node's GPUs."""
    actor, rollout, ref, critic = ("actor_rollout_ref.actor", "actor_rollout_ref.rollout",
                                   "actor_rollout_ref.ref", "critic")
    g = cfg.get
    nnodes, per_node = g("trainer.nnodes"), g("trainer.n_gpus_per_node")
    ints = [nnodes, per_node, g("data.train_batch_size"), g(f"{rollout}.n"), g(f"{actor}.ppo_mini_batch_size")]
    if not all(_int(v) for v in ints):
        return  # a type problem is reported elsewhere; arithmetic on it would mislead
    n_gpus = nnodes * per_node
    counts = [f"{actor}.ppo_micro_batch_size_per_gpu", f"{rollout}.log_prob_micro_batch_size_per_gpu",
              f"{ref}.log_prob_micro_batch_size_per_gpu", f"{critic}.ppo_micro_batch_size_per_gpu"]
    odd = [k for k in counts if g(k) is not None and not (_int(g(k)) and g(k) > 0)]
    for count in odd:  # where no dataclass types them, verl's workers divide by them as they come
        yield (f"{count}",), (f"{count} must be a positive whole number of samples, got {g(count)!r}: verl's "
                              f"workers divide the batch by it"), WORKERS
    if odd:
        return
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
            tp_pp_cp = [g(f"{actor}.megatron.{k}_parallel_size") for k in ("tensor_model", "pipeline_model", "context")]
            if not all(_int(v) and v > 0 for v in tp_pp_cp) or not (micro is None or _int(micro)):
                return
            mp, cp = tp_pp_cp[0] * tp_pp_cp[1], tp_pp_cp[2]
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
        world = tp * dp * pp
        if replicas_span_nodes and world % min(per_node, world):
            yield (f"{rollout}.tensor_model_parallel_size",), (
                f"a rollout replica (TP x DP x PP = {tp} x {dp} x {pp} = {world} GPUs) must fill whole nodes of "
                f"{per_node} GPUs (verl's RolloutReplica)"), WORKERS
        elif tp > per_node and not replicas_span_nodes:
            yield (f"{rollout}.tensor_model_parallel_size",), (
                f"rollout tensor parallel size {tp} spans more than one node ({per_node} GPUs per node): set "
                f"{rollout}.tensor_model_parallel_size to at most {per_node}"), WORKERS
        elif n_gpus % (tp * dp * pp):
            yield (f"{rollout}.tensor_model_parallel_size", "trainer.nnodes"), (
                f"{n_gpus} GPUs are not divisible by rollout TP x DP x PP = {tp} x {dp} x {pp} "
                f"(verl #1191, #1785)"), WORKERS
