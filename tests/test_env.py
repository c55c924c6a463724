"""A spec's env reaches the job on every target, also a variable verlc sets itself (#53 item 3): a path list is
merged (verlc's entry, then the spec's), and a VERLC_ variable, verlc's own, is refused at its line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from conftest import REPO, run_verlc, slurm_job

EXTRA = "/site/extra"
# the example specs whose targets cover all five
SPECS = ("qwen2-7b-gsm8k-ppo-mi300", "qwen2-7b-grpo-k8s-cloud")


def with_env(tmp_path: Path, example: str, **env: str) -> Path:
    yaml = YAML()
    data = yaml.load((REPO / "specs" / f"{example}.yaml").read_text())
    data.setdefault("env", {}).update(env)
    spec = tmp_path / f"{example}.yaml"
    with spec.open("w") as fh:
        yaml.dump(data, fh)
    return spec


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every target's bundle of the examples, each spec with PYTHONPATH in its env."""
    root = tmp_path_factory.mktemp("env")
    found: dict[str, Path] = {}
    for example in SPECS:
        spec = with_env(root, example, PYTHONPATH=EXTRA)
        built = run_verlc("build", spec, "--target", "all", "--out", root / "out", cwd=REPO)
        assert built.returncode == 0, built.stderr
        found.update({t.name: t for t in (root / "out" / example).iterdir()})
    assert sorted(found) == ["compose", "kuberay", "ray-job", "skypilot", "slurm"]
    return found


def test_compose_services_get_the_job_package_then_the_specs_entries(bundles: dict[str, Path]) -> None:
    services = YAML(typ="safe").load((bundles["compose"] / "compose.yaml").read_text())["services"]
    assert len(services) == 2
    for name, service in services.items():
        paths = [e for e in service["environment"] if e.startswith("PYTHONPATH")]
        assert paths == [f"PYTHONPATH=/opt/verlc:{EXTRA}"], (name, paths)


def test_kuberay_pods_get_the_job_package_then_the_specs_entries(bundles: dict[str, Path]) -> None:
    rayjob = YAML(typ="safe").load((bundles["kuberay"] / "rayjob.yaml").read_text())
    cluster = rayjob["spec"]["rayClusterSpec"]
    pods = [cluster["headGroupSpec"], *cluster["workerGroupSpecs"]]
    for pod in pods:
        [container] = pod["template"]["spec"]["containers"]
        paths = [e["value"] for e in container["env"] if e["name"] == "PYTHONPATH"]
        assert paths == [f"/opt/verlc:{EXTRA}"], (container["name"], paths)


def test_ray_job_slurm_and_skypilot_pass_the_specs_value_and_add_their_own_on_the_node(
        bundles: dict[str, Path]) -> None:
    # ray-job: Ray puts py_modules (verlc's job package) on the path itself, beside the env's PYTHONPATH
    runtime_env = YAML(typ="safe").load((bundles["ray-job"] / "runtime_env.yaml").read_text())
    assert runtime_env["env_vars"]["PYTHONPATH"] == EXTRA and runtime_env["py_modules"] == ["verlc_job"]
    # slurm: the runtime runs as `python3 -`, needing no path; the job's env exports the spec's value
    script = (bundles["slurm"] / "sbatch.sh").read_text()
    assert re.findall(r"export PYTHONPATH=(\S+)", script) == [EXTRA], script
    assert slurm_job(script)["name"]
    # skypilot: the task's env has the spec's value; run.sh puts the job package ahead of it
    task = YAML(typ="safe").load((bundles["skypilot"] / "task.yaml").read_text())
    assert task["envs"]["PYTHONPATH"] == EXTRA
    assert "export PYTHONPATH=/opt/verlc${PYTHONPATH:+:$PYTHONPATH}\n" in task["run"]


@pytest.mark.parametrize("example", SPECS)
def test_a_verlc_variable_in_the_specs_env_is_refused_at_its_line(tmp_path: Path, example: str) -> None:
    spec = with_env(tmp_path, example, VERLC_STOP_AFTER="preflight")
    result = run_verlc("validate", spec, "--target", "all", cwd=REPO)
    line = next(i for i, text in enumerate(spec.read_text().splitlines(), 1) if "VERLC_STOP_AFTER" in text)
    assert result.returncode == 2, result.stderr
    assert re.search(rf"^{re.escape(str(spec))}:{line}:\d+: env\.VERLC_STOP_AFTER: VERLC_STOP_AFTER: VERLC_ "
                     r"variables are verlc's own", result.stderr, re.M), result.stderr


def test_hccl_ports_left_to_hccl_are_taken_and_an_explicit_range_is_refused_at_its_line(tmp_path: Path) -> None:
    """#53 item 9: `auto` (verl's own runtime env asks it) reaches every target's nodes, and verlc's port plan
    leaves that variable out (the Slurm script derives only the other one from the job's block); a range of the
    spec's own is refused, saying what verlc does and that `auto` is taken."""
    auto = with_env(tmp_path, "qwen3-32b-grpo-ascend-a3", HCCL_HOST_SOCKET_PORT_RANGE="auto")
    built = run_verlc("build", auto, "--target", "all", "--out", tmp_path / "out", cwd=REPO)
    assert built.returncode == 0, built.stderr
    assert "env.HCCL_HOST_SOCKET_PORT_RANGE: note: HCCL_HOST_SOCKET_PORT_RANGE: auto: HCCL picks these ports" \
        in built.stderr
    bundles = tmp_path / "out" / "qwen3-32b-grpo-ascend-a3"
    script = (bundles / "slurm" / "sbatch.sh").read_text()
    assert "readonly hccl_ports=(HCCL_NPU_SOCKET_PORT_RANGE 55 99)" in script, script
    assert re.findall(r"export HCCL_HOST_SOCKET_PORT_RANGE=(\S+)", script) == ["auto"]
    rayjob = YAML(typ="safe").load((bundles / "kuberay" / "rayjob.yaml").read_text())
    cluster = rayjob["spec"]["rayClusterSpec"]
    for pod in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        env = {e["name"]: e.get("value") for e in pod["template"]["spec"]["containers"][0]["env"]}
        assert env["HCCL_HOST_SOCKET_PORT_RANGE"] == "auto" and env["HCCL_NPU_SOCKET_PORT_RANGE"] == "20055-20099"
    explicit = with_env(tmp_path, "qwen3-32b-grpo-ascend-a3", HCCL_HOST_SOCKET_PORT_RANGE="60000-60050")
    refused = run_verlc("validate", explicit, cwd=REPO)
    line = next(i for i, text in enumerate(explicit.read_text().splitlines(), 1) if "60000-60050" in text)
    assert refused.returncode == 2
    assert re.search(rf":{line}:\d+: env\.HCCL_HOST_SOCKET_PORT_RANGE: verlc gives HCCL_HOST_SOCKET_PORT_RANGE a "
                     r"range of the job's own block of ports .* the other value it takes is `auto`", refused.stderr)
