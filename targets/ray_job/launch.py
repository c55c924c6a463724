"""The ray-job bundle's lifecycle: its submit.sh submits (one way to submit, with or without verlc); state,
logs and stop go to the Ray Jobs REST API of the dashboard (no Ray import, so they answer at once)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

from ...compiler.ir import JobIR
from ...contract.launcher import (LaunchError, Observed, State, Submission, SubmittedRun, is_service_log, observed,
                                  tool, utc, variants_of)
from ...contract.launcher import run as command
from ...runtime.protocol import SERVICE_LOGS_IN_RAY

FINAL = {"SUCCEEDED", "FAILED", "STOPPED"}

# The Ray Jobs API's statuses as verlc's
STATES = {"PENDING": State.PENDING, "RUNNING": State.RUNNING, "SUCCEEDED": State.SUCCEEDED, "FAILED": State.FAILED,
          "STOPPED": State.CANCELLED}


def submit(ir: JobIR, bundle: Path, cwd: Path, env: dict[str, str]) -> list[Submission]:
    address = env.get("RAY_ADDRESS") or ir.ray.address
    if not address:
        raise LaunchError("no Ray address: set ray.address in the spec or RAY_ADDRESS (e.g. http://head:8265)", 2)
    _api(address, "/api/version")  # reachable before anything is uploaded
    out = command([tool("bash", "submit.sh is a bash script"), str(bundle / "submit.sh")], cwd=cwd,
              env={**env, "RAY_ADDRESS": address}, timeout=1800).stdout
    submitted = re.findall(r"^submitted (\S+) to (\S+)", out, re.M)
    if not submitted:
        raise LaunchError(f"submit.sh printed no submission: {out.strip()[-300:]}")
    variants = variants_of(ir, [sid for sid, _ in submitted], "submit.sh")
    return [Submission(run=sid, job_id=sid, where=where, log=None, record=None, variant=v)
            for (sid, where), v in zip(submitted, variants)]


def _api(address: str, path: str, method: str = "GET") -> dict:
    return json.loads(_read(address, path, method) or b"{}")


def _read(address: str, path: str, method: str = "GET") -> bytes:
    """The dashboard's answer to one request (its Jobs API, its state and log API)."""
    url = address.rstrip("/") + path
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise LaunchError(f"the Ray cluster at {address} has no {path} (an unknown job, or no Jobs API)") from None
        raise LaunchError(f"Ray at {address} answered {exc.code} to {method} {path}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise LaunchError(f"cannot reach the Ray dashboard at {address}: {reason}") from None


def state(run: SubmittedRun) -> Observed:
    info = _api(run.where, f"/api/jobs/{run.job_id}")
    status = info.get("status", "UNKNOWN")
    # the driver's exit code is not in the API; "SUCCEEDED" is the job's exit 0
    def moment(ms: object) -> str | None:  # the Jobs API gives milliseconds since the epoch (0: not yet)
        return utc(datetime.fromtimestamp(ms / 1000, timezone.utc)) if isinstance(ms, (int, float)) and ms else None

    return observed(STATES, status, 0, 0 if status == "SUCCEEDED" else None, status in FINAL, "ray jobs api",
                    moment(info.get("start_time")), moment(info.get("end_time")) if status in FINAL else None)


def logs(run: SubmittedRun) -> str:
    return _api(run.where, f"/api/jobs/{run.job_id}/logs").get("logs", "")


def service_logs(run: SubmittedRun, name: str, node: str | None) -> dict[str, str]:
    """A service's logs through Ray's log API: the job said which folder of Ray's log folder keeps them on each
    node; each live node's matching files (a node gone from the cluster took its logs with it)."""
    said = SERVICE_LOGS_IN_RAY.search(logs(run))
    if not said:
        raise LaunchError(f"{run.run}'s log names no services' logs in Ray's log folder (it has no services, has "
                          f"not started them yet, or ran a verlc that kept them elsewhere)")
    folder, found = said["folder"], {}
    listed = _api(run.where, "/api/v0/nodes?limit=10000&detail=false").get("data", {}).get("result", {})
    for each in listed.get("result", []):
        if each.get("state") != "ALIVE":
            continue
        query = urllib.parse.urlencode({"node_id": each["node_id"], "glob": f"{folder}/*.log"})
        files = _api(run.where, f"/api/v0/logs?{query}").get("data", {}).get("result", {})
        for file in sorted(f for group in files.values() for f in group if is_service_log(f, name, node)):
            query = urllib.parse.urlencode({"node_id": each["node_id"], "filename": file, "lines": -1})
            found[file.rsplit("/", 1)[-1]] = _read(run.where, f"/api/v0/logs/file?{query}").decode(errors="replace")
    if not found:
        raise LaunchError(f"no log of service {name!r}{f' on node {node}' if node else ''} in {folder} of Ray's "
                          f"log folder on the live nodes of {run.where}")
    return found


def cancel(run: SubmittedRun) -> None:  # the scheduler reports the end itself
    if not _api(run.where, f"/api/jobs/{run.job_id}/stop", "POST").get("stopped", True):
        raise LaunchError(f"Ray did not stop {run.job_id}: it had already ended")


def attach(run: SubmittedRun, argv: list[str]) -> list[str]:
    raise LaunchError(f"{run.run} runs on a Ray cluster verlc did not start: attach with your cluster's own "
                      f"access (the job's driver runs on the head of {run.where})")
