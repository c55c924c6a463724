"""What the kuberay target cannot run: no OCI image, a name KubeRay refuses, secrets without a Secret,
env values that need a shell, checkpoints that die with the pods, a GPU selector no node matches."""

from __future__ import annotations

import re
from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.load import Sourced
from ...compiler.verl.check import Selection
from ...compiler.verl.program import saves_checkpoints
from ...compiler.code import has_code
from ...compiler.spec import Spec
from ...compiler.verl.check import NOTE
from ..shared import image_problems, kept, literal_env, node_image, node_workdir
from .lower import GPU_LABEL, RAYJOB_NAME_MAX, is_rayjob_name, rayjob_names
from .section import Kubernetes

# How the GPU operators' feature discovery labels a node's GPU model: the product name, e.g.
# NVIDIA-A100-SXM4-80GB or Tesla-V100-SXM2-16GB (NVIDIA), Instinct_MI300X or AMD_Instinct_MI300X_OAM (AMD).
_PRODUCT_LABEL = {"cuda": re.compile(r"(NVIDIA|Tesla|Quadro)-.+"), "rocm": re.compile(r"(AMD|Instinct).+"),
                  "npu": re.compile(r"huawei-Ascend.+")}
_EXAMPLE = {"cuda": "NVIDIA-A100-SXM4-80GB", "rocm": "AMD_Instinct_MI300X_OAM", "npu": "huawei-Ascend910"}


def check_build(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    if has_code(spec):
        k_workdir = node_workdir(spec, (spec.kubernetes or Kubernetes()).workdir)
        claim = next((v.claim for v in (spec.kubernetes or Kubernetes()).volumes
                      if k_workdir and (k_workdir + "/").startswith(v.mount.rstrip("/") + "/")), None)
        yield sourced.diagnostic(("code",) if spec.code else ("program",), (
            f"{NOTE}the pods run the job in {k_workdir}: "
            + (f"put the run's code there on the claim {claim}" if claim else
               "the image must hold the run's code there (built from its commit), or mount a claim that does")
            + "; the preflight checks the files it names"))
    k = spec.kubernetes or Kubernetes()
    image, workdir = node_image(spec, k.image), node_workdir(spec, k.workdir)
    yield from image_problems(spec, sourced, "kuberay", "kubernetes", image, workdir,
                              spec.kubernetes.workdir if spec.kubernetes else None, "Kubernetes")
    bad = [n for n in rayjob_names(spec) if not is_rayjob_name(n)]
    if bad:
        yield sourced.diagnostic(("name",), (
            f"the kuberay target names the RayJob {bad[0]!r} (the name in lowercase, '_' and '.' as '-'"
            f"{', -vNNN per sweep variant' if spec.sweep else ''}); KubeRay needs a DNS-1035 label: at most "
            f"{RAYJOB_NAME_MAX} characters, starting with a letter"))
    if spec.secrets and k.secret is None:
        yield sourced.diagnostic(("secrets",), (
            f"the kuberay target reads secrets from a Kubernetes Secret: set kubernetes.secret to the Secret "
            f"holding {', '.join(spec.secrets)} (one key per name)"))
    yield from literal_env(spec, sourced, "kuberay")
    yield from _gpu_label(spec, sourced, k)
    if k.deadline and isinstance(chosen, Selection) and not chosen.release.startup.get("expiry_save") \
            and saves_checkpoints(spec.program):
        yield sourced.diagnostic(("kubernetes", "deadline"), (
            f"{NOTE}{chosen.release.label}'s trainer cannot save a checkpoint ahead of the deadline (verl's "
            f"should_save_ckpt_esi came with 0.5.0): the steps since its last trainer.save_freq checkpoint are "
            f"lost when it ends the run"))
    trainer = spec.verl.get("trainer")
    save_freq = trainer.get("save_freq", -1) if isinstance(trainer, dict) else -1  # verl's default: never
    if k.deadline and spec.program == "verl.trainer.main_ppo" and isinstance(save_freq, int) and save_freq <= 0:
        yield sourced.diagnostic(("kubernetes", "deadline"), (
            f"{NOTE}trainer.save_freq is {save_freq}: verl saves no checkpoint, not even ahead of the deadline "
            f"(its save there needs a positive save_freq), so a run the deadline ends has nothing to resume from; "
            f"set trainer.save_freq"))
    mounts = [v.mount for v in k.volumes]
    yield from kept(spec, sourced, workdir, mounts, "a kubernetes.volumes claim",
                    "kubernetes.retries recreates the pods" if k.retries else None)


def _gpu_label(spec: Spec, sourced: Sourced, k: Kubernetes) -> Iterator[Diagnostic]:
    """cluster.gpu_type is a short accelerator name (A100-80GB); a node label has the full product name.
    A selector no node matches leaves the pods Pending for ever: the label's value must be given."""
    gpu_type, accelerator = spec.cluster.gpu_type, spec.cluster.accelerator
    label = k.gpu_label or GPU_LABEL[accelerator]
    if gpu_type is None or label in k.node_selector or _PRODUCT_LABEL[accelerator].fullmatch(gpu_type):
        return
    device = "NPU" if accelerator == "npu" else "GPU"
    yield sourced.diagnostic(("cluster", "gpu_type"), (
        f"the kuberay target selects nodes by their {device} label {label}, whose values are product names such "
        f"as {_EXAMPLE[accelerator]}, not {gpu_type}: set kubernetes.node_selector: "
        f"{{{label}: <the value on your nodes>}} (`kubectl get nodes -L {label}` shows it)"))
