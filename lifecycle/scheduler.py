"""What every target's launcher shares: running the scheduler's own tools, and what they report."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


class LaunchError(Exception):
    """One line for the user (no scheduler, unreachable address, unknown job); `code` is verlc's exit code."""

    def __init__(self, message: str, code: int = 3) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Submission:
    run: str  # the run id: what the target calls the job, made unique (e.g. <name>-<slurm job id>)
    job_id: str
    where: str  # the cluster, Ray address or host it went to
    log: str | None  # where the job's own log is, when it is a file
    record: str | None  # where the in-cluster run record will be


@dataclass(frozen=True)
class Observed:
    state: str  # the scheduler's word, upper case (PENDING, RUNNING, COMPLETED, FAILED, ...)
    restarts: int = 0
    exit_code: int | None = None
    final: bool = False
    source: str = ""  # which tool said so
    started: str | None = None  # when the scheduler started the job (UTC, %Y-%m-%dT%H:%M:%SZ), if it says
    ended: str | None = None  # when it ended, if it says


def utc(moment: datetime | None) -> str | None:
    """A scheduler's time as the ledger writes times."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


def tool(name: str, why: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise LaunchError(f"{name} is not on PATH ({why})", code=4)
    return path


def run(argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run a scheduler command; a failure becomes one LaunchError line with the tool's own message."""
    try:
        result = subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{Path(argv[0]).name} did not answer within {timeout:g}s") from None
    if result.returncode != 0:
        said = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise LaunchError(f"{Path(argv[0]).name} {argv[1] if len(argv) > 1 else ''} failed (exit "
                          f"{result.returncode}): {said[-1] if said else 'no message'}")
    return result
