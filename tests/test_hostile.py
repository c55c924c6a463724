"""Hostile strings in every string field of a spec, for every target.

Each value is either refused with clean `file:line:col: path: message` lines, or it reaches the
generated files only as data: the scripts parse, and RUNNING them with every external command
(srun, scontrol, docker, ray, python3, ...) replaced by a recorder yields exactly the argv the
IR intended, while the payloads (which would create a marker file) never execute.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import IN_CI, require_tool
from test_compose import compose_binary
from verlc.compiler.diagnostics import SpecError
from verlc.compiler.ir import JobIR
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.targets import render
from verlc.targets.bundle import Bundle
from verlc.targets.slurm.view import STEP_LOCK_IN_CONTAINER

MARKER = Path("/tmp/verlc-hostile-marker")  # every payload tries to create this file
PAYLOADS = [
    f"$(touch {MARKER})", f"`touch {MARKER}`", f"x; touch {MARKER}", f"x && touch {MARKER}",
    f"x | touch {MARKER}", f"x\ntouch {MARKER}", f"x'; touch {MARKER}; '", f'x"; touch {MARKER}; "',
    f"${{IFS}}touch${{IFS}}{MARKER}", "*", "/*", "?", "[a-z]*", "-rf", "--help", "-", "~root",
    "$HOME", "${HOME}", "$$", "\\", "'", '"', "%j", "${PATH:0:1}", "{a,b}", "!!", "#comment",
    "日本語-ünïcødé-🚀", "a b\tc", "x" * 5000, " leading-space", "trailing\\", "=", "a=b", ":",
]
BASE: dict[str, Any] = {
    "name": "hostile",
    "project": "p",
    "experiment": "e",
    "model": "org/model",
    "data": {"prepare": [{"dataset": "gsm8k", "dir": "data/gsm8k", "script": "prep.py"}],
             "train_files": ["data/train.parquet"], "val_files": ["data/test.parquet"]},
    "verl": {"actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 4},
                                   "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4}},
             "critic": {"ppo_micro_batch_size_per_gpu": 4}, "data": {"prompt_key": "prompt"}},
    "cluster": {"nodes": 2, "gpus_per_node": 8,
                "slurm": {"cpus_per_task": 4, "partition": "gpu", "output": "slurm-%j.out", "modules": ["cuda"],
                          "npu_gres": "npu", "mail_type": ["END"], "mail_user": "me@lab.example"}},
    "container": {"runtime": "docker", "image": "img:1", "workdir": "/w", "mounts": ["/a:/b"],
                  "run_args": ["--privileged"], "build": {"dockerfile": "Dockerfile", "context": "."}},
    "network": {"head_interface": "eth0"},
    "env": {"SOME_VAR": "v"},
    "secrets": ["WANDB_API_KEY"],
    "ray": {"address": "http://head:8265", "working_dir": "."},
    "targets": ["slurm", "ray-job", "compose"],
}
SCRIPT_TARGETS = ("slurm", "ray-job", "compose")
# Every string field of the spec, as a path into BASE.
FIELDS: list[tuple[str | int, ...]] = [
    ("name",), ("project",), ("experiment",), ("model",), ("data", "prepare", 0, "dir"),
    ("data", "prepare", 0, "script"), ("data", "train_files", 0), ("data", "val_files", 0),
    ("verl", "data", "prompt_key"), ("cluster", "slurm", "partition"), ("cluster", "slurm", "output"),
    ("cluster", "slurm", "modules", 0), ("cluster", "slurm", "npu_gres"), ("cluster", "slurm", "mail_type", 0),
    ("cluster", "slurm", "mail_user"), ("container", "image"), ("container", "workdir"),
    ("container", "mounts", 0), ("container", "run_args", 0), ("container", "build", "dockerfile"),
    ("network", "head_interface"), ("env", "SOME_VAR"), ("secrets", 0), ("ray", "address"),
    ("ray", "working_dir"),
]
DIAGNOSTIC = re.compile(r"spec\.yaml:\d+:\d+: \S+: \S.*")


def with_value(path: tuple[str | int, ...], value: str) -> dict[str, Any]:
    spec = copy.deepcopy(BASE)
    node: Any = spec
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return spec


def build(tmp: Path, spec: dict[str, Any], targets: tuple[str, ...] = SCRIPT_TARGETS
          ) -> tuple[JobIR, list[Bundle]] | list[str]:
    """Compile for these targets; the diagnostics when refused."""
    path = tmp / "spec.yaml"
    path.write_text(json.dumps(spec, ensure_ascii=False))  # JSON is YAML
    try:
        ir = compile_spec(path, CATALOG, display="spec.yaml", source="spec.yaml", targets=targets)
    except SpecError as exc:
        return [str(d) for d in exc.diagnostics]
    return ir, [render(name, ir) for name in targets]


def assert_clean_refusal(problems: list[str]) -> None:
    assert problems
    for line in problems:
        assert DIAGNOSTIC.fullmatch(line), line
        assert "Traceback" not in line


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(FIELDS),
       value=st.one_of(st.sampled_from(PAYLOADS),
                       st.text(st.sampled_from("$`'\"\\;&|*?[]{}()<>!#~ \t\n-=:,%@^日ü🚀xa0"), max_size=40)))
def test_every_value_is_refused_cleanly_or_stays_data(tmp_path: Path, field: tuple[str | int, ...],
                                                      value: str) -> None:
    result = build(tmp_path, with_value(field, value))
    if isinstance(result, list):
        assert_clean_refusal(result)
        return
    _, bundles = result
    for bundle in bundles:
        for f in bundle.files:
            if f.path.endswith(".sh"):
                check = subprocess.run(["bash", "-n"], input=f.text, capture_output=True, text=True)
                assert check.returncode == 0, f"{bundle.folder}/{f.path}: {check.stderr}"
            if f.path.endswith(".json"):
                json.loads(f.text)


# ---- running the generated scripts against recorders -----------------------------------------

RECORDER = r'''#!{python} -SE
"""Stands in for an external command: appends its argv to $VERLC_RECORD, then plays its part."""
import json, os, sys, time
name = os.path.basename(sys.argv[0])
args = sys.argv[1:]
with open(os.environ["VERLC_RECORD"], "a", encoding="utf-8") as fh:
    fh.write(json.dumps([name, *args]) + "\n")
if "-" in args or (name == "python3" and args[:1] == ["-"]):
    sys.stdin.read()  # the embedded helper; it is tested on its own
if "ray-logs" in args:  # the helper's tar stream of Ray's logs (here: only its note), which the node waits for
    import io, tarfile
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        note = tarfile.TarInfo("TRUNCATED.txt")
        note.size = len(b"nothing was cut\n")
        tar.addfile(note, io.BytesIO(b"nothing was cut\n"))
if name == "srun":  # one task per node, like Slurm: the commands inside are recorded too
    import signal, subprocess
    rest = [a for a in args]
    while rest and rest[0].startswith("-"):
        rest.pop(0)
    nodes = next(a.split("=", 1)[1] for a in args if a.startswith("--nodelist=")).split(",")
    tasks = [subprocess.Popen(rest, start_new_session=True, env=dict(os.environ, SLURMD_NODENAME=node, SLURM_PROCID=str(i)))
             for i, node in enumerate(nodes)] if rest else []
    def forward(signum, frame):  # Slurm signals every process of the step, not only the task
        for task in tasks:
            try:
                os.killpg(task.pid, signum)
            except ProcessLookupError:
                pass
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    sys.exit(max([task.wait() for task in tasks], default=0))
if name == "scontrol" and args[:2] == ["show", "hostnames"]:
    print("n1\nn2")
elif name == "hostname":
    print("127.0.0.1")
elif name == "ip":
    print("2: eth0    inet 10.0.0.5/24 scope global eth0")
elif "--block" in args or args[:1] == ["run"]:  # `ray start --block`, `docker run`: until the cleanup stops them
    time.sleep(60)
elif name == "python3" and args[:1] != ["-"] and "verl.trainer.main_ppo" not in args \
        and not any(a.endswith("/upload_size.py") for a in args):
    os.execv({python!r}, [{python!r}, *args])  # submit.sh's runtime-env merge: the real thing
'''
COMMANDS = ("srun", "scontrol", "docker", "podman", "apptainer", "ray", "python3", "hostname", "ip", "module")


@pytest.fixture(scope="module")
def fake_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fake-bin")
    for command in COMMANDS:
        (folder / command).write_text(RECORDER.format(python=sys.executable))
        (folder / command).chmod(0o755)
    return folder


def run_script(bundle_dir: Path, script: str, fake_bin: Path, tmp: Path, job: int = 4242) -> list[list[str]]:
    """Run a bundle's script with every external command recorded; `job` is the Slurm job id it sees (a job's
    own files, e.g. its step lock, are named by it)."""
    record = tmp / "record.jsonl"
    record.unlink(missing_ok=True)
    env = {"PATH": f"{fake_bin}:/usr/bin:/bin", "HOME": str(tmp), "VERLC_RECORD": str(record),
           "SLURM_JOB_ID": str(job), "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2",
           "SLURM_SUBMIT_DIR": str(tmp), "WANDB_API_KEY": "k", "RAY_ADDRESS": "http://127.0.0.1:8265"}
    result = subprocess.run(["bash", str(bundle_dir / script)], cwd=tmp, env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, f"{script}: {result.stdout[-3000:]}{result.stderr[-3000:]}"
    return [json.loads(line) for line in record.read_text().splitlines()]


def write(bundle: Bundle, root: Path) -> Path:
    folder = root / bundle.folder
    for f in bundle.files:
        (folder / f.path).parent.mkdir(parents=True, exist_ok=True)
        (folder / f.path).write_text(f.text)
    return folder


CASES = [(field, payload) for payload in PAYLOADS[:8] for field in
         (("project",), ("data", "train_files", 0), ("env", "SOME_VAR"), ("container", "mounts", 0))]
CASES += [(field, f"$(touch {MARKER})") for field in FIELDS]


def recorded_case(root: Path, fake_bin: Path, job: int, field: tuple[str | int, ...], value: str) -> dict[str, Any]:
    """One case's build, and where it builds: each script's shellcheck, the recorders' argv of the Slurm and
    ray-job scripts, and Compose's reading of its file."""
    root.mkdir()
    result = build(root, with_value(field, value))
    if isinstance(result, list):
        return {"refused": result}
    ir, bundles = result
    shellcheck = require_tool("shellcheck")
    by_target = {b.target: write(b, root / "out") for b in bundles}
    # SC2016 ("$(...) does not expand in single quotes") and SC1003 ("want to escape a single quote?") guess
    # at intent from literal text in single quotes; for a payload, literal is the point. The example bundles
    # are checked with every rule (test_examples.py).
    lint = [subprocess.run([shellcheck, "--exclude=SC2016,SC1003", str(script)], capture_output=True, text=True)
            for folder in by_target.values() for script in folder.glob("*.sh")]
    compose = subprocess.run([compose_binary(), "-f", "compose.yaml", "config", "--format", "json"],
                             cwd=by_target["compose"], capture_output=True, text=True, env={**os.environ})
    return {"ir": ir, "lint": lint, "compose": compose, "by_target": by_target,
            "slurm": run_script(by_target["slurm"], "sbatch.sh", fake_bin, root, job),
            "ray-job": run_script(by_target["ray-job"], "submit.sh", fake_bin, root)}


