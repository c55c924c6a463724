"""`verlc import --service SCRIPT`: a script that starts a server for the trainer (an LLM judge or a user simulator
served by vLLM or SGLang's OpenAI-compatible server), as one of the spec's `services:`, and the trainer's settings
that name the server's address wired to it (`${services.NAME.url}`).

Input: the commands the server script started, recorded by the sandbox's stand-ins as for the trainer's script
(compiler/import_script.py). The server's own host and port become the service's (verlc picks the port from the
job's block, the host is the node's private address); its readiness is the server's /health, its probe a chat
request to the model it serves. What the spec cannot hold (the script's choice of GPUs, a server listening on
every interface, a trainer variable naming the server's address) is written into the spec's header with its
line in the script, never dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

from .services import engine_server
from .diagnostics import Diagnostic
from .import_script import _PYTHON, _SHELL_ENV, SECRET, Call, Imported, ImportFailed, locate
from .verl.hydra import service_variable

# The servers it knows, by the words after the program that start them (python3 -m MODULE, vllm serve): the
# option naming the model (`vllm serve` also takes it as its first argument), the option naming what /v1/models
# lists.
SERVERS = {
    ("-m", "vllm.entrypoints.openai.api_server"): ("--model", "--served-model-name"),
    ("serve",): ("--model", "--served-model-name"),  # `vllm serve MODEL`
    ("-m", "sglang.launch_server"): ("--model-path", "--served-model-name"),
}
READY_PATH = "/health"  # vLLM's and SGLang's OpenAI servers both answer it once the model is loaded
READY_DEADLINE = "15m"  # a model's load: minutes for a large one
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0")


@dataclass(frozen=True)
class Server:
    """A server the script starts: its argv (with ${services.NAME.host/port} for its own), its environment as the
    script set it, its address as the script had it, the model it serves, and what the spec cannot hold."""
    name: str
    argv: tuple[str, ...]
    env: dict[str, str]
    host: str
    port: str
    model: str
    line: int
    left: tuple[str, ...]


def find_server(calls: tuple[Call, ...], base_env: dict[str, str], shown: str, text: str) -> Server:
    """The first server the script started; ImportFailed naming what it started instead."""
    for i, call in enumerate(calls):
        words = _server_words(call)
        if words is not None:
            server = _server(call, words, base_env, text)
            # every other call: one started in the background may be recorded after the loop that waits for it
            return replace(server, left=server.left + tuple(_waits(calls[:i] + calls[i + 1:], server, text)))
    started = ", ".join(dict.fromkeys(" ".join(c.argv[:3]) for c in calls)) or "nothing verlc records"
    raise ImportFailed([Diagnostic(shown, 1, 1, "script", f"no server verlc knows is started here (vLLM's "
                                                          f"`vllm serve` or `python -m vllm.entrypoints.openai."
                                                          f"api_server`, `python -m sglang.launch_server`); the "
                                                          f"script started: {started}")])


# What a script waits for its server with (the sandbox's stand-ins: each answers at once)
_WAITERS = ("curl", "wget", "nc")


def _waits(others: tuple[Call, ...], server: Server, text: str) -> Iterator[str]:
    """A loop of the script's that waits for its own server to answer: verlc's readiness does that instead."""
    for call in others:
        if call.tool in _WAITERS and any(server.port in word for word in call.argv[1:]):
            line = locate(text, call.tool, call.argv[-1])[0]
            yield (f"line {line}: `{' '.join((call.tool, *call.argv[1:]))}`: the script waits for its own server; "
                   f"verlc does that (services.{server.name}.ready: GET {READY_PATH} until ready.deadline, "
                   f"{READY_DEADLINE} here), so the loop is left out; change ready if the server answers elsewhere")
            return


def _server_words(call: Call) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(the words that start the server, its arguments) where `call` starts one verlc knows."""
    argv = (call.tool, *call.argv[1:])
    if call.tool == "vllm" and argv[1:2] == ("serve",):
        return argv[:2], argv[2:]
    if _PYTHON.fullmatch(call.tool) and tuple(argv[1:3]) in SERVERS:
        return argv[:3], argv[3:]
    return None


