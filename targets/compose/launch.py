"""The compose bundle's lifecycle: `up --detach` in the bundle folder, state from `ps`, logs from `logs`,
and cancel is `down`. The job runs on the head service, so the head's exit is the run's end."""

from __future__ import annotations

import json
import secrets
import shutil
import time
from pathlib import Path

from ...compiler.derive import tracker_env
from ...compiler.ir import JobIR
from ...contract.launcher import (TRACKER_RUN, LaunchError, Observed, State, Submission, SubmittedRun, observed,
                                  require_secrets)
from ...contract.launcher import run as command
from ...runtime.protocol import RECORD
from ..shared import image_service_tokens
from .view import HEAD, RUN_LABEL, SERVICE_PREFIX

# The head container's state (`compose ps`), or how it ended, as verlc's
STATES = {"CREATED": State.PENDING, "RUNNING": State.RUNNING, "RESTARTING": State.RUNNING, "PAUSED": State.RUNNING,
          "COMPLETED": State.SUCCEEDED, "FAILED": State.FAILED, "DEAD": State.FAILED, "CANCELLED": State.CANCELLED}

ENDED = ("exited", "dead")  # `compose ps` states of a container whose process has ended


def compose() -> list[str]:
    """A Compose v2: the standalone `docker-compose`, or the `docker compose` plugin."""
    if standalone := shutil.which("docker-compose"):
        return [standalone]
    if docker := shutil.which("docker"):
        return [docker, "compose"]
    raise LaunchError("neither docker-compose nor docker is on PATH (the compose target runs Docker Compose)", 4)


def submit(ir: JobIR, bundle: Path, cwd: Path, env: dict[str, str]) -> list[Submission]:
    require_secrets(ir.secrets, env, "docker compose passes them to the containers")
    (bundle / "runs").mkdir(exist_ok=True)  # the run record's folder, owned by you rather than the engine
    run = f"{ir.name}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    # One bundle is one stack: `up` would replace the containers of a run still going, and remove those of one
    # that ended, with their logs. The first is refused; the second's log and exit code are kept first.
    head = _head(bundle)
    if head is not None:
        owner = _owner(head)
        if head.get("State") not in ENDED:
            stop = f"`verlc cancel {owner}`" if owner else f"`{' '.join(compose())} down` in {bundle}"
            raise LaunchError(f"{bundle} already runs {owner or 'a stack brought up by hand'} "
                              f"({head.get('State')}); one bundle runs one stack at a time: {stop} first")
        if owner:
            _keep(bundle, owner, int(head.get("ExitCode", 1)))
    # the run's W&B run id (the compose file passes these through): its own, or the run it continues
    tracker = tracker_env((e.name for e in ir.env), env.get(TRACKER_RUN) or run)
    # a token for each service in an image of its own, made for this run (the compose file reads it; view.py)
    tokens = {t: secrets.token_urlsafe(24) for t in image_service_tokens(ir)}
    command([*compose(), "up", "--detach"], cwd=bundle, env={**env, **tracker, **tokens, "VERLC_RUN": run},
            timeout=1800)
    where = env.get("DOCKER_HOST") or "local docker"
    return [Submission(run=run, job_id=ir.name, where=f"{where} ({bundle})", log=None,
                       record=str(bundle / "runs" / RECORD))]


def _bundle(run: SubmittedRun) -> Path:
    return Path(run.bundle)


def _head(bundle: Path) -> dict | None:
    """The head container as `compose ps` shows it, or None when the stack is down."""
    out = command([*compose(), "ps", "--all", "--format", "json", HEAD], cwd=bundle).stdout.strip()
    rows = json.loads(out) if out.startswith("[") else [  # older Compose prints one JSON array
        json.loads(line) for line in out.splitlines() if line.strip()]
    return rows[0] if rows else None


def _owner(head: dict) -> str:
    """The verlc run whose `up` made the head container ("" when it was brought up by hand)."""
    labels = head.get("Labels") or ""
    if isinstance(labels, str):  # Compose prints them as one "key=value,key=value" string
        labels = dict(item.partition("=")[::2] for item in labels.split(","))
    return labels.get(RUN_LABEL, "")


