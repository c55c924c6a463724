"""The skypilot target: every generated task.yaml is loaded by SkyPilot's own task parser (the `skypilot`
package in its own venv, .cache/sky: its pins clash with verl's); its `run` script is shellcheck-clean and,
on the head, runs the job package and stops only the Ray it started; a recovering managed job whose
checkpoints would be lost is refused; sky command lines of submit/status/logs/cancel, against a recording
`sky` (no cloud here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import IN_CI, REPO, require_tool, run_verlc
from test_kuberay import base as kube_base
from test_kuberay import problems as kube_problems
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.lifecycle import ledger
from verlc.targets import render

EXAMPLE = REPO / "specs" / "qwen2-7b-grpo-k8s-cloud.yaml"
SKY_PYTHON = REPO / ".cache" / "sky" / "bin" / "python"


def base(**changes: Any) -> dict[str, Any]:
    spec = kube_base(**changes)
    spec.pop("kubernetes", None) if "kubernetes" not in changes else None
    spec["targets"] = ["skypilot"]
    spec["cluster"] = {"gpu_type": "A100-80GB", **spec["cluster"]}
    spec.setdefault("skypilot", {"buckets": [{"source": "gs://bucket/ckpt", "mount": "/ckpt"}]})
    return spec


VARIANTS = {
    "example": None,
    "sweep of 2, volumes, infra": base(sweep={"matrix": {"verl.actor_rollout_ref.actor.optim.lr": [1e-6, 2e-6]}},
                                       skypilot={"infra": "gcp/us-central1", "cpus": "32+", "memory": 256,
                                                 "disk_size": 500, "volumes": [{"name": "ckpt", "mount": "/ckpt"}]}),
    "rocm MI300X, no recovery": base(cluster={"nodes": 1, "gpus_per_node": 8, "accelerator": "rocm",
                                              "gpu_type": "MI300X"}, skypilot={"recovery": "off"}),
    "secrets and env": base(secrets=["WANDB_API_KEY", "HF_TOKEN"], env={"NCCL_DEBUG": "INFO", "X": "a b; `touch x` | y $$z"}),
}


def bundle_files(spec: Path | dict[str, Any], tmp: Path) -> tuple[dict[str, str], Any]:
    if isinstance(spec, dict):
        tmp.mkdir(parents=True, exist_ok=True)
        path = tmp / "spec.yaml"
        path.write_text(json.dumps(spec))
        spec = path
    ir = compile_spec(spec, CATALOG, display=spec.name, source=spec.name, targets=["skypilot"])
    return {f.path: f.text for f in render("skypilot", ir).files}, ir


def test_skypilots_own_parser_loads_every_task(tmp_path: Path) -> None:
    if not SKY_PYTHON.exists():
        message = "SkyPilot is not installed in .cache/sky (dev/test.sh installs it)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    folders = []
    for i, (name, spec) in enumerate(VARIANTS.items()):
        files, ir = bundle_files(spec or EXAMPLE, tmp_path / f"s{i}" if spec else tmp_path)
        folder = tmp_path / f"bundle{i}"
        for rel, text in files.items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(text)
        folders.append((name, folder, ir))
    # one process for every task: sky.Task.from_yaml validates against SkyPilot's schema, offline
    code = """
import json, os, sys
import sky
out = []
for folder in sys.argv[1:]:
    os.chdir(folder)
    task = sky.Task.from_yaml("task.yaml")
    (resources,) = task.resources
    out.append({"nodes": task.num_nodes, "accelerators": resources.accelerators, "spot": resources.use_spot,
                "image": resources.image_id, "envs": task.envs,
                "secrets": sorted(r.name for r in task.managed_secret_refs),  # null: from `--secret` at launch
                "storage": sorted(task.storage_mounts), "mounts": task.file_mounts,
                "recovery": resources.job_recovery})
