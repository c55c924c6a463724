"""The one Jinja environment of verlc: strict, and unable to print a value that no filter rendered.

Every `{{ ... }}` must end in one of the filters below. `finalize` rejects anything else, so a raw
spec string cannot reach a generated file by accident: forgetting `| sh` fails the build.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterable
from functools import cache
from importlib import resources
from typing import Any

import jinja2

from ..compiler.ir import Var, Word


class Rendered(str):
    """Text that went through an output-language filter."""


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DIRECTIVE = re.compile(r"--[a-z-]+(=[A-Za-z0-9_.,:%@+=/\[\]{}~*&|()!-]+)?")  # sbatch reads #SBATCH lines: no shell


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


# How templates are parsed; also part of the compiled-template cache's key.
_SYNTAX: dict[str, Any] = dict(
    keep_trailing_newline=True,
    trim_blocks=True,
    lstrip_blocks=True,
    autoescape=False,
    # `{#` is everyday bash (`${#array[@]}`), so template comments use `{##` ... `##}`.
    comment_start_string="{##",
    comment_end_string="##}",
)


class _PycacheBytecode(jinja2.BytecodeCache):
    """Compiled templates kept in the package's `__pycache__`, beside its compiled modules, as Python
    keeps those: compiling sbatch.sh.j2 costs more than rendering every target. Jinja rejects an entry
    whose template source or Python version differs; the file name carries Jinja's version and the
    syntax above. Like Python, it writes nothing when PYTHONDONTWRITEBYTECODE is set, and where the
    folder cannot be written, templates are compiled in every run."""

    def __init__(self, package: str) -> None:
        self.folder = os.path.join(str(resources.files(package)), "__pycache__")
        settings = repr((jinja2.__version__, sorted(_SYNTAX.items()), _finalize.__qualname__))
        self.tag = hashlib.sha256(settings.encode()).hexdigest()[:12]

    def _path(self, bucket: jinja2.bccache.Bucket) -> str:
        return os.path.join(self.folder, f"{bucket.key[:20]}.jinja-{self.tag}.cache")

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            with open(self._path(bucket), "rb") as f:
                bucket.load_bytecode(f)
        except OSError:
            pass

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        if sys.dont_write_bytecode:
            return
        try:
            os.makedirs(self.folder, exist_ok=True)
            with tempfile.NamedTemporaryFile("wb", dir=self.folder, suffix=".tmp", delete=False) as f:
                bucket.write_bytecode(f)
            os.replace(f.name, self._path(bucket))  # whole files only, even with two builds at once
        except OSError:
            pass


@cache
def environment(package: str) -> jinja2.Environment:
    """The strict environment for one target's templates (built once: it caches compiled templates)."""
    env = jinja2.Environment(loader=jinja2.PackageLoader(package, "."), undefined=jinja2.StrictUndefined,
                             finalize=_finalize, bytecode_cache=_PycacheBytecode(package), **_SYNTAX)
    env.filters.clear()  # no escape hatches such as |string or |join: only the filters below
    env.filters.update(sh=sh, argv=argv, name=name, directive=directive, comment=comment,
                       heredoc=heredoc, tojson=tojson)
    return env
