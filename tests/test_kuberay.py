"""The kuberay target: every generated RayJob passes KubeRay v1.7.0's own CRD schema (../shared/kuberay), its
name rule and Kubernetes' quantity grammar; what Kubernetes cannot run is refused at build time; kubectl
command lines of submit/status/logs/cancel/attach, against a recording kubectl (no cluster here)."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from conftest import IN_CI, REPO, run_verlc
from verlc.compiler.diagnostics import SpecError
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.targets import render

CRD = REPO.parent / "shared" / "kuberay" / "ray.io_rayjobs.yaml"
EXAMPLE = REPO / "specs" / "qwen2-7b-grpo-k8s-cloud.yaml"
# Kubernetes' resource.Quantity grammar (k8s.io/apimachinery/pkg/api/resource)
QUANTITY = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?")
DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")


def structural(node: Any) -> Any:
    """A CRD's OpenAPI v3 structural schema as JSON Schema: int-or-string and nullable spelled out, and an
    object with listed properties closed (`kubectl apply` validates strictly; the API server would prune)."""
    if isinstance(node, list):
        return [structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: structural(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k != "nullable"}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node and "additionalProperties" not in node \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


@cache
def crd() -> dict[str, Any]:
    """KubeRay's RayJob CRD (1.4 MB of YAML: libyaml's parser where PyYAML has it, ten times as fast)."""
    return yaml.load(CRD.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@pytest.fixture(scope="module")
def rayjob_schema() -> Any:
    """A validator of the CRD's v1 schema, made (and the schema itself checked) once."""
    if not CRD.exists():
        message = f"{CRD} is missing (CI has ../shared beside the clone)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    version = next(v for v in crd()["spec"]["versions"] if v["name"] == "v1")
    schema = structural(version["schema"]["openAPIV3Schema"])
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    return validator(schema)


@cache
def cel_fields() -> frozenset[str]:
    """Fields whose CRD schema carries CEL rules (x-kubernetes-validations), which no JSON Schema checks."""
    found: set[str] = set()

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            if "x-kubernetes-validations" in node:
                found.add(path)
            for key, value in node.get("properties", {}).items():
                walk(value, f"{path}.{key}" if path else key)
    walk(next(v for v in crd()["spec"]["versions"] if v["name"] == "v1")["schema"]["openAPIV3Schema"], "")
    return frozenset(found)


def kuberay_docs(spec: Path | dict[str, Any], tmp: Path | None = None) -> tuple[list[dict], list[dict], Any]:
    """The RayJob(s), the two ConfigMaps (the job's, the runtime's) and the IR of `spec` built for kuberay."""
    if isinstance(spec, dict):
        assert tmp is not None
        path = tmp / "spec.yaml"
        path.write_text(json.dumps(spec))
        spec = path
    ir = compile_spec(spec, CATALOG, display=spec.name, source=spec.name, targets=["kuberay"])
    bundle = render("kuberay", ir)
    files = {f.path: f.text for f in bundle.files}
    configmaps = [yaml.safe_load(files[name]) for name in ("configmap.yaml", "runtime.yaml")]
    return list(yaml.safe_load_all(files["rayjob.yaml"])), configmaps, ir


def base(**changes: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": "k8s_Run.v2", "project": "p", "model": "org/model", "verl_version": "0.9.1",
        "data": {"train_files": ["/data/t.parquet"], "val_files": ["/data/v.parquet"]},
        "verl": {"algorithm": {"adv_estimator": "grpo"},
                 "actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 4},
                                       "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4}},
                 "trainer": {"default_local_dir": "/ckpt/run"}},
        "cluster": {"nodes": 2, "gpus_per_node": 4},
        "container": {"runtime": "docker", "image": "registry.example/verl:0.9.1", "workdir": "/workspace/verl"},
        "kubernetes": {"volumes": [{"claim": "ckpt", "mount": "/ckpt"}]},
        "targets": ["kuberay"],
    }
    for dotted, value in changes.items():
        node = spec
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return spec


