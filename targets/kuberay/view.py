"""JobIR -> the ConfigMap and RayJob(s) as data; they go out through a YAML serializer, never a template.

Each RayJob brings up its own RayCluster (a head, and one worker group of nodes - 1 pods), runs the job
package's `job` command on it as the Ray job's entrypoint (wait for every node and GPU, data, preflight,
train: runtime/runner.py), and deletes the cluster when the job has finished.
"""

from __future__ import annotations

import copy
import shlex
from typing import Any

from ...compiler.derive import tracker_env
from ...compiler.ir import JobIR, Var, Word
from ..bundle import File
from ..job_package import COMMAND, PACKAGE
from ...runtime.protocol import JOB_END, RUNNER_STAGES, STOP_AFTER
from ..shared import OWN_SERVICE_PORT, path_list
from .lower import KubeIR

HELPER_DIR = "/opt/verlc"  # the ConfigMaps are mounted at HELPER_DIR/verlc_job, on PYTHONPATH, in every pod
DASHBOARD_PORT = 8265
# Why K8sJobMode: KubeRay runs `ray job submit` in a Kubernetes Job that follows the driver's log until it
# ends, so `kubectl logs job/NAME` (and `verlc logs`) show the run as it goes, and a failed submission is
# retried by that Job; HTTPMode submits from the operator and leaves no log behind, and SidecarMode needs
# KubeRay 1.5 or later.
SUBMISSION_MODE = "K8sJobMode"
SUBMISSION_WHY = ("submissionMode K8sJobMode: KubeRay runs `ray job submit` in a Kubernetes Job that",
                  "follows the driver's log, so `kubectl logs job/<rayjob>` shows the run (HTTPMode leaves",
                  "no log behind; SidecarMode needs KubeRay 1.5 or later).")


def labels(ir: JobIR) -> dict[str, str]:
    return {"app.kubernetes.io/name": "verl", "app.kubernetes.io/managed-by": "verlc",
            "verlc.dev/spec": ir.name.lower().replace("_", "-").replace(".", "-"),
            "verlc.dev/spec-sha256": ir.spec_sha256[:16]}


def configmap_name(ir: JobIR, part: str) -> str:
    """The ConfigMap of `part` of the job package: "job" (its jobs) or "runtime" (the runtime's modules)."""
    return f"{labels(ir)['verlc.dev/spec']}-verlc-{part}"[:63].rstrip("-")


def package_parts(files: list[File]) -> dict[str, list[File]]:
    """The job package in two ConfigMaps: the runtime's modules (the same in every bundle: runtime.yaml, marked
    as generated for review) and this job's JSON (configmap.yaml), so a pull request's diff shows the job."""
    return {"job": [f for f in files if not f.path.endswith(".py")],
            "runtime": [f for f in files if f.path.endswith(".py")]}


def configmap(ir: JobIR, part: str, files: list[File]) -> dict[str, Any]:
    """One part of the job package as a ConfigMap: one key per file ('/' is not allowed in a key: jobs/3.json is
    jobs-3.json)."""
    k: KubeIR = ir.part("kuberay")
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": configmap_name(ir, part), "namespace": k.namespace, "labels": labels(ir)},
            "data": {_key(f.path): f.text for f in files}}


def _key(path: str) -> str:
    return path.removeprefix(f"{PACKAGE}/").replace("/", "-")


def _spec_env(ir: JobIR) -> list[dict[str, Any]]:
    """The spec's env but PYTHONPATH (which each pod's container extends). Kubernetes expands $(NAME) in env values
    and reads $$ as $: every $ doubled keeps a value as written."""
    return [{"name": e.name, "value": e.value.display.replace("$", "$$")} for e in ir.env if e.name != "PYTHONPATH"]


