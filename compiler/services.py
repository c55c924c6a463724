"""Services beside the trainer, before lowering: where a spec refers to one (`${services.NAME.url}`), and what
the job gets for it. The runtime (runtime/services.py) starts them, sets the variables named here, and watches them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from .derive import TOOL_CONFIG_KEY, has_key
from .diagnostics import Diagnostic, did_you_mean
from .ir import ProbeIR, ServiceIR, Word, parse_word
from .load import Sourced
from .overrides import verl_values
from .spec import Spec
from .verl import loadable
from .verl.check import NOTE, Selection
from .verl.hydra import SERVICE_ATTRIBUTES, SERVICE_REFERENCE, service_variable, verl_value
from .verl.program import TORCHRUN
from .verl.rules import Config


def reference_problem(body: str, services: dict[str, Any]) -> str | None:
    """Why `${services.BODY}` names no service attribute of the spec, or None."""
    name, _, attribute = body.partition(".")
    if name not in services:
        known = f"the spec's services are {', '.join(sorted(services))}" if services else "the spec has no services:"
        return f"'${{services.{body}}}': no service '{name}'{did_you_mean(name, services)}; {known}"
    if attribute not in SERVICE_ATTRIBUTES:
        return (f"'${{services.{body}}}': a service has {', '.join(SERVICE_ATTRIBUTES)}"
                f"{did_you_mean(attribute, SERVICE_ATTRIBUTES)}")
    return None


def _strings(value: Any, loc: tuple[str | int, ...]) -> Iterator[tuple[tuple[str | int, ...], str]]:
    if isinstance(value, str):
        yield loc, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, (*loc, i))
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, (*loc, k))


def _service_words(name: str, service: Any) -> list[tuple[tuple[str | int, ...], str]]:
    """The strings of a service that are words of the node (its command, env and readiness command), with
    where each is in the spec."""
    at = ("services", name)
    return [*_strings(list(service.command), (*at, "command")), *_strings(dict(service.env), (*at, "env")),
            *_strings(list(service.ready.command or ()), (*at, "ready", "command"))]


def check_references(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    """Every `${services.NAME.ATTR}` in verl's settings and in the services' commands, env and readiness
    commands names a service of the spec and one of its attributes; the job's env cannot hold one (its values
    are set on every node before any service has an address)."""
    places = list(_strings(spec.verl, ("verl",))) + list(_strings(spec.tool_config or {}, ("tool_config",)))
    for name, service in spec.services.items():
        places += _service_words(name, service)
    for loc, text in places:
        for match in SERVICE_REFERENCE.finditer(text):
            problem = reference_problem(match[1], spec.services)
            if problem:
                yield sourced.diagnostic(loc, problem)
            elif loc[0] == "verl" and match[1].endswith(".token"):
                name = match[1].split(".")[0]
                yield sourced.diagnostic(loc, f"{NOTE}verl prints its config, resolved, as it starts: each run's "
                                              f"token of '{name}' will be in the job's log; code of the run (a "
                                              f"reward function, a tool) can read "
                                              f"{service_variable(name, 'token')} from its environment instead")
    for name, value in spec.env.items():
        if SERVICE_REFERENCE.search(value):
            yield sourced.diagnostic(("env", name), "env is set on every node before any service has an address: "
                                                    "the trainer's processes have VERLC_SERVICE_<NAME>_URL (and "
                                                    "_HOST, _PORT, _TOKEN) instead; verl's settings take "
                                                    "${services.NAME.url}")
    for name, service in spec.services.items():
        if service.listen == "all":
            yield sourced.diagnostic(("services", name, "listen"),
                                     f"{NOTE}services.{name} listens on every interface of its node: anyone who "
                                     f"reaches the node reaches it", at_key=True)


# A word that says which port a server listens on, followed by the port (or `--port=PORT`)
_PORT_FLAGS = ("--port", "-p", "--listen-port", "--http-port", "--server-port")
# An address written by hand: scheme, host, port
_FIXED_ADDRESS = re.compile(r"\bhttps?://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\]|[A-Za-z0-9.-]+):[0-9]{2,5}\b")


def wiring_problems(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    """How a service's command and the trainer's settings reach it: a command that never reads its own port (verlc
    probes that port until the deadline), one that listens on another service's port, a command written as one
    string (argv[0] would be the whole line), `https://` before a service's address (services speak plain HTTP),
    and, where the spec has services, an address written by hand in verl's settings or the tool config."""
    for name, s in spec.services.items():
        at = ("services", name)
        if not s.command:
            continue  # an image of its own: the target gives it its port
        if " " in s.command[0].strip():
            yield sourced.diagnostic((*at, "command", 0), (
                f"{s.command[0]!r} is one word with spaces: a command is a list of words (argv), each its own item; "
                f"write {s.command[0].split()!r} + the rest"))
        words = [*s.command, *s.env.values()]
        own = {m[1].partition(".")[2] for w in words for m in SERVICE_REFERENCE.finditer(w)
               if m[1].partition(".")[0] == name}
        # (a misspelt attribute of its own, `${services.NAME.prot}`, is said once, by check_references)
        if not own & {"port", "url"} and own <= set(SERVICE_ATTRIBUTES) \
                and (s.probe is not None or s.ready.command is None):
            yield sourced.diagnostic((*at, "command"), (
                f"services.{name} never reads ${{services.{name}.port}}: verlc gives it a port of the job's own and "
                f"checks that one until ready.deadline, while a port written in its command is another. Pass "
                f"${{services.{name}.port}} (or its url) where the server takes its port"))
        for i, word in enumerate(s.command):
            flag, eq, value = word.partition("=")
            j, given = (i + 1, s.command[i + 1]) if word in _PORT_FLAGS and i + 1 < len(s.command) else \
                (i, value) if eq and flag in _PORT_FLAGS else (i, "")
            other = re.fullmatch(r"\$\{services\.([a-z][a-z0-9_]*)\.port\}", given)
            if other and other[1] != name and other[1] in spec.services:
                yield sourced.diagnostic((*at, "command", j), (
                    f"services.{name} listens on services.{other[1]}'s port: two servers cannot take one port; "
                    f"give it ${{services.{name}.port}}"))
    places = list(_strings(spec.verl, ("verl",))) + list(_strings(spec.tool_config or {}, ("tool_config",)))
    for name, s in spec.services.items():
        places += _service_words(name, s)
    for loc, text in places:
        if re.search(r"https://\$\{services\.", text):
            yield sourced.diagnostic(loc, "a service speaks plain HTTP: ${services.NAME.url} is http://HOST:PORT "
                                          "already, and https:// before its host fails the TLS handshake")
        elif spec.services and loc[0] != "services" and (m := _FIXED_ADDRESS.search(text)) \
                and not SERVICE_REFERENCE.search(text):
            yield sourced.diagnostic(loc, (
                f"{NOTE}{m[0]} is an address written by hand while the spec has services ("
                f"{', '.join(spec.services)}): a service's address is known only as the job runs; "
                f"${{services.NAME.url}} gives it (the host a process on another node reaches)"))


