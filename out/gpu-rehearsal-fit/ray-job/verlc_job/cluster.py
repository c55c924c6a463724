# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The job's Ray cluster: connecting, its nodes, waiting for all of them, tasks pinned to each node, and a
sweep's turn on a shared cluster (ray-job)."""

from __future__ import annotations

import contextvars
import json
import os
import socket
import sys
import time

from .protocol import node_message, say


def connect(address: str):  # noqa: ANN201 - ray is imported lazily: `prepare` must work without it
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False, ignore_reinit_error=True)
    return ray


def ray_log_folder(ray) -> str | None:  # noqa: ANN001
    """This node's Ray log folder, the one Ray's log API serves (no public API names it), where `ray` is
    connected; else None."""
    try:
        return ray._private.worker._global_node.get_logs_dir_path()
    except AttributeError:
        return None


def alive_nodes(ray) -> list[dict]:  # noqa: ANN001
    return [n for n in ray.nodes() if n.get("Alive")]


LOST_SETTLE = 5  # seconds to wait, once a node is lost, for others lost with it (one message names them all)


def lost_nodes(ray, started: list[dict]) -> list[dict]:  # noqa: ANN001
    """The nodes of `started` that Ray now holds dead (it declares a node dead once its health checks fail)."""
    alive = {n["NodeID"] for n in alive_nodes(ray)}
    return [n for n in started if n["NodeID"] not in alive]


def node_name(node: dict) -> str:
    """A Ray node's name: the one the Slurm bundle gives it (Slurm's), else its host's."""
    given = node.get("NodeName")
    return given if given not in (None, "", node.get("NodeManagerAddress")) else node.get("NodeManagerHostname")


def node_label(node: dict) -> str:
    """How messages name a Ray node: its name and address."""
    return f"{node_name(node)} ({node.get('NodeManagerAddress')})"


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


# Each node's time in the per-node tasks of the check under way (the preflight's `timed` collects them, to name
# the slowest node): (node, seconds), as each node measured its own task.
NODE_TIMES: contextvars.ContextVar[list | None] = contextvars.ContextVar("verlc_node_times", default=None)


def timed_on_node(function, *args: object) -> tuple[float, object]:  # noqa: ANN001
    """`function(*args)` on a node, and how long it took there."""
    began = time.monotonic()
    result = function(*args)
    return time.monotonic() - began, result


def note_node_time(node: dict, seconds: float) -> None:
    """A node's time in the check under way, where one collects them (NODE_TIMES)."""
    kept = NODE_TIMES.get()
    if kept is not None:
        kept.append((node_name(node) or node["NodeID"][:8], seconds))


# Ray leaves a worker's visible-device variable as the node set it where the worker's environment has these (the
# job's own environment has the ROCm and Ascend ones already: verl's workers pick their devices themselves there)
SEE_ACCELERATORS = ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
                    "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES")


def holding(device: str, count: float) -> dict:
    """A Ray task's options that hold `count` of resource `device` (Ray takes GPUs as num_gpus only)."""
    if device == "GPU":
        return {"num_gpus": count}
    return {"resources": {device: count}} if count else {}


