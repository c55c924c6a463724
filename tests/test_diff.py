"""`verlc diff`: what differs between two runs, grouped for a reviewer; specs and bundles alike."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, run_verlc

A = REPO / "specs" / "qwen2-7b-gsm8k-ppo-mi300.yaml"


def test_a_bundle_and_its_spec_are_the_same_run() -> None:
    result = run_verlc("diff", REPO / "out" / A.stem / "slurm", A)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "describe the same run" in result.stdout


def test_changes_are_grouped_and_marked(tmp_path: Path) -> None:
    changed = tmp_path / "b.yaml"
    # one node: each GPU holds twice the shard of the training state, and the rollout's 0.9 no longer fits
    changed.write_text(A.read_text().replace("lr: 1e-6", "lr: 2e-6").replace("nodes: 2", "nodes: 1")
                       .replace("gpu_memory_utilization: 0.9", "gpu_memory_utilization: 0.8")
                       .replace("  NCCL_DEBUG: INFO\n", ""))
    result = run_verlc("diff", A, changed)
    assert result.returncode == 1, result.stderr
    text = result.stdout
    assert "verl settings:\n" in text and "  ~ actor_rollout_ref.actor.optim.lr: 1e-06 -> 2e-06" in text
    assert "  ~ trainer.nnodes: 2 -> 1" in text
    assert "resources:\n" in text and "  ~ cluster.nodes: 2 -> 1" in text
    assert "environment:\n" in text and "  - env.NCCL_DEBUG = INFO" in text
    markdown = run_verlc("diff", A, changed, "--format", "markdown").stdout
    assert "| ~ | `actor_rollout_ref.actor.optim.lr` | `1e-06` | `2e-06` |" in markdown


def test_the_first_entry_of_an_empty_mapping_is_the_change_not_the_mapping(tmp_path: Path) -> None:
    """#40 item 16: a spec without env against one with an env var printed `- env = {}` beside `+ env.A = 1`."""
    plain = REPO / "specs" / "quickstart-gsm8k-1node.yaml"
    with_env = tmp_path / "b.yaml"
    with_env.write_text(plain.read_text() + "env: {A: '1'}\n")
    for a, b, mark in ((plain, with_env, "+"), (with_env, plain, "-")):
        result = run_verlc("diff", a, b)
        assert result.returncode == 1 and result.stdout.endswith(f"environment:\n  {mark} env.A = 1\n"), result.stdout


def test_every_spec_field_has_a_group() -> None:
    """Complete by construction: a new spec field must be given a group (or shown through the overrides)."""
    from verlc.compiler.diff import SECTION_GROUPS

    assert set(SECTION_GROUPS) | set(CATALOG.top_sections) == set(CATALOG.spec.model_fields) - {"extends"}


def test_network_and_compose_changes_are_not_hidden(tmp_path: Path) -> None:
    changed = tmp_path / "b.yaml"
    changed.write_text(A.read_text().replace("verl.rocm", "verl.rocm2").replace("network:\n", "network:\n"
                                                                                  "  head_interface: ib1\n"))
    result = run_verlc("diff", A, changed)
    assert result.returncode == 1
    assert "  ~ container.image: verl.rocm -> verl.rocm2" in result.stdout
    assert "network.head_interface" in result.stdout


# --- property: whenever a generated file changes, diff names the edited spec path ----------------------

import json  # noqa: E402
import random  # noqa: E402

from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from ruamel.yaml import YAML  # noqa: E402

from verlc.compiler import yaml_text  # noqa: E402
from verlc.compiler.diagnostics import SpecError  # noqa: E402
from verlc.compiler.diff import changes  # noqa: E402
from verlc.compiler.pipeline import compile_spec  # noqa: E402
from verlc.targets import CATALOG
from verlc.targets import render  # noqa: E402

SPECS = sorted((REPO / "specs").glob("*.yaml"))


def _normalized(spec: Path) -> dict:
    return YAML(typ="safe", pure=True).load(compile_spec(spec, CATALOG, display="a", source="a.yaml").normalized_spec)


NORMALIZED = {p.stem: _normalized(p) for p in SPECS}


def _paths(tree: object, path: tuple = ()) -> list[tuple]:
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _paths(v, (*path, k))]
    if isinstance(tree, list):
        return [p for i, v in enumerate(tree) for p in _paths(v, (*path, i))]
    return [path] if tree is not None else []


def _edit(value: object, rng: random.Random) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + rng.choice([1, 2, -1])
    if isinstance(value, float):
        return value * 2
    return f"{value}x" if rng.random() < 0.7 else f"{value}/y"


def _files(ir) -> dict[str, str]:  # noqa: ANN001
    """Every generated file without the lines that carry the spec's digest (the header) and the manifest."""
    out = {}
    for name in ir.targets:
        for f in render(name, ir).files:
            if f.path != "manifest.json":
                out[f"{name}/{f.path}"] = "\n".join(
                    line for line in f.text.splitlines() if ir.spec_sha256 not in line)
    return out


def _dotted(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(sorted(NORMALIZED)), st.integers(0, 10**6))
def test_diff_names_every_edit_that_changes_a_generated_file(tmp_path: Path, name: str, seed: int) -> None:
    rng = random.Random(seed)
    base = NORMALIZED[name]
    path = rng.choice(_paths(base))
    edited = json.loads(json.dumps(base))
    node = edited
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = _edit(node[path[-1]], rng)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml_text.dump(base))
    b.write_text(yaml_text.dump(edited))
    try:
        ir_a = compile_spec(a, CATALOG, display="a", source="a.yaml", targets=["all"])
        ir_b = compile_spec(b, CATALOG, display="b", source="a.yaml", targets=["all"])
    except SpecError:
        event("the edit made an invalid spec")
        return
    if _files(ir_a) == _files(ir_b):
        event("no generated file changed")
        return
    event("a generated file changed")
    dotted = _dotted(path).replace(".+", ".")  # verl's key, without the `+` that appends it to verl's config
    items = [item for rows in changes(ir_a, ir_b, CATALOG).values() for item, _, _ in rows]
    # a verl leaf is named by the override it is part of (a list element: the list's key)
    assert any(item == dotted or (dotted.startswith("verl.") and (dotted == f"verl.{item}" or dotted.startswith(
        (f"verl.{item}.", f"verl.{item}[")))) for item in items), (dotted, items)
