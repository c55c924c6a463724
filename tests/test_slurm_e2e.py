"""The generated sbatch script on a real two-node Slurm (dev/slurm.sh), stopped before training.

Each test builds a small 2 x 8 GPU spec (runtime none, this venv's ray) over tiny local fixtures
(a parquet file with verl's columns, a model folder with a config.json) and asserts on what the
job itself printed and what Slurm recorded.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pytest

from conftest import IN_CI, REPO, failing_first, rollout_engine_site, run_verlc, slurm_job
from verlc.targets.slurm.ports import PLAN


# dev/slurm.sh keeps the test cluster in its own state folder; every Slurm command finds it via SLURM_CONF.
SLURM_STATE = Path(os.environ.get("VERLC_SLURM_STATE", "/tmp/verlc-slurm"))
SLURM_CONF = str(SLURM_STATE / "slurm.conf")
NODES = 4  # the most any test asks for (dev/slurm.sh starts 8)


def _slurm_up() -> bool:
    if not shutil.which("sinfo") or not Path(SLURM_CONF).is_file():  # without its config, sinfo retries for 60 s
        return False
    idle = subprocess.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], capture_output=True, text=True, timeout=30)
    return idle.returncode == 0 and {f"n{i}" for i in range(1, NODES + 1)} <= set(idle.stdout.split())


@pytest.fixture(scope="session")
def slurm() -> Iterator[None]:
    """A running two-node cluster: reuse one that is up, else start it with dev/slurm.sh (and stop it after).
    Every Slurm command of the tests (and of the jobs they submit) reads the test cluster's SLURM_CONF."""
    before = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = SLURM_CONF
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
    if before is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = before


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


# npu-smi's `info -m` as an A3 node prints it: per NPU card two chips with a logic id, and an MCU without one.
# FAKE_NPUS chips; FAKE_NPUS_SECOND on the Slurm job's second node.
NPU_SMI = """#!/usr/bin/env bash
[[ $* == "info -m" ]] || exit 2
count=${FAKE_NPUS:-0}
if [[ -n ${FAKE_NPUS_SECOND:-} ]] \\
    && [[ $(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 2p) == "${SLURMD_NODENAME:-}" ]]; then
  count=$FAKE_NPUS_SECOND
fi
printf '        NPU ID   Chip ID   Chip Logic ID   Chip Name\\n'
for ((i = 0; i < count; i++)); do
  printf '        %d        %d         %d               Ascend910_9391\\n' $((i / 2)) $((i % 2)) "$i"
  if ((i % 2)); then printf '        %d        2         -               Mcu\\n' $((i / 2)); fi
done
"""
# Every Ray worker process (where verl's workers run) writes the HCCL, Ascend and gloo settings it sees.
RECORD_ENV = """import json, os, sys
if any("default_worker" in a for a in sys.orig_argv):
    seen = {k: v for k, v in os.environ.items() if k.startswith(("HCCL_", "ASCEND_", "GLOO_", "RAY_EXPERIMENTAL_"))}
    with open(os.path.join({root!r}, "env-" + os.environ.get("SLURMD_NODENAME", "unknown") + ".json"), "w") as fh:
        json.dump(seen, fh)
"""


# FAKE_METRICS: what verl prints over a 3-step run (awk, `x` = lr * 1e5): its step total, the actor's size as its
# worker loads it, that it trains from scratch, the initial validation (and its step 0), per step the training
# reward, a loss and a timing, the checkpoint it saves, and validation at step 3.
FAKE_METRICS_LINES = (
    'x = lr * 1e5; printf "(TaskRunner pid=%s) Total training steps: 3\\n", pid; '
    'printf "(WorkerDict pid=%s) Qwen2ForCausalLM contains 494.03M parameters\\n", pid; '
    'printf "(TaskRunner pid=%s) Training from scratch\\n", pid; '
    'printf "(TaskRunner pid=%s) Initial validation metrics: {}\\n", pid; '
    'printf "(TaskRunner pid=%s) step:0 - val-core/gsm8k/reward/mean@1:%g\\n", pid, x; '
    'for (i = 1; i <= 3; i++) printf "(TaskRunner pid=%s) step:%d - critic/score/mean:%g - '
    'actor/pg_loss:%g - timing_s/step:1.5%s\\n", pid, i, x + i / 10, -(i % 3 + 1) / 100, '
    '(i == 3 ? sprintf(" - val-core/gsm8k/reward/mean@1:%g", x + 0.5) : ""); '
    'printf "(TaskRunner pid=%s) local_global_step_folder: ckpt/global_step_3\\n", pid')


def stand_in(venv: Path, name: str, script: str) -> None:
    """An executable of fake_venv's replaced by a stand-in: the link to this venv's own goes first, so that the
    real one (e.g. torch's torchrun) is never written through it."""
    path = venv / "bin" / name
    path.unlink(missing_ok=True)
    path.write_text(script)
    path.chmod(0o755)


def fake_venv(root: Path, *, ray_fails_on: str | None = None, no_interface_on: str | None = None,
              slow_ranks: bool = False, npus: bool = False, worker_times_out_once: bool = False) -> Path:
    """This venv, except that `ray start` fails on one node, or the first worker's `ray start` fails as Ray's
    does when its raylet does not register within Ray's 30 s (its message, then exit code 1), or its Ray (and so every process Ray starts
    there) is told to use a network interface that does not exist (as a wrong NCCL_SOCKET_IFNAME would), or
    (npus) each node has an `npu-smi` (NPU_SMI) and its Ray workers record their env (RECORD_ENV), or
    (slow_ranks) the preflight's all-reduce ranks touch `root/rank-started`, then wait (up to 120 s) until the
    test has put its fault in place and touched `root/fault-on`, and
    `python3 -m verl.trainer.main_ppo` only prints its argv (there is no GPU to train on), then runs the script
    FAKE_TRAINER names with its overrides where that is set; else the first run
    prints FAKE_STEPS steps, one a second, or waits to be preempted; a restarted run
    (SLURM_RESTART_COUNT > 0) exits 0 at once. Everything else is the real thing."""
    real = Path(sys.executable).parent
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name not in ("ray", "python3"):
            (venv / "bin" / entry.name).symlink_to(entry)
    fail = (f'[[ ${{SLURMD_NODENAME:-}} == {ray_fails_on} && $1 == start ]] && '
            f'{{ echo "test: ray start refused on {ray_fails_on}" >&2; exit 1; }}\n') if ray_fails_on else ""
    if worker_times_out_once:
        fail += (f'if [[ $1 == start && " $* " != *" --head "* ]] && mkdir {root}/timed-out 2>/dev/null; then\n'
                 f'  echo "Exception: The current node timed out during startup. This could happen because some '
                 f'of the raylet failed to startup or the GCS has become overloaded." >&2; exit 1\nfi\n')
    if no_interface_on:
        fail += f'[[ ${{SLURMD_NODENAME:-}} != {no_interface_on} ]] || export GLOO_SOCKET_IFNAME=verlc-no-such-nic\n'
    site = ""  # a sitecustomize that every Python Ray starts reads
    if slow_ranks:
        site += ("import os, sys, time\nif 'init_process_group' in ' '.join(sys.orig_argv):\n"
                 f"    open({str(root / 'rank-started')!r}, 'w').close()\n"
                 f"    for _ in range(600):\n"
                 f"        if os.path.exists({str(root / 'fault-on')!r}):\n            break\n"
                 f"        time.sleep(0.2)\n")
    if npus:
        site += RECORD_ENV.replace("{root!r}", repr(str(root)))
        (venv / "bin" / "npu-smi").write_text(NPU_SMI)
        (venv / "bin" / "npu-smi").chmod(0o755)
    if site:
        (root / "site").mkdir()
        (root / "site" / "sitecustomize.py").write_text(site)
        fail += f'export PYTHONPATH={root}/site${{PYTHONPATH:+:$PYTHONPATH}}\n'
    (venv / "bin" / "ray").write_text(f"#!/usr/bin/env bash\n{fail}exec {real}/ray \"$@\"\n")
    (venv / "bin" / "python3").write_text(f"""#!/usr/bin/env bash
if [[ ${{1:-}} == -m && ${{2:-}} == verl.trainer.main_ppo ]]; then  # the trainer, not a mention of it
  echo "TRAINER restart=${{SLURM_RESTART_COUNT:-0}} wandb=${{WANDB_RUN_ID:-}}/${{WANDB_RESUME:-}} argv: $*"
  [[ -z ${{FAKE_TRAINER:-}} ]] || exec {real}/python3 "$FAKE_TRAINER" "${{@:3}}"  # a stand-in of the test's own
  [[ ${{SLURM_RESTART_COUNT:-0}} == 0 ]] || exit 0
  if [[ -n ${{FAKE_METRICS:-}} ]]; then  # FAKE_METRICS_LINES: verl's lines of a 3-step run, from the run's lr
    lr=$(printf '%s\n' "$@" | sed -n 's/^actor_rollout_ref[.]actor[.]optim[.]lr=//p' | tail -n 1)
    awk -v lr="$lr" -v pid=$$ 'BEGIN {{ {FAKE_METRICS_LINES} }}'
    exit 0
  fi
  for ((i = 1; i <= ${{FAKE_STEPS:-0}}; i++)); do  # verl's console logger, as Ray prints it
    echo "(TaskRunner pid=$$) step:$i - critic/score/mean:0.5 - actor/pg_loss:-0.01"
    sleep 1
  done
  if [[ -n ${{FAKE_STEPS:-}} ]]; then exit 0; fi
  if [[ ${{SLURM_RESTART_COUNT:-0}} == 0 ]]; then sleep 600; fi
  exit 0
fi
exec {real}/python3 "$@"
""")
    for name in ("ray", "python3"):
        (venv / "bin" / name).chmod(0o755)
    return venv


