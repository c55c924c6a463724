"""The Slurm bundle's lifecycle: sbatch, then the job's state from sacct, or from scontrol on clusters
without accounting (and, once slurmctld has forgotten the job, from the job's own last log line)."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

from ...compiler.ir import JobIR
from ...contract.launcher import (LaunchError, Observed, State, Submission, SubmittedRun, observed, require_secrets,
                                  tool, utc)
from ...contract.launcher import run as command
from ...runtime.protocol import ATTACH, RECORD, RUNS, parse_event, run_id

FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE"}

# Slurm's job states (squeue/scontrol/sacct) as verlc's
STATES = {"PENDING": State.PENDING, "CONFIGURING": State.PENDING, "REQUEUED": State.PENDING,
          "REQUEUE_HOLD": State.PENDING, "REQUEUE_FED": State.PENDING, "RESV_DEL_HOLD": State.PENDING,
          "RUNNING": State.RUNNING, "COMPLETING": State.RUNNING, "SUSPENDED": State.RUNNING,
          "STAGE_OUT": State.RUNNING, "SIGNALING": State.RUNNING, "RESIZING": State.RUNNING,
          "COMPLETED": State.SUCCEEDED, "CANCELLED": State.CANCELLED,
          **{s: State.FAILED for s in ("FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                                       "DEADLINE")}}


def submit(ir: JobIR, bundle: Path, cwd: Path, env: dict[str, str], after: str | None = None) -> list[Submission]:
    """sbatch from `cwd` (the job's submit dir), after creating the log folders Slurm cannot create; a
    pipeline's stage after the job of the stage before it (afterok: Slurm cancels it when that one fails)."""
    sbatch = tool("sbatch", "the slurm target submits with sbatch")
    require_secrets(ir.secrets, env, "sbatch passes them to the job's nodes")
    for folder in ir.part("slurm").log_dirs:
        (cwd / folder).mkdir(parents=True, exist_ok=True)
    chained = [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"] if after else []
    out = command([sbatch, "--parsable", *chained, str(bundle / "sbatch.sh")], cwd=cwd, env=env).stdout.strip()
    job, _, cluster = out.partition(";")
    if not job.isdigit():
        raise LaunchError(f"sbatch answered {out!r}, not a job id")
    shown = _show(job) or {}
    where = cluster or shown.get("ClusterName") or _cluster()
    if not ir.variants:
        run = run_id(ir.name, job)
        return [Submission(run=run, job_id=job, where=where, log=shown.get("StdOut"),
                           record=str(cwd / RUNS / run / RECORD))]
    # a sweep: one run per array task (<job>_<task>, as Slurm names it); each task's log is known once it starts
    return [Submission(run=run_id(ir.name, job, v.index), job_id=f"{job}_{v.index}", where=where, log=None,
                       record=str(cwd / RUNS / run_id(ir.name, job, v.index) / RECORD), variant=v.index)
            for v in ir.variants]


def _cluster() -> str:
    shown = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True).stdout
    match = re.search(r"^ClusterName\s*=\s*(\S+)", shown, re.M)
    return match[1] if match else "slurm"


def _show(job: str) -> dict[str, str] | None:
    """`scontrol show job` as a mapping, or None once slurmctld no longer knows the job."""
    result = subprocess.run([tool("scontrol", "the slurm target asks Slurm"), "show", "job", "--oneliner", job],
                            capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        return None
    line = result.stdout.splitlines()[0] if result.stdout else ""
    return dict(re.findall(r"(\w+(?::\w+)?)=(\S*)", line))


def _time(text: str | None) -> str | None:
    """A Slurm time (the controller's local time, e.g. 2026-12-01T14:10:00) in UTC; None for Unknown/None."""
    try:
        return utc(datetime.strptime(text or "", "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def _sacct(job: str) -> Observed | None:
    """The job's state from accounting, or None where the cluster keeps none (sacct then exits non-zero)."""
    result = subprocess.run(["sacct", "--jobs", job, "--allocations", "--noheader", "--parsable2",
                             "--format=State,ExitCode,Restarts,Start,End"], capture_output=True, text=True, timeout=60)
    rows = [r.split("|") for r in result.stdout.splitlines() if r.strip()]
    if result.returncode != 0 or not rows:
        return None
    row = rows[-1] + [""] * (5 - len(rows[-1]))
    state, exit_code, restarts = row[0].split()[0], row[1], row[2] or "0"
    return observed(STATES, state, int(restarts), int(exit_code.split(":")[0]), state in FINAL, "sacct",
                    _time(row[3]), _time(row[4]) if state in FINAL else None)


def state(run: SubmittedRun) -> Observed:
    job, log = run.job_id, run.log
    shown = _show(job)
    if shown is not None:  # slurmctld's own view, with the restart count accounting does not keep
        name = shown.get("JobState", "UNKNOWN")
        code = int(shown.get("ExitCode", "0:0").split(":")[0])
        # an array task's log, once it started: a pending task is shown as its array's record, a range of tasks
        task = job.partition("_")[2]
        out = shown.get("StdOut", "") if name != "PENDING" and shown.get("ArrayTaskId", "") == task else ""
        return observed(STATES, name, int(shown.get("Restarts", "0")), code if name in FINAL else None, name in FINAL,
                        "scontrol", _time(shown.get("StartTime")),
                        _time(shown.get("EndTime")) if name in FINAL else None,
                        log=out if out and not log else None)
    accounted = _sacct(job) if shutil.which("sacct") else None
    if accounted is not None:
        return accounted
    last = _last_exit(log)
    if last is not None:
        return observed(STATES, "COMPLETED" if last == 0 else "FAILED", 0, last, True, f"the job's log {log}")
    raise LaunchError(f"Slurm no longer knows job {job}, keeps no accounting, and its log has no exit line")


def _last_exit(log: str | None) -> int | None:
    """The exit code the batch script logged last (`verlc: exit code N`), if its log is readable."""
    try:
        text = Path(log).read_text(errors="replace") if log else ""
    except OSError:
        return None
    codes = [e.exit_code for e in map(parse_event, text.splitlines()) if e and e.exit_code is not None]
    return codes[-1] if codes else None


def logs(run: SubmittedRun) -> str:
    """The job's log so far (its --output file; the trainer's lines are in it too). An array task's file is
    named once the task started: slurmctld says where."""
    log = run.log or state(run).log
    try:
        return Path(log).read_text(errors="replace") if log else ""
    except FileNotFoundError:
        return ""  # pending: Slurm creates it when the job starts


def cancel(run: SubmittedRun) -> None:  # the scheduler reports the end itself
    command([tool("scancel", "the slurm target cancels with scancel"), run.job_id])


def attach(run: SubmittedRun, argv: list[str]) -> list[str]:
    """The srun command that runs ARGV (default: a shell) on the head node of a running job, where its
    commands run (inside its container), from the `attach.argv` the batch script wrote."""
    try:
        words = (Path(run.record).parent / ATTACH).read_bytes().split(b"\0")[:-1]
    except (OSError, TypeError):
        raise LaunchError(f"{run.run} has not started yet (no {ATTACH} in its run folder)") from None
    node, count, rest = words[0].decode(), int(words[1]), [w.decode() for w in words[2:]]
    step_args, prefix = rest[:count], rest[count:]
    interactive = not argv
    return [tool("srun", "attach runs a job step"), f"--jobid={run.job_id}", "--overlap", "--nodes=1",
            "--ntasks=1", f"--nodelist={node}", *(["--pty"] if interactive else []), *step_args, *prefix,
            *(argv or ["bash", "-i"])]


def service_logs(run: SubmittedRun, name: str, node: str | None) -> dict[str, str]:
    """Only asked where the run folder, which keeps them, is not on this machine."""
    where = f" ({Path(run.record).parent})" if run.record else ""
    raise LaunchError(f"{run.run}'s services' logs are in its run folder{where}, which is not on this machine")
