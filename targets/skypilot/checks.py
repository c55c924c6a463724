"""What the skypilot target cannot run: no OCI image, no GPU model to ask for, env values that need a
shell, checkpoints that a recovery on new nodes would not find."""

from __future__ import annotations

from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.load import Sourced
from ...compiler.verl.check import Selection
from ...compiler.spec import Spec
from ..shared import image_problems, image_services_refused, kept, literal_env, node_image, node_workdir
from .section import Skypilot


def check_build(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:  # noqa: ARG001
    k = spec.skypilot or Skypilot()
    image, workdir = node_image(spec, k.image), node_workdir(spec, k.workdir)
    yield from image_problems(spec, sourced, "skypilot", "skypilot", image, workdir,
                              spec.skypilot.workdir if spec.skypilot else None, "SkyPilot")
    if spec.cluster.accelerator == "npu":
        # its task parser takes any accelerator name, but its clouds' catalogs and its Kubernetes support
        # (nvidia.com/gpu, amd.com/gpu, google.com/tpu) have no Ascend NPU: a task would never be placed
        yield sourced.diagnostic(("cluster", "accelerator"), "the skypilot target cannot run on Ascend NPUs: "
                                 "SkyPilot's clouds and its Kubernetes support offer no Ascend accelerator; use "
                                 "the slurm, kuberay, ray-job or compose target")
    elif spec.cluster.gpu_type is None:
        yield sourced.diagnostic(("cluster",), "the skypilot target asks for GPUs by model: set cluster.gpu_type "
                                               "(SkyPilot's accelerator name, e.g. H100, A100-80GB, MI300X)")
    yield from literal_env(spec, sourced, "skypilot")
    yield from image_services_refused(spec, sourced, "skypilot", "the task's commands run inside the job's image "
                                      "on every node (resources.image_id: docker:...), where no container engine "
                                      "starts a second one; run the service in the job's image (command:), or "
                                      "build for slurm, compose or kuberay")
    mounts = [b.mount for b in k.buckets] + [v.mount for v in k.volumes]
    yield from kept(spec, sourced, workdir, mounts, "a skypilot.buckets or skypilot.volumes mount",
                    f"skypilot.recovery {k.recovery} restarts the job on new nodes (or set recovery: off)"
                    if k.recovery != "off" else None)
