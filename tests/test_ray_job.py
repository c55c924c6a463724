"""The ray-job bundle against a REAL local Ray head (ray[default], loopback, 8 logical GPUs, own temp
dir): submit.sh runs, the job's preflight passes or names the missing file, the run record is real."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import IN_CI, run_verlc
from test_slurm_e2e import write_fixtures

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NODE_VARIABLE = "VERLC_TEST_NODE_SCRATCH"
NODE_ENV: dict[str, str] = {}  # the head node's own environment, set by the ray_head fixture


def ray_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0", **(extra or {})}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray head on 127.0.0.1 with 8 logical GPUs; yields its dashboard address."""
    if not (BIN / "ray").exists():
        message = "ray is not installed in the test venv (the README's test command installs it)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    temp = Path("/tmp") / f"verlc-test-ray-{os.getpid()}"  # short: Ray's socket paths have a length limit
    port, dashboard = free_port(), free_port()
    # The node's own environment, as a cluster's $SCRATCH would be: what ${env:NAME} reads there.
    node_env = {NODE_VARIABLE: str(tmp_path_factory.mktemp("node-scratch"))}
    subprocess.run([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--num-gpus=8",
                    "--num-cpus=2", f"--temp-dir={temp}", "--disable-usage-stats"],
                   check=True, capture_output=True, env=ray_env(node_env), timeout=120)
    NODE_ENV.update(node_env)
    try:
        deadline = time.monotonic() + 60  # `ray start` returns before resources are reported
        while time.monotonic() < deadline:
            status = subprocess.run([str(BIN / "ray"), "status", f"--address=127.0.0.1:{port}"],
                                    capture_output=True, text=True, env=ray_env())
            if re.search(r"0(\.0)?/8(\.0)? GPU", status.stdout):
                break
            time.sleep(1)
        else:
            pytest.fail(f"Ray head never reported 8 GPUs:\n{status.stdout}{status.stderr}")
        yield f"http://127.0.0.1:{dashboard}"
    finally:
        subprocess.run([str(BIN / "ray"), "stop", "--force"], capture_output=True, env=ray_env(), timeout=120)


def build(root: Path, val_file: str = "data/test.parquet", checkpoints: str | None = None, **extra: object) -> Path:
    trainer = {"trainer": {"default_local_dir": checkpoints}} if checkpoints else {}
    spec = root / "spec.yaml"
    spec.write_text(json.dumps({**extra,
        "name": "rayjob-e2e", "project": "e2e", "model": str(root / "model"),
        "data": {"train_files": ["data/train.parquet"], "val_files": [val_file]},
        "verl": {"actor_rollout_ref": {"rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4},
                                       "actor": {"ppo_micro_batch_size_per_gpu": 4}},
                 "critic": {"ppo_micro_batch_size_per_gpu": 4}, **trainer},
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "ray": {"working_dir": str(root), "wait_for_nodes": "60s"},
    }))
    result = run_verlc("build", spec, "--target", "ray-job", "--out", root / "out")
    assert result.returncode == 0, result.stderr
    return root / "out" / "rayjob-e2e" / "ray-job" / "submit.sh"


def submit_and_wait(script: Path, address: str) -> tuple[str, str]:
    """Run submit.sh (stop before training), wait for the job; return (final status, logs)."""
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300,
                            env=ray_env({"RAY_ADDRESS": address, "VERLC_STOP_AFTER": "preflight"}),
                            cwd=script.parent)
    assert result.returncode == 0, result.stderr
    job = re.search(r"^submitted (\S+) to ", result.stdout, re.M)
    assert job, result.stdout
    assert f"ray job logs --address {address} --follow {job[1]}" in result.stdout
    deadline = time.monotonic() + 240
    status = ""
    while time.monotonic() < deadline:
        status = subprocess.run([str(BIN / "ray"), "job", "status", "--address", address, job[1]],
                                capture_output=True, text=True, env=ray_env()).stdout
        if re.search(r"Job '\S+' (succeeded|failed|stopped)", status):
            break
        time.sleep(2)
    logs = subprocess.run([str(BIN / "ray"), "job", "logs", "--address", address, job[1]],
                          capture_output=True, text=True, env=ray_env()).stdout
    final = re.search(r"Job '\S+' (succeeded|failed|stopped)", status)
    return (final[1].upper() if final else f"not finished: {status}"), logs


