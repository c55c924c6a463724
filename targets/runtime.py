"""verlc's in-cluster runtime: what runs on the cluster, on the head node (and each node's Ray logs), inside
the job's container, next to verl.

Every bundle ships this one file: the Slurm script embeds it verbatim (below a banner with its sha256) and
runs it as `python3 - COMMAND ...`; the other bundles ship it as the package `verlc_job`. It needs only the
standard library and ray, and torch for the preflight's all-reduce; pyarrow and transformers are used when
the image has them (verl's images have all of these).

Its command line (what bundles call):
  job          the job: wait for the Ray cluster, data, preflight, train (with the stall watchdog), stopping
               after the stage VERLC_STOP_AFTER names; the package's job.json, or --json from the Slurm script
  ray-logs     a node's Ray session logs as a tar stream (bounded), then Ray's temp dir removed
  materialize  put a hub model's pinned revision into a folder, unless it holds it already

The stages, each a function below: `wait` blocks until the cluster has the expected nodes and GPUs (NPUs on
Ascend), or fails at a deadline; `materialize` and `prepare` put the model and the data in place; `preflight`
checks the cluster, package versions and what verl's workers import at start-up on every node, an all-reduce over every GPU, data files, model and
checkpoint folder, and writes the run record; `train` runs verl's program, watching verl's step lines
(protocol.STEP_LINE) for a stall.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import time

if __package__:  # verlc_job/ (verlc.targets while developing): the protocol is the module beside this one
    from .protocol import (NODE_LOST, PAUSE_AT, PIPELINE_JOBS, RUNNER_STAGES, STEP_LINE, STOP_AFTER,
                           TIME_LIMIT_REACHED, TRAIN_STARTS, USAGE, Job, Variant, event_line, node_message,
                           skipped_message, stage_message, stamp, stop_after_problem)
# else: run as `python3 -` by the Slurm script, which feeds protocol.py's text ahead of this file's

PACKAGES = ("verl", "ray", "torch", "transformers", "vllm", "sglang", "tensorrt_llm")
MIN_RAY = (2, 40)  # older Ray is incompatible with verl


def say(message: str) -> None:
    print(event_line(message), flush=True)


def connect(address: str):  # noqa: ANN201 - ray is imported lazily: `prepare` must work without it
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False, ignore_reinit_error=True)
    return ray


def alive_nodes(ray) -> list[dict]:  # noqa: ANN001
    return [n for n in ray.nodes() if n.get("Alive")]


LOST_SETTLE = 5  # seconds to wait, once a node is lost, for others lost with it (one message names them all)


def lost_nodes(ray, started: list[dict]) -> list[dict]:  # noqa: ANN001
    """The nodes of `started` that Ray now holds dead (it declares a node dead once its health checks fail)."""
    alive = {n["NodeID"] for n in alive_nodes(ray)}
    return [n for n in started if n["NodeID"] not in alive]


def node_label(node: dict) -> str:
    """How messages name a Ray node: its name (the Slurm bundle names it as Slurm does) or host, and address."""
    address = node.get("NodeManagerAddress")
    name = node.get("NodeName") if node.get("NodeName") not in (None, "", address) else node.get("NodeManagerHostname")
    return f"{name} ({address})"


def wait(address: str, nodes: int, gpus: int, timeout: int, device: str = "GPU") -> int:
    """Block until Ray has `nodes` nodes and `gpus` of Ray's resource `device` (GPU, or NPU on Ascend) (0), or
    fail (1): at the deadline, or as soon as every node the Slurm bundle started has come with too few."""
    deadline = time.monotonic() + timeout
    say(f"waiting up to {timeout}s for {nodes} nodes and {gpus} {device}s")
    ray = None
    while ray is None:
        try:
            ray = connect(address)
        except ImportError as exc:  # no waiting makes Ray appear in this Python
            say(f"ERROR: the job's Python ({sys.executable}) cannot import ray: {exc}")
            return 1
        except Exception as exc:  # the head may still be starting
            if time.monotonic() > deadline:
                say(f"ERROR: no Ray head at {address} after {timeout}s: {exc}")
                return 1
            time.sleep(1)
    seen: set[str] = set()
    per_node = gpus // max(nodes, 1)
    names = os.environ.get("VERLC_NODE_NAMES", "").split()  # the Slurm bundle's nodes: Ray's node names are Slurm's
    while True:
        alive = alive_nodes(ray)
        for n in alive:
            if n["NodeID"] not in seen:
                seen.add(n["NodeID"])
                say(node_message(node_label(n), device, n.get("Resources", {}).get(device, 0), len(seen), nodes))
        have = sum(n.get("Resources", {}).get(device, 0) for n in alive)
        if len(alive) >= nodes and have >= gpus:
            say(f"cluster ready: {len(alive)} nodes, {have:g} {device}s")
            return 0
        short = [f"{node_label(n)} has {n.get('Resources', {}).get(device, 0):g}" for n in alive
                 if n.get("Resources", {}).get(device, 0) < per_node]
        complete = bool(names) and set(names) <= {a.get("NodeName") for a in alive}
        if time.monotonic() > deadline or complete:  # a node's resources never change once it has registered
            missing = [n for n in names if n not in {a.get("NodeName") for a in alive}]
            say(f"ERROR: {'after ' + str(timeout) + 's ' if not complete else ''}the cluster has {len(alive)} of "
                f"{nodes} nodes and {have:g} of {gpus} {device}s"
                + (f"; no Ray node from {', '.join(missing)} (its Ray did not start, or cannot reach the head at "
                   f"{address})" if missing else "")
                + (f"; each node needs {per_node} {device}s: {', '.join(short)}" if short else ""))
            return 1
        time.sleep(0.5)


def prepare(out_dir: str, cmd: list[str]) -> int:
    """Run one data preparation command unless its outputs exist already."""
    outputs = [os.path.join(out_dir, name) for name in ("train.parquet", "test.parquet")]
    if all(os.path.isfile(p) for p in outputs):
        say(f"data in {out_dir} already prepared; skipping")
        return 0
    say(f"preparing data into {out_dir}: {' '.join(cmd)}")
    rc = subprocess.call(cmd)
    if rc != 0:
        say(f"ERROR: data preparation exited with {rc}")
        return rc
    missing = [p for p in outputs if not os.path.isfile(p)]
    if missing:
        say(f"ERROR: data preparation finished but did not write {', '.join(missing)}")
        return 1
    return 0


def revision_manifest(folder: str) -> dict:
    """What `materialize` wrote into `folder` ({} for a folder it did not fill)."""
    try:
        with open(os.path.join(folder, REVISION_FILE), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def revision_held(folder: str, revision: str) -> dict | None:
    """The manifest `materialize` wrote into `folder`, when the folder still holds every file of `revision`."""
    held = revision_manifest(folder)
    if revision not in (held.get("revision"), held.get("requested")):
        return None
    for rel, size in held.get("files", {}).items():
        path = os.path.join(folder, rel)
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            return None
    return held


def materialize(repo: str, revision: str, folder: str) -> int:
    """Put a hub model's revision into a folder verl can read: from the hub, or with HF_HUB_OFFLINE=1 from
    the local Hugging Face cache; skipped when the folder holds every file of it already."""
    import shutil

    held = revision_held(folder, revision)
    if held:
        say(f"model {repo} at {revision} already in {folder} ({len(held['files'])} files); skipping")
        return 0
    if os.path.exists(folder) and not os.path.isfile(os.path.join(folder, REVISION_FILE)):
        say(f"ERROR: {folder} exists and verlc did not fill it: move it away, or choose another model.local_dir")
        return 1
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        say("ERROR: a pinned model needs huggingface_hub on the head node (transformers, which verl needs, has it)")
        return 1
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    say(f"fetching model {repo} at {revision} into {folder}"
        + (" from the local Hugging Face cache (HF_HUB_OFFLINE)" if offline else ""))
    try:
        source = snapshot_download(repo_id=repo, revision=revision, local_files_only=offline)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        say(f"ERROR: cannot fetch {repo} at {revision}: {type(exc).__name__}: {lines[0] if lines else ''}")
        return 1
    partial = f"{folder}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    files = {}
    for parent, _, names in os.walk(source):
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(parent, name), source)
            real, into = os.path.realpath(os.path.join(parent, name)), os.path.join(partial, rel)
            os.makedirs(os.path.dirname(into), exist_ok=True)
            try:  # the cache's own file, without a second copy, where both are on one file system
                os.link(real, into)
            except OSError:
                shutil.copyfile(real, into)
            files[rel] = os.path.getsize(into)
    commit = os.path.basename(os.path.normpath(source))  # the cache names a snapshot by its commit
    with open(os.path.join(partial, REVISION_FILE), "w", encoding="utf-8") as fh:
        json.dump({"repo": repo, "requested": revision, "revision": commit, "files": files}, fh,
                  indent=1, sort_keys=True)
    shutil.rmtree(folder, ignore_errors=True)  # verlc's own folder of another revision, or a partial one
    os.replace(partial, folder)
    say(f"model {repo} at {commit}: {len(files)} files, {mib(sum(files.values()))} in {folder}")
    return 0


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


def paths_on_node(model: list, checkpoint_dir: list, data: list[list]) -> list[str]:
    """On one node, what its verl processes would meet: every data file, a local model folder and the checkpoint
    folder (each verl worker loads the model and writes its shard of each checkpoint), with the paths expanded
    in this node's environment as verl's ${oc.env:...} would be. A hub model is checked once, on the head."""
    problems = [f"data file {path} does not exist (cwd {os.getcwd()})" for path in map(expand, data)
                if not os.path.isfile(path)]
    folder = expand(model)
    if folder.startswith(("/", "./", "../", "~")) or os.path.isdir(os.path.expanduser(folder)):
        problems += [p for p in [check_model(folder)] if p]
    problems += [p for p in [checkpoint_problem(expand(checkpoint_dir))] if p]
    return problems


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


def code_inputs(code: dict) -> tuple[dict, list[str]]:
    """The run's code where the job runs (its working dir): each file the bundle was built with, hashed
    here; problems for one that is missing or not the same bytes."""
    files, problems = {}, []
    for name, built in sorted(code.get("files", {}).items()):
        if not os.path.isfile(name):
            files[name] = None
            problems.append(f"the run's code lacks {name} here ({os.getcwd()}): the job runs in {code['folder']}")
            continue
        files[name] = sha256_file(name)
        if files[name] != built:
            problems.append(f"{name} here is not the file the bundle was built with (sha256 {files[name][:12]}, "
                            f"built {built[:12]}): rebuild, or ship the code that was built")
    return {"commit": code.get("commit"), "dirty": code.get("dirty"), "diff_sha256": code.get("diff_sha256"),
            "files": files}, problems


def on_each_node(ray, nodes: list[dict], function, *args: object, what: str,  # noqa: ANN001
                 timeout: float = 300, hold: str | None = None) -> tuple[dict, list[str]]:
    """`function(*args)` as a zero-CPU task pinned to each node: {NodeID: its result}, and a problem naming each
    node whose task failed, that Ray declared dead meanwhile (a task pinned there may never return), or that
    did not answer within `timeout`. `hold`: a resource (GPU, NPU) the task holds all of on its node, so that it
    sees the node's accelerators as verl's workers will (Ray hides them from a task that holds none)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(function)
    pending = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                            **(holding(hold, n.get("Resources", {}).get(hold, 0)) if hold else {}))
               .remote(*args) for n in nodes]
    refs = {ref.hex(): n for ref, n in zip(pending, nodes)}
    results, problems = {}, []
    deadline, checked = time.monotonic() + timeout, time.monotonic()
    while pending and time.monotonic() < deadline:
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            node = refs[ref.hex()]
            try:
                results[node["NodeID"]] = ray.get(ref)
            except Exception as exc:  # the task itself failed there
                lines = str(exc).strip().splitlines()
                problems.append(f"{what}: node {node_label(node)}: {lines[-1] if lines else exc}")
        if pending and time.monotonic() - checked >= 2:
            checked = time.monotonic()
            dead = {n["NodeID"] for n in lost_nodes(ray, [refs[r.hex()] for r in pending])}
            for ref in [r for r in pending if refs[r.hex()]["NodeID"] in dead]:
                problems.append(f"{what}: node {node_label(refs[ref.hex()])}: Ray declared it dead (it stopped "
                                f"answering Ray's health checks; ray.node_timeout)")
                pending.remove(ref)
                ray.cancel(ref, force=True)
    for ref in pending:
        problems.append(f"{what}: node {node_label(refs[ref.hex()])} did not answer within {timeout:g}s")
        ray.cancel(ref, force=True)
    return results, problems


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