def state(run: SubmittedRun) -> Observed:
    if (code := _kept_exit(run)) is not None:
        return _ended(code, "the exit code kept in runs/")
    head = _head(_bundle(run))
    owner = _owner(head) if head is not None else ""
    if head is None or owner not in ("", run.run):
        now = f"its containers now run {owner}" if head is not None else "its containers were taken down"
        raise LaunchError(f"Compose has no {HEAD} container of {run.run}: {now}")
    if head.get("State") in ENDED:
        code = int(head.get("ExitCode", 1))
        _keep(_bundle(run), run.run, code)
        # the job has ended with the head: its workers, whose Ray would only notice the head gone after its
        # health checks, stop now (their containers and logs stay until `down`)
        command([*compose(), "stop"], cwd=_bundle(run), timeout=300)
        return _ended(code, "compose ps")
    return observed(STATES, str(head.get("State", "unknown")).upper(), 0, None, False, "compose ps")


def _ended(code: int, source: str) -> Observed:
    return observed(STATES, "COMPLETED" if code == 0 else "FAILED", 0, code, True, source)


def _kept(bundle: Path, run: str, suffix: str) -> Path:
    """What is kept of a run that ended (the bundle's runs/ folder): `down` and the next `up` remove the
    containers, and Compose's logs and exit code with them."""
    return bundle / "runs" / f"{run}.{suffix}"


def _kept_exit(run: SubmittedRun) -> int | None:
    kept = _kept(_bundle(run), run.run, "exit")
    return int(kept.read_text()) if kept.exists() else None


def _keep(bundle: Path, run: str, code: int | None) -> None:
    """Keep the head's log (and its exit code, once it exited) under the run's name, unless kept already."""
    if not (log := _kept(bundle, run, "log")).exists():
        log.write_text(_compose_logs(bundle))
    for service in _image_services(bundle):
        if not (kept := _kept(bundle, run, f"{service}.log")).exists():
            kept.write_text(_compose_logs(bundle, service))
    if code is not None and not (kept := _kept(bundle, run, "exit")).exists():
        kept.write_text(f"{code}\n")


def _compose_logs(bundle: Path, service: str = HEAD) -> str:
    return command([*compose(), "logs", "--no-color", "--no-log-prefix", service], cwd=bundle).stdout


def logs(run: SubmittedRun) -> str:
    if (kept := _kept(_bundle(run), run.run, "log")).exists():
        return kept.read_text(errors="replace")
    head = _head(_bundle(run))
    if head is not None and _owner(head) not in ("", run.run):
        raise LaunchError(f"{run.run}'s log is gone: its containers were replaced by {_owner(head)}'s "
                          f"before verlc kept it")
    return _compose_logs(_bundle(run))


def cancel(run: SubmittedRun) -> Observed | None:
    """`down` removes the containers, so Compose keeps no state to ask afterwards: the run ends here, with
    its log kept first. A run whose containers another run's `up` has replaced has nothing left to take down
    (and the other run's containers stay)."""
    head = _head(_bundle(run))
    if head is not None and _owner(head) not in ("", run.run):
        code = _kept_exit(run)
        return None if code is None else _ended(code, "the exit code kept in runs/")
    if head is not None:
        _keep(_bundle(run), run.run, None)
    command([*compose(), "down", "--volumes"], cwd=_bundle(run), timeout=300)
    return observed(STATES, "CANCELLED", 0, None, True, "compose down")


def attach(run: SubmittedRun, argv: list[str]) -> list[str]:
    """`compose exec` on the head service (which runs the job): ARGV, or a shell."""
    return [*compose(), "--project-directory", run.bundle, "-f", f"{run.bundle}/compose.yaml", "exec",
            *(["--no-TTY"] if argv else []), HEAD, *(argv or ["bash", "-i"])]


def service_logs(run: SubmittedRun, name: str, node: str | None) -> dict[str, str]:
    """Asked where the run folder (runs/, which keeps the runtime's services' logs) has none of `name`: a service
    in an image of its own, whose container's log Compose keeps (and verlc once the run ended, in runs/)."""
    if (kept := _kept(_bundle(run), run.run, f"{SERVICE_PREFIX}{name}.log")).exists():
        return {f"{name}.log": kept.read_text(errors="replace")}
    if f"{SERVICE_PREFIX}{name}" not in _image_services(_bundle(run)):
        raise LaunchError(f"{run.run} has no service {name!r} in an image of its own, and its run folder no log "
                          f"of it")
    return {f"{name}.log": _compose_logs(_bundle(run), f"{SERVICE_PREFIX}{name}")}


def _image_services(bundle: Path) -> list[str]:
    """The Compose services that run services in images of their own (view.py image_services)."""
    names = command([*compose(), "config", "--services"], cwd=bundle).stdout.split()
    return [n for n in names if n.startswith(SERVICE_PREFIX)]