def _option(args: tuple[str, ...], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE`."""
    for i, word in enumerate(args):
        if word == name and i + 1 < len(args):
            return args[i + 1]
        if word.startswith(name + "="):
            return word.partition("=")[2]
    return None


def _server(call: Call, words: tuple[tuple[str, ...], tuple[str, ...]], base_env: dict[str, str],
            text: str) -> Server:
    start, args = words
    model_option, served_option = SERVERS[start[1:]]
    positional = args[0] if start[0] == "vllm" and args and not args[0].startswith("-") else None
    listed = _option(args, served_option) or _option(args, model_option) or positional or ""
    name = _service_name(listed)
    line = locate(text, " ".join(start[1:]), start[-1])[0]
    left = []
    out: list[str] = [start[0] if start[0] == "vllm" else "python3", *start[1:]]
    skip = 0
    host, port, given = "127.0.0.1", "", set()
    for i, word in enumerate(args):
        if skip:
            skip -= 1
            continue
        option, eq, value = word.partition("=")
        if option in ("--host", "--port"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            skip = 0 if eq else 1
            if option == "--host":
                host = value
            else:
                port = value
            given.add(option)
            out += [option, f"${{services.{name}.{option[2:]}}}"]
            continue
        out.append(word)
    for option in ("--port", "--host"):  # the server's defaults (8000, every interface) are never the service's
        if option not in given:
            out += [option, f"${{services.{name}.{option[2:]}}}"]
    port = port or "8000"
    if host == "0.0.0.0":
        left.append(f"line {line}: --host 0.0.0.0: the service listens on its node's own address (services.{name}."
                    f"listen: private; `all` opens every interface)")
    env = {}
    for key, value in sorted(call.env.items()):
        if key in _SHELL_ENV or base_env.get(key) == value or SECRET.search(key):
            continue
        if key in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
            share = _option(args, "--gpu-memory-utilization") or _option(args, "--mem-fraction-static")
            left.append(f"line {locate(text, key + '=')[0]}: {key}={value}: the server's own GPUs. verlc runs the "
                        f"service on the head node beside the trainer, in the same GPUs: set services.{name}."
                        "gpu_memory to its share of a GPU's memory" + (f" ({share} here)" if share else "")
                        + " and lower it and the rollout's gpu_memory_utilization until both fit (the build "
                        "checks), or run it elsewhere")
            continue
        env[key] = value.replace("$", "$$") if "${" in value else value
    return Server(name, tuple(out), env, host, port, listed, line, tuple(left))


def _service_name(listed: str) -> str:
    """A service name from the model the server lists: its last path part, as a spec's service name."""
    word = re.sub(r"[^a-z0-9_]+", "_", PurePosixPath(listed).name.lower()).strip("_") if listed else ""
    word = word if word[:1].isalpha() else f"server_{word}".rstrip("_")
    return word[:32].rstrip("_") or "server"


def add_service(imported: Imported, server: Server, shown: str, text: str) -> list[str]:
    """The server (from script `shown`) as one of the spec's services, and every verl setting of the trainer's
    (script text `text`) that names its address wired to `${services.NAME.url}`; the notes on it."""
    spec = imported.spec
    services = spec.setdefault("services", {})
    name = server.name
    while name in services:
        name = f"{name}_2"[:32]
    argv = tuple(w.replace(f"${{services.{server.name}.", f"${{services.{name}.") for w in server.argv)
    # the share of each GPU the server takes beside the trainer: its flag, else its engine's default (the build
    # checks it with the rollout's)
    engine = engine_server(argv)
    share = engine.share if engine is not None else None
    services[name] = {"command": list(argv), **({"env": server.env} if server.env else {}),
                      **({"gpu_memory": share} if share is not None else {}),
                      "ready": {"http": READY_PATH, "deadline": READY_DEADLINE},
                      "probe": {"kind": "judge", "model": server.model}}
    imported.left += [f"{shown}: {item}" for item in server.left]
    if engine is not None and engine.given is None:
        imported.left.append(f"{shown}:{server.line}: the server passes no {engine.flag}: {engine.engine} then takes "
                             + (f"{engine.default:g} of each GPU (written as services.{name}.gpu_memory; pass "
                                f"{engine.flag} with a share that fits beside the rollout's)"
                                if engine.default is not None else
                                f"a share it sizes itself; pass {engine.flag} and set services.{name}.gpu_memory to "
                                f"it"))
    addresses = [f"http://{host}:{server.port}" for host in dict.fromkeys((server.host, *LOCAL_HOSTS))]
    wired = list(_wire(spec.get("verl"), addresses, f"${{services.{name}.url}}", "verl"))
    variable = service_variable(name, "url")
    for key, value in list((spec.get("env") or {}).items()):  # the job's env is set before the service has one
        if any(value == a or value.startswith(a + "/") for a in addresses):
            del spec["env"][key]
            suffix = value[len(next(a for a in addresses if value.startswith(a))):]
            imported.left.append(f"line {locate(text, key + '=')[0]}: export {key}={value}: the server's address, "
                                 f"which a spec's env cannot hold (it is set on every node before the service has "
                                 f"one): the trainer's processes have {variable} (http://HOST:PORT), and {key} was "
                                 + (f"it followed by {suffix}" if suffix else "it") + f": read it where the code "
                                 f"reads {key}")
            wired.append(f"env.{key} (left: read {variable})")
    if spec.get("env") == {}:
        del spec["env"]
    notes = [f"{shown}:{server.line}: the server, as service {name} (ready at {READY_PATH} within "
             f"{READY_DEADLINE}, then a chat request to {server.model}); the trainer's "
             + (", ".join(wired) + " named its address" if wired else
                f"settings name no http://HOST:{server.port}: wire it with ${{services.{name}.url}} by hand")]
    return notes


def _wire(node: Any, addresses: list[str], url: str, path: str) -> Iterator[str]:
    """Every string in the mappings under `node` that starts with one of `addresses`, given `url` in its place:
    their paths (below `path`)."""
    if not isinstance(node, dict):
        return
    for key, value in node.items():
        if not isinstance(value, str):
            yield from _wire(value, addresses, url, f"{path}.{key}")
            continue
        address = next((a for a in addresses if value == a or value.startswith(a + "/")), None)
        if address:
            node[key] = url + value[len(address):]
            yield f"{path}.{key}"
