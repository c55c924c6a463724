# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""Where the job's services are: their ports (the job's block, or free ones), each service's variables (host,
port, URL, a token made for the run), and the nodes of their own that services get in the allocation."""

from __future__ import annotations

import os
import secrets
import socket

from .cluster import node_name
from .job import Service
from .protocol import SERVICE_PORTS


def service_ports(count: int) -> list[int]:
    """Ports for `count` services: from the job's block where the target gives one (SERVICE_PORTS, FIRST-LAST),
    else ports nothing listens on here now."""
    given = os.environ.get(SERVICE_PORTS, "")
    if given:
        first, _, last = given.partition("-")
        block = list(range(int(first), int(last) + 1))
        if len(block) < count:
            raise ValueError(f"{SERVICE_PORTS}={given} holds {len(block)} ports for {count} services")
        return block[:count]
    found = []
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:  # held open together: no two the same
            sock.bind(("", 0))
            found.append(sock.getsockname()[1])
    finally:
        for sock in socks:
            sock.close()
    return found


def addresses(services: list[Service], head_ip: str) -> dict[str, str]:
    """Every service's variables: a head service at the head's own address, one on every node at 127.0.0.1
    (each node's processes reach their own node's), one on a node of its own at no host yet (`placed` sets it
    once the nodes are up); its token made now, for this run alone (never in a bundle or a log of verlc's: the
    service and its callers read it from their environment). One in an image of its own has the variables its
    target gave this process (those it did not give are missing)."""
    values: dict[str, str] = {}
    for service, port in zip(services, service_ports(len(services))):
        if service.image:  # the target's, which set its variables here (protocol.py)
            values.update({v: os.environ[v] for v in service.variables.values() if v in os.environ})
            continue
        own = {"port": str(port), "token": secrets.token_urlsafe(24)}
        values.update({variable: own[attribute] for attribute, variable in service.variables.items()
                       if attribute in own})
        if not service.own_node:
            values.update(placed(service, "127.0.0.1" if service.every_node else head_ip, port))
    return values


def placed(service: Service, host: str, port: int) -> dict[str, str]:
    """A service's host and URL variables, at `host`."""
    own = {"host": host, "url": f"http://{host}:{port}"}
    return {variable: own[attribute] for attribute, variable in service.variables.items() if attribute in own}


def own_nodes(services: list[Service], nodes: list[dict], here: str) -> dict[str, dict]:
    """The node of each service on one of its own: the allocation's last nodes by name, never the runtime's own
    (the head: NodeID `here`), one per service in the spec's order; the trainer has the others."""
    others = sorted((n for n in nodes if n["NodeID"] != here), key=lambda n: (node_name(n) or "", n["NodeID"]))
    own = [s for s in services if s.own_node]
    return {s.name: n for s, n in zip(own, others[len(others) - len(own):])} if len(own) <= len(others) else {}
