"""The generated sbatch script on a real two-node Slurm (dev/slurm.sh), stopped before training.

Each test builds a small 2 x 8 GPU spec (runtime none, this venv's ray) over tiny local fixtures
(a parquet file with verl's columns, a model folder with a config.json) and asserts on what the
job itself printed and what Slurm recorded.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import IN_CI, REPO, run_verlc


def _slurm_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    return states.returncode == 0 and "n1 idle" in states.stdout and "n2 idle" in states.stdout


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    """A running two-node cluster: reuse one that is up, else start it with dev/slurm.sh."""
    started = False
    if not _slurm_up():
        result = subprocess.run(["bash", str(REPO / "dev" / "slurm.sh"), "start"], capture_output=True,
                                text=True, timeout=600)
        if result.returncode != 0:
            message = f"cannot start the local Slurm cluster:\n{result.stderr}"
            if IN_CI:
                pytest.fail(message)
            pytest.skip(message)
        started = True
    yield
    if started:
        subprocess.run(["bash", str(REPO / "dev" / "slurm.sh"), "stop"], timeout=120)


def write_fixtures(root: Path) -> None:
    """A model folder and train/test parquet files shaped like verl's GSM8K preprocessing output."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "model").mkdir()
    (root / "model" / "config.json").write_text('{"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}')
    (root / "data").mkdir()
    table = pa.table({
        "data_source": ["openai/gsm8k"],
        "prompt": [[{"role": "user", "content": "What is 1+1? Let's think step by step."}]],
        "ability": ["math"],
        "reward_model": [{"style": "rule", "ground_truth": "2"}],
        "extra_info": [{"index": 0, "split": "train"}],
    })
    pq.write_table(table, root / "data" / "train.parquet")
    pq.write_table(table, root / "data" / "test.parquet")


def build(root: Path, *, val_file: str = "data/test.parquet", wait: str = "120s") -> Path:
    spec = root / "spec.yaml"
    spec.write_text(f"""\
name: e2e-{root.name[-12:].strip('_-') or 'run'}
project: e2e
model: {root}/model
data: {{train_files: [data/train.parquet], val_files: [{val_file}]}}
verl: {{actor_rollout_ref: {{rollout: {{name: vllm}}}}}}
cluster: {{nodes: 2, gpus_per_node: 8, slurm: {{cpus_per_task: 1, output: {root}/slurm-%j.out}}}}
container: {{runtime: none, workdir: {root}, venv: {Path(sys.prefix)}}}
network: {{head_interface: lo}}
ray: {{wait_for_nodes: {wait}}}
""")
    result = run_verlc("build", spec, "--target", "slurm", "--out", root / "out")
    assert result.returncode == 0, result.stderr
    return next((root / "out").glob("*/slurm/sbatch.sh"))


def sbatch(script: Path, root: Path, stop_after: str = "preflight") -> tuple[str, str, str]:
    """Submit, wait, and return (job id, the job's output, Slurm's JobState)."""
    result = subprocess.run(["sbatch", "--wait", "--parsable", str(script)], cwd=root, capture_output=True,
                            text=True, timeout=600,
                            env={"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "HOME": str(root),
                                 "VERLC_STOP_AFTER": stop_after})
    job = result.stdout.strip().split(";")[0]
    assert job.isdigit(), result.stderr
    output = (root / f"slurm-{job}.out").read_text()
    state = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    match = re.search(r"JobState=(\w+)", state)
    return job, output, match[1] if match else "UNKNOWN"


def ray_processes() -> list[str]:
    ps = subprocess.run(["pgrep", "-af", "raylet|gcs_server"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if "pgrep" not in line]


def no_ray_left(deadline: float = 30) -> list[str]:
    end = time.monotonic() + deadline
    while ray_processes() and time.monotonic() < end:
        time.sleep(1)
    return ray_processes()


def test_two_node_bring_up_and_preflight(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    job, output, state = sbatch(build(tmp_path), tmp_path)
    assert state == "COMPLETED", output
    registered = re.findall(r"node registered: .* GPUs=8 \((\d)/2\)", output)
    assert registered == ["1", "2"], output
    assert "cluster ready: 2 nodes, 16 GPUs" in output
    assert "preflight passed: 2 nodes, 16 GPUs, 2 data files" in output
    assert "stage train: skipped (VERLC_STOP_AFTER=preflight)" in output
    assert no_ray_left() == []


def test_missing_data_file_fails_preflight(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    job, output, state = sbatch(build(tmp_path, val_file="data/missing.parquet"), tmp_path)
    assert state == "FAILED", output
    assert "PREFLIGHT FAILED: data file data/missing.parquet does not exist" in output
    assert no_ray_left() == []
