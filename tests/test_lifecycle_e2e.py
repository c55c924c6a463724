"""`verlc submit/status/logs/cancel/runs` against the real schedulers: the local Slurm (no accounting, so
state comes from scontrol and, once Slurm forgets a job, from its log) and a local Ray head."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from conftest import run_verlc
from test_ray_job import build as build_ray_job
from test_ray_job import ray_env, ray_head  # noqa: F401
from test_slurm_e2e import SUBMIT_ENV, build, fake_venv, slurm, wait_for, write_fixtures  # noqa: F401

from verlc.lifecycle import ledger


def verlc(root: Path, *args: str, stop_after: str = "preflight", env: dict[str, str] | None = None
          ) -> subprocess.CompletedProcess[str]:
    """verlc as the user runs it from the run folder (the submit dir), in the submitting shell's env."""
    return run_verlc(*args, cwd=root, env={**SUBMIT_ENV, **(env or {}), "HOME": str(root),
                                           "VERLC_STOP_AFTER": stop_after})


def runs_of(root: Path) -> dict[str, ledger.Run]:
    return ledger.fold(root / ledger.FILE)  # no git here: the ledger is beside the spec


def until_final(root: Path, run: str, timeout: float = 180, env: dict[str, str] | None = None) -> None:
    """Ask `verlc status` (which appends what the scheduler says) until the ledger has the run's end."""
    def ended() -> bool:
        assert verlc(root, "status", run, env=env).returncode == 0
        return runs_of(root)[run].final
    wait_for(ended, timeout, f"{run} to end")


