"""The skypilot target's section: `skypilot:`, the resources, storage and recovery of a SkyPilot job."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, Strict

from ...compiler.fields import AbsPath, Bool, Int, K8sName, Model, Text, int_as_str, matching


class Bucket(Model):
    """Cloud storage mounted on every SkyPilot node."""

    source: Annotated[str, Strict(), matching(r"(s3|gs|r2|cos|oci|https)://[A-Za-z0-9_.@+=,/:-]{1,255}",
                                               "a bucket URL such as s3://bucket/path")] = Field(
        description="The bucket (and folder): s3://, gs://, r2://, cos://, oci:// or an Azure https:// URL.")
    mount: AbsPath = Field(description="Where it is mounted on every node.")
    mode: Literal["MOUNT", "MOUNT_CACHED", "COPY"] = Field("MOUNT", description="SkyPilot's storage mode: MOUNT "
                                                                              "streams, COPY copies at launch.")


class SkyVolume(Model):
    """A SkyPilot volume (created with `sky volumes apply`) mounted on every node."""

    name: K8sName = Field(description="The volume's name.")
    mount: AbsPath = Field(description="Where it is mounted on every node.")


class Skypilot(Model):
    """The skypilot target: resources, storage and recovery of a SkyPilot (managed) job."""

    image: Text | None = Field(None, description="The Docker image the nodes run; default: container.image "
                                                 "(docker or podman), else compose.image.")
    workdir: AbsPath | None = Field(None, description="Working directory in the image; default: the container's.")
    infra: Annotated[str, Strict(), matching(r"[a-z0-9*][A-Za-z0-9_./*-]{0,127}", "an infra such as aws, "
                                              "gcp/us-central1 or k8s/my-context")] | None = Field(
        None, description="Where to run (SkyPilot's infra: cloud[/region[/zone]] or k8s[/context]); default: "
                          "the cheapest that has the GPUs.")
    use_spot: Bool = Field(False, description="Spot (preemptible) instances.")
    cpus: Annotated[str, BeforeValidator(int_as_str), Strict(), matching(r"\d+\+?", "a CPU count such as 32 or "
                                                                                       "32+")] | None = Field(
        None, description="vCPUs per node, e.g. 32 or 32+ (at least).")
    memory: Annotated[str, BeforeValidator(int_as_str), Strict(), matching(r"\d+\+?", "a memory size in GB such "
                                                                                         "as 256 or 256+")] | None = Field(
        None, description="Memory per node in GB, e.g. 256 or 256+ (at least).")
    disk_size: Int | None = Field(None, ge=1, description="Boot disk size in GB.")
    buckets: tuple[Bucket, ...] = Field((), description="Buckets mounted on every node (data, checkpoints).")
    volumes: tuple[SkyVolume, ...] = Field((), description="SkyPilot volumes mounted on every node.")
    recovery: Literal["EAGER_NEXT_REGION", "FAILOVER", "off"] = Field(
        "EAGER_NEXT_REGION", description="Managed-job recovery after a preemption (job_recovery.strategy); the "
                                         "checkpoints must then be on a bucket or volume.")
    max_restarts_on_errors: Int = Field(0, ge=0, le=100, description="Also restart after a failure of the job "
                                                                    "itself (job_recovery).")