def _env(ir: JobIR, k: KubeIR, head: bool, run: str) -> list[dict[str, Any]]:
    env = _spec_env(ir)
    # the RayJob's name is the run's id: its retries (backoffLimit) continue the one W&B run
    env += [{"name": name, "value": value} for name, value in tracker_env((e.name for e in ir.env), run).items()]
    env += [{"name": name, "valueFrom": {"secretKeyRef": {"name": k.secret, "key": name}}} for name in ir.secrets]
    # verlc's job package on every node (Ray imports the helper's remote functions from it there), then the spec's
    env.append({"name": "PYTHONPATH", "value": path_list(HELPER_DIR, *(e.value.display.replace("$", "$$")
                                                                      for e in ir.env if e.name == "PYTHONPATH"))})
    if head:
        env.append({"name": STOP_AFTER, "value": RUNNER_STAGES[-1]})  # or an earlier stage: stop after it
    return env


def service_secret(rayjob: str) -> str:
    """The Secret with the tokens of a RayJob's services in images of their own: `verlc submit` makes it for each
    run (launch.py), owned by the RayJob, so that Kubernetes deletes it with it."""
    return f"{rayjob}-services"


def sidecar(service: str) -> str:
    """The head pod's container of a service in an image of its own (a DNS label: no '_')."""
    return f"service-{service.replace('_', '-')}"


def _kube_word(word: Word) -> str:
    """A word where Kubernetes expands $(NAME) from the container's env (a service's args and env values)."""
    return "".join(f"$({p.name})" if isinstance(p, Var) else p.replace("$", "$$") for p in word.parts)


