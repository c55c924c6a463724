"""Read a spec file: YAML 1.2 (ruamel.yaml), duplicate keys rejected, every value's position kept."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarbool import ScalarBoolean

from .diagnostics import Diagnostic, SpecError, dotted

# A spec is a page of settings; anything this large is a mistake, not a spec.
MAX_SPEC_BYTES = 1 << 20


@dataclass(frozen=True)
class Sourced:
    """A loaded spec: plain Python values plus the YAML tree that knows where each came from."""

    file: str  # as shown in diagnostics
    data: dict[str, Any]
    tree: CommentedMap
    sha256: str

    def position(self, loc: Sequence[str | int], *, at_key: bool = False) -> tuple[int, int]:
        """1-based (line, col) of the value at `loc`, or of its key when `at_key`.

        A location that does not exist in the file (a missing field) points at the nearest parent.
        """
        node: Any = self.tree
        best = (1, 1)
        for i, part in enumerate(loc):
            last = i == len(loc) - 1
            if isinstance(node, CommentedMap) and part in node:
                line, col = node.lc.key(part) if (last and at_key) else node.lc.value(part)
                best = (line + 1, col + 1)
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                line, col = node.lc.item(part)
                best = (line + 1, col + 1)
                node = node[part]
            elif isinstance(node, CommentedMap):
                # pydantic adds union tags (e.g. 'docker') to locations; they are not in the file.
                continue
            else:
                break
        return best

    def diagnostic(self, loc: Sequence[str | int], message: str, *, at_key: bool = False) -> Diagnostic:
        line, col = self.position(loc, at_key=at_key)
        return Diagnostic(self.file, line, col, dotted(loc), message)


def load(path: Path, display: str | None = None) -> Sourced:
    """Load one spec file or raise SpecError with a positioned message."""
    shown = display or str(path)

    def fail(message: str, line: int = 1, col: int = 1) -> SpecError:
        return SpecError([Diagnostic(shown, line, col, "", message)])

    try:
        raw = path.read_bytes()
    except IsADirectoryError:
        raise fail("is a directory, not a spec file") from None
    except FileNotFoundError:
        raise fail("no such file") from None
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise fail(f"file is {len(raw)} bytes; a spec must be under {MAX_SPEC_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise fail(f"not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})", line) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise fail("contains a NUL byte; a spec is text", line)

    yaml = YAML(typ="rt")  # round-trip keeps line/column; YAML 1.2 by default
    yaml.allow_duplicate_keys = False
    try:
        tree = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        raise fail(f"invalid YAML: {problem}", line, col) from None
    except YAMLError as exc:  # errors without a position
        raise fail(f"invalid YAML: {' '.join(str(exc).split())}") from None

    if tree is None:
        raise fail("empty file; a spec is a YAML mapping with at least `name:`")
    if not isinstance(tree, CommentedMap):
        raise fail(f"a spec is a YAML mapping, not a {_kind(tree)}")

    problems: list[Diagnostic] = []
    data = _plain(tree, (), shown, problems)
    if problems:
        raise SpecError(problems)
    return Sourced(shown, data, tree, hashlib.sha256(raw).hexdigest())


def _kind(value: Any) -> str:
    return "list" if isinstance(value, list) else type(value).__name__


def _plain(node: Any, loc: tuple[str | int, ...], file: str, problems: list[Diagnostic]) -> Any:
    """ruamel's round-trip types -> plain dict/list/str/int/float/bool/None, reporting odd keys and tags."""
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            if not isinstance(key, str):
                line, col = node.lc.key(key)
                problems.append(Diagnostic(file, line + 1, col + 1, dotted(loc),
                                           f"keys must be strings, got {key!r}"))
                continue
            out[key] = _plain(node[key], (*loc, key), file, problems)
        return out
    if isinstance(node, CommentedSeq):
        return [_plain(item, (*loc, i), file, problems) for i, item in enumerate(node)]
    if isinstance(node, ScalarBoolean):  # an int subclass in ruamel
        return bool(node)
    if node is None or isinstance(node, bool):
        return node
    for kind in (str, int, float):
        if isinstance(node, kind):
            return kind(node)
    problems.append(Diagnostic(file, 1, 1, dotted(loc),
                               f"unsupported YAML value of type {type(node).__name__}; quote it"))
    return None
