"""The Slurm bundle's docker and podman paths for real: containers -> ray -> data -> preflight inside the
containers of two local Slurm nodes, and the cleanup that removes them.

dev/containers.sh builds the test image (Debian, Ray with its dashboard, verl) without a registry and keeps
podman's state in its own folder; `docker` is its podman shim on the job's PATH. Both nodes share this host
and one container store, so each node's container carries the node's name.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest

from conftest import EXAMPLE_BUNDLES, IN_CI, REPO, failing_first, rollout_engine_site, run_verlc
from test_slurm_e2e import (Ended, Job, build, ended, job_state, no_ray_left, sbatch, side_by_side,  # noqa: F401
                            slurm, submit, submitted, wait_for, write_fixtures)
from verlc.targets.slurm.view import STEP_LOCK_FILE

STATE = Path(os.environ.get("VERLC_CONTAINER_STATE", "/tmp/verlc-containers"))


@pytest.fixture(scope="module")
def engine() -> Iterator[dict[str, str]]:
    """The environment that points podman and the docker shim at dev/containers.sh's state and image."""
    built = subprocess.run(["bash", str(REPO / "dev" / "containers.sh"), "image"], capture_output=True,
                           text=True, timeout=1800)
    if built.returncode != 0:
        message = f"cannot build the test image:\n{built.stderr[-3000:]}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    exports = subprocess.run(["bash", str(REPO / "dev" / "containers.sh"), "env"], capture_output=True,
                             text=True, check=True).stdout
    env = dict(word.split("=", 1) for line in exports.splitlines() for word in shlex.split(line)[1:])
    env["PATH"] = f"{REPO / 'dev' / 'bin'}:/usr/bin:/bin:/usr/sbin:/sbin"
    env.pop("DOCKER_HOST")  # the jobs run podman directly; only Compose needs the API service
    yield env
    subprocess.run(["bash", str(REPO / "dev" / "containers.sh"), "release"], timeout=60)  # the store's mount


PODMAN_WITHOUT_GPUS = """#!/bin/bash
# No GPU here, and podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi (this machine's, which the
# tests leave alone): drop the CDI GPU device the bundle asks for, and say so in the job's log.
args=()
for a in "$@"; do
  if [[ $a == --device=nvidia.com/gpu=all ]]; then echo "test shim: dropped $a" >&2; continue; fi
  args+=("$a")
done
exec /usr/bin/podman "${args[@]}"
"""


def job_env(engine: dict[str, str], runtime: str, root: Path) -> dict[str, str]:
    """The submitting shell's environment: the engine's, plus for podman the GPU-less shim first on PATH."""
    if runtime == "docker":  # dev/bin/docker runs podman, which takes `--gpus all` and ignores it here
        return engine
    shim = root / "shim"
    shim.mkdir()
    (shim / "podman").write_text(PODMAN_WITHOUT_GPUS)
    (shim / "podman").chmod(0o755)
    return {**engine, "PATH": f"{shim}:{engine['PATH']}"}


def containers(env: dict[str, str], script: Path, job: str) -> list[str]:
    """The job's containers that still exist (running or not)."""
    listed = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True,
                            env={**os.environ, **env}, check=True).stdout
    return [name for name in listed.split() if name.startswith(f"verlc-{script.parent.parent.name}-{job}-")]


def left_of(env: dict[str, str], script: Path, job: str) -> list[str]:
    """What of the job is left on the cluster's nodes, in the end: its containers (running or not), its Ray
    processes (in a container, Ray runs in the node's network namespace, under the job's temp dir), and its
    step locks' files (the nodes share this host's /tmp)."""
    return containers(env, script, job) + no_ray_left(30, job) + sorted(glob.glob(f"/tmp/verlc-step-{job}-*.lock"))


def fake_bin(root: Path, *, ray_fails_on_node: int | None = None) -> Path:
    """Commands that go first on the containers' PATH: `ray start` fails on one node (by its place in
    the job, which names its Ray temp dir), and verl's trainer only prints its argv (no GPU here); the
    first run then waits to be preempted, a restarted one (SLURM_RESTART_COUNT > 0) exits 0."""
    folder = root / "bin"
    folder.mkdir()
    fail = (f'[[ $1 == start && " $* " == *"-{ray_fails_on_node} "* ]] && '
            f'{{ echo "test: ray start refused here" >&2; exit 1; }}\n') if ray_fails_on_node else ""
    (folder / "ray").write_text(f"#!/bin/bash\n{fail}exec /opt/venv/bin/ray \"$@\"\n")
    (folder / "python3").write_text("""#!/bin/bash
if [[ ${1:-} == -m && ${2:-} == verl.trainer.main_ppo ]]; then  # the trainer, not a mention of it
  echo "TRAINER restart=${SLURM_RESTART_COUNT:-0} wandb=${WANDB_RUN_ID:-}/${WANDB_RESUME:-} argv: $*"
  if [[ ${SLURM_RESTART_COUNT:-0} == 0 ]]; then sleep 600; fi
  exit 0
fi
exec /opt/venv/bin/python3 "$@"
""")
    for name in ("ray", "python3"):
        (folder / name).chmod(0o755)
    return folder


