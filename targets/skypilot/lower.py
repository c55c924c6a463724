"""Spec -> the skypilot target's part of the IR: the task's resources, storage and recovery."""

from __future__ import annotations

from dataclasses import dataclass

from ...compiler.ir import JobIR
from ...compiler.spec import Spec
from ..shared import MountIR, node_image, node_workdir
from .section import Skypilot


@dataclass(frozen=True)
class SkyIR:
    """The skypilot target: one task (a managed job with recovery, or `sky launch` on a cluster)."""

    names: tuple[str, ...]  # the task's name, or one per variant
    image: str
    workdir: str
    accelerators: str  # GPU model:count per node
    infra: str | None
    use_spot: bool
    cpus: str | None
    memory: str | None
    disk_size: int | None
    buckets: tuple[MountIR, ...]
    volumes: tuple[MountIR, ...]
    recovery: str | None  # job_recovery strategy; None: no recovery
    max_restarts_on_errors: int


def lower(spec: Spec, ir: JobIR) -> SkyIR:
    k = spec.skypilot or Skypilot()
    image, workdir = node_image(spec, k.image), node_workdir(spec, k.workdir)
    assert image is not None and workdir is not None and spec.cluster.gpu_type is not None, \
        "the checks refuse the skypilot target without them"
    count = len(ir.variants)
    return SkyIR(
        names=tuple(f"{spec.name}-v{i:03d}" for i in range(count)) if count else (spec.name,),
        image=image, workdir=workdir, accelerators=f"{spec.cluster.gpu_type}:{spec.cluster.gpus_per_node}",
        infra=k.infra, use_spot=k.use_spot, cpus=k.cpus, memory=k.memory, disk_size=k.disk_size,
        buckets=tuple(MountIR(b.source, b.mount, b.mode) for b in k.buckets),
        volumes=tuple(MountIR(v.name, v.mount) for v in k.volumes),
        recovery=None if k.recovery == "off" else k.recovery, max_restarts_on_errors=k.max_restarts_on_errors,
    )
