"""A YAML file rewritten in place: a ruamel round trip that keeps comments, key order, quoting and the
file's own indentation, with keys set, moved and deleted by path. Used by `verlc migrate`."""

from __future__ import annotations

import difflib
import io
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

# Indentation styles tried in order; the first that reproduces a file unchanged is the file's own.
_STYLES = ((2, 2, 0), (2, 4, 2), (4, 4, 2), (2, 4, 0), (4, 4, 0), (4, 6, 4), (3, 3, 0), (3, 5, 2))


class Doc:
    """One spec file for rewriting: loaded with quotes kept, dumped in the file's own indentation."""

    def __init__(self, path: Path, own: bool) -> None:
        self.path, self.own = path, own
        self.before = path.read_text(encoding="utf-8")
        self.yaml, self.tree, self.style_loss = self._style()
        self.touched = False

    def _style(self) -> tuple[YAML, CommentedMap, int]:
        best = None
        for mapping, sequence, offset in _STYLES:
            self.indent = mapping
            yaml = YAML(typ="rt")
            yaml.preserve_quotes = True
            yaml.width = 4096
            yaml.indent(mapping=mapping, sequence=sequence, offset=offset)
            tree = yaml.load(self.before)
            loss = _changed_lines(self.before, _dump(yaml, tree))
            if best is None or loss < best[2]:
                best = (yaml, tree, loss)
            if not loss:
                break
        assert best is not None
        self.indent = best[0].map_indent or 2
        return best

    def after(self) -> str:
        return _dump(self.yaml, self.tree) if self.touched else self.before

    def node(self, loc: tuple[str | int, ...]) -> tuple[Any, bool]:
        """(the value at `loc`, whether the file has it)."""
        node: Any = self.tree
        for part in loc:
            if not isinstance(node, CommentedMap) or part not in node:
                return None, False
            node = node[part]
        return node, True

    def delete(self, loc: tuple[str | int, ...]) -> tuple[Any, Any]:
        """Remove the key at `loc` and the mappings it leaves empty (never the `verl:` section itself);
        returns its value and its end-of-line comment (for put())."""
        value, _ = self.node(loc)
        parent, _ = self.node(loc[:-1])
        comment = parent.ca.items.get(loc[-1])
        for depth in range(len(loc), 1, -1):
            parent, _ = self.node(loc[:depth - 1])
            del parent[loc[depth - 1]]
            if parent or depth - 1 <= 1:
                break
        self.touched = True
        return value, comment

    def put(self, loc: tuple[str | int, ...], value: Any, comment: str = "", near: tuple[int, int] | None = None,
            carried: Any = None) -> None:
        """Set the key at `loc`, creating the mappings on the way in the style of their parent; a key new
        at depth `near[0]` goes to position `near[1]` there (where the key it replaces was); `carried` is
        the comment of the key it replaces."""
        node = self.tree
        for depth, part in enumerate(loc):
            last = depth == len(loc) - 1
            if part not in node and near is not None and near[0] == depth:
                node.insert(min(near[1], len(node)), part, None)
            if last:
                break
            child = node.get(part)
            if not isinstance(child, CommentedMap):
                child = CommentedMap()
                if node.fa.flow_style():
                    child.fa.set_flow_style()
                node[part] = child
            node = child
        node[loc[-1]] = _styled(value, node.fa.flow_style())
        # two spaces before an end-of-line comment's '#' (ruamel places it by column)
        column = (len(loc) - 1) * self.indent + len(_dump(self.yaml, CommentedMap([(loc[-1], node[loc[-1]])])).rstrip()) + 2
        if carried and len(carried) > 2 and carried[2] is not None and not node.fa.flow_style():
            carried[2].start_mark.column = column
            node.ca.items[loc[-1]] = carried
        if comment and not node.fa.flow_style():
            node.yaml_add_eol_comment(f"# {comment}", loc[-1], column=column)
        self.touched = True

    def position(self, loc: tuple[str | int, ...]) -> int:
        parent, _ = self.node(loc[:-1])
        return list(parent).index(loc[-1])


def _dump(yaml: YAML, tree: Any) -> str:
    stream = io.StringIO()
    yaml.dump(tree, stream)
    return stream.getvalue()


def _changed_lines(a: str, b: str) -> int:
    return sum(1 for line in difflib.ndiff(a.splitlines(), b.splitlines()) if line[:1] in "+-")


def _styled(value: Any, flow: bool) -> Any:
    """A plain value as ruamel nodes: new lists and mappings inline (one line per key in a diff)."""
    if isinstance(value, dict):
        out = CommentedMap((k, _styled(v, True)) for k, v in value.items())
        out.fa.set_flow_style()
        return out
    if isinstance(value, list):
        seq = CommentedSeq(_styled(v, True) for v in value)
        seq.fa.set_flow_style()
        return seq
    return value