def mounts(root: Path) -> str:
    """The containers' mounts (a YAML flow list): the test's folder, and this venv's CPU torch, read-only, for
    the preflight's all-reduce. (The test image has no torch of its own: where podman falls back to its vfs
    driver, an image's whole tree is copied into every container, and torch would double that.)"""
    site = Path(sysconfig.get_paths()["purelib"])
    into = "/opt/venv/lib/python3.11/site-packages"  # the image's Python is 3.11, as this one must be
    assert sys.version_info[:2] == (3, 11), "torch's compiled parts must match the image's Python"
    torch = [site / "torch", site / "torchgen", site / "functorch", *site.glob("torch-*.dist-info"),
             *rollout_engine_site().glob("vllm-*.dist-info")]  # and the rollout engine the spec names
    return "[" + ", ".join([f"'{root}:{root}'", *(f"'{p}:{into}/{p.name}:ro'" for p in torch)]) + "]"


def container_spec(root: Path, runtime: str, env: dict[str, str], ray_fails_on_node: int | None = None,
                   pinned: bool = False) -> str:
    """The containers' section of the e2e spec; `pinned`: the test image by its digest, as reproducible wants."""
    path = f"{fake_bin(root, ray_fails_on_node=ray_fails_on_node)}:/opt/venv/bin:/usr/bin:/bin"
    image = env["VERLC_TEST_IMAGE"]
    if pinned:
        digest = subprocess.run(["podman", "images", "--digests", "--format", "{{.Digest}}", image], env=env,
                                capture_output=True, text=True, check=True).stdout.split()[0]
        image = f"{image.rsplit(':', 1)[0]}@{digest}"
    return (f"{{runtime: {runtime}, image: {json.dumps(image)}, workdir: {root}, shm_size: 1g, "
            f"mounts: {mounts(root)}, run_args: [--env, 'PATH={path}', --env, SLURM_RESTART_COUNT]}}")


REPRODUCIBLE = "reproducible: true\nverl_version: 0.9.1\n"


@side_by_side(lambda root, runtime, engine: Job(build(root, container=container_spec(root, runtime, engine)),
                                                env=job_env(engine, runtime, root)))
@pytest.mark.parametrize("runtime", ["docker", "podman"])
def test_bring_up_and_preflight_inside_containers_then_every_container_is_removed(
        ended: Ended, engine: dict[str, str], runtime: str) -> None:
    job, output, script = ended.job, ended.output, ended.script
    text = script.read_text()
    assert f"{runtime} run --rm" in text and f"{runtime} exec --interactive" in text
    assert ended.state == "COMPLETED", output
    if runtime == "podman":
        assert output.count("test shim: dropped --device=nvidia.com/gpu=all") == 2, output
    nodes = re.findall(r"node registered: (n\d+) ", output)
    assert len(nodes) == 2, output
    for node in nodes:
        assert f"starting container verlc-{script.parent.parent.name}-{job}-{node} on {node}" in output
        assert f"verlc: image on {node}: present\n" in output  # asked before the containers start (#56)
    assert "cluster ready: 2 nodes, 16 GPUs" in output
    assert "preflight passed: 2 nodes, 16 GPUs, 2 data files" in output
    assert ", all-reduce over 2 ranks on 2 nodes\n" in output
    run_dir = ended.root / "verlc-runs" / f"{script.parent.parent.name}-{job}"
    record = json.loads((run_dir / "run-record.json").read_text())
    assert all(n["python"].startswith("3.11") and n["packages"]["verl"] == "0.9.1" for n in record["nodes"])
    for node in nodes:  # Ray's logs left each container before it went
        assert (run_dir / "ray-logs" / node / "raylet.out").stat().st_size > 0, output
    assert containers(engine, script, job) == [], "the cleanup must remove every container"