def build(root: Path, *, val_file: str = "data/test.parquet", wait: str = "120s", venv: Path | None = None,
          grace: str = "null", prepare: str = "", nodes: int = 2, container: str | None = None,
          extra: str = "", model: str | None = None, ray: str = "", micro: int = 4, cluster: str = "",
          slurm: str = "", verl: str = "") -> Path:
    """The e2e spec in `root`; `container` replaces its `runtime: none` section (a YAML flow mapping); `micro`:
    the micro batch sizes (verl's default mini batch of 256 over 16 nodes' 128 GPUs leaves 2 per GPU); `verl`:
    more of verl's sections (", reward: {...}")."""
    container = container or f"{{runtime: none, workdir: {root}, venv: {venv or Path(sys.prefix)}}}"
    spec = root / "spec.yaml"
    spec.write_text(f"""\
name: e2e-{root.name[-12:].strip('_-') or 'run'}
project: e2e
model: {model or f"{root}/model"}
data: {{train_files: [data/train.parquet], val_files: [{val_file}]{prepare}}}
verl: {{actor_rollout_ref: {{rollout: {{name: vllm, log_prob_micro_batch_size_per_gpu: {micro}}},
                            actor: {{ppo_micro_batch_size_per_gpu: {micro}}}}},
       critic: {{ppo_micro_batch_size_per_gpu: {micro}}}{verl}}}
cluster: {{nodes: {nodes}, gpus_per_node: 8{cluster}, slurm: {{cpus_per_task: 1, output: {root}/slurm-%j.out,
                                               requeue_grace: {grace}{slurm}}}}}
container: {container}
ray: {{wait_for_nodes: {wait}{ray}}}
{extra}""")
    result = run_verlc("build", spec, "--target", "slurm", "--out", root / "out")
    assert result.returncode == 0, result.stderr
    return next((root / "out").glob("*/slurm/sbatch.sh"))


# The job inherits this environment: its nodes' Python sees the rollout engine's package there.
SUBMIT_ENV = {"PATH": "/usr/bin:/bin:/usr/sbin:/sbin", "SLURM_CONF": SLURM_CONF,
              "PYTHONPATH": str(rollout_engine_site())}


def sbatch(script: Path, root: Path, stop_after: str = "preflight", *options: str,
           env: dict[str, str] | None = None) -> tuple[str, str, str]:
    """Submit, wait, and return (job id, the job's output, Slurm's JobState). `env` adds to the
    submitting shell's environment, which the job inherits."""
    result = subprocess.run(["sbatch", "--parsable", *options, str(script)], cwd=root,
                            capture_output=True, text=True, timeout=60,
                            env={**SUBMIT_ENV, "HOME": str(root), "VERLC_STOP_AFTER": stop_after, **(env or {})})
    job = result.stdout.strip().split(";")[0]
    assert job.isdigit(), result.stderr
    # Polled here: `sbatch --wait` backs off to polls many seconds apart, which adds up over the suite.
    wait_for(lambda: job_state(job, settle=False) in FINAL, 600, f"job {job} to end")
    return job, (root / f"slurm-{job}.out").read_text(), job_state(job)


FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}


def job_state(job: str, settle: bool = True) -> str:
    """The job's state; with `settle`, once it is past COMPLETING/CONFIGURING (or a minute went by)."""
    end = time.monotonic() + 60
    while True:
        shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
        match = re.search(r"JobState=(\w+)", shown)
        state = match[1] if match else "UNKNOWN"
        if not settle or state not in ("COMPLETING", "CONFIGURING") or time.monotonic() > end:
            return state
        time.sleep(0.5)


def submit(script: Path, root: Path, stop_after: str = "train", env: dict[str, str] | None = None,
           options: tuple[str, ...] = ()) -> str:
    result = subprocess.run(["sbatch", "--parsable", *options, str(script)], cwd=root, capture_output=True, text=True,
                            timeout=60, env={**SUBMIT_ENV, "HOME": str(root), "VERLC_STOP_AFTER": stop_after,
                                             **(env or {})})
    job = result.stdout.strip().split(";")[0]
    assert job.isdigit(), result.stderr
    return job


def wait_for(predicate, timeout: float, what: str, seen=None) -> None:  # noqa: ANN001
    """Wait for `predicate`; at the timeout fail naming `what`, and with `seen()` (e.g. the job's log) if given."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"timed out after {timeout}s waiting for {what}" + (
            f"; seen:\n{seen()}" if seen else "")
        time.sleep(1)


def ray_processes(job: str | None = None) -> list[str]:
    """Ray's processes on the test cluster's nodes (their network namespaces, where every job step runs), or
    only those of `job` (its Ray's temp dirs, /tmp/verlc-ray-JOB-*): a Ray of the other machine tests, on the
    host, is not the cluster's."""
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    found = []
    for ns in (n for n in namespaces if re.fullmatch(r"verlc-n\d+", n)):
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            try:
                line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # it ended
            if re.search(r"raylet|gcs_server", line) and (job is None or f"verlc-ray-{job}-" in line):
                found.append(f"{ns} {pid} {line.strip()}")
    return found


def no_ray_left(deadline: float = 30, job: str | None = None) -> list[str]:
    end = time.monotonic() + deadline
    while ray_processes(job) and time.monotonic() < end:
        time.sleep(1)
    return ray_processes(job)


# ---- jobs side by side --------------------------------------------------------------------------------------
# Most tests here run one short job and read what it printed. Their jobs are independent, and the cluster's 8
# nodes hold four 2-node jobs at once: such a test says how its job is made (`@side_by_side(make)`), the first
# of them to run submits the jobs of every one selected in its module, and each test gets its own job once that
# has ended. tests/conftest.py runs them first in their module, so that their jobs have the cluster to themselves.
# Where a test needs particular nodes (a fault on one of them), it names them (--nodelist), apart from the others.

@dataclass(frozen=True)
class Job:
    """A job to submit: its script, the stage it stops after, sbatch's options, what it adds to the environment."""

    script: Path
    stop_after: str = "preflight"
    options: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Ended:
    """A side-by-side test's job once it ended: its id, what it printed, Slurm's state, its folder and script."""

    job: str
    output: str
    state: str
    root: Path
    script: Path


def side_by_side(make: Callable[..., Job], *, last: bool = False) -> pytest.MarkDecorator:
    """Marks a test whose job `make(root, ...)` makes: it gets that job from the `ended` fixture, once it ended.
    `last`: a long job (a time limit to reach), submitted last (the others' nodes named by --nodelist are then
    taken) and checked after every other test of the module (tests/conftest.py orders them), so that it runs
    beside them; they look for what their own jobs left, not for every job's."""
    return pytest.mark.side_by_side.with_args(make, last=last)


# The test cluster's nodes share this machine's two cores, and one Ray node's start costs seconds of CPU: eight at
# once overloaded Ray's GCS past its fixed 30 s for a node to register (a CI run: "The current node timed out
# during startup"; `ray start` has no setting for it), which a cluster of real hosts does not see. So the
# side-by-side jobs bring Ray up at most two at a time; their preflights and the rest still overlap.
BRING_UPS = 2


def bringing_up(job: str, root: Path) -> bool:
    """Whether the job is still to bring Ray up: pending (jobs queued while the nodes were taken start together
    once nodes free up), or running with no "cluster ready" and no cleanup in its log yet."""
    state = job_state(job, settle=False)
    if state == "PENDING":
        return True
    if state != "RUNNING":
        return False
    log = root / f"slurm-{job}.out"
    text = log.read_text(errors="replace") if log.exists() else ""
    return "cluster ready: " not in text and "cleaning up" not in text


@pytest.fixture(scope="module")
def submitted(slurm: None, request: pytest.FixtureRequest,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[str, Path, Job] | BaseException]]:
    """The job of every selected side-by-side test, each submitted once it is built: test id -> (job id, folder,
    job), or what stopped its making (a skip, a failed assertion), for that test alone to raise. `make` gets the
    folder, the test's parameters it names, and the module's fixtures it names (`engine`)."""
    jobs: dict[str, tuple[str, Path, Job] | BaseException] = {}
    try:
        for item in request.session.items:
            mark = item.get_closest_marker("side_by_side")
            if mark is None or item.module is not request.module:
                continue
            make = mark.args[0]
            root = tmp_path_factory.mktemp(item.originalname.removeprefix("test_")[:30])
            params = item.callspec.params if hasattr(item, "callspec") else {}
            named = [p.name for p in list(inspect.signature(make).parameters.values())[1:]
                     if p.default is inspect.Parameter.empty]  # what make must be given
            try:
                write_fixtures(root)
                job = make(root, **{name: params[name] if name in params else request.getfixturevalue(name)
                                    for name in named})
                made = [m for m in jobs.values() if isinstance(m, tuple)]
                paced = time.monotonic() + 180  # then on regardless: pacing, not a check
                while sum(bringing_up(j, r) for j, r, _ in made) >= BRING_UPS and time.monotonic() < paced:
                    time.sleep(2)
                jobs[item.nodeid] = (submit(job.script, root, job.stop_after, job.env, job.options), root, job)
            except (AssertionError, pytest.skip.Exception, pytest.fail.Exception) as stopped:
                jobs[item.nodeid] = stopped
        yield jobs
    finally:
        for made in jobs.values():  # any that a failed test did not wait for
            if isinstance(made, tuple):
                subprocess.run(["scancel", made[0]], capture_output=True)


