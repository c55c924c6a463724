"""The one Jinja environment of verlc: strict, and unable to print a value that no filter rendered.

Every `{{ ... }}` must end in one of the filters below. `finalize` rejects anything else, so a raw
spec string cannot reach a generated file by accident: forgetting `| sh` fails the build.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable
from functools import cache
from typing import Any

import jinja2

from ..compiler.ir import Var, Word


class Rendered(str):
    """Text that went through an output-language filter."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIRECTIVE = re.compile(r"--[a-z-]+(=[A-Za-z0-9_.,:%@+=/\[\]{}~-]+)?")


def _literal(text: str) -> str:
    """Literal text as shell: single quotes, or, when it holds a `$` meant for a later reader (verl's
    `${oc.env:X}`), double quotes with every special character escaped (shellcheck reads that as intended)."""
    if "$" in text or "`" in text:
        return '"' + re.sub(r'([\\"$`])', r"\\\1", text) + '"'
    return shlex.quote(text)


def sh(value: Any) -> Rendered:
    """One shell word: literals quoted, variable references double-quoted."""
    if isinstance(value, bool) or not isinstance(value, (str, int, Word)):
        raise TypeError(f"sh: cannot quote {type(value).__name__}")
    if isinstance(value, int):
        return Rendered(str(value))
    if isinstance(value, str):
        return Rendered(_literal(value))
    if not value.parts:
        return Rendered("''")
    return Rendered("".join(f'"${{{p.name}}}"' if isinstance(p, Var) else _literal(p) for p in value.parts))


def argv(values: Iterable[Any]) -> Rendered:
    """Several shell words on one line."""
    return Rendered(" ".join(sh(v) for v in values))


def name(value: Any) -> Rendered:
    """A shell or environment variable name, checked, unquoted."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError(f"name: {value!r} is not a variable name")
    return Rendered(value)


def directive(value: Any) -> Rendered:
    """An `#SBATCH --option=value` argument: sbatch splits these on white space, so none is allowed."""
    if not isinstance(value, str) or not _DIRECTIVE.fullmatch(value):
        raise ValueError(f"directive: {value!r} is not a safe sbatch option")
    return Rendered(value)


def comment(value: Any) -> Rendered:
    """Text for a `#` comment line: one line, no control characters."""
    text = str(value)
    if any(ord(c) < 32 for c in text):
        raise ValueError(f"comment: {text!r} spans lines")
    return Rendered(text)


def heredoc(value: Any, delimiter: str) -> Rendered:
    """Static text for a quoted here-document; refuses text containing the delimiter line."""
    text = str(value)
    if delimiter in text.splitlines():
        raise ValueError(f"heredoc: text contains the delimiter {delimiter}")
    return Rendered(text.rstrip("\n"))


def tojson(value: Any) -> Rendered:
    return Rendered(json.dumps(value, ensure_ascii=False, sort_keys=True))


def _finalize(value: Any) -> Any:
    if isinstance(value, Rendered):
        return value
    raise TypeError(f"template printed {value!r} without an output filter (sh, argv, name, ...)")


@cache
def environment(package: str) -> jinja2.Environment:
    """The strict environment for one target's templates (built once: it caches compiled templates)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader(package, "."),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        finalize=_finalize,
        # `{#` is everyday bash (`${#array[@]}`), so template comments use `{##` ... `##}`.
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters.clear()  # no escape hatches such as |string or |join: only the filters below
    env.filters.update(sh=sh, argv=argv, name=name, directive=directive, comment=comment,
                       heredoc=heredoc, tojson=tojson)
    return env