@pytest.fixture(scope="module")
def sandbox_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An image of its own for a service (#55 item 1): the test image with the test's code sandbox in it, built
    here without a registry; removed after the module."""
    context = tmp_path_factory.mktemp("sandbox-image")
    shutil.copy(REPO / "tests" / "services" / "sandbox.py", context / "sandbox.py")
    (context / "Containerfile").write_text(f"FROM {engine['VERLC_TEST_IMAGE']}\nCOPY sandbox.py /opt/sandbox.py\n")
    tag = f"localhost/verlc-test-sandbox:{context.name}"
    subprocess.run(["podman", "build", "--quiet", "--tag", tag, str(context)], env={**os.environ, **engine},
                   check=True, capture_output=True, timeout=600)
    yield tag
    subprocess.run(["podman", "rmi", "--force", tag], env={**os.environ, **engine}, capture_output=True, timeout=120)


def image_service(image: str) -> str:
    """A spec's services: the code sandbox in its own image, reached with the run's token only."""
    return json.dumps({"sandbox": {
        "image": image, "command": ["/opt/venv/bin/python3", "/opt/sandbox.py", "--host", "${services.sandbox.host}",
                                    "--port", "${services.sandbox.port}", "--token-env",
                                    "VERLC_SERVICE_SANDBOX_TOKEN"],
        "ready": {"http": "/health", "deadline": "120s"}, "probe": {"kind": "sandbox"}}})


@side_by_side(lambda root, engine, sandbox_image: Job(build(
    root, container=container_spec(root, "podman", engine), extra=f"services: {image_service(sandbox_image)}\n"),
    env=job_env(engine, "podman", root)))
def test_a_service_in_an_image_of_its_own_runs_beside_the_bring_up_on_the_head_and_goes_with_the_job(
        ended: Ended, engine: dict[str, str], sandbox_image: str) -> None:
    """#55 item 1 on the local Slurm cluster with podman: the script starts the sandbox's own image in a step of
    its own on the head node as Ray comes up, at the head's address and the block's first service port, with a
    token made for the run that the runtime gets too (the sandbox answers only requests that carry it: the probe
    passes); its output is in the run folder; its container is gone with the job's."""
    job, output, script = ended.job, ended.output, ended.script
    assert ended.state == "COMPLETED", output
    head = re.search(r"; head (n\d+);", output)[1]
    at = re.search(rf"service sandbox: in its own image {re.escape(sandbox_image)}, started by the target on the "
                   rf"head node at http://(10\.77\.0\.\d+):(\d+)\n", output)
    assert at, output
    assert f"starting service sandbox in its own image on {head}" in output
    assert re.search(r"service sandbox: ready in [\d.]+s, sandbox probe passed", output), output
    assert "preflight passed: 2 nodes, 16 GPUs" in output
    run_dir = ended.root / "verlc-runs" / f"{script.parent.parent.name}-{job}"
    assert f"sandbox listening on {at[1]}:{at[2]}" in (run_dir / "services" / "sandbox.log").read_text()
    record = json.loads((run_dir / "run-record.json").read_text())
    assert record["services"]["sandbox"]["probe_passed"], record["services"]
    assert left_of(engine, script, job) == [], "the job's and the service's containers must be gone"


def missing_image_service() -> str:
    return json.dumps({"sandbox": {"image": "localhost/verlc-no-such-image:1", "ready": {"deadline": "20s"}}})


@side_by_side(lambda root, engine: Job(build(
    root, container=container_spec(root, "podman", engine), extra=f"services: {missing_image_service()}\n"),
    env=job_env(engine, "podman", root)))
def test_a_service_whose_image_is_not_there_fails_the_preflight_by_its_deadline_with_the_engines_words(
        ended: Ended, engine: dict[str, str]) -> None:
    """The service's own image cannot be had (not on the node, no registry answers): its container never starts,
    so the service is never ready; the job fails before training once its deadline has passed, naming the
    service, and shows the engine's own words from the service's log, with nothing of the job left."""
    job, output, script = ended.job, ended.output, ended.script
    assert ended.state == "FAILED", output
    assert re.search(r"service sandbox was not ready within 20s \(ready\.deadline\): nothing accepts a connection "
                     r"at 10\.77\.0\.\d+:\d+", output), output
    shown = [line for line in output.splitlines() if line.startswith("[service sandbox] ")]  # its log's last lines
    assert any("localhost/verlc-no-such-image" in line for line in shown), output
    assert "stage train" not in output and "TRAINER" not in output
    assert left_of(engine, script, job) == []


@side_by_side(lambda root, engine: Job(build(root, wait="300s", container=container_spec(
    root, "docker", engine, ray_fails_on_node=1)), env=engine))
def test_a_worker_whose_ray_fails_inside_its_container_fails_the_job_fast_and_is_named(
        ended: Ended, engine: dict[str, str]) -> None:
    output = ended.output
    assert ended.state == "FAILED", output
    assert "test: ray start refused here" in output
    assert re.search(r"Ray on n\d+ exited \(code 1\)", output), output
    assert "cluster ready" not in output
    assert left_of(engine, ended.script, ended.job) == []


def test_scancel_after_bring_up_removes_the_containers_and_keeps_rays_logs(slurm: None, engine: dict[str, str], tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    script = build(tmp_path, container=container_spec(tmp_path, "docker", engine))
    # Held at the start of the data stage: Ray runs in both containers, so both have logs to keep. (A cancel
    # while `ray start` has not yet begun on a node leaves nothing to keep there; the moments of bring-up
    # itself are the Slurm test's cancel-at-any-moment.)
    job = submit(script, tmp_path, "preflight", {**engine, "VERLC_PAUSE_AT": "data"})
    log = tmp_path / f"slurm-{job}.out"
    wait_for(lambda: log.exists() and "paused at data" in log.read_text(), 180, "bring-up to reach the data stage")
    # the running containers hold their step locks by the files' inodes: no file is left for a KILL to strand
    assert sorted(glob.glob(f"/tmp/verlc-step-{job}-*.lock")) == []
    subprocess.run(["scancel", job], check=True)
    wait_for(lambda: job_state(job) == "CANCELLED", 180, "the job to be cancelled")  # under load: minutes COMPLETING
    wait_for(lambda: "exit code 143" in log.read_text(), 120, "the cleanup trap to finish")
    # No job step can be started after scancel: the containers stop with their own step.
    wait_for(lambda: containers(engine, script, job) == [], 60, "the containers to be removed")
    assert left_of(engine, script, job) == []
    kept = tmp_path / "verlc-runs" / f"{script.parent.parent.name}-{job}" / "ray-logs"
    assert all((kept / node / "TRUNCATED.txt").exists() for node in ("n1", "n2")), log.read_text()


# `podman run` (behind `docker` too) as a signal finds it still creating the container: the engine's monitor
# (conmon) has already left the step's processes and starts the container a moment later, whatever happens to
# the step. Here a detached `podman run` starts 35 s after the shim marked that moment (creating-NODE), when
# Slurm's KillWait (30 s) has ended the whole step, and writes its exit code to created-NODE when it returns.
# The shim itself lives on through the signal, as the engine's command does while it creates, until the step's
# task has gone (the test cluster's process tracking would not end it once its parent is gone).
PODMAN_CREATING = PODMAN_WITHOUT_GPUS.replace('exec /usr/bin/podman "${args[@]}"', """\
if [[ ${args[0]:-} == run ]]; then
  trap '' TERM INT
  (setsid bash -c 'sleep 35; /usr/bin/podman "${@:2}"; echo $? >"$1"' run-later \\
    "$RACE_DIR/created-$SLURMD_NODENAME" "${args[@]}" </dev/null >/dev/null 2>&1 &)
  touch "$RACE_DIR/creating-$SLURMD_NODENAME"
  while kill -0 "$PPID" 2>/dev/null; do sleep 0.5; done
  exit 0
fi
exec /usr/bin/podman "${args[@]}"
""")


def test_a_cancel_while_the_containers_are_being_created_leaves_no_container(
        slurm: None, engine: dict[str, str], tmp_path: Path) -> None:
    """#42: scancel lands while `docker run` / `podman run` still creates each node's container, so the step's
    trap finds nothing to remove, and the container starts once the step is gone. It must end by itself then
    (its main process waits for the step's lock). The shim holds every node's run in that moment when the
    cancel comes, and starts the containers only once the step is gone, so the race is met every time: one job
    per engine, side by side. (Before the lock, the step's trap removed the container over and over for 26 s:
    a container that took longer to start, as it does under load, was left running.)"""
    jobs = {}
    for runtime in ("docker", "podman"):
        root = tmp_path / runtime
        root.mkdir()
        write_fixtures(root)
        script = build(root, container=container_spec(root, runtime, engine))
        (root / "shim").mkdir()
        (root / "shim" / "podman").write_text(PODMAN_CREATING)
        (root / "shim" / "podman").chmod(0o755)
        env = {**engine, "PATH": f"{root / 'shim'}:{engine['PATH']}", "RACE_DIR": str(root)}
        jobs[runtime] = (root, script, submit(script, root, "preflight", env))
    try:
        for runtime, (root, script, job) in jobs.items():
            wait_for(lambda: len(list(root.glob("creating-n*"))) == 2, 180, f"{runtime}: both nodes creating")
            subprocess.run(["scancel", job], check=True)
        for runtime, (root, script, job) in jobs.items():
            log = root / f"slurm-{job}.out"
            wait_for(lambda: "exit code 143" in log.read_text(), 120, f"{runtime}: the cleanup trap to finish")
            # each delayed run created its container after the step had gone, and returned once it ended
            wait_for(lambda: len(list(root.glob("created-n*"))) == 2, 240,
                     f"{runtime}: the containers started after the step had gone to end by themselves")
            codes = {p.name: p.read_text().strip() for p in root.glob("created-n*")}
            # the step locks' files stay, by design, for the runs that outlived the job (removed below)
            assert containers(engine, script, job) + no_ray_left(30, job) == [], (codes, log.read_text())
            assert set(codes.values()) == {"0"}, codes  # the containers did start, and ended on their own
    finally:
        for runtime, (root, script, job) in jobs.items():
            for name in containers(engine, script, job):  # only where the test failed
                subprocess.run(["podman", "rm", "--force", name], env={**os.environ, **engine}, capture_output=True)
            for node in (p.name.removeprefix("creating-") for p in root.glob("creating-n*")):  # left for the late run
                Path(STEP_LOCK_FILE.display.replace("${SLURM_JOB_ID}", job).replace("${SLURMD_NODENAME}", node)
                     ).unlink(missing_ok=True)


def test_preemption_requeues_into_new_containers_resumes_and_shows_the_restart_in_status_and_runs(
        slurm: None, engine: dict[str, str], tmp_path: Path) -> None:
    from test_lifecycle_e2e import runs_of, until_final, verlc

    write_fixtures(tmp_path)
    script = build(tmp_path, grace="60s", container=container_spec(tmp_path, "docker", engine, pinned=True),
                   extra=REPRODUCIBLE)
    assert "#SBATCH --signal=B:USR1@60" in script.read_text()
    assert verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", stop_after="train", env=engine).returncode == 0
    [run] = runs_of(tmp_path).values()
    wait_for(lambda: "TRAINER restart=0" in verlc(tmp_path, "logs", run.run).stdout, 240, "training to start")
    # What Slurm does ahead of preemption or the time limit, as asked by --signal=B:USR1@...
    subprocess.run(["scancel", "--signal=USR1", "--batch", run.job_id], check=True)
    wait_for(lambda: "TRAINER restart=1" in verlc(tmp_path, "logs", run.run).stdout, 600, "the requeued run",
             seen=lambda: failing_first(verlc(tmp_path, "logs", run.run).stdout))
    until_final(tmp_path, run.run, env=engine)
    final = runs_of(tmp_path)[run.run]
    assert (final.state, final.restarts) == ("COMPLETED", 1)
    assert "completed (1 restarts)" in verlc(tmp_path, "runs").stdout
    text = verlc(tmp_path, "logs", run.run).stdout
    # its wall time and GPU-hours count both attempts (#53 item 12): their spans in the log, not Slurm's times,
    # which are the second attempt's alone
    from verlc.lifecycle.progress import attempts_seconds
    [row] = json.loads(verlc(tmp_path, "runs", "--results", "--format", "json").stdout)
    took = attempts_seconds(text.splitlines())
    last = datetime.fromisoformat(final.ended_at[:-1]) - datetime.fromisoformat(final.started_at[:-1])
    assert took is not None and took > last.total_seconds() + 5, (took, last)
    assert row["gpu_hours"] == round(16 * took / 3600, 2), row
    assert "USR1: preemption or time limit ahead" in text and f"requeueing job {run.job_id}" in text
    assert "SLURM_RESTART_COUNT=1" in text
    restart = re.search(r"TRAINER restart=1 wandb=\S+ argv: (.*)", text)
    assert restart and "trainer.resume_mode=auto" in restart[1].split(), text
    assert f"trainer.default_local_dir=checkpoints/e2e/{run.name}" in restart[1]
    # both attempts report to the same W&B run (the variables verl's wandb.init reads), resumed, not new
    trackers = re.findall(r"TRAINER restart=(\d) wandb=(\S+) ", text)
    assert trackers == [("0", f"{run.name}-{run.job_id}/allow"), ("1", f"{run.name}-{run.job_id}/allow")], trackers
    # reproducible: the requeued attempt saw the inputs and versions of the first, so it went on
    assert "first run of a reproducible job" in text and "PREFLIGHT FAILED" not in text
    assert text.count("preflight passed: 2 nodes") == 2
    # each attempt ran in containers of its own, and none is left
    assert text.count(f"starting container verlc-{script.parent.parent.name}-{run.job_id}-n2 on n2") == 2
    assert left_of(engine, script, run.job_id) == []


def reproducible_first_run(root: Path, engine: dict[str, str]) -> Job:
    """A reproducible job's first run (to its preflight), its training data uncompressed to edit in place."""
    import pyarrow.parquet as pq

    train = root / "data" / "train.parquet"
    pq.write_table(pq.read_table(train), train, compression="none")  # its text as bytes
    return Job(build(root, container=container_spec(root, "docker", engine, pinned=True), extra=REPRODUCIBLE),
               env=engine)


@side_by_side(reproducible_first_run)
def test_a_reproducible_rerun_whose_data_changed_by_one_byte_stops_before_training_naming_the_file(
        ended: Ended, engine: dict[str, str]) -> None:
    assert ended.state == "COMPLETED" and "first run of a reproducible job" in ended.output, ended.output
    train, script = ended.root / "data" / "train.parquet", ended.script
    before = hashlib.sha256(train.read_bytes()).hexdigest()
    train.write_bytes(train.read_bytes().replace(b"1+1", b"1+2", 1))  # one byte, the same size
    job, output, state = sbatch(script, ended.root, "train", env=engine)
    assert state == "FAILED", output
    after = hashlib.sha256(train.read_bytes()).hexdigest()
    assert re.search(rf"PREFLIGHT FAILED: inputs: data data/train\.parquet sha256: {after}, but the first run "
                     rf"\(\S+/verlc-first-run\.json\) had {before}\n", output), output
    assert "stage train" not in output and "TRAINER" not in output
    assert left_of(engine, script, job) == []


# ---- compose: the real Docker Compose binary against podman's Docker API ---------------------------

@pytest.fixture(scope="module")
def podman_api(engine: dict[str, str]) -> Iterator[dict[str, str]]:
    """podman's Docker API service (dev/containers.sh start), stopped by pid after the module."""
    started = subprocess.run(["bash", str(REPO / "dev" / "containers.sh"), "start"], capture_output=True, text=True,
                             timeout=120)
    assert started.returncode == 0, started.stderr
    yield {**engine, "DOCKER_HOST": f"unix://{STATE / 'podman.sock'}"}
    subprocess.run(["bash", str(REPO / "dev" / "containers.sh"), "stop"], timeout=60)


def compose_up_then_down(bundle: Path, files: list[str], env: dict[str, str]
                         ) -> tuple[subprocess.CompletedProcess[str], dict[str, int], subprocess.CompletedProcess[str]]:
    """`up` until the head's job exits, then (always) `down --volumes`; with when each container started. Nothing
    runs podman's healthchecks (no systemd here): the bundle must not need them."""
    from test_compose import compose_binary

    compose = [compose_binary(), *(arg for f in files for arg in ("-f", f))]
    project = json.loads(subprocess.run([*compose, "config", "--format", "json"], cwd=bundle, env=env, check=True,
                                        capture_output=True, text=True).stdout)["name"]
    try:
        up = subprocess.run([*compose, "up", "--abort-on-container-exit", "--exit-code-from", "ray-head"],
                            cwd=bundle, env=env, capture_output=True, text=True, timeout=600)
    finally:
        listed = subprocess.run(["podman", "ps", "--all", "--filter", f"label=com.docker.compose.project={project}",
                                 "--format", "{{.Names}} {{.StartedAt}}"], env=env, capture_output=True,
                                text=True).stdout
        started = {name: int(at) for name, at in (line.split() for line in listed.splitlines())}
        down = subprocess.run([*compose, "down", "--volumes"], cwd=bundle, env=env, capture_output=True,
                              text=True, timeout=300)
        if down.returncode and "container not known" in down.stderr:
            # podman's API lists every network's containers, and one of another test's (the Slurm tests share the
            # podman store) was removed in between: its error, not Compose's; `down` again, still asserted on
            down = subprocess.run([*compose, "down", "--volumes"], cwd=bundle, env=env, capture_output=True,
                                  text=True, timeout=300)
    return up, started, down


def compose_spec(tmp_path: Path, engine: dict[str, str], env: str = "{}", trainer: str = "") -> None:
    """A 2-node CPU spec for the compose target over the test image and local fixtures; `trainer`: verl's
    trainer section (a YAML flow mapping's items)."""
    write_fixtures(tmp_path)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"""\
name: compose-e2e
project: e2e
model: {tmp_path}/model
data: {{train_files: [data/train.parquet], val_files: [data/test.parquet]}}
verl: {{actor_rollout_ref: {{rollout: {{name: vllm, log_prob_micro_batch_size_per_gpu: 4}},
                            actor: {{ppo_micro_batch_size_per_gpu: 4}}}},
       critic: {{ppo_micro_batch_size_per_gpu: 4}}, trainer: {{{trainer}}}}}
cluster: {{nodes: 2, gpus_per_node: 8}}
container: {{runtime: docker, image: {json.dumps(engine['VERLC_TEST_IMAGE'])}, workdir: {tmp_path}, shm_size: 1g,
            mounts: {mounts(tmp_path)}}}
ray: {{wait_for_nodes: 180s}}
env: {env}
""")


def test_compose_bundle_comes_up_in_order_runs_to_the_preflight_and_down_leaves_nothing(
        engine: dict[str, str], podman_api: dict[str, str], tmp_path: Path) -> None:
    compose_spec(tmp_path, engine)
    built = run_verlc("build", tmp_path / "spec.yaml", "--target", "compose", "--out", tmp_path / "out")
    assert built.returncode == 0, built.stderr
    bundle = tmp_path / "out" / "compose-e2e" / "compose"
    env = {**os.environ, **podman_api, "VERLC_STOP_AFTER": "preflight"}
    up, started, down = compose_up_then_down(bundle, ["compose.yaml"], env)
    assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-2000:]
    log = up.stdout + up.stderr
    # Compose started the worker after the head, and it joined once the head's GCS answered: no healthcheck ran
    assert started["compose-e2e-ray-worker-1-1"] >= started["compose-e2e-ray-head-1"], started
    assert "verlc: cluster ready: 2 nodes, 16 GPUs" in log
    assert "verlc: preflight passed: 2 nodes, 16 GPUs, 2 data files" in log
    assert json.loads((bundle / "runs" / "run-record.json").read_text())["gpus"] == 16
    assert down.returncode == 0, down.stderr
    left = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], env=env, capture_output=True,
                          text=True, check=True).stdout
    volumes = subprocess.run(["podman", "volume", "ls", "--format", "{{.Name}}"], env=env, capture_output=True,
                             text=True, check=True).stdout
    assert "compose-e2e" not in left + volumes


