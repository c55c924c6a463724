"""The example specs: goldens for every file of every bundle, and invariants a careless golden
update cannot approve (bash -n, shellcheck, determinism across processes, out/ kept fresh)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import EXAMPLE_BUNDLES, PIPELINES, REPO, SPECS, require_tool, run_verlc
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG, NAMES, render
from verlc.targets.bundle import Bundle
from verlc.targets.slurm.ports import EPHEMERAL, PLAN, RAY_WORKER_PORTS

# out/ is the reviewed output and the goldens' folder: `verlc build specs/*.yaml --target all --out out`
# (or this file's tests with --snapshot-update) rewrites it.
REFRESH = "pytest tests/test_examples.py --snapshot-update"


def bundles(spec: Path) -> list[Bundle]:
    """Every bundle `verlc build SPEC --target all` writes: one per target the spec lists."""
    ir = compile_spec(spec, CATALOG, display=str(spec), source=spec.relative_to(REPO).as_posix(), targets=["all"])
    return [render(name, ir) for name in ir.targets]


def test_the_spec_knows_every_target() -> None:
    """The spec's `targets:` and each target's own section come from the registry (targets/__init__.py)."""
    fields = CATALOG.spec.model_json_schema()["properties"]
    assert fields["targets"]["anyOf"][0]["items"]["enum"] == list(NAMES)
    assert {"compose", "kubernetes", "skypilot"} <= fields.keys()


@pytest.mark.parametrize(("example_spec", "target"), EXAMPLE_BUNDLES,
                         ids=[f"{s.stem}-{t}" for s, t in EXAMPLE_BUNDLES])
def test_golden(example_spec: Path, target: str, snapshot) -> None:  # noqa: ANN001
    """Every generated file equals its reviewed golden in out/. Refresh with: pytest ... --snapshot-update"""
    bundle = next(b for b in bundles(example_spec) if b.target == target)
    snapshot.snapshot_dir = REPO / "out" / bundle.name
    tree: dict = {}
    for f in bundle.files:
        *folders, name = f.path.split("/")
        node = tree
        for folder in folders:
            node = node.setdefault(folder, {})
        node[name] = f.text
    snapshot.assert_match_dir(tree, target)


def test_out_matches_a_fresh_build(tmp_path: Path, recipes: list[Path]) -> None:
    """out/ is committed for review; it must be what `verlc build` writes today, modes included."""
    result = run_verlc("build", *SPECS, *recipes, *PIPELINES, "--target", "all", "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr
    fresh = {p.relative_to(tmp_path / "out"): p for p in (tmp_path / "out").rglob("*") if p.is_file()}
    committed = {p.relative_to(REPO / "out"): p for p in (REPO / "out").rglob("*") if p.is_file()}
    fix = ("regenerate with: verlc build specs/*.yaml specs/recipes/*.yaml specs/pipelines/*.yaml --target all "
           "--out out")
    assert sorted(committed) == sorted(fresh), fix
    for rel, path in fresh.items():
        assert committed[rel].read_bytes() == path.read_bytes(), f"out/{rel} is stale; {fix}"
        assert committed[rel].stat().st_mode & 0o777 == path.stat().st_mode & 0o777, f"out/{rel} mode; {fix}"


def scripts(spec: Path) -> list[tuple[str, str]]:
    return [(f"{b.folder}/{f.path}", f.text) for b in bundles(spec) for f in b.files if f.path.endswith(".sh")]


def test_scripts_parse(example_spec: Path, tmp_path: Path) -> None:
    for name, text in scripts(example_spec):
        script = tmp_path / "script.sh"
        script.write_text(text)
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{name}: {result.stderr}"


def test_scripts_are_shellcheck_clean(example_spec: Path, tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck")
    for name, text in scripts(example_spec):
        script = tmp_path / "script.sh"
        script.write_text(text)
        result = subprocess.run([shellcheck, "--severity=style", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, f"{name}:\n{result.stdout}"


def test_recipe_scripts_parse_and_are_shellcheck_clean(recipes: list[Path], tmp_path: Path) -> None:
    shellcheck = require_tool("shellcheck")
    checked = 0
    for spec in recipes:
        for name, text in scripts(spec):
            script = tmp_path / "script.sh"
            script.write_text(text)
            for argv in (["bash", "-n"], [shellcheck, "--severity=style"]):
                result = subprocess.run([*argv, str(script)], capture_output=True, text=True)
                assert result.returncode == 0, f"{name}:\n{result.stdout}{result.stderr}"
            checked += 1
    assert checked >= 2 * len(recipes) >= 4  # each recipe's sbatch.sh and submit.sh


def test_build_is_deterministic_across_processes(tmp_path: Path, recipes: list[Path]) -> None:
    """Same spec -> same bytes, whatever the hash seed, the working directory or the user's env."""
    trees = []
    for seed, cwd in (("1", REPO), ("12345", tmp_path)):
        out = tmp_path / f"out-{seed}"
        result = run_verlc("build", *SPECS, *recipes, "--target", "all", "--out", out, cwd=cwd,
                           env={"PYTHONHASHSEED": seed, "HOME": f"/home/someone-{seed}", "USER": f"u{seed}"})
        assert result.returncode == 0, result.stderr
        trees.append({p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()})
    assert trees[0] == trees[1]
    assert all(b"\r\n" not in text for text in trees[0].values())


