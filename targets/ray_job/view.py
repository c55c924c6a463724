"""JobIR -> RayJobView: the submit script's values, the runtime env and the job description.

Ray joins `ray job submit -- ARGS` with Windows quoting rules and hands the result to a POSIX
shell, so no spec value may travel on that command line. The entrypoint is the fixed
`python3 -m verlc_job job`; the job's argv goes in verlc_job/job.json, which Ray ships with
`py_modules` and the helper reads without any shell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...compiler.ir import JobIR
from ..bundle import header_lines
from ..job_package import COMMAND, PACKAGE, PIPELINE_COMMAND
from ...runtime.protocol import RUNNER_STAGES, RUNS, SWEEP_AFTER, SWEEP_PARALLEL

UPLOAD_CHECK = "upload_size.py"  # targets/ray_job/upload_size.py, shipped beside submit.sh
# verl's own runtime_env.yaml sets these for `ray job submit`; the spec's env wins.
VERL_RECOMMENDED_ENV = {"TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "CUDA_DEVICE_MAX_CONNECTIONS": "1"}


@dataclass(frozen=True)
class RayJobView:
    """What `submit.sh.j2` prints; built by `ray_job_view`."""

    header: tuple[str, ...]
    name: str
    address: str | None
    secrets: tuple[str, ...]
    entrypoint: tuple[str, ...]
    upload_check: str  # the bundle's script that measures the upload before submitting
    variants: tuple[str, ...]  # a sweep's variant indexes; each is one submission
    sweep_parallel: str = "1"  # how many of them run at once on the cluster (a number, as env holds it)
    stages: tuple[str, ...] = RUNNER_STAGES  # what VERLC_STOP_AFTER may name
    sweep_after: str = SWEEP_AFTER
    sweep_parallel_variable: str = SWEEP_PARALLEL


def ray_job_view(ir: JobIR) -> RayJobView:
    return RayJobView(header_lines(ir), ir.name, ir.ray.address, ir.secrets, COMMAND, UPLOAD_CHECK,
                      tuple(str(v.index) for v in ir.variants), str(ir.ray.sweep_parallel))


def pipeline_view(irs: list[JobIR]) -> RayJobView:
    """A pipeline as one Ray job: its stages in turn (`python3 -m verlc_job pipeline`)."""
    first = irs[0]
    assert first.pipeline is not None
    return RayJobView(header_lines(first), first.pipeline.name, first.ray.address,
                      tuple(dict.fromkeys(s for ir in irs for s in ir.secrets)), PIPELINE_COMMAND, UPLOAD_CHECK, ())


# What a verl working dir holds that the job never reads from the upload: checkpoints, data and weights
# (read from shared storage), virtual environments, tracker and Hydra output, verlc's own run folders.
UPLOAD_EXCLUDES = ("/.git/", "checkpoints/", "*.parquet", "*.arrow", "*.safetensors", "*.bin", "*.pt", "*.pth",
                   "*.ckpt", ".venv/", "venv/", "__pycache__/", "wandb/", "mlruns/", "tensorboard_log/", "outputs/",
                   f"{RUNS}/")


def upload_excludes(ir: JobIR) -> list[str]:
    """UPLOAD_EXCLUDES plus the run's checkpoint folder when it lies under the working dir; the data files
    the spec names relative to the working dir stay in (the job reads them from the upload)."""
    first = ir.checkpoint_dir.parts[0]
    relative = isinstance(first, str) and not first.startswith(("/", "~"))
    folder = first.split("/")[0] if relative else ""
    extra = [f"/{folder}/"] if folder and folder not in (".", "..") and f"{folder}/" not in UPLOAD_EXCLUDES else []
    kept = [f"!/{f.display.removeprefix('./')}" for f in ir.data_files
            if len(f.parts) == 1 and not f.display.startswith(("/", "~", "../"))]
    return [*UPLOAD_EXCLUDES, *extra, *sorted(set(kept))]


def runtime_env(ir: JobIR, *others: JobIR) -> dict[str, Any]:
    """runtime_env.yaml: never a secret value (submit.sh adds those from its own environment). `others`: a
    pipeline's other stages, run in the same job (their env is the first's: checks.check_pipeline), whose data
    files the upload keeps too."""
    env = dict(VERL_RECOMMENDED_ENV)
    env.update({e.name: e.value.display for e in ir.env})  # Ray expands ${NAME} in env_vars itself
    excludes = upload_excludes(ir)
    for other in others:
        excludes += [e for e in upload_excludes(other) if e not in excludes]
    return {
        "working_dir": ir.code.folder if ir.code else ir.ray.working_dir,
        "excludes": excludes,
        "py_modules": [PACKAGE],  # submit.sh makes this path absolute
        "env_vars": env,
    }
