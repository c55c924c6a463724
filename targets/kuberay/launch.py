"""The kuberay bundle's lifecycle, with kubectl: apply the ConfigMap, create the RayJob(s), then read the
RayJob's status; logs are the submitter Job's (K8sJobMode follows the driver's log); cancel deletes the
RayJob, and with it its RayCluster."""

from __future__ import annotations

import json
import re
import secrets
import time
from pathlib import Path

from ruamel.yaml import YAML

from ...compiler import yaml_text
from ...compiler.ir import JobIR
from ...contract.launcher import LaunchError, Observed, State, Submission, SubmittedRun, observed, tool, variants_of
from ...contract.launcher import run as command
from .lower import KubeIR
from ..shared import image_service_tokens
from .view import labels, service_secret, sidecar, with_end

# KubeRay's jobDeploymentStatus values after which nothing more happens to the RayJob
FINAL = {"Complete", "Failed"}

# The RayJob's job status (or, before it has one, its deployment status) as verlc's
STATES = {"PENDING": State.PENDING, "NEW": State.PENDING, "INITIALIZING": State.PENDING, "WAITING": State.PENDING,
          "RUNNING": State.RUNNING, "SUCCEEDED": State.SUCCEEDED, "COMPLETE": State.SUCCEEDED,
          "FAILED": State.FAILED, "STOPPED": State.CANCELLED, "CANCELLED": State.CANCELLED,
          "SUSPENDED": State.CANCELLED}


def kubectl() -> str:
    return tool("kubectl", "the kuberay target talks to Kubernetes with kubectl")


def submit(ir: JobIR, bundle: Path, cwd: Path, env: dict[str, str]) -> list[Submission]:
    k: KubeIR = ir.part("kuberay")
    command([kubectl(), "apply", "--namespace", k.namespace, "--filename", str(bundle / "runtime.yaml"),
             "--filename", str(bundle / "configmap.yaml")], env=env)
    # create, not apply: a RayJob of the same name is another run's, and applying would rewrite it. With its
    # deadline's end in the head's environment (view.with_end), for verl's save ahead of it.
    docs = [with_end(doc, time.time()) for doc in YAML(typ="safe").load_all((bundle / "rayjob.yaml").read_text())]
    tokens = image_service_tokens(ir)
    if tokens:  # the run's tokens, before the RayJob whose head pod reads them
        _create_secrets(ir, [doc["metadata"]["name"] for doc in docs], tokens, env)
    try:
        out = command([kubectl(), "create", "--namespace", k.namespace, "--filename", "-", "--output", "name"],
                      env=env, stdin="---\n".join(yaml_text.dump(doc) for doc in docs)).stdout
    except LaunchError:
        for doc in docs if tokens else []:  # nothing would own them
            command([kubectl(), "delete", "secret", service_secret(doc["metadata"]["name"]), "--namespace",
                     k.namespace, "--ignore-not-found"], env=env)
        raise
    names = re.findall(r"^rayjob\.ray\.io/(\S+)$", out, re.M)
    if not names:
        raise LaunchError(f"kubectl created no RayJob: {out.strip()[-300:]}")
    for name in names if tokens else []:
        _owned_by(k.namespace, service_secret(name), name, env)
    return [Submission(run=name, job_id=name, where=k.namespace, log=None, record=None, variant=v)
            for name, v in zip(names, variants_of(ir, names, "kubectl"))]


def _create_secrets(ir: JobIR, rayjobs: list[str], tokens: list[str], env: dict[str, str]) -> None:
    """For each RayJob, a Secret with a token made for this run for each service in an image of its own (the
    head pod's sidecars and the runtime read them: view.image_services). Handed to kubectl on stdin, never on
    its command line, and never written here."""
    k: KubeIR = ir.part("kuberay")
    docs = [{"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
             "metadata": {"name": service_secret(name), "namespace": k.namespace, "labels": labels(ir)},
             "stringData": {token: secrets.token_urlsafe(24) for token in tokens}} for name in rayjobs]
    command([kubectl(), "create", "--namespace", k.namespace, "--filename", "-", "--output", "name"], env=env,
            stdin="---\n".join(yaml_text.dump(doc) for doc in docs))


def _owned_by(namespace: str, secret: str, rayjob: str, env: dict[str, str]) -> None:
    """The Secret goes with its RayJob: Kubernetes' garbage collector deletes it once the RayJob is deleted."""
    uid = command([kubectl(), "get", "rayjob", rayjob, "--namespace", namespace, "--output",
                   "jsonpath={.metadata.uid}"], env=env).stdout.strip()
    owner = {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": rayjob, "uid": uid}
    command([kubectl(), "patch", "secret", secret, "--namespace", namespace, "--type", "merge", "--patch",
             json.dumps({"metadata": {"ownerReferences": [owner]}})], env=env)


def _rayjob(run: SubmittedRun) -> dict:
    out = command([kubectl(), "get", "rayjob", run.job_id, "--namespace", run.where, "--output", "json"]).stdout
    return json.loads(out)


def state(run: SubmittedRun) -> Observed:
    status = _rayjob(run).get("status", {})
    deployment = status.get("jobDeploymentStatus", "")
    job = status.get("jobStatus", "")
    final = deployment in FINAL
    code = 0 if job == "SUCCEEDED" else (1 if final else None)
    return observed(STATES, (job or deployment or "Pending").upper(), int(status.get("failed") or 0), code, final,
                    "kubectl get rayjob")


def logs(run: SubmittedRun) -> str:
    """The submitter Job's log: `ray job submit` following the driver (stages, steps, the run record)."""
    return command([kubectl(), "logs", "--namespace", run.where, f"job/{run.job_id}"], timeout=300).stdout


def cancel(run: SubmittedRun) -> Observed:
    """Deleting the RayJob deletes its cluster, so nothing is left to ask: the run ends here."""
    command([kubectl(), "delete", "rayjob", run.job_id, "--namespace", run.where, "--wait=false"])
    return observed(STATES, "CANCELLED", 0, None, True, "kubectl delete rayjob")


def _head_pod(run: SubmittedRun) -> str:
    cluster = _rayjob(run).get("status", {}).get("rayClusterName")
    if not cluster:
        raise LaunchError(f"{run.job_id} has no RayCluster (yet, or any more)")
    pods = command([kubectl(), "get", "pods", "--namespace", run.where, "--selector",
                    f"ray.io/cluster={cluster},ray.io/node-type=head", "--output", "name"]).stdout.split()
    if not pods:
        raise LaunchError(f"the RayCluster {cluster} has no head pod running")
    return pods[0]


def attach(run: SubmittedRun, argv: list[str]) -> list[str]:
    """`kubectl exec` into the head pod of the RayJob's cluster: ARGV, or a shell."""
    return [kubectl(), "exec", "--namespace", run.where, *(["--stdin", "--tty"] if not argv else []),
            _head_pod(run), "--", *(argv or ["bash", "-i"])]


def service_logs(run: SubmittedRun, name: str, node: str | None) -> dict[str, str]:
    """A service in an image of its own: its sidecar's log (view.image_services). The runtime's services keep
    theirs in the head pod, which verlc does not read from outside."""
    try:
        return {f"{name}.log": command([kubectl(), "logs", "--namespace", run.where, _head_pod(run), "--container",
                                        sidecar(name)], timeout=300).stdout}
    except LaunchError:
        pass
    raise LaunchError(f"{run.run}'s services' logs are in its head pod (the folder its log names, in Ray's log "
                      f"folder): read them with `verlc attach {run.run} -- ls -R FOLDER` and `cat`")