@pytest.fixture
def ended(submitted: dict[str, tuple[str, Path, Job] | BaseException], request: pytest.FixtureRequest) -> Ended:
    made = submitted[request.node.nodeid]
    if isinstance(made, BaseException):
        raise made
    job, root, submission = made
    wait_for(lambda: job_state(job, settle=False) in FINAL, 900, f"job {job} to end")
    return Ended(job, (root / f"slurm-{job}.out").read_text(), job_state(job), root, submission.script)


def took(output: str) -> float:
    """Seconds from the job's first log line to its last (its run, without its time in the queue)."""
    stamps = [datetime.fromisoformat(m) for m in re.findall(r"^\[(\S+)Z\] ", output, re.M)]
    return (stamps[-1] - stamps[0]).total_seconds()


def steps_per_stage(job: str, output: str) -> dict[str, int]:
    """How many job steps the job started in each stage: step launches from every slurmd's log, placed
    between the job's own `stage NAME` lines ("setup" before the first, "cleanup" after the trap starts)."""
    def stamp(text: str, utc: bool) -> float:
        moment = datetime.fromisoformat(text)
        return (moment.replace(tzinfo=timezone.utc) if utc else moment).timestamp()

    marks = [(stamp(m[1], True), m[2]) for m in re.finditer(r"^\[(\S+)Z\] verlc: (stage \w+|cleaning up)", output, re.M)]
    launches: dict[str, float] = {}
    for log in SLURM_STATE.glob("slurmd-n*.log"):
        for m in re.finditer(rf"^\[(\S+)\] launch task StepId={job}\.(\d+) ", log.read_text(), re.M):
            launches[m[2]] = min(launches.get(m[2], math.inf), stamp(m[1], False))
    counts: dict[str, int] = {}
    for at in launches.values():
        stage = next((name for when, name in reversed(marks) if when <= at), "setup")
        stage = "cleanup" if stage == "cleaning up" else stage.removeprefix("stage ")
        counts[stage] = counts.get(stage, 0) + 1
    return counts


# The job steps of a bring-up to the preflight (runtime none), whatever the node count: one step asks
# every node for its address, then the Ray head, all workers, and verlc's runtime on the head (which waits
# for the cluster and runs data and preflight in that same step).
STEPS = {"setup": 1, "ray": 3}


@side_by_side(lambda root: esi_job(root), last=True)
def test_verl_saves_ahead_of_the_limit_and_the_requeued_attempt_resumes_there(ended: Ended) -> None:
    """#42: verl's own should_save_ckpt_esi, given the job's end by the runtime, saves ahead of Slurm's time
    limit; USR1 (requeue_grace before it) requeues the job, and the next attempt resumes at that save."""
    check_esi_job(ended)


@side_by_side(lambda root, nodes: Job(build(root, nodes=nodes)))
@pytest.mark.parametrize("nodes", [2, NODES])
def test_bring_up_and_preflight_take_the_same_job_steps_on_any_node_count(ended: Ended, nodes: int) -> None:
    job, output = ended.job, ended.output
    assert ended.state == "COMPLETED", output
    registered = re.findall(rf"node registered: .* GPUs=8 \((\d)/{nodes}\)", output)
    assert registered == [str(i) for i in range(1, nodes + 1)], output
    assert f"cluster ready: {nodes} nodes, {8 * nodes} GPUs" in output
    assert f"preflight passed: {nodes} nodes, {8 * nodes} GPUs, 2 data files" in output
    assert f", all-reduce over {nodes} ranks on {nodes} nodes\n" in output  # gloo: no GPU here
    # the cleanup stopped each Ray: said as such, not as a failure (#40 item 15)
    assert "exited (code" not in output, output
    assert len(re.findall(r"Ray on n\d+ stopped \(the job is ending\)", output)) == nodes, output
    assert "stage train: skipped (VERLC_STOP_AFTER=preflight)" in output
    assert steps_per_stage(job, output) == STEPS, output
    assert no_ray_left(job=job) == []
    # every node kept its Ray logs (the head's GCS too) and removed Ray's temp dir, also where one step runs
    # several nodes' Ray
    kept = next((ended.root / "verlc-runs").glob(f"*-{job}")) / "ray-logs"
    placed = re.findall(r"node registered: (n\d+) ", output)
    assert sorted(p.parent.name for p in kept.glob("*/TRUNCATED.txt")) == sorted(placed), output
    for node in placed:
        assert (kept / node / "raylet.out").stat().st_size > 0, sorted(p.name for p in (kept / node).iterdir())
        assert (kept / node / "TRUNCATED.txt").read_text() == "nothing was cut\n"
    assert len(list(kept.glob("*/gcs_server.out"))) == 1, output  # the head's
    assert not list(Path("/tmp").glob(f"verlc-ray-{job}-*"))


@side_by_side(lambda root: Job(build(root, venv=fake_venv(root, no_interface_on="n4")), options=("--nodelist=n3,n4",)))
def test_an_all_reduce_that_fails_on_one_node_fails_the_preflight_and_names_that_node(ended: Ended) -> None:
    output = ended.output
    assert ended.state == "FAILED", output
    failures = [line.split("PREFLIGHT FAILED: ", 1)[1] for line in output.splitlines() if "PREFLIGHT FAILED" in line]
    assert len(failures) == 1 and failures[0].startswith("all-reduce: node n4 ("), output
    assert "Unable to find address for: verlc-no-such-nic" in failures[0]
    assert "preflight passed" not in output and no_ray_left(60, ended.job) == []


