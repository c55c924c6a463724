# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The job protocol: what the cluster hands back, and the names both sides use, written once.

Three parties share it. The build (targets/*/view.py) decides a `Job` (runtime/job.py) and writes it into the
bundle; the runtime (this package) loads that `Job` on the cluster, runs its stages and prints event lines; the
lifecycle (lifecycle/, each target's launch.py) reads those lines and the run folder's files back. Each of
them takes the names below from here, and the bash templates get them from their views, so a rename is one
edit here.

Standard library only: every bundle ships it with the rest of the runtime (targets/job_package.py).
"""

from __future__ import annotations

import json
import re
import sys
import time
from dataclasses import dataclass
from datetime import datetime

# ---- the stages ------------------------------------------------------------------------------------------
# Every stage a run goes through, in order. "containers" is the Slurm script's own (it starts the job's
# containers before Ray); the runtime's stage runner runs the others.
STAGES = ("containers", "ray", "data", "preflight", "train")
RUNNER_STAGES = STAGES[1:]
STOP_AFTER = "VERLC_STOP_AFTER"  # run the stages up to this one, skip the rest (default: every stage)
PAUSE_AT = "VERLC_PAUSE_AT"  # wait (until signalled) at the start of this stage, or at a named point inside one


def stop_after_problem(value: str, stages: tuple[str, ...] = RUNNER_STAGES) -> str | None:
    """Why VERLC_STOP_AFTER=value names no stage of `stages`, or None."""
    if value in stages:
        return None
    return f"{STOP_AFTER}={value}: expected {', '.join(stages[:-1])} or {stages[-1]}"


# ---- exit codes ------------------------------------------------------------------------------------------
USAGE = 2  # a bad VERLC_* setting
NODE_LOST = 75  # Ray declared a node dead during the run (EX_TEMPFAIL: worth a retry on other nodes)


# ---- event lines -----------------------------------------------------------------------------------------
# Everything the bundles and the runtime report is one line `[<UTC time>] verlc: <message>`; a log may put its
# own prefix ahead of it (Compose: the service's name).
EVENT = re.compile(r"\[(?P<time>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)\] verlc: (?P<message>.*?)\s*$")
EVENT_TIME = "%Y-%m-%dT%H:%M:%S"  # and milliseconds, then Z
EVENT_DATE = "+%Y-%m-%dT%H:%M:%S.%3NZ"  # the same for date -u (the bundles' bash; the Slurm library writes it too)


def stamp(now: float | None = None) -> str:
    now = time.time() if now is None else now
    return time.strftime(EVENT_TIME, time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def event_line(message: str, now: float | None = None) -> str:
    return f"[{stamp(now)}] verlc: {message}"


def say(message: str) -> None:
    """Print one event line now (the runtime's every report): one write, whole, whichever thread says it."""
    sys.stdout.write(event_line(message) + "\n")
    sys.stdout.flush()


@dataclass(frozen=True)
class Event:
    """One event line, read back: when, what, and (for the messages below) what it means."""
    time: str
    message: str

    @property
    def at(self) -> datetime:
        """Its time (UTC, naive), to compute with."""
        return datetime.strptime(self.time, EVENT_TIME + ".%fZ")

    @property
    def stage(self) -> str | None:
        """The stage that started here ("stage NAME"; a skipped stage starts nothing)."""
        m = re.fullmatch(r"stage (\w+)", self.message)
        return m[1] if m else None

    @property
    def skipped(self) -> str | None:
        m = re.match(r"stage (\w+): skipped\b", self.message)
        return m[1] if m else None

    @property
    def node_count(self) -> tuple[int, int] | None:
        """(registered, expected) from "node registered: NAME (ADDRESS) GPUs=N (i/n)"."""
        m = re.fullmatch(r"node registered: .*\((\d+)/(\d+)\)", self.message)
        return (int(m[1]), int(m[2])) if m else None

    @property
    def exit_code(self) -> int | None:
        """The job's exit code, from its last line "exit code N"."""
        m = re.fullmatch(re.escape(EXIT_MESSAGE) + r"(\d+)", self.message)
        return int(m[1]) if m else None


def parse_event(line: str) -> Event | None:
    m = EVENT.search(line)
    return Event(m["time"], m["message"]) if m else None


# The run record in the job's log (the record file has verl's whole config too): a line per group, and per item
# of a group that is a mapping (`inputs.model`, `versions.torch`), so that no line runs to kilobytes.
RECORD_LINE = "run record: "


def record_messages(record: dict) -> list[str]:
    lines = []
    for key, value in sorted(record.items()):
        items = sorted(value.items()) if isinstance(value, dict) and value else [(None, value)]
        lines += [f"{RECORD_LINE}{key}{'.' + sub if sub is not None else ''}: {json.dumps(v, sort_keys=True)}"
                  for sub, v in items]
    return lines


def record_from_log(text: str) -> dict:
    """The run record a log's last preflight printed (its record_messages), rebuilt."""
    record: dict = {}
    seen: set[str] = set()
    for key, value in re.findall(rf"verlc: {RECORD_LINE}([\w.-]+): (.*)$", text, re.M):
        if key in seen:  # a later preflight's record (a requeued attempt) begins
            record, seen = {}, set()
        seen.add(key)
        group, _, sub = key.partition(".")
        record[group] = json.loads(value) if not sub else {**record.get(group, {}), sub: json.loads(value)}
    return record


TRAINING_MESSAGE = "training: "  # the runtime's line as it starts verl's trainer, then its argv
# service_ready_message and service_failed_message, read back: seconds from the service's start (its first, for a
# failure) until it was first seen ready, or until it failed
SERVICE_READY = re.compile(r"service (?P<name>[\w-]+): ready in (?P<seconds>[0-9.]+)s")
SERVICE_FAILED = re.compile(r"service (?P<name>[\w-]+): failed (?P<seconds>[0-9.]+)s after its start")


SERVICE_TAIL_PREFIX = "[service "  # a failed service's last lines, printed above its failure (`verlc logs -f` too)


def service_tail_line(name: str, line: str) -> str:
    return f"{SERVICE_TAIL_PREFIX}{name}] {line.rstrip()}"


def service_ready_message(name: str, seconds: float) -> str:
    return f"service {name}: ready in {seconds:g}s"


def service_failed_message(name: str, seconds: float) -> str:
    return f"service {name}: failed {seconds:g}s after its start"


def stage_message(stage: str) -> str:
    return f"stage {stage}"


def skipped_message(stage: str, stop_after: str) -> str:
    return f"stage {stage}: skipped ({STOP_AFTER}={stop_after})"


def node_message(label: str, device: str, count: float, seen: int, expected: int) -> str:
    return f"node registered: {label} {device}s={count:g} ({seen}/{expected})"


EXIT_MESSAGE = "exit code "  # the job's last line, and its exit code


def exit_message(code: int) -> str:
    return f"{EXIT_MESSAGE}{code}"


# One line of verl's console logger, `step:N - key:value - key:value ...` (behind Ray's `(TaskRunner pid=...)`
# prefix, or the SFT trainer's tqdm bar, `... 1.30s/it]step:2 - ...`): the one parser of it (the runtime's stall
# watchdog, `verlc logs --follow` in lifecycle/progress.py).
STEP_LINE = re.compile(r"(?:^|[\s)\]])step:(\d+)((?: - [^\s:]+:\S+)*)\s*$")


# ---- the start-up timeline -------------------------------------------------------------------------------
# Event lines that time a run's phases beside the stage lines (lifecycle/timeline.py reads them back).
CHECK_MESSAGE = "check "  # "check NAME: 1.234s": one preflight check, and how long it took
SLOWEST_NODE = "the slowest node: "  # of a check with a task on each node: "(the slowest node: n3 1.200s)"


def check_message(name: str, seconds: float, slowest: tuple[str, float] | None = None) -> str:
    """One check's line; `slowest`: the node whose tasks of it took longest there, and how long, where several
    nodes had one."""
    return f"{CHECK_MESSAGE}{name}: {seconds:.3f}s" + (f" ({SLOWEST_NODE}{slowest[0]} {slowest[1]:.3f}s)"
                                                       if slowest else "")


CHECK_LINE = re.compile(re.escape(CHECK_MESSAGE) + r"(?P<name>[\w -]+): (?P<seconds>\d+\.\d+)s"
                        r"(?: \(" + re.escape(SLOWEST_NODE) + r"(?P<node>\S+) (?P<node_seconds>\d+\.\d+)s\))?")
# the Slurm script's image on each node (targets/slurm/library.sh fetch_image): there already, or pulled or built
IMAGE_LINE = re.compile(r"image on (?P<node>\S+): (?:present|(?P<how>pulled|built) in (?P<seconds>\d+\.\d)s)")
TRAINER_MESSAGE = "trainer: "  # a milestone of verl's own start-up, stamped as the runtime relays the line
# verl's start-up milestones, each known by a line its trainer prints: the same text in every release from 0.3.0 to
# 0.9.1 (read from their code). In the order they come: RayPPOTrainer's __init__ builds the dataloader (and prints
# the step total), init_workers builds the worker groups (print_model_size, as each model loads) and the rollout
# engine, fit() loads a checkpoint or says it trains from scratch, validates first where val_before_train, then
# its console logger prints a line per step.
TRAINER_MILESTONES = (
    ("dataloader ready", re.compile(r"Total training steps: \d+")),
    ("first model loaded", re.compile(r"\bcontains [\d.]+\w? parameters")),
    ("workers up", re.compile(r"Training from scratch|Load from checkpoint folder: \S+")),
    ("initial validation done", re.compile(r"Initial validation metrics")),
)
# Running out of memory, as the trainer's processes say it: a GPU's (torch's allocator on CUDA, ROCm or Ascend;
# vLLM refusing to start beside what the GPU holds: vllm/v1/worker/utils.py, 0.24.0) or a node's host memory (Ray's
# memory monitor killing a worker, ray.exceptions.OutOfMemoryError). They look alike to a user and are fixed
# differently: the runtime says which, once each.
OUT_OF_MEMORY = (
    ("GPU", re.compile(r"(?:CUDA|HIP|NPU) out of memory|CUDA error: out of memory|"
                       r"Free memory on device .* is less than desired GPU memory utilization")),
    ("host", re.compile(r"ray\.exceptions\.OutOfMemoryError|Task was killed due to the node running low on memory|"
                        r"which exceeds the memory usage threshold of [\d.]+")),
)
FIRST_STEP = "first step"  # "trainer: first step (step N)": a requeued run's first step is its checkpoint's next
STEP_TIMES = re.compile(re.escape(TRAINER_MESSAGE) + r"(?P<steps>\d+) steps, median step (?P<median>\d+\.\d+)s")


def step_times_message(steps: int, median: float) -> str:
    return f"{TRAINER_MESSAGE}{steps} steps, median step {median:.3f}s"


CLOCKS_MESSAGE = "node clocks against the head's: "  # each node's offset, as the preflight measured it


def clocks_message(offsets: dict[str, tuple[float, float]]) -> str:
    """Each node's clock against the head's (node -> (offset, within)): its log lines' times are off by that."""
    return CLOCKS_MESSAGE + ", ".join(f"{node} {offset:+.3f}s (within {within:.3f}s)"
                                      for node, (offset, within) in sorted(offsets.items()))


CLOCK_OFFSET = re.compile(r"(?P<node>\S+) (?P<offset>[+-]\d+\.\d+)s \(within (?P<within>\d+\.\d+)s\)")

# ---- the bundle -------------------------------------------------------------------------------------------
MANIFEST = "manifest.json"  # a bundle's files with their sha256 and modes, its spec and verlc's version

PIPELINE_JOBS = "stages"  # a pipeline run as one job: verlc_job/stages/<NN>-<stage>.json, in the order they run

# ---- the run folder --------------------------------------------------------------------------------------
RUNS = "verlc-runs"  # a Slurm run's folder is <submit dir>/verlc-runs/<run id>/
RECORD = "run-record.json"  # the preflight's record: inputs, versions, verl config, resources
JOB_LOG = "job.log"  # the runtime's output on the head node
RAY_LOGS = "ray-logs"  # <node>/: each node's Ray session logs, bounded, with TRUNCATED.txt
TRUNCATED = "TRUNCATED.txt"  # in each node's ray-logs: what the bound cut
ATTACH = "attach.argv"  # how `verlc attach` enters the head node: NUL-separated node, count, step args, prefix
END_TIME = "end-time"  # the job's end in epoch seconds, as the scheduler has it now
TRAIN_STARTS = "train-start.json"  # per attempt: the latest checkpoint's step when training began
TIME_LIMIT_REACHED = "time-limit-reached"  # the attempt (SLURM_RESTART_COUNT) that the time limit stopped
REFERENCE = "verlc-first-run.json"  # a reproducible job's first run record, beside its checkpoints
JOB_END = "VERLC_JOB_END"  # the job's end (epoch seconds) where a launcher sets it at submission (kuberay)
# A sweep submitted at once to one Ray cluster (ray-job): a variant's job waits until fewer than SWEEP_PARALLEL of
# the submissions in SWEEP_AFTER (the variants submitted before it, space-separated) have yet to end
SWEEP_AFTER = "VERLC_SWEEP_AFTER"
SWEEP_PARALLEL = "VERLC_SWEEP_PARALLEL"


# ---- services beside the trainer -------------------------------------------------------------------------
SERVICE_PORTS = "VERLC_SERVICE_PORTS"  # "FIRST-LAST": the ports of the job's block a target gives its services
SERVICE_LOGS = "services"  # <run folder>/services/<name>.log: each head service's output
# A service in an image of its own (job.Service.image) is the target's: it starts the service's container on the
# head node, beside the bring-up, with the service's variables (Service.variables: host, port, url and a token
# it makes for the run) in that container's env and in the runtime's, and removes it with the job. Its port is
# the one of the services' block (SERVICE_PORTS) at the service's place in the spec, as the runtime's are; its
# output goes to the run folder's services/<name>.log where the job has one. The runtime checks, probes and
# watches it like its own, and neither starts nor stops it.
# A job without a run folder (ray-job, kuberay, skypilot) keeps its services' logs in a folder of Ray's log folder
# on each node (the runtime says which, relative to it): Ray's log API reads them from outside the cluster
SERVICE_LOGS_IN_RAY = re.compile(r"the services' logs: \S+ on the head node \(in Ray's log folder of each node: "
                                 r"(?P<folder>\S+)\)")


def service_logs_message(folder: str, in_ray: str | None) -> str:
    """Where a job without a run folder keeps its services' logs: `folder` on the head node, `in_ray` relative to
    Ray's log folder where it is in it."""
    return f"the services' logs: {folder} on the head node" + (
        f" (in Ray's log folder of each node: {in_ray})" if in_ray else "") + ", kept after the job"
TOOL_CONFIG_FILE = "tool-config.yaml"  # <run folder>/: the spec's tool config, as verl read it (kept with the run)


# ---- run ids ---------------------------------------------------------------------------------------------
def run_id(name: str, job_id: str, task: int | str | None = None) -> str:
    """A run's id: <spec name>-<scheduler's job id>, and _<task> for a sweep's array task. Requeues keep it;
    it names the run folder and is the experiment tracker's run id, so a requeued run continues its W&B run."""
    return "".join(str(part) for part in run_id_parts(name, job_id, task))


def run_id_parts(name: str, job_id: object, task: object = None) -> tuple[object, ...]:
    """The parts of `run_id`, where the job id and task may be what stands for them until the job runs (the
    Slurm script's shell variables)."""
    return (f"{name}-", job_id, *(("_", task) if task is not None else ()))