def test_check_catches_an_unquoted_value() -> None:
    """The invariant above is not vacuous: an unquoted space in a script fails shellcheck."""
    shellcheck = require_tool("shellcheck")
    bad = "#!/usr/bin/env bash\nname=$1\nrm -rf $name/tmp\n"
    result = subprocess.run([shellcheck, "-"], input=bad, capture_output=True, text=True)
    assert result.returncode != 0 and "SC2086" in result.stdout


def test_header_names_spec_and_hash(example_spec: Path) -> None:
    for bundle in bundles(example_spec):
        for f in bundle.files:
            if f.path.endswith(".json"):  # no comments in JSON: a field names the spec
                assert f'"specs/{example_spec.name}' in f.text, f.path
                continue
            head = "\n".join(f.text.splitlines()[:3])
            if f.path.startswith("verlc_job/") and f.path.endswith(".py"):  # the runtime: alike in every bundle
                assert "'s runtime (runtime/ in verlc's source)" in head and "Do not edit" in head, f.path
                continue
            assert f"from specs/{example_spec.name} (sha256 " in head, f.path
            assert "Do not edit" in head, f.path
    assert os.sep not in bundles(example_spec)[0].name


@pytest.mark.parametrize("job_id", [0, 1, 126, 127, 4095, 10**6 + 125, 2**31 - 1])
def test_every_port_of_a_job_lies_in_its_block_between_rays_worker_ports_and_the_ephemeral_range(job_id: int) -> None:
    """The port plan as values: for any job id and node count, every port lies in 20000-32767, above Ray's
    worker ports and below Linux's ephemeral range, inside the job's block, and no two uses of the block
    share a port."""
    offsets = PLAN.offsets()
    assert sum(map(len, offsets.values())) == len(set().union(*offsets.values())), offsets
    assert max(map(max, offsets.values())) < PLAN.size
    base = PLAN.base(job_id)
    assert (PLAN.first + (PLAN.blocks - 1) * PLAN.size + PLAN.size - 1) < EPHEMERAL.start
    assert PLAN.first > RAY_WORKER_PORTS[-1]
    for node in (0, 1, 89, 90, 4095):
        ports = PLAN.ports(job_id, node)
        for value in ports.values():
            for port in value if isinstance(value, range) else (value,):
                assert base <= port < base + PLAN.size and RAY_WORKER_PORTS[-1] < port < EPHEMERAL.start


def test_the_slurm_script_computes_the_port_plans_values() -> None:
    """The script's arithmetic, run by bash for several job ids, gives the plan's ports."""
    script = (REPO / "out" / "qwen3-32b-grpo-ascend-a3" / "slurm" / "sbatch.sh").read_text()
    # the header's numbers (the view's PortPlan) and the library's arithmetic on them
    values = "\n".join(re.findall(r"^readonly (?:port_|agent_|pinned_|hccl_ports).*$", script, flags=re.M))
    plan = script[script.index("plan_ports() {"):script.index("\n}\n", script.index("plan_ports() {")) + 3]
    agent = re.search(r"local agent_port=(\$\(\(.*?\)\))", script)[1]
    hccl = [name for name, *_ in PLAN.hccl]
    for job_id in (0, 1, 126, 127, 10**6 + 125):
        for node in (0, 1, 90):
            program = (f"SLURM_JOB_ID={job_id}; i={node}\n{values}\n{plan}\nplan_ports\n"
                       f"echo $ray_port $dashboard_port $client_port $(({agent[3:-2]})) "
                       + " ".join(f"${n}" for n in hccl))
            out = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True).stdout.split()
            want = PLAN.ports(job_id, node)
            ranges = [f"{want[n][0]}-{want[n][-1]}" for n in hccl]
            assert out == [str(want["gcs"]), str(want["dashboard"]), str(want["client"]), str(want["agent"]), *ranges]


