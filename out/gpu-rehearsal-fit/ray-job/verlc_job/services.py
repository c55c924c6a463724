# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""Services beside the trainer (a code sandbox, an LLM judge, a retriever): started as the cluster comes up, ready
and answering one real request before training, watched while it trains, stopped with the job.

A head service is a process group of this runtime's own on the head node; a service on every node is one per node,
each held by a Ray actor pinned there (its process ends with the actor: the parent-death signal). A service in an
image of its own is the target's container on the head node (protocol.py): checked and watched here, through its
address, never started or stopped. Each service's address reaches the job as environment variables
(Service.variables), set here before any service or the trainer starts: verl's settings read them through
OmegaConf's ${oc.env:...}, a service's words through their env parts."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import uuid

from .addresses import addresses, own_nodes, placed
from .cluster import holding, node_label, node_name, on_each_node
from .job import Service, ToolConfig
from .probes import (SERVICE_REQUEST_TIMEOUT, connect_problem, exposure_problem, listening_ports, probe_problem,
                     ready_problem)
from .process import SERVICE_STOP_GRACE, Process, tail_of
from .protocol import (SERVICE_LOGS, TOOL_CONFIG_FILE, say, service_failed_message, service_ready_message,
                       service_tail_line)
from .watch import Watch


class NodeService:
    """A service on one node, held by a Ray actor pinned there (the class is made a Ray actor in `start_nodes`):
    its process, its readiness and probe asked there, at `host` (the node's loopback for a service on every
    node, the node's own address for one on a node of its own)."""

    def __init__(self, service: Service, variables: dict, log: str, host: str) -> None:
        os.environ.update(variables)
        self.service, self.log, self.host = service, log, host
        self.process = Process(service, log)

    def where(self) -> tuple[str, str]:
        """Its node's host name, and its log there."""
        return socket.gethostname(), self.log

    def poll(self) -> int | None:
        return self.process.poll()

    def restart(self) -> None:
        self.process.stop()
        self.process = Process(self.service, self.log)

    def tail(self) -> list[str]:
        return self.process.tail()

    def ready(self, port: int, token: str) -> str | None:
        return ready_problem(self.service, self.host, port, token)

    def exposed(self, port: int) -> str | None:
        return exposure_problem(self.service, port)

    def probe(self, port: int, token: str) -> str | None:
        return probe_problem(self.service, f"http://{self.host}:{port}", token)

    def stop(self) -> None:
        self.process.stop()


def write_tool_config(path: str, text: str) -> str:
    """The tool config at `path` on this node, whole or not at all; the node's name."""
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)
    return socket.gethostname()


