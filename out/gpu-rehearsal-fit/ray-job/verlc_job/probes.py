# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""A service's readiness, its contract probe (one real request of its kind) and whether it listens privately: the
HTTP side of runtime/services.py, asked on the head node or, for a service on every node, on that node."""

from __future__ import annotations

import json
import os
import socket
import subprocess

from .job import Probe, Service, expand

SERVICE_REQUEST_TIMEOUT = 30  # seconds for one readiness or probe request


def _request(url: str, token: str, body: object = None) -> tuple[int, str]:
    """One HTTP request (POST with a JSON body, else GET) with the service's token as a bearer token (a service
    that takes none ignores it): the status and the answer's text; 0 and why where none came. (urllib is imported
    here: every start of the runtime, such as a node keeping Ray's logs, would pay for it.)"""
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    headers = {"Authorization": f"Bearer {token}", **({"Content-Type": "application/json"} if data else {})}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=SERVICE_REQUEST_TIMEOUT) as answer:
            return answer.status, answer.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(65536).decode(errors="replace")
    except (OSError, ValueError) as exc:
        return 0, str(getattr(exc, "reason", exc))


def _json(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _sandbox(url: str, token: str, probe: Probe) -> tuple[str, str, bool]:
    body = {"code": "print(1)", "language": "python"}
    status, text = _request(url + "/run_code", token, body)
    answer = _json(text)
    stdout = (answer.get("run_result") or {}).get("stdout") if isinstance(answer, dict) else None
    return f"POST /run_code {json.dumps(body)}", f"{status} {text}", status // 100 == 2 and \
        isinstance(stdout, str) and stdout.strip() == "1"


def _retriever(url: str, token: str, probe: Probe) -> tuple[str, str, bool]:
    body = {"queries": [probe.query], "topk": 1, "return_scores": True}
    status, text = _request(url + "/retrieve", token, body)
    answer = _json(text)
    result = answer.get("result") if isinstance(answer, dict) else None
    return f"POST /retrieve {json.dumps(body)}", f"{status} {text}", status // 100 == 2 and \
        isinstance(result, list) and len(result) == 1 and isinstance(result[0], list) and len(result[0]) >= 1


def _judge(url: str, token: str, probe: Probe) -> tuple[str, str, bool]:
    status, text = _request(url + "/v1/models", token)
    answer = _json(text)
    listed = [m.get("id") for m in answer.get("data") or [] if isinstance(m, dict)] if isinstance(answer, dict) else []
    if status // 100 != 2 or probe.model not in listed:
        return "GET /v1/models", f"{status} {text}", False
    body = {"model": probe.model, "messages": [{"role": "user", "content": "Answer with one word: ready?"}],
            "max_tokens": 8}
    status, text = _request(url + "/v1/chat/completions", token, body)
    answer = _json(text)
    choices = answer.get("choices") if isinstance(answer, dict) else None
    content = ((choices[0] or {}).get("message") or {}).get("content") if isinstance(choices, list) and choices \
        and isinstance(choices[0], dict) else None
    return f"POST /v1/chat/completions {json.dumps(body)}", f"{status} {text}", status // 100 == 2 and \
        isinstance(content, str)


def _http(url: str, token: str, probe: Probe) -> tuple[str, str, bool]:
    status, text = _request(url + (probe.path or "/"), token, probe.body if probe.method == "POST" else None)
    request = f"{probe.method} {probe.path}" + (f" {json.dumps(probe.body)}" if probe.method == "POST" else "")
    return request, f"{status} {text}", status // 100 == 2 and (probe.expect or "") in text


PROBES = {"sandbox": _sandbox, "retriever": _retriever, "judge": _judge, "http": _http}


def ready_problem(service: Service, host: str, port: int, token: str) -> str | None:
    """Why `service` is not ready yet (its readiness check once), or None."""
    if service.ready_command:
        done = subprocess.run([expand(w) for w in service.ready_command], capture_output=True, text=True,
                              timeout=SERVICE_REQUEST_TIMEOUT)
        return None if done.returncode == 0 else f"its ready command exited {done.returncode}"
    if service.ready_http:
        status, text = _request(f"http://{host}:{port}{service.ready_http}", token)
        return None if status // 100 == 2 else f"GET {service.ready_http} answered {status or text}"
    refused = connect_problem(host, port)
    return refused and f"nothing accepts a connection at {host}:{port} ({refused})"


def connect_problem(host: str, port: int) -> str | None:
    """Why a connection to host:port failed (one try), or None where it was accepted."""
    try:
        socket.create_connection((host, port), timeout=5).close()
        return None
    except OSError as exc:
        return str(exc.strerror or exc)


def probe_problem(service: Service, url: str, token: str) -> str | None:
    """Why the service's contract probe failed (the request and the answer), or None."""
    if service.probe is None:
        return None
    request, answer, ok = PROBES[service.probe.kind](url, token, service.probe)
    if ok:
        return None
    shown = answer if len(answer) <= 300 else answer[:300] + "..."
    return f"failed its {service.probe.kind} probe: {request} answered {shown}"


def _listening(table_rows: list[list[str]]) -> dict[str, int]:
    """{socket inode: port} of the LISTEN rows (state 0A) of /proc/net/tcp-style rows."""
    return {row[9]: int(row[1].partition(":")[2], 16) for row in table_rows if len(row) > 9 and row[3] == "0A"}


def listening_ports(session: int) -> list[int]:
    """The ports that the processes of one session (a service's process group, started with a session of its own)
    listen on, as the kernel's tables say: where a service listens when it is not on the port verlc gave it."""
    sockets: dict[str, int] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as fh:
                sockets.update(_listening([line.split() for line in fh.readlines()[1:]]))
        except OSError:
            continue
    ports = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
                fields = fh.read().rpartition(")")[2].split()
            if int(fields[3]) != session:  # after the command's name: state, ppid, pgrp, session
                continue
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in sockets:
                    ports.add(sockets[target[8:-1]])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile, or not ours to read
    return sorted(ports)


def open_to_all(port: int) -> bool:
    """Whether a socket of this node's network listens on `port` on every interface (0.0.0.0 or ::), as the
    kernel's tables say."""
    for table, anywhere in (("/proc/net/tcp", "0" * 8), ("/proc/net/tcp6", "0" * 32)):
        try:
            with open(table, encoding="ascii") as fh:
                rows = [line.split() for line in fh.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            address, _, hex_port = row[1].partition(":")
            if row[3] == "0A" and address == anywhere and int(hex_port, 16) == port:  # 0A: LISTEN
                return True
    return False


def exposure_problem(service: Service, port: int) -> str | None:
    """Why a service that should listen privately does not (it listens on every interface), or None."""
    if service.listen_all or not open_to_all(port):
        return None
    return (f"listens on every interface of its node (port {port}), where anyone who reaches the node reaches it: "
            f"bind it to ${{services.{service.name}.host}}, or set services.{service.name}.listen: all")
