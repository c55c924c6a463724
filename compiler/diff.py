"""A semantic diff of two compiled jobs, grouped the way a reviewer reads a run: verl settings,
resources, container, environment, stages. Text for terminals, Markdown for PR comments."""

from __future__ import annotations

from typing import Any

from .ir import JobIR

Facts = dict[str, dict[str, str]]


def facts(ir: JobIR) -> Facts:
    """What a run is, as group -> {item: value}; two runs with equal facts run the same way."""
    c = ir.container
    return {
        "verl settings": {o.key: o.value for o in ir.overrides},
        "resources": {"nodes": str(ir.nodes), "gpus_per_node": str(ir.gpus_per_node),
                      "accelerator": ir.accelerator,
                      **({f"slurm --{k}": v for k, v in ir.slurm.directives} if ir.slurm else {}),
                      **({f"slurm module {m}": "load" for m in ir.slurm.modules} if ir.slurm else {})},
        "container": {"runtime": c.runtime, "image": ir.image.display,
                      **({"workdir": c.workdir.display} if c.workdir else {}),
                      **{f"mount {m.display}": "yes" for m in c.mounts},
                      **{f"run arg {a.display}": "yes" for a in c.run_args}},
        "environment": {**{e.name: e.value.display for e in ir.env},
                        **{s: "(secret, from the submitting shell)" for s in ir.secrets}},
        "stages": {**{f"prepare {p.dataset}": " ".join(p.argv) for p in ir.data_prep},
                   "wait for nodes": f"{ir.ray.wait_seconds}s",
                   **{f"pin {n}": v for n, v in ir.pins},
                   **({"sweep variants": str(len(ir.variants))} if ir.variants else {})},
    }


def changes(a: JobIR, b: JobIR) -> dict[str, list[tuple[str, str | None, str | None]]]:
    """group -> [(item, before, after)] for every item added, removed or changed."""
    fa, fb = facts(a), facts(b)
    out: dict[str, list[tuple[str, str | None, str | None]]] = {}
    for group in fa:
        rows = [(k, fa[group].get(k), fb[group].get(k)) for k in sorted(fa[group].keys() | fb[group].keys())
                if fa[group].get(k) != fb[group].get(k)]
        if rows:
            out[group] = rows
    return out


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
