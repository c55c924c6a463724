"""Spec -> the kuberay target's part of the IR: the RayJob's names, pods, volumes and retries."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...compiler.derive import variant_specs
from ...compiler.ir import JobIR
from ...compiler.spec import Spec
from ..shared import MountIR, node_image, node_workdir
from .section import Kubernetes

GPU_RESOURCE = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu"}  # the device plugins' resource names
# GPU feature discovery's labels; Ascend nodes carry accelerator=huawei-Ascend910 (its device plugin's docs)
GPU_LABEL = {"cuda": "nvidia.com/gpu.product", "rocm": "amd.com/gpu.product-name", "npu": "accelerator"}
RAYJOB_NAME_MAX = 47  # KubeRay's rule: the RayJob name makes its cluster's and pods' names (DNS-1035 labels)


@dataclass(frozen=True)
class TolerationIR:
    key: str | None
    operator: str
    value: str | None
    effect: str | None


@dataclass(frozen=True)
class KubeIR:
    """The kuberay target: one RayJob (per variant), its pods and the ConfigMap with the job package."""

    names: tuple[str, ...]  # the RayJob's name, or one per variant: DNS-1035 labels of at most 47 characters
    namespace: str
    image: str
    workdir: str
    service_account: str | None
    image_pull_secret: str | None
    secret: str | None  # the Secret holding `secrets`, read with secretKeyRef
    node_selector: tuple[tuple[str, str], ...]
    tolerations: tuple[TolerationIR, ...]
    priority_class: str | None
    gpu_resource: str  # nvidia.com/gpu, amd.com/gpu, or the Ascend device plugin's (kubernetes.npu_resource)
    cpus: str | None
    memory: str | None
    shm_size: str
    volumes: tuple[MountIR, ...]
    retries: int
    ttl_after_finished: int
    deadline: int | None


def rayjob_names(spec: Spec) -> tuple[str, ...]:
    """The RayJob's name (one per sweep variant): the spec's name in lowercase, '_' and '.' as '-'.
    A name that still is not a DNS-1035 label of at most 47 characters is refused by the checks."""
    base = re.sub(r"[_.]", "-", spec.name.lower())
    count = len(variant_specs(spec))
    return tuple(f"{base}-v{i:03d}" for i in range(count)) if count else (base,)


def is_rayjob_name(name: str) -> bool:
    return len(name) <= RAYJOB_NAME_MAX and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) is not None


def lower(spec: Spec, ir: JobIR) -> KubeIR:
    k = spec.kubernetes or Kubernetes()
    image, workdir = node_image(spec, k.image), node_workdir(spec, k.workdir)
    assert image is not None and workdir is not None, "the checks refuse the kuberay target without them"
    selector = dict(k.node_selector)
    if spec.cluster.gpu_type:
        selector.setdefault(k.gpu_label or GPU_LABEL[spec.cluster.accelerator], spec.cluster.gpu_type)
    return KubeIR(
        names=rayjob_names(spec), namespace=k.namespace, image=image, workdir=workdir,
        service_account=k.service_account, image_pull_secret=k.image_pull_secret, secret=k.secret,
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(TolerationIR(t.key, t.operator, t.value, t.effect) for t in k.tolerations),
        priority_class=k.priority_class,
        gpu_resource=k.npu_resource if spec.cluster.accelerator == "npu" else GPU_RESOURCE[spec.cluster.accelerator],
        cpus=k.cpus, memory=k.memory, shm_size=k.shm_size,
        volumes=tuple(MountIR(v.claim, v.mount, "ro" if v.read_only else "") for v in k.volumes),
        retries=k.retries, ttl_after_finished=k.ttl_after_finished, deadline=k.deadline,
    )