def test_submit_follow_shows_each_stage_and_the_ledger_keeps_the_run(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    build(tmp_path)
    followed = verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", "--out", "out", "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    out = followed.stdout
    assert out.startswith("up to date: out/"), out  # the bundle build() wrote is reused, not rewritten
    [run] = runs_of(tmp_path).values()
    lines = [line.removeprefix(f"{run.run}: ") for line in out.splitlines()]
    stages = [line for line in lines if line in ("ray", "ray 1/2 nodes", "ray 2/2 nodes", "data", "preflight")]
    assert stages == ["ray", "ray 1/2 nodes", "ray 2/2 nodes", "data", "preflight"], out
    assert lines[-1] == "completed", out
    assert (run.state, run.final, run.exit_code) == ("COMPLETED", True, 0)
    assert run.submitted["spec"] == "spec.yaml" and run.submitted["target"] == "slurm"
    manifest = (tmp_path / "out" / run.name / "slurm" / "manifest.json").read_bytes()
    assert run.submitted["bundle_sha256"] == hashlib.sha256(manifest).hexdigest()
    assert Path(run.record).is_file() and json.loads(Path(run.record).read_text())["gpus"] == 16
    table = verlc(tmp_path, "runs").stdout.splitlines()
    assert table[0].split()[:3] == ["run", "spec", "target"] and table[1].split()[:3] == [run.run, "spec.yaml", "slurm"]
    assert "| run | spec |" in verlc(tmp_path, "runs", "--format", "markdown").stdout
    stage = verlc(tmp_path, "logs", run.job_id, "--stage", "preflight").stdout
    assert "verlc: stage preflight" in stage and "preflight passed: 2 nodes, 16 GPUs" in stage
    assert "stage ray" not in stage
    ray_logs = verlc(tmp_path, "logs", run.run, "--ray", "--node", "n2").stdout
    assert "==> n2/raylet.out <==" in ray_logs and "==> n1/" not in ray_logs
    missing = verlc(tmp_path, "logs", run.run, "--ray", "--node", "n9")
    assert missing.returncode == 3 and "no Ray logs of node n9" in missing.stderr and "n1, n2" in missing.stderr


def test_cancel_ends_a_training_run_and_the_ledger_records_it(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    build(tmp_path, venv=fake_venv(tmp_path))
    submitted = verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", stop_after="train")
    assert submitted.returncode == 0, submitted.stderr
    [run] = runs_of(tmp_path).values()
    wait_for(lambda: "TRAINER restart=0" in verlc(tmp_path, "logs", run.run).stdout, 180, "training to start")
    status = verlc(tmp_path, "status")
    assert status.stdout.startswith(f"{run.run}: running (job {run.job_id} on "), status.stdout
    attached = verlc(tmp_path, "attach", run.run, "--", "printenv", "SLURMD_NODENAME", "SLURM_JOB_ID")
    assert (attached.returncode, attached.stdout) == (0, f"n1\n{run.job_id}\n"), attached.stderr
    cancelled = verlc(tmp_path, "cancel", run.run)
    assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"{run.run}: cancel sent"), cancelled.stderr
    until_final(tmp_path, run.run)
    assert runs_of(tmp_path)[run.run].state == "CANCELLED"
    wait_for(lambda: "cleaning up" in verlc(tmp_path, "logs", run.run).stdout, 60, "the cleanup to run")
    ended = verlc(tmp_path, "attach", run.run)
    assert ended.returncode == 3 and "has ended (cancelled): nothing to attach to" in ended.stderr
    events = [e["event"] for e in ledger.events(tmp_path / ledger.FILE)]
    assert events[0] == "submitted" and events[-1] == "finished" and events.count("finished") == 1


def test_two_concurrent_submits_leave_two_intact_records(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    build(tmp_path)
    env = {**SUBMIT_ENV, "HOME": str(tmp_path), "VERLC_STOP_AFTER": "ray"}
    both = [subprocess.Popen([sys.executable, "-m", "verlc", "submit", "spec.yaml", "--target", "slurm"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    assert [p.wait(timeout=120) for p in both] == [0, 0], [p.stderr.read() for p in both]
    runs = runs_of(tmp_path)
    assert len(runs) == 2 and len({r.job_id for r in runs.values()}) == 2
    for run in runs.values():
        until_final(tmp_path, run.run)
        assert runs_of(tmp_path)[run.run].state == "COMPLETED"


def test_state_of_a_job_slurm_forgot_comes_from_its_log_and_else_is_an_error(slurm: None, tmp_path: Path) -> None:
    """Without accounting, a job slurmctld no longer knows has only its own log: its last exit line."""
    from verlc.lifecycle.scheduler import LaunchError
    from verlc.targets.slurm import launch

    log = tmp_path / "slurm-999999.out"
    log.write_text("[2026-12-01T03:00:00.000Z] verlc: cleaning up (exit code 1)\n"
                   "[2026-12-01T03:00:01.000Z] verlc: exit code 1\n")
    seen = launch.state({"job_id": "999999", "log": str(log)})
    assert (seen.state, seen.exit_code, seen.final) == ("FAILED", 1, True) and "log" in seen.source
    log.write_text("[2026-12-01T03:00:00.000Z] verlc: stage ray\n")
    try:
        launch.state({"job_id": "999999", "log": str(log)})
    except LaunchError as exc:
        assert "Slurm no longer knows job 999999" in str(exc)
    else:
        raise AssertionError("a job with neither Slurm's state nor an exit line must be an error")


def test_ray_job_submit_status_logs_and_runs_against_a_real_head(ray_head: str, tmp_path: Path) -> None:  # noqa: F811
    write_fixtures(tmp_path)
    build_ray_job(tmp_path)
    env = ray_env({"RAY_ADDRESS": ray_head, "VERLC_STOP_AFTER": "preflight"})
    result = subprocess.run([sys.executable, "-m", "verlc", "submit", "spec.yaml", "--target", "ray-job", "--wait"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    [run] = runs_of(tmp_path).values()
    assert (run.state, run.where) == ("SUCCEEDED", ray_head)
    logs = subprocess.run([sys.executable, "-m", "verlc", "logs", run.run, "--stage", "preflight"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert "preflight passed: 1 nodes, 8 GPUs" in logs.stdout, logs.stdout + logs.stderr
