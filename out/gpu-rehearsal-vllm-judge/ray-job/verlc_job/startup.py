# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""What verl's workers need when they start, checked on every node.

The job's `startup` list (compiler/verl/workers.py reads it from the release's code): modules the workers import,
flash-attn 2 where a worker asks transformers for it, and what verl 0.9's agent loop requires of the model's
tokenizer (verl's own chat builder of the model's family, run on it where the release's builder for that family
requires anything). Checked on every node in a fresh Python, as verl's workers would import them: an import can
take seconds and must not stay loaded in a Ray worker."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from dataclasses import asdict

from .job import RolloutMemory, StartupNeed


STARTUP_TIMEOUT = 300


STARTUP_PROBE = r"""
import importlib, json, os, sys
needs = json.loads(sys.argv[1])


def chat_tokens(need):
    # verl's own chat builder of the model's family, on the tokenizer as verl loads it (verl.utils.hf_tokenizer,
    # whose AutoTokenizer may rebuild it by the model's type), where the release's builder for this model_type
    # requires something of it; its ValueError is what verl's agent loop raises at the first rollout
    folder = need["model"]
    try:
        with open(os.path.join(folder, "config.json")) as fh:
            model_type = json.load(fh).get("model_type")
    except (OSError, ValueError):
        return None, "not checked: no readable config.json in " + folder + " here"
    lines = need["model_types"].get(model_type)
    if not lines:
        return True, ""
    if not any(os.path.exists(os.path.join(folder, f)) for f in ("tokenizer.json", "tokenizer_config.json")):
        return None, "not checked: no tokenizer in " + folder + " here"
    try:
        from verl.utils import hf_tokenizer
        build = importlib.import_module(need["module"]).create_continuous_token_builder
        tokenizer = hf_tokenizer(folder)
    except Exception as exc:
        return None, "not checked: verl could not load the tokenizer: " + (type(exc).__name__ + ": " + str(exc))[:200]
    try:
        build(tokenizer, hf_model_type=model_type)
    except ValueError as exc:
        return False, ("the model's tokenizer (" + folder + ") fails verl's chat builder for a " + model_type +
                       " model: " + str(exc)[:200] + " (" + ", ".join(lines) + ")")
    return True, ""


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
        if need["check"] == "chat_tokens":
            ok, detail = chat_tokens(need)
        elif need["check"] == "flash_attention_2":
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
print(json.dumps({"devices": sorted(devices), "results": results}))
"""


def startup_found(needs: list[dict]) -> dict:
    """One node's outcome of each start-up need (as JSON: a Ray task's argument), in the needs' order: ok true,
    false (with why) or null (not checked: the need is for a device this node's torch does not see); and the
    devices its torch sees ("cuda", "npu")."""
    return fresh_python(STARTUP_PROBE, [json.dumps(needs)], "the check")


