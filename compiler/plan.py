"""`verlc plan SPEC`: the resolved allocation of a spec's run before it is submitted, from the compiled IR.

GPUs per role, the rollout's replicas and their parallelism, each role's batch arithmetic per GPU, a sweep's
variants, and GPU-hours (and a cost, where the cluster's gpu_hour_price is given) bounded by the run's time
limit (a target's: compiler/ir.py's TimeLimit). Everything is read from the config verl will run with (the
IR's verl_config, interpolations resolved as verl resolves them) and the normalized spec; nothing is guessed:
where verlc cannot know, it says so.
"""

from __future__ import annotations

import math
from typing import Any

from ruamel.yaml import YAML

from .derive import critic_in_use
from .ir import JobIR
from .memory import NEAR, Estimate, gib
from .verl.program import GENERATION, RAY_PROGRAMS
from .verl.rules import Config

EVALUATION = RAY_PROGRAMS[1]  # verl.trainer.main_eval
ACTOR, ROLLOUT, REF, CRITIC = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic"


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h"


def gpu_hours(ir: JobIR) -> float | None:
    """The run's GPU-hours bound by its time limit (no retry; every sweep variant), or None without one."""
    if ir.time_limit is None:
        return None
    return ir.time_limit.seconds / 3600 * ir.nodes * ir.gpus_per_node * max(1, len(ir.variants))


def plan(ir: JobIR) -> str:
    price = (YAML(typ="safe").load(ir.normalized_spec).get("cluster") or {}).get("gpu_hour_price")
    cfg = Config(YAML(typ="safe").load(ir.verl_config) or {}, {})
    g = cfg.get
    device = ir.device
    total = ir.nodes * ir.gpus_per_node
    kind = f" ({ir.gpu_type})" if ir.gpu_type else ""
    own = (f" ({ir.nodes - ir.service_nodes} for the trainer, {ir.service_nodes} for services)"
           if ir.service_nodes else "")
    out = [f"{ir.name}: {ir.nodes} node(s){own} x {ir.gpus_per_node} {device}s{kind} = {total} {device}s; "
           f"verl {ir.verl_version}, {ir.trainer_module} ({ir.config_name})"]

    if ir.trainer_module in (EVALUATION, *GENERATION):  # no actor updates, no critic, no training batch
        lines = _evaluation(ir, g) if ir.trainer_module == EVALUATION else _generation(ir, g, "actor_rollout_ref"
                                                                                         in cfg.tree)
        return "\n".join([*out, *lines, *_cost(ir, price, total, 1, device)]) + "\n"
    if "actor_rollout_ref" not in cfg.tree:  # not PPO's roles: verl's SFT trainer, one process per GPU
        return "\n".join([*out, *_sft(ir, g), *_cost(ir, price, total, 1, device)]) + "\n"
    trainer_gpus = (_count(g("trainer.nnodes")) or ir.nodes - ir.service_nodes) * \
        (_count(g("trainer.n_gpus_per_node")) or ir.gpus_per_node)
    pool = (_count(g("rollout.nnodes")), _count(g("rollout.n_gpus_per_node")))
    critic = critic_in_use(cfg.tree, cfg.tree)
    trained = ["actor", *(["reference"] if g(f"{ACTOR}.use_kl_loss") or g("algorithm.use_kl_in_reward") else []),
               *(["critic"] if critic else []), *(["reward model"] if g("reward_model.enable") else [])]
    if pool[1]:
        rollout_gpus = (pool[0] or 1) * pool[1]
        out.append(f"  {device}s:     rollout on {rollout_gpus} of its own ({pool[0] or 1} x rollout.n_gpus_per_node "
                   f"{pool[1]}); {', '.join(trained)} on the trainer's {trainer_gpus}")
    else:
        rollout_gpus = trainer_gpus
        out.append(f"  {device}s:     {', '.join(['rollout', *trained])} share all {trainer_gpus} (verl's hybrid "
                   f"engine: each role in turn)")

    tp, dp, pp = (_count(g(f"{ROLLOUT}.{k}")) or 1 for k in ("tensor_model_parallel_size", "data_parallel_size",
                                                             "pipeline_model_parallel_size"))
    per_replica = tp * dp * pp
    replicas = f"{rollout_gpus // per_replica} replica(s)" if rollout_gpus % per_replica == 0 else \
        f"{rollout_gpus} {device}s do not divide into replicas"
    out.append(f"  rollout:  {g(f'{ROLLOUT}.name')} ({g(f'{ROLLOUT}.mode') or 'sync'}), {replicas} of TP {tp} x DP "
               f"{dp} x PP {pp} = {per_replica} {device}s each")

    train, n = _count(g("data.train_batch_size")) or None, _count(g(f"{ROLLOUT}.n")) or 1
    if train is not None:
        out.append(f"  step:     data.train_batch_size {train} prompts x rollout.n {n} = {train * n} responses")
    else:
        out.append(f"  step:     data.train_batch_size is {g('data.train_batch_size')}: {ir.trainer_module} forms "
                   f"its own batches")
    out += _role("actor", ACTOR, g, train, n, trainer_gpus)
    if critic:
        out += _role("critic", CRITIC, g, train, n, trainer_gpus)
    for role, section in (("rollout", ROLLOUT), ("ref", REF)):
        micro = _count(g(f"{section}.log_prob_micro_batch_size_per_gpu"))
        if micro is not None and (role == "rollout" or "reference" in trained):
            out.append(f"  {role + ':':9} log-probs in micro batches of {micro} per {device}")

    out += _services(ir, g, device)
    out += _memory(ir.memory, device)
    variants = len(ir.variants) or 1
    if ir.variants:
        out.append(f"  sweep:    {variants} variants (one Slurm array task each):")
        out += [f"    {v.index}: " + ", ".join(f"{k}={val}" for k, val in v.settings) for v in ir.variants]
    out += _cost(ir, price, total, variants, device)
    return "\n".join(out) + "\n"