def test_a_pinned_model_comes_from_the_hf_cache_offline_and_each_run_records_what_it_read(slurm: None,
                                                                                          tmp_path: Path) -> None:
    """The data stage fills the model's folder from the local Hugging Face cache (hub offline) once; every
    run's record hashes its data and model files, so `verlc diff` of two records names a one-byte edit."""
    import pyarrow.parquet as pq
    from test_inputs import COMMIT, hub_cache

    write_fixtures(tmp_path)
    train = tmp_path / "data" / "train.parquet"
    pq.write_table(pq.read_table(train), train, compression="none")
    hub_cache(tmp_path / "hf")
    env = f"env: {{HF_HOME: {tmp_path / 'hf'}, HF_HUB_OFFLINE: '1'}}\n"
    script = build(tmp_path, model=f"{{path: org/tiny, revision: {COMMIT}}}", extra=env)
    folder = f"models/org--tiny-{COMMIT[:12]}"
    assert f"actor_rollout_ref.model.path={folder}" in script.read_text()
    job, output, state = sbatch(script, tmp_path)
    assert state == "COMPLETED", output
    assert f"fetching model org/tiny at {COMMIT} into {folder} from the local Hugging Face cache" in output
    assert (tmp_path / folder / "config.json").read_bytes() == b'{"model_type": "qwen2"}'
    train.write_bytes(train.read_bytes().replace(b"1+1", b"1+2", 1))  # one byte, the same size
    job2, output, state = sbatch(script, tmp_path)
    assert state == "COMPLETED", output
    assert f"model org/tiny at {COMMIT} already in {folder} (4 files); skipping" in output
    records = [next((tmp_path / "verlc-runs").glob(f"*-{j}")) / "run-record.json" for j in (job, job2)]
    first = json.loads(records[0].read_text())
    assert first["inputs"]["model"]["revision"] == COMMIT
    assert set(first["inputs"]["model"]["files"]) == {"config.json", "tokenizer.json"}
    assert first["verl_config"]["actor_rollout_ref"]["model"]["path"] == folder
    diff = run_verlc("diff", *records)
    assert diff.returncode == 1
    groups = {line.rstrip(":") for line in diff.stdout.splitlines() if line.endswith(":")}
    assert "inputs" in groups and not groups & {"versions", "verl config"}, diff.stdout
    assert "  ~ data data/train.parquet sha256: " in diff.stdout, diff.stdout


def code_job(root: Path) -> Job:
    """A spec with a code folder (a git repository) and its reward function, built; the function is then
    edited (after the build)."""
    from test_programs import code_repo

    (root / "commit").write_text(code_repo(root / "code"))
    spec = root / "spec.yaml"
    spec.write_text(f"""\
name: e2e-code
project: e2e
model: {root}/model
code: code
data: {{train_files: [{root}/data/train.parquet], val_files: [{root}/data/test.parquet]}}
verl: {{actor_rollout_ref: {{rollout: {{name: vllm, log_prob_micro_batch_size_per_gpu: 4}},
                            actor: {{ppo_micro_batch_size_per_gpu: 4}}}},
       algorithm: {{adv_estimator: grpo}},
       reward: {{custom_reward_function: {{path: rewards/math.py, name: compute_score}}}}}}
cluster: {{nodes: 2, gpus_per_node: 8, slurm: {{cpus_per_task: 1, output: {root}/slurm-%j.out}}}}
container: {{runtime: none, venv: {Path(sys.prefix)}}}
ray: {{wait_for_nodes: 120s}}
""")
    result = run_verlc("build", spec, "--target", "slurm", "--out", root / "out")
    assert result.returncode == 0, result.stderr
    reward = root / "code" / "rewards" / "math.py"
    (root / "built.sha256").write_text(hashlib.sha256(reward.read_bytes()).hexdigest())
    reward.write_text(reward.read_text() + "# edited after the build\n")
    return Job(root / "out" / "e2e-code" / "slurm" / "sbatch.sh")


@side_by_side(code_job)
def test_the_job_runs_in_the_runs_code_and_records_the_files_it_was_built_with(ended: Ended) -> None:
    """Without a container the job's steps run in the code folder (relative to where sbatch runs): the run
    record has the code's commit and the reward function's sha256 as the job found it, and a file edited
    after the build fails the preflight, naming it and both hashes."""
    tmp_path, job, output = ended.root, ended.job, ended.output
    reward = tmp_path / "code" / "rewards" / "math.py"
    built = (tmp_path / "built.sha256").read_text()
    commit = (tmp_path / "commit").read_text()
    assert ended.state == "FAILED", output
    assert (f"PREFLIGHT FAILED: rewards/math.py here is not the file the bundle was built with (sha256 "
            f"{hashlib.sha256(reward.read_bytes()).hexdigest()[:12]}, built {built[:12]})") in output
    record = json.loads((next((tmp_path / "verlc-runs").glob(f"*-{job}")) / "run-record.json").read_text())
    assert record["inputs"]["code"]["commit"] == commit  # read where the job ran: the code folder
    assert record["inputs"]["code"]["files"] == {"rewards/math.py": hashlib.sha256(reward.read_bytes()).hexdigest()}


@side_by_side(lambda root: Job(build(root, val_file="data/missing.parquet")))
def test_missing_data_file_fails_preflight(ended: Ended) -> None:
    assert ended.state == "FAILED", ended.output
    assert "PREFLIGHT FAILED: data file data/missing.parquet does not exist" in ended.output
    assert no_ray_left(job=ended.job) == []


def model_on_n1_only(root: Path) -> Job:
    (root / "models").mkdir()
    shutil.copytree(root / "model", root / "models" / "n1")
    return Job(build(root, model=f"{root}/models/${{env:SLURMD_NODENAME}}"), options=("--nodelist=n1,n2",))


@side_by_side(model_on_n1_only)
def test_a_model_folder_one_node_cannot_see_fails_the_preflight_naming_that_node(ended: Ended) -> None:
    """The model path names each node's own folder (${env:SLURMD_NODENAME}, as verl's workers resolve it on their
    node), and only the head's (n1) exists. Before, the preflight looked on the head only and passed."""
    output = ended.output
    assert ended.state == "FAILED", output
    assert re.search(rf"PREFLIGHT FAILED: node n2 \(\S+\): model path {ended.root}/models/n2 does not exist",
                     output), output
    assert "models/n1 does not exist" not in output
    assert no_ray_left(job=ended.job) == []


IMAGE = b"verl image\n"


def image_differing_on_n8(root: Path) -> Job:
    (root / "images").mkdir()
    (root / "images" / "n7.sif").write_bytes(IMAGE)
    (root / "images" / "n8.sif").write_bytes(IMAGE.replace(b"\n", b"!\n"))
    image = f"{root}/images/${{env:SLURMD_NODENAME}}.sif"
    pin = hashlib.sha256(IMAGE).hexdigest()
    container = f"{{runtime: apptainer, image: '{image}@sha256:{pin}', workdir: {root}}}"
    return Job(build(root, container=container), "containers", ("--nodelist=n7,n8",))


@side_by_side(image_differing_on_n8)
def test_an_image_file_pinned_by_its_sha256_is_checked_on_every_node(ended: Ended) -> None:
    """An apptainer .sif pinned as FILE@sha256:... runs FILE (not a path with the pin in it), and the job checks
    the file's sha256 on every node before any container runs: n8's copy differs by one byte and fails the job,
    naming n8. The path names each node's own file (${env:SLURMD_NODENAME}), as a node-local copy would be."""
    tmp_path, output, pin = ended.root, ended.output, hashlib.sha256(IMAGE).hexdigest()
    script = ended.script.read_text()
    assert 'images/"${SLURMD_NODENAME}".sif --' not in script  # the pin is not part of the path
    assert "@sha256" not in script.split("exec_prefix=(")[1].split("\n")[0]
    assert ended.state == "FAILED", output
    # n8 is not the head: its mismatch shows the check runs on every node. Whether n7 printed its own line first
    # depends on which node got there first (the step ends at n8's failure), so only what n7 printed is checked
    assert f"checking the sha256 of {tmp_path}/images/n8.sif on n8" in output, output
    assert re.search(rf"ERROR: the image {tmp_path}/images/n8.sif on n8 has sha256 [0-9a-f]{{64}}, not the pinned "
                     rf"{pin} ", output), output
    assert "on n7 has sha256" not in output


@side_by_side(lambda root: Job(build(root, wait="300s", venv=fake_venv(root, ray_fails_on="n6")),
                               options=("--nodelist=n5,n6",)))
