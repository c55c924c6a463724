"""The compose target's section: `compose:`, its image when the spec's container is not docker or podman."""

from __future__ import annotations

from pydantic import Field

from ...compiler.fields import Model, Size, Text


class Compose(Model):
    """The compose target's image when `container` is not docker or podman (e.g. verl's own image)."""

    image: Text = Field(description="A Docker image with verl, ray and verl's data-prep scripts at workdir.")
    workdir: Text = Field(description="Working directory inside the container, e.g. the verl checkout.")
    shm_size: Size = Field("64G", description="Shared memory of each container.")
    mounts: tuple[Text, ...] = Field((), description="SRC:DST[:OPTS] volumes.")


def node_words(spec: object) -> list[str]:
    """The section's texts that expand on the node (`${env:NAME}` there must be set): image, workdir, mounts."""
    c = getattr(spec, "compose", None)
    return [c.image, c.workdir, *c.mounts] if c is not None else []
