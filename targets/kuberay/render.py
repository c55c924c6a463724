"""Render the kuberay bundle: rayjob.yaml (the RayJob, one per sweep variant) and configmap.yaml (the job
package), both serialized, not templated."""

from __future__ import annotations

from ...compiler import yaml_text
from ...compiler.ir import JobIR
from ..bundle import Bundle, File, finish, header_lines
from ..job_package import job_package
from .lower import KubeIR
from .view import SUBMISSION_WHY, configmap, rayjobs


def render(ir: JobIR) -> Bundle:
    k: KubeIR = ir.part("kuberay")
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    package = job_package(ir, record=None, image=k.image)  # the run record goes to the job log
    usage = (f"# Run:  kubectl apply --namespace {k.namespace} -f configmap.yaml -f rayjob.yaml   (or: verlc submit)\n"
             + "".join(f"# {line}\n" for line in SUBMISSION_WHY))
    docs = "---\n".join(yaml_text.dump(doc) for doc in rayjobs(ir, package))
    return finish(ir, "kuberay", [
        File("rayjob.yaml", header + usage + docs),
        File("configmap.yaml", header + yaml_text.dump(configmap(ir, package))),
    ])
