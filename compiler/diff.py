"""A semantic diff of two compiled jobs, grouped the way a reviewer reads a run: verl settings,
resources, container, environment, stages. Text for terminals, Markdown for PR comments."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ruamel.yaml import YAML

from .ir import JobIR

if TYPE_CHECKING:
    from .catalog import Catalog

Facts = dict[str, dict[str, str]]

# Every top-level section of a spec, and the group its leaves are shown in (the targets' own sections: in the
# group their descriptor names, Catalog.top_sections). `verl` leaves are shown as the
# overrides they become ("verl settings", which also holds what verlc derives). tests/test_diff.py fails
# when a spec field is missing here, and a leaf of an unlisted section would still show, under "other".
SECTION_GROUPS = {
    "verl": None, "name": "run", "verl_version": "run", "verl_commit": "run", "verl_checkout": "run",
    "program": "run", "code": "run", "project": "run", "experiment": "run", "model": "run", "model_shape": "run",
    "hydra": "run", "reproducible": "run", "sweep": "run", "stall_timeout": "stages", "data": "stages",
    "ray": "stages", "pins": "stages", "stages": "run",
    "cluster": "resources", "targets": "run", "container": "container", "env": "environment",
    "secrets": "environment", "network": "environment", "services": "services", "tool_config": "services",
}


def facts(ir: JobIR, catalog: Catalog) -> Facts:
    """What a run is, as group -> {item: value}: every leaf of the normalized spec, in the group of its
    section, plus the overrides verl gets and the environment verlc derives. Equal facts, equal runs."""
    groups = {**SECTION_GROUPS, **catalog.top_sections}
    out: Facts = {"verl settings": {o.key: o.value for o in ir.overrides}}
    for group in groups.values():
        if group:
            out.setdefault(group, {})
    out["environment"].update({f"{e.name} (verlc, from {e.origin})": e.value.display for e in ir.env
                               if e.origin != "env"})
    for path, value in _leaves(YAML(typ="safe", pure=True).load(ir.normalized_spec)):
        section = path.split(".")[0].split("[")[0]
        group = groups.get(section, "other")
        if group:
            out.setdefault(group, {})[path] = value
    return out


def _leaves(tree: Any, path: str = "") -> list[tuple[str, str]]:
    if isinstance(tree, dict) and tree:
        return [leaf for k, v in tree.items() for leaf in _leaves(v, f"{path}.{k}" if path else str(k))]
    if isinstance(tree, list) and tree:
        return [leaf for i, v in enumerate(tree) for leaf in _leaves(v, f"{path}[{i}]")]
    return [(path, json.dumps(tree, ensure_ascii=False) if not isinstance(tree, str) else tree)]


def changes(a: JobIR, b: JobIR, catalog: Catalog) -> dict[str, list[tuple[str, str | None, str | None]]]:
    """group -> [(item, before, after)] for every item added, removed or changed."""
    fa, fb = facts(a, catalog), facts(b, catalog)
    out: dict[str, list[tuple[str, str | None, str | None]]] = {}
    for group in [*fa, *(g for g in fb if g not in fa)]:
        fa.setdefault(group, {})
        fb.setdefault(group, {})
        keys = fa[group].keys() | fb[group].keys()
        rows = [(k, fa[group].get(k), fb[group].get(k)) for k in sorted(keys)
                if fa[group].get(k) != fb[group].get(k) and not _emptied(k, fa[group], fb[group], keys)]
        if rows:
            out[group] = rows
    return out


def _emptied(key: str, a: dict[str, str], b: dict[str, str], keys: set[str]) -> bool:
    """An empty mapping or list on one side (`env = {}`) where the other side has entries under it: those
    entries are the change, the empty container is not."""
    empty = a.get(key, b.get(key)) if key not in a or key not in b else None
    return empty in ("{}", "[]") and any(k.startswith((f"{key}.", f"{key}[")) for k in keys)


def render(a_name: str, b_name: str, diff: dict[str, Any], markdown: bool) -> str:
    if not diff:
        return f"{a_name} and {b_name} describe the same run\n"
    lines = [f"### {a_name} -> {b_name}" if markdown else f"{a_name} -> {b_name}"]
    for group, rows in diff.items():
        if markdown:
            lines += ["", f"**{group}**", "", "| | item | before | after |", "| --- | --- | --- | --- |"]
            for item, before, after in rows:
                mark = "+" if before is None else "-" if after is None else "~"
                lines.append(f"| {mark} | `{item}` | {_cell(before)} | {_cell(after)} |")
        else:
            lines += ["", f"{group}:"]
            for item, before, after in rows:
                if before is None:
                    lines.append(f"  + {item} = {after}")
                elif after is None:
                    lines.append(f"  - {item} = {before}")
                else:
                    lines.append(f"  ~ {item}: {before} -> {after}")
    return "\n".join(lines) + "\n"


def _cell(value: str | None) -> str:
    return "" if value is None else "`" + value.replace("|", "\\|").replace("`", "'") + "`"