def image_services(ir: JobIR, run: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The services in images of their own (runtime/protocol.py), as sidecars of the head pod: each at the pod's
    address (which the workers' pods reach) and a port of its own, its token from the run's Secret; and those
    variables, which the head's container (the runtime) gets too."""
    given: list[dict[str, Any]] = []
    sidecars = []
    for index, s in enumerate(x for x in ir.services if x.image):
        v, port = dict(s.variables), OWN_SERVICE_PORT + index
        variables = [{"name": v["host"], "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                     {"name": v["port"], "value": str(port)},
                     {"name": v["url"], "value": f"http://$({v['host']}):{port}"},
                     {"name": v["token"], "valueFrom": {"secretKeyRef": {"name": service_secret(run),
                                                                         "key": v["token"]}}}]
        given += variables
        sidecars.append({"name": sidecar(s.name), "image": s.image,
                         **({"args": [_kube_word(w) for w in s.argv]} if s.argv else {}),
                         "env": [*_spec_env(ir), *({"name": n, "value": _kube_word(w)} for n, w in s.env),
                                 *variables]})
    return given, sidecars


def _pod(ir: JobIR, k: KubeIR, role: str, files: list[File], run: str) -> dict[str, Any]:
    limits: dict[str, str] = {k.gpu_resource: str(ir.gpus_per_node)}
    if k.cpus:
        limits["cpu"] = k.cpus
    if k.memory:
        limits["memory"] = k.memory
    mounts = [{"name": "dshm", "mountPath": "/dev/shm"},
              {"name": "verlc-job", "mountPath": f"{HELPER_DIR}/{PACKAGE}", "readOnly": True}]
    mounts += [{"name": f"claim-{i}", "mountPath": v.path, **({"readOnly": True} if v.mode == "ro" else {})}
               for i, v in enumerate(k.volumes)]
    container = {"name": f"ray-{role}", "image": k.image, "workingDir": k.workdir,
                 "env": _env(ir, k, role == "head", run),
                 "resources": {"requests": dict(limits), "limits": limits}, "volumeMounts": mounts}
    sidecars: list[dict[str, Any]] = []
    if role == "head":
        container["ports"] = [{"name": "gcs", "containerPort": 6379}, {"name": "dashboard", "containerPort": DASHBOARD_PORT}]
        given, sidecars = image_services(ir, run)
        container["env"] += given
    volumes = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": k.shm_size}},
               {"name": "verlc-job", "projected": {"sources": [  # both ConfigMaps in one folder: the package
                   {"configMap": {"name": configmap_name(ir, part), "items": [
                       {"key": _key(f.path), "path": f.path.removeprefix(f"{PACKAGE}/")} for f in part_files]}}
                   for part, part_files in package_parts(files).items()]}}]
    volumes += [{"name": f"claim-{i}", "persistentVolumeClaim": {
        "claimName": v.source, **({"readOnly": True} if v.mode == "ro" else {})}} for i, v in enumerate(k.volumes)]
    spec: dict[str, Any] = {"containers": [container, *sidecars], "volumes": volumes}
    if k.service_account:
        spec["serviceAccountName"] = k.service_account
    if k.image_pull_secret:
        spec["imagePullSecrets"] = [{"name": k.image_pull_secret}]
    if k.node_selector:
        spec["nodeSelector"] = dict(k.node_selector)
    if k.tolerations:
        spec["tolerations"] = [{name: value for name, value in (("key", t.key), ("operator", t.operator),
                                                               ("value", t.value), ("effect", t.effect))
                                if value is not None} for t in k.tolerations]
    if k.priority_class:
        spec["priorityClassName"] = k.priority_class
    return {"metadata": {"labels": labels(ir)}, "spec": spec}


# verl's save ahead of activeDeadlineSeconds ends this long before it: KubeRay then deletes the cluster, whose
# pods get Kubernetes' 30 s termination grace
DEADLINE_LEAD = 60


def with_end(rayjob: dict[str, Any], now: float) -> dict[str, Any]:
    """The RayJob as `verlc submit` creates it: where it has activeDeadlineSeconds, its head gets the end in
    JOB_END (now + the deadline: KubeRay counts it from the RayJob's start, which is no earlier than now)."""
    deadline = rayjob["spec"].get("activeDeadlineSeconds")
    if not deadline:
        return rayjob
    out = copy.deepcopy(rayjob)
    head = out["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    head["env"] = [*head.get("env", []), {"name": JOB_END, "value": str(int(now) + int(deadline))}]
    return out


def rayjobs(ir: JobIR, files: list[File]) -> list[dict[str, Any]]:
    """One RayJob, or one per sweep variant (each its own cluster, named NAME-vNNN)."""
    k: KubeIR = ir.part("kuberay")
    variants = [str(v.index) for v in ir.variants] or [None]
    # KubeRay passes rayStartParams to `ray start` through a shell: the NPU resource's JSON is quoted for it
    start = {**({"resources": f'"{{\\"NPU\\": {ir.gpus_per_node}}}"'} if ir.device == "NPU"
                else {"num-gpus": str(ir.gpus_per_node)}), "disable-usage-stats": "true",
             **{option.removeprefix("--"): "true" for option in ir.ray.start_options}}
    out = []
    for name, variant in zip(k.names, variants):
        entrypoint = f"cd {shlex.quote(k.workdir)} && exec {shlex.join([*COMMAND, *([variant] if variant else [])])}"
        workers = [{"groupName": "workers", "replicas": ir.nodes - 1, "minReplicas": ir.nodes - 1,
                    "maxReplicas": ir.nodes - 1, "rayStartParams": dict(start),
                    "template": _pod(ir, k, "worker", files, name)}] if ir.nodes > 1 else []
        spec: dict[str, Any] = {
            "entrypoint": entrypoint,
            "submissionMode": SUBMISSION_MODE,
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": k.ttl_after_finished,
            "backoffLimit": k.retries,
            "rayClusterSpec": {
                "headGroupSpec": {"rayStartParams": {**start, "dashboard-host": "0.0.0.0"},
                                  "template": _pod(ir, k, "head", files, name)},
                "workerGroupSpecs": workers,
            },
        }
        if k.deadline:
            spec["activeDeadlineSeconds"] = k.deadline
        out.append({"apiVersion": "ray.io/v1", "kind": "RayJob",
                    "metadata": {"name": name, "namespace": k.namespace, "labels": labels(ir)}, "spec": spec})
    return out