# ---- what verl's workers need when they start -----------------------------------------------------------
# The job's "startup" list (compiler/verl/workers.py reads it from the release's code): modules the workers
# import, and flash-attn 2 where a worker asks transformers for it. Checked on every node in a fresh Python,
# as verl's workers would import them: an import can take seconds and must not stay loaded in a Ray worker.
STARTUP_TIMEOUT = 300
STARTUP_PROBE = r"""
import importlib, json, sys
needs = json.loads(sys.argv[1])
devices = set()
try:
    import torch
    if torch.cuda.is_available():
        devices.add("cuda")
    if any(n["device"] == "npu" for n in needs):
        import torch_npu  # noqa: F401
        if torch.npu.is_available():
            devices.add("npu")
except Exception:
    pass
results = []
for need in needs:
    if need["device"] and need["device"] not in devices:
        results.append({"ok": None, "detail": "not checked: torch sees no " + need["device"].upper() + " here"})
        continue
    try:
        if need["check"] == "flash_attention_2":
            from transformers.utils import is_flash_attn_2_available
            try:
                ok, why = bool(is_flash_attn_2_available()), "is false"
            except Exception as exc:  # older transformers read the package's metadata unguarded
                ok, why = False, "raised " + type(exc).__name__ + ": " + str(exc)
            detail = "" if ok else ("transformers cannot use flash-attn 2 here (is_flash_attn_2_available() " + why
                                    + "): the flash-attn package is missing, or not built for this torch")
        else:
            importlib.import_module(need["module"])
            ok, detail = True, ""
    except BaseException as exc:
        ok, detail = False, (type(exc).__name__ + ": " + str(exc)).splitlines()[0][:300]
    results.append({"ok": ok, "detail": detail})
print(json.dumps(results))
"""