def case_id(field: tuple[str | int, ...], value: str) -> str:
    return f"{'.'.join(map(str, field))}={value[:12]!r}"


@pytest.fixture(scope="module")
def recorded(fake_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple, dict[str, Any] | BaseException]:
    """Every case, side by side: the scripts mostly wait (their polling, the cleanup's), so eight at a time.
    A payload that ran leaves the marker; the cases are then run one at a time to name the one that did."""
    MARKER.unlink(missing_ok=True)
    root = tmp_path_factory.mktemp("recorded")

    def one(n: int, field: tuple[str | int, ...], value: str, where: str) -> dict[str, Any] | BaseException:
        try:
            return recorded_case(root / f"{where}{n}", fake_bin, 4242 + n, field, value)
        except (AssertionError, subprocess.TimeoutExpired, pytest.fail.Exception) as stopped:
            return stopped

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda c: one(c[0], *c[1], "case"), enumerate(CASES)))
    found = dict(zip(CASES, results))
    if MARKER.exists():
        for n, case in enumerate(CASES):
            MARKER.unlink(missing_ok=True)
            one(n, *case, "again")
            if MARKER.exists():
                found[case] = AssertionError("a payload was executed")
    return found


@pytest.mark.parametrize(("field", "value"), CASES, ids=[case_id(f, v) for f, v in CASES])
def test_scripts_run_with_recorders_pass_exactly_the_intended_argv(recorded: dict[tuple, Any],
                                                                   field: tuple[str | int, ...], value: str) -> None:
    found = recorded[(field, value)]
    if isinstance(found, BaseException):
        raise found
    if "refused" in found:
        assert_clean_refusal(found["refused"])
        return
    ir, by_target = found["ir"], found["by_target"]
    for lint in found["lint"]:
        assert lint.returncode == 0, lint.stdout

    jobs = [c for c in found["slurm"] if "--json" in c]  # the runtime's job step on the head node
    assert len(jobs) == 2  # srun's own argv, then the command it runs (docker exec ...)
    argv = jobs[-1]
    assert argv[argv.index("python3"):argv.index("--json")] == ["python3", "-", "job", "--begun", "ray"]
    assert json.loads(argv[argv.index("--json") + 1])["train"] == list(ir.trainer_argv)
    assert argv[argv.index("env") + 1].startswith("RAY_ADDRESS=10.0.0.5:")
    starts = [c for c in found["slurm"] if c[:2] == ["docker", "run"]]
    assert len(starts) == 2  # one container per node
    assert starts[0][-4:] == [ir.container.image.display if "$" not in ir.container.image.display
                              else starts[0][-4], "flock", STEP_LOCK_IN_CONTAINER, "true"]

    submit = next(c for c in found["ray-job"] if c[:3] == ["ray", "job", "submit"])
    assert submit[submit.index("--") + 1:] == ["python3", "-m", "verlc_job", "job"]
    job = json.loads((by_target["ray-job"] / "verlc_job" / "job.json").read_text())
    assert job["train"] == list(ir.trainer_argv)

    compose = found["compose"]
    assert compose.returncode == 0, compose.stderr
    trainer_env = json.loads(compose.stdout)["services"]["ray-head"]["environment"]
    for e in ir.env:
        expected = e.value.display.replace("${HOME}", os.environ["HOME"]).replace("${USER}", os.environ.get("USER", ""))
        assert trainer_env[e.name] == expected


