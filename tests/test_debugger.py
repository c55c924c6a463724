"""Ray's legacy debugger (ray.debug: legacy): a breakpoint in any verl worker stops for `ray debug`, so every node's
`ray start` takes --ray-debugger-external, not the head's alone (#53 item 13)."""

from __future__ import annotations

import re
from pathlib import Path

from ruamel.yaml import YAML

from conftest import REPO, run_verlc
from test_env import SPECS

OPTION = "--ray-debugger-external"


def test_every_nodes_ray_start_accepts_the_debugger(tmp_path: Path) -> None:
    yaml = YAML()
    for example in SPECS:
        data = yaml.load((REPO / "specs" / f"{example}.yaml").read_text())
        data.setdefault("ray", {})["debug"] = "legacy"
        with (tmp_path / f"{example}.yaml").open("w") as fh:
            yaml.dump(data, fh)
        built = run_verlc("build", tmp_path / f"{example}.yaml", "--target", "all", "--out", tmp_path / "out")
        assert built.returncode == 0, built.stderr
    mi300, k8s = (tmp_path / "out" / s for s in SPECS)
    script = (mi300 / "slurm" / "sbatch.sh").read_text()
    head, worker = re.search(r"^ray_command\(\) \{(.*?)^  else(.*?)^\}", script, re.M | re.S).groups()
    assert "ray start --head" in head and OPTION in head, head
    assert "ray start --block --address" in worker and OPTION in worker, worker
    services = YAML(typ="safe").load((mi300 / "compose" / "compose.yaml").read_text())["services"]
    assert len(services) == 2 and all(OPTION in service["command"] for service in services.values()), services
    cluster = YAML(typ="safe").load((k8s / "kuberay" / "rayjob.yaml").read_text())["spec"]["rayClusterSpec"]
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        assert group["rayStartParams"]["ray-debugger-external"] == "true", group["rayStartParams"]
    run = YAML(typ="safe").load((k8s / "skypilot" / "task.yaml").read_text())["run"]
    assert len(re.findall(rf"ray start [^&]*{OPTION}", run)) == 2, run