def startup_found(needs: list[dict]) -> dict:
    """One node's outcome of each start-up need, in the needs' order: ok true, false (with why) or null (not
    checked: the need is for a device this node's torch does not see)."""
    host = platform.node()
    try:
        done = subprocess.run([sys.executable, "-c", STARTUP_PROBE, json.dumps(needs)], capture_output=True,
                              text=True, timeout=STARTUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"host": host, "error": f"the check did not finish within {STARTUP_TIMEOUT}s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"host": host, "error": f"the check exited with code {done.returncode}: {last}"}
    return {"host": host, "results": json.loads(lines[-1])}


def startup_problems(found: dict, needs: list[dict]) -> list[str]:
    """A problem for each need a node lacks, naming the node, the package, and the verl file and line."""
    problems = []
    for node, info in sorted(found.items()):
        where = f"node {info['host']} ({node[:8]})"
        if "error" in info:
            problems.append(f"{where}: the start-up check failed: {info['error']}")
            continue
        for need, result in zip(needs, info["results"]):
            if result["ok"] is False:
                avoid = f"; {need['avoid']}" if need["avoid"] else ""
                problems.append(f"{where}: {need['module']}: {result['detail']}; {need['why']} ({need['where']})"
                                f"{avoid}")
    return problems


def startup_record(found: dict, needs: list[dict] | None) -> dict:
    """What the run record keeps: each need and what every node showed, or why nothing was checked."""
    if needs is None:
        return {"unknown": "verlc has no start-up facts for this release's workers (verl 0.8 on: engine workers)"}
    return {"needs": [{**need, "nodes": {info["host"]: info.get("results", [{}] * len(needs))[i]
                                         for info in found.values()}} for i, need in enumerate(needs)]}


# ---- what a run used: its inputs, hashed, and the config verl resolves --------------------------------
# The files that decide what a model folder is, besides its weights (hashed too large to hash every run).
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "tokenizer.model", "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json",
               "chat_template.jinja")
REVISION_FILE = ".verlc-revision.json"  # written by `materialize` into the folder it fills


def sha256_file(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 * 1024**2), b""):
            digest.update(block)
    return digest.hexdigest()


def parquet_rows(path: str) -> int | None:
    """Rows of a parquet file; None without pyarrow or for a file pyarrow cannot read (the columns check
    names that)."""
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return None


def data_inputs(paths: list[str]) -> list[dict]:
    """Every data file as it is now: size, sha256 (every run: no cache to miss a same-size edit), rows."""
    return [{"path": p, "bytes": os.path.getsize(p), "sha256": sha256_file(p), "rows": parquet_rows(p)}
            for p in paths if os.path.isfile(p)]


def model_input(model: str) -> dict:
    """The model verl gets: a folder's config and tokenizer files hashed, and the hub revision it holds when
    `materialize` filled it; a hub id as it is (resolved by the hub when training starts)."""
    folder = os.path.expanduser(model)
    if not os.path.isdir(folder):
        return {"path": model, "revision": None, "files": {}}
    return {"path": model, "revision": revision_manifest(folder).get("revision"),
            "files": {name: sha256_file(os.path.join(folder, name)) for name in MODEL_FILES
                      if os.path.isfile(os.path.join(folder, name))}}


MERGED_MARK = "config.json"  # a merged model's folder is complete once the merger wrote it (its last step)


def stage_input(entry: dict) -> tuple[dict | None, str | None]:
    """An earlier stage's last checkpoint (verl's latest_checkpointed_iteration.txt in its folder) and where its
    merged model goes; or why there is none."""
    folder = expand(entry["checkpoint_dir"])
    step = saved_step(folder)
    if step is None:
        return None, (f"stage {entry['stage']} left no checkpoint in {folder} (no latest_checkpointed_iteration.txt, "
                      f"cwd {os.getcwd()}): it saves one every trainer.save_freq steps and at its last step")
    checkpoint = os.path.join(folder, f"global_step_{step}", *([entry["layout"]] if entry["layout"] else []))
    merged = expand(entry["merged"])
    return {"stage": entry["stage"], "step": step, "checkpoint": checkpoint,
            "model": os.path.join(merged, f"global_step_{step}"), "latest": expand(entry["latest"])}, None


def merge_inputs(inputs: list[dict]) -> int:
    """Each earlier stage's last checkpoint merged into a Hugging Face folder with verl's own merger (unless
    that step is merged already), into a temporary folder first, so that a merge that fails leaves nothing a
    later run would take for a model; then `latest` points at it."""
    for entry in inputs:
        found, problem = stage_input(entry)
        if found is None:
            say(f"ERROR: {problem}")
            return 1
        stage, model = found["stage"], found["model"]
        if os.path.isfile(os.path.join(model, MERGED_MARK)):
            say(f"stage {stage}'s step {found['step']} is merged already: {model}")
        elif not os.path.isdir(found["checkpoint"]):
            say(f"ERROR: stage {stage}'s checkpoint {found['checkpoint']} does not exist (its tracker names step "
                f"{found['step']})")
            return 1
        else:
            partial = f"{model}.partial-{os.getpid()}"
            cmd = [*entry["merger"], "--local_dir", found["checkpoint"], "--target_dir", partial]
            say(f"merging stage {stage}'s checkpoint (step {found['step']}) into a Hugging Face folder: "
                + " ".join(cmd))
            rc = subprocess.call(cmd)
            if rc != 0 or not os.path.isfile(os.path.join(partial, MERGED_MARK)):
                shutil.rmtree(partial, ignore_errors=True)
                say(f"ERROR: verl's model merger exited with {rc}" + ("" if rc else f" without writing {MERGED_MARK}"))
                return rc or 1
            shutil.rmtree(model, ignore_errors=True)  # an earlier merge that did not finish
            os.replace(partial, model)
        link = f"{found['latest']}.{os.getpid()}"
        os.symlink(os.path.basename(model), link)
        os.replace(link, found["latest"])
        say(f"stage {stage}'s model: {found['latest']} -> {os.path.basename(model)}")
    return 0


def stage_records(inputs: list[dict]) -> tuple[list[dict], list[str]]:
    """What the run record keeps of each earlier stage's model: its step, and every file's sha256 (so a
    re-run shows it started from the same model); and the problems of a model that is not there."""
    records, problems = [], []
    for entry in inputs:
        found, problem = stage_input(entry)
        if found is None:
            problems.append(problem)
            continue
        model = found["model"]
        files = {os.path.relpath(os.path.join(root, name), model): sha256_file(os.path.join(root, name))
                 for root, _, names in os.walk(model) for name in names} if os.path.isdir(model) else {}
        if MERGED_MARK not in files:
            problems.append(f"stage {found['stage']}'s merged model {model} is missing (the data stage merges it)")
        records.append({**found, "files": dict(sorted(files.items()))})
    return records, problems


def resolved_verl_config(train: list[str]) -> dict:
    """verl's config as its trainer composes it from `train` (Hydra, with this node's verl), resolved;
    {"unresolved": why} when this node cannot compose it."""
    try:
        module = train[train.index("-m") + 1]
    except (ValueError, IndexError):
        return {"unresolved": "no `python3 -m MODULE` in the trainer argv"}
    rest = train[train.index("-m") + 2:]
    name = next((a.split("=", 1)[1] for a in rest if a.startswith("--config-name=")), "ppo_trainer")
    overrides = [a for a in rest if not a.startswith("-")]
    try:
        import importlib.util

        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        spec = importlib.util.find_spec(module.rsplit(".", 1)[0])
        folder = os.path.join(list(spec.submodule_search_locations)[0], "config")
        with initialize_config_dir(config_dir=folder, version_base=None):
            config = compose(config_name=name, overrides=overrides)
        return OmegaConf.to_container(config, resolve=True)
    except Exception as exc:  # no hydra here, an older layout, a value that only resolves at training
        return {"unresolved": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}


