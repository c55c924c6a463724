# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The one stage runner of every bundle: the protocol's stages, each through its entry in STAGE_TABLE, stopping
after the stage VERLC_STOP_AFTER names; and a pipeline's jobs in turn."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from .cluster import alive_nodes, connect, head_address, ray_log_folder, sweep_turn, wait
from .data import materialize, merge_inputs, prepare
from .job import Job, expand
from .preflight import preflight
from .protocol import (PAUSE_AT, PIPELINE_JOBS, RUNNER_STAGES, SERVICE_LOGS, STOP_AFTER, SWEEP_AFTER,
                       SWEEP_PARALLEL, TRAINING_MESSAGE, USAGE, say, service_logs_message, skipped_message,
                       stage_message, stop_after_problem)
from .services import Services
from .train import RAY_JOB_CONFIG, in_job_env, repeats_last_attempt, train, with_deadline


def pause_at(point: str) -> None:
    """A debugging aid (and the tests' hook for cancellation): wait here, until signalled, when VERLC_PAUSE_AT
    names this point (a stage's start)."""
    if os.environ.get(PAUSE_AT) == point:
        say(f"paused at {point} ({PAUSE_AT})")
        while True:
            time.sleep(1)


def load_job(variant: str | None) -> Job:
    """The job.json next to this module (jobs/VARIANT.json for a sweep's variant): how the bundles that ship
    the runtime as the package verlc_job give it its job."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "jobs", f"{int(variant)}.json") if variant else os.path.join(here, "job.json")
    with open(path, encoding="utf-8") as fh:
        return Job.from_json(fh.read())


def load_stages() -> list[tuple[str, Job]]:
    """A pipeline's jobs next to this module (stages/<NN>-<stage>.json), in the order they run."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), PIPELINE_JOBS)
    found = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            found.append((name.removesuffix(".json").partition("-")[2], Job.from_json(fh.read())))
    return found


def pipeline(stages: list[tuple[str, Job]]) -> int:
    """A pipeline's stages in one job (the targets that do not chain jobs): each stage's job in turn; the first
    that fails stops the pipeline, named."""
    for index, (name, spec) in enumerate(stages):
        say(f"pipeline stage {index + 1}/{len(stages)}: {name} ({spec.name})")
        rc = job(spec)
        if rc != 0:
            left = [n for n, _ in stages[index + 1:]]
            say(f"ERROR: stage {name} exited with code {rc}; the pipeline stops"
                + (f" ({', '.join(left)} not run)" if left else ""))
            return rc
    say(f"pipeline done: {', '.join(n for n, _ in stages)}")
    return 0


@dataclass
class Run:
    """What the stages of one job share: the Ray cluster it runs in, and its services (from the ray stage on)."""
    address: str
    services: Services | None = None


def run_ray(job: Job, run: Run) -> int:
    """A sweep's variant waits for its turn on a shared cluster (ray-job), then for every node and GPU; the
    head's services start as the nodes come up, the services on every node once they are all up."""
    after = os.environ.get(SWEEP_AFTER, "").split()
    rc = sweep_turn(run.address, after, int(os.environ.get(SWEEP_PARALLEL) or 1)) if after else 0
    if rc:
        return rc
    if job.services or job.tool_config:
        logs = services_folder(job, run.address)
        run.services = Services(job.services, logs, job.tool_config, expand(job.run_folder) if job.run_folder else None,
                                job.device)
        run.services.start_head(head_address(run.address))
    rc = wait(run.address, job.nodes, job.total_gpus, job.wait_seconds, job.device)
    if rc == 0 and (any(s.every_node or s.own_node for s in job.services) or (job.tool_config and not job.run_folder)):
        ray = connect(run.address)
        run.services.start_nodes(ray, alive_nodes(ray))
    return rc


def services_folder(job: Job, address: str) -> str:
    """Where the services' logs go: the run folder; else, in a Ray job (ray-job, kuberay: its cluster is up), a
    folder of the head's Ray log folder, which Ray's log API reads from outside (said, relative to it); else a
    temporary folder on the head (said)."""
    if job.record:
        return os.path.dirname(expand(job.record))
    ray_logs = ray_log_folder(connect(address)) if os.environ.get(RAY_JOB_CONFIG) else None
    logs = tempfile.mkdtemp(prefix=f"verlc-services-{job.name}-", dir=ray_logs)
    if job.services:
        kept = os.path.join(logs, SERVICE_LOGS)
        say(service_logs_message(kept, os.path.relpath(kept, ray_logs) if ray_logs else None))
    return logs


