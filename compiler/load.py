"""Read a spec file: YAML 1.2 (ruamel.yaml), duplicate keys rejected, every value's position kept."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
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
    """A loaded spec: plain Python values, plus the YAML trees that know where each value came from.

    `layers` runs from the furthest base (`extends:`) to the spec itself; a value's position is
    taken from the last layer that sets it.
    """

    file: str  # the spec itself, as shown in diagnostics
    data: dict[str, Any]
    layers: tuple[tuple[str, CommentedMap], ...]
    sha256: str
    stage: str | None = None  # one stage of a pipeline: its own settings are the last layer (compiler/stages.py)

    def _found(self, loc: Sequence[str | int], at_key: bool) -> tuple[str, int, int, int]:
        """(file, line, col, layer index) of the deepest match of `loc`, the last layer first."""
        best = (-1, self.file, 1, 1, len(self.layers) - 1)
        for index in reversed(range(len(self.layers))):
            shown, tree = self.layers[index]
            depth, (line, col) = _walk(tree, loc, at_key)
            if depth > best[0]:
                best = (depth, shown, line, col, index)
        return best[1:]

    def locate(self, loc: Sequence[str | int], *, at_key: bool = False) -> tuple[str, int, int]:
        """(file, line, col), 1-based, of the value at `loc` (of its key when `at_key`).

        A location that is in no file (a missing field) points at the nearest parent that is.
        """
        return self._found(loc, at_key)[:3]

    def position(self, loc: Sequence[str | int], *, at_key: bool = False) -> tuple[int, int]:
        _, line, col = self.locate(loc, at_key=at_key)
        return line, col

    def diagnostic(self, loc: Sequence[str | int], message: str, *, at_key: bool = False) -> Diagnostic:
        """A problem at `loc`; in a stage's own settings, its path is the stage's (stages.NAME.verl...)."""
        file, line, col, index = self._found(loc, at_key)
        own = self.stage is not None and index == len(self.layers) - 1
        return Diagnostic(file, line, col, dotted(("stages", self.stage, *loc) if own else loc), message)


def _walk(tree: CommentedMap, loc: Sequence[str | int], at_key: bool) -> tuple[int, tuple[int, int]]:
    """How many parts of `loc` this tree has, and the position of the deepest one."""
    node: Any = tree
    best, depth = (1, 1), 0
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, CommentedMap) and part in node:
            line, col = node.lc.key(part) if (last and at_key) else node.lc.value(part)
        elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
            line, col = node.lc.item(part)
        elif isinstance(node, CommentedMap):
            continue  # pydantic adds union tags (e.g. 'docker') to locations; they are not in the file
        else:
            break
        best, depth, node = (line + 1, col + 1), depth + 1, node[part]
    return depth, best


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`: mappings merge key by key; lists and scalars are replaced whole."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load(path: Path, display: str | None = None, _chain: tuple[Path, ...] = (),
         texts: Mapping[Path, str] | None = None) -> Sourced:
    """Load one spec file (and the bases it `extends:`), or raise SpecError with positioned messages.

    `texts` stands in for files by resolved path (`verlc migrate` checks its rewrite before writing it)."""
    shown = display or str(path)
    texts = texts or {}
    tree, raw = read_yaml(path, shown, texts, "a spec", "`name:`")
    problems: list[Diagnostic] = []
    data = plain(tree, (), shown, problems)
    if problems:
        raise SpecError(problems)
    if data.get("extends", ...) is None:  # `extends: null` extends nothing
        del data["extends"]
    own = Sourced(shown, data, ((shown, tree),), hashlib.sha256(raw).hexdigest())
    if "extends" not in data:
        return own
    return _extend(path, own, _chain, texts)


def read_yaml(path: Path, shown: str, texts: Mapping[Path, str], what: str, needs: str,
              ) -> tuple[CommentedMap, bytes]:
    """A YAML mapping file (a spec, a profiles file) as ruamel's tree, and its bytes; SpecError otherwise."""
    def fail(message: str, line: int = 1, col: int = 1) -> SpecError:
        return SpecError([Diagnostic(shown, line, col, "", message)])

    try:
        raw = texts[path.resolve()].encode() if path.resolve() in texts else path.read_bytes()
    except IsADirectoryError:
        raise fail(f"is a directory, not {what} file") from None
    except FileNotFoundError:
        raise fail("no such file") from None
    except OSError as exc:
        raise fail(f"cannot read: {exc.strerror}") from None
    if len(raw) > MAX_SPEC_BYTES:
        raise fail(f"file is {len(raw)} bytes; {what} must be under {MAX_SPEC_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise fail(f"not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start})", line) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise fail(f"contains a NUL byte; {what} is text", line)

    yaml = YAML(typ="rt")  # round-trip keeps line/column; YAML 1.2 by default
    yaml.allow_duplicate_keys = False
    try:
        tree = yaml.load(text)
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = " ".join(str(exc.problem or exc.context or "invalid YAML").split())
        if exc.context_mark and exc.problem_mark and "flow" in str(exc.context or ""):
            # An unclosed `[` or `{` is found lines later: point at the bracket, name where parsing stopped.
            opened = "[" if "sequence" in str(exc.context) else "{"
            problem = (f"this '{opened}' is not closed where it should be: {problem} "
                       f"(line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1})")
            mark = exc.context_mark
        line, col = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise fail(f"invalid YAML: {problem}", line, col) from None
    except YAMLError as exc:  # errors without a position
        raise fail(f"invalid YAML: {' '.join(str(exc).split())}") from None

    if tree is None:
        raise fail(f"empty file; {what} is a YAML mapping with at least {needs}")
    if not isinstance(tree, CommentedMap):
        raise fail(f"{what} is a YAML mapping, not a {_kind(tree)}")
    return tree, raw