VARIANTS = {
    "example": None,
    "one node, rocm, MI300X": base(cluster={"nodes": 1, "gpus_per_node": 8, "accelerator": "rocm",
                                            "gpu_type": "AMD_Instinct_MI300X_OAM"}),
    "sweep of 2": base(sweep={"matrix": {"verl.actor_rollout_ref.actor.optim.lr": [1e-6, 2e-6]}}),
    "everything set": base(kubernetes={
        "namespace": "team-a", "service_account": "sa", "image_pull_secret": "regcred", "secret": "keys",
        "node_selector": {"pool": "gpu"}, "tolerations": [{"operator": "Exists"}, {"key": "k", "value": "v",
                                                                                   "effect": "NoExecute"}],
        "priority_class": "high", "cpus": 32, "memory": "256Gi", "shm_size": "32Gi", "retries": 3,
        "ttl_after_finished": "10m", "deadline": "2h",
        "volumes": [{"claim": "ckpt", "mount": "/ckpt"}, {"claim": "data", "mount": "/data", "read_only": True}]},
        secrets=["WANDB_API_KEY", "HF_TOKEN"], env={"NCCL_DEBUG": "INFO"}),
    "ascend, 2 x 16 NPUs": REPO / "specs" / "qwen3-32b-grpo-ascend-a3.yaml",
    "pyxis image": base(container={"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3",
                                   "workdir": "/workspace"}),
    "sweep of 2, a service in an image of its own": base(
        sweep={"matrix": {"verl.actor_rollout_ref.actor.optim.lr": [1e-6, 2e-6]}},
        services={"code_box": {"image": "volcengine/sandbox-fusion:server-20250609",
                               "command": ["uvicorn", "sandbox.server.server:app", "--host",
                                           "${services.code_box.host}", "--port", "${services.code_box.port}"],
                               "env": {"HOME_OF": "$$HOME"}, "probe": {"kind": "sandbox"}}}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rayjob_passes_kuberays_crd(rayjob_schema: Any, tmp_path: Path, variant: str) -> None:
    jobs, configmaps, ir = kuberay_docs(VARIANTS[variant] or EXAMPLE, tmp_path)
    assert len(jobs) == max(1, len(ir.variants))
    for job in jobs:
        rayjob_schema.validate(job)
        name = job["metadata"]["name"]
        assert DNS_1035.fullmatch(name) and len(name) <= 47, name
        spec = job["spec"]
        assert spec["shutdownAfterJobFinishes"] is True and spec["submissionMode"] == "K8sJobMode"
        pods = [spec["rayClusterSpec"]["headGroupSpec"]["template"],
                *(g["template"] for g in spec["rayClusterSpec"]["workerGroupSpecs"])]
        assert sum(g["replicas"] for g in spec["rayClusterSpec"]["workerGroupSpecs"]) == ir.nodes - 1
        for group in [spec["rayClusterSpec"]["headGroupSpec"], *spec["rayClusterSpec"]["workerGroupSpecs"]]:
            # KubeRay hands these to `ray start` through a shell: the NPU resource's JSON must survive it
            start = group["rayStartParams"]
            assert ("num-gpus" in start) != (ir.accelerator == "npu"), start
            if "resources" in start:
                words = shlex.split(f"--resources={start['resources']}")
                assert words == [f'--resources={{"NPU": {ir.gpus_per_node}}}'], words
        for pod in pods:
            container = pod["spec"]["containers"][0]
            for amounts in container["resources"].values():
                assert all(QUANTITY.fullmatch(str(v)) for v in amounts.values()), amounts
            gpus = {"rocm": "amd.com/gpu", "npu": "huawei.com/Ascend910"}.get(ir.accelerator, "nvidia.com/gpu")
            assert container["resources"]["limits"][gpus] == str(ir.gpus_per_node)
            shm = next(v for v in pod["spec"]["volumes"] if v["name"] == "dshm")
            assert shm["emptyDir"]["medium"] == "Memory" and QUANTITY.fullmatch(shm["emptyDir"]["sizeLimit"])
            for env in container["env"]:  # secrets by reference only; a service's host is its pod's address
                assert "value" in env or set(env["valueFrom"]) == {"secretKeyRef"} or \
                    (env["name"].endswith("_HOST") and env["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}})
            helper = next(v for v in pod["spec"]["volumes"] if v["name"] == "verlc-job")
            mounted = {s["configMap"]["name"]: {i["key"] for i in s["configMap"]["items"]}
                       for s in helper["projected"]["sources"]}
            assert mounted == {c["metadata"]["name"]: set(c["data"]) for c in configmaps}
        if ir.services:  # #55 item 1: the head pod's sidecar, its token from the RayJob's own Secret
            head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"]
            [sidecar] = head[1:]
            token = {"name": "VERLC_SERVICE_CODE_BOX_TOKEN", "valueFrom": {"secretKeyRef": {
                "name": f"{name}-services", "key": "VERLC_SERVICE_CODE_BOX_TOKEN"}}}
            assert sidecar["name"] == "service-code-box" and token in sidecar["env"] and token in head[0]["env"]
            assert sidecar["args"][3:] == ["$(VERLC_SERVICE_CODE_BOX_HOST)", "--port", "$(VERLC_SERVICE_CODE_BOX_PORT)"]
            assert {"name": "HOME_OF", "value": "$$HOME"} in sidecar["env"]  # a literal $, as Kubernetes reads it
            assert {"name": "VERLC_SERVICE_CODE_BOX_URL", "value": "http://$(VERLC_SERVICE_CODE_BOX_HOST):18000"} \
                in head[0]["env"]
    # no generated RayJob sets a field whose CRD schema carries CEL rules (which this test cannot evaluate)
    def fields(node: Any, path: str = "") -> set[str]:
        if not isinstance(node, dict):
            return {path}
        return {path} | {f for k, v in node.items() for f in fields(v, f"{path}.{k}" if path else k)}
    assert not cel_fields() & set().union(*(fields(j) for j in jobs))


def test_the_example_rayjob(tmp_path: Path) -> None:
    jobs, (configmap, runtime), ir = kuberay_docs(EXAMPLE)
    (job,) = jobs
    assert job["metadata"] == {"name": "qwen2-7b-grpo-k8s-cloud", "namespace": "ml-research", "labels": {
        "app.kubernetes.io/name": "verl", "app.kubernetes.io/managed-by": "verlc",
        "verlc.dev/spec": "qwen2-7b-grpo-k8s-cloud", "verlc.dev/spec-sha256": ir.spec_sha256[:16]}}
    spec = job["spec"]
    assert spec["entrypoint"] == "cd /workspace/verl && exec python3 -m verlc_job job"
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (2, 259200, 3600)
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert head["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert (head["serviceAccountName"], head["priorityClassName"]) == ("verl-runner", "training")
    env = {e["name"]: e for e in head["containers"][0]["env"]}
    assert env["WANDB_API_KEY"] == {"name": "WANDB_API_KEY",
                                    "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "WANDB_API_KEY"}}}
    assert env["PYTHONPATH"]["value"] == "/opt/verlc"
    # the RayJob's name is its run id and W&B run id, on every pod: a retry (backoffLimit) continues the run
    for pod in (head, *(w["template"]["spec"] for w in spec["rayClusterSpec"]["workerGroupSpecs"])):
        tracker = {e["name"]: e.get("value") for e in pod["containers"][0]["env"] if e["name"].startswith("WANDB_R")}
        assert tracker == {"WANDB_RUN_ID": "qwen2-7b-grpo-k8s-cloud", "WANDB_RESUME": "allow"}
    assert head["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8", "cpu": "96", "memory": "1600Gi"}
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"] for v in head["volumes"] if "persistentVolumeClaim" in v}
    mounts = {m["name"]: m["mountPath"] for m in head["containers"][0]["volumeMounts"]}
    assert {mounts[n]: c for n, c in claims.items()} == {"/data": "verl-data", "/checkpoints": "verl-checkpoints"}
    job_json = json.loads(configmap["data"]["job.json"])  # the same job package as the other targets
    assert job_json["nodes"] == 2 and job_json["total_gpus"] == 16 and job_json["image"] == "verlai/verl:vllm024.latest"
    assert job_json["train"][:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    for module in (REPO / "runtime").glob("*.py"):  # the runtime's modules, after the bundle's header
        assert runtime["data"][module.name].endswith(module.read_text()), module.name
    assert set(configmap["data"]) == {"job.json"}  # the job's own ConfigMap holds its job alone


def problems(tmp: Path, spec: dict[str, Any], target: str = "kuberay") -> list[str]:
    """`path: message` of every problem building `spec` for `target` (none: [])."""
    path = tmp / "spec.yaml"
    path.write_text(json.dumps(spec))
    try:
        compile_spec(path, CATALOG, display="spec.yaml", source="spec.yaml", targets=[target])
    except SpecError as exc:
        return [f"{d.path}: {d.message}" for d in exc.diagnostics]
    return []


def test_what_kubernetes_cannot_run_is_refused(tmp_path: Path) -> None:
    retry = base(kubernetes={"retries": 2})
    assert problems(tmp_path, retry) == [
        "verl.trainer.default_local_dir: kubernetes.retries recreates the pods: the checkpoints must be on a "
        "kubernetes.volumes claim (/ckpt/run is not under any of them); set trainer.default_local_dir under one"]
    assert problems(tmp_path, base(**{"kubernetes__retries": 2})) == []  # on the /ckpt claim
    assert problems(tmp_path, base(secrets=["WANDB_API_KEY"])) == [
        "secrets: the kuberay target reads secrets from a Kubernetes Secret: set kubernetes.secret to the Secret "
        "holding WANDB_API_KEY (one key per name)"]
    assert problems(tmp_path, base(env={"CACHE": "${HOME}/.cache"})) == [
        "env.CACHE: the kuberay target sets env values as they are; '${HOME}/.cache' needs a shell to expand it "
        "on the node"]
    long = base(name="a" * 48)
    assert problems(tmp_path, long)[0].startswith("name: the kuberay target names the RayJob 'aaaa")
    assert problems(tmp_path, base(name="9lives"))[0].startswith("name: the kuberay target names the RayJob '9lives'")
    apptainer = base(container={"runtime": "apptainer", "image": "/img/verl.sif", "workdir": "/w"})
    assert problems(tmp_path, apptainer)[0].startswith("kubernetes: the kuberay target runs an OCI image")
    bad = base(**{"kubernetes__memory": "1.5 TB"})
    assert problems(tmp_path, bad)[0].startswith("kubernetes.memory: '1.5 TB' is not a Kubernetes quantity")


def test_a_gpu_model_name_is_not_a_node_label_value(tmp_path: Path) -> None:
    """GPU feature discovery labels nodes NVIDIA-A100-SXM4-80GB; a selector on SkyPilot's A100-80GB matches no
    node and leaves the pods Pending for ever."""
    short = base(cluster={"nodes": 2, "gpus_per_node": 8, "gpu_type": "A100-80GB"})
    assert problems(tmp_path, short) == [
        "cluster.gpu_type: the kuberay target selects nodes by their GPU label nvidia.com/gpu.product, whose values "
        "are product names such as NVIDIA-A100-SXM4-80GB, not A100-80GB: set kubernetes.node_selector: "
        "{nvidia.com/gpu.product: <the value on your nodes>} (`kubectl get nodes -L nvidia.com/gpu.product` shows it)"]
    labelled = base(cluster={"nodes": 2, "gpus_per_node": 8, "gpu_type": "A100-80GB"},
                    **{"kubernetes__node_selector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}})
    assert problems(tmp_path, labelled) == []
    jobs, _, _ = kuberay_docs(labelled, tmp_path)
    head = jobs[0]["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert head["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    product = base(cluster={"nodes": 2, "gpus_per_node": 8, "gpu_type": "NVIDIA-H100-80GB-HBM3"})
    assert problems(tmp_path, product) == []


def test_a_spec_name_is_mapped_to_a_rayjob_name(tmp_path: Path) -> None:
    jobs, configmaps, _ = kuberay_docs(base(), tmp_path)
    assert jobs[0]["metadata"]["name"] == "k8s-run-v2"
    assert [c["metadata"]["name"] for c in configmaps] == ["k8s-run-v2-verlc-job", "k8s-run-v2-verlc-runtime"]


# --- lifecycle: kubectl command lines ------------------------------------------------------------------

KUBECTL = r'''#!{python}
import json, os, sys
with open(os.environ["VERLC_RECORD"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[:1] == ["create"]:
    with open(os.environ["VERLC_RECORD"] + ".created", "w") as fh:
        fh.write(sys.stdin.read())
    print("rayjob.ray.io/qwen2-7b-grpo-k8s-cloud")
elif args[:2] == ["get", "rayjob"]:
    print(json.dumps({"status": json.loads(os.environ["VERLC_RAYJOB_STATUS"])}))
elif args[:2] == ["get", "pods"]:
    print("pod/qwen2-7b-grpo-k8s-cloud-raycluster-head-abc12")
elif args[:1] == ["logs"]:
    print("verlc: stage data done")
'''


def test_lifecycle_runs_kubectl(tmp_path: Path) -> None:
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "kubectl"
    fake.write_text(KUBECTL.replace("{python}", sys.executable))
    fake.chmod(0o755)
    record = tmp_path / "record.jsonl"
    status = {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "failed": 1,
              "rayClusterName": "qwen2-7b-grpo-k8s-cloud-raycluster"}
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "VERLC_RECORD": str(record),
           "VERLC_RAYJOB_STATUS": json.dumps(status)}
    work = tmp_path / "work"  # the ledger (runs.jsonl) goes beside a spec outside git
    work.mkdir()
    (work / EXAMPLE.name).write_text(EXAMPLE.read_text())

    def verlc(*args: str, **extra: str) -> Any:
        return run_verlc(*args, cwd=work, env={**env, **extra})

    before = time.time()
    submitted = verlc("submit", EXAMPLE.name, "--target", "kuberay")
    assert submitted.returncode == 0, submitted.stderr
    # the RayJob as created: the bundle's, with its deadline's end in the head's environment (#42)
    [created] = yaml.safe_load_all((tmp_path / "record.jsonl.created").read_text())
    head = created["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    end = int(next(e["value"] for e in head["env"] if e["name"] == "VERLC_JOB_END"))
    assert before + 72 * 3600 - 1 <= end <= time.time() + 72 * 3600
    [bundled] = yaml.safe_load_all((work / "out" / "qwen2-7b-grpo-k8s-cloud" / "kuberay" / "rayjob.yaml").read_text())
    head["env"] = [e for e in head["env"] if e["name"] != "VERLC_JOB_END"]
    assert created == bundled
    bundle = work / "out" / "qwen2-7b-grpo-k8s-cloud" / "kuberay"
    status_out = verlc("status", "qwen2-7b-grpo-k8s-cloud")
    assert status_out.stdout == ("qwen2-7b-grpo-k8s-cloud: running, 1 restart(s) (job qwen2-7b-grpo-k8s-cloud on "
                                 "ml-research, from kubectl get rayjob)\n"), status_out.stderr
    assert "verlc: stage data done" in verlc("logs", "qwen2-7b-grpo-k8s-cloud").stdout
    attach = verlc("attach", "qwen2-7b-grpo-k8s-cloud", "--", "ray", "status")
    assert attach.returncode == 0, attach.stderr
    done = {**status, "jobDeploymentStatus": "Complete", "jobStatus": "SUCCEEDED"}
    final = verlc("status", "qwen2-7b-grpo-k8s-cloud", VERLC_RAYJOB_STATUS=json.dumps(done))
    assert final.stdout.startswith("qwen2-7b-grpo-k8s-cloud: succeeded"), final.stdout + final.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls[0] == ["apply", "--namespace", "ml-research", "--filename", str(bundle / "runtime.yaml"),
                        "--filename", str(bundle / "configmap.yaml")]
    assert calls[1] == ["create", "--namespace", "ml-research", "--filename", "-", "--output", "name"]
    get = ["get", "rayjob", "qwen2-7b-grpo-k8s-cloud", "--namespace", "ml-research", "--output", "json"]
    assert calls[2] == get
    assert calls[3] == ["logs", "--namespace", "ml-research", "job/qwen2-7b-grpo-k8s-cloud"]
    assert calls[4:7] == [get, ["get", "pods", "--namespace", "ml-research", "--selector",
                                "ray.io/cluster=qwen2-7b-grpo-k8s-cloud-raycluster,ray.io/node-type=head",
                                "--output", "name"],
                          ["exec", "--namespace", "ml-research", "pod/qwen2-7b-grpo-k8s-cloud-raycluster-head-abc12",
                           "--", "ray", "status"]]
    # cancel deletes the RayJob, and KubeRay its cluster with it
    cancelled = verlc("cancel", "qwen2-7b-grpo-k8s-cloud")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(record.read_text().splitlines()[-1]) == [
        "delete", "rayjob", "qwen2-7b-grpo-k8s-cloud", "--namespace", "ml-research", "--wait=false"]


def test_verl_saves_ahead_of_the_rayjobs_deadline(tmp_path: Path) -> None:
    """#42 on KubeRay: the job says where its end comes from (JOB_END, which `verlc submit` sets in the head's
    environment) and the runtime turns it into verl's deadline, 60 s ahead; without it, a line says verl saves at
    save_freq only. A release before verl's save ahead of a deadline (0.4.1) gets no expiry."""
    from verlc.runtime.job import Expiry, Job
    from verlc.runtime.train import with_deadline

    def job(version: str) -> Job:
        spec = tmp_path / f"{version}.yaml"
        spec.write_text(EXAMPLE.read_text() + f"verl_version: {version}\n")
        built = run_verlc("build", spec, "--target", "kuberay", "--out", tmp_path / version)
        assert built.returncode == 0, built.stderr
        assert ("cannot save a checkpoint ahead of the deadline" in built.stderr) == (version == "0.4.1"), built.stderr
        configmap = yaml.safe_load((tmp_path / version / "qwen2-7b-grpo-k8s-cloud" / "kuberay" / "configmap.yaml")
                                   .read_text())
        return Job.from_json(configmap["data"]["job.json"])

    expiry = job("0.9.1").expiry
    assert expiry == Expiry(variable="MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", lead=60,
                            end_env="VERLC_JOB_END")
    env = with_deadline({"VERLC_JOB_END": "2000000000"}, expiry)
    assert env["MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"] == "1999999940"
    assert json.loads(env["RAY_JOB_CONFIG_JSON_ENV_VAR"])["runtime_env"]["env_vars"] == {
        "MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP": "1999999940"}
    assert with_deadline({}, expiry) == {}  # applied by hand: no end known
    assert job("0.4.1").expiry is None
    spec = tmp_path / "no-saves.yaml"
    spec.write_text(EXAMPLE.read_text().replace("save_freq: 20", "save_freq: -1"))
    built = run_verlc("build", spec, "--target", "kuberay", "--out", tmp_path / "no-saves")
    assert "trainer.save_freq is -1: verl saves no checkpoint, not even ahead of the deadline" in built.stderr, \
        built.stderr


SECRET_KUBECTL = r'''#!{python}
import json, os, sys
with open(os.environ["VERLC_RECORD"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\n")
args = sys.argv[1:]
if args[:1] == ["create"]:
    text = sys.stdin.read()
    with open(os.environ["VERLC_RECORD"] + ".created", "a") as fh:
        fh.write(text + "\n---\n")
    if "kind: Secret" in text:
        print("\n".join(f"secret/{n}" for n in ("k8s-run-v2-v000-services", "k8s-run-v2-v001-services")))
    else:
        print("rayjob.ray.io/k8s-run-v2-v000\nrayjob.ray.io/k8s-run-v2-v001")
elif args[:2] == ["get", "rayjob"]:
    print("uid-of-" + args[2])
'''


def test_submit_makes_each_rayjobs_secret_of_tokens_first_and_hands_it_to_the_rayjob(tmp_path: Path) -> None:
    """#55 item 1 on KubeRay (against a recording kubectl: no cluster here): `verlc submit` creates one Secret per
    RayJob with a token made for the run (on kubectl's stdin, never its command line or the bundle), then the
    RayJobs, then makes each Secret the RayJob's own (Kubernetes deletes it with the RayJob)."""
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(SECRET_KUBECTL.replace("{python}", sys.executable))
    (bin_dir / "kubectl").chmod(0o755)
    record = tmp_path / "record.jsonl"
    work = tmp_path / "work"
    work.mkdir()
    (work / "spec.yaml").write_text(yaml.safe_dump(VARIANTS["sweep of 2, a service in an image of its own"]))
    submitted = run_verlc("submit", "spec.yaml", "--target", "kuberay", cwd=work,
                          env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "VERLC_RECORD": str(record)})
    assert submitted.returncode == 0, submitted.stderr
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert [c[:2] for c in calls] == [["apply", "--namespace"], ["create", "--namespace"], ["create", "--namespace"],
                                      ["get", "rayjob"], ["patch", "secret"], ["get", "rayjob"], ["patch", "secret"]]
    created = [d for d in yaml.safe_load_all(record.with_suffix(".jsonl.created").read_text()) if d]
    secrets, jobs = created[:2], created[2:]
    assert [s["kind"] for s in secrets] == ["Secret", "Secret"] and [j["kind"] for j in jobs] == ["RayJob"] * 2
    assert [s["metadata"]["name"] for s in secrets] == [f"{j['metadata']['name']}-services" for j in jobs]
    tokens = [s["stringData"]["VERLC_SERVICE_CODE_BOX_TOKEN"] for s in secrets]
    assert len(set(tokens)) == 2 and all(len(t) >= 32 for t in tokens)
    owner = json.loads(calls[4][-1])["metadata"]["ownerReferences"]
    assert owner == [{"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "k8s-run-v2-v000",
                      "uid": "uid-of-k8s-run-v2-v000"}]
    assert calls[4][2] == "k8s-run-v2-v000-services" and calls[6][2] == "k8s-run-v2-v001-services"
    kept = record.read_text() + submitted.stdout + submitted.stderr + "".join(
        p.read_text() for p in (work / "out").rglob("*") if p.is_file())
    assert not [t for t in tokens if t in kept]