def compose_verlc(root: Path, podman_api: dict[str, str]
                  ) -> tuple[dict[str, str], Callable[..., subprocess.CompletedProcess[str]]]:
    """verlc as a user runs it from `root` on a compose bundle: the real Compose binary as `docker-compose` on PATH
    (what the launcher runs), podman's API as the engine, stopping after the preflight; that environment (a test
    may change it between calls) and the runner."""
    from test_compose import compose_binary

    tools = root / "tools"
    tools.mkdir()
    (tools / "docker-compose").symlink_to(compose_binary())
    env = {**os.environ, **podman_api, "PATH": f"{tools}:{podman_api['PATH']}", "VERLC_STOP_AFTER": "preflight"}

    def verlc(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "verlc", *args], cwd=root, env=env, capture_output=True,
                              text=True, timeout=900)
    return env, verlc


def test_a_compose_service_in_an_image_of_its_own_is_reached_by_the_runtime_with_the_runs_token(
        engine: dict[str, str], podman_api: dict[str, str], sandbox_image: str, tmp_path: Path) -> None:
    """#55 item 1 in podman compose, through `verlc submit`: the sandbox's own image is a Compose service on the
    job's network, which the head starts after; the runtime reaches it at its service name and port with the
    token verlc submit made for the run and Compose passed to both (the probe passes only with it); `verlc logs
    --service` shows its container's log, kept once the run ended; cancel (`down`) leaves nothing of it, and the
    token is in no file of verlc's."""
    from verlc.lifecycle import ledger

    compose_spec(tmp_path, engine)
    with (tmp_path / "spec.yaml").open("a") as spec:
        spec.write(f"services: {image_service(sandbox_image)}\n")
    env, verlc = compose_verlc(tmp_path, podman_api)

    def inspect(name: str, form: str) -> str:
        return subprocess.run(["podman", "inspect", "--format", form, f"compose-e2e-{name}-1"], env=env,
                              capture_output=True, text=True, check=True).stdout.strip()

    submitted = verlc("submit", "spec.yaml", "--target", "compose", "--wait")
    [run] = ledger.fold(tmp_path / ledger.FILE).values()
    try:
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        assert (run.state, run.exit_code) == ("COMPLETED", 0)
        log = verlc("logs", run.run).stdout
        assert "service sandbox: in its own image " + sandbox_image + ", started by the target on the head node " \
               "at http://service-sandbox:18000" in log, log[-6000:]
        assert re.search(r"service sandbox: ready in [\d.]+s, sandbox probe passed", log), log[-6000:]
        assert "verlc: preflight passed: 2 nodes, 16 GPUs, 2 data files" in log
        started = {name: inspect(name, "{{.State.StartedAt}}") for name in ("ray-head", "service-sandbox")}
        assert started["ray-head"] >= started["service-sandbox"], started
        token = next(e.split("=", 1)[1] for e in inspect("service-sandbox", "{{json .Config.Env}}").strip(
            "[]").replace('"', "").split(",") if e.startswith("VERLC_SERVICE_SANDBOX_TOKEN="))
        assert len(token) >= 32
        shown = verlc("logs", run.run, "--service", "sandbox")
        assert shown.returncode == 0 and "sandbox listening on service-sandbox:18000" in shown.stdout, shown.stderr
    finally:
        down = verlc("cancel", run.run)
    assert down.returncode == 0, down.stderr
    kept = verlc("logs", run.run, "--service", "sandbox")  # its containers are gone: kept in runs/
    assert kept.returncode == 0 and "sandbox listening on service-sandbox:18000" in kept.stdout, kept.stderr
    left = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert "compose-e2e" not in left
    files = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert not [p for p in files if token in p.read_text(errors="replace")]