def remove_tool_config(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


class Services:
    """The job's services, from their start to the job's end; and the tool config verl reads them through: in
    the run folder where the job has one (every node sees it: the Slurm script's, where each node keeps its Ray
    logs), kept with the run; else written on every node at one path and removed with the job. Its path is in
    the job's env (ToolConfig.variable)."""

    def __init__(self, services: list[Service], log_folder: str, tool_config: ToolConfig | None = None,
                 run_folder: str | None = None, device: str = "GPU") -> None:
        self.services, self.log_folder, self.tool_config = services, log_folder, tool_config
        self.device = device  # what a service on a node of its own holds there (Ray's resource)
        self.run_folder = run_folder
        self.tool_config_path = os.path.join(run_folder, TOOL_CONFIG_FILE) if run_folder else \
            os.path.join(tempfile.gettempdir(), f"verlc-tools-{uuid.uuid4().hex}.yaml")
        self.placed: list[dict] = []  # the nodes the tool config was written on
        self.problems: list[str] = []  # what went wrong before the preflight asks (the tool config's writing)
        self.variables: dict[str, str] = {}
        self.head: dict[str, Process] = {}
        self.nodes: dict[str, list] = {}  # name -> its actors, one per node
        self.restarts: dict[str, int] = {s.name: 0 for s in services}
        self.record: dict[str, dict] = {}
        self.given: dict[str, float] = {}  # a service in an image of its own (the target's) -> when seen here first
        self.own: dict[str, dict] = {}  # name -> the node of its own (a Ray node)
        self.first: dict[str, float] = {}  # name -> its first start (ready.deadline counts from it, restarts or not)
        self.ray = None
        by_name = {s.name: s for s in services}
        self.watch = Watch(lambda name: self._check_once(by_name[name]))

    def _port(self, service: Service) -> int:
        return int(self.variables[service.variables["port"]])

    def _host(self, service: Service) -> str:
        return self.variables[service.variables["host"]]

    def _token(self, service: Service) -> str:
        return self.variables[service.variables["token"]]

    def start_head(self, head_ip: str) -> None:
        """Every service's address set for the job (but the host of one on a node of its own), and the head's
        services started (beside Ray's bring-up)."""
        self.variables = addresses(self.services, head_ip)
        if self.tool_config:
            self.variables[self.tool_config.variable] = self.tool_config_path
            if self.run_folder:
                write_tool_config(self.tool_config_path, self._tool_config_text())
                say(f"tool config: {self.tool_config_path} ({self.tool_config.variable})")
        os.environ.update(self.variables)  # the services' words, the trainer and verl's settings read them
        for service in self.services:
            if service.image:
                self._take_given(service)
            elif not service.every_node and not service.own_node:
                self.head[service.name] = Process(service, self._log(service.name))
                self.first[service.name] = self.head[service.name].started
                self.watch.add(service.name)
                say(f"service {service.name}: started on the head node at {self.variables[service.variables['url']]}")

    def _take_given(self, service: Service) -> None:
        """A service in an image of its own: the target started its container and gave its variables."""
        missing = [v for v in service.variables.values() if not self.variables.get(v)]
        if missing:
            self.problems.append(f"service {service.name}: its image {service.image} is the target's to start, "
                                 f"and the target gave the job no {', '.join(missing)}")
            return
        self.given[service.name] = self.first[service.name] = time.monotonic()
        self.watch.add(service.name)
        say(f"service {service.name}: in its own image {service.image}, started by the target on the head node at "
            f"{self.variables[service.variables['url']]}")

    def _here(self, service: Service) -> bool:
        """Whether a service is on this (the head) node: the runtime's process or the target's container."""
        return service.name in self.head or service.name in self.given

    def _tool_config_text(self) -> str:
        assert self.tool_config is not None
        return json.dumps(self.tool_config.content, indent=1, ensure_ascii=False) + "\n"  # JSON is YAML

    def _log(self, name: str, node: str = "") -> str:
        return os.path.join(self.log_folder, SERVICE_LOGS, f"{name}{'-' + node if node else ''}.log")

    def _node_log(self, service: Service, node: dict) -> str:
        return self._log(service.name, node_name(node) or node["NodeID"][:8])

    def start_nodes(self, ray, nodes: list[dict]) -> None:  # noqa: ANN001
        """Once Ray has every node: the services on nodes of their own, each holding its GPUs there, then those
        on every node of the trainer (which may read the former's addresses); one actor per node, pinned there."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        self.ray = ray
        if self.tool_config and not self.run_folder:
            written, problems = on_each_node(ray, nodes, write_tool_config, self.tool_config_path,
                                             self._tool_config_text(), what="the tool config", timeout=60)
            self.placed = [n for n in nodes if n["NodeID"] in written]
            self.problems += problems
            if not problems:
                say(f"tool config: {self.tool_config_path} on {len(nodes)} nodes ({self.tool_config.variable})")
        self.own = own_nodes(self.services, nodes, ray.get_runtime_context().get_node_id())
        for service in self.services:
            if service.own_node and service.name in self.own:
                self.variables.update(placed(service, self.own[service.name]["NodeManagerAddress"],
                                             self._port(service)))
        os.environ.update(self.variables)
        actor = ray.remote(num_cpus=0, max_restarts=0)(NodeService)
        for service in (s for s in self.services if s.own_node or s.every_node):
            if service.own_node and service.name not in self.own:
                self.problems.append(f"service {service.name}: the cluster has no node of its own for it "
                                     f"({len(nodes)} nodes, the head's one of them)")
                continue
            on = [self.own[service.name]] if service.own_node else self.trainer_nodes(nodes)
            self.nodes[service.name] = [actor.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                **holding(self.device, service.gpus)).remote(
                    service, self.variables, self._node_log(service, n),
                    n["NodeManagerAddress"] if service.own_node else "127.0.0.1")
                for n in on]
            self.first[service.name] = time.monotonic()
            self.watch.add(service.name)
            where = f"on {node_label(on[0])}, a node of its own ({service.gpus} {self.device}s)" \
                if service.own_node else f"on {len(on)} nodes"
            say(f"service {service.name}: starting {where} at {self.variables[service.variables['url']]}")

    def trainer_nodes(self, nodes: list[dict]) -> list[dict]:
        """The nodes of `nodes` that are the trainer's: not a service's own."""
        own = {n["NodeID"] for n in self.own.values()}
        return [n for n in nodes if n["NodeID"] not in own]

    def _exited(self, service: Service) -> str | None:
        """Why a service's process (or one node's) is gone, with its last lines, or None."""
        if service.name in self.head:
            process = self.head[service.name]
            code = process.poll()
            if code is not None:
                return self._failure(service, f"exited with code {code}", process.tail())
            return None
        for handle in self.nodes.get(service.name, []):
            try:
                code = self.ray.get(handle.poll.remote(), timeout=SERVICE_REQUEST_TIMEOUT)
                if code is not None:
                    node, log = self.ray.get(handle.where.remote())
                    return self._failure(service, f"exited with code {code} on {node}",
                                         self.ray.get(handle.tail.remote()), log)
            except Exception as exc:  # the actor or its node is gone
                return f"service {service.name}: its node's actor failed ({str(exc).strip().splitlines()[-1]})"
        return None

    def _unreachable(self, service: Service) -> str | None:
        """Why a service in an image of its own (whose process is the target's) is gone: its address accepts no
        connection any more; or None."""
        if service.name not in self.given:
            return None
        host, port = self._host(service), self._port(service)
        refused = connect_problem(host, port)
        return refused and self._failure(service, f"stopped accepting connections at {host}:{port} ({refused}): "
                                                  f"its container is the target's", self._tail(service))

    def _failure(self, service: Service, what: str, tail: list[str], log: str | None = None) -> str:
        """A service's problem, its last lines printed above it; `log`: its log where one node's is meant."""
        for line in tail:
            print(service_tail_line(service.name, line), flush=True)
        if log is None:
            log = self._log(service.name) if self._here(service) else \
                self._node_log(service, self.own[service.name]) if service.name in self.own else \
                f"{self._log(service.name, 'NODE')}, one per node"
        if service.name in self.given and not os.path.exists(log):
            log = f"its container's output, which the target keeps: verlc logs RUN --service {service.name}"
        return f"service {service.name} {what} ({'its last lines are above; ' if tail else ''}its log: {log})"

    def _check_once(self, service: Service) -> str | None:
        if self._here(service):
            return ready_problem(service, self._host(service), self._port(service), self._token(service))
        problems = self.ray.get([h.ready.remote(self._port(service), self._token(service))
                                 for h in self.nodes[service.name]])
        return next((p for p in problems if p), None)

    def _exposed(self, service: Service) -> str | None:
        if self._here(service):
            return exposure_problem(service, self._port(service))
        problems = self.ray.get([h.exposed.remote(self._port(service)) for h in self.nodes[service.name]])
        return next((p for p in problems if p), None)

    def _probe(self, service: Service) -> str | None:
        if self._here(service):
            return probe_problem(service, self.variables[service.variables["url"]], self._token(service))
        problems = self.ray.get([h.probe.remote(self._port(service), self._token(service))
                                 for h in self.nodes[service.name]])
        return next((p for p in problems if p), None)

    def ready(self) -> list[str]:
        """Wait until every service is ready (each by its deadline from its first start) and its probe passed: the
        problems, each naming its service; the record of each (seconds from its start until first seen ready, by
        the watch that asks it from its start: watch.py; the probe's result). A service that exits meanwhile is
        started again up to its restart count, as while training."""
        now = time.monotonic()
        problems: list[str] = list(self.problems)
        waiting = [s for s in self.services if not s.image or s.name in self.given]
        last: dict[str, str] = {}
        while waiting:
            for service in list(waiting):
                gone = self._exited(service)
                if gone and self._start_again(service, gone):
                    continue
                if gone:
                    problems.append(gone)
                    self._failed_after(service, now)
                    waiting.remove(service)
                    continue
                seen = self.watch.seen(service.name)
                last[service.name] = "" if seen is not None else self._check_once(service) or ""
                if not last[service.name]:
                    waiting.remove(service)
                    seconds = round((seen or time.monotonic()) - self._started(service, now), 1)
                    problem = self._exposed(service) or self._probe(service)
                    self.record[service.name] = {"ready_seconds": seconds, "probe": service.probe.kind
                                                 if service.probe else None, "probe_passed": problem is None}
                    if problem:
                        problems.append(self._failure(service, problem, self._tail(service)))
                    else:
                        say(service_ready_message(service.name, seconds) + (
                            f", {service.probe.kind} probe passed" if service.probe else ""))
                elif time.monotonic() - self.first.get(service.name, now) > service.deadline:
                    waiting.remove(service)
                    problems.append(self._failure(service, f"was not ready within {service.deadline}s "
                                                           f"(ready.deadline): {last[service.name]}"
                                                           + self._elsewhere(service), self._tail(service)))
                    self._failed_after(service, now)
            if waiting:
                time.sleep(0.5)
        return problems

    def _failed_after(self, service: Service, otherwise: float) -> None:
        """Said once a service failed before training: how long after its first start (the timeline reads it)."""
        self.record[service.name] = {"ready_seconds": None, "probe": service.probe.kind if service.probe else None,
                                     "probe_passed": False}
        say(service_failed_message(service.name, round(time.monotonic() - self.first.get(service.name, otherwise),
                                                       1)))

    def _start_again(self, service: Service, gone: str) -> bool:
        """A service that exited, started again where its restart count allows (said, with why): whether it was."""
        if self.restarts[service.name] >= service.restart:  # 0 for the target's (checked at build)
            return False
        self.restarts[service.name] += 1
        say(f"{gone}; starting it again ({self.restarts[service.name]} of {service.restart})")
        if service.name in self.head:
            self.head[service.name] = Process(service, self._log(service.name))
        else:
            self.ray.get([h.restart.remote() for h in self.nodes[service.name]])
        self.watch.add(service.name)
        return True

    def _elsewhere(self, service: Service) -> str:
        """Where a head service listens, when not on the port verlc gave it (a port written in its command)."""
        process = self.head.get(service.name)
        if process is None or process.proc is None or service.ready_command:
            return ""
        ports = [p for p in listening_ports(process.proc.pid) if p != self._port(service)]
        return (f"; its process listens on port {', '.join(map(str, ports))} instead of {self._port(service)}: pass "
                f"${{services.{service.name}.port}} where the server takes its port") if ports else ""

    def _started(self, service: Service, otherwise: float) -> float:
        """When a service was started (time.monotonic() here): its head process's start, its node actors'."""
        if service.name in self.head:
            return self.head[service.name].started
        return self.first.get(service.name, otherwise)

    def _tail(self, service: Service) -> list[str]:
        if service.name in self.head:
            return self.head[service.name].tail()
        if service.name in self.given:  # where the target writes its container's output, if it has a run folder
            return tail_of(self._log(service.name))
        handles = self.nodes.get(service.name) or []
        return self.ray.get(handles[0].tail.remote()) if handles else []

    def failed(self) -> str | None:
        """While training: why a service failed for good (restarted up to its count first), or None."""
        for service in self.services:
            gone = self._exited(service) or self._unreachable(service)
            if gone and not self._start_again(service, gone):
                return gone
        return None

    def stop(self) -> None:
        """Every service stopped: the head's process groups, the nodes' actors (each stops its process)."""
        self.watch.stop()
        for name, process in self.head.items():
            process.stop()
        for handles in self.nodes.values():
            for handle in handles:
                try:
                    self.ray.get(handle.stop.remote(), timeout=SERVICE_STOP_GRACE + 5)
                except Exception:  # its node is gone: the actor's end stops the process
                    pass
                try:
                    self.ray.kill(handle)
                except Exception:
                    pass
        if self.head or self.nodes:
            say(f"services stopped: {', '.join(s.name for s in self.services)}")
        if self.placed:
            on_each_node(self.ray, self.placed, remove_tool_config, self.tool_config_path, what="the tool config",
                         timeout=30)
        self.head, self.nodes, self.placed = {}, {}, []