def _generation(ir: JobIR, g: Any, ppo_config: bool) -> list[str]:
    """verl's generation: the rollout alone on the trainer's GPUs, answering every prompt of its data n times
    (main_generation's own config; main_generation_server composes ppo_trainer and trains nothing)."""
    rollout = ROLLOUT if ppo_config else "rollout"
    gpus = (_count(g("trainer.nnodes")) or ir.nodes) * (_count(g("trainer.n_gpus_per_node")) or ir.gpus_per_node)
    tp = _count(g(f"{rollout}.tensor_model_parallel_size")) or 1
    replicas = f"{gpus // tp} replica(s)" if gpus % tp == 0 else f"{gpus} {ir.device}s do not divide into replicas"
    out = [f"  {ir.device}s:     the rollout alone on {gpus} (nothing is trained)",
           f"  rollout:  {g(f'{rollout}.name')}, {replicas} of TP {tp}"]
    batch, n = (g("data.batch_size"), g("data.n_samples")) if not ppo_config else \
        (g("data.gen_batch_size") or g("data.train_batch_size"), g(f"{ROLLOUT}.n"))
    if _count(batch) and _count(n):
        out.append(f"  prompts:  {batch} at a time x {n} response(s) each, into data.output_path "
                   f"({g('data.output_path')})")
    return out


def _evaluation(ir: JobIR, g: Any) -> list[str]:
    """verl's evaluation: the reward function over the responses data.path holds, as Ray tasks on CPUs."""
    return [f"  {ir.device}s:     none used: it scores the responses in data.path ({g('data.path')}) with the "
            f"reward function, as Ray tasks on CPUs; the allocation's {ir.nodes * ir.gpus_per_node} {ir.device}s "
            f"wait idle while it runs"]


def _sft(ir: JobIR, g: Any) -> list[str]:
    """A program without PPO's roles (verl's SFT trainer): its launch, and its batch over the GPUs."""
    gpus = ir.nodes * ir.gpus_per_node
    out = [f"  {ir.device}s:     {' '.join(ir.launch[:-1])}: one process per {ir.device} of {gpus}"]
    train, micro = _count(g("data.train_batch_size")), _count(g("data.micro_batch_size_per_gpu"))
    if train is None:
        return out + [f"  step:     data.train_batch_size is {g('data.train_batch_size')}: not a whole number here"]
    line = f"  step:     data.train_batch_size {train} samples"
    if g("data.use_dynamic_bsz"):
        return out + [line + f"; micro batches by tokens (use_dynamic_bsz: at most "
                             f"{g('data.max_token_len_per_gpu')} tokens per {ir.device})"]
    if micro and train % gpus == 0:
        per = train // gpus
        line += f", {per} per {ir.device}" + (f", micro batch {micro}: {per / micro:g} gradient-accumulation step(s)"
                                              if per % micro == 0 else f", micro batch {micro} (does not divide it)")
    return out + [line]