print(json.dumps(out))
"""
    result = subprocess.run([str(SKY_PYTHON), "-c", code, *(str(f) for _, f, _ in folders)], capture_output=True,
                            text=True, timeout=300, env={**os.environ, "HOME": str(tmp_path / "home")})
    assert result.returncode == 0, result.stderr[-3000:]
    for (name, folder, ir), task in zip(folders, json.loads(result.stdout)):
        assert task["nodes"] == ir.nodes, name
        assert task["accelerators"] == {ir.gpu_type: ir.gpus_per_node}, name
        assert task["image"] == {"null": f"docker:{ir.part('skypilot').image}"} or \
            list(task["image"].values()) == [f"docker:{ir.part('skypilot').image}"], name
        assert task["secrets"] == sorted(ir.secrets), name
        assert {e.name: e.value.display for e in ir.env}.items() <= task["envs"].items(), name
        assert task["mounts"] == {"/opt/verlc/verlc_job": "./verlc_job"}, name
        assert task["storage"] == sorted(b.path for b in ir.part("skypilot").buckets), name
        assert (task["recovery"] or {}).get("strategy") == ir.part("skypilot").recovery, name


def test_the_example_task() -> None:
    files, ir = bundle_files(EXAMPLE, Path("."))
    task = yaml.safe_load(files["task.yaml"])
    assert task["resources"] == {"accelerators": "H100:8", "image_id": "docker:verlai/verl:vllm024.latest",
                                 "use_spot": True, "job_recovery": {"strategy": "EAGER_NEXT_REGION",
                                                                    "max_restarts_on_errors": 1}}
    assert task["secrets"] == {"WANDB_API_KEY": None}  # a name: the value comes from `--secret` at launch
    assert task["file_mounts"]["/checkpoints"] == {"source": "s3://my-verl-bucket/checkpoints",
                                                   "mode": "MOUNT_CACHED"}
    assert json.loads(files["verlc_job/job.json"])["checkpoint_dir"] == ["/checkpoints/verl_grpo_example_gsm8k/qwen2-7b"]
    assert "  run: |" not in files["task.yaml"] and "\nrun: |\n  # Runs on every node" in files["task.yaml"]


def test_run_and_launch_scripts_are_shellcheck_clean(tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck")
    for i, spec in enumerate(VARIANTS.values()):
        files, _ = bundle_files(spec or EXAMPLE, tmp_path)
        run = tmp_path / f"run{i}.sh"
        run.write_text("#!/usr/bin/env bash\n" + yaml.safe_load(files["task.yaml"])["run"])
        launch = tmp_path / f"launch{i}.sh"
        launch.write_text(files["launch.sh"])
        result = subprocess.run([shellcheck, "--severity=style", str(run), str(launch)], capture_output=True,
                                text=True)
        assert result.returncode == 0, result.stdout


FAKE_RAY = r'''#!{python}
import json, os, signal, sys, time
with open(os.environ["VERLC_RECORD"], "a") as fh:
    fh.write(json.dumps(["ray", *sys.argv[1:]]) + "\n")
def stopped(*_):
    with open(os.environ["VERLC_RECORD"], "a") as fh:
        fh.write(json.dumps(["ray stopped by", "TERM"]) + "\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stopped)
while True:
    time.sleep(0.1)
'''
FAKE_PYTHON = r'''#!{python}
import json, os, sys, time
deadline = time.time() + 20
while '"--head"' not in open(os.environ["VERLC_RECORD"]).read() and time.time() < deadline:
    time.sleep(0.05)  # as the real job waits for its cluster: the head's Ray has started
time.sleep(0.3)
with open(os.environ["VERLC_RECORD"], "a") as fh:
    fh.write(json.dumps(["python3", *sys.argv[1:], os.environ.get("RAY_ADDRESS", ""), os.getcwd()]) + "\n")
sys.exit(3)
'''


def test_the_head_runs_the_job_and_stops_only_its_own_ray(tmp_path: Path) -> None:
    files, _ = bundle_files(VARIANTS["sweep of 2, volumes, infra"], tmp_path)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ray", FAKE_RAY), ("python3", FAKE_PYTHON)):
        (bin_dir / name).write_text(text.replace("{python}", sys.executable))
        (bin_dir / name).chmod(0o755)
    workdir = tmp_path / "workspace" / "verl"
    workdir.mkdir(parents=True)
    run = yaml.safe_load(files["task.yaml"])["run"].replace("cd /workspace/verl", f"cd {workdir}")
    record = tmp_path / "record.jsonl"
    record.touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "VERLC_RECORD": str(record),
           "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NUM_GPUS_PER_NODE": "4",
           "VERLC_VARIANT": "1"}
    result = subprocess.run(["bash", "-c", run], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 3 and "verlc: exit code 3" in result.stdout, result.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls[0] == ["ray", "start", "--head", "--block", "--port=6379", "--num-gpus=4", "--dashboard-host=127.0.0.1",
                        "--dashboard-port=8280", "--disable-usage-stats"]
    job = next(c for c in calls if c[0] == "python3")
    assert job == ["python3", "-m", "verlc_job", "job", "1", "127.0.0.1:6379", str(workdir)]
    assert calls[-1] == ["ray stopped by", "TERM"]  # its own Ray, by process group; never `ray stop`
    assert not any(c[:2] == ["ray", "stop"] for c in calls)


def problems(tmp: Path, spec: dict[str, Any]) -> list[str]:
    return kube_problems(tmp, spec, "skypilot")


def test_a_recovery_that_would_lose_checkpoints_is_refused(tmp_path: Path) -> None:
    lost = base(skypilot={"buckets": [{"source": "s3://b/data", "mount": "/data"}]})
    assert problems(tmp_path, lost) == [
        "verl.trainer.default_local_dir: skypilot.recovery EAGER_NEXT_REGION restarts the job on new nodes (or set "
        "recovery: off): the checkpoints must be on a skypilot.buckets or skypilot.volumes mount (/ckpt/run is not "
        "under any of them); set trainer.default_local_dir under one"]
    assert problems(tmp_path, base(skypilot={"recovery": "off"})) == []
    assert problems(tmp_path, base(skypilot={"volumes": [{"name": "v", "mount": "/ckpt"}]})) == []
    no_gpu = base()
    del no_gpu["cluster"]["gpu_type"]
    assert problems(tmp_path, no_gpu) == [
        "cluster: the skypilot target asks for GPUs by model: set cluster.gpu_type (SkyPilot's accelerator name, "
        "e.g. H100, A100-80GB, MI300X)"]
    bad = base(skypilot={"buckets": [{"source": "ftp://x/y", "mount": "/ckpt"}]})
    assert problems(tmp_path, bad)[0].startswith("skypilot.buckets[0].source: 'ftp://x/y' is not a bucket URL")


SKY = r'''#!{python}
import json, os, sys
with open(os.environ["VERLC_RECORD"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[:2] == ["jobs", "queue"]:
    name = open(os.environ["VERLC_RECORD"]).read().split('"--name", "')[1].split('"')[0]
    print(json.dumps([{"job_id": 6, "job_name": "other", "status": "RUNNING"},
                      {"job_id": 7, "job_name": name, "status": os.environ["VERLC_SKY_STATUS"], "recovery_count": 2}]))
elif args[:2] == ["jobs", "logs"]:
    print("verlc: stage preflight done")
'''


def test_lifecycle_runs_sky(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sky").write_text(SKY.replace("{python}", sys.executable))
    (bin_dir / "sky").chmod(0o755)
    record = tmp_path / "record.jsonl"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VERLC_RECORD": str(record), "WANDB_API_KEY": "secret-value",
           "VERLC_SKY_STATUS": "RECOVERING"}
    work = tmp_path / "work"  # the ledger (runs.jsonl) goes beside a spec outside git
    work.mkdir()
    (work / EXAMPLE.name).write_text(EXAMPLE.read_text())

    def verlc(*args: str, **extra: str) -> Any:
        return run_verlc(*args, cwd=work, env={**env, **extra})

    submitted = verlc("submit", EXAMPLE.name, "--target", "skypilot")
    assert submitted.returncode == 0, submitted.stderr
    launch = json.loads(record.read_text().splitlines()[0])
    job = launch[launch.index("--name") + 1]
    assert job.startswith("qwen2-7b-grpo-k8s-cloud-") and launch == [
        "jobs", "launch", "--name", job, "--yes", "--detach-run", "--env", "VERLC_STOP_AFTER=train",
        "--secret", "WANDB_API_KEY", "--env", f"WANDB_RUN_ID={job}", "--env", "WANDB_RESUME=allow", "task.yaml"]
    # the managed job's name is its W&B run id, which its recoveries (the same job, relaunched) keep
    [run] = ledger.fold(work / ledger.FILE).values()
    assert run.run == run.submitted["tracker_run"] == job
    assert "secret-value" not in record.read_text()
    status = verlc("status", job)
    assert status.stdout.startswith(f"{job}: recovering, 2 restart(s)"), status.stdout + status.stderr
    assert "verlc: stage preflight done" in verlc("logs", job).stdout
    assert verlc("cancel", job).returncode == 0
    done = verlc("status", job, VERLC_SKY_STATUS="CANCELLED")
    assert done.stdout.startswith(f"{job}: cancelled"), done.stdout + done.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    queue = ["jobs", "queue", "--output", "json"]
    logs = ["jobs", "logs", "--name", job, "--no-follow"]
    # once it has ended, its log is read once more: the timeline the ledger keeps (#56)
    assert calls[1:] == [queue, logs, ["jobs", "cancel", "--yes", "--name", job], queue, queue, logs]


def test_the_gpu_model_is_used_by_every_target_that_can_use_it(tmp_path: Path) -> None:
    spec = base(cluster={"nodes": 2, "gpus_per_node": 4, "gpu_type": "H100", "slurm": {"cpus_per_task": 8}},
                kubernetes={"volumes": [{"claim": "ckpt", "mount": "/ckpt"}],  # a node label holds the product name
                            "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}})
    spec["targets"] = ["slurm", "kuberay", "skypilot"]

    def files() -> dict[str, str]:
        path = tmp_path / "spec.yaml"
        path.write_text(json.dumps(spec))
        ir = compile_spec(path, CATALOG, display="spec.yaml", source="spec.yaml", targets=["all"])
        return {f"{t}/{f.path}": f.text for t in ir.targets for f in render(t, ir).files}

    typed = files()
    assert "#SBATCH --gpus-per-node=H100:4\n" in typed["slurm/sbatch.sh"]  # Slurm's typed GRES
    job = yaml.safe_load(typed["kuberay/rayjob.yaml"])
    assert job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert yaml.safe_load(typed["skypilot/task.yaml"])["resources"]["accelerators"] == "H100:4"
    del spec["cluster"]["gpu_type"]
    del spec["kubernetes"]["node_selector"]
    spec["targets"] = ["slurm", "kuberay"]
    plain = files()
    assert "#SBATCH --gpus-per-node=4\n" in plain["slurm/sbatch.sh"] and "nodeSelector" not in plain["kuberay/rayjob.yaml"]


def test_the_runs_code_is_skypilots_workdir(tmp_path: Path) -> None:
    """With a code folder the nodes run in ~/sky_workdir, which SkyPilot syncs from the folder launch.sh passes
    as --workdir (resolved where it is run, before it changes folder); the real CLI takes that option."""
    from test_programs import code_repo

    shellcheck = require_tool("shellcheck")
    code_repo(tmp_path / "s" / "code")
    files, ir = bundle_files(base(code="code"), tmp_path / "s")
    run = yaml.safe_load(files["task.yaml"])["run"]
    assert 'cd "$HOME/sky_workdir"' in run and f"cd {ir.part('skypilot').workdir}" not in run
    launch = files["launch.sh"]
    assert launch.index("workdir=$(cd -- code && pwd)") < launch.index('cd "$(dirname "${BASH_SOURCE[0]}")"')
    assert '--workdir "$workdir"' in launch
    for name, text in (("run.sh", "#!/usr/bin/env bash\n" + run), ("launch.sh", launch)):
        (tmp_path / name).write_text(text)
    result = subprocess.run([shellcheck, "--severity=style", str(tmp_path / "run.sh"), str(tmp_path / "launch.sh")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    if not SKY_PYTHON.exists():
        message = "SkyPilot is not installed in .cache/sky (dev/test.sh installs it)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    helped = subprocess.run([str(SKY_PYTHON.parent / "sky"), "jobs", "launch", "--help"], capture_output=True,
                            text=True, timeout=120, env={**os.environ, "HOME": str(tmp_path / "home")})
    assert helped.returncode == 0 and "--workdir" in helped.stdout and "--env" in helped.stdout, helped.stderr[-2000:]
