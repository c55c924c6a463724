"""`verlc plan SPEC` (compiler/plan.py): the allocation verl will run with, before anything is queued (#40 item 19)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import run_verlc

NODES, PER_NODE, TRAIN, N, MINI, MICRO, TP = 2, 8, 64, 4, 16, 2, 2
SPEC = f"""\
name: plan-grpo
targets: [slurm]
project: p
verl_version: "0.9.1"
model: /models/qwen
data: {{train_files: [/d/train.parquet], val_files: [/d/test.parquet]}}
verl:
  algorithm: {{adv_estimator: grpo}}
  data: {{train_batch_size: {TRAIN}}}
  actor_rollout_ref:
    actor: {{ppo_mini_batch_size: {MINI}, ppo_micro_batch_size_per_gpu: {MICRO}, use_kl_loss: true}}
    rollout: {{name: vllm, n: {N}, tensor_model_parallel_size: {TP}, log_prob_micro_batch_size_per_gpu: 8}}
    ref: {{log_prob_micro_batch_size_per_gpu: 8}}
  trainer: {{logger: [console], save_freq: 10}}
cluster: {{nodes: {NODES}, gpus_per_node: {PER_NODE}, slurm: {{cpus_per_task: 8, time: "10:00:00"}}}}
container: {{runtime: none}}
sweep: {{matrix: {{verl.actor_rollout_ref.actor.optim.lr: [1.0e-6, 2.0e-6]}}}}
"""


def test_the_plan_is_the_arithmetic_of_the_config_verl_runs_with(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "spec.yaml").write_text(SPEC)
    profiles = {"profiles": {"lab": {"cluster": {"gpu_hour_price": 2.5}}}}
    (tmp_path / "verlc-profiles.yaml").write_text(json.dumps(profiles))
    result = run_verlc("plan", "spec.yaml", "--profile", "lab", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text, gpus = result.stdout, NODES * PER_NODE
    assert f"{NODES} node(s) x {PER_NODE} GPUs = {gpus} GPUs; verl 0.9.1" in text
    assert f"rollout, actor, reference share all {gpus}" in text  # use_kl_loss: the reference policy runs
    assert f"{gpus // TP} replica(s) of TP {TP} x DP 1 x PP 1 = {TP} GPUs each" in text
    assert f"data.train_batch_size {TRAIN} prompts x rollout.n {N} = {TRAIN * N} responses" in text
    assert f"mini batch {MINI} prompts x n {N} = {MINI * N} responses, {TRAIN // MINI} update(s) per step" in text
    # what verl's FSDP workers make of it at start-up: the mini batch x n over the data-parallel ranks
    per_rank = MINI * N // gpus
    assert f"{per_rank} per data-parallel rank, micro batch {MICRO} per GPU: {per_rank // MICRO} " in text
    assert "  0: verl.actor_rollout_ref.actor.optim.lr=1e-06\n    1: verl.actor_rollout_ref.actor.optim.lr=2e-06\n" in text
    hours = 10 * gpus
    assert f"at most 10 h per run (cluster.slurm.time 10:00:00) x {gpus} GPUs = {hours} GPU-hours; the sweep " \
           f"{hours * 2}" in text
    assert f"cost at 2.5 per GPU-hour: at most {2.5 * hours * 2:,.2f} ({2.5 * hours:,.2f} per run)" in text
    # requeued (the default requeue_grace) up to max_requeues (3) times more, each attempt to the limit
    assert f"up to {hours * 2 * 4:g} where all 3 retries (cluster.slurm.max_requeues) run to the limit too" in text
    # a spec with a problem gets the problem, not a plan
    (tmp_path / "bad.yaml").write_text(SPEC.replace(f"n: {N},", "n: four,"))
    bad = run_verlc("plan", "bad.yaml", cwd=tmp_path)
    assert bad.returncode == 2 and "bad.yaml:12:30: verl.actor_rollout_ref.rollout.n: " in bad.stderr and not bad.stdout, bad.stderr


def test_the_plan_of_verls_sft_trainer_is_its_launch_and_its_batch_per_gpu(tmp_path: Path) -> None:
    """No PPO roles for verl's SFT trainer: torchrun's processes, and its global batch over the GPUs (verl's
    fsdp_sft_trainer divides data.train_batch_size by the data-parallel size)."""
    spec = tmp_path / "sft.yaml"
    spec.write_text(json.dumps({
        "name": "sft", "project": "p", "verl_version": "0.4.1", "program": "verl.trainer.fsdp_sft_trainer",
        "model": "m", "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
        "verl": {"data": {"train_batch_size": 96, "micro_batch_size_per_gpu": 4}, "trainer": {"logger": ["console"]}},
        "cluster": {"nodes": 1, "gpus_per_node": 8}}))
    result = run_verlc("plan", spec)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1] == "  GPUs:     torchrun --standalone --nnodes=1 --nproc_per_node=8: one process per GPU of 8"
    assert lines[2] == "  step:     data.train_batch_size 96 samples, 12 per GPU, micro batch 4: 3 gradient-accumulation " \
                       "step(s)"
    assert not any(word in result.stdout for word in ("rollout", "actor", "critic"))


@pytest.mark.parametrize(("slurm", "seconds", "retries"), [
    ('time: "1-02:03:04", max_requeues: 1', ((24 + 2) * 60 + 3) * 60 + 4, 1),
    ('time: "2-05"', (2 * 24 + 5) * 3600, 3),
    ('time: "90"', 90 * 60, 3),  # minutes
    ('time: "90:30", requeue_grace: null', 90 * 60 + 30, 0),  # minutes:seconds; never requeued
    ("", None, None),
])
def test_the_time_limit_is_the_targets_own_reading_of_its_section(slurm: str, seconds: int | None,
                                                                  retries: int | None, tmp_path: Path) -> None:
    """compiler/plan.py reads the run's TimeLimit from the IR, which the slurm target's section gives it."""
    from verlc.compiler.load import load
    from verlc.compiler.validate import validate
    from verlc.targets import CATALOG

    (tmp_path / "spec.yaml").write_text(SPEC.replace(', time: "10:00:00"', slurm and f", {slurm}"))
    limit = CATALOG.time_limit(validate(load(tmp_path / "spec.yaml"), CATALOG.spec))
    assert (limit.seconds, limit.retries) == (seconds, retries) if limit else seconds is None