def flat(tree: object, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        out: dict[str, object] = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    return {prefix: tree}


# What two run records are compared by: group -> item -> value. A reproducible re-run must match its first
# run in every group but resources (the nodes a scheduler gives may change).
GROUPS = ("inputs", "versions", "verl config", "resources")


def record_items(record: dict) -> dict[str, dict[str, object]]:
    inputs: dict[str, object] = {}
    code = record.get("inputs", {}).get("code") or {}
    if code:
        inputs.update({"code commit": code.get("commit"), "code uncommitted diff sha256": code.get("diff_sha256")})
        inputs.update({f"code {name} sha256": h for name, h in sorted(code.get("files", {}).items())})
    for f in record.get("inputs", {}).get("data", []):
        inputs.update({f"data {f['path']} sha256": f["sha256"], f"data {f['path']} rows": f["rows"],
                       f"data {f['path']} bytes": f["bytes"]})
    model = record.get("inputs", {}).get("model") or {}
    if model:
        inputs.update({"model path": model.get("path"), "model revision": model.get("revision")})
        inputs.update({f"model {name} sha256": h for name, h in sorted(model.get("files", {}).items())})
    for stage in record.get("inputs", {}).get("stages", []):  # an earlier stage's model: its step and every file
        inputs.update({f"stage {stage['stage']} step": stage.get("step")})
        inputs.update({f"stage {stage['stage']} model {name} sha256": h for name, h in
                       sorted(stage.get("files", {}).items())})
    nodes = record.get("nodes", [])
    versions = {"image": record.get("image"), "python": nodes[0].get("python") if nodes else None,
                **record.get("versions", {})}
    argv = record.get("trainer_argv") or []
    # from the program's launcher on (older records had `env RAY_ADDRESS=<this job's port>` before it)
    start = next((i for i, a in enumerate(argv) if a in ("python3", "torchrun")), 0)
    verl = {"trainer argv": " ".join(argv[start:]),
            **{f"verl {k}": v for k, v in flat(record.get("verl_config") or {}).items()}}
    resources = {"nodes": len(nodes), "GPUs": record.get("gpus"),
                 **{f"node {i} host": n.get("host") for i, n in enumerate(nodes)},
                 **{f"node {i} CPUs": n.get("cpus") for i, n in enumerate(nodes)}}
    return dict(zip(GROUPS, (inputs, versions, verl, resources)))


def record_differences(old: dict, new: dict, groups: tuple[str, ...] = GROUPS) -> dict[str, list[tuple]]:
    """group -> [(item, old value, new value)] for every item that differs (missing on one side: None)."""
    a, b = record_items(old), record_items(new)
    out = {}
    for group in groups:
        keys = sorted(set(a[group]) | set(b[group]))
        changed = [(k, a[group].get(k), b[group].get(k)) for k in keys if a[group].get(k) != b[group].get(k)]
        if changed:
            out[group] = changed
    return out


def reference_problems(record: dict, path: str) -> list[str]:
    """A reproducible job's re-run must see the inputs, versions and verl config its first run saw."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        first = json.load(fh)
    # A first run recorded by an older verlc lacks what it did not record yet: not comparable, said so.
    unknown = [group for group, keys in (("inputs", ("inputs",)), ("verl config", ("verl_config", "trainer_argv")))
               if not all(k in first for k in keys)]
    for group in unknown:
        say(f"the first run's record ({path}) has no {group} (an older verlc wrote it): {group} not compared")
    return [f"{group}: {item}: {new if new is not None else 'none'}, but the first run ({path}) had "
            f"{old if old is not None else 'none'}"
            for group, changes in record_differences(first, record, tuple(g for g in GROUPS[:3] if g not in unknown)
                                                     ).items()
            for item, old, new in changes]


def expand(word: list) -> str:
    """A path from job.json: text parts as they are, {"env": NAME} as this node's NAME."""
    return "".join(p if isinstance(p, str) else os.environ.get(p["env"], "") for p in word)


def environment_of(names: list[str]) -> dict:
    return {"host": platform.node(), "missing": [n for n in names if not os.environ.get(n)]}


def missing_env_per_node(ray, nodes: list[dict], names: list[str]) -> list[str]:  # noqa: ANN001
    """The env vars the spec reads on the nodes that a node lacks (unset or empty), and the nodes that could
    not say."""
    seen, problems = on_each_node(ray, nodes, environment_of, names, what="environment")
    return problems + [f"node {s['host']}: environment variable {n} is not set (the spec reads ${{env:{n}}})"
                       for s in seen.values() for n in s["missing"]]


# ---- the collective smoke test: one all-reduce over every GPU of every node -------------------------
# Rendezvous in a TCP store this process (on the head) serves: each node says how many ranks it has, gets
# its first rank and the world size, and each rank marks its progress, so a node that never arrives or
# fails is named, and the first failure ends the test instead of a timeout on every rank.
COLLECTIVE_TIMEOUT = 120  # seconds; NCCL's own set-up on many nodes takes tens of them

# One rank, as a process of its own (NCCL wants a process per GPU). It dies with its node task.
RANK_PROGRAM = """
import ctypes, signal, sys
from datetime import timedelta
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
import torch
import torch.distributed as dist
host, port, rank, world, local, timeout = sys.argv[1:7]
rank, world, timeout = int(rank), int(world), timedelta(seconds=float(timeout))
try:
    import torch_npu  # noqa: F401  (Ascend: torch.npu and the hccl backend)
    npu = torch.npu.is_available()
except ImportError:
    npu = False
cuda = not npu and torch.cuda.is_available()
device, backend = ("npu", "hccl") if npu else ("cuda", "nccl") if cuda else ("cpu", "gloo")
if device != "cpu":
    getattr(torch, device).set_device(int(local))
store = dist.TCPStore(host, int(port), is_master=False, timeout=timeout)
store.set(f"joined/{rank}", "1")
dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world, timeout=timeout)
x = torch.ones(256 * 1024, device=device)  # 1 MiB
dist.all_reduce(x)
got = x[0].item()
dist.destroy_process_group()
store.set(f"done/{rank}", str(got))
sys.exit(0 if got == world else 3)
"""


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


def allreduce_node(host: str, port: int, index: int, timeout: float) -> dict:
    """A node's part of the all-reduce (a Ray task holding every GPU or NPU of the node): a rank per device,
    or one gloo rank where torch sees none."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    # the plan comes once every node has arrived: as late as the head waits for the slowest (STARTUP_TIMEOUT)
    store = TCPStore(host, port, is_master=False, timeout=timedelta(seconds=STARTUP_TIMEOUT + timeout))
    count, backend = local_devices()
    ranks = count or 1
    store.set(f"ranks/{index}", str(ranks))
    first, world = map(int, store.get(f"plan/{index}").decode().split())
    procs = [subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, host, str(port), str(first + local), str(world),
                               str(local), str(timeout)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for local in range(ranks)]
    failed = []
    for local, proc in enumerate(procs):
        _, err = proc.communicate()
        if proc.returncode:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            failed.append(f"rank {first + local} exited {proc.returncode}: {lines[-1] if lines else 'no output'}")
    return {"host": platform.node(), "ranks": ranks, "backend": backend, "failed": failed}


def holding(device: str, count: float) -> dict:
    """A Ray task's options that hold `count` of resource `device` (Ray takes GPUs as num_gpus only)."""
    if device == "GPU":
        return {"num_gpus": count}
    return {"resources": {device: count}} if count else {}


def collective_problems(ray, nodes: list[dict], timeout: float = COLLECTIVE_TIMEOUT,  # noqa: ANN001
                        device: str = "GPU") -> tuple[list[str], str]:
    """Problems of an all-reduce across every GPU (NPU) of every node, each naming its node; and a summary."""
    from datetime import timedelta

    try:
        from torch.distributed import TCPStore
    except ImportError:
        return ["all-reduce: torch is not installed here (verl needs it)"], ""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    host = ray.util.get_node_ip_address()
    store = TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    names = [node_label(n) for n in nodes]
    task = ray.remote(allreduce_node)
    refs = [task.options(
        num_cpus=0, **holding(device, n.get("Resources", {}).get(device, 0)), max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
    ).remote(host, store.port, i, timeout) for i, n in enumerate(nodes)]
    which = {ref.hex(): i for i, ref in enumerate(refs)}
    # Reaching the rendezvous takes a fresh Ray worker that imports torch, as long as the start-up check's
    # probe may take on a loaded node; the all-reduce itself then has `timeout`.
    arrival = STARTUP_TIMEOUT
    deadline, problems, planned, ranks = time.monotonic() + arrival, [], False, []

    def node_of(rank: int) -> str:
        return names[next(i for i in range(len(nodes)) if rank < sum(ranks[:i + 1]))]

    pending = list(refs)
    checked = time.monotonic()
    while pending and not problems and time.monotonic() < deadline:
        if time.monotonic() - checked >= 2:  # a task on a node Ray declared dead may never return: look
            checked = time.monotonic()
            problems += [f"all-reduce: node {node_label(n)}: Ray declared it dead (it stopped answering Ray's "
                         f"health checks; ray.node_timeout)" for n in lost_nodes(ray, nodes)]
        if not planned and store.check([f"ranks/{i}" for i in range(len(nodes))]):
            ranks = [int(store.get(f"ranks/{i}")) for i in range(len(nodes))]
            for i in range(len(nodes)):
                store.set(f"plan/{i}", f"{sum(ranks[:i])} {sum(ranks)}")
            planned, deadline = True, time.monotonic() + timeout
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            try:
                result = ray.get(ref)
            except Exception as exc:  # the task itself failed: torch missing, store unreachable, ...
                lines = str(exc).strip().splitlines()
                problems.append(f"all-reduce: node {names[which[ref.hex()]]}: {lines[-1] if lines else exc}")
                continue
            problems += [f"all-reduce: node {names[which[ref.hex()]]}: {f}" for f in result["failed"]]
    if pending and not problems:
        if not planned:
            missing = [names[i] for i in range(len(nodes)) if not store.check([f"ranks/{i}"])]
            problems.append(f"all-reduce: node(s) {', '.join(missing)} did not reach the rendezvous at "
                            f"{host}:{store.port} within {arrival:g}s")
        else:
            stuck = sorted({node_of(r) for r in range(sum(ranks)) if not store.check([f"joined/{r}"])}
                           or {node_of(r) for r in range(sum(ranks)) if not store.check([f"done/{r}"])})
            problems.append(f"all-reduce: did not finish within {timeout:g}s; waiting for node(s) {', '.join(stuck)}")
    for ref in pending:
        ray.cancel(ref, force=True)
    summary = f"all-reduce over {sum(ranks)} ranks on {len(nodes)} nodes" if ranks else ""
    return problems, summary


def preflight(*, address: str, nodes: int, gpus: int, model: str, checkpoint_dir: str, data: list[str],
              columns: list[str], pins: list[str], rollout_package: str | None, record: str | None,
              image: str | None,
              require_env: list[str], reference: str | None, train: list[str], verl_commit: str | None = None,
              code: dict | None = None, device: str = "GPU", startup: list[dict] | None = None,
              paths: dict | None = None, inputs: list[dict] | None = None) -> int:
    """Check the cluster, every node's packages (and NPUs), an all-reduce over every GPU (NPU), the data files,
    the model and the checkpoint folder (here, and on every other node from `paths`: the job's words, expanded
    on each node); write the run record (and a reproducible job's first-run record). 0: passed."""
    started = stamp()
    problems: list[str] = []
    ray = connect(address)
    expected_nodes, expected_gpus = nodes, gpus
    nodes = alive_nodes(ray)
    gpus = sum(n.get("Resources", {}).get(device, 0) for n in nodes)
    if len(nodes) != expected_nodes:
        problems.append(f"Ray has {len(nodes)} nodes, the spec asks for {expected_nodes}")
    if gpus != expected_gpus:
        problems.append(f"Ray has {gpus:g} {device}s, the spec asks for {expected_gpus}")
    pinned = dict(p.split("=", 1) for p in pins)
    seen, unanswered = versions_per_node(ray, nodes, device)
    problems += unanswered + version_problems(seen, pinned, rollout_package)
    if device == "NPU":
        problems += npu_problems(seen, [n for n in nodes if n["NodeID"] in seen])
    started_found: dict = {}
    if startup:
        started_found, unanswered = on_each_node(ray, nodes, startup_found, startup, what="start-up needs",
                                                 timeout=STARTUP_TIMEOUT + 30, hold=device)
        problems += unanswered + startup_problems(started_found, startup)
    if verl_commit:
        problems += verl_commit_problems(seen, verl_commit)
    code_record, code_problems = code_inputs(code) if code else (None, [])
    problems += code_problems
    stages_record, stage_problems = stage_records(inputs) if inputs else (None, [])
    problems += stage_problems
    if require_env:
        problems += missing_env_per_node(ray, nodes, require_env)
    if not columns:
        say("data columns: not checked (the program reads the columns its own config names)")
    for path in data:
        if not os.path.isfile(path):
            problems.append(f"data file {path} does not exist (cwd {os.getcwd()})")
            continue
        found = parquet_columns(path) if columns else None
        if found is not None:
            missing = [c for c in columns if c not in found]
            if missing:
                problems.append(f"data file {path} lacks verl's columns {', '.join(missing)}")
    collective, collective_summary = collective_problems(ray, nodes, device=device) if not problems else ([], "")
    problems += collective
    problem = check_model(model) if model else None  # verl's evaluation takes no model
    if problem:
        problems.append(problem)
    problem = checkpoint_problem(checkpoint_dir)
    if problem:
        problems.append(problem)
    if paths:  # the same on every other node: a folder only the head sees fails verl's workers elsewhere
        here = ray.get_runtime_context().get_node_id()
        others = [n for n in nodes if n["NodeID"] != here]
        found, unanswered = on_each_node(ray, others, paths_on_node, paths["model"], paths["checkpoint_dir"],
                                         paths["data"], what="paths") if others else ({}, [])
        problems += unanswered + [f"node {node_label(n)}: {p}" for n in others for p in found.get(n["NodeID"], [])]
    run_record = {
        "started": started,
        "image": image,
        "inputs": {"data": data_inputs(data), **({"model": model_input(model)} if model else {}),
                   **({"code": code_record} if code_record else {}),
                   **({"stages": stages_record} if stages_record is not None else {})},
        "trainer_argv": train,
        "verl_config": resolved_verl_config(train),
        "nodes": [{"host": n.get("NodeManagerHostname"), "address": n.get("NodeManagerAddress"),
                   "gpus": n.get("Resources", {}).get(device, 0), "cpus": n.get("Resources", {}).get("CPU", 0),
                   **seen.get(n["NodeID"], {})} for n in nodes],
        "gpus": gpus,
        "versions": next(iter(seen.values()), {}).get("packages", {}),
        "pins": pinned,
        "startup": startup_record(started_found, startup),
        "problems": problems,
    }
    changes = reference_problems(run_record, reference) if reference else []
    if changes and os.environ.get("VERLC_ACCEPT_CHANGES") == "1":
        run_record["accepted_changes"] = changes
        for change in changes:
            say(f"accepted change (VERLC_ACCEPT_CHANGES=1): {change}")
    else:
        problems += changes
    text = json.dumps(run_record, indent=1, sort_keys=True)
    shown = {k: v for k, v in run_record.items() if k != "verl_config"}
    say("run record: " + json.dumps(shown, sort_keys=True))
    unresolved = run_record["verl_config"].get("unresolved")
    say(f"verl config: not resolved here ({unresolved})" if unresolved
        else f"verl config: {len(flat(run_record['verl_config']))} settings, as verl resolves them (in the record)")
    if record:
        os.makedirs(os.path.dirname(os.path.abspath(record)), exist_ok=True)
        with open(record, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    for p in problems:
        say(f"PREFLIGHT FAILED: {p}")
    if problems:
        return 1
    if reference and (not os.path.exists(reference) or run_record.get("accepted_changes")):
        first = not os.path.exists(reference)
        os.makedirs(os.path.dirname(os.path.abspath(reference)), exist_ok=True)
        with open(reference + ".tmp", "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        os.replace(reference + ".tmp", reference)
        say(f"first run of a reproducible job: its record is now {reference}" if first
            else f"the accepted changes are in this run's record; later re-runs compare with it ({reference})")
    say(f"preflight passed: {len(nodes)} nodes, {gpus:g} {device}s, {len(data)} data files, "
        f"model {model}, {collective_summary}")
    return 0




RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # Ray's: the job-level runtime env its driver's ray.init() merges


def with_deadline(env: dict, expiry: dict | None) -> dict:
    """The trainer's environment with verl's deadline (expiry["variable"], epoch seconds): the job's end as the
    target last saw it (in the file expiry["end_file"], or the variable expiry["end_env"]) less the lead the
    target needs to stop cleanly. verl's trainer reads it in its own Ray actor, so it goes into the job's
    runtime env as well (Ray merges that with the one verl's ray.init() passes), which every actor and worker of
    the job gets; read at each start (a requeue too)."""
    if not expiry:
        return env
    try:
        if expiry.get("end_env"):
            end = int(env[expiry["end_env"]])
        else:
            with open(expand(expiry["end_file"]), encoding="utf-8") as fh:
                end = int(fh.read().strip())
    except (KeyError, OSError, ValueError):
        say("the job's end time is not known here: verl saves checkpoints at trainer.save_freq only")
        return env
    deadline, name = end - expiry["lead"], expiry["variable"]
    shown = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
    say(f"{name}={deadline}: verl saves a checkpoint once a step and a save no longer fit before {shown} (the "
        f"job's end, less {expiry['lead']}s to stop cleanly)")
    job = json.loads(env.get(RAY_JOB_CONFIG) or "{}")
    runtime_env = job.get("runtime_env") or {}
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), name: str(deadline)}
    job["runtime_env"] = runtime_env
    return {**env, name: str(deadline), RAY_JOB_CONFIG: json.dumps(job)}


def saved_step(checkpoint_dir: str) -> int | None:
    """The step of verl's latest checkpoint in the folder (its latest_checkpointed_iteration.txt), or None."""
    try:
        with open(os.path.join(checkpoint_dir, "latest_checkpointed_iteration.txt"), encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def repeats_last_attempt(checkpoint_dir: str, run_folder: str) -> str | None:
    """Why this attempt of a requeued job must not train, or None. Each attempt notes in the run folder the step
    of the latest checkpoint when its training began (train-start.json); the Slurm script notes an attempt
    stopped at the time limit (time-limit-reached). If the last attempt reached the limit and saved no newer
    checkpoint, this one would repeat the same steps and reach the limit again, requeue after requeue."""
    attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    starts_file = os.path.join(run_folder, TRAIN_STARTS)
    try:
        with open(starts_file, encoding="utf-8") as fh:
            starts = json.load(fh)
    except (OSError, ValueError):
        starts = {}
    try:
        with open(os.path.join(run_folder, TIME_LIMIT_REACHED), encoding="utf-8") as fh:
            at_limit = int(fh.read().strip())
    except (OSError, ValueError):
        at_limit = None
    now = saved_step(checkpoint_dir)
    last = str(attempt - 1)
    if attempt and at_limit == attempt - 1 and last in starts and starts[last] == now:
        since = f"step {now}" if now is not None else "none at all"
        return (f"the last attempt of this job ran to its time limit and saved no new checkpoint (the latest is "
                f"{since}, as when it began): training again would repeat the same steps and be stopped at the "
                f"limit again; not training. Raise cluster.slurm.time or lower trainer.save_freq")
    starts[str(attempt)] = now
    with open(starts_file + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(starts, fh)
    os.replace(starts_file + ".tmp", starts_file)
    return None


# ---- torchrun on every node ---------------------------------------------------------------------------------
# A program that sets up torch.distributed itself (verl's SFT trainer) on more than one node: the runtime runs
# rank 0's torchrun on its own node, as on one node, and each other node's as a Ray task pinned there (the nodes'
# Ray is up for the preflight anyway), all joining torchrun's static rendezvous at this node.
OTHERS_GRACE = 120  # seconds the other nodes' torchrun may take to end once rank 0's has ended well
TAIL_LINES = 40  # of a node's output, shown when its torchrun fails


def torchrun_argv(argv: list[str], rank: int, host: str, port: int) -> list[str]:
    """Node `rank`'s torchrun of a launch on every node: torchrun's static rendezvous, hosted by rank 0."""
    return [argv[0], f"--node_rank={rank}", f"--master_addr={host}", f"--master_port={port}", *argv[1:]]


def free_port() -> int:
    """A TCP port nothing listens on here now, for rank 0's torchrun to host the rendezvous on."""
    import socket

    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def torchrun_node(argv: list[str], env: dict, cwd: str) -> dict:
    """One other node's torchrun (a Ray task holding the node's GPUs): its exit code and last lines of output.
    No trainer outlives the task: its process group gets TERM when the task ends or is cancelled, and torchrun
    itself TERM when the task's process dies (the parent-death signal)."""
    import collections
    import ctypes
    import threading

    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=lambda: prctl(1, signal.SIGTERM))  # 1: PR_SET_PDEATHSIG
    tail: collections.deque = collections.deque(maxlen=TAIL_LINES)
    reader = threading.Thread(target=lambda: tail.extend(raw.decode(errors="replace").rstrip("\n")
                                                         for raw in proc.stdout), daemon=True)
    reader.start()
    try:
        while proc.poll() is None:  # a sleep, not a blocking read: a cancellation interrupts it
            time.sleep(0.5)
        reader.join(5)
        return {"code": proc.returncode, "tail": list(tail)}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


class OtherNodes:
    """The other nodes' torchrun of a launch on every node, as Ray tasks, for rank 0's runtime to watch."""

    def __init__(self, ray, nodes: list[dict], argv_of, env: dict, device: str) -> None:  # noqa: ANN001
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray = ray
        task = ray.remote(num_cpus=0, max_retries=0)(torchrun_node)
        self.refs = {}
        for rank, node in enumerate(nodes, 1):
            ref = task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                               **holding(device, node.get("Resources", {}).get(device, 0))
                               ).remote(argv_of(rank), env, os.getcwd())
            self.refs[ref.hex()] = (ref, rank, node)
        self.pending = [ref for ref, _, _ in self.refs.values()]

    def _ended(self, ref) -> str | None:  # noqa: ANN001
        """Why the torchrun of `ref`'s node failed (its last lines printed first), or None where it exited 0."""
        _, rank, node = self.refs[ref.hex()]
        where = f"torchrun on node {node_label(node)} (node rank {rank})"
        try:
            result = self.ray.get(ref)
        except Exception as exc:  # the task itself failed: torchrun missing, the node's Ray gone, ...
            lines = str(exc).strip().splitlines()
            return f"{where} failed: {lines[-1] if lines else exc}"
        if result["code"] == 0:
            say(f"{where} exited with code 0")
            return None
        for line in result["tail"]:
            print(f"[{node_label(node)}] {line}", flush=True)
        return f"{where} exited with code {result['code']} (its last lines are above)"

    def failed(self) -> str | None:
        """Why a node's torchrun has failed so far, or None."""
        done, self.pending = self.ray.wait(self.pending, num_returns=len(self.pending), timeout=0)
        problems = [p for p in map(self._ended, done) if p]
        return "; ".join(problems) or None

    def finish(self, grace: float) -> str | None:
        """Once rank 0's torchrun ended well: wait up to `grace` for the others, and say why any did not."""
        done, self.pending = self.ray.wait(self.pending, num_returns=len(self.pending), timeout=grace)
        problems = [p for p in map(self._ended, done) if p]
        problems += [f"torchrun on node {node_label(self.refs[r.hex()][2])} had not ended {grace:g}s after rank "
                     f"0's" for r in self.pending]
        self.stop()
        return "; ".join(problems) or None

    def stop(self, within: float = 30) -> None:
        """Cancel the torchrun of every node still running, and wait up to `within` s for Ray to end those
        tasks (each task's end stops its trainer): cancelling only asks."""
        for ref in self.pending:
            try:
                self.ray.cancel(ref, force=True)
            except Exception:  # already ended
                pass
        if self.pending and within:
            self.ray.wait(self.pending, num_returns=len(self.pending), timeout=within)
        self.pending = []


def every_node(ray, nodes: int, device: str) -> tuple[dict, list[dict]] | str:  # noqa: ANN001
    """Where a launch on every node runs: this node (rank 0, where the runtime runs) and the other nodes in
    rank order; or why it cannot run."""
    here = ray.get_runtime_context().get_node_id()
    alive = [n for n in alive_nodes(ray) if n.get("Resources", {}).get(device)]
    own = next((n for n in alive if n["NodeID"] == here), None)
    if own is None:
        return f"the node verlc's runtime runs on, where torchrun's rank 0 must run, has no {device}s in Ray"
    others = sorted((n for n in alive if n["NodeID"] != here), key=lambda n: (n.get("NodeName") or "",
                                                                                 n["NodeManagerAddress"]))
    if len(others) < nodes - 1:
        return f"torchrun needs {nodes} nodes with {device}s; Ray has {len(others) + 1}"
    return own, others[:nodes - 1]


def train(argv: list[str], env: dict, stall_timeout: int | None, address: str | None = None, nodes: int = 1,
          device: str = "GPU") -> int:
    """Run verl's trainer. With a stall timeout, end it when its output shows no new step for that long (124);
    with a Ray address, end it when Ray declares one of its nodes dead (NODE_LOST): verl would otherwise wait
    on the dead node's workers, in a collective that never returns. With `nodes` (a torchrun launch on every
    node): rank 0 here, the others as Ray tasks (OtherNodes); one node's failure stops them all, named."""
    import threading

    ray = started = None
    if address:
        try:
            ray = connect(address)
            started = alive_nodes(ray)
        except Exception as exc:  # the cluster was checked just before: say so, but train anyway
            if nodes > 1:
                say(f"ERROR: cannot reach Ray to start torchrun on the other nodes: {exc}")
                return 1
            say(f"cannot watch Ray's nodes during training: {exc}")
    others = None
    if nodes > 1 and ray is not None:
        placed = every_node(ray, nodes, device)
        if isinstance(placed, str):
            say(f"ERROR: {placed}")
            return 1
        own, rest = placed
        host, port = own["NodeManagerAddress"], free_port()
        say(f"torchrun on {nodes} nodes, rendezvous at {host}:{port}: node rank 0 {node_label(own)} (here), "
            + ", ".join(f"{rank} {node_label(n)}" for rank, n in enumerate(rest, 1)))
        added = {k: v for k, v in env.items() if os.environ.get(k) != v}  # each node's Ray has the job's env
        others = OtherNodes(ray, rest, lambda rank: torchrun_argv(argv, rank, host, port), added, device)
        argv = torchrun_argv(argv, 0, host, port)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE if stall_timeout else None,
                            stderr=subprocess.STDOUT if stall_timeout else None, start_new_session=True)
    last = [time.monotonic()]

    def stop(signum: int, _frame: object) -> None:  # the trainer has a session of its own: pass the signal on
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass
        if others:  # the job is ending (scancel, a time limit): every node's Ray is being stopped too
            others.stop(within=0)
        sys.exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)

    def relay() -> None:
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            sys.stdout.write(line)
            sys.stdout.flush()
            if STEP_LINE.search(line):
                last[0] = time.monotonic()

    reader = threading.Thread(target=relay, daemon=True)
    if stall_timeout:
        reader.start()

    def end(code: int) -> int:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        if others:
            others.stop()
        if stall_timeout:
            reader.join(5)
        return code

    checked = time.monotonic()
    while proc.poll() is None:
        if stall_timeout and time.monotonic() - last[0] > stall_timeout:
            say(f"ERROR: no new training step for {stall_timeout}s (stall_timeout): stopping the run")
            return end(124)
        failed = others.failed() if others else None
        if failed:
            say(f"ERROR: {failed}: stopping the run")
            return end(1)
        if started and time.monotonic() - checked >= 2:
            checked = time.monotonic()
            try:
                lost = lost_nodes(ray, started)
            except Exception:  # a slow answer from the GCS is not a lost node
                lost = []
            if lost:  # nodes cut off together are declared dead within a few health-check periods of each other
                settle = time.monotonic() + LOST_SETTLE
                while time.monotonic() < settle and len(lost) < len(started) - 1:
                    time.sleep(0.5)
                    try:
                        lost = lost_nodes(ray, started) or lost
                    except Exception:
                        pass
                names = ", ".join(node_label(n) for n in lost)
                whole = len(started) > 2 and len(lost) == len(started) - 1
                say(f"ERROR: Ray declared node(s) {names} dead during training (they stopped answering its health "
                    f"checks; ray.node_timeout): stopping the run" + (
                        "; every other node at once: this head node may have lost its network" if whole else ""))
                return end(NODE_LOST)
        time.sleep(1)
    if stall_timeout:
        reader.join(5)
    if others and proc.returncode == 0:
        failed = others.finish(OTHERS_GRACE)
        if failed:
            say(f"ERROR: {failed}")
            return 1
    elif others:
        others.stop()
    return proc.returncode


