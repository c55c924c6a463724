# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""torchrun on every node: a program that sets up torch.distributed itself (verl's SFT trainer) on more than one
node. The runtime runs rank 0's torchrun on its own node, as on one node, and each other node's as a Ray task pinned
there (the nodes' Ray is up for the preflight anyway), all joining torchrun's static rendezvous at this node."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from .cluster import alive_nodes, holding, node_label
from .protocol import say


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
