# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""What verl's workers need when they start, checked on every node.

The job's `startup` list (compiler/verl/workers.py reads it from the release's code): modules the workers import,
and flash-attn 2 where a worker asks transformers for it. Checked on every node in a fresh Python, as verl's workers
would import them: an import can take seconds and must not stay loaded in a Ray worker."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from dataclasses import asdict

from .job import StartupNeed


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
    """One node's outcome of each start-up need (as JSON: a Ray task's argument), in the needs' order: ok true,
    false (with why) or null (not checked: the need is for a device this node's torch does not see)."""
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


def startup_problems(found: dict, needs: list[StartupNeed]) -> list[str]:
    """A problem for each need a node lacks, naming the node, the package, and the verl file and line."""
    problems = []
    for node, info in sorted(found.items()):
        where = f"node {info['host']} ({node[:8]})"
        if "error" in info:
            problems.append(f"{where}: the start-up check failed: {info['error']}")
            continue
        for need, result in zip(needs, info["results"]):
            if result["ok"] is False:
                avoid = f"; {need.avoid}" if need.avoid else ""
                problems.append(f"{where}: {need.module}: {result['detail']}; {need.why} ({need.where}){avoid}")
    return problems


def startup_record(found: dict, needs: list[StartupNeed] | None) -> dict:
    """What the run record keeps: each need and what every node showed, or why nothing was checked."""
    if needs is None:
        return {"unknown": "verlc has no start-up facts for this release's workers (verl 0.8 on: engine workers)"}
    return {"needs": [{**asdict(need), "nodes": {info["host"]: info.get("results", [{}] * len(needs))[i]
                                         for info in found.values()}} for i, need in enumerate(needs)]}
