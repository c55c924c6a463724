"""The ray-job bundle against a REAL local Ray head (ray[default], loopback, 8 logical GPUs, own temp
dir): submit.sh runs, the job's preflight passes or names the missing file, the run record is real."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import IN_CI, carries, failing_first, processes, rollout_engine_site, run_verlc, stop_processes
from verlc.runtime.protocol import record_from_log
from test_slurm_e2e import write_fixtures

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NODE_VARIABLE = "VERLC_TEST_NODE_SCRATCH"
NODE_ENV: dict[str, str] = {}  # the head node's own environment, set by the ray_head fixture
GCS: dict[str, str] = {}  # "address": the head's GCS address, set by the ray_head fixture


RAY_MARK = "VERLC_TEST_RAY"  # in the environment of a Ray node's every process: its temp dir (stop_by_pid)


def ray_env(extra: dict[str, str] | None = None, temp: Path | None = None) -> dict[str, str]:
    """The environment of Ray's commands here; `temp`: that of `ray start --temp-dir=TEMP`, whose every process
    then carries it (stop_by_pid) and keeps its temp files there (as the Slurm bundle's Ray: targets/slurm/view.py).
    The node has the rollout engine. Its raylet waits up to 300 s (Ray's default: 60 s) for a fresh worker
    process to register: on this 2-core machine beside the Slurm cluster's jobs, a worker's start (Python,
    Ray's imports) can take longer than 60 s, and Ray then kills it and starts another, again and again."""
    return {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_worker_register_timeout_seconds": "300", "PYTHONPATH": str(rollout_engine_site()), **(extra or {}),
            **({RAY_MARK: str(temp), "TMPDIR": str(temp)} if temp else {})}


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray head on 127.0.0.1 with 8 logical GPUs; yields its dashboard address."""
    if not (BIN / "ray").exists():
        message = "ray is not installed in the test venv (the README's test command installs it)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    temp = Path("/tmp") / f"verlc-test-ray-{os.getpid()}"  # short: Ray's socket paths have a length limit
    port, dashboard = free_port(), free_port()
    # The node's own environment, as a cluster's $SCRATCH would be: what ${env:NAME} reads there. Ray hides the
    # GPUs from a task that holds none (CUDA_VISIBLE_DEVICES=""), as the Ray of verl's images does (2.4x); later
    # releases leave the variable alone unless this is set.
    node_env = {NODE_VARIABLE: str(tmp_path_factory.mktemp("node-scratch")),
                "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "1"}
    subprocess.run([str(BIN / "ray"), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}",
                    "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--num-gpus=8",
                    "--num-cpus=2", f"--temp-dir={temp}", "--disable-usage-stats"],
                   check=True, capture_output=True, env=ray_env(node_env, temp), timeout=120)
    NODE_ENV.update(node_env)
    GCS["address"] = f"127.0.0.1:{port}"
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
        stop_by_pid(temp)


def stop_by_pid(temp: Path) -> None:
    """Stop the Ray node started with `ray_env(temp=TEMP)` and `--temp-dir=TEMP`, not every Ray on the machine as
    `ray stop` would: the processes that carry TEMP in their environment or command line, and their descendants
    (Ray's client server names no temp dir and is init's child from its start: it outlived the suite so); TERM,
    then KILL after 3 s; then the temp dir (its sessions' logs and sockets) goes."""
    def ours() -> set[int]:
        now = processes()
        found = {pid for pid, p in now.items() if str(temp).encode() in p.cmdline or carries(pid, RAY_MARK, str(temp))}
        grew = True
        while grew:
            more = {pid for pid, p in now.items() if p.parent in found} - found
            found |= more
            grew = bool(more)
        return found

    stop_processes(ours, 3)  # Ray's GCS and raylet outlast 10 s of TERM here
    shutil.rmtree(temp, ignore_errors=True)


def build(root: Path, val_file: str = "data/test.parquet", checkpoints: str | None = None,
          tool_config_path: str | None = None, **extra: object) -> Path:
    trainer = {"trainer": {"default_local_dir": checkpoints}} if checkpoints else {}
    multi_turn = {"multi_turn": {"tool_config_path": tool_config_path}} if tool_config_path else {}
    spec = root / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "rayjob-e2e", "project": "e2e", "model": str(root / "model"),
        "data": {"train_files": ["data/train.parquet"], "val_files": [val_file]},
        "verl": {"actor_rollout_ref": {"rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4,
                                                   **multi_turn},
                                       "actor": {"ppo_micro_batch_size_per_gpu": 4}},
                 "critic": {"ppo_micro_batch_size_per_gpu": 4}, **trainer, **extra.pop("verl", {})},
        "cluster": {"nodes": 1, "gpus_per_node": 8},
        "ray": {"working_dir": str(root), "wait_for_nodes": "60s"},
        **extra,
    }))
    result = run_verlc("build", spec, "--target", "ray-job", "--out", root / "out")
    assert result.returncode == 0, result.stderr
    return root / "out" / "rayjob-e2e" / "ray-job" / "submit.sh"