def fresh_python(probe: str, args: list[str], what: str) -> dict:
    """`probe` run by a fresh Python of this node: this node's host name and the JSON object the probe printed
    last, or an error naming `what` (it timed out, failed or printed nothing)."""
    host = platform.node()
    try:
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                              timeout=STARTUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        return {"host": host, "error": f"{what} did not finish within {STARTUP_TIMEOUT}s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"host": host, "error": f"{what} exited with code {done.returncode}: {last}"}
    return {"host": host, **json.loads(lines[-1])}


def by_node(found: dict, failed: str) -> tuple[list[str], list[tuple[str, dict]]]:
    """A probe's answers (NodeID -> its result), in NodeID order: a problem (`failed`, formatted with the node and
    the error) for each node whose probe failed, and (the node's name, its result) for each that answered."""
    problems, answered = [], []
    for node, info in sorted(found.items()):
        where = f"node {info['host']} ({node[:8]})"
        if "error" in info:
            problems.append(failed.format(where=where, error=info["error"]))
        else:
            answered.append((where, info))
    return problems, answered


def startup_problems(found: dict, needs: list[StartupNeed]) -> list[str]:
    """A problem for each need a node lacks, naming the node, the package, and the verl file and line."""
    problems, answered = by_node(found, "{where}: the start-up check failed: {error}")
    for where, info in answered:
        for need, result in zip(needs, info["results"]):
            if result["ok"] is False:
                avoid = f"; {need.avoid}" if need.avoid else ""
                problems.append(f"{where}: {need.module}: {result['detail']}; {need.why} ({need.where}){avoid}")
    return problems


def startup_record(found: dict, needs: list[StartupNeed] | None) -> dict:
    """What the run record keeps: each need and what every node showed, or why nothing was checked."""
    if needs is None:
        return {"unknown": "verlc has no start-up facts for this release's workers"}
    return {"needs": [{**asdict(need), "nodes": {info["host"]: info.get("results", [{}] * len(needs))[i]
                                         for info in found.values()}} for i, need in enumerate(needs)]}


# --- the memory vLLM's rollout asks to find free ---------------------------------------------------------------

GIB = 1 << 30
# Each GPU's free and total memory, as a process that has just made its CUDA context there sees them (as vLLM's
# engine does when it measures), and the processes holding memory on the GPUs (nvidia-smi; none where it is absent).
MEMORY_PROBE = r"""
import json, os, subprocess, torch
gpus = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "free": free, "total": total})
holders = []
try:
    listed = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory,process_name",
                             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30).stdout
    for line in listed.splitlines():
        pid, mib, name = (part.strip() for part in line.split(",", 2))
        if int(pid) == os.getpid():
            continue  # this probe's own context
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                name = fh.read().replace(b"\0", b" ").decode(errors="replace").strip() or name
        except OSError:
            pass
        holders.append({"pid": int(pid), "mib": int(mib), "command": " ".join(name.split())[:160]})
except Exception:
    pass
print(json.dumps({"gpus": gpus, "holders": holders}))
"""


def memory_found() -> dict:
    """This node's GPUs' free and total memory, and what holds memory there (a task's answer, as JSON)."""
    return fresh_python(MEMORY_PROBE, [], "the measurement")


def memory_problems(found: dict, memory: RolloutMemory) -> list[str]:
    """A problem for each GPU with less free memory than vLLM's rollout asks for at its start (vLLM refuses to
    start below `share` of the GPU's total: vllm/v1/worker/utils.py request_memory), or than verlc's plan predicts
    the run takes of it at its peak, on this GPU's total (another process on the GPU, or a smaller card than the
    spec declares: the rollout's share is of the card there),
    naming the node, the GPU, the figures and what holds the memory. The trainer's own models take more before
    vLLM starts: what fails here fails there."""
    problems, answered = by_node(found, "GPU memory: {where}: {error}")
    for where, info in answered:
        held = ", ".join(f"pid {h['pid']} {h['mib'] / 1024:.1f} GiB ({h['command']})" for h in info["holders"])
        holders = 'held by: ' + held if held else 'nvidia-smi names no process holding it'
        for gpu in info["gpus"]:
            has = f"GPU {gpu['index']} ({gpu['name']}) has {gpu['free'] / GIB:.1f} of {gpu['total'] / GIB:.1f} GiB free"
            asked = math.ceil(gpu["total"] * memory.share) if memory.share is not None else 0  # as vLLM rounds it
            if gpu["free"] < asked:
                problems.append(
                    f"GPU memory: {where}: {has}, and vLLM's rollout asks for {memory.share} of its total "
                    f"({asked / GIB:.1f} GiB) free when it starts (actor_rollout_ref.rollout.gpu_memory_utilization; "
                    f"vLLM refuses to start below it) before verl's own models take theirs; {holders}. Lower the "
                    f"share, or free the GPU (a service's gpu_memory counts only what the spec says)")
                continue
            peak = memory.peak(gpu["total"])
            if peak is not None and gpu["free"] < peak.bytes:
                # another card than declared: the same card's total differs by MiBs between verlc's table and
                # what the driver reports, another card's by GiBs
                other = memory.gpu is not None and abs(gpu["total"] - memory.gpu) > memory.gpu / 50
                card = f"; the spec declares a GPU of {memory.gpu / GIB:.1f} GiB" if other else ""
                problems.append(
                    f"GPU memory: {where}: {has}, and the run takes {peak.bytes / GIB:.1f} GiB of it at its peak "
                    f"({peak.name}{card}; `verlc plan` shows each phase), the services' shares aside: it runs out "
                    f"of memory there; {holders}. Free the GPU, or lower what the plan names")
    return problems