def pause_at(point: str) -> None:
    """A debugging aid (and the tests' hook for cancellation): wait here, until signalled, when VERLC_PAUSE_AT
    names this point (a stage's start)."""
    if os.environ.get(PAUSE_AT) == point:
        say(f"paused at {point} ({PAUSE_AT})")
        while True:
            time.sleep(1)


def load_job(variant: str | None) -> Job:
    """The job.json next to this module (jobs/VARIANT.json for a sweep's variant): how the bundles that ship
    the runtime as the package verlc_job give it its job."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "jobs", f"{int(variant)}.json") if variant else os.path.join(here, "job.json")
    with open(path, encoding="utf-8") as fh:
        return Job.from_json(fh.read())


def load_stages() -> list[tuple[str, Job]]:
    """A pipeline's jobs next to this module (stages/<NN>-<stage>.json), in the order they run."""
    folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), PIPELINE_JOBS)
    found = []
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            found.append((name.removesuffix(".json").partition("-")[2], Job.from_json(fh.read())))
    return found


def pipeline(stages: list[tuple[str, Job]]) -> int:
    """A pipeline's stages in one job (the targets that do not chain jobs): each stage's job in turn; the first
    that fails stops the pipeline, named."""
    for index, (name, spec) in enumerate(stages):
        say(f"pipeline stage {index + 1}/{len(stages)}: {name} ({spec.name})")
        rc = job(spec)
        if rc != 0:
            left = [n for n, _ in stages[index + 1:]]
            say(f"ERROR: stage {name} exited with code {rc}; the pipeline stops"
                + (f" ({', '.join(left)} not run)" if left else ""))
            return rc
    say(f"pipeline done: {', '.join(n for n, _ in stages)}")
    return 0