def run_data(job: Job, run: Run) -> int:
    """The pinned model's revision, earlier stages' models merged, then each data preparation."""
    fetch = job.model_fetch
    rc = materialize(fetch.repo, fetch.revision, expand(fetch.folder)) if fetch else 0
    rc = rc or merge_inputs(job.inputs or [])
    for step in job.data_prep:
        rc = rc or prepare(step.out_dir, step.argv)
    if not fetch and not job.data_prep and not job.inputs:
        say("no data preparation in the spec")
    return rc


def run_preflight(job: Job, run: Run) -> int:
    return preflight(job, run.address, run.services)


def run_train(job: Job, run: Run) -> int:
    """verl's trainer, unless this attempt of a requeued job would repeat the last one's steps."""
    repeated = repeats_last_attempt(expand(job.checkpoint_dir), os.path.dirname(expand(job.record))) \
        if job.record else None
    if repeated:
        say(f"ERROR: {repeated}")
        return 1
    say(TRAINING_MESSAGE + " ".join(job.train))
    env = with_deadline({**os.environ, "RAY_ADDRESS": run.address}, job.expiry)
    if run.services:  # every process of the trainer's Ray job reads the services' addresses
        env = in_job_env(env, run.services.variables)
    rc = train(job.train, env, job.stall_timeout, run.address, nodes=job.nodes if job.every_node else 1,
               device=job.device, services=run.services, memory=job.rollout_memory)
    say(f"training exited with code {rc}")
    return rc


def stage_table(runners: dict[str, Callable[[Job, Run], int]], stages: tuple[str, ...]) -> dict:
    """The runners of `stages`, in their order: a stage without a runner (or a runner of no stage) is an error
    here, when the runtime is loaded, never a stage that runs something else."""
    if set(runners) != set(stages):
        missing, extra = sorted(set(stages) - set(runners)), sorted(set(runners) - set(stages))
        raise RuntimeError(f"the runtime's stage table does not match the protocol's stages ({', '.join(stages)}):"
                           + (f" no runner for {', '.join(missing)}" if missing else "")
                           + (f" a runner of no stage: {', '.join(extra)}" if extra else ""))
    return {stage: runners[stage] for stage in stages}


STAGE_TABLE = stage_table({"ray": run_ray, "data": run_data, "preflight": run_preflight, "train": run_train},
                          RUNNER_STAGES)


def job(spec: Job, begun: str | None = None) -> int:
    """The one stage runner of every bundle: each stage of STAGE_TABLE in turn, stopping after the stage
    VERLC_STOP_AFTER names. `begun`: the stage the caller already began and announced (the Slurm script starts
    Ray itself); it goes on here without a second line. No shell ever parses the job's argv."""
    stop_after = os.environ.get(STOP_AFTER) or RUNNER_STAGES[-1]
    problem = stop_after_problem(stop_after)
    if problem:
        say(f"ERROR: {problem}")
        return USAGE
    if spec.variant:
        say(spec.variant)
    if spec.run_folder is not None and not os.path.isdir(expand(spec.run_folder)):
        folder = expand(spec.run_folder)
        say(f"ERROR: the run folder {folder} is not here, where the job runs: its container does not mount it (the "
            f"run record and the job's end time go there); mount the folder you submit from, e.g. container.mounts "
            f"['{os.path.dirname(os.path.dirname(folder))}:{os.path.dirname(os.path.dirname(folder))}'], or submit "
            f"from a folder the container mounts")
        return USAGE
    run = Run(os.environ.get("RAY_ADDRESS") or "auto")  # the cluster this job runs in
    stopped = False
    try:
        for stage, runner in STAGE_TABLE.items():
            if stopped:
                say(skipped_message(stage, stop_after))
                continue
            if stage != begun:
                pause_at(stage)
                say(stage_message(stage))
            rc = runner(spec, run)
            if rc != 0:
                return rc
            if stage == stop_after and stage != RUNNER_STAGES[-1]:
                say(f"stopping after stage {stage} ({STOP_AFTER})")
                stopped = True
        return 0
    finally:
        if run.services:  # whatever ended the job (a failure, a stop after a stage, the trainer's end)
            run.services.stop()
