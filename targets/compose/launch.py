"""The compose bundle's lifecycle: `up --detach` in the bundle folder, state from `ps`, logs from `logs`,
and cancel is `down`. The job runs on the head service, so the head's exit is the run's end."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from ...compiler.derive import tracker_env
from ...compiler.ir import JobIR
from ...lifecycle.scheduler import TRACKER_RUN, LaunchError, Observed, State, Submission, observed
from ...lifecycle.scheduler import run as command
from .view import HEAD

# The head container's state (`compose ps`), or how it ended, as verlc's
STATES = {"CREATED": State.PENDING, "RUNNING": State.RUNNING, "RESTARTING": State.RUNNING, "PAUSED": State.RUNNING,
          "COMPLETED": State.SUCCEEDED, "FAILED": State.FAILED, "DEAD": State.FAILED, "CANCELLED": State.CANCELLED}


def compose() -> list[str]:
    """A Compose v2: the standalone `docker-compose`, or the `docker compose` plugin."""
    if standalone := shutil.which("docker-compose"):
        return [standalone]
    if docker := shutil.which("docker"):
        return [docker, "compose"]
    raise LaunchError("neither docker-compose nor docker is on PATH (the compose target runs Docker Compose)", 4)


def submit(ir: JobIR, bundle: Path, cwd: Path, env: dict[str, str]) -> list[Submission]:
    (bundle / "runs").mkdir(exist_ok=True)  # the run record's folder, owned by you rather than the engine
    run = f"{ir.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    # the run's W&B run id (the compose file passes these through): its own, or the run it continues
    tracker = tracker_env((e.name for e in ir.env), env.get(TRACKER_RUN) or run)
    command([*compose(), "up", "--detach"], cwd=bundle, env={**env, **tracker}, timeout=1800)
    where = env.get("DOCKER_HOST") or "local docker"
    return [Submission(run=run, job_id=ir.name, where=f"{where} ({bundle})", log=None,
                       record=str(bundle / "runs" / "run-record.json"))]


def _bundle(run: dict) -> Path:
    return Path(run["bundle"])


def state(run: dict) -> Observed:
    out = command([*compose(), "ps", "--all", "--format", "json", HEAD], cwd=_bundle(run)).stdout.strip()
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    if out.startswith("["):  # older Compose prints one JSON array
        rows = json.loads(out)
    if not rows:
        raise LaunchError(f"Compose has no {HEAD} container for {run['job_id']}: it was taken down")
    head = rows[0]
    if head.get("State") == "exited":
        code = int(head.get("ExitCode", 1))
        _keep_log(run)
        return observed(STATES, "COMPLETED" if code == 0 else "FAILED", 0, code, True, "compose ps")
    return observed(STATES, str(head.get("State", "unknown")).upper(), 0, None, False, "compose ps")


def _kept(run: dict) -> Path:
    """Where an ended run's log is kept (the bundle's runs/ folder): `down` and the next `up` remove the
    containers, and Compose's logs with them."""
    return _bundle(run) / "runs" / f"{run['run']}.log"


def _keep_log(run: dict) -> None:
    if not _kept(run).exists():
        _kept(run).write_text(_compose_logs(run))


def _compose_logs(run: dict) -> str:
    return command([*compose(), "logs", "--no-color", "--no-log-prefix", HEAD], cwd=_bundle(run)).stdout


def logs(run: dict) -> str:
    return _kept(run).read_text(errors="replace") if _kept(run).exists() else _compose_logs(run)


def cancel(run: dict) -> Observed:
    """`down` removes the containers, so Compose keeps no state to ask afterwards: the run ends here, with
    its log kept first."""
    _keep_log(run)
    command([*compose(), "down", "--volumes"], cwd=_bundle(run), timeout=300)
    return observed(STATES, "CANCELLED", 0, None, True, "compose down")


def attach(run: dict, argv: list[str]) -> list[str]:
    """`compose exec` on the head service (which runs the job): ARGV, or a shell."""
    return [*compose(), "--project-directory", run["bundle"], "-f", f"{run['bundle']}/compose.yaml", "exec",
            *(["--no-TTY"] if argv else []), HEAD, *(argv or ["bash", "-i"])]