def _extend(path: Path, own: Sourced, chain: tuple[Path, ...], texts: Mapping[Path, str]) -> Sourced:
    """The spec on top of its bases, in the order `extends:` lists them."""
    refs = own.data["extends"]
    refs = [refs] if isinstance(refs, str) else refs
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) for r in refs):
        raise SpecError([own.diagnostic(("extends",), "extends is a spec file or a list of them")])
    here = path.resolve()
    data: dict[str, Any] = {}
    layers: list[tuple[str, CommentedMap]] = []
    digest = hashlib.sha256()
    for i, ref in enumerate(refs):
        loc = ("extends",) if isinstance(own.data["extends"], str) else ("extends", i)
        base_path = path.parent / ref
        if base_path.resolve() in (*chain, here):
            names = " -> ".join(p.name for p in (*chain, here, base_path.resolve()))
            raise SpecError([own.diagnostic(loc, f"extends cycle: {names}")])
        if not base_path.is_file() and base_path.resolve() not in texts:
            raise SpecError([own.diagnostic(loc, f"extends {ref}: no such spec file")])
        base = load(base_path, os.path.normpath(os.path.join(os.path.dirname(own.file), ref)), (*chain, here), texts)
        data = merge(data, base.data)
        layers += base.layers
        digest.update(base.sha256.encode())
    data = merge(data, {k: v for k, v in own.data.items() if k != "extends"})
    digest.update(own.sha256.encode())
    return Sourced(own.file, data, (*layers, *own.layers), digest.hexdigest())


def _kind(value: Any) -> str:
    return "list" if isinstance(value, list) else type(value).__name__


def plain(node: Any, loc: tuple[str | int, ...], file: str, problems: list[Diagnostic]) -> Any:
    """ruamel's round-trip types -> plain dict/list/str/int/float/bool/None, reporting odd keys and tags."""
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            if not isinstance(key, str):
                line, col = node.lc.key(key)
                problems.append(Diagnostic(file, line + 1, col + 1, dotted(loc),
                                           f"keys must be strings, got {key!r}"))
                continue
            out[key] = plain(node[key], (*loc, key), file, problems)
        return out
    if isinstance(node, CommentedSeq):
        return [plain(item, (*loc, i), file, problems) for i, item in enumerate(node)]
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