# A stand-in for verl's trainer (no GPU here) that saves as its FSDP ranks do: every node's rank writes its own
# shard into the checkpoint folder, which lies outside every mount of the spec's.
SAVING_TRAINER = """\
import os, socket, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
folder = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("trainer.default_local_dir="))

@ray.remote(num_cpus=0)
def save(rank):
    os.makedirs(f"{folder}/global_step_1", exist_ok=True)
    with open(f"{folder}/global_step_1/rank_{rank}.pt", "w") as fh:
        fh.write(socket.gethostname())

ray.init(address="auto")
nodes = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
ray.get([save.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote(rank)
         for rank, n in enumerate(nodes)])
print(f"TRAINER saved {len(nodes)} ranks into {folder}")
"""


def test_a_two_node_compose_run_keeps_every_ranks_checkpoint_files_on_the_host(
        engine: dict[str, str], podman_api: dict[str, str], tmp_path: Path) -> None:
    """#53 item 2: the checkpoint folder is the same host folder on every node, so a worker's shards outlive
    `down` as the head's do."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "trainer.py").write_text(SAVING_TRAINER)
    python3 = tmp_path / "bin" / "python3"
    python3.write_text(f"""#!/bin/bash
if [[ ${{1:-}} == -m && ${{2:-}} == verl.trainer.main_ppo ]]; then exec /opt/venv/bin/python3 {tmp_path}/trainer.py "$@"; fi
exec /opt/venv/bin/python3 "$@"
""")
    python3.chmod(0o755)
    compose_spec(tmp_path, engine, env=json.dumps({"PATH": f"{tmp_path}/bin:/opt/venv/bin:/usr/bin:/bin"}),
                 trainer="default_local_dir: /checkpoints/compose-e2e")
    built = run_verlc("build", tmp_path / "spec.yaml", "--target", "compose", "--out", tmp_path / "out")
    assert built.returncode == 0, built.stderr
    bundle = tmp_path / "out" / "compose-e2e" / "compose"
    env = {**os.environ, **podman_api, "VERLC_STOP_AFTER": "train"}
    up, _, down = compose_up_then_down(bundle, ["compose.yaml"], env)
    log = up.stdout + up.stderr
    assert up.returncode == 0, log[-6000:]
    assert "TRAINER saved 2 ranks into /checkpoints/compose-e2e" in log, log[-6000:]
    assert down.returncode == 0, down.stderr
    saved = bundle / "checkpoints" / "global_step_1"
    hosts = {p.name: p.read_text() for p in saved.iterdir()}
    assert sorted(hosts) == ["rank_0.pt", "rank_1.pt"] and len(set(hosts.values())) == 2, hosts


# What the example specs name that this machine lacks, replaced for the bring-up below and nothing else:
# their images (not pullable here: no registry) and their GPU devices (none here).
HARDWARE_KEYS = ("devices", "group_add", "deploy")


def without_hardware(services: dict[str, dict]) -> dict[str, dict]:
    return {name: {k: v for k, v in s.items() if k not in (*HARDWARE_KEYS, "image")} for name, s in services.items()}


COMPOSE_EXAMPLES = [spec for spec, target in EXAMPLE_BUNDLES if target == "compose"]


@pytest.mark.parametrize("example", COMPOSE_EXAMPLES, ids=[spec.stem for spec in COMPOSE_EXAMPLES])
def test_every_example_compose_bundle_comes_up_to_the_ray_stage(
        engine: dict[str, str], podman_api: dict[str, str], tmp_path: Path, example: Path) -> None:
    from test_compose import compose_binary

    bundle = tmp_path / "compose"
    shutil.copytree(REPO / "out" / example.stem / "compose", bundle)  # the committed bundle, run from a copy
    home = tmp_path / "home"  # the examples mount ${HOME}/...: a home of the test's own
    env = {**os.environ, **podman_api, "HOME": str(home), "SCRATCH": str(tmp_path / "scratch"),
           "VERLC_STOP_AFTER": "ray"}

    def resolved(*files: str) -> dict[str, dict]:
        out = subprocess.run([compose_binary(), *(a for f in files for a in ("-f", f)), "config", "--format", "json"],
                             cwd=bundle, env=env, capture_output=True, text=True, check=True).stdout
        return json.loads(out)["services"]

    services = resolved("compose.yaml")
    for service in services.values():  # bind sources the user's machine has; here they live in the test's folder
        for volume in service.get("volumes", []):
            if volume["type"] == "bind":
                assert Path(volume["source"]).is_relative_to(tmp_path), volume
                Path(volume["source"]).mkdir(parents=True, exist_ok=True)
    # a service in an image of its own (whose image is not here) runs the test image, idle: the stages up to ray
    # do not ask it (the preflight does: test_a_compose_service_in_an_image_of_its_own_...)
    override = "services:\n" + "".join(
        f"  {name}:\n    image: {json.dumps(engine['VERLC_TEST_IMAGE'])}\n"
        + ("    command: [sleep, '600']\n" if name.startswith("service-") else "")
        + "    devices: !reset []\n    group_add: !reset []\n    deploy: !reset {}\n" for name in services)
    (bundle / "no-gpus.yaml").write_text(override)
    def kept(given: dict[str, dict]) -> dict[str, dict]:  # what the override leaves: all but an image service's command
        return without_hardware({n: {k: v for k, v in s.items() if k != "command" or not n.startswith("service-")}
                                 for n, s in given.items()})

    assert kept(resolved("compose.yaml", "no-gpus.yaml")) == kept(services), \
        "the override may replace only the image and the GPU devices (and an image service's command)"

    up, started, down = compose_up_then_down(bundle, ["compose.yaml", "no-gpus.yaml"], env)
    log = up.stdout + up.stderr
    assert up.returncode == 0, log[-6000:]
    job = json.loads((bundle / "verlc_job" / "job.json").read_text())
    assert f"verlc: cluster ready: {job['nodes']} nodes, {job['total_gpus']} GPUs" in log
    assert "verlc: stopping after stage ray (VERLC_STOP_AFTER)" in log
    assert len([name for name in started if "-ray-" in name]) == job["nodes"]
    assert down.returncode == 0, down.stderr
    left = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert example.stem not in left


def test_compose_runs_through_submit_status_logs_and_cancel(engine: dict[str, str], podman_api: dict[str, str],
                                                            tmp_path: Path) -> None:
    """`verlc submit --target compose` brings the stack up detached on the podman engine; status follows the
    head's exit, logs show the stages, cancel takes everything down; the ledger has each run's end."""
    # verl's trainer only prints its argv and waits (fake_bin): there is no GPU to train on
    compose_spec(tmp_path, engine, env=json.dumps({"PATH": f"{fake_bin(tmp_path)}:/opt/venv/bin:/usr/bin:/bin"}))
    env, verlc = compose_verlc(tmp_path, podman_api)

    from test_slurm_e2e import wait_for
    from verlc.lifecycle import ledger

    submitted = verlc("submit", "spec.yaml", "--target", "compose", "--wait")
    try:
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        [run] = ledger.fold(tmp_path / ledger.FILE).values()
        assert (run.state, run.exit_code) == ("COMPLETED", 0)
        assert "preflight passed: 2 nodes, 16 GPUs" in verlc("logs", run.run, "--stage", "preflight").stdout
        assert json.loads(Path(run.record).read_text())["gpus"] == 16
    finally:
        down = verlc("cancel", ledger.fold(tmp_path / ledger.FILE).popitem()[1].run)
    assert down.returncode == 0, down.stderr
    # its log outlives the containers: kept in the bundle's runs/ when verlc saw the run end
    assert "preflight passed: 2 nodes, 16 GPUs" in verlc("logs", run.run, "--stage", "preflight").stdout
    env["VERLC_STOP_AFTER"] = "train"
    assert verlc("submit", "spec.yaml", "--target", "compose").returncode == 0
    second = list(ledger.fold(tmp_path / ledger.FILE).values())[-1]
    wait_for(lambda: "TRAINER restart=0" in verlc("logs", second.run).stdout, 180, "training to start")
    assert f"TRAINER restart=0 wandb={second.run}/allow " in verlc("logs", second.run).stdout  # its own W&B run
    assert verlc("status", second.run).stdout.startswith(f"{second.run}: running")
    inside = verlc("attach", second.run, "--", "printenv", "PYTHONPATH")
    assert (inside.returncode, inside.stdout) == (0, "/opt/verlc\n"), inside.stderr
    cancelled = verlc("cancel", second.run)
    assert cancelled.returncode == 0 and "now cancelled" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    assert ledger.fold(tmp_path / ledger.FILE)[second.run].state == "CANCELLED"
    # a resubmit that continues the cancelled run: a new run, logging to the same W&B run
    resumed = verlc("submit", "spec.yaml", "--target", "compose", "--resume", second.run)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    third = list(ledger.fold(tmp_path / ledger.FILE).values())[-1]
    assert third.run != second.run and (third.submitted["tracker_run"], third.submitted["resumes"]) == (
        second.run, second.run)
    wait_for(lambda: "TRAINER restart=0" in verlc("logs", third.run).stdout, 180, "the resumed training to start")
    assert f"TRAINER restart=0 wandb={second.run}/allow " in verlc("logs", third.run).stdout
    # one bundle runs one stack: a submit while a run is going is refused, naming it, and leaves it running
    refused = verlc("submit", "spec.yaml", "--target", "compose")
    assert refused.returncode == 3 and f"already runs {third.run} (running)" in refused.stderr, refused.stderr
    assert f"`verlc cancel {third.run}` first" in refused.stderr and len(ledger.fold(tmp_path / ledger.FILE)) == 3
    # a run that ends while nobody asks (its head stopped under it), then the next submit: the ended run's log
    # and exit code are kept before `up` replaces its containers, and verlc cancel of it leaves the new run alone
    subprocess.run(["podman", "stop", "--time", "2", "compose-e2e-ray-head-1"], env=env, capture_output=True,
                   check=True, timeout=120)
    # once verlc sees the head ended, no container of the run is left up (#53 item 14: the worker's Ray would
    # only notice a minute later)
    assert verlc("status", third.run).stdout.startswith(f"{third.run}: failed")
    running = subprocess.run(["podman", "ps", "--filter", "label=com.docker.compose.project=compose-e2e", "--filter",
                              "status=running", "--format", "{{.Names}}"], env=env, capture_output=True, text=True,
                             check=True).stdout
    assert running == "", running
    env["VERLC_STOP_AFTER"] = "ray"
    fourth_submit = verlc("submit", "spec.yaml", "--target", "compose")
    assert fourth_submit.returncode == 0, fourth_submit.stdout + fourth_submit.stderr
    fourth = list(ledger.fold(tmp_path / ledger.FILE).values())[-1]
    kept = verlc("logs", third.run).stdout
    assert f"TRAINER restart=0 wandb={second.run}/allow " in kept, kept  # the third run's own log
    status = verlc("status", third.run)
    assert status.stdout.startswith(f"{third.run}: failed") and ledger.fold(tmp_path / ledger.FILE)[
        third.run].exit_code not in (None, 0), status.stdout + status.stderr
    assert verlc("cancel", third.run).returncode == 0
    assert verlc("status", fourth.run).returncode == 0  # its containers are still there
    assert verlc("cancel", fourth.run).returncode == 0
    left = subprocess.run(["podman", "ps", "--all", "--format", "{{.Names}}"], env=env, capture_output=True,
                          text=True, check=True).stdout
    assert "compose-e2e" not in left