def test_job_runs_preflight_on_a_real_ray_cluster(ray_head: str, tmp_path: Path) -> None:
    import ray

    write_fixtures(tmp_path)
    status, logs = submit_and_wait(build(tmp_path), ray_head)
    assert status == "SUCCEEDED", logs
    assert "cluster ready: 1 nodes, 8 GPUs" in logs
    assert "preflight passed: 1 nodes, 8 GPUs, 2 data files" in logs
    assert "stopping after stage preflight" in logs
    record = json.loads(re.search(r"run record: (\{.*\})", logs)[1])
    assert record["gpus"] == 8
    assert record["versions"]["ray"] == ray.__version__
    assert record["pins"] == {"verl": "0.9.1"} and record["versions"]["verl"] == "0.9.1"


def test_env_vars_of_the_node_expand_there_and_are_required(ray_head: str, tmp_path: Path) -> None:
    """${env:NAME} in the checkpoint folder: the preflight creates it under the node's value (not a folder
    named '${...}'), verl gets ${oc.env:NAME}; a variable the node lacks fails the preflight, named."""
    write_fixtures(tmp_path)
    status, logs = submit_and_wait(build(tmp_path, checkpoints=f"${{env:{NODE_VARIABLE}}}/ckpt"), ray_head)
    assert status == "SUCCEEDED", logs
    scratch = Path(NODE_ENV[NODE_VARIABLE])
    assert (scratch / "ckpt").is_dir()
    assert not list(tmp_path.rglob("*${*")), "a folder named after the unexpanded variable"
    job = json.loads((tmp_path / "out" / "rayjob-e2e" / "ray-job" / "verlc_job" / "job.json").read_text())
    assert f"trainer.default_local_dir='${{oc.env:{NODE_VARIABLE}}}/ckpt'" in job["train"]

    missing = tmp_path / "missing"
    missing.mkdir()
    write_fixtures(missing)
    status, logs = submit_and_wait(build(missing, checkpoints="${env:VERLC_TEST_NOT_ON_THE_NODE}/ckpt"), ray_head)
    assert status == "FAILED", logs
    assert "environment variable VERLC_TEST_NOT_ON_THE_NODE is not set (the spec reads " \
           "${env:VERLC_TEST_NOT_ON_THE_NODE})" in logs


def test_missing_data_file_fails_the_job(ray_head: str, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    status, logs = submit_and_wait(build(tmp_path, val_file="data/nope.parquet"), ray_head)
    assert status == "FAILED", logs
    assert "PREFLIGHT FAILED: data file data/nope.parquet does not exist" in logs


def test_reproducible_reruns_must_match_the_first_run(ray_head: str, tmp_path: Path) -> None:
    """The first run writes its record next to its checkpoints; a re-run that sees other versions fails."""
    write_fixtures(tmp_path)
    script = build(tmp_path, reproducible=True, verl_version="0.9.1",
                   container={"runtime": "docker", "image": "verl@sha256:" + "0" * 64, "workdir": "/w"},
                   checkpoints=str(tmp_path / "ckpt"))
    status, logs = submit_and_wait(script, ray_head)
    assert status == "SUCCEEDED", logs
    # Ray runs the job in a copy of working_dir: a shared, absolute checkpoint folder outlives it.
    reference = tmp_path / "ckpt" / "verlc-first-run.json"
    assert "first run of a reproducible job" in logs and reference.exists()
    status, logs = submit_and_wait(script, ray_head)
    assert status == "SUCCEEDED", logs
    first = json.loads(reference.read_text())
    first["versions"]["verl"] = "0.9.0"
    reference.write_text(json.dumps(first))
    status, logs = submit_and_wait(script, ray_head)
    assert status == "FAILED", logs
    assert "PREFLIGHT FAILED: verl 0.9.1, but the first run" in logs and "had 0.9.0" in logs
