"""A Slurm job's ports on its nodes, as values: the script only does the arithmetic these give it.

Each job owns a block of `size` ports from its base: `blocks` blocks between Ray's worker ports (10002-19999)
and Linux's ephemeral range (32768-60999), chosen by the job id, so that two jobs sharing a node collide only
when their ids differ by a multiple of `blocks` (ray.port and ray.dashboard_port pin the ports instead). In
the block: Ray's GCS, dashboard and client server, the nodes' dashboard agents (node i: agents[0] + i % agents[1]),
HCCL's ranges on Ascend, and the services' ports (runtime/services.py: the runtime gives them out in order).
"""

from __future__ import annotations

from dataclasses import dataclass

from ...compiler.derive import HCCL_PORTS

RAY_WORKER_PORTS = range(10002, 20000)  # Ray's default min/max worker ports
EPHEMERAL = range(32768, 61000)  # Linux's default ip_local_port_range


@dataclass(frozen=True)
class PortPlan:
    first: int = 20000
    blocks: int = 116
    size: int = 110
    gcs: int = 0
    dashboard: int = 1
    client: int = 2
    agents: tuple[int, int] = (3, 7)  # first offset, how many
    hccl: tuple[tuple[str, int, int], ...] = tuple((n, a, b) for n, (a, b) in HCCL_PORTS.items())
    services: tuple[int, int] = (100, 109)  # first, last offset: 10 services at most

    def base(self, job_id: int) -> int:
        return self.first + job_id % self.blocks * self.size

    def agent(self, node: int) -> int:
        """The offset of node `node`'s dashboard agent (its place in the job, 0 for the head)."""
        return self.agents[0] + node % self.agents[1]

    def offsets(self) -> dict[str, range]:
        """Every use of the block, by name, as offsets."""
        return {"gcs": range(self.gcs, self.gcs + 1), "dashboard": range(self.dashboard, self.dashboard + 1),
                "client": range(self.client, self.client + 1),
                "agents": range(self.agents[0], self.agents[0] + self.agents[1]),
                **{name: range(a, b + 1) for name, a, b in self.hccl},
                "services": range(self.services[0], self.services[1] + 1)}

    def ports(self, job_id: int, node: int) -> dict[str, int | range]:
        """A job's ports on node `node` (the script's values for that job id)."""
        base = self.base(job_id)
        return {"gcs": base + self.gcs, "dashboard": base + self.dashboard, "client": base + self.client,
                "agent": base + self.agent(node),
                **{name: range(base + a, base + b + 1) for name, a, b in self.hccl},
                "services": range(base + self.services[0], base + self.services[1] + 1)}


PLAN = PortPlan()