def test_worker_ray_failure_fails_fast_and_names_the_node(ended: Ended) -> None:
    output = ended.output
    assert ended.state == "FAILED", output
    assert "Ray on n6 exited (code 1)" in output
    assert "Ray on a worker (named above) exited during bring-up" in output
    assert took(output) < 120, "should fail well before the 300 s wait"
    assert no_ray_left(job=ended.job) == []


@side_by_side(lambda root: Job(build(root, venv=fake_venv(root, worker_times_out_once=True))))
def test_a_worker_whose_raylet_did_not_register_in_rays_30_s_is_started_again(ended: Ended) -> None:
    output = ended.output
    assert ended.state == "COMPLETED", output
    again = re.findall(r"Ray on (n\d+) did not register with the head in Ray's 30 s; starting it again \(2 of 3\)",
                       output)
    assert len(again) == 1 and "preflight passed: 2 nodes" in output, output
    kept = next((ended.root / "verlc-runs").glob(f"*-{ended.job}")) / "ray-logs" / again[0] / "ray-start.out"
    assert "Ray runtime started" in kept.read_text()  # the second start's output, kept
    assert no_ray_left(job=ended.job) == []


# Where the script can be held for a cancel (VERLC_PAUSE_AT): the start of each stage, before the nodes are
# asked for their addresses, and just after the readiness waiter started (where a cancel once left no log).
PAUSE_POINTS = ("addresses", "containers", "ray", "ray-wait", "data", "preflight")


