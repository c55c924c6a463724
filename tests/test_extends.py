"""extends: a spec on top of base specs (e.g. a cluster profile + an experiment)."""

from __future__ import annotations

from pathlib import Path

from conftest import run_verlc

CLUSTER = """\
cluster: {nodes: 2, gpus_per_node: 8, slurm: {cpus_per_task: 16, partition: gpu, modules: [cuda/12.4]}}
container: {runtime: docker, image: verlai/verl:vllm024.latest, workdir: /workspace/verl}
env: {NCCL_DEBUG: WARN, TOKENIZERS_PARALLELISM: "false"}
"""
EXPERIMENT = """\
extends: profiles/cluster.yaml
name: exp
project: p
model: Qwen/Qwen2.5-0.5B-Instruct
data: {train_files: [d/train.parquet], val_files: [d/test.parquet]}
verl:
  actor_rollout_ref:
    actor: {ppo_micro_batch_size_per_gpu: 4}
    rollout: {name: vllm, log_prob_micro_batch_size_per_gpu: 4}
  critic: {ppo_micro_batch_size_per_gpu: 4}
cluster: {slurm: {modules: [cuda/12.6]}}
env: {NCCL_DEBUG: INFO}
"""


def layout(tmp: Path, experiment: str = EXPERIMENT, cluster: str = CLUSTER) -> Path:
    (tmp / "profiles").mkdir()
    (tmp / "profiles" / "cluster.yaml").write_text(cluster)
    (tmp / "exp.yaml").write_text(experiment)
    return tmp / "exp.yaml"


def test_mappings_merge_and_lists_are_replaced(tmp_path: Path) -> None:
    layout(tmp_path)
    result = run_verlc("build", "exp.yaml", "--target", "slurm", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    script = (tmp_path / "out" / "exp" / "slurm" / "sbatch.sh").read_text()
    assert "#SBATCH --partition=gpu\n" in script and "#SBATCH --cpus-per-task=16\n" in script  # from the base
    assert "module load cuda/12.6\n" in script and "cuda/12.4" not in script  # the list is replaced
    assert "export NCCL_DEBUG=INFO" in script and "export TOKENIZERS_PARALLELISM=false" in script  # merged


def test_errors_point_at_the_file_a_value_came_from(tmp_path: Path) -> None:
    base = tmp_path / "a"
    base.mkdir()
    layout(base, cluster=CLUSTER.replace("nodes: 2", "nodes: 0"))
    result = run_verlc("validate", "exp.yaml", cwd=base)
    assert result.returncode == 2
    assert "profiles/cluster.yaml:1:18: cluster.nodes: should be greater than or equal to 1" in result.stderr
    child = tmp_path / "b"
    child.mkdir()
    layout(child, experiment=EXPERIMENT.replace("env: {NCCL_DEBUG: INFO}", "env: {NCCL_DEBUG: INFO, WANDB_API_KEY: x}"))
    result = run_verlc("validate", "exp.yaml", cwd=child)
    assert result.returncode == 2
    assert result.stderr.startswith("exp.yaml:12:25: env.WANDB_API_KEY: WANDB_API_KEY looks like a secret")


def test_cycles_are_reported_at_the_extends_line(tmp_path: Path) -> None:
    layout(tmp_path, cluster="extends: ../exp.yaml\n" + CLUSTER)
    result = run_verlc("validate", "exp.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "profiles/cluster.yaml:1:10: extends: extends cycle: exp.yaml -> cluster.yaml -> exp.yaml" in result.stderr


def test_a_missing_base_is_reported_at_the_extends_line(tmp_path: Path) -> None:
    layout(tmp_path, experiment=EXPERIMENT.replace("profiles/cluster.yaml", "profiles/nope.yaml"))
    result = run_verlc("validate", "exp.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert "exp.yaml:1:10: extends: extends profiles/nope.yaml: no such spec file" in result.stderr