def test_recorders_would_see_an_executed_payload(tmp_path: Path, fake_bin: Path) -> None:
    """The marker check is not vacuous: an unquoted value in a script does create it."""
    MARKER.unlink(missing_ok=True)
    (tmp_path / "bad.sh").write_text(f'#!/usr/bin/env bash\nvalue="$(printf %s \'$(touch {MARKER})\')"\n'
                                     'eval "echo $value"\n')
    subprocess.run(["bash", str(tmp_path / "bad.sh")], capture_output=True, timeout=30)
    assert MARKER.exists()
    MARKER.unlink()


def test_secret_values_never_reach_a_bundle(tmp_path: Path) -> None:
    planted = {"WANDB_API_KEY": "wandb-planted-0123456789", "HF_TOKEN": "hf-planted-9876543210"}
    spec = with_value(("secrets", 0), "WANDB_API_KEY")
    spec["secrets"] = list(planted)
    (tmp_path / "spec.yaml").write_text(json.dumps(spec))
    out = tmp_path / "out"
    env = {**os.environ, **planted}
    result = subprocess.run([sys.executable, "-m", "verlc", "build", "spec.yaml", "--target", "all", "--out", str(out)],
                            cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 10
    for path in files:
        text = path.read_text()
        for name, value in planted.items():
            assert value not in text, f"{path} holds {name}'s value"
    sbatch = (out / "hostile" / "slurm" / "sbatch.sh").read_text()
    assert "--env WANDB_API_KEY\n" in sbatch and "--env HF_TOKEN\n" in sbatch  # passed by name


# ---- the kuberay and skypilot targets: payloads stay data in their YAML and in SkyPilot's `run` -------

CLOUD = {**copy.deepcopy(BASE), "targets": ["kuberay", "skypilot"],
         "cluster": {"nodes": 2, "gpus_per_node": 8, "gpu_type": "H100"},
         "kubernetes": {"secret": "keys", "volumes": [{"claim": "ckpt", "mount": "/ckpt"}],
                        "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
         "skypilot": {"buckets": [{"source": "s3://bucket/ckpt", "mount": "/ckpt"}]}}
CLOUD["verl"] = {**CLOUD["verl"], "trainer": {"default_local_dir": "/ckpt/run"}}
CLOUD_FIELDS = [("name",), ("project",), ("experiment",), ("model",), ("data", "train_files", 0),
                ("verl", "data", "prompt_key"), ("container", "image"), ("container", "workdir"),
                ("env", "SOME_VAR"), ("secrets", 0)]
CLOUD_CASES = [(field, payload) for payload in PAYLOADS for field in CLOUD_FIELDS]
FAKE = """#!{python}
import json, os, sys
with open(os.environ["VERLC_RECORD"], "a") as fh:
    fh.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""


def test_cloud_payloads_are_refused_cleanly_or_stay_data(tmp_path: Path) -> None:
    """Every payload in every field that reaches a RayJob, its ConfigMap or a SkyPilot task: refused with
    positioned lines, or read back from the YAML exactly as given, and SkyPilot's `run` (with `cd`, `ray`
    and `python3` recorded) runs the job package with the intended argv and never the payload."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("ray", "python3", "setsid"):
        (bin_dir / name).write_text(FAKE.replace("{python}", sys.executable))
        (bin_dir / name).chmod(0o755)
    built = refused = 0
    for field, value in CLOUD_CASES:
        MARKER.unlink(missing_ok=True)
        spec = copy.deepcopy(CLOUD)
        node: Any = spec
        for part in field[:-1]:
            node = node[part]
        node[field[-1]] = value
        result = build(tmp_path, spec, ("kuberay", "skypilot"))
        if isinstance(result, list):
            assert_clean_refusal(result)
            refused += 1
            continue
        built += 1
        ir, bundles = result
        files = {f"{b.target}/{f.path}": f.text for b in bundles for f in b.files}
        jobs = list(yaml.safe_load_all(files["kuberay/rayjob.yaml"]))
        head = jobs[0]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in head["env"]}
        written = next(e.value.display for e in ir.env if e.name == "SOME_VAR")
        assert env["SOME_VAR"] == written.replace("$", "$$")  # Kubernetes reads $$ as $, and expands no $(...)
        assert head["image"] == ir.part("kuberay").image
        assert head["workingDir"] == ir.part("kuberay").workdir
        entrypoint = jobs[0]["spec"]["entrypoint"]
        assert shlex.split(entrypoint) == ["cd", ir.part("kuberay").workdir, "&&", "exec", "python3", "-m", "verlc_job",
                                           "job"]
        configmap = yaml.safe_load(files["kuberay/configmap.yaml"])
        assert json.loads(configmap["data"]["job.json"])["train"] == list(ir.trainer_argv)
        task = yaml.safe_load(files["skypilot/task.yaml"])
        assert task["envs"]["SOME_VAR"] == written
        assert task["resources"]["image_id"] == f"docker:{ir.part('skypilot').image}"
        record = tmp_path / "record.jsonl"
        record.unlink(missing_ok=True)
        run = ('cd() { python3 "cd" "$@"; }\n'  # the fake python3 records it; nothing changes directory
               + task["run"])
        result_run = subprocess.run(["bash", "-c", run], capture_output=True, text=True, timeout=60, env={
            "PATH": f"{bin_dir}:/usr/bin:/bin", "VERLC_RECORD": str(record), "SKYPILOT_NODE_RANK": "0",
            "SKYPILOT_NODE_IPS": "10.0.0.1", "SKYPILOT_NUM_GPUS_PER_NODE": "8", "HOME": str(tmp_path)})
        assert result_run.returncode == 0, result_run.stderr
        calls = [json.loads(line) for line in record.read_text().splitlines()]
        assert ["python3", "cd", ir.part("skypilot").workdir] in calls
        assert ["python3", "-m", "verlc_job", "job"] in calls
        assert not MARKER.exists(), f"{field}={value!r} was executed"
    assert built > 50 and refused > 10


def test_hand_edited_files_are_not_overwritten(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(json.dumps(BASE))
    def verlc(*args: str) -> subprocess.CompletedProcess[str]:  # noqa: E306
        return subprocess.run([sys.executable, "-m", "verlc", "build", "spec.yaml", "--target", "slurm", *args],
                              cwd=tmp_path, capture_output=True, text=True)
    assert verlc().returncode == 0
    script = tmp_path / "out" / "hostile" / "slurm" / "sbatch.sh"
    edited = script.read_text().replace("set -euo pipefail", "set -euo pipefail ", 1)
    script.write_text(edited)
    refused = verlc()
    assert refused.returncode == 2
    assert "sbatch.sh: edited by hand" in refused.stderr and "--force" in refused.stderr
    assert script.read_text() == edited
    assert verlc("--force").returncode == 0
    assert script.read_text() != edited


if not shutil.which("bash") and IN_CI:  # pragma: no cover - bash is the product's runtime
    pytest.fail("bash is required")
