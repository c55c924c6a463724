"""The kuberay target's section: `kubernetes:`, where and how the RayJob's pods run."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ...compiler.fields import (
    AbsPath, Bool, Int, K8sName, LabelKey, LabelValue, Model, Quantity, Seconds, Text,
)


class Toleration(Model):
    """One Kubernetes toleration of a node taint."""

    key: LabelKey | None = Field(None, description="The taint's key (none with Exists: every taint).")
    operator: Literal["Equal", "Exists"] = Field("Equal", description="Equal: key and value match; Exists: the key.")
    value: LabelValue | None = Field(None, description="The taint's value (with Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(None, description="The effect.")


class Claim(Model):
    """A PersistentVolumeClaim mounted into every pod."""

    claim: K8sName = Field(description="The claim's name in the namespace.")
    mount: AbsPath = Field(description="Where it is mounted in every container.")
    read_only: Bool = Field(False, description="Mount it read-only.")


class Kubernetes(Model):
    """The kuberay target: where and how the RayJob's pods run. Nothing here reaches the other targets."""

    image: Text | None = Field(None, description="The pods' image (verl, ray, verl's data-prep scripts); default: "
                                                 "container.image (docker, podman or pyxis), else compose.image.")
    workdir: AbsPath | None = Field(None, description="Working directory in the pods; default: the container's.")
    namespace: K8sName = Field("default", description="The namespace of the RayJob and its ConfigMap.")
    service_account: K8sName | None = Field(None, description="The pods' service account.")
    image_pull_secret: K8sName | None = Field(None, description="A Secret for pulling the image from a private "
                                                                "registry.")
    secret: K8sName | None = Field(None, description="The Secret holding the spec's `secrets`, one key per name; "
                                                     "the pods read them with secretKeyRef (never values).")
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, description="Node labels the pods need.")
    gpu_label: LabelKey | None = Field(None, description="The node label whose value is cluster.gpu_type; default: "
                                                         "nvidia.com/gpu.product (cuda), amd.com/gpu.product-name "
                                                         "(rocm), accelerator (npu: huawei-Ascend910).")
    npu_resource: LabelKey = Field("huawei.com/Ascend910", description="cluster.accelerator npu: the resource "
                                                                      "name of the Ascend device plugin.")
    tolerations: tuple[Toleration, ...] = Field((), description="Taints the pods tolerate (e.g. GPU nodes').")
    priority_class: K8sName | None = Field(None, description="The pods' PriorityClass.")
    cpus: Quantity | None = Field(None, description="CPU request (and limit) of each pod, e.g. 64.")
    memory: Quantity | None = Field(None, description="Memory request (and limit) of each pod, e.g. 512Gi.")
    shm_size: Quantity = Field("64Gi", description="/dev/shm of each pod: a memory-backed emptyDir of this size.")
    volumes: tuple[Claim, ...] = Field((), description="PersistentVolumeClaims for data, models and checkpoints.")
    retries: Int = Field(0, ge=0, le=100, description="RayJob backoffLimit: new pods, same checkpoints (they must "
                                                      "be on a volume).")
    ttl_after_finished: Seconds = Field(3600, description="How long a finished RayJob's cluster stays for "
                                                          "inspection before KubeRay deletes it.")
    deadline: Seconds | None = Field(None, description="RayJob activeDeadlineSeconds: the run's time limit.")
