"""Render the kuberay bundle: rayjob.yaml (the RayJob, one per sweep variant), configmap.yaml (the job's JSON)
and runtime.yaml (the runtime's modules), serialized, not templated."""

from __future__ import annotations

from ...compiler import yaml_text
from ...compiler.ir import JobIR
from ..bundle import Bundle, File, finish, header_lines
from ..job_package import job_package
from ...runtime.job import Expiry
from ...runtime.protocol import JOB_END
from .lower import KubeIR
from ..shared import image_service_tokens
from .view import DEADLINE_LEAD, SUBMISSION_WHY, configmap, package_parts, rayjobs, service_secret


def render(ir: JobIR) -> Bundle:
    k: KubeIR = ir.part("kuberay")
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    # verl (0.5.0 on) saves ahead of the RayJob's deadline: `verlc submit` sets its end in the head's environment
    expiry = Expiry(variable=ir.expiry_variable, lead=DEADLINE_LEAD, end_env=JOB_END) \
        if k.deadline and ir.expiry_variable else None
    package = job_package(ir, record=None, image=k.image, expiry=expiry)  # the run record goes to the job log
    tokens = image_service_tokens(ir)
    usage = (f"# Run:  kubectl apply --namespace {k.namespace} -f runtime.yaml -f configmap.yaml -f rayjob.yaml\n"
             "#       (or: verlc submit)\n"
             + "".join(f"# {line}\n" for line in SUBMISSION_WHY)
             + (f"# activeDeadlineSeconds: `verlc submit` also sets {JOB_END} (the deadline in epoch seconds) in the\n"
                f"# head's environment, for verl's save ahead of it; without it verl saves at trainer.save_freq only.\n"
                if expiry else "")
             + (f"# services in images of their own: `verlc submit` first makes the Secret "
                f"{service_secret(k.names[0])}\n"
                f"# (one per RayJob) with a token for each ({', '.join(tokens)}), owned by the RayJob;\n"
                f"# by hand: kubectl create secret generic {service_secret(k.names[0])} "
                f"{' '.join(f'--from-literal={t}=$(openssl rand -hex 24)' for t in tokens)}\n"
                if tokens else ""))
    docs = "---\n".join(yaml_text.dump(doc) for doc in rayjobs(ir, package))
    parts = package_parts(package)
    return finish(ir, "kuberay", [
        File("rayjob.yaml", header + usage + docs),
        File("configmap.yaml", header + yaml_text.dump(configmap(ir, "job", parts["job"]))),
        File("runtime.yaml", header + yaml_text.dump(configmap(ir, "runtime", parts["runtime"]))),
    ])
