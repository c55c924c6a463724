"""What every target's launcher shares: running the scheduler's own tools, and what they report."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ..compiler.ir import JobIR


class LaunchError(Exception):
    """One line for the user (no scheduler, unreachable address, unknown job); `code` is verlc's exit code."""

    def __init__(self, message: str, code: int = 3) -> None:
        super().__init__(message)
        self.code = code


def require_secrets(secrets: tuple[str, ...], env: dict[str, str], how: str) -> None:
    """A launcher whose job reads the spec's secrets from the submitting shell checks them before it queues anything
    (a Slurm job, or each task of an array, would otherwise die at its start after the queue)."""
    missing = [name for name in secrets if not env.get(name)]
    if missing:
        raise LaunchError(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set: the spec's secrets "
                          f"come from this shell ({how}); export {'it' if len(missing) == 1 else 'them'} and submit "
                          f"again (nothing was queued)", 2)


# `verlc submit --resume RUN` tells the launcher the tracker run to continue (ray-job's submit.sh reads it too)
TRACKER_RUN = "VERLC_TRACKER_RUN"
RESUMES = "VERLC_RESUMES"  # ... and which run that was, for the ledger


@dataclass(frozen=True)
class Submission:
    run: str  # the run id: what the target calls the job, made unique (e.g. <name>-<slurm job id>)
    job_id: str
    where: str  # the cluster, Ray address or host it went to
    log: str | None  # where the job's own log is, when it is a file
    record: str | None  # where the in-cluster run record will be
    variant: int | None = None  # a sweep's variant this job runs (JobIR.variants' index)


class State(Enum):
    """Where a run is, the same for every target: each launcher maps its scheduler's words onto these."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class SubmittedRun:
    """What a launcher is told of a run it submitted: the ledger's `submitted` event's fields that name the job
    to its scheduler (lifecycle/ledger.py Run.submission)."""
    run: str  # the run id
    target: str
    job_id: str
    where: str  # the cluster, Ray address, namespace or host it went to
    bundle: str  # the bundle's folder it was submitted from
    log: str | None = None  # the job's own log file, where it is one (named at submission, or once it started)
    record: str | None = None  # where the in-cluster run record will be


@dataclass(frozen=True)
class Observed:
    scheduler_state: str  # the scheduler's word, upper case (PENDING, RUNNING, COMPLETED, ...): shown and recorded
    restarts: int = 0
    exit_code: int | None = None
    final: bool = False
    source: str = ""  # which tool said so
    started: str | None = None  # when the scheduler started the job (UTC, %Y-%m-%dT%H:%M:%SZ), if it says
    ended: str | None = None  # when it ended, if it says
    state: State = State.UNKNOWN  # the scheduler's word as one of verlc's states
    log: str | None = None  # the job's log file, where the scheduler names it only once the job started


def variants_of(ir: JobIR, jobs: Sequence[str], tool_name: str) -> list[int | None]:
    """The sweep's variant each submitted job runs: the bundles submit one job per variant, in variant order."""
    variants = [v.index for v in ir.variants] or [None]
    if len(jobs) != len(variants):
        raise LaunchError(f"{tool_name} submitted {len(jobs)} job(s) for {len(variants)} variant(s): {', '.join(jobs)}")
    return variants


def observed(states: Mapping[str, State], word: str, *args: object, **fields: object) -> Observed:
    """What a scheduler said (`word` and the rest, as Observed takes them), with `word` mapped through the
    launcher's table onto verlc's states."""
    return Observed(word, *args, state=states.get(word, State.UNKNOWN), **fields)  # type: ignore[arg-type]


class Launcher(Protocol):
    """A target's lifecycle with its scheduler's own tools (targets/<folder>/launch.py), each call about one
    submitted run."""

    def submit(self, ir: JobIR, bundle: Path, cwd: Path, env: dict[str, str], after: str | None = None
               ) -> list[Submission]:
        """Submit the bundle from `cwd`; one Submission per job (a sweep may make several). `after`: the job
        this one starts after, once it succeeded (a pipeline's stage before it; only a CHAIN target: compiler/catalog.py)."""

    def state(self, run: SubmittedRun) -> Observed:
        """What the scheduler says of the run now (LaunchError when it cannot say)."""

    def logs(self, run: SubmittedRun) -> str:
        """The run's log so far ('' before it starts)."""

    def cancel(self, run: SubmittedRun) -> Observed | None:
        """Stop the run. The final state when stopping removed what `state` asks (Compose's containers, the
        RayJob); None when the scheduler goes on reporting the run, so that `state` says how it ended."""

    def attach(self, run: SubmittedRun, argv: list[str]) -> list[str]:
        """The argv that runs `argv` (a shell when empty) where the run's commands run on its head node."""

    def service_logs(self, run: SubmittedRun, name: str, node: str | None) -> dict[str, str]:
        """Service `name`'s logs (every node's, or `node`'s only) as file name -> text, for a run whose run
        folder is not on this machine; LaunchError naming where they are where verlc cannot read them."""


def is_service_log(filename: str, name: str, node: str | None) -> bool:
    """Whether `filename` is a log of service `name` (NAME.log on the head, NAME-NODE.log on each node), on `node`
    where one is named."""
    stem = filename.rsplit("/", 1)[-1].removesuffix(".log")
    return filename.endswith(".log") and (stem == f"{name}-{node}" if node else
                                          stem == name or stem.startswith(f"{name}-"))


# a target's name -> its Launcher: the lifecycle gets it from the composition root (verlc/), which has the
# target registry's targets.launcher; lifecycle/ itself imports no target
Launchers = Callable[[str], Launcher]


def utc(moment: datetime | None) -> str | None:
    """A scheduler's time as the ledger writes times."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


def tool(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise LaunchError(f"{name} is not on PATH ({why})", code=4)
    return path


def run(argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 120, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command; a failure becomes one LaunchError line with the tool's own message."""
    try:
        result = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                                input=stdin)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{Path(argv[0]).name} did not answer within {timeout:g}s") from None
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise LaunchError(f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''} failed (exit "
                          f"{result.returncode}): {said[-1] if said else 'no message'}")
    return result
