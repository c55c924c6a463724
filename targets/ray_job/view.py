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
from ..job_package import COMMAND, PACKAGE
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
    variants: tuple[str, ...]  # a sweep's variant indexes; each is one submission


def ray_job_view(ir: JobIR) -> RayJobView:
    return RayJobView(header_lines(ir), ir.name, ir.ray.address, ir.secrets, COMMAND,
                      tuple(str(v.index) for v in ir.variants))


def runtime_env(ir: JobIR) -> dict[str, Any]:
    """runtime_env.yaml: never a secret value (submit.sh adds those from its own environment)."""
    env = dict(VERL_RECOMMENDED_ENV)
    env.update({e.name: e.value.display for e in ir.env})  # Ray expands ${NAME} in env_vars itself
    return {
        "working_dir": ir.ray.working_dir,
        "excludes": ["/.git/"],
        "py_modules": [PACKAGE],  # submit.sh makes this path absolute
        "env_vars": env,
    }
