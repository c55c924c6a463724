"""verl's command line: Python values in Hydra's override grammar (`key=value` after main_ppo)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

# Plain Hydra values that need no quoting; anything else is single-quoted.
_BARE = re.compile(r"[A-Za-z_/.][A-Za-z0-9_./+@-]*")
# Bare words Hydra would read as something other than a string.
_NOT_A_STRING = re.compile(r"(?i)(true|false|null|[-+]?(inf|nan)|[-+]?[0-9_.]+(e[-+]?[0-9]+)?)")
KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # Hydra's ID token (verl has keys such as cuda-graph-trace)


def hydra_value(value: Any) -> str:
    """A Python value in Hydra override syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        if _BARE.fullmatch(value) and not _NOT_A_STRING.fullmatch(value):
            return value
        return _quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_key(k)}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Hydra syntax for {type(value).__name__}")


def shown(value: Any) -> str:
    """A value for a message: Hydra's syntax where it has one, else Python's (never raises)."""
    try:
        return hydra_value(value)
    except (TypeError, ValueError):
        return repr(value)


def verl_value(value: Any) -> Any:
    """verlc's `${env:NAME}` (and its ${HOME}, ${USER}) as OmegaConf's `${oc.env:NAME}`, which verl resolves on
    the node it runs on (OmegaConf would read `${HOME}` as a key of verl's config, which has none)."""
    if isinstance(value, str):
        value = SERVICE_REFERENCE.sub(lambda m: "${oc.env:" + service_variable(*m[1].split(".", 1)) + "}", value)
        return _OWN.sub(r"${oc.env:\1}", _ENV.sub("${oc.env:", value))
    if isinstance(value, list):
        return [verl_value(v) for v in value]
    if isinstance(value, dict):
        return {k: verl_value(v) for k, v in value.items()}
    return value


_ENV = re.compile(r"\$\{env:(?=[A-Za-z_])")
# `${services.NAME.ATTR}` in a spec (compiler/services.py checks each): the build turns it into the environment
# variable service_variable(NAME, ATTR), which the runtime sets where the job runs before it starts the services
# and the trainer: verl's settings get OmegaConf's ${oc.env:...} of it, a service's command and env an env part.
SERVICE_REFERENCE = re.compile(r"\$\{services\.([^{}]*)\}")
SERVICE_ATTRIBUTES = ("url", "host", "port", "token")  # token: made by the runtime for each run


def service_variable(name: str, attribute: str) -> str:
    """The environment variable that holds `${services.NAME.ATTRIBUTE}` where the job runs."""
    return f"VERLC_SERVICE_{name.upper()}_{attribute.upper()}"


_OWN = re.compile(r"\$\{(HOME|USER)\}")


# A dict value's key in Hydra's grammar: its ID, number and other unquoted characters as they are, and the
# characters that end or split a key escaped; a key Hydra would read as another type (1, 1.5, true, null) has no
# spelling as a string.
_KEY_PLAIN = re.compile(r"[A-Za-z0-9_/\-+.$%*@?|]")
_KEY_ESCAPED = frozenset("\\()[]{}:=, \t")


def _key(key: Any) -> str:
    if not isinstance(key, str) or not key or _NOT_A_STRING.fullmatch(key) \
            or any(not _KEY_PLAIN.fullmatch(c) and c not in _KEY_ESCAPED for c in key):
        raise ValueError(f"{key!r} cannot be a key in a Hydra dict value")
    return "".join("\\" + c if c in _KEY_ESCAPED else c for c in key)


def _quote(text: str) -> str:
    # Hydra's quoted strings: backslashes only escape when they precede a quote or end the string.
    out = []
    run = 0
    for ch in text:
        if ch == "\\":
            run += 1
            continue
        if ch == "'":
            out.append("\\" * (2 * run) + "\\'")
        else:
            out.append("\\" * run + ch)
        run = 0
    out.append("\\" * (2 * run))
    return "'" + "".join(out) + "'"


@dataclass(frozen=True)
class Parsed:
    """One override as Hydra's own parser reads it."""

    text: str              # as given
    key: str               # dotted key (or config group)
    prefix: str            # "", "+" or "++"
    value: Any             # Python value (list, dict, str, number, bool, None)
    package: str | None    # group@package
    sweep: bool            # a multirun sweep (a,b / range(...))
    delete: bool           # ~key


def parse(overrides: list[str]) -> list[Parsed]:
    """Parse Hydra overrides with Hydra's own grammar; ValueError with Hydra's message when one is not an
    override, RuntimeError when Hydra is not installed."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser
        from hydra.core.override_parser.types import OverrideType
        from hydra.errors import HydraException
    except ImportError:
        raise RuntimeError("reading Hydra overrides needs Hydra, which verlc's install brings and this "
                           "environment lacks: pip install hydra-core") from None
    parser = OverridesParser.create()
    out = []
    for text in overrides:
        try:
            (o,) = parser.parse_overrides([text])
        except HydraException as exc:
            raise ValueError(f"{text}: {exc}") from None
        sweep = o.is_sweep_override()
        out.append(Parsed(text, o.key_or_group, {OverrideType.ADD: "+", OverrideType.FORCE_ADD: "++"}.get(o.type, ""),
                          None if sweep or o.type == OverrideType.DEL else o.value(), o.package, sweep,
                          o.type == OverrideType.DEL))
    return out