def placement_problems(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    """A service's GPUs are held on a node of its own, within that node's; its GPU memory share is of GPUs it
    shares with the trainer; a node of its own is a Ray node, which a torchrun program (no Ray) has none of; and
    a head service, started as Ray comes up, cannot read the address of one on a node of its own (known once
    every node is up)."""
    own = {name for name, s in spec.services.items() if s.on == "own_node"}
    for name, s in spec.services.items():
        at = ("services", name)
        yield from _image_problems(name, s, sourced)
        if s.ready.http is not None and s.ready.command is not None:
            yield sourced.diagnostic((*at, "ready"), f"services.{name}.ready has both http and command: give one "
                                                     f"(a path that answers 2xx, or a command that exits 0)")
        if s.gpus is not None and s.on != "own_node":
            yield sourced.diagnostic((*at, "gpus"), f"gpus is what a service on a node of its own holds there "
                                                    f"(on: own_node); services.{name} is on: {s.on}", at_key=True)
        elif s.gpus is not None and s.gpus > spec.cluster.gpus_per_node:
            yield sourced.diagnostic((*at, "gpus"), f"a node of the job has {spec.cluster.gpus_per_node} GPUs "
                                                    f"(cluster.gpus_per_node): services.{name} cannot hold {s.gpus}")
        if s.on == "own_node" and s.gpu_memory is not None:
            yield sourced.diagnostic((*at, "gpu_memory"), "gpu_memory is a share of the GPUs a service shares with "
                                                          "the trainer: on a node of its own it shares none (its "
                                                          "own server's flag sets what it takes there)", at_key=True)
        if s.on == "own_node" and spec.program in TORCHRUN:
            yield sourced.diagnostic((*at, "on"), f"{spec.program} runs under torchrun, without Ray: a service "
                                                  f"runs on the head node or every node")
        if s.on != "head":
            continue
        for loc, text in _service_words(name, s):
            for match in SERVICE_REFERENCE.finditer(text):
                other = match[1].split(".")[0]
                if other in own:
                    yield sourced.diagnostic(loc, f"services.{other} is on a node of its own, whose address is "
                                                  f"known once every node is up, and services.{name} starts on "
                                                  f"the head node before: put {name} on every_node, or {other} "
                                                  f"on the head")


def _image_problems(name: str, s: Any, sourced: Sourced) -> Iterator[Diagnostic]:
    """A service runs a command in the job's image, or an image of its own. That image's container is the
    target's (started beside the job's container on the head node, removed with the job), not a process of
    verlc's runtime: the runtime cannot start it again, place it on other nodes, or give it GPUs."""
    at = ("services", name)
    if s.image is None:
        if not s.command:
            yield sourced.diagnostic(at, f"services.{name} runs a command in the job's image (command: [...]) "
                                         f"or an image of its own (image: ...): it has neither", at_key=True)
        return
    if s.on != "head":
        yield sourced.diagnostic((*at, "on"), f"services.{name} runs in an image of its own, whose container the "
                                              f"target starts on the head node: it cannot be on {s.on}")
    if s.restart:
        yield sourced.diagnostic((*at, "restart"), f"services.{name} runs in an image of its own, whose container "
                                                   f"the target starts once: verlc's runtime, which restarts "
                                                   f"services, cannot start it again (restart: 0)")
    if s.gpu_memory is not None:
        yield sourced.diagnostic((*at, "gpu_memory"), f"services.{name} runs in an image of its own, whose "
                                                      f"container gets no GPU: run a GPU server in the job's image",
                                 at_key=True)


ROLLOUT_MEMORY = "actor_rollout_ref.rollout.gpu_memory_utilization"
# Inference servers a service may run on the trainer's GPUs: (how a command starts one, its memory-share flag, the
# share it takes without the flag). vLLM's default gpu_memory_utilization is 0.92 in vLLM 0.24.0, the release verl
# 0.9.1 pins (vllm/config/cache.py CacheConfig; earlier releases took 0.9); SGLang sizes
# mem_fraction_static itself from the GPU's memory when the flag is missing (server_args), as if the GPU were its own.
ENGINE_SERVERS = (("vLLM", ("vllm serve", "-m vllm.entrypoints.openai.api_server"), "--gpu-memory-utilization", 0.92),
                  ("SGLang", ("-m sglang.launch_server", "sglang serve"), "--mem-fraction-static", None))


class EngineServer(NamedTuple):
    """An inference server a service's command starts: its engine, its memory-share flag, the share it takes
    without the flag, and what the command passes (a number, a word verlc cannot read, or None: no flag)."""

    engine: str
    flag: str
    default: float | None
    given: float | str | None

    @property
    def share(self) -> float | None:
        """What it takes of each GPU: the flag's number, else its default; None where verlc cannot know."""
        return None if isinstance(self.given, str) else self.given if self.given is not None else self.default

    def takes(self) -> str:
        return (f"{self.given:g} of each GPU ({self.flag} {self.given:g})" if isinstance(self.given, float) else
                f"{self.default:g} of each GPU without {self.flag} (its default)" if self.default is not None else
                f"the share it sizes itself without {self.flag}")


def engine_server(argv: tuple[str, ...]) -> EngineServer | None:
    """The inference server `argv` starts, or None."""
    line = " ".join(argv)
    for engine, starts, flag, default in ENGINE_SERVERS:
        if any(f" {s} " in f" {line} " for s in starts):
            given: float | str | None = None
            for i, word in enumerate(argv):
                if word == flag and i + 1 < len(argv):
                    given = argv[i + 1]
                elif word.startswith(flag + "="):
                    given = word.partition("=")[2]
            try:
                given = float(given) if given is not None else None
            except ValueError:
                pass
            return EngineServer(engine, flag, default, given)
    return None


def gpu_shares(spec: Spec, sourced: Sourced) -> tuple[dict[str, float], dict[str, str], list[Diagnostic]]:
    """The share of each trainer GPU's memory each service takes there (gpu_memory, else the inference server's
    flag or default), where it says; what says so; and the problems of a server whose flag and gpu_memory
    disagree or that takes its default share beside the rollout."""
    shares: dict[str, float] = {}
    said: dict[str, str] = {}
    problems = []
    for name, s in spec.services.items():
        server = engine_server(tuple(s.command)) if s.image is None and s.on != "own_node" else None
        at = ("services", name)
        if server is None or isinstance(server.given, str):  # a variable's share is known only where it runs
            if s.gpu_memory:
                shares[name], said[name] = s.gpu_memory, f"services.{name}.gpu_memory"
            continue
        if s.gpu_memory is not None and server.share != s.gpu_memory:
            problems.append(sourced.diagnostic((*at, "gpu_memory"), (
                f"services.{name} runs {server.engine}, which takes {server.takes()}, not gpu_memory's "
                f"{s.gpu_memory:g}: pass {server.flag} {s.gpu_memory:g} in its command")))
        elif server.share is None:
            problems.append(sourced.diagnostic((*at, "command"), (
                f"services.{name} runs {server.engine} on the GPUs verl's rollout uses, without {server.flag}: "
                f"{server.engine} then sizes its memory as if each GPU were its own; pass {server.flag} and the same "
                f"services.{name}.gpu_memory, with the rollout's {ROLLOUT_MEMORY}, within 1")))
        else:
            shares[name] = server.share
            said[name] = (f"services.{name}.gpu_memory" if s.gpu_memory is not None else
                          f"services.{name}: {server.engine}'s {server.flag} {server.given:g}"
                          if server.given is not None else
                          f"services.{name}: {server.engine}'s default without {server.flag}")
    return shares, said, problems


def gpu_memory_problems(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    """Services that take a share of the GPUs they share with the trainer (gpu_memory, or what the inference server
    its command starts takes: its flag, else its default) and verl's rollout (its gpu_memory_utilization of every
    GPU) must fit one GPU together on the node that has them all: the head (a service on every node is there too).
    Refused with every number where they do not (vLLM fails to start, or runs out of memory, after the model has
    loaded); a server whose flag and gpu_memory disagree too."""
    if isinstance(chosen, str):
        return
    shares, said, problems = gpu_shares(spec, sourced)
    yield from problems
    if not shares:
        return
    rollout = Config(chosen.tree, verl_values(spec, chosen)).get(ROLLOUT_MEMORY)  # the spec's, else the default
    if not isinstance(rollout, (int, float)) or isinstance(rollout, bool):
        return  # an interpolation or a type problem: verl's check says which
    taken = sum(shares.values())
    if rollout + taken > 1:
        parts = " + ".join(f"{shares[n]:g} ({said[n]})" for n in shares)
        for name in shares:
            s = spec.services[name]
            yield sourced.diagnostic(("services", name, "gpu_memory" if s.gpu_memory is not None else "command"),
                                     f"the head node's GPUs hold verl's rollout and the services: {rollout:g} "
                                     f"({ROLLOUT_MEMORY}) + {parts} = {rollout + taken:g} of a GPU's memory, more "
                                     f"than it has; lower them to fit within 1"
                                     + ("" if s.gpu_memory is not None else
                                        f" (services.{name}.gpu_memory and the server's own flag)"))


def tool_config_problems(spec: Spec, sourced: Sourced, chosen: Selection | str, code: Path | None = None
                         ) -> Iterator[Diagnostic]:
    """The tool config is verl's file: a `tools` list of mappings, each naming a class the release (or the run's
    code) has, a config.type and a tool_schema of the form the release reads (loadable.py); and the program's
    config has the key that names the file (verl 0.3 has no multi-turn tools)."""
    if spec.tool_config is None:
        return
    tools = spec.tool_config.get("tools")
    if not isinstance(tools, list) or not tools:
        yield sourced.diagnostic(("tool_config",), "verl reads a list of tools from it: tool_config: {tools: "
                                                   "[{class_name: ..., config: {...}, tool_schema: {...}}]}")
    else:
        for i, tool in enumerate(tools):
            at = ("tool_config", "tools", i)
            if not isinstance(tool, dict) or not isinstance(tool.get("class_name"), str):
                yield sourced.diagnostic(at, "a tool names its class_name (the Python class verl imports for it)")
                continue
            if isinstance(chosen, str):
                continue
            release = chosen.release
            found = loadable.name_problem(tool["class_name"], "the tool's class", release.loadable, code,
                                          release.label, loadable.releases_shipping)
            if found is not None:
                yield sourced.diagnostic((*at, "class_name"), found[0] if found[1] else NOTE + found[0])
            for path, message, refused in loadable.tool_problems(tool, release.loadable, release.label):
                yield sourced.diagnostic((*at, *path), message if refused else NOTE + message)
    if not isinstance(chosen, str) and not has_key(chosen.tree, TOOL_CONFIG_KEY):
        yield sourced.diagnostic(("tool_config",), f"{chosen.release.label}'s {chosen.config} has no "
                                                   f"{TOOL_CONFIG_KEY}: this release runs no multi-turn tools",
                                 at_key=True)


def lower_tool_config(spec: Spec) -> dict[str, Any] | None:
    """The tool config as the runtime writes it, with strings OmegaConf resolves where verl loads it (each
    ${services.NAME.ATTR} the variable the runtime sets, ${env:NAME} OmegaConf's)."""
    return None if spec.tool_config is None else verl_value(spec.tool_config)


def service_word(text: str) -> Word:
    """A word of a service's command or env: each `${services.NAME.ATTR}` the variable the runtime sets."""
    return parse_word(SERVICE_REFERENCE.sub(lambda m: "${env:" + service_variable(*m[1].split(".", 1)) + "}", text))


def word_problems(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    """The services' commands and env may read the node's env (`${env:NAME}`, ${HOME}, ~) and services'
    addresses, and nothing else that would expand."""
    for name, service in spec.services.items():
        for loc, text in _service_words(name, service):
            try:
                service_word(text)
            except ValueError as exc:
                yield sourced.diagnostic(loc, str(exc))


def lower_services(spec: Spec) -> tuple[ServiceIR, ...]:
    """The spec's services, in the spec's order, as the runtime gets them."""
    out = []
    for name, s in spec.services.items():
        p = s.probe
        probe = None if p is None else ProbeIR(
            kind=p.kind, query=getattr(p, "query", None), model=getattr(p, "model", None),
            method=getattr(p, "method", None), path=getattr(p, "path", None), body=getattr(p, "json_body", None),
            expect=getattr(p, "expect", None))
        out.append(ServiceIR(
            name=name, argv=tuple(map(service_word, s.command)),
            env=tuple((k, service_word(v)) for k, v in s.env.items()),
            image=s.image, every_node=s.on == "every_node", own_node=s.on == "own_node",
            gpus=(spec.cluster.gpus_per_node if s.gpus is None else s.gpus) if s.on == "own_node" else 0,
            listen_all=s.listen == "all",
            ready_http=s.ready.http, ready_command=tuple(map(service_word, s.ready.command or ())) or None,
            deadline=s.ready.deadline, probe=probe, restart=s.restart,
            variables=tuple((a, service_variable(name, a)) for a in SERVICE_ATTRIBUTES), gpu_memory=s.gpu_memory))
    return tuple(out)