def submit_and_wait(script: Path, address: str, stop_after: str = "preflight", accept_changes: bool = False,
                    cwd: Path | None = None) -> tuple[str, str]:
    """Run submit.sh (stop before training) from its folder or `cwd`, wait for the job; return (final status,
    logs)."""
    accept = {"VERLC_ACCEPT_CHANGES": "1"} if accept_changes else {}
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=300,
                            env=ray_env({"RAY_ADDRESS": address, "VERLC_STOP_AFTER": stop_after, **accept}),
                            cwd=cwd or script.parent)
    assert result.returncode == 0, result.stderr
    job = re.search(r"^submitted (\S+) to ", result.stdout, re.M)
    assert job, result.stdout
    assert f"ray job logs --address {address} --follow {job[1]}" in result.stdout
    # Asked of the dashboard's Jobs API, as verlc's own status and logs do (targets/ray_job/launch.py): each
    # `ray job status` command took 1.9 s of CPU here, polled beside the job it waits for.
    deadline = time.monotonic() + 480  # a loaded test machine: the preflight alone may take minutes
    status = ""
    while time.monotonic() < deadline:
        status = jobs_api(address, job[1])["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            return status, jobs_api(address, f"{job[1]}/logs")["logs"]
        time.sleep(1)
    return f"not finished: {status}", jobs_api(address, f"{job[1]}/logs")["logs"]


def jobs_api(address: str, path: str) -> dict:
    """GET the Ray dashboard's /api/jobs/PATH (`address`: the dashboard's http://HOST:PORT)."""
    with urllib.request.urlopen(f"{address}/api/jobs/{path}", timeout=30) as answer:
        return json.loads(answer.read())


def test_job_runs_preflight_on_a_real_ray_cluster(ray_head: str, tmp_path: Path) -> None:
    import ray
    from test_inputs import COMMIT, hub_cache

    write_fixtures(tmp_path)
    hub_cache(tmp_path / "hf")  # the model pinned to a revision, from the local HF cache with the hub offline
    tools = tmp_path / "shared-storage" / "tools.yaml"  # a tool config outside the code, by its absolute path
    tools.parent.mkdir()
    tools.write_text("tools: []\n")
    script = build(tmp_path, model={"path": "org/tiny", "revision": COMMIT}, tool_config_path=str(tools),
                   env={"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"})
    status, logs = submit_and_wait(script, ray_head)
    assert status == "SUCCEEDED", failing_first(logs)
    folder = f"models/org--tiny-{COMMIT[:12]}"
    assert f"fetching model org/tiny at {COMMIT} into {folder} from the local Hugging Face cache" in logs
    assert "cluster ready: 1 nodes, 8 GPUs" in logs
    assert "preflight passed: 1 nodes, 8 GPUs, 2 data files" in logs
    assert ", all-reduce over 1 ranks on 1 nodes\n" in logs
    assert "stopping after stage preflight" in logs
    record = record_from_log(logs)
    assert record["gpus"] == 8
    assert record["versions"]["ray"] == ray.__version__
    assert record["pins"] == {"verl": "0.9.1"} and record["versions"]["verl"] == "0.9.1"
    assert record["inputs"]["model"]["revision"] == COMMIT and record["inputs"]["model"]["path"] == folder
    assert record["inputs"]["files"] == {str(tools): hashlib.sha256(tools.read_bytes()).hexdigest()}  # #53 item 7


def test_the_wait_counts_every_nodes_gpus_against_the_specs(ray_head: str) -> None:
    """The runtime's wait stage on a real cluster of one 8-GPU node, for a job that asks for 16 GPUs on 1 node:
    the node count is met, the GPU count is not, so the cluster is not ready (it once compared the total with
    the last registered node's GPUs) and the deadline names both numbers."""
    code = "import sys\nfrom verlc.runtime import cluster\nsys.exit(cluster.wait(sys.argv[1], 1, 16, 3))"
    result = subprocess.run([sys.executable, "-c", code, GCS["address"]], capture_output=True, text=True,
                            env=ray_env(), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "node registered: " in result.stdout and "GPUs=8 (1/1)" in result.stdout
    assert "ERROR: after 3s the cluster has 1 of 1 nodes and 8 of 16 GPUs" in result.stdout, result.stdout


def test_a_task_that_sees_the_nodes_gpus_runs_beside_one_that_holds_them_all(ray_head: str) -> None:
    """The preflight's start-up needs see a node's GPUs as the node's own processes do (Ray hides them from a
    task that holds none) without holding them, so the all-reduce, which holds them all, runs meanwhile: on a
    real 8-GPU node (logical), one task holds the 8 GPUs while each node's seeing task answers with the node's
    own CUDA_VISIBLE_DEVICES (unset here); a task that holds none is shown an empty one."""
    code = """if True:
        import json, os, sys, time
        from verlc.runtime import cluster
        ray = cluster.connect(sys.argv[1])
        nodes = cluster.alive_nodes(ray)
        holder = ray.remote(num_cpus=0, num_gpus=8)(lambda: time.sleep(60))
        held = holder.remote()
        deadline = time.monotonic() + 60
        while ray.available_resources().get("GPU", 0) and time.monotonic() < deadline:
            time.sleep(0.2)
        shown = lambda: os.environ.get("CUDA_VISIBLE_DEVICES")
        seen, problems = cluster.on_each_node(ray, nodes, shown, what="seeing", timeout=50, see=True)
        hidden, more = cluster.on_each_node(ray, nodes, shown, what="hidden", timeout=50)
        still = not ray.wait([held], timeout=0)[0]
        print(json.dumps({"free": ray.available_resources().get("GPU", 0), "seen": list(seen.values()),
                          "hidden": list(hidden.values()), "problems": problems + more, "held": still}))
        ray.cancel(held, force=True)
    """
    result = subprocess.run([sys.executable, "-c", code, GCS["address"]], capture_output=True, text=True,
                            env=ray_env(), timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown == {"free": 0, "seen": [None], "hidden": [""], "problems": [], "held": True}, shown


def test_env_vars_of_the_node_expand_there_and_are_required(ray_head: str, tmp_path: Path) -> None:
    """${env:NAME} in the checkpoint folder: the preflight creates it under the node's value (not a folder
    named '${...}'), verl gets ${oc.env:NAME}; a variable the node lacks fails the preflight, named."""
    write_fixtures(tmp_path)
    status, logs = submit_and_wait(build(tmp_path, checkpoints=f"${{env:{NODE_VARIABLE}}}/ckpt"), ray_head)
    assert status == "SUCCEEDED", failing_first(logs)
    scratch = Path(NODE_ENV[NODE_VARIABLE])
    assert (scratch / "ckpt").is_dir()
    assert not list(tmp_path.rglob("*${*")), "a folder named after the unexpanded variable"
    job = json.loads((tmp_path / "out" / "rayjob-e2e" / "ray-job" / "verlc_job" / "job.json").read_text())
    assert f"trainer.default_local_dir='${{oc.env:{NODE_VARIABLE}}}/ckpt'" in job["train"]

    missing = tmp_path / "missing"
    missing.mkdir()
    write_fixtures(missing)
    status, logs = submit_and_wait(build(missing, checkpoints="${env:VERLC_TEST_NOT_ON_THE_NODE}/ckpt"), ray_head)
    assert status == "FAILED", failing_first(logs)
    assert "environment variable VERLC_TEST_NOT_ON_THE_NODE is not set (the spec reads " \
           "${env:VERLC_TEST_NOT_ON_THE_NODE})" in logs


def test_missing_data_file_fails_the_job(ray_head: str, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    status, logs = submit_and_wait(build(tmp_path, val_file="data/nope.parquet",
                                         tool_config_path=f"{tmp_path}/gone/tools.yaml"), ray_head)
    assert status == "FAILED", failing_first(logs)
    assert "PREFLIGHT FAILED: data file data/nope.parquet does not exist" in logs
    assert f"file {tmp_path}/gone/tools.yaml (named by a verl setting) does not exist" in logs


def test_a_file_a_verl_setting_names_by_an_absolute_path_is_checked_on_every_node(tmp_path: Path) -> None:
    """The same function runs on each other node (on_each_node): a file one node cannot see is named there."""
    from verlc.runtime.nodes import paths_on_node

    write_fixtures(tmp_path)
    (tmp_path / "tools.yaml").write_text("tools: []\n")
    data = [[str(tmp_path / "data" / "train.parquet")]]
    seen = paths_on_node([str(tmp_path / "model")], [str(tmp_path / "ckpt")], data,
                         [[str(tmp_path / "tools.yaml")], [str(tmp_path), "/", {"env": "VERLC_TEST_NONE"}, "x.py"]])
    assert seen == [f"file {tmp_path}/x.py (named by a verl setting) does not exist"], seen


def test_reproducible_reruns_must_match_the_first_run(ray_head: str, tmp_path: Path) -> None:
    """The first run writes its record next to its checkpoints; a re-run with the same inputs proceeds, one
    whose data or versions differ stops before training, naming old and new, unless told to accept them."""
    import pyarrow.parquet as pq

    write_fixtures(tmp_path)
    train = tmp_path / "data" / "train.parquet"
    pq.write_table(pq.read_table(train), train, compression="none")  # its text as bytes, to edit in place
    script = build(tmp_path, reproducible=True, verl_version="0.9.1",
                   container={"runtime": "docker", "image": "verl@sha256:" + "0" * 64, "workdir": "/w"},
                   checkpoints=str(tmp_path / "ckpt"))
    status, logs = submit_and_wait(script, ray_head)
    assert status == "SUCCEEDED", failing_first(logs)
    # Ray runs the job in a copy of working_dir: a shared, absolute checkpoint folder outlives it.
    reference = tmp_path / "ckpt" / "verlc-first-run.json"
    assert "first run of a reproducible job" in logs and reference.exists()
    first = json.loads(reference.read_text())
    [data] = [f for f in first["inputs"]["data"] if f["path"] == "data/train.parquet"]
    assert (data["rows"], data["bytes"]) == (1, train.stat().st_size)
    assert first["trainer_argv"][:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert first["verl_config"]["trainer"]["project_name"] == "e2e"  # as the node's verl resolves it
    assert first["inputs"]["model"]["files"]["config.json"] == hashlib.sha256(
        (tmp_path / "model" / "config.json").read_bytes()).hexdigest()
    status, logs = submit_and_wait(script, ray_head)
    assert status == "SUCCEEDED" and "PREFLIGHT FAILED" not in logs, failing_first(logs)

    content = train.read_bytes()
    train.write_bytes(content.replace(b"1+1", b"1+2", 1))  # one byte, the same size
    assert train.stat().st_size == len(content)
    first["versions"]["verl"] = "0.9.0"
    reference.write_text(json.dumps(first))
    status, logs = submit_and_wait(script, ray_head)
    assert status == "FAILED", failing_first(logs)
    new = hashlib.sha256(train.read_bytes()).hexdigest()
    assert (f"PREFLIGHT FAILED: inputs: data data/train.parquet sha256: {new}, but the first run ({reference}) "
            f"had {data['sha256']}") in logs
    assert f"PREFLIGHT FAILED: versions: verl: 0.9.1, but the first run ({reference}) had 0.9.0" in logs
    assert "stage train" not in logs

    status, logs = submit_and_wait(script, ray_head, accept_changes=True)
    assert status == "SUCCEEDED", failing_first(logs)
    assert f"accepted change (VERLC_ACCEPT_CHANGES=1): inputs: data data/train.parquet sha256: {new}" in logs
    accepted = json.loads(reference.read_text())  # later re-runs compare with what was accepted
    assert len(accepted["accepted_changes"]) == 2 and accepted["versions"]["verl"] == "0.9.1"


def installed_verl_from_git(site: Path, commit: str) -> Path:
    """A verl distribution as `pip install verl@git+...@COMMIT` records it (PEP 610's direct_url.json), at the
    version the pinned commit installs as; metadata only (the node's verl code stays the venv's)."""
    info = site / "verl-0.8.0.dev0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: verl\nVersion: 0.8.0.dev0\n")
    (info / "direct_url.json").write_text(json.dumps({"url": "https://github.com/verl-project/verl.git",
                                                      "vcs_info": {"vcs": "git", "commit_id": commit}}))
    return site


def test_the_runs_code_reaches_the_job_is_recorded_and_each_nodes_verl_commit_is_checked(
        ray_head: str, tmp_path: Path) -> None:
    """A recipe-style run: the code folder is the job's working_dir; the preflight hashes the reward function
    where the job runs (the record has the sha256 of the file built from) and refuses a node whose verl is
    another commit than the spec pins, naming both."""
    from test_programs import ROLLING, code_repo

    commit = code_repo(tmp_path / "code")
    write_fixtures(tmp_path)  # data and model on "shared storage", beside the code
    site = tmp_path / "site"
    spec = tmp_path / "spec.yaml"

    def run(installed: str, accept: bool = False, **extra: object) -> tuple[str, str]:
        installed_verl_from_git(site, installed)
        spec.write_text(json.dumps({**extra,
            "name": "own-code", "project": "e2e", "model": str(tmp_path / "model"), "code": "code",
            "verl_commit": ROLLING,
            "data": {"train_files": [str(tmp_path / "data" / "train.parquet")],
                     "val_files": [str(tmp_path / "data" / "test.parquet")]},
            "verl": {"actor_rollout_ref": {"rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4},
                                           "actor": {"ppo_micro_batch_size_per_gpu": 4}},
                     "algorithm": {"adv_estimator": "grpo"},
                     "custom_reward_function": {"path": "rewards/math.py", "name": "compute_score"}},
            "env": {"PYTHONPATH": f"{site}:{rollout_engine_site()}"},  # the node's verl install
            "cluster": {"nodes": 1, "gpus_per_node": 8}, "ray": {"wait_for_nodes": "60s"}}))
        result = run_verlc("build", spec, "--target", "ray-job", "--out", tmp_path / "out",
                           env={"VERLC_ACCEPT_CHANGES": "1"} if accept else None)
        assert result.returncode == 0, result.stderr
        return submit_and_wait(tmp_path / "out" / "own-code" / "ray-job" / "submit.sh", ray_head, cwd=tmp_path)

    other = "1" * 40
    status, logs = run(other)
    assert status == "FAILED", failing_first(logs)
    assert re.search(rf"PREFLIGHT FAILED: node \S+ \(\w+\): verl is commit {other}; the spec pins commit {ROLLING}",
                     logs), logs
    record = record_from_log(logs)  # written before the preflight fails
    reward_file = tmp_path / "code" / "rewards" / "math.py"
    reward = hashlib.sha256(reward_file.read_bytes()).hexdigest()
    assert record["inputs"]["code"] == {"commit": commit, "dirty": False, "diff_sha256": None,
                                        "files": {"rewards/math.py": reward}}
    assert record["nodes"][0]["verl_source"]["commit"] == other

    # a reproducible run from code with uncommitted changes: refused at build, built when accepted, and then
    # the run record names the commit, the changes' sha256 (their diff is the bundle's code.diff) and the
    # reward function as it was built; this node's verl is the pinned commit
    reward_file.write_text(reward_file.read_text() + "# tuned for this run\n")
    pinned = {"reproducible": True, "container": {"runtime": "docker", "image": "verl@sha256:" + "0" * 64,
                                                  "workdir": "/w"}}
    with pytest.raises(AssertionError, match="has uncommitted changes"):
        run(ROLLING, **pinned)
    status, logs = run(ROLLING, accept=True, **pinned)
    assert status == "SUCCEEDED", failing_first(logs)
    record = record_from_log(logs)
    diff = (tmp_path / "out" / "own-code" / "ray-job" / "code.diff").read_bytes()
    assert record["inputs"]["code"] == {
        "commit": commit, "dirty": True, "diff_sha256": hashlib.sha256(diff).hexdigest(),
        "files": {"rewards/math.py": hashlib.sha256(reward_file.read_bytes()).hexdigest()}}
    assert b"+# tuned for this run" in diff and record["nodes"][0]["verl_source"]["commit"] == ROLLING


def upload_fixture(root: Path) -> None:
    """A working dir with what verl checkouts hold: code, a .gitignore'd and a .rayignore'd folder,
    data and checkpoints the default excludes leave out, nested folders, an empty one."""
    for rel, size in {"verl/trainer/main_ppo.py": 40_000, "verl/utils/x.py": 3_000, "README.md": 900,
                      "logs/a.log": 50_000, "scratch/big.npy": 70_000, "data/gsm8k/train.parquet": 200_000,
                      "checkpoints/step_1/model.safetensors": 300_000, "examples/run.sh": 1_200,
                      "wandb/run-1/files.txt": 9_000, "sub/.gitignore": 6, "sub/keep.txt": 10,
                      "sub/drop.tmp": 5_000}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    (root / "sub" / ".gitignore").write_text("*.tmp\n")
    (root / ".gitignore").write_text("logs/\n")
    (root / ".rayignore").write_text("scratch/\n")
    (root / "empty").mkdir()


def test_upload_size_is_measured_with_rays_own_rules(tmp_path: Path) -> None:
    """The helper's estimate of the upload equals the size of the zip Ray itself builds from the same
    folder and excludes (within the zip's own per-entry extras)."""
    from ray._private.runtime_env.packaging import create_package

    from verlc.targets.ray_job import upload_size
    from verlc.targets.ray_job.view import UPLOAD_EXCLUDES

    upload_fixture(tmp_path / "wd")
    zipped = tmp_path / "ray.zip"
    create_package(str(tmp_path / "wd"), zipped, include_gitignore=True, excludes=list(UPLOAD_EXCLUDES))
    sizes = upload_size.upload_sizes(str(tmp_path / "wd"), list(UPLOAD_EXCLUDES))
    assert set(sizes) == {"verl", "README.md", "examples", "sub", "empty", ".gitignore", ".rayignore"}
    estimate = sum(sizes.values()) + 22
    assert abs(estimate - zipped.stat().st_size) < 0.01 * zipped.stat().st_size, (estimate, zipped.stat().st_size)


def test_submit_refuses_a_working_dir_over_rays_upload_limit_naming_the_largest(ray_head: str, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    big = tmp_path / "assets" / "tokenizer-cache.bin.part"
    big.parent.mkdir()
    with big.open("wb") as fh:  # sparse: 120 MiB that takes no disk
        fh.truncate(120 * 1024**2)
    with (tmp_path / "data" / "huge.parquet").open("wb") as fh:  # excluded by default: not counted
        fh.truncate(500 * 1024**2)
    script = build(tmp_path)
    result = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=ray_env({"RAY_ADDRESS": ray_head}))
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(r"would upload 120\.\d MiB, over the 100\.0 MiB the Ray dashboard accepts", result.stderr)
    assert "Largest entries: assets (120.0 MiB). Exclude them" in result.stderr, result.stderr
    assert "submitted" not in result.stdout
    big.unlink()
    ok = subprocess.run(["bash", str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                        env=ray_env({"RAY_ADDRESS": ray_head, "VERLC_STOP_AFTER": "ray"}))
    assert ok.returncode == 0 and "working_dir " in ok.stdout and "uploading 0." in ok.stdout, ok.stdout + ok.stderr


def test_the_stall_timeout_ends_a_ray_job_whose_trainer_prints_no_step(ray_head: str, tmp_path: Path) -> None:
    """The job's own watchdog (the same rule as the Slurm script's): verl's trainer (here a stand-in that
    prints its argv and hangs) showed no console-logger step for 6 s."""
    from test_slurm_e2e import fake_venv

    write_fixtures(tmp_path)
    fake = fake_venv(tmp_path) / "bin"
    script = build(tmp_path, stall_timeout="6s", env={"PATH": f"{fake}:/usr/bin:/bin"})
    status, logs = submit_and_wait(script, ray_head, stop_after="train")
    assert status == "FAILED", failing_first(logs)
    assert "TRAINER restart=0" in logs
    assert "ERROR: no new training step for 6s (stall_timeout): stopping the run" in logs
    assert "training exited with code 124" in logs


def test_a_pipelines_stages_run_in_turn_in_one_ray_job(ray_head: str, tmp_path: Path) -> None:
    """#43 on ray-job: a pipeline is one Ray job that runs its stages in turn: SFT (a stand-in torchrun saving a
    real FSDP-format checkpoint, no GPU here), verl's own merger on it, then GRPO from the merged model (verl's
    main_ppo stands in: it prints its argv); a stage that fails stops the job, named."""
    from test_lifecycle_e2e import SFT_STANDIN
    from test_slurm_e2e import fake_venv, stand_in

    write_fixtures(tmp_path)
    fake = fake_venv(tmp_path)
    (tmp_path / "sft_standin.py").write_text(SFT_STANDIN)
    stand_in(fake, "torchrun", f"#!/usr/bin/env bash\nexec {sys.executable} {tmp_path}/sft_standin.py \"$@\"\n")
    spec = tmp_path / "pipeline.yaml"
    outcomes = {}
    for fail in ("", "1"):
        spec.write_text(json.dumps({
            "name": "rayjob-chain", "targets": ["ray-job"], "project": "e2e", "model": str(tmp_path / "model"),
            "data": {"train_files": ["data/train.parquet"], "val_files": ["data/test.parquet"]},
            "cluster": {"nodes": 1, "gpus_per_node": 8},
            "env": {"PATH": f"{fake / 'bin'}:/usr/bin:/bin", "FAKE_STEPS": "2", "FAIL_SFT": fail},
            "ray": {"working_dir": str(tmp_path), "wait_for_nodes": "60s"},
            "stages": {
                "sft": {"program": "verl.trainer.sft_trainer",
                        "verl": {"data": {"max_length": 512},
                                 "trainer": {"logger": ["console"], "default_local_dir": f"{tmp_path}/ckpt/sft"}}},
                "grpo": {"model": "${stages.sft.model}",
                         "verl": {"algorithm": {"adv_estimator": "grpo"},
                                  "actor_rollout_ref": {"rollout": {"name": "vllm",
                                                                    "log_prob_micro_batch_size_per_gpu": 4},
                                                        "actor": {"ppo_micro_batch_size_per_gpu": 4},
                                                        "ref": {"log_prob_micro_batch_size_per_gpu": 4}}}}},
        }))
        result = run_verlc("build", spec, "--target", "ray-job", "--out", tmp_path / "out")
        assert result.returncode == 0, result.stderr
        outcomes[fail] = submit_and_wait(tmp_path / "out" / "rayjob-chain" / "ray-job" / "submit.sh", ray_head,
                                         stop_after="train")
    status, logs = outcomes[""]
    assert status == "SUCCEEDED", failing_first(logs)
    lines = [line.split("verlc: ", 1)[1] for line in logs.splitlines() if "verlc: pipeline " in line]
    assert lines == ["pipeline stage 1/2: sft (rayjob-chain-sft)", "pipeline stage 2/2: grpo (rayjob-chain-grpo)",
                     "pipeline done: sft, grpo"], logs
    merged = tmp_path / "ckpt" / "sft" / "verlc-merged"
    assert f"merging stage rayjob-chain-sft's checkpoint (step 2) into a Hugging Face folder: python3 -m " \
           f"verl.model_merger merge --backend fsdp --local_dir {tmp_path}/ckpt/sft/global_step_2 " in logs
    assert f"actor_rollout_ref.model.path={merged}/latest" in logs and (merged / "global_step_2" / "config.json").is_file()
    record = record_from_log(logs)
    assert record["inputs"]["stages"][0]["step"] == 2 and "model.safetensors" in record["inputs"]["stages"][0]["files"]
    status, logs = outcomes["1"]
    assert status == "FAILED" and "ERROR: stage sft exited with code 1; the pipeline stops (grpo not run)" in logs
    assert "pipeline stage 2/2" not in logs


# A stand-in torchrun (there is no GPU here): it records its pid by node rank, then does what the case file
# says: every rank ends well, rank 1 fails, or rank 0 fails while the others wait (as at a rendezvous).
STAND_IN_TORCHRUN = """#!/usr/bin/env bash
rank=''
for a in "$@"; do [[ $a == --node_rank=* ]] && rank=${a#--node_rank=}; done
echo "TORCHRUN rank $rank argv: $*"
echo $$ >"$VERLC_TEST_DIR/pid-$rank"
case "$(cat "$VERLC_TEST_DIR/case")-$rank" in
  ok-*) echo "step:1 - rank $rank"; exit 0 ;;
  other_fails-1) echo "rank 1: NCCL error"; exit 3 ;;
  rank0_fails-0)  # once rank 1 runs (a fresh Ray worker takes its time on a busy machine)
    for _ in $(seq 240); do [[ -f $VERLC_TEST_DIR/pid-1 ]] && break; sleep 0.5; done
    echo "rank 0: out of memory"; exit 4 ;;
esac
exec sleep 600
"""


@pytest.mark.machine  # its own Ray cluster: beside another test's Ray, default ports clash
def test_torchrun_on_every_node_runs_each_nodes_rank_and_one_failure_stops_them_all(tmp_path: Path) -> None:
    """The runtime's train stage of a torchrun program on 2 nodes (protocol.Job.every_node), on a real Ray
    cluster of two nodes on this host: rank 0 runs where the runtime runs, rank 1 as a Ray task on the other
    node, both with the rendezvous at the runtime's node. One node's failure stops the run, naming that node
    with its last lines, and leaves no torchrun of any node running."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(STAND_IN_TORCHRUN)
    (bin_dir / "torchrun").chmod(0o755)
    temp = Path("/tmp") / f"verlc-test-ray2-{os.getpid()}"
    env = ray_env({"PATH": f"{bin_dir}:{BIN}:{os.environ['PATH']}", "VERLC_TEST_DIR": str(tmp_path)}, temp)
    port = free_port()
    common = ["--node-ip-address=127.0.0.1", "--num-gpus=2", "--num-cpus=1", f"--temp-dir={temp}",
              "--disable-usage-stats"]
    try:
        for start in (["--head", f"--port={port}", "--include-dashboard=false"], [f"--address=127.0.0.1:{port}"]):
            up = subprocess.run([str(BIN / "ray"), "start", *start, *common], capture_output=True, text=True,
                                env=env, timeout=120)
            assert up.returncode == 0, up.stdout + up.stderr
        train = ("import os, sys\nfrom verlc.runtime import train\n"
                 "sys.exit(train.train(['torchrun', '--nnodes=2', '--nproc_per_node=2', '-m', 'verl.trainer.sft_"
                 "trainer'], dict(os.environ), 300, os.environ['RAY_ADDRESS'], nodes=2))\n")
        runs = {}
        for case in ("ok", "other_fails", "rank0_fails"):
            (tmp_path / "case").write_text(case)
            for pid in tmp_path.glob("pid-*"):
                pid.unlink()
            started = time.monotonic()
            run = subprocess.run([sys.executable, "-c", train], capture_output=True, text=True, timeout=240,
                                 env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"})
            pids = {p.name: int(p.read_text()) for p in tmp_path.glob("pid-*")}
            left, gone_by = dict(pids), time.monotonic() + 5  # the runtime saw the tasks end; TERM is on its way
            while left and time.monotonic() < gone_by:
                time.sleep(0.2)
                left = {name: pid for name, pid in left.items() if Path(f"/proc/{pid}").exists()}
            runs[case] = (run, time.monotonic() - started, sorted(pids), left)
    finally:
        stop_by_pid(temp)
    run, _, ranks, left = runs["ok"]
    assert run.returncode == 0 and ranks == ["pid-0", "pid-1"] and not left, run.stdout + run.stderr
    # the rendezvous is Ray's address of the runtime's node (the two nodes share this host's)
    placed = re.search(r"torchrun on 2 nodes, rendezvous at ([\d.]+):(\d+): node rank 0 \S+ \(\1\) \(here\), "
                       r"1 \S+ \(\1\)\n", run.stdout)
    assert placed, run.stdout
    assert (f"TORCHRUN rank 0 argv: --node_rank=0 --master_addr={placed[1]} --master_port={placed[2]} --nnodes=2 "
            f"--nproc_per_node=2 -m verl.trainer.sft_trainer") in run.stdout, run.stdout
    assert "(node rank 1) exited with code 0" in run.stdout, run.stdout
    run, took, ranks, left = runs["other_fails"]
    assert run.returncode == 1 and not left and took < 60, (took, left, run.stdout + run.stderr)
    assert re.search(r"\] rank 1: NCCL error\n.*ERROR: torchrun on node .* \(node rank 1\) exited with code 3 "
                     r"\(its last lines are above\): stopping the run", run.stdout), run.stdout
    assert re.search(r"\] TORCHRUN rank 1 argv: --node_rank=1 --master_addr=[\d.]+ --master_port=\d+ ",
                     run.stdout), run.stdout
    run, took, ranks, left = runs["rank0_fails"]
    assert run.returncode == 4 and ranks == ["pid-0", "pid-1"] and not left and took < 60, \
        (took, left, run.stdout + run.stderr)


SERVICES = Path(__file__).parent / "services"  # the real HTTP servers the services tests start


SERVICES_VERL = {"reward": {"sandbox_fusion": {"url": "${services.sandbox.url}/run_code"}}}
# verl's multi-turn tool config as a Search-R1 run writes it: its search tool reaches the retriever on its own node
SERVICES_TOOLS = {"tools": [{"class_name": "search_r1.tools.SearchTool",
                             "config": {"type": "native", "retrieval_service_url": "${services.retriever.url}/retrieve",
                                        "topk": 1},
                             "tool_schema": {"type": "function", "function": {
                                 "name": "search", "description": "Searches the corpus.",
                                 "parameters": {"type": "object", "properties": {"query": {"type": "string"}},
                                                "required": ["query"]}}}}]}


def service_fixtures(root: Path) -> dict:
    """The test servers, the stand-in trainer and the retriever's corpus in `root`; the spec's services: a code
    sandbox on the head node and a BM25 retriever on every node (real servers, started by the runtime)."""
    write_fixtures(root)
    for name in ("sandbox.py", "retriever.py", "trainer.py"):
        shutil.copy(SERVICES / name, root / name)
    (root / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in (
        {"id": "pg", "contents": "Policy gradient methods optimise the policy directly from sampled returns."},
        {"id": "ppo", "contents": "Proximal policy optimisation clips the ratio of new to old policy."},
        {"id": "bm25", "contents": "BM25 ranks documents by term frequency and inverse document frequency."})))
    return {
        "sandbox": {"command": ["python3", "sandbox.py", "--host", "${services.sandbox.host}",
                                "--port", "${services.sandbox.port}", "--token-env", "VERLC_SERVICE_SANDBOX_TOKEN"],
                    "ready": {"http": "/health", "deadline": "60s"}, "probe": {"kind": "sandbox"}},
        "retriever": {"command": ["python3", "retriever.py", "--host", "${services.retriever.host}",
                                  "--port", "${services.retriever.port}", "--corpus", "corpus.jsonl"],
                      "on": "every_node", "probe": {"kind": "retriever", "query": "policy optimisation"}},
    }


def services_spec(root: Path, retriever: dict | None = None, **sandbox: object) -> Path:
    """A job with the services of service_fixtures, and a stand-in trainer (tests/services/trainer.py) that calls
    both at the addresses verlc wired: the sandbox's through verl's reward.sandbox_fusion.url (with the run's
    token, which the sandbox requires), the retriever's through its env."""
    from test_slurm_e2e import fake_venv

    services = service_fixtures(root)
    services["sandbox"].update(sandbox)
    services["retriever"].update(retriever or {})
    fake = fake_venv(root) / "bin"
    return build(root, env={"PATH": f"{fake}:/usr/bin:/bin", "FAKE_TRAINER": "trainer.py",
                            "TOKEN_SEEN": str(root / "token.seen")}, verl=SERVICES_VERL,
                 services=services, tool_config=SERVICES_TOOLS)


def service_processes(root: Path) -> list[str]:
    """The command lines of the test's service processes still running (none once a job has ended)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if entry.name.isdigit() and ("sandbox.py" in line or "retriever.py" in line) and str(root) in \
                os.readlink(entry / "cwd"):
            found.append(line)
    return found


def kept_service_logs(address: str, name: str, node: str | None = None) -> dict[str, str]:
    """A service's logs that the latest ray-job run kept (it has no run folder), read as `verlc logs RUN
    --service NAME` reads them: the ray-job launcher, through Ray's log API (they are in Ray's log folder, gone
    with the test's Ray)."""
    from verlc.contract.launcher import SubmittedRun
    from verlc.targets.ray_job import launch

    with urllib.request.urlopen(f"{address}/api/jobs/", timeout=30) as answer:
        latest = max(json.load(answer), key=lambda job: job.get("start_time") or 0)
    run = SubmittedRun(run=latest["submission_id"], target="ray-job", job_id=latest["submission_id"],
                       where=address, bundle="")
    return launch.service_logs(run, name, node)


def test_services_start_with_the_job_pass_their_probes_and_reach_the_trainer_then_stop(ray_head: str,
                                                                                        tmp_path: Path) -> None:
    """#55: a sandbox on the head and a retriever on every node, started by the runtime beside the bring-up,
    ready and probed before training; the stand-in trainer reaches both at the addresses verlc wired; nothing of
    them runs once the job has ended."""
    status, logs = submit_and_wait(services_spec(tmp_path), ray_head, stop_after="train")
    assert status == "SUCCEEDED", failing_first(logs)
    assert re.search(r"service sandbox: started on the head node at http://[\d.]+:\d+", logs)
    assert re.search(r"service sandbox: ready in [\d.]+s, sandbox probe passed", logs), logs
    assert re.search(r"service retriever: ready in [\d.]+s, retriever probe passed", logs), logs
    # verl's setting reads the variable the runtime set (OmegaConf resolves it in the trainer's process)
    assert "reward.sandbox_fusion.url='${oc.env:VERLC_SERVICE_SANDBOX_URL}/run_code'" in logs
    url = re.search(r"sandbox at (http://[\d.]+:(\d+))/run_code printed 42", logs)
    assert url and url[1] in logs.split("service sandbox: started on the head node at ")[1], logs
    assert re.search(r"retriever at http://127\.0\.0\.1:\d+/retrieve found pg", logs), logs
    record = record_from_log(logs)
    assert record["services"]["sandbox"]["probe_passed"] and record["services"]["retriever"]["probe_passed"]
    assert "services stopped: sandbox, retriever" in logs
    assert not service_processes(tmp_path)
    said = re.search(r"the services' logs: (/\S+) on the head node \(in Ray's log folder of each node: \S+\)", logs)
    assert said and said[1].startswith("/tmp/verlc-test-ray-"), logs  # in the head's Ray log folder
    sandbox = kept_service_logs(ray_head, "sandbox")  # the head's, and the retriever's of each node
    assert list(sandbox) == ["sandbox.log"] and "sandbox listening on" in sandbox["sandbox.log"], sandbox
    retrievers = kept_service_logs(ray_head, "retriever")
    assert retrievers and all(re.fullmatch(r"retriever-\S+\.log", k) for k in retrievers), retrievers
    node = next(iter(retrievers)).removeprefix("retriever-").removesuffix(".log")
    assert kept_service_logs(ray_head, "retriever", node) == {f"retriever-{node}.log":
                                                              retrievers[f"retriever-{node}.log"]}
    # the spec's tool config: written on the node, reached by the trainer through verl's key, removed at the end
    placed = re.search(r"tool config: (/\S+\.yaml) on 1 nodes \(VERLC_TOOL_CONFIG\)", logs)
    assert placed, logs
    assert re.search(rf"the tool config at {re.escape(placed[1])} reached the retriever at "
                     r"http://127\.0\.0\.1:\d+/retrieve: ppo", logs), logs
    assert not Path(placed[1]).exists()
    [token] = (tmp_path / "token.seen").read_text().split()  # the stand-in trainer's (the sandbox requires it)
    assert len(token) >= 32 and token not in logs
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file() and token in p.read_text(errors="replace")]


def test_a_service_whose_probe_fails_fails_the_job_before_training_naming_it(ray_head: str,
                                                                             tmp_path: Path) -> None:
    """A sandbox that answers but runs nothing (verl #7853's kind): its probe fails the preflight with the request
    and the answer; a retriever that cannot start on its nodes (no corpus) is named with its node and that node's
    log; the trainer never starts, and the services are stopped."""
    no_corpus = {"command": ["python3", "retriever.py", "--host", "${services.retriever.host}", "--port",
                             "${services.retriever.port}", "--corpus", "no-such-corpus.jsonl"]}
    status, logs = submit_and_wait(services_spec(tmp_path, retriever=no_corpus, env={"SANDBOX_BROKEN": "1"}),
                                   ray_head, stop_after="train")
    assert status == "FAILED", failing_first(logs)
    assert re.search(r'PREFLIGHT FAILED: service sandbox failed its sandbox probe: POST /run_code '
                     r'\{"code": "print\(1\)", "language": "python"\} answered 200 .*"stdout": ""', logs), logs
    assert "sandbox listening on" in logs  # its last lines
    # a service on every node that exits: its node, and that node's own log
    assert re.search(r"PREFLIGHT FAILED: service retriever exited with code 1 on \S+ \(its last lines are above; "
                     r"its log: \S+/services/retriever-\S+\.log\)", logs), logs
    assert "[service retriever] FileNotFoundError" in logs or "no-such-corpus.jsonl" in logs, logs
    assert "TRAINER" not in logs
    assert not service_processes(tmp_path)
    assert "sandbox listening on" in kept_service_logs(ray_head, "sandbox")["sandbox.log"]
