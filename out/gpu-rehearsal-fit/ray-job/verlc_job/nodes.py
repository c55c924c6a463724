# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""What each node has: its packages and their versions, verl's source, Ascend NPUs, the environment the spec
reads, and the paths verl's processes open there (each called on the node, as a Ray task pinned to it)."""

from __future__ import annotations

import glob
import json
import os
import platform
import subprocess

from .cluster import node_label, on_each_node
from .job import Word, expand


PACKAGES = ("verl", "ray", "torch", "transformers", "vllm", "sglang", "tensorrt_llm")


MIN_RAY = (2, 40)  # older Ray is incompatible with verl


def installed_versions(device: str = "GPU") -> dict:
    """A node's Python, packages and verl's source; on Ascend also torch_npu and the node's NPUs."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in PACKAGES + (("torch_npu",) if device == "NPU" else ()):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return {"host": platform.node(), "python": platform.python_version(), "packages": found,
            "verl_source": installed_from("verl"), **({"npus": npu_devices()} if device == "NPU" else {})}


def local_devices() -> tuple[int, str]:
    """How many accelerators torch sees on this node, and the backend of the all-reduce over them: HCCL where
    torch_npu sees Ascend NPUs, NCCL (RCCL on ROCm) where torch sees GPUs, else gloo (one rank)."""
    import importlib

    import torch

    try:
        importlib.import_module("torch_npu")  # adds torch.npu and the hccl backend
        if torch.npu.is_available():
            return torch.npu.device_count(), "hccl"
    except ImportError:
        pass
    return (torch.cuda.device_count(), "nccl") if torch.cuda.is_available() else (0, "gloo")


def npu_devices() -> dict:
    """What a node shows of its Ascend NPUs, each None where it shows nothing: `npu-smi info -m`'s chips that
    have a logic id (the NPUs; an MCU has none) and their names, torch_npu's count, and CANN's version."""
    smi, names = None, []
    try:
        out = subprocess.run(["npu-smi", "info", "-m"], capture_output=True, text=True, timeout=60).stdout
        chips = [row for row in (line.split(None, 3) for line in out.splitlines()) if len(row) > 2 and row[2].isdigit()]
        smi, names = len(chips), sorted({row[3].strip() for row in chips if len(row) > 3})
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        count, backend = local_devices()
        torch_npu = count if backend == "hccl" else None
    except ImportError:
        torch_npu = None
    cann = None
    home = os.environ.get("ASCEND_TOOLKIT_HOME") or "/usr/local/Ascend/ascend-toolkit/latest"
    for info in sorted(glob.glob(os.path.join(home, "*", "ascend_toolkit_install.info"))):
        with open(info, encoding="utf-8", errors="replace") as fh:
            cann = next((line.split("=", 1)[1].strip() for line in fh if line.startswith("version=")), cann)
    return {"npu_smi": smi, "chips": names, "torch_npu": torch_npu, "cann": cann}


def npu_problems(seen: dict, nodes: list[dict]) -> list[str]:
    """Each node must show at least the NPUs Ray was started with (torch_npu's count, else npu-smi's)."""
    problems = []
    for n in nodes:
        info = seen.get(n["NodeID"], {}).get("npus") or {}
        given = n.get("Resources", {}).get("NPU", 0)
        visible, how = (info.get("torch_npu"), "torch_npu") if info.get("torch_npu") is not None \
            else (info.get("npu_smi"), "npu-smi")
        if visible is None:
            problems.append(f"node {node_label(n)}: no NPU visible (no npu-smi on PATH, no torch_npu)")
        elif visible < given:
            problems.append(f"node {node_label(n)}: {how} shows {visible} NPUs, Ray was started with {given:g}")
    return problems


def installed_from(name: str) -> dict | None:
    """Where pip installed a distribution from (PEP 610's direct_url.json): {"commit": sha} for a git
    install, {"url": ...} for a folder or an archive; None for an index install (or none at all)."""
    from importlib.metadata import PackageNotFoundError, distribution

    try:
        text = distribution(name).read_text("direct_url.json")
    except PackageNotFoundError:
        return None
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return {"url": "an unreadable direct_url.json"}
    commit = (data.get("vcs_info") or {}).get("commit_id")
    return {"commit": commit, "url": data.get("url")} if commit else {"url": data.get("url")}


def verl_commit_problems(seen: dict, commit: str) -> list[str]:
    """Each node's verl must be the spec's commit, as pip recorded it (a git install)."""
    problems = []
    for node, info in sorted(seen.items()):
        source = info.get("verl_source") or {}
        got = source.get("commit")
        if got == commit:
            continue
        what = (f"verl is commit {got}" if got else f"verl was installed from {source['url']}, not from git"
                if source.get("url") else "verl was not installed from git (no commit recorded)")
        problems.append(f"node {info['host']} ({node[:8]}): {what}; the spec pins commit {commit} "
                        f"(pip install verl@git+https://github.com/verl-project/verl.git@{commit})")
    return problems


def versions_per_node(ray, nodes: list[dict], device: str = "GPU") -> tuple[dict, list[str]]:  # noqa: ANN001
    """What each node's Python sees (by NodeID), and the nodes that could not say."""
    return on_each_node(ray, nodes, installed_versions, device, what="versions")


def version_tuple(text: str) -> tuple[int, ...]:
    out = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


def version_problems(seen: dict, pins: dict[str, str], rollout_package: str | None = None) -> list[str]:
    problems = []
    for node, info in sorted(seen.items()):
        where = f"node {info['host']} ({node[:8]})"
        if rollout_package and not info["packages"].get(rollout_package):
            problems.append(f"{where}: the rollout engine {rollout_package} (actor_rollout_ref.rollout.name) "
                            f"is not installed")
        for name, wanted in sorted(pins.items()):
            got = info["packages"].get(name)
            if got != wanted:
                problems.append(f"{where}: {name} {got or 'is not installed'}, the spec pins {wanted}")
        ray_version = info["packages"].get("ray")
        if ray_version and version_tuple(ray_version) < MIN_RAY:
            problems.append(f"{where}: ray {ray_version} is older than verl needs (>= 2.40)")
    distinct = {json.dumps(info["packages"], sort_keys=True) for info in seen.values()}
    if len(distinct) > 1:
        problems.append("nodes see different package versions: " + "; ".join(
            f"{info['host']}: " + ", ".join(f"{k} {v}" for k, v in sorted(info["packages"].items()) if v)
            for info in seen.values()))
    return problems


def environment_of(names: list[str]) -> dict:
    return {"host": platform.node(), "missing": [n for n in names if not os.environ.get(n)]}


def missing_env_per_node(ray, nodes: list[dict], names: list[str]) -> list[str]:  # noqa: ANN001
    """The env vars the spec reads on the nodes that a node lacks (unset or empty), and the nodes that could
    not say."""
    seen, problems = on_each_node(ray, nodes, environment_of, names, what="environment")
    return problems + [f"node {s['host']}: environment variable {n} is not set (the spec reads ${{env:{n}}})"
                       for s in seen.values() for n in s["missing"]]


def parquet_columns(path: str) -> list[str] | None:
    """Top-level column names of a parquet file, or None when pyarrow is not installed."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    return list(pq.read_schema(path).names)


def check_model(model: str) -> str | None:
    """Problem with the model, or None. A local folder needs a readable config.json; a hub id is
    resolved through transformers (config only, no weights) when it is installed."""
    if os.path.isdir(os.path.expanduser(model)):
        config = os.path.join(os.path.expanduser(model), "config.json")
        try:
            with open(config, encoding="utf-8") as fh:
                json.load(fh)
        except (OSError, ValueError) as exc:
            return f"model folder {model}: cannot read config.json ({exc})"
        return None
    if model.startswith(("/", "./", "../", "~")):
        return f"model path {model} does not exist"
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    try:
        AutoConfig.from_pretrained(model)
    except Exception as exc:
        return f"model {model}: config does not load ({type(exc).__name__}: {exc})"
    return None


def checkpoint_problem(folder: str) -> str | None:
    """Why the checkpoint folder cannot take verl's checkpoints here, or None (it is made if missing)."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".verlc-write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        return f"checkpoint folder {folder} is not writable ({exc.strerror})"
    return None


def paths_on_node(model: Word, checkpoint_dir: Word, data: list[Word], files: list[Word] = ()) -> list[str]:
    """On one node, what its verl processes would meet: every data file, a local model folder, the checkpoint
    folder (each verl worker loads the model and writes its shard of each checkpoint) and the files verl's settings
    name, with the paths expanded in this node's environment as verl's ${oc.env:...} would be. A hub model is
    checked once, on the head."""
    problems = [f"data file {path} does not exist (cwd {os.getcwd()})" for path in map(expand, data)
                if not os.path.isfile(path)]
    problems += [f"file {path} (named by a verl setting) does not exist" for path in map(expand, files)
                 if not os.path.isfile(path)]
    folder = expand(model)
    if folder.startswith(("/", "./", "../", "~")) or os.path.isdir(os.path.expanduser(folder)):
        problems += [p for p in [check_model(folder)] if p]
    problems += [p for p in [checkpoint_problem(expand(checkpoint_dir))] if p]
    return problems