def on_each_node(ray, nodes: list[dict], function, *args: object, what: str,  # noqa: ANN001
                 timeout: float = 300, see: bool = False) -> tuple[dict, list[str]]:
    """`function(*args)` as a zero-CPU task pinned to each node: {NodeID: its result}, and a problem naming each
    node whose task failed, that Ray declared dead meanwhile (a task pinned there may never return), or that
    did not answer within `timeout`. `see`: the task sees the node's accelerators as the node's own processes do
    (Ray hides them from a task that holds none), without holding them: tasks that hold them run beside it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(timed_on_node)
    seeing = {"runtime_env": {"env_vars": {name: "1" for name in SEE_ACCELERATORS}}} if see else {}
    pending = [task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False), **seeing)
               .remote(function, *args) for n in nodes]
    refs = {ref.hex(): n for ref, n in zip(pending, nodes)}
    results, problems = {}, []
    deadline, checked = time.monotonic() + timeout, time.monotonic()
    while pending and time.monotonic() < deadline:
        done, pending = ray.wait(pending, timeout=0.5)
        for ref in done:
            node = refs[ref.hex()]
            try:
                seconds, results[node["NodeID"]] = ray.get(ref)
                note_node_time(node, seconds)
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


def head_address(address: str) -> str:
    """The head node's address as the other nodes reach it: the host of the cluster's address where that is not
    a loopback one (the Slurm script gives every node the head's own address: Ray's pick on a Debian host can be
    its name's 127.0.1.1, which no other node reaches), else the address Ray picks on this node (compose's head
    container, whose runtime reaches Ray at 127.0.0.1)."""
    host, _, port = address.rpartition(":")
    if host and port.isdigit() and "/" not in host:
        try:
            found = socket.gethostbyname(host)
            if not found.startswith("127."):
                return found
        except OSError:
            pass
    import ray

    return ray.util.get_node_ip_address()


def clock() -> float:
    return time.time()


def clock_offsets(ray, nodes: list[dict]) -> dict[str, tuple[float, float]]:  # noqa: ANN001
    """Each node's clock against this node's: node -> (offset in seconds, within +-): a task pinned there reads its
    clock between two readings here, and the offset is from their midpoint (half their distance bounds it). First
    tasks, on every node at once, lease a worker there, so that each measured round trip is short. A node that
    does not answer within 30 s is left out (the nodes check names it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    read = ray.remote(num_cpus=0, max_retries=0)(clock)
    pinned = [read.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)) for n in nodes]
    ray.wait([p.remote() for p in pinned], num_returns=len(pinned), timeout=30)  # the leases, all nodes at once
    out = {}
    for node, task in zip(nodes, pinned):
        try:
            before = time.time()
            theirs = ray.get(task.remote(), timeout=30)
            after = time.time()
        except Exception:  # gone, or too slow to say: no offset for it
            continue
        out[node_name(node)] = (theirs - (before + after) / 2, (after - before) / 2)
    return out


JOBS_ENDED = {"SUCCEEDED", "FAILED", "STOPPED"}  # the Ray Jobs API's final statuses


def sweep_turn(address: str, after: list[str], parallel: int, poll: float = 5) -> int:
    """A sweep's variant, submitted with every other variant to one Ray cluster, waits here until fewer than
    `parallel` of the variants submitted before it (`after`: their submission ids) have yet to end: the
    variants run in turn (parallel 1), each with the cluster's GPUs, instead of failing for want of them. Their
    states come from the Jobs API of the cluster's own dashboard; an id it does not know (a submission that
    failed) has ended."""
    import urllib.error
    import urllib.request

    import ray

    dashboard = ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                         ignore_reinit_error=True).dashboard_url
    if not dashboard:
        say("ERROR: the sweep's variants run in turn through Ray's Jobs API, and this cluster has no dashboard")
        return 1

    def running() -> list[str]:
        busy = []
        for sid in after:
            try:
                with urllib.request.urlopen(f"http://{dashboard}/api/jobs/{sid}", timeout=30) as response:
                    status = json.loads(response.read() or b"{}").get("status")
            except urllib.error.HTTPError as exc:
                status = None if exc.code == 404 else "UNKNOWN"
            if status is not None and status not in JOBS_ENDED:
                busy.append(sid)
        return busy

    started, told = time.monotonic(), None
    while len(busy := running()) >= parallel:
        if busy != told:
            say(f"waiting for its turn: {len(busy)} variant(s) submitted before it still to end "
                f"({', '.join(busy)}); {parallel} at a time (ray.sweep_parallel)")
            told = busy
        time.sleep(poll)
    if told is not None:
        say(f"its turn came after {time.monotonic() - started:.0f}s")
    return 0
