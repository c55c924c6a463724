"""The skypilot bundle's lifecycle, with the `sky` CLI: the bundle's launch.sh starts a managed job (one way
to launch, by hand or by verlc); state and recovery count from `sky jobs queue --output json`; logs and
cancel with `sky jobs logs` and `sky jobs cancel`, by the job's unique name."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ...compiler.ir import JobIR
from ...contract.launcher import (LaunchError, Observed, State, Submission, SubmittedRun, observed, require_secrets,
                                  tool, variants_of)
from ...contract.launcher import run as command

FINAL = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS", "FAILED_NO_RESOURCE",
         "FAILED_CONTROLLER"}

# SkyPilot's managed-job statuses as verlc's
STATES = {"PENDING": State.PENDING, "SUBMITTED": State.PENDING, "STARTING": State.PENDING,
          "RUNNING": State.RUNNING, "RECOVERING": State.RUNNING, "CANCELLING": State.RUNNING,
          "SUCCEEDED": State.SUCCEEDED, "CANCELLED": State.CANCELLED,
          **{s: State.FAILED for s in FINAL - {"SUCCEEDED", "CANCELLED"}}}


def sky() -> str:
    return tool("sky", "the skypilot target launches with SkyPilot's sky")


def submit(ir: JobIR, bundle: Path, cwd: Path, env: dict[str, str]) -> list[Submission]:
    sky()  # before launch.sh, for the one-line error when it is missing
    require_secrets(ir.secrets, env, "sky jobs launch --secret NAME reads them")
    out = command([tool("bash", "launch.sh is a bash script"), str(bundle / "launch.sh")], cwd=cwd, env=env,
                  timeout=3600).stdout
    names = re.findall(r"^submitted (\S+)", out, re.M)
    if not names:
        raise LaunchError(f"launch.sh printed no submission: {out.strip()[-300:]}")
    return [Submission(run=name, job_id=name, where="sky jobs", log=None, record=None, variant=v)
            for name, v in zip(names, variants_of(ir, names, "launch.sh"))]


def state(run: SubmittedRun) -> Observed:
    jobs = json.loads(command([sky(), "jobs", "queue", "--output", "json"], timeout=300).stdout or "[]")
    mine = [j for j in jobs if j.get("job_name") == run.job_id]
    if not mine:
        raise LaunchError(f"sky jobs queue has no job named {run.job_id}")
    job = max(mine, key=lambda j: j.get("job_id") or 0)
    status = str(job.get("status") or "UNKNOWN").upper()
    code = 0 if status == "SUCCEEDED" else (1 if status in FINAL else None)
    return observed(STATES, status, int(job.get("recovery_count") or 0), code, status in FINAL, "sky jobs queue")


def logs(run: SubmittedRun) -> str:
    return command([sky(), "jobs", "logs", "--name", run.job_id, "--no-follow"], timeout=300).stdout


def cancel(run: SubmittedRun) -> None:  # the controller reports the end; `status` asks it
    command([sky(), "jobs", "cancel", "--yes", "--name", run.job_id], timeout=300)


def attach(run: SubmittedRun, argv: list[str]) -> list[str]:
    raise LaunchError(f"{run.run} runs on a cluster SkyPilot manages for the job: find it with "
                      f"`sky status` and reach its head with `ssh <cluster>`")


def service_logs(run: SubmittedRun, name: str, node: str | None) -> dict[str, str]:
    raise LaunchError(f"{run.run}'s services' logs are on its cluster's head (the folder its log names): find the "
                      f"cluster with `sky status` and read them over `ssh <cluster>`")