def test_each_recipe_example_says_how_to_get_its_code(tmp_path: Path) -> None:
    """#40 item 17: a user's clone has no ../shared; each recipe example's comments give the git commands that
    make its `code:` folder at its verl commit, and a build without the folder says the code must be checked
    out there, pointing at those comments."""
    import yaml

    recipes = sorted((REPO / "specs" / "recipes").glob("*.yaml"))
    assert recipes
    for path in recipes:
        text = path.read_text()
        spec = yaml.safe_load(text)
        folder = os.path.relpath((path.parent / spec["code"]).resolve(), REPO)
        comments = "\n".join(line for line in text.splitlines() if line.startswith("#"))
        assert f"git clone https://github.com/verl-project/verl {folder}\n" in comments, path.name
        assert f"git -C {folder} checkout {spec['verl_commit']}\n" in comments, path.name
        assert f"git clone https://github.com/verl-project/verl-recipe {folder}/recipe\n" in comments, path.name
    moved = tmp_path / "specs" / "recipes"
    moved.mkdir(parents=True)
    (moved / recipes[0].name).write_text(recipes[0].read_text())
    result = run_verlc("build", moved / recipes[0].name, "--target", "slurm", "--out", tmp_path / "out")
    assert result.returncode == 2 and "code: no folder " in result.stderr, result.stderr
    assert "the run's code must be checked out there first (the spec's comments may say how)" in result.stderr


def test_a_slurm_job_stops_inside_slurms_kill_wait() -> None:
    """The stop's timing as values: Ray stops with time left to keep its logs before its container is removed,
    and the container is gone before Slurm's KillWait (30 s by default) runs out."""
    from verlc.targets.slurm.view import Stopping

    assert Stopping().fits()
    assert not Stopping(logs_wait=25).fits() and not Stopping(ray_kill_after=10).fits()


def test_the_slurm_library_is_static_bash_and_each_script_gives_it_every_value_it_reads() -> None:
    """#41: what runs in every Slurm job is targets/slurm/library.sh, included verbatim: no template syntax in it,
    every generated sbatch.sh holds it as it is, and shellcheck (which names a variable read but never assigned)
    passes on every script, so each header gives the library every value it reads."""
    library = (REPO / "targets" / "slurm" / "library.sh").read_text()
    assert not any(mark in library for mark in ("{{", "{%", "{##")), "the library must stay static bash"
    scripts = sorted((REPO / "out").glob("*/slurm/sbatch.sh"))
    assert scripts
    for script in scripts:
        assert library in script.read_text(), script
    shellcheck = Path(sys.executable).parent / "shellcheck"
    checked = subprocess.run([str(shellcheck), *map(str, scripts)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout


def test_a_pull_requests_diff_of_out_shows_each_jobs_own_files() -> None:
    """#54 item 6: git (and forges) collapse exactly the runtime's copies and the manifests in out/: every file that
    holds a runtime module's text whole (the package copies, KubeRay's runtime ConfigMap) is marked, unless it is
    the Slurm script (one file by design: .gitattributes says why); no job's own file is."""
    require_tool("git")
    modules = [p.read_text() for p in (REPO / "runtime").glob("*.py")]
    files = sorted(p.relative_to(REPO).as_posix() for p in (REPO / "out").rglob("*") if p.is_file())
    shown = subprocess.run(["git", "check-attr", "diff", "--stdin"], cwd=REPO, input="\n".join(files) + "\n",
                           capture_output=True, text=True, check=True).stdout
    hidden = {line.split(": ")[0] for line in shown.splitlines() if line.endswith(": diff: unset")}
    def held(path: str) -> str:  # a ConfigMap's files, or the file's text
        text = (REPO / path).read_text()
        if path.endswith(".yaml") and "kind: ConfigMap" in text:
            return "\n".join(yaml.safe_load(text)["data"].values())
        return text

    copies = {f for f in files if not f.endswith("/sbatch.sh") and any(m in held(f) for m in modules)}
    manifests = {f for f in files if f.endswith("/manifest.json")}
    assert copies, "no runtime copy found in out/"
    assert hidden == copies | manifests, (sorted(hidden - copies - manifests)[:5], sorted(copies - hidden)[:5])