def _role(name: str, section: str, g: Any, train: int | None, n: int, gpus: int) -> list[str]:
    """A trained role's arithmetic: responses per update, per GPU, and gradient accumulation."""
    mini, epochs = _count(g(f"{section}.ppo_mini_batch_size")), _count(g(f"{section}.ppo_epochs")) or 1
    sp = _count(g(f"{section}.ulysses_sequence_parallel_size")) or 1
    label = f"  {name + ':':9} "
    if g(f"{section}.strategy") == "megatron":
        tp, pp, cp = (_count(g(f"{section}.megatron.{k}_parallel_size")) or 1
                      for k in ("tensor_model", "pipeline_model", "context"))
        data_parallel = gpus // (tp * pp * cp) if gpus % (tp * pp * cp) == 0 else None
        shown = f"Megatron TP {tp} x PP {pp} x CP {cp}, data parallel {data_parallel or 'not whole'}; "
        ranks = data_parallel
    else:
        shown, ranks = (f"FSDP over {gpus} GPUs" + (f", Ulysses sequence parallel {sp}" if sp > 1 else "") + "; "), \
            (gpus // sp if gpus % sp == 0 else None)
    if mini is None:
        return [label + shown + "mini batch not a whole number here (an interpolation verlc cannot resolve)"]
    updates = (f"{math.ceil(train / mini)} update(s) per step" if train else "updates as the program forms them") \
        + (f" x ppo_epochs {epochs}" if epochs > 1 else "")
    line = label + shown + f"mini batch {mini} prompts x n {n} = {mini * n} responses, {updates}"
    if g(f"{section}.use_dynamic_bsz"):
        tokens = g(f"{section}.ppo_max_token_len_per_gpu")
        return [line, f"{'':12}micro batches by tokens (use_dynamic_bsz: at most {tokens} tokens per GPU)"]
    micro = _count(g(f"{section}.ppo_micro_batch_size_per_gpu"))
    if ranks is None or micro is None or not micro:
        return [line]
    per_rank = mini * n / ranks
    shown_rank = f"{per_rank:g}" if per_rank != int(per_rank) else str(int(per_rank))
    accumulation = f"{per_rank / micro:g}" if per_rank % micro else str(int(per_rank // micro))
    return [line, f"{'':12}{shown_rank} per data-parallel rank, micro batch {micro} per GPU: {accumulation} "
                  f"gradient-accumulation step(s)"]


def _services(ir: JobIR, g: Any, device: str) -> list[str]:
    """Where each service runs and what it takes of the trainer's nodes: the head's (or every node's) CPUs, and
    where it says so a share of each GPU's memory beside the rollout's."""
    lines = []
    for s in ir.services:
        probe = f", {s.probe.kind} probe" if s.probe else ""
        if s.own_node:
            where = f"a node of its own, holding {s.gpus} of its {ir.gpus_per_node} {device}s"
        else:
            where = f"{'every node' if s.every_node else 'the head node'}, in the trainer's nodes"
        memory = (f"; {s.gpu_memory:g} of each {device}'s memory beside the rollout's "
                  f"{g(f'{ROLLOUT}.gpu_memory_utilization')}" if s.gpu_memory else "")
        lines.append(f"  {'service:' if not lines else '':9} {s.name} on {where} (ready within {s.deadline} s"
                     f"{probe}){memory}")
    return lines


def _memory(found: Estimate | None, device: str) -> list[str]:
    """Each phase's memory on one trainer GPU (compiler/memory.py), the peak's terms, or why verlc cannot know."""
    if found is None:
        return []
    if found.unknown:
        return [f"  memory:   not estimated: {found.unknown}"]
    assert found.shape is not None and found.peak is not None and found.gpu is not None
    peak = found.peak
    out = [f"  memory:   per trainer {device}, of its {gib(found.gpu)} GiB ({found.gpu_origin}); "
           f"{found.shape.architecture}, {found.shape.parameters / 1e9:.2f}B parameters ({found.shape_origin})"]
    out += [f"{'':12}{p.name:22} {gib(p.bytes):>6} GiB" + (" at most" if p.bound else "") +
            ("  <- the peak" if p is peak else "") for p in found.phases]
    out.append(f"{'':12}the peak, {peak.name}:")
    out += [f"{'':12}  {t.what}: {gib(t.bytes)}" for t in peak.terms]
    verdict = ("more than the GPU has" + (" where every sequence runs to the maximum length" if peak.bound else "")
               if peak.bytes > found.gpu else
               f"within {100 - NEAR * 100:g}% of it" if peak.bytes > NEAR * found.gpu else "fits")
    out.append(f"{'':12}peak {gib(peak.bytes)} of {gib(found.gpu)} GiB ({peak.bytes / found.gpu:.0%}): {verdict}")
    return out


def _cost(ir: JobIR, price: float | None, gpus: int, variants: int, device: str) -> list[str]:
    limit = ir.time_limit
    if limit is None:
        return [f"  time:     no time limit: {device}-hours unknown; verlc cannot know how long verl trains"]
    hours = limit.seconds / 3600 * gpus
    lines = [f"  time:     at most {_hours(limit.seconds)} per run ({limit.origin}) x {gpus} {device}s = "
             f"{hours:g} {device}-hours" + (f"; the sweep {hours * variants:g}" if variants > 1 else "")]
    if limit.retries:
        lines.append(f"{'':12}up to {hours * variants * (limit.retries + 1):g} where all {limit.retries} retries "
                     f"({limit.retries_origin}) run to the limit too")
    if price is not None:
        lines.append(f"{'':12}cost at {price:g} per {device}-hour: at most {price * hours * variants:,.2f}"
                     + (f" ({price * hours:,.2f} per run)" if variants > 1 else ""))
    return lines

