"""JobIR -> the SkyPilot task as data (serialized, never templated) and the views of its two scripts.

The task runs the same job package as the other targets: `run` brings up the run's own Ray on every
node (SkyPilot's node rank and IPs say which node is the head), and the head runs `python3 -m verlc_job
job`, which waits for every node and GPU before data, preflight and training (runtime/runner.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...compiler.derive import tracker_env
from ...compiler.ir import JobIR, Var, Word
from ..bundle import header_lines
from ..job_package import PACKAGE
from ...runtime.protocol import EVENT_DATE, EXIT_MESSAGE, RUNNER_STAGES, STOP_AFTER
from .lower import SkyIR

HELPER_DIR = "/opt/verlc"  # ./verlc_job is mounted at HELPER_DIR/verlc_job on every node
RAY_PORT = 6379  # SkyPilot's own Ray listens on 6380
DASHBOARD_PORT = 8280


@dataclass(frozen=True)
class SkyView:
    """What run.sh.j2 and launch.sh.j2 print; built by `sky_view`."""

    header: tuple[str, ...]
    name: str
    workdir: str
    code_folder: str | None  # the run's code, synced by SkyPilot to ~/sky_workdir (launch.sh --workdir)
    helper_dir: str
    package: str
    port: int
    dashboard_port: int
    nodes: int
    wait_seconds: int
    secrets: tuple[str, ...]
    variants: tuple[str, ...]
    tracker: tuple[tuple[str, str | None], ...]  # W&B's run: (name, value; None: the managed job's name)
    ray_options: tuple[str, ...]  # every node's `ray start` takes them (the spec's ray.debug)
    stages: tuple[str, ...] = RUNNER_STAGES  # what VERLC_STOP_AFTER may name
    event_date: str = EVENT_DATE  # date(1)'s format of an event line's time (runtime/protocol.py)
    exit_message: Word = Word((EXIT_MESSAGE, Var("status")))  # the job's last line (protocol.Event.exit_code)


def sky_view(ir: JobIR) -> SkyView:
    k: SkyIR = ir.part("skypilot")
    return SkyView(header_lines(ir), ir.name, k.workdir, ir.code.folder if ir.code else None, HELPER_DIR, PACKAGE,
                   RAY_PORT, DASHBOARD_PORT,
                   ir.nodes, ir.ray.wait_seconds, ir.secrets, tuple(str(v.index) for v in ir.variants),
                   tuple(tracker_env((e.name for e in ir.env), None).items()), ir.ray.start_options)


def task(ir: JobIR, k: SkyIR, run: str) -> dict[str, Any]:
    resources: dict[str, Any] = {"accelerators": k.accelerators, "image_id": f"docker:{k.image}"}
    for key, value in (("infra", k.infra), ("cpus", k.cpus), ("memory", k.memory), ("disk_size", k.disk_size)):
        if value is not None:
            resources[key] = value
    if k.use_spot:
        resources["use_spot"] = True
    if k.recovery:
        resources["job_recovery"] = {"strategy": k.recovery, "max_restarts_on_errors": k.max_restarts_on_errors}
    mounts: dict[str, Any] = {b.path: {"source": b.source, "mode": b.mode} for b in k.buckets}
    mounts[f"{HELPER_DIR}/{PACKAGE}"] = f"./{PACKAGE}"
    out: dict[str, Any] = {"name": ir.name, "num_nodes": ir.nodes, "resources": resources,
                           "envs": {**{e.name: e.value.display for e in ir.env}, STOP_AFTER: RUNNER_STAGES[-1],
                                    "VERLC_VARIANT": ""}}
    if ir.secrets:
        out["secrets"] = {name: None for name in ir.secrets}  # values: `sky ... --secret NAME`, from the shell
    out["file_mounts"] = mounts
    if k.volumes:
        out["volumes"] = {v.path: v.source for v in k.volumes}
    out["setup"] = ("# Fails fast, before the run, when the image lacks what the job needs.\n"
                    "python3 -c 'import ray, verl; print(\"ray\", ray.__version__, \"verl\", verl.__version__)'\n")
    out["run"] = run
    return out