def job(spec: Job, begun: str | None = None) -> int:
    """The one stage runner of every bundle: wait for the cluster, data, preflight, train, stopping after the
    stage VERLC_STOP_AFTER names. `begun`: the stage the caller already began and announced (the Slurm script
    starts Ray itself); it goes on here without a second line. No shell ever parses the job's argv."""
    stop_after = os.environ.get(STOP_AFTER) or RUNNER_STAGES[-1]
    problem = stop_after_problem(stop_after)
    if problem:
        say(f"ERROR: {problem}")
        return USAGE
    if spec.variant:
        say(spec.variant)
    address = os.environ.get("RAY_ADDRESS") or "auto"  # the cluster this job runs in
    stopped = False
    for stage in RUNNER_STAGES:
        if stopped:
            say(skipped_message(stage, stop_after))
            continue
        if stage != begun:
            pause_at(stage)
            say(stage_message(stage))
        if stage == "ray":
            rc = wait(address, spec.nodes, spec.total_gpus, spec.wait_seconds, spec.device)
        elif stage == "data":
            fetch = spec.model_fetch
            rc = materialize(fetch["repo"], fetch["revision"], expand(fetch["folder"])) if fetch else 0
            rc = rc or merge_inputs(spec.inputs or [])
            for step in spec.data_prep:
                rc = rc or prepare(step["out_dir"], step["argv"])
            if not fetch and not spec.data_prep and not spec.inputs:
                say("no data preparation in the spec")
        elif stage == "preflight":
            rc = preflight(
                address=address, nodes=spec.nodes, gpus=spec.total_gpus, model=expand(spec.model),
                checkpoint_dir=expand(spec.checkpoint_dir), data=[expand(f) for f in spec.data_files],
                columns=spec.data_columns, pins=spec.pins, rollout_package=spec.rollout_package,
                record=expand(spec.record) if spec.record else None, image=spec.image,
                require_env=spec.require_env, reference=expand(spec.reference) if spec.reference else None,
                train=spec.train, verl_commit=spec.verl_commit, code=spec.code,
                device=spec.device, startup=spec.startup,
                paths={"model": spec.model, "checkpoint_dir": spec.checkpoint_dir, "data": spec.data_files},
                inputs=spec.inputs)
        else:
            repeated = repeats_last_attempt(expand(spec.checkpoint_dir), os.path.dirname(expand(spec.record))) \
                if spec.record else None
            if repeated:
                say(f"ERROR: {repeated}")
                return 1
            say("training: " + " ".join(spec.train))
            env = with_deadline({**os.environ, "RAY_ADDRESS": address}, spec.expiry)
            rc = train(spec.train, env, spec.stall_timeout, address, nodes=spec.nodes if spec.every_node else 1,
                       device=spec.device)
            say(f"training exited with code {rc}")
        if rc != 0:
            return rc
        if stage == stop_after and stage != RUNNER_STAGES[-1]:
            say(f"stopping after stage {stage} ({STOP_AFTER})")
            stopped = True
    return 0


def mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


def ray_logs(temp_dir: str, limit_mib: int) -> int:
    """Write this node's Ray session logs as a tar stream to stdout, at most --limit-mib of them (each file
    over its share keeps its end; TRUNCATED.txt says what was cut), then remove Ray's temp dir."""
    import io
    import shutil
    import tarfile

    logs = os.path.join(temp_dir, "session_latest", "logs")
    files = sorted((os.path.join(d, f) for d, _, names in os.walk(logs) for f in names), key=os.path.getsize)
    budget, cut = limit_mib * 1024**2, []
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for n, path in enumerate(files):
            share = budget // (len(files) - n)  # small files first: what they leave goes to the large ones
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                if size > share:
                    fh.seek(size - share)
                    cut.append(f"{os.path.relpath(path, logs)}: kept the last {share} of {size} bytes")
                data = fh.read(share)
            info = tarfile.TarInfo(os.path.relpath(path, logs))
            info.size, info.mtime = len(data), int(os.path.getmtime(path))
            tar.addfile(info, io.BytesIO(data))
            budget -= len(data)
        note = ("\n".join(cut) or "nothing was cut") + "\n"
        info = tarfile.TarInfo("TRUNCATED.txt")
        info.size = len(note.encode())
        tar.addfile(info, io.BytesIO(note.encode()))
    shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    """The command line bundles call: `python3 - COMMAND ...` (the source on stdin) or `python3 -m verlc_job`."""
    parser = argparse.ArgumentParser(prog="verlc-runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("materialize")
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--folder", required=True)
    p = sub.add_parser("ray-logs")
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--limit-mib", type=int, required=True)
    p = sub.add_parser("job")
    p.add_argument("variant", nargs="?", help="a sweep's variant index (jobs/<index>.json); default: job.json")
    p.add_argument("--json", help="the job itself, instead of the package's job.json (the Slurm script passes it)")
    p.add_argument("--begun", choices=RUNNER_STAGES, help="the stage the caller began (the Slurm script starts Ray)")
    p.add_argument("--variant-json", help="a sweep's array task: what its variant changes in --json")
    sub.add_parser("pipeline", help="a pipeline's stages in order (the package's stages/*.json)")
    a = parser.parse_args(argv)
    if a.command == "materialize":
        return materialize(a.repo, a.revision, a.folder)
    if a.command == "ray-logs":
        return ray_logs(a.temp_dir, a.limit_mib)
    if a.command == "pipeline":
        return pipeline(load_stages())
    spec = Job.from_json(a.json) if a.json else load_job(a.variant)
    return job(spec.with_variant(Variant.from_json(a.variant_json)) if a.variant_json else spec, a.begun)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
