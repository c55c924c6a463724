# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The collective smoke test: one all-reduce over every GPU (NPU) of every node.

Rendezvous in a TCP store this process (on the head) serves: each node says how many ranks it has, gets its first
rank and the world size, and each rank marks its progress, so a node that never arrives or fails is named, and the
first failure ends the test instead of a timeout on every rank."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time

from .cluster import holding, lost_nodes, node_label, note_node_time
from .startup import STARTUP_TIMEOUT


# ---- the collective smoke test: one all-reduce over every GPU of every node -------------------------
# Rendezvous in a TCP store this process (on the head) serves: each node says how many ranks it has, gets
# its first rank and the world size, and each rank marks its progress, so a node that never arrives or
# fails is named, and the first failure ends the test instead of a timeout on every rank.
COLLECTIVE_TIMEOUT = 120  # seconds; NCCL's own set-up on many nodes takes tens of them


# One rank, as a process of its own (NCCL wants a process per GPU). It dies with its node task. The node's first
# rank says how many devices torch sees there; a rank past them (Ray holds more here than torch sees) leaves.
RANK_PROGRAM = """
import ctypes, signal, sys, time
from datetime import timedelta
ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
import torch
import torch.distributed as dist
host, port, index, local, timeout, wait = sys.argv[1:7]
index, local, timeout = int(index), int(local), timedelta(seconds=float(timeout))
try:
    import torch_npu  # noqa: F401  (Ascend: torch.npu and the hccl backend)
    npu = torch.npu.is_available()
except ImportError:
    npu = False
cuda = not npu and torch.cuda.is_available()
device, backend = ("npu", "hccl") if npu else ("cuda", "nccl") if cuda else ("cpu", "gloo")
count = getattr(torch, device).device_count() if device != "cpu" else 1
store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=float(wait)))
if local == 0:
    store.set(f"ranks/{index}", str(count))
    print("arrived", time.time(), flush=True)
if local >= count:
    sys.exit(0)
first, world = map(int, store.get(f"plan/{index}").decode().split())
rank = first + local
if device != "cpu":
    getattr(torch, device).set_device(local)
store.set(f"joined/{rank}", "1")
dist.init_process_group(backend, store=dist.PrefixStore("pg", store), rank=rank, world_size=world, timeout=timeout)
x = torch.ones(256 * 1024, device=device)  # 1 MiB
dist.all_reduce(x)
got = x[0].item()
dist.destroy_process_group()
store.set(f"done/{rank}", str(got))
sys.exit(0 if got == world else 3)
"""
DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd", "/dev/davinci_manager")  # NVIDIA's, ROCm's and Ascend's drivers


def allreduce_node(host: str, port: int, index: int, timeout: float, held: float) -> dict:
    """A node's part of the all-reduce (a Ray task holding every GPU or NPU of the node, `held`, that imports no
    torch itself): a rank process per device held where the node has a device driver, else one gloo rank, all
    started at once (each imports torch). Its "seconds": how long the node took to reach the rendezvous (the
    slowest node is the one every other waited for)."""
    began = time.time()
    ranks = max(1, int(held)) if any(os.path.exists(f) for f in DEVICE_FILES) else 1
    # the plan comes once every node has arrived: as late as the head waits for the slowest (STARTUP_TIMEOUT)
    procs = [subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, host, str(port), str(index), str(local),
                               str(timeout), str(STARTUP_TIMEOUT + timeout)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for local in range(ranks)]
    failed, arrived = [], None
    for local, proc in enumerate(procs):
        out, err = proc.communicate()
        if local == 0:
            arrived = next((float(line.split()[1]) - began for line in out.splitlines() if line.startswith("arrived ")),
                           None)
        if proc.returncode:
            lines = [line for line in err.strip().splitlines() if line.strip()]
            failed.append(f"local rank {local} exited {proc.returncode}: {lines[-1] if lines else 'no output'}")
    return {"host": platform.node(), "failed": failed, "seconds": time.time() - began if arrived is None else arrived}


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
    held = [n.get("Resources", {}).get(device, 0) for n in nodes]
    refs = [task.options(
        num_cpus=0, **holding(device, held[i]), max_retries=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
    ).remote(host, store.port, i, timeout, held[i]) for i, n in enumerate(nodes)]
    which = {ref.hex(): i for i, ref in enumerate(refs)}
    # Reaching the rendezvous takes a fresh Ray worker and a rank process that imports torch, as long as the
    # start-up check's probe may take on a loaded node; the all-reduce itself then has `timeout`.
    arrival = STARTUP_TIMEOUT
    deadline, problems, planned, ranks = time.monotonic() + arrival, [], False, []

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
            note_node_time(nodes[which[ref.hex()]], result["seconds"])
    if pending and not problems:
        problems.append(unfinished(store, names, ranks, planned, timeout if planned else arrival))
    for ref in pending:
        ray.cancel(ref, force=True)
    summary = f"all-reduce over {sum(ranks)} ranks on {len(nodes)} nodes" if ranks else ""
    return problems, summary


def unfinished(store, names: list[str], ranks: list[int], planned: bool, waited: float) -> str:  # noqa: ANN001
    """Why the all-reduce did not end in time, naming the nodes it waited for: those that never reached the
    rendezvous, else those with a rank that never joined, else those with a rank that never finished."""
    if not planned:
        missing = [names[i] for i in range(len(names)) if not store.check([f"ranks/{i}"])]
        return (f"all-reduce: node(s) {', '.join(missing)} did not reach the rendezvous at {store.host}:{store.port} "
                f"within {waited:g}s")

    def node_of(rank: int) -> str:
        return names[next(i for i in range(len(names)) if rank < sum(ranks[:i + 1]))]

    stuck = sorted({node_of(r) for r in range(sum(ranks)) if not store.check([f"joined/{r}"])}
                   or {node_of(r) for r in range(sum(ranks)) if not store.check([f"done/{r}"])})
    return f"all-reduce: did not finish within {waited:g}s; waiting for node(s) {', '.join(stuck)}"
