"""Ascend NPUs (cluster.accelerator: npu) on every target: what each bundle asks the scheduler for, the
containers' devices and driver files, HCCL's settings, verl's trainer.device, and the refusals; then the
runtime's wait and preflight on a real Ray cluster whose nodes have Ray's NPU resource (CPU-only here), with
an `npu-smi` stand-in reporting the devices."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from ruamel.yaml import YAML

from conftest import IN_CI, REPO, run_verlc
from test_compose import config
from test_ray_job import BIN, free_port, ray_env, stop_by_pid
from test_slurm_e2e import NPU_SMI
from verlc.compiler.diagnostics import SpecError
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.targets import render

EXAMPLE = REPO / "specs" / "qwen3-32b-grpo-ascend-a3.yaml"
SKY_PYTHON = REPO / ".cache" / "sky" / "bin" / "python"
CUDA_OR_ROCM = re.compile(r"\b(CUDA_VISIBLE_DEVICES|HIP_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES|NCCL_\w+|--gpus|"
                          r"--num-gpus|nvidia\.com/gpu|/dev/kfd)\b")


REMOVE = object()  # a change that removes the key


def example(**changes: Any) -> dict[str, Any]:
    """The example spec as data, with dotted-key changes (REMOVE removes the key)."""
    spec = YAML(typ="safe").load(EXAMPLE.read_text())  # YAML 1.2, as verlc reads it (1e-6 is a number)
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = spec
        for part in parents:
            node = node.setdefault(part, {})
        if value is REMOVE:
            node.pop(last, None)
        else:
            node[last] = value
    return spec


def files(spec: dict[str, Any], tmp_path: Path, target: str) -> tuple[dict[str, str], Any]:
    path = tmp_path / f"{target}.yaml"
    path.write_text(json.dumps(spec))
    ir = compile_spec(path, CATALOG, display=path.name, source=path.name, targets=[target])
    return {f.path: f.text for f in render(target, ir).files}, ir


def refusal(spec: dict[str, Any], tmp_path: Path, target: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        files(spec, tmp_path, target)
    return [str(p) for p in caught.value.diagnostics]


def sbatch_lines(script: str, option: str) -> list[str]:
    return re.findall(rf"^#SBATCH --{option}\b.*$", script, flags=re.M)


def test_the_slurm_bundle_asks_for_npus_and_sets_them_up_as_verls_ascend_guide_does(tmp_path: Path) -> None:
    out, ir = files(example(), tmp_path, "slurm")
    script = out["sbatch.sh"]
    assert sbatch_lines(script, "gres") == ["#SBATCH --gres=npu:16"] and not sbatch_lines(script, "gpus-per-node")
    # Ray's NPU resource on every node (JSON, one word), never GPUs; no CUDA/ROCm/NCCL settings at all
    assert script.count("'--resources={\"NPU\": 16}'") == 2
    generated = script.split("# runtime/ of verlc")[0]  # the job's part (the runtime serves every job)
    assert not CUDA_OR_ROCM.findall(generated), CUDA_OR_ROCM.findall(generated)
    env = dict(re.findall(r"^  export (\w+)=(.*?)(?:  # .*)?$", script, flags=re.M))
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, range(16)))
    assert env["RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES"] == "1"
    assert env["HCCL_SOCKET_IFNAME"] == "enp189s0f0"  # network.head_interface
    assert env["HCCL_CONNECT_TIMEOUT"] == env["HCCL_EXEC_TIMEOUT"] == "3600"
    # HCCL's ranges in the job's port block, as offsets the script adds to its base (values: test_slurm_e2e)
    assert "HCCL_HOST_SOCKET_PORT_RANGE" not in env and "HCCL_NPU_SOCKET_PORT_RANGE" not in env
    assert re.search(r"^readonly hccl_ports=\(HCCL_HOST_SOCKET_PORT_RANGE 10 54 HCCL_NPU_SOCKET_PORT_RANGE 55 99\)",
                     script, flags=re.M), script[:3000]
    # the container: each NPU's device file and Ascend's three others, the driver read-only; not privileged
    devices = re.findall(r"--device=(\S+)", script)
    assert devices == [f"/dev/davinci{i}" for i in range(16)] + ["/dev/davinci_manager", "/dev/devmm_svm",
                                                                  "/dev/hisi_hdc"]
    volumes = re.findall(r"--volume (\S+)", script)
    assert "/usr/local/Ascend/driver:/usr/local/Ascend/driver:ro" in volumes
    assert "/usr/local/bin/npu-smi:/usr/local/bin/npu-smi:ro" in volumes and "--privileged" not in script
    # every HCCL and Ascend variable also reaches the container
    passed = set(re.findall(r"--env (\w+)", script))
    assert {n for n in env if n.startswith(("HCCL_", "ASCEND_"))} <= passed
    assert "trainer.device=npu" in ir.trainer_argv and '"device": "NPU"' in generated  # the runtime's job


def test_slurm_gres_follows_the_site(tmp_path: Path) -> None:
    """A site that schedules no NPUs gets neither --gres nor --gpus-per-node; a typed one NAME:TYPE:N."""
    untyped, _ = files(example(**{"cluster.slurm.npu_gres": None}), tmp_path, "slurm")
    assert not sbatch_lines(untyped["sbatch.sh"], "gres") and not sbatch_lines(untyped["sbatch.sh"], "gpus-per-node")
    typed, _ = files(example(**{"cluster.slurm.npu_gres": "ascend", "cluster.gpu_type": "910C"}), tmp_path, "slurm")
    assert sbatch_lines(typed["sbatch.sh"], "gres") == ["#SBATCH --gres=ascend:910C:16"]


def test_privileged_is_the_sites_choice_and_noted(tmp_path: Path) -> None:
    spec = example(**{"container.privileged": True})
    out, ir = files(spec, tmp_path, "slurm")
    assert "    --privileged\n" in out["sbatch.sh"]
    assert any("container.privileged: note: the container gets every device" in n for n in ir.notes), ir.notes


def test_trainer_device_follows_the_accelerator_and_the_release(tmp_path: Path) -> None:
    verl = {"algorithm": {"adv_estimator": "grpo"},
            "actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 4},
                                  "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4}}}
    _, old = files(example(verl_version="0.3.0.post1", verl=verl), tmp_path, "slurm")
    assert not any(a.startswith("trainer.device=") for a in old.trainer_argv)
    assert any("verl 0.3.0.post1 predates Ascend NPU support" in n for n in old.notes), old.notes
    wrong = example()
    wrong["verl"]["trainer"]["device"] = "cuda"
    problems = refusal(wrong, tmp_path, "slurm")
    assert len(problems) == 1 and "verl.trainer.device: trainer.device cuda on cluster.accelerator npu" in problems[0]
    gpu = example(**{"cluster.accelerator": "cuda", "cluster.slurm.npu_gres": None})
    gpu["verl"]["trainer"]["device"] = "npu"
    assert "trainer.device npu on cluster.accelerator cuda" in refusal(gpu, tmp_path, "slurm")[0]


def test_pyxis_cannot_run_npus(tmp_path: Path) -> None:
    spec = example(container={"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3", "workdir": "/w"})
    problems = refusal(spec, tmp_path, "slurm")
    assert any("pyxis/enroot exposes NVIDIA GPUs only; use docker, podman or apptainer on Ascend" in p
               for p in problems), problems


def test_apptainer_binds_the_driver_and_passes_no_gpu_flag(tmp_path: Path) -> None:
    out, _ = files(example(container={"runtime": "apptainer", "image": "/images/verl-npu.sif", "workdir": "/w"}),
                   tmp_path, "slurm")
    assert "--bind /usr/local/Ascend/driver:/usr/local/Ascend/driver:ro" in " ".join(out["sbatch.sh"].split())
    assert "--nv" not in out["sbatch.sh"].split() and "--rocm" not in out["sbatch.sh"].split()


def test_compose_gives_each_ray_node_its_own_npus_as_compose_reads_them(tmp_path: Path) -> None:
    """Two Ray nodes on one host of 32 NPUs: each service its own 16 device files (numbered from 0 inside),
    Ascend's other devices and the driver in both; the file is read back by the Compose binary."""
    spec = example(targets=["compose"], **{"cluster.slurm": REMOVE})
    out, _ = files(spec, tmp_path, "compose")
    folder = tmp_path / "bundle"
    for path, text in out.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    result = config(folder, "--format", "json")
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    assert sorted(services) == ["ray-head", "ray-worker-1"]
    for index, name in enumerate(["ray-head", "ray-worker-1"]):
        service = services[name]
        devices = [d["source"] for d in service["devices"]]
        assert devices == [f"/dev/davinci{16 * index + i}" for i in range(16)] + [
            "/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"], devices
        assert "deploy" not in service and not service.get("privileged")
        assert service["environment"]["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, range(16)))
        assert any(v["source"] == "/usr/local/Ascend/driver" and v.get("read_only") for v in service["volumes"])
        assert '--resources={"NPU": 16}' in service["command"] and "--num-gpus" not in " ".join(service["command"])


def test_kuberay_asks_for_the_device_plugins_resource_and_selects_ascend_nodes(tmp_path: Path) -> None:
    out, _ = files(example(**{"kubernetes.npu_resource": "huawei.com/Ascend910C"}), tmp_path, "kuberay")
    job = yaml.safe_load(out["rayjob.yaml"])
    pod = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["huawei.com/Ascend910C"] == "16"
    assert pod["nodeSelector"] == {"accelerator": "huawei-Ascend910"}
    # a chip name is not the node label's value: refused, naming the label and an example value
    spec = example(**{"cluster.gpu_type": "Ascend910B3", "kubernetes.node_selector": {}})
    problems = refusal(spec, tmp_path, "kuberay")
    assert any("selects nodes by their NPU label accelerator" in p and "huawei-Ascend910" in p for p in problems)


def test_skypilot_is_refused_in_one_line_and_its_own_code_has_no_ascend(tmp_path: Path) -> None:
    problems = refusal(example(targets=["skypilot"], **{"cluster.gpu_type": "Ascend910B"}), tmp_path, "skypilot")
    ascend = [p for p in problems if "Ascend NPUs" in p]
    assert len(ascend) == 1 and re.fullmatch(
        r"skypilot\.yaml:\d+:\d+: cluster\.accelerator: the skypilot target cannot run on Ascend NPUs: SkyPilot's "
        r"clouds and its Kubernetes support offer no Ascend accelerator; use the slurm, kuberay, ray-job or "
        r"compose target", ascend[0]), problems
    if not SKY_PYTHON.exists():
        message = "SkyPilot is not installed in .cache/sky (dev/test.sh installs it)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    # the reason, checked against SkyPilot's own code: the accelerator resources its Kubernetes support knows
    probe = ("from sky.provision.kubernetes import utils\n"
             "print(' '.join(sorted(utils.SUPPORTED_GPU_RESOURCE_KEYS.values())))")
    result = subprocess.run([str(SKY_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "nvidia.com/gpu" in result.stdout.split() and not re.search(r"huawei|ascend|npu", result.stdout, re.I)


def test_ray_job_notes_what_the_cluster_must_have(tmp_path: Path) -> None:
    _, ir = files(example(), tmp_path, "ray-job")
    assert any("the cluster's Ray nodes must have their NPUs as Ray's NPU resource" in n for n in ir.notes)


def test_hostile_values_in_the_npu_fields_are_refused_with_positions(tmp_path: Path) -> None:
    for dotted, value in (("cluster.slurm.npu_gres", "npu:16 --uid=0"), ("cluster.slurm.npu_gres", "$(id)"),
                          ("kubernetes.npu_resource", "huawei.com/Ascend 910"), ("network.hccl.exec_timeout", "1h; id"),
                          ("container.privileged", "yes"), ("cluster.accelerator", "ascend")):
        path = tmp_path / "hostile.yaml"
        path.write_text(yaml.safe_dump(example(**{dotted: value})))
        result = run_verlc("validate", path)
        assert result.returncode == 2, (dotted, value, result.stdout)
        *lines, summary = result.stderr.strip().splitlines()
        assert lines and all(re.match(rf"{re.escape(str(path))}:\d+:\d+: ", line) for line in lines), lines
        assert re.fullmatch(r"verlc: \d+ problem\(s\); nothing written", summary), summary
        assert any(f": {dotted}: " in line for line in lines), (dotted, lines)
        assert "Traceback" not in result.stderr


# ---- the runtime on a real Ray cluster with Ray's NPU resource ------------------------------------------


@pytest.fixture(scope="module")
def npu_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two Ray nodes on this host, started as the bundles start them on Ascend: `--resources={"NPU": N}` with
    every NPU visible and Ray leaving the visibility to verl. npu-head has 2 NPUs (npu-smi shows 2), npu-short
    has 1 (npu-smi shows none: its driver lost it). Yields the GCS address."""
    if not (BIN / "ray").exists():
        message = "ray is not installed in the test venv (the README's test command installs it)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    tools = tmp_path_factory.mktemp("npu-tools")
    (tools / "npu-smi").write_text(NPU_SMI)
    (tools / "npu-smi").chmod(0o755)
    temps = [Path("/tmp") / f"verlc-npu-{os.getpid()}-{i}" for i in range(2)]
    address = f"127.0.0.1:{free_port()}"

    def start(temp: Path, npus: int, shown: int, *role: str, name: str) -> None:
        env = ray_env({"PATH": f"{tools}:{BIN}:{os.environ['PATH']}", "FAKE_NPUS": str(shown),
                       "ASCEND_RT_VISIBLE_DEVICES": ",".join(map(str, range(npus))),
                       "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": "1"}, temp)
        subprocess.run([str(BIN / "ray"), "start", *role, "--node-ip-address=127.0.0.1", f"--node-name={name}",
                        f'--resources={{"NPU": {npus}}}', "--num-cpus=1", f"--temp-dir={temp}",
                        f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"],
                       check=True, capture_output=True, env=env, timeout=180)

    try:
        start(temps[0], 2, 2, "--head", f"--port={address.split(':')[1]}", "--include-dashboard=false",
              name="npu-head")
        start(temps[1], 1, 0, f"--address={address}", name="npu-short")
        yield address
    finally:
        for temp in temps:
            stop_by_pid(temp)


# The start of a program run by runtime(): connected to the cluster, once both nodes are there (by name)
CONNECTED = """
import time
ray = cluster.connect(address)
for _ in range(60):
    nodes = cluster.alive_nodes(ray)
    if len(nodes) == 2:
        break
    time.sleep(1)
nodes = sorted(nodes, key=lambda n: n["NodeName"])
"""


def runtime(program: str, address: str, **env: str) -> subprocess.CompletedProcess[str]:
    code = (f"import json, sys\nfrom verlc.runtime import cluster, collective, nodes as on_nodes\n"
            f"address = sys.argv[1]\n{program}")
    return subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                          env=ray_env(env), timeout=300)


def test_the_wait_counts_npus_and_names_a_node_with_too_few(npu_cluster: str) -> None:
    ready = runtime("sys.exit(cluster.wait(address, 2, 3, 60, 'NPU'))", npu_cluster)
    assert ready.returncode == 0, ready.stdout + ready.stderr
    assert re.search(r"node registered: npu-head \([\d.]+\) NPUs=2 \(\d/2\)", ready.stdout), ready.stdout
    assert re.search(r"node registered: npu-short \([\d.]+\) NPUs=1 \(\d/2\)", ready.stdout), ready.stdout
    assert "cluster ready: 2 nodes, 3 NPUs" in ready.stdout
    # every node the job started (the Slurm bundle names them) has come: it fails at once, naming the short one
    began = time.monotonic()
    short = runtime("sys.exit(cluster.wait(address, 2, 4, 120, 'NPU'))", npu_cluster,
                    VERLC_NODE_NAMES="npu-head npu-short")
    assert short.returncode == 1, short.stdout + short.stderr
    assert time.monotonic() - began < 60, "it waited for the deadline"
    assert re.search(r"ERROR: the cluster has 2 of 2 nodes and 3 of 4 NPUs; each node needs 2 NPUs: "
                     r"npu-short \([\d.]+\) has 1\n", short.stdout), short.stdout


def test_the_preflight_reads_each_nodes_npus_and_the_all_reduce_holds_them(npu_cluster: str) -> None:
    """npu-smi's chips per node against Ray's NPU resource (the short node's npu-smi shows none), torch_npu's
    version recorded; the all-reduce's tasks hold each node's NPUs (gloo here: no torch_npu)."""
    program = CONNECTED + """
seen, unanswered = on_nodes.versions_per_node(ray, nodes, "NPU")
assert unanswered == [], unanswered
problems, summary = collective.collective_problems(ray, nodes, device="NPU")
print(json.dumps({"seen": {n["NodeName"]: seen[n["NodeID"]] for n in nodes},
                  "npu": on_nodes.npu_problems(seen, nodes), "allreduce": problems, "summary": summary}))
"""
    result = runtime(program, npu_cluster)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    head, short = out["seen"]["npu-head"], out["seen"]["npu-short"]
    assert head["npus"] == {"npu_smi": 2, "chips": ["Ascend910_9391"], "torch_npu": None, "cann": None}
    assert short["npus"]["npu_smi"] == 0 and "torch_npu" in head["packages"]
    assert len(out["npu"]) == 1 and re.fullmatch(r"node npu-short \([\d.]+\): npu-smi shows 0 NPUs, Ray was "
                                                 r"started with 1", out["npu"][0]), out["npu"]
    assert out["allreduce"] == [] and out["summary"] == "all-reduce over 2 ranks on 2 nodes", out


def test_a_probe_on_each_node_names_the_node_that_failed_or_did_not_answer(npu_cluster: str) -> None:
    """The preflight's per-node probes (versions, environment) report a node whose task fails or never answers
    by name, within their timeout, instead of raising or waiting on it."""
    program = CONNECTED + """
def short_fails():
    if ray.get_runtime_context().get_node_id() == nodes[1]["NodeID"]:
        raise RuntimeError("no torch here")
    return "fine"

def short_hangs():
    if ray.get_runtime_context().get_node_id() == nodes[1]["NodeID"]:
        time.sleep(60)
    return "fine"

began = time.monotonic()
failed = cluster.on_each_node(ray, nodes, short_fails, what="versions")
hung = cluster.on_each_node(ray, nodes, short_hangs, what="environment", timeout=5)
print(json.dumps({"failed": failed, "hung": hung, "seconds": time.monotonic() - began}))
"""
    result = runtime(program, npu_cluster)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout.strip().splitlines()[-1])
    (head_id, head_answer), = out["failed"][0].items()
    assert head_answer == "fine" and out["hung"][0] == {head_id: "fine"}, out
    assert len(out["failed"][1]) == 1 and re.fullmatch(
        r"versions: node npu-short \([\d.]+\): RuntimeError: no torch here", out["failed"][1][0]), out["failed"]
    assert out["hung"][1] and re.fullmatch(r"environment: node npu-short \([\d.]+\) did not answer within 5s",
                                           out["hung"][1][0]) and len(out["hung"][1]) == 1, out["hung"]
    assert out["seconds"] < 40, out["seconds"]
