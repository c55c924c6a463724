"""The job protocol: what the build hands the cluster, and what the cluster hands back, written once.

Three parties share it. The build (targets/*/view.py) decides a `Job` and writes it into the bundle; the
runtime (targets/runtime.py) loads that `Job` on the cluster, runs its stages and prints event lines; the
lifecycle (lifecycle/, each target's launch.py) reads those lines and the run folder's files back. Each of
them takes the names below from here, and the bash templates get them from their views, so a rename is one
edit here.

Standard library only: every bundle ships this file beside the runtime (the package verlc_job/; the Slurm
script embeds both, this one first).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

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
EVENT_TIME = "%Y-%m-%dT%H:%M:%S"  # and milliseconds, then Z (bash: date -u +%Y-%m-%dT%H:%M:%S.%3NZ)


def stamp(now: float | None = None) -> str:
    now = time.time() if now is None else now
    return time.strftime(EVENT_TIME, time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z"


def event_line(message: str, now: float | None = None) -> str:
    return f"[{stamp(now)}] verlc: {message}"


@dataclass(frozen=True)
class Event:
    """One event line, read back: when, what, and (for the messages below) what it means."""
    time: str
    message: str

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
        m = re.fullmatch(r"exit code (\d+)", self.message)
        return int(m[1]) if m else None


def parse_event(line: str) -> Event | None:
    m = EVENT.search(line)
    return Event(m["time"], m["message"]) if m else None


def stage_message(stage: str) -> str:
    return f"stage {stage}"


def skipped_message(stage: str, stop_after: str) -> str:
    return f"stage {stage}: skipped ({STOP_AFTER}={stop_after})"


def node_message(label: str, device: str, count: float, seen: int, expected: int) -> str:
    return f"node registered: {label} {device}s={count:g} ({seen}/{expected})"


def exit_message(code: int) -> str:
    return f"exit code {code}"


# One line of verl's console logger, `step:N - key:value - key:value ...` (behind Ray's `(TaskRunner pid=...)`
# prefix, or the SFT trainer's tqdm bar, `... 1.30s/it]step:2 - ...`): the one parser of it (the runtime's stall
# watchdog, `verlc logs --follow` in lifecycle/progress.py).
STEP_LINE = re.compile(r"(?:^|[\s)\]])step:(\d+)((?: - [^\s:]+:\S+)*)\s*$")


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


# ---- run ids ---------------------------------------------------------------------------------------------
def run_id(name: str, job_id: str, task: int | str | None = None) -> str:
    """A run's id: <spec name>-<scheduler's job id>, and _<task> for a sweep's array task. Requeues keep it;
    it names the run folder and is the experiment tracker's run id, so a requeued run continues its W&B run."""
    return "".join(str(part) for part in run_id_parts(name, job_id, task))


def run_id_parts(name: str, job_id: object, task: object = None) -> tuple[object, ...]:
    """The parts of `run_id`, where the job id and task may be what stands for them until the job runs (the
    Slurm script's shell variables)."""
    return (f"{name}-", job_id, *(("_", task) if task is not None else ()))


# ---- the job ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Job:
    """What the runtime runs: wait for the cluster, data, preflight, train. Paths are words: lists of text
    and {"env": NAME} parts that the runtime expands on the node."""
    generated_from: str
    spec_sha256: str
    name: str
    variant: str | None  # a sweep variant's label, logged first
    nodes: int
    total_gpus: int  # over every node
    device: str  # Ray's resource name of the accelerators: GPU, or NPU on Ascend
    wait_seconds: int
    data_prep: list[dict[str, Any]]  # {"out_dir", "argv"}
    model_fetch: dict[str, Any] | None  # {"repo", "revision", "folder"}
    model: list
    checkpoint_dir: list
    data_files: list[list]
    data_columns: list[str]  # every data file must have them (none: the program's columns are not checked)
    require_env: list[str]
    pins: list[str]  # "package=version"
    verl_commit: str | None
    code: dict[str, Any] | None
    rollout_package: str | None
    startup: list[dict[str, Any]] | None  # what verl's workers import and refuse at start-up
    image: str
    record: list | None  # where the preflight writes the run record
    reference: list | None  # a reproducible job's first run record
    train: list[str]  # the trainer's argv
    stall_timeout: int | None
    # verl's save ahead of the job's end: {"variable": where verl reads its deadline, "lead": seconds before the
    # end, and where the end (epoch seconds) is: "end_file" (a word) or "end_env" (a variable, e.g. JOB_END)}
    expiry: dict[str, Any] | None = None
    # a pipeline stage's models from earlier stages, merged in its data stage: {"stage": its job name,
    # "checkpoint_dir": a word, "layout": the shards' folder in global_step_N ("actor" or ""), "merger": verl's
    # merger argv up to --local_dir, "merged": a word, the folder of merged steps, "latest": a word, the link in it
    # to the last one merged (the stage's model)}
    inputs: list[dict[str, Any]] | None = None
    # torchrun on every node (a program that sets up torch.distributed itself, on more than one node): node i
    # runs `train` with --node_rank=i and the rendezvous at the runtime's own node, rank 0
    every_node: bool = False

    def to_json(self) -> str:
        """For review: one key per line, and a long list (the trainer's argv) one item per line."""
        lines = []
        for key, value in asdict(self).items():
            text = json.dumps(value, ensure_ascii=False)
            if isinstance(value, list) and value and len(text) > 100:
                text = "[\n" + ",\n".join(f"    {json.dumps(v, ensure_ascii=False)}" for v in value) + "\n  ]"
            lines.append(f"  {json.dumps(key)}: {text}")
        return "{\n" + ",\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text: str) -> Job:
        data = json.loads(text)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"not a job of this runtime: unknown keys {', '.join(unknown)}")
        return cls(**data)

    def with_variant(self, variant: Variant) -> Job:
        """A sweep's job for one variant: the base job's trainer overrides, then the variant's."""
        return replace(self, variant=variant.label, checkpoint_dir=variant.checkpoint_dir,
                       reference=variant.reference, train=[*self.train, *variant.train_overrides])


@dataclass(frozen=True)
class Variant:
    """What one array task of a sweep changes in its job (the Slurm script passes it beside the job)."""
    label: str
    checkpoint_dir: list
    reference: list | None
    train_overrides: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Variant:
        return cls(**json.loads(text))
