"""Spec -> the compose target's part of the IR: the docker container every service runs."""

from __future__ import annotations

from ...compiler.ir import ContainerIR, JobIR
from ...compiler.lower import container
from ...compiler.spec import Engine, Spec


def lower(spec: Spec, ir: JobIR) -> ContainerIR:
    """Docker/podman as the spec says, else the `compose:` section's image on docker."""
    if isinstance(spec.container, Engine):
        return ir.container
    c = spec.compose
    assert c is not None, "the checks refuse the compose target without a docker image"
    engine = Engine(runtime="docker", image=c.image, workdir=c.workdir, shm_size=c.shm_size, mounts=c.mounts)
    return container(spec.model_copy(update={"container": engine}))