def test_scancel_at_any_moment_of_bring_up_runs_the_cleanup_and_leaves_nothing(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    script = build(tmp_path)

    def cancel(kind: str, at: str | float) -> str:
        job = submit(script, tmp_path, "preflight", {"VERLC_PAUSE_AT": at} if kind == "paused at" else None)
        log = tmp_path / f"slurm-{job}.out"
        started = f"paused at {at} (VERLC_PAUSE_AT)" if kind == "paused at" else "verlc: job "
        wait_for(lambda: log.exists() and started in log.read_text(), 180, f"{kind} {at}")
        time.sleep(at if kind == "after" else 0)
        subprocess.run(["scancel", job], check=True)
        wait_for(lambda: job_state(job) == "CANCELLED", 180, "the job to be cancelled")  # under load: minutes COMPLETING
        wait_for(lambda: "] verlc: exit code 143" in log.read_text(), 60, f"the cleanup trap ({kind} {at})")
        assert "cleaning up (exit code 143)" in log.read_text(), (kind, at)
        return job

    # Two 2-node jobs at a time, each in a port block of its own: four at once (eight Ray nodes starting and
    # being stopped on two cores) once left a cleanup unfinished within Slurm's KillWait under CI's load.
    moments = [("paused at", point) for point in PAUSE_POINTS] + [("after", delay) for delay in (0, 0.7, 1.5, 3)]
    with ThreadPoolExecutor(2) as pool:
        jobs = list(pool.map(lambda moment: cancel(*moment), moments))
    assert [process for job in jobs for process in no_ray_left(60, job)] == []
    wait_for(lambda: not [d for job in jobs for d in Path("/tmp").glob(f"verlc-ray-{job}-*")], 30,
             "Ray's temp dirs to go")


def stall_job(root: Path, steps: str | None = None) -> Job:
    """A trainer that prints `steps` steps a second apart (or hangs before its first), under an 8 s stall_timeout."""
    return Job(build(root, venv=fake_venv(root), extra="stall_timeout: 8s\n"), "train",
               env={"FAKE_STEPS": steps} if steps else {})


@side_by_side(lambda root: stall_job(root, steps="14"))
def test_a_training_run_that_steps_is_not_ended_by_the_stall_timeout(ended: Ended) -> None:
    assert ended.state == "COMPLETED", ended.output
    assert "step:14 - critic/score/mean:0.5" in ended.output and "stall_timeout" not in ended.output


@side_by_side(stall_job)
def test_a_training_run_without_new_steps_is_ended_by_the_stall_timeout(ended: Ended) -> None:
    output = ended.output
    assert ended.state == "FAILED", output
    assert "ERROR: no new training step for 8s (stall_timeout): stopping the run" in output
    assert "cleaning up (exit code 124)" in output and no_ray_left(60, ended.job) == []  # the runtime's watchdog: 124


def test_requeues_are_capped_a_limit_reached_without_a_new_checkpoint_is_not_trained_again(
        slurm: None, tmp_path: Path) -> None:
    """#40 item 14. `limit`: its trainer steps but never saves; once it runs, its time limit is moved (scontrol
    update, as an operator would) to 3 minutes away, inside requeue_grace, and USR1 comes as Slurm sends it
    there: the job requeues, and the next attempt refuses to train, since it would repeat the same steps.
    `cap`: max_requeues 0, USR1 far from its limit (a preemption ahead): not requeued. (verl saving ahead of
    the limit is the side-by-side test_verl_saves_ahead_of_the_limit_and_the_requeued_attempt_resumes_there.)"""
    scripts = {}
    for name, grace, slurm_extra in (("limit", "240s", ", time: '00:30:00'"), ("cap", "60s", ", max_requeues: 0")):
        root = tmp_path / name
        root.mkdir()
        write_fixtures(root)
        scripts[name] = build(root, venv=fake_venv(root), grace=grace, slurm=slurm_extra)
    jobs = {name: submit(script, tmp_path / name, "train", {"FAKE_STEPS": "900"}) for name, script in scripts.items()}
    logs = {name: tmp_path / name / f"slurm-{job}.out" for name, job in jobs.items()}
    for name, job in jobs.items():
        wait_for(lambda: "step:3 " in (logs[name].read_text() if logs[name].exists() else ""), 300, f"{name} to step")
    shown = subprocess.run(["scontrol", "show", "job", jobs["limit"]], capture_output=True, text=True).stdout
    h, m, sec = (int(x) for x in re.search(r"RunTime=(\d+):(\d+):(\d+)", shown).groups())
    subprocess.run(["scontrol", "update", f"JobId={jobs['limit']}", f"TimeLimit={h * 60 + m + 4}"], check=True)
    for job in jobs.values():  # what Slurm does at requeue_grace before the limit (--signal=B:USR1@...)
        subprocess.run(["scancel", "--signal=USR1", "--batch", job], check=True)
    # the limit back where it was once the attempt ends, or Slurm would signal the next attempt at once
    wait_for(lambda: f"requeueing job {jobs['limit']}" in logs["limit"].read_text(), 120, "the requeue")
    subprocess.run(["scontrol", "update", f"JobId={jobs['limit']}", "TimeLimit=30"], check=True)
    wait_for(lambda: "not training" in logs["limit"].read_text(), 300, "the requeued attempt")
    limit_state, cap_state = (job_state(j) for j in (wait_ended(jobs["limit"]), wait_ended(jobs["cap"])))
    limit, cap = logs["limit"].read_text(), logs["cap"].read_text()
    assert f"requeueing job {jobs['limit']}" in limit and "SLURM_RESTART_COUNT=1" in limit, limit
    assert ("ERROR: the last attempt of this job ran to its time limit and saved no new checkpoint (the latest is "
            "none at all, as when it began)") in limit, limit
    assert limit.count("TRAINER restart=") == 1 and limit_state == "FAILED", limit
    assert "not requeued: max_requeues (0) reached: this job was requeued 0 time(s) already " \
           "(cluster.slurm.max_requeues)" in cap, cap
    assert "requeueing job" not in cap and "SLURM_RESTART_COUNT=1" not in cap and cap_state == "FAILED", cap
    # keep_end_time is stopped by the cleanup, not KILLed (a node's Ray that outlives its grace may be)
    killed = [line for line in (limit + cap).splitlines() if "Killed" in line and "keep_end_time" in line]
    assert not killed, limit + cap
    assert [process for job in jobs.values() for process in no_ray_left(60, job)] == []


# A stand-in for verl's trainer that keeps verl's own deadline logic: a Ray driver whose actor runs the steps (as
# verl's TaskRunner does), resumes from the checkpoint folder's latest_checkpointed_iteration.txt, and after
# each one-second step asks verl's should_save_ckpt_esi (the installed verl's, not a copy) whether to save.
ESI_TRAINER = """\
import os, sys, time
import ray
args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
folder = args["trainer.default_local_dir"]
redundant = float(args.get("trainer.esi_redundant_time", 0))
ray.init(runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "true"}})  # as verl's main_ppo: merged by Ray

@ray.remote(num_cpus=0)
def fit(folder, redundant, attempt):
    from verl.utils.checkpoint.checkpoint_manager import should_save_ckpt_esi
    latest = os.path.join(folder, "latest_checkpointed_iteration.txt")
    step = int(open(latest).read()) if os.path.exists(latest) else 0
    print(f"STAND-IN resumed at step {step}; deadline {os.environ.get('MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP')}",
          flush=True)
    for _ in range(3 if attempt else 100000):
        time.sleep(1)
        step += 1
        print(f"step:{step} - critic/score/mean:0.5", flush=True)
        if should_save_ckpt_esi(max_steps_duration=1.0, redundant_time=redundant):
            os.makedirs(folder, exist_ok=True)
            open(latest, "w").write(str(step))
            print(f"Force saving checkpoint: ESI instance expiration approaching. step {step} at {time.time():.0f}",
                  flush=True)
    return step

print("STAND-IN done at step", ray.get(fit.remote(folder, redundant, int(os.environ.get("SLURM_RESTART_COUNT") or 0))))
"""


def esi_job(root: Path) -> Job:
    """#42 items 1-2: a job whose trainer is ESI_TRAINER, with a 5-minute limit and USR1 asked 30 s before it
    (Slurm may send it up to 60 s earlier, which the deadline allows for: end - 90 s). A negative
    trainer.esi_redundant_time narrows verl's 61 s window, to keep it short. (With 4 minutes, a CI run's
    bring-up beside other jobs took the first attempt past USR1 before its first step; side by side, the
    others' bring-ups are paced, one beside it at most.)"""
    venv = fake_venv(root)
    (root / "esi_trainer.py").write_text(ESI_TRAINER)
    python = venv / "bin" / "python3"
    python.write_text(python.read_text().replace(
        'if [[ ${1:-} == -m && ${2:-} == verl.trainer.main_ppo ]]; then',
        f'if [[ ${{1:-}} == -m && ${{2:-}} == verl.trainer.main_ppo ]]; then\n  shift 2\n'
        f'  exec {sys.executable} {root}/esi_trainer.py "$@"'))
    trainer = f", trainer: {{default_local_dir: {root}/ckpt, save_freq: 1000, esi_redundant_time: -30}}"
    return Job(build(root, venv=venv, grace="30s", slurm=", time: '00:05:00'", verl=trainer), "train")


def check_esi_job(ended: Ended) -> None:
    """The deadline (the job's end less requeue_grace) reached verl's should_save_ckpt_esi in the trainer's
    Ray actor, which saved ahead of it; USR1 requeued the job, and the next attempt resumed from that save."""
    output = ended.output
    assert ended.state == "COMPLETED", output
    first, _, second = output.partition("SLURM_RESTART_COUNT=1")
    assert second, output
    deadline = int(re.search(r"MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP=(\d+): verl saves", first)[1])
    assert f"STAND-IN resumed at step 0; deadline {deadline}" in first, first  # in the actor, by Ray's job env
    saves = [(int(s), int(t)) for s, t in re.findall(r"Force saving checkpoint: ESI instance expiration "
                                                     r"approaching. step (\d+) at (\d+)", first)]
    last_step = max(int(s) for s in re.findall(r"step:(\d+) - ", first))
    assert saves and all(t <= deadline for _, t in saves), (saves, deadline)
    resumed = int(re.search(r"STAND-IN resumed at step (\d+)", second)[1])
    assert resumed == saves[-1][0], second
    print({"saved_before_deadline_s": deadline - saves[-1][1], "steps_lost": last_step - resumed,
           "steps_lost_without": last_step})  # for the record (pytest -s)
    assert last_step - resumed < last_step and "STAND-IN done at step" in second


def wait_ended(job: str) -> str:
    wait_for(lambda: job_state(job, settle=False) in FINAL, 420, f"job {job} to end")
    return job


@side_by_side(lambda root, option: Job(build(root), options=(option,)))
@pytest.mark.parametrize(("option", "message"), [
    ("--nodes=1", r"allocation has 1 nodes \(n\d\), the spec asks for 2"),
    ("--gpus-per-node=4", r"Slurm gives 4 GPUs per node, the spec asks for 8"),
], ids=["nodes", "gpus"])
def test_allocation_that_differs_from_the_spec_fails_with_both_numbers(ended: Ended, option: str,
                                                                      message: str) -> None:
    assert ended.state == "FAILED" and re.search(message, ended.output), ended.output


PROBE = """\
# Runs as the job's data step, on the head node while Ray is up: where does the dashboard listen, and what of
# the head does another node of the job reach?
import json, os, shutil, socket, subprocess, sys
import psutil

out = sys.argv[sys.argv.index("--local_save_dir") + 1]
os.makedirs(out, exist_ok=True)
listening = {}
for c in psutil.net_connections("tcp"):
    if c.status == "LISTEN" and c.pid:
        try:
            cmd = " ".join(psutil.Process(c.pid).cmdline())
        except psutil.Error:
            continue
        # the dashboard's HTTP port (the Jobs API); its internal gRPC port, like the GCS, serves the cluster
        if "dashboard/dashboard.py" in cmd and f"--port={c.laddr.port}" in cmd:
            listening.setdefault(str(c.laddr.port), []).append(c.laddr.ip)
others = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
          if a.family == socket.AF_INET and not a.address.startswith("127.")]
head, gcs = os.environ["RAY_ADDRESS"].rsplit(":", 1)
ports = {"gcs": int(gcs), **{f"dashboard {p}": int(p) for p in listening}}
connect = ("import json, socket, sys\\nhost, ports = sys.argv[1], json.loads(sys.argv[2])\\nok = {}\\n"
           "for name, port in ports.items():\\n    with socket.socket() as s:\\n        s.settimeout(3)\\n"
           "        ok[name] = s.connect_ex((host, port)) == 0\\nprint(json.dumps(ok))")
other = subprocess.run(["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n2", sys.executable, "-c", connect,
                        head, json.dumps(ports)], capture_output=True, text=True, timeout=60)
json.dump({"listening": listening, "others": others, "head": head,
           "from_n1": {ip: json.loads(subprocess.run([sys.executable, "-c", connect, ip, json.dumps(ports)],
                                                     capture_output=True, text=True).stdout) for ip in others},
           "from_n2": json.loads(other.stdout or "null"), "n2_error": other.stderr},
          open(f"{out}/probe.json", "w"))
for name in ("train.parquet", "test.parquet"):
    shutil.copy(f"data/{name}", f"{out}/{name}")
"""


def probe_job(root: Path) -> Job:
    (root / "probe.py").write_text(PROBE)
    prepare = f", prepare: [{{dataset: gsm8k, dir: probe, script: {root}/probe.py}}]"
    return Job(build(root, prepare=prepare), "data", ("--nodelist=n1,n2",))  # the probe reaches out from n2


@side_by_side(probe_job)
def test_the_dashboard_answers_on_the_head_loopback_only(ended: Ended) -> None:
    """The Jobs API runs code as the job's user: by default nothing but the head node itself reaches it, while
    another node reaches the head's GCS (so that the probe's own reach is shown)."""
    assert ended.state == "COMPLETED", ended.output
    probe = json.loads((ended.root / "probe" / "probe.json").read_text())
    assert probe["listening"], f"no dashboard found listening: {probe}"
    assert all(ips == ["127.0.0.1"] for ips in probe["listening"].values()), probe
    assert probe["head"] in probe["others"] and "172.17.0.1" in probe["others"], probe  # the node's two addresses
    # the head itself on its non-loopback addresses, and another host: the GCS answers, the dashboard does not
    assert all(reached == {name: name == "gcs" for name in reached} for reached in probe["from_n1"].values()), probe
    assert probe["from_n2"] == {name: name == "gcs" for name in probe["from_n2"]}, probe


@side_by_side(lambda root: Job(build(root), env={"PYTHONPATH": ""}))
def test_a_node_without_the_rollout_engine_fails_the_preflight_naming_engine_and_node(ended: Ended) -> None:
    """rollout.name is vllm: a node whose Python has no vllm would fail only once verl's workers start."""
    output = ended.output
    assert ended.state == "FAILED", output
    failures = [line.split("PREFLIGHT FAILED: ", 1)[1] for line in output.splitlines() if "PREFLIGHT FAILED" in line]
    assert failures and all(re.fullmatch(r"node \S+ \(\w{8}\): the rollout engine vllm "
                                         r"\(actor_rollout_ref\.rollout\.name\) is not installed", f)
                            for f in failures[:2]), output
    assert len([f for f in failures if "rollout engine" in f]) == 2  # each node, by its Ray node id


# A slow data preparation (#53 item 5): it records each run of it, and writes its files slowly enough that a second
# writer, or a reader that does not wait, would be caught half-way.
SLOW_PREPARE = """\
import os, shutil, sys, time
out = sys.argv[sys.argv.index("--local_save_dir") + 1]
with open("prepared.log", "a") as log:
    log.write(f"{os.uname().nodename} {out}\\n")
os.makedirs(out, exist_ok=True)
for name in ("train.parquet", "test.parquet"):
    time.sleep(4)
    shutil.copy(f"data/{name}", f"{out}/{name}")
"""


def test_a_sweep_with_one_checkpoint_folder_runs_each_variant_in_its_own(slurm: None, tmp_path: Path) -> None:
    """Both array tasks of a 2-variant sweep whose spec fixes trainer.default_local_dir: two folders. They start
    together and share one data folder: one task prepares it (slowly), the other waits for it, then skips."""
    write_fixtures(tmp_path)
    (tmp_path / "prep.py").write_text(SLOW_PREPARE)
    prepare = f", prepare: [{{dataset: gsm8k, dir: prepared, script: {tmp_path}/prep.py}}]"
    spec = build(tmp_path, prepare=prepare).parents[3] / "spec.yaml"  # the e2e spec, a sweep and a fixed folder
    ckpt = tmp_path / "ckpt"
    spec.write_text(spec.read_text().replace("verl: {", f"verl: {{trainer: {{default_local_dir: {ckpt}}}, ", 1)
                    + "sweep: {matrix: {verl.actor_rollout_ref.actor.optim.lr: [1.0e-6, 2.0e-6]}}\n")
    built = run_verlc("build", spec, "--target", "slurm", "--out", tmp_path / "out", "--force")
    assert built.returncode == 0, built.stderr
    script = next((tmp_path / "out").glob("*/slurm/sbatch.sh"))
    job = submit(script, tmp_path, stop_after="preflight")
    wait_for(lambda: not subprocess.run(["squeue", "--noheader", "--jobs", job], capture_output=True,
                                        text=True).stdout.strip(), 600, f"array job {job} to end")
    name = spec.read_text().split("name: ", 1)[1].split("\n", 1)[0]
    assert sorted(p.name for p in ckpt.iterdir()) == [f"{name}-v000", f"{name}-v001"]
    outputs = [p.read_text() for p in tmp_path.glob("slurm-*.out")]
    assert len(outputs) == 2 and all("preflight passed" in o for o in outputs), outputs
    # each task's log names it as its run does (ARRAY_JOB_TASK), not by the task's own job id (#40 item 15)
    assert sorted(re.search(r"verlc: job (\S+) on ", o)[1] for o in outputs) == [f"{job}_0", f"{job}_1"], outputs
    # one preparation for both tasks, into a folder of its own; the other task waited for it and then skipped
    [prepared] = (tmp_path / "prepared.log").read_text().splitlines()
    assert re.fullmatch(r"\S+ prepared\.partial-\S+-\d+", prepared), prepared
    assert sorted(p.name for p in (tmp_path / "prepared").iterdir()) == ["test.parquet", "train.parquet"]
    assert [p.name for p in tmp_path.glob("prepared.partial-*")] == []
    assert sum("preparing data into prepared:" in o for o in outputs) == 1, outputs
    skipped = [o for o in outputs if "data in prepared already prepared; skipping" in o]
    assert len(skipped) == 1 and "waiting for another run that is filling prepared (prepared.lock)" in skipped[0], \
        outputs


PREPARE_WITH_THE_RELEASES_PARSER = """\
# The data stage's script: verl {version}'s own gsm8k.py argument parser parses what the bundle passes,
# then the test's parquet files stand in for the dataset (no hub here).
import argparse, ast, shutil, sys, tarfile
with tarfile.open({archive!r}) as tar:
    source = tar.extractfile("examples/data_preprocess/gsm8k.py").read().decode()
main = next(n for n in ast.parse(source).body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test))
body = []
for statement in main.body:
    if "parse_args" in ast.unparse(statement):
        break
    body.append(statement)
scope = {{"argparse": argparse}}
exec(compile(ast.Module(body=body, type_ignores=[]), "gsm8k.py", "exec"), scope)
args = scope["parser"].parse_args(sys.argv[1:])
out = args.local_save_dir if "--local_save_dir" in sys.argv else args.local_dir
print("parsed by verl {version}'s gsm8k.py:", sys.argv[1:], "->", out)
import os
os.makedirs(out, exist_ok=True)
for name in ("train.parquet", "test.parquet"):
    shutil.copy(f"data/{{name}}", f"{{out}}/{{name}}")
"""


EXAMPLES_071 = REPO.parent / "shared" / "verl-examples" / "verl-v0.7.1-examples.tar.gz"
PREPARE_071 = ", prepare: [{{dataset: gsm8k, dir: prepared, script: {root}/prep.py}}]"


def prepare_job(root: Path) -> Job:
    if not EXAMPLES_071.exists():
        message = f"{EXAMPLES_071} is missing (verl's example scripts, shared beside the repository)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    (root / "prep.py").write_text(PREPARE_WITH_THE_RELEASES_PARSER.format(version="0.7.1", archive=str(EXAMPLES_071)))
    return Job(build(root, prepare=PREPARE_071.format(root=root), extra="verl_version: 0.7.1\n"), "data")


@side_by_side(prepare_job)
def test_the_data_stage_passes_the_releases_own_preprocessing_options(ended: Ended) -> None:
    """0.7.1's own gsm8k.py parses what the bundle passes (--local_save_dir); a 0.4.1 spec gets --local_dir,
    the only option that release's scripts have (its scripts are not in ../shared to run)."""
    tmp_path, output = ended.root, ended.output
    prepare = PREPARE_071.format(root=tmp_path)
    assert ended.state == "COMPLETED", output
    # the option is the release's; its folder the preparation's own, whose files then go into prepared/ (#53 item 5)
    assert re.search(r"parsed by verl 0\.7\.1's gsm8k\.py: \['--local_save_dir', 'prepared\.partial-\S+-\d+'\] -> "
                     r"prepared\.partial-", output), output
    assert (tmp_path / "prepared" / "train.parquet").exists()
    old = build(tmp_path, prepare=prepare.replace("prepared", "prepared041"), extra="verl_version: 0.4.1\n")
    [prep] = slurm_job(old.read_text())["data_prep"]  # the spec's own script, with 0.4.1's option
    assert prep["argv"] == ["python3", f"{tmp_path}/prep.py", "--local_dir", "prepared041"]


def npu_job(root: Path, shown: dict[str, str]) -> Job:
    """cluster.accelerator npu on CPU-only nodes, each node's npu-smi showing 8 NPUs (FAKE_NPUS) unless `shown`
    says otherwise for the second node (FAKE_NPUS_SECOND)."""
    script = build(root, venv=fake_venv(root, npus=True), cluster=", accelerator: npu", slurm=", npu_gres: null")
    return Job(script, env={"FAKE_NPUS": "8", **shown})


@side_by_side(lambda root: npu_job(root, {}))
def test_ascend_npus_bring_up_to_the_preflight_with_hccl_set_on_every_node(ended: Ended) -> None:
    """Ray's NPU resource on each node (the wait counts NPUs), an npu-smi on every node, HCCL's settings as every
    node's Ray workers see them (interface, timeouts, the job's own ports)."""
    root, job, output = ended.root, ended.job, ended.output
    assert ended.state == "COMPLETED", output
    assert len(re.findall(r"node registered: n\d+ \(10\.77\.0\.\d+\) NPUs=8 \(\d/2\)", output)) == 2, output
    assert "cluster ready: 2 nodes, 16 NPUs" in output and "preflight passed: 2 nodes, 16 NPUs" in output
    record = json.loads(next((root / "verlc-runs").glob(f"*-{job}/run-record.json")).read_text())
    assert [n["npus"]["npu_smi"] for n in record["nodes"]] == [8, 8]
    assert record["nodes"][0]["npus"]["chips"] == ["Ascend910_9391"] and "torch_npu" in record["versions"]
    base = PLAN.base(int(job))
    nodes = sorted(p.stem.removeprefix("env-") for p in root.glob("env-*.json"))
    assert len(nodes) == 2, nodes
    for node in nodes:
        env = json.loads((root / f"env-{node}.json").read_text())
        assert env == {"ASCEND_RT_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
                       "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1",
                       "GLOO_SOCKET_IFNAME": "eth0", "HCCL_SOCKET_IFNAME": "eth0",  # the interface of NodeAddr
                       "HCCL_CONNECT_TIMEOUT": "3600", "HCCL_EXEC_TIMEOUT": "3600",
                       "HCCL_HOST_SOCKET_PORT_RANGE": f"{base + 10}-{base + 54}",
                       "HCCL_NPU_SOCKET_PORT_RANGE": f"{base + 55}-{base + 99}"}, (node, env)


@side_by_side(lambda root: npu_job(root, {"FAKE_NPUS_SECOND": "6"}))
def test_an_ascend_node_whose_npu_smi_shows_fewer_npus_fails_the_preflight_naming_it(ended: Ended) -> None:
    output = ended.output
    assert ended.state == "FAILED", output
    failures = [line.split("PREFLIGHT FAILED: ", 1)[1] for line in output.splitlines() if "PREFLIGHT FAILED" in line]
    assert len(failures) == 1 and re.fullmatch(r"node (n\d+) \(10\.77\.0\.\d+\): npu-smi shows 6 NPUs, Ray was "
                                               r"started with 8", failures[0]), output


# The ranks of the two-node SFT job's stand-in trainer: a real torch.distributed gloo group over both nodes (torch's
# own torchrun starts it with the rendezvous verlc gave), an all-reduce of rank + 1, and where each rank ran.
RANKS = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
with open(os.path.join(sys.argv[1], f"rank-{rank}"), "w") as fh:
    fh.write(f"{os.environ['SLURMD_NODENAME']} {os.environ['GROUP_RANK']} {world} {total.item():g}")
if rank == 0:
    print(f"step:1 - train/loss:0.5 - world {world} sum {total.item():g}", flush=True)
dist.destroy_process_group()
"""


def sft_two_nodes_job(root: Path) -> Job:
    """verl's SFT program on two nodes (#43): torchrun on every node, rank 0's where verlc's runtime runs and
    the other node's as a Ray task there. No GPU here: the stand-in `torchrun` prints its argv and hands its
    rendezvous options to torch's own torchrun, which starts two gloo ranks per node running RANKS instead of
    verl's trainer; bring-up, preflight and the launch on both nodes are the real thing."""
    venv = fake_venv(root)
    (root / "ranks.py").write_text(RANKS)
    stand_in(venv, "torchrun", '#!/usr/bin/env bash\necho "TORCHRUN argv: $*"\nargs=()\n'
                               'for a in "$@"; do [[ $a == -m ]] && break; args+=("$a"); done\n'
                               f'exec python3 -m torch.distributed.run "${{args[@]}}" {root}/ranks.py {root}\n')
    spec = root / "spec.yaml"
    spec.write_text(f"""\
name: e2e-sft-two
project: e2e
program: verl.trainer.sft_trainer
model: {root}/model
data: {{train_files: [data/train.parquet], val_files: [data/test.parquet]}}
verl: {{data: {{max_length: 512}}, trainer: {{logger: [console]}}}}
cluster: {{nodes: 2, gpus_per_node: 2, slurm: {{cpus_per_task: 1, output: {root}/slurm-%j.out}}}}
container: {{runtime: none, workdir: {root}, venv: {venv}}}
""")
    result = run_verlc("build", spec, "--target", "slurm", "--out", root / "out")
    assert result.returncode == 0, result.stderr
    return Job(next((root / "out").glob("*/slurm/sbatch.sh")), "train")


@side_by_side(sft_two_nodes_job)
def test_verls_sft_program_runs_torchrun_on_every_node_with_one_rendezvous(ended: Ended) -> None:
    output = ended.output
    assert ended.state == "COMPLETED", failing_first(output)
    nodes = re.search(r"job \S+ on (\S+) (\S+); head \1", output)
    assert nodes, output
    head, other = nodes[1], nodes[2]
    placed = re.search(rf"torchrun on 2 nodes, rendezvous at ([\d.]+):(\d+): node rank 0 {head} \(\1\) \(here\), "
                       rf"1 {other} \(", output)
    assert placed, output
    assert (f"TORCHRUN argv: --node_rank=0 --master_addr={placed[1]} --master_port={placed[2]} --nnodes=2 "
            f"--nproc_per_node=2 -m verl.trainer.sft_trainer") in output, output
    assert f"torchrun on node {other} (" in output and "(node rank 1) exited with code 0" in output, output
    assert "step:1 - train/loss:0.5 - world 4 sum 10" in output, output  # 1 + 2 + 3 + 4: every rank took part
    ranks = {p.name: p.read_text().split() for p in ended.root.glob("rank-*")}
    assert ranks == {"rank-0": [head, "0", "4", "10"], "rank-1": [head, "0", "4", "10"],
                     "rank-2": [other, "1", "4", "10"], "rank-3": [other, "1", "4", "10"]}, ranks


def sft_job(root: Path) -> Job:
    """verl's SFT program on one node (#43): verlc starts it with torchrun, one process per GPU. There is no GPU
    here: a stand-in `torchrun` on the venv's PATH prints its argv and two of verl's step lines; the rest of the
    job (bring-up, preflight, the run record) is the real thing."""
    venv = fake_venv(root)
    stand_in(venv, "torchrun", '#!/usr/bin/env bash\necho "TORCHRUN argv: $*"\n'
                               'for i in 1 2; do echo "step:$i - train/loss:0.5"; done\n')
    spec = root / "spec.yaml"
    spec.write_text(f"""\
name: e2e-sft
project: e2e
program: verl.trainer.sft_trainer
model: {root}/model
data: {{train_files: [data/train.parquet], val_files: [data/test.parquet]}}
verl: {{data: {{max_length: 512}}, trainer: {{logger: [console]}}}}
cluster: {{nodes: 1, gpus_per_node: 8, slurm: {{cpus_per_task: 1, output: {root}/slurm-%j.out}}}}
container: {{runtime: none, workdir: {root}, venv: {venv}}}
""")
    result = run_verlc("build", spec, "--target", "slurm", "--out", root / "out")
    assert result.returncode == 0, result.stderr
    return Job(next((root / "out").glob("*/slurm/sbatch.sh")), "train")


@side_by_side(sft_job)
def test_verls_sft_program_runs_under_torchrun_on_one_node(ended: Ended) -> None:
    output = ended.output
    assert ended.state == "COMPLETED", failing_first(output)
    launched = next(line for line in output.splitlines() if "TORCHRUN argv: " in line)
    argv = launched.split("TORCHRUN argv: ", 1)[1].split()
    assert argv[:6] == ["--standalone", "--nnodes=1", "--nproc_per_node=8", "-m", "verl.trainer.sft_trainer",
                        "--config-name=sft_trainer_engine"], launched
    assert f"model.path={ended.root}/model" in argv and "data.max_length=512" in argv, launched
    assert "preflight passed: 1 nodes, 8 GPUs, 2 data files" in output and "step:2 - train/loss:0.5" in output


CONSTRAINTS = ["h100&ib", "h100|ib", "h100,ib", "[h100|ib]", "(h100&ib)|rack1", "h100*2", "[h100*1&ib*1]",
               "h100&&ib", "h100||ib", "&h100", "h100&", "h100|", "(h100", "h100)", "()", "h100(ib)", "h100 ib"]


def test_verlcs_constraint_grammar_is_the_controllers(slurm: None) -> None:
    """#64 item 6: each expression's verdict is slurmctld's own (sbatch --test-only against the test cluster, whose
    nodes have the features h100, ib and rack1): refused at the line by verlc exactly where Slurm refuses it."""
    from verlc.targets.slurm.section import constraint_problem

    slurms, verlcs = {}, {}
    for expression in CONSTRAINTS:
        done = subprocess.run(["sbatch", "--test-only", "-N", "1", f"--constraint={expression}", "--wrap", "true"],
                              capture_output=True, text=True, timeout=60)
        slurms[expression] = done.returncode == 0
        verlcs[expression] = constraint_problem(expression) is None
    assert verlcs == slurms
    assert not slurms["h100&&ib"] and slurms["h100&ib"]  # the case the issue names, both ways
