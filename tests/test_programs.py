"""Programs other than main_ppo, verl pinned to a commit: verlc composes a recipe's config as Hydra does and
judges its keys as verl does (issue: paper runs as they are really run).

The recipes and verl sources are the shared ones (../shared/verl-recipe/, made into local git checkouts by
dev/checkouts.py); Hydra composes them in one process per checkout (tests/verl_oracle.py for verdicts).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO
from test_verl_releases import leaves, nest, other_type, user_overrides
from verlc.compiler.diagnostics import SpecError
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.targets.job_package import job_of
from verlc.runtime.job import Job
from verlc.compiler.verl.check import select, settings
from verlc.compiler.verl.commit import _release, commit_release
from verlc.compiler.verl.release import RELEASES
from verlc.compiler.verl.hydra import verl_value
from verlc.compiler.verl.program import resolve

sys.path.insert(0, str(REPO / "dev"))
from checkouts import SHARED, make  # noqa: E402

ROLLING = "bcb638649a50e58494a8ddd92085ad1174f674b8"    # verl-recipe's ROLLING_VERL_COMMIT
REPRODUCTION = "4f80e465c2ec79ab9c3c30ec74b9745de61d0490"  # DAPO's published tables
# (checkout, verl commit, program, config name or None for the program's own)
PROGRAMS = [
    ("verl-bcb6386-recipe", ROLLING, "recipe.dapo.main_dapo", None),
    ("verl-bcb6386-recipe", ROLLING, "recipe.dapo.main_dapo", "dapo_megatron_trainer"),
    ("verl-bcb6386-recipe", ROLLING, "recipe.sppo.main_sppo", None),
    ("verl-bcb6386-recipe", ROLLING, "verl.experimental.fully_async_policy.fully_async_main", None),
    ("verl-bcb6386-recipe", ROLLING, "verl.experimental.one_step_off_policy.main_ppo", None),
    ("verl-4f80e465", REPRODUCTION, "recipe.dapo.src.main_dapo", None),
]
IDS = [f"{p[2]}:{p[3] or 'default'}" for p in PROGRAMS]


@pytest.fixture(scope="session")
def checkouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not SHARED.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"{SHARED} is missing: CI runs every test")
        pytest.skip(f"{SHARED} is missing")
    into = tmp_path_factory.mktemp("checkouts")
    for name in {p[0] for p in PROGRAMS}:
        make(name, into)
    return into


# --- composition: verlc's tree is Hydra's, for every program and engine --------------------------

HYDRA_COMPOSE = """
import json, os, sys
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
out = []
for case in json.load(sys.stdin):
    os.chdir(case["cwd"])
    with initialize_config_dir(config_dir=case["dir"], version_base=None):
        cfg = compose(case["name"], overrides=case["overrides"])
    tree = OmegaConf.to_container(cfg, resolve=False)
    tree.pop("hydra", None)
    out.append(tree)
json.dump(out, sys.stdout)
"""


def test_every_programs_config_is_composed_as_hydra_composes_it(checkouts: Path) -> None:
    cases, mine = [], []
    for checkout, commit, module, name in PROGRAMS:
        program = resolve(module, name, commit_release(commit, None), code=checkouts / checkout, verl_source=None)
        release = program.release
        for engine in release.engines(program.config_name):
            cases.append({"cwd": str(checkouts / checkout), "dir": str(program.config_dir),
                          "name": program.config_name, "overrides": [f"model_engine={engine}"] if engine else []})
            mine.append((f"{module} {program.config_name} {engine or '-'}", release.tree(program.config_name, engine)))
    result = subprocess.run([sys.executable, "-c", HYDRA_COMPOSE], input=json.dumps(cases), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    hydras = json.loads(result.stdout)
    assert len(mine) >= len(PROGRAMS) + 2  # the programs over verl's trainer config have every engine
    for (label, tree), hydra in zip(mine, hydras):
        assert tree == hydra, f"{label}: verlc's composition differs from Hydra's"


def test_a_recipes_own_dataclass_is_read_with_its_verl_base(checkouts: Path) -> None:
    checkout = checkouts / "verl-bcb6386-recipe"
    program = resolve("recipe.sppo.main_sppo", None, commit_release(ROLLING, None), code=checkout, verl_source=None)
    cls = program.release.target("recipe.sppo.config.SPPOActorConfig")
    assert cls is not None and cls.fields["sppo_eta"] == "float"
    assert "ppo_mini_batch_size" in cls.fields  # inherited from verl's ActorConfig, read from the commit's schema


# --- verdicts: verlc refuses what verl refuses, on the recipes' own keys and verl's ---------------

def base_verl() -> dict[str, Any]:
    return {"algorithm": {"adv_estimator": "grpo"},
            "actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 4},
                                  "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4}}}


def recipe_cases(program: Any, tree: dict[str, Any], rng: random.Random, count: int) -> list[dict[str, Any]]:
    """Keys drawn from the composed config, half of them from the recipe's own file (what verl lacks)."""
    own = {k for k, _ in leaves(_own_keys(program))}
    real = [(k, v) for k, v in leaves(tree) if v != "???" and not (isinstance(v, str) and "${" in v)
            and not any(r in k for r in ("_target_", "batch_size", "parallel_size", "nnodes", "n_gpus", "enable",
                                         "adv_estimator", "name", "mode", "strategy", "use_", "critic.", "path",
                                         "_files", "project_name", "experiment_name", "default_local_dir",
                                         "resume_mode", "rollout.n", "do_sample", "loss_agg_mode", "ulysses",
                                         "temperature", "total_training_steps"))]
    mine = [(k, v) for k, v in real if k in own] or real
    cases = []
    while len(cases) < count:
        key, default = rng.choice(mine if rng.random() < 0.5 else real)
        kind = rng.choice(["real", "type", "typo", "new-closed", "plus-new"])
        parts = key.split(".")
        if kind == "real":
            flat = {key: default}
        elif kind == "type":
            flat = {key: other_type(default)}
        elif kind == "typo":
            i = rng.randrange(len(parts))
            parts[i] = parts[i] + "x"
            flat = {".".join(parts): default}
        elif kind == "new-closed":
            flat = {".".join([*parts[:-1], "brand_new_setting"]): 1}
        else:
            flat = {".".join([*parts[:-1], "+brand_new_setting"]): 1}
        cases.append({"kind": kind, "flat": flat})
    return cases


def _own_keys(program: Any) -> dict[str, Any]:
    from ruamel.yaml import YAML

    data = YAML(typ="safe", pure=True).load((program.config_dir / f"{program.config_name}.yaml").read_text())
    return {k: v for k, v in (data or {}).items() if k not in ("defaults", "hydra")}


@pytest.mark.parametrize("index", [0, 2, 5], ids=[IDS[0], IDS[2], IDS[5]])
def test_verlc_and_verl_agree_on_a_programs_keys(checkouts: Path, tmp_path: Path, index: int,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    checkout, commit, module, name = PROGRAMS[index]
    code = checkouts / checkout
    program = resolve(module, name, commit_release(commit, None), code=code, verl_source=None)
    engine = program.release.default_engine(program.config_name)
    tree = program.release.tree(program.config_name, engine)
    cases = recipe_cases(program, tree, random.Random(f"verlc-{module}"), 40)
    judged = []
    for case in cases:
        verl = nest(case["flat"], base_verl())
        spec = tmp_path / "spec.yaml"
        spec.write_text(json.dumps({"name": "recipe", "project": "p", "model": "m", "verl_commit": commit,
                                    "program": module, "code": str(code), "verl": verl,
                                    "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                                    "cluster": {"nodes": 1, "gpus_per_node": 8}}))
        try:
            compile_spec(spec, CATALOG, display="spec.yaml", source="spec.yaml")
            problems: list[str] = []
        except SpecError as exc:
            problems = [f"{d.path}: {d.message}" for d in exc.diagnostics]
        chosen = select(verl, program.release)
        assert not isinstance(chosen, str), chosen
        mine = user_overrides("0.9.1", case["flat"])  # base_verl() is that test's baseline too
        values = {".".join(p.lstrip("+") for p in k.split(".")): verl_value(v)
                  for k, v in {**dict(leaves(base_verl())), **case["flat"]}.items()}
        judged.append((case, problems, {
            "config": program.config_name, "engine": engine, "config_dir": str(program.config_dir),
            "overrides": mine, "keys": [o.split("=", 1)[0].lstrip("+") for o in mine], "values": values,
            "verlc": None if problems else [s.arg for s in settings(verl, chosen.walker)]}))
    result = subprocess.run([sys.executable, str(REPO / "tests" / "verl_oracle.py"), str(code / "verl")],
                            input=json.dumps([j[2] for j in judged]), capture_output=True, text=True, cwd=code,
                            timeout=600, env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    disagreements = [f"{case['kind']} {case['flat']}\n  verlc: {problems or 'accepts'}\n  verl:  {says or 'accepts'}"
                     for (case, problems, _), says in zip(judged, json.loads(result.stdout))
                     if bool(problems) != bool(says)]
    kinds = {c["kind"] for c in cases}
    assert kinds == {"real", "type", "typo", "new-closed", "plus-new"}
    assert not disagreements, f"{len(disagreements)} of {len(cases)}:\n" + "\n".join(disagreements[:20])


def test_a_config_of_ones_own_that_chooses_verls_model_engine_is_composed_with_it(tmp_path: Path) -> None:
    """main_ppo on a config folder of the run's own whose defaults list takes verl's ppo_trainer and overrides
    its model_engine group (megatron): verlc composes that engine's tree, as Hydra does, with no note that it
    leaves the group to Hydra; a key of the FSDP engine is refused, and verl 0.9.1 itself agrees on both."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "mine.yaml").write_text(
        "hydra:\n  searchpath:\n    - pkg://verl.trainer.config\ndefaults:\n  - ppo_trainer\n"
        "  - override model_engine: megatron\n  - _self_\ndata:\n  return_raw_chat: true\n")
    settings_ = {"megatron": ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", 2),
                 "dp": ("actor_rollout_ref.actor.fsdp_config.param_offload", True)}
    problems = {}
    for engine, (key, value) in settings_.items():
        verl = nest({key: value}, base_verl())
        spec = tmp_path / f"{engine}.yaml"
        spec.write_text(json.dumps({"name": "own-engine", "project": "p", "model": "/models/m", "verl_version": "0.9.1",
                                    "code": ".", "hydra": {"config_name": "mine", "config_dir": "conf"},
                                    "data": {"train_files": ["/d/t.parquet"], "val_files": ["/d/v.parquet"]},
                                    "cluster": {"nodes": 1, "gpus_per_node": 8}, "verl": verl}))
        try:
            ir = compile_spec(spec, CATALOG, display=spec.name, source=spec.name, targets=["ray-job"])
            problems[engine] = []
            assert not [n for n in ir.notes if "left to Hydra" in n], ir.notes
        except SpecError as exc:
            problems[engine] = [str(d) for d in exc.diagnostics]
    assert problems["megatron"] == [], problems["megatron"]
    assert len(problems["dp"]) == 1 and "belongs to the FSDP engine; this spec uses megatron" in problems["dp"][0]
    cases = [{"config": "mine", "engine": "", "config_dir": str(tmp_path / "conf"), "overrides": [f"{k}={v}"],
              "keys": [k], "values": {}, "verlc": None} for k, v in settings_.values()]
    result = subprocess.run([sys.executable, str(REPO / "tests" / "verl_oracle.py"), str(installed_verl())],
                            input=json.dumps(cases), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    megatron, dp = json.loads(result.stdout)
    assert not megatron and "Could not override 'actor_rollout_ref.actor.fsdp_config.param_offload'" in dp, (megatron, dp)


def installed_verl() -> Path:
    from verlc.compiler.verl.release import installed_package

    assert installed_package().joinpath("version", "version").read_text().strip() == "0.9.1"
    return installed_package()


# --- a commit read from a checkout, once --------------------------------------------------------

@pytest.fixture(scope="module")
def commit_cache(tmp_path_factory: pytest.TempPathFactory, checkouts: Path) -> Path:
    """One $XDG_CACHE_HOME for the tests that read a checkout's commit (each commit is read once). The rolling
    recipe checkout's commit holds verl at ROLLING, whose shipped schema is its facts: it starts in the cache, as
    a first read would leave it (reading it takes minutes; dev/verl_schema.py --check, in test_verl_rules.py,
    reads ROLLING from those very files and compares it with the shipped schema)."""
    from importlib import resources

    from verlc.compiler.verl.commit import _extractor_digest

    root = tmp_path_factory.mktemp("cache")
    folder = root / "verlc" / "verl-commits"
    folder.mkdir(parents=True)
    shipped = resources.files("verlc.compiler.verl").joinpath("schemas", f"{ROLLING}.json.gz").read_bytes()
    (folder / f"{head(checkouts / 'verl-bcb6386-recipe')}-{_extractor_digest()}.json.gz").write_bytes(shipped)
    return root


def head(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.mark.parametrize("checkout, shipped, program", [
    ("verl-4f80e465", REPRODUCTION, "recipe.dapo.src.main_dapo"),  # (the rolling checkout's: in commit_cache)
])
def test_a_commit_is_read_from_its_checkout_once_then_cached(checkouts: Path, tmp_path: Path, commit_cache: Path,
                                                             checkout: str, shipped: str, program: str) -> None:
    folder = checkouts / checkout
    commit = head(folder)  # the checkout's own commit: verlc has no schema of it
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "dapo", "project": "p", "model": "m", "verl_commit": commit,
                                "verl_checkout": str(folder), "program": program, "code": str(folder),
                                "verl": nest({"algorithm.filter_groups.enable": True}, base_verl()),
                                "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                                "cluster": {"nodes": 1, "gpus_per_node": 8}}))
    env = {**os.environ, "XDG_CACHE_HOME": str(commit_cache)}

    def validate() -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "verlc", "validate", str(spec)], capture_output=True,
                              text=True, env=env, timeout=600)

    first, second = validate(), validate()
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert f"reading verl {commit[:12]}" in first.stderr
    # progress on what can take a minute: each trainer config, once composed, with the time so far
    assert re.search(rf"verlc: verl {commit[:12]}: ppo_trainer composed \((\d+ model_engine choices, )?\d+ other "
                     r"group options\) after \d+ s\n", first.stderr), first.stderr
    assert "reading verl" not in second.stderr
    cached = list((commit_cache / "verlc" / "verl-commits").glob(f"{commit}-*.json.gz"))
    assert len(cached) == 1
    # the same files as the shipped schema of the commit they were unpacked from
    known, read = commit_release(shipped, None), _release(commit, cached[0].read_bytes())
    assert (read.configs, read.classes, read.version) == (known.configs, known.classes, known.version)


def test_import_with_a_verl_checkout_pins_its_commit_and_names_it(checkouts: Path, tmp_path: Path,
                                                                   commit_cache: Path) -> None:
    """#53 item 8: `verlc import --verl-checkout DIR` pins DIR's commit (read from it where verlc has no schema
    of it: here the cache the test above filled) and writes DIR as the spec's verl_checkout, and the spec
    validates; a folder that is not a checkout, or --verl-version beside it, is refused."""
    folder = checkouts / "verl-4f80e465"
    script = tmp_path / "run_dapo.sh"
    script.write_text("python3 -m recipe.dapo.src.main_dapo trainer.nnodes=1 trainer.n_gpus_per_node=8 "
                      "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 "
                      "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 "
                      "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(commit_cache)}

    def verlc(*args: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "verlc", *map(str, args)], capture_output=True, text=True,
                              cwd=folder, env=env, timeout=900)

    result = verlc("import", script, "--verl-checkout", folder, "-o", tmp_path / "spec.yaml")
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "spec.yaml").read_text()
    assert f"verl_commit: {head(folder)}\n" in text and f"verl_checkout: {os.path.relpath(folder, tmp_path)}\n" in text
    assert verlc("validate", tmp_path / "spec.yaml").returncode == 0
    refused = verlc("import", script, "--verl-checkout", tmp_path, "-o", tmp_path / "b.yaml")
    assert refused.returncode == 2 and "not a git checkout" in refused.stderr, refused.stderr
    both = verlc("import", script, "--verl-checkout", folder, "--verl-version", "0.7.1", "-o", tmp_path / "b.yaml")
    assert both.returncode == 2 and "give one" in both.stderr and not (tmp_path / "b.yaml").exists()


def test_a_release_tags_commit_is_checked_against_that_releases_schema(tmp_path: Path) -> None:
    """#53 item 9: a verl_commit that is a release's tag (verl's own scripts pin them) needs no checkout: the
    release's shipped schema is that commit's; another unseen commit still asks for a checkout."""
    from verlc.compiler.verl.commit import RELEASE_TAGS
    from verlc.compiler.verl.release import snapshot

    assert sorted(RELEASE_TAGS.values()) == sorted(v for v in RELEASES if v != "0.9.1")  # 0.9.1 has no tag
    for commit, version in RELEASE_TAGS.items():
        assert commit_release(commit, None).configs == snapshot(version).configs
    spec = tmp_path / "spec.yaml"
    for commit, says in (("bec9ef74768dd201881cd4e54cd0385e87caae27", "checked against verl 0.7.1 at commit bec9ef74768d"),
                         ("1" * 40, "verlc has no schema of verl commit 111111111111 yet")):
        spec.write_text(json.dumps({"name": "tag", "project": "p", "model": "m", "verl_commit": commit,
                                    "verl": base_verl(), "data": {"train_files": ["t.parquet"],
                                                                  "val_files": ["v.parquet"]},
                                    "cluster": {"nodes": 1, "gpus_per_node": 8}}))
        result = subprocess.run([sys.executable, "-m", "verlc", "validate", str(spec)], capture_output=True,
                                text=True, timeout=300, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "c")})
        assert says in result.stdout + result.stderr, result.stderr


def test_a_checkout_whose_verl_has_uncommitted_changes_is_refused(checkouts: Path, tmp_path: Path,
                                                                 commit_cache: Path) -> None:
    """The job imports the code's own verl/: with the commit in its history, it must be that commit."""
    code = tmp_path / "code"
    subprocess.run(["cp", "-a", str(checkouts / "verl-bcb6386-recipe"), str(code)], check=True)
    main = code / "verl" / "trainer" / "main_ppo.py"
    main.write_text(main.read_text() + "# patched\n")
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "dapo", "project": "p", "model": "m", "verl_commit": head(code),
                                "program": "recipe.dapo.main_dapo", "code": "code", "verl": base_verl(),
                                "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                                "cluster": {"nodes": 1, "gpus_per_node": 8}}))
    result = build_code_spec(spec, tmp_path / "out", XDG_CACHE_HOME=str(commit_cache))
    assert result.returncode == 2, result.stderr
    assert re.search(r"spec\.yaml:\d+:\d+: verl_commit: the code's verl/ \(what the job imports\) differs from "
                     rf"commit {head(code)[:12]}", result.stderr), result.stderr
    assert not (tmp_path / "out").exists()


def test_reading_a_commit_without_hydra_says_how_to_get_it(checkouts: Path, tmp_path: Path) -> None:
    folder = checkouts / "verl-4f80e465"
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "dapo", "project": "p", "model": "m", "verl_commit": head(folder),
                                "verl_checkout": str(folder), "verl": base_verl(),
                                "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                                "cluster": {"nodes": 1, "gpus_per_node": 8}}))
    no_hydra = "import sys; sys.modules['hydra'] = None; from verlc.cli import main; sys.exit(main(sys.argv[1:]))"
    result = subprocess.run([sys.executable, "-c", no_hydra, "validate", str(spec)], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert result.returncode == 2, result.stderr
    assert "verl_checkout: reading verl's config at a commit needs Hydra, which verlc's install brings and this environment lacks: " \
           "pip install hydra-core" in result.stderr


# --- bad input: one positioned line each, exit 2, nothing written ---------------------------------

@pytest.mark.parametrize("change, where, says", [
    ({"hydra": {"config_name": "dapo_trainr"}}, "hydra.config_name", "did you mean 'dapo_trainer'"),
    ({"program": "recipe.dapo.main_dapoo"}, "program", "cannot find recipe.dapo.main_dapoo"),
    ({"verl_commit": "0" * 40}, "verl_checkout", "does not have commit 000000000000"),
    ({"code": "no/such/folder"}, "code", "no folder"),
    ({"defaults": ["ppo_trainer", "no_such_config", "_self_"]}, "program", "names 'no_such_config'"),
    ({"verl_version": "0.9.1"}, "verl_version", "installs as verl 0.8.0.dev0"),
], ids=["config-name", "program", "commit", "code", "defaults", "version"])
def test_bad_program_input_is_one_line_at_its_key(checkouts: Path, tmp_path: Path, change: dict[str, Any],
                                                  where: str, says: str) -> None:
    code = tmp_path / "code"
    subprocess.run(["cp", "-r", str(checkouts / "verl-bcb6386-recipe"), str(code)], check=True)
    defaults = change.pop("defaults", None)
    if defaults:
        config = code / "recipe" / "dapo" / "config" / "dapo_trainer.yaml"
        config.write_text(config.read_text().replace("  - ppo_trainer\n", "".join(f"  - {d}\n" for d in defaults
                                                                                 if d != "_self_"), 1))
    spec = tmp_path / "spec.yaml"
    data = {"name": "dapo", "project": "p", "model": "m", "verl_commit": ROLLING, "verl_checkout": str(code),
            "program": "recipe.dapo.main_dapo", "code": str(code), "verl": base_verl(),
            "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
            "cluster": {"nodes": 1, "gpus_per_node": 8}, **change}
    spec.write_text(json.dumps(data, indent=1))
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, "-m", "verlc", "build", str(spec), "--target", "ray-job", "--out",
                             str(out)], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.startswith(str(spec))]
    assert len(lines) == 1 and f": {where}: " in lines[0] and says in lines[0], result.stderr
    assert "Traceback" not in result.stderr and not out.exists()


# --- the examples start what the recipes' own scripts start ------------------------------------------

# What verlc derives from the spec's cluster and names (equal to the script's), and from its data, model and
# checkpoint folder (the spec names its own paths)
SAME = ("trainer.nnodes", "trainer.n_gpus_per_node", "trainer.project_name", "trainer.experiment_name")
PATHS = ("data.train_files", "data.val_files", "actor_rollout_ref.model.path", "trainer.default_local_dir")
# example -> (its script in the recipe checkout, the script's keys verl's config no longer has at the pinned
# commit and the names the recipe's own config gives them)
SCRIPTS = {
    "dapo-qwen2.5-32b": ("recipe/dapo/run_dapo_qwen2.5_32b.sh", {
        "reward_model.overlong_buffer.enable": "reward.reward_kwargs.overlong_buffer_cfg.enable",
        "reward_model.overlong_buffer.len": "reward.reward_kwargs.overlong_buffer_cfg.len",
        "reward_model.overlong_buffer.penalty_factor": "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor"}),
    "fully-async-dapo-qwen2.5-7b": ("verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_4.sh", {}),
}


def script_argv(script: Path, cwd: Path, tmp_path: Path) -> list[str]:
    """The trainer command a launch script runs, as it computes it: its own shell code runs with stand-ins for
    `ray` and `python`/`python3` on PATH that record their argv (and start nothing)."""
    tools = tmp_path / "tools"
    tools.mkdir()
    record = tmp_path / "argv.json"
    for name in ("ray", "python", "python3"):
        (tools / name).write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json, sys; json.dump(sys.argv[1:], "
                                  f"open(sys.argv[1], \"w\"))' {record} {name} \"$@\"\n")
        (tools / name).chmod(0o755)
    env = {"PATH": f"{tools}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), "PWD": str(cwd)}
    result = subprocess.run(["bash", str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    argv = json.loads(record.read_text())[1:]
    argv = argv[argv.index("--") + 1:] if argv[0] == "ray" else argv
    return ["python3", *argv[1:]]


@pytest.mark.parametrize("example", sorted(SCRIPTS))
def test_an_example_starts_the_program_with_its_scripts_overrides(recipes: list[Path], tmp_path: Path,
                                                                  example: str) -> None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    checkout = REPO / "checkouts" / "verl-bcb6386-recipe"
    script_path, stale = SCRIPTS[example]
    script = script_argv(checkout / script_path, checkout, tmp_path)
    job = json.loads((REPO / "out" / example / "ray-job" / "verlc_job" / "job.json").read_text())
    assert script[:3] == job["train"][:3] and script[1] == "-m"
    parser = OverridesParser.create()

    def values(args: list[str]) -> dict[str, Any]:
        return {o.key_or_group: o.value() for o in parser.parse_overrides([a for a in args if not a.startswith("-")])}

    theirs, ours = values(script[3:]), values(job["train"][3:])
    assert len(theirs) >= 50
    for key, value in theirs.items():
        if key in PATHS:
            assert key in ours, key
        elif key in stale:
            assert ours[stale[key]] == value, key
        else:
            assert ours.get(key) == value, f"{key}: the script passes {value!r}, the bundle {ours.get(key)!r}"
    assert not set(ours) - set(theirs) - set(stale.values()) - {"trainer.resume_mode"}, "keys the script lacks"
    if stale:  # what the example renames, verl itself refuses at that commit (Hydra composing the config)
        probe = ("import sys; from hydra import compose, initialize_config_dir\n"
                 "with initialize_config_dir(config_dir=sys.argv[1], version_base=None):\n"
                 "    for override in sys.argv[3:]:\n"
                 "        try:\n            compose(sys.argv[2], overrides=[override]); print('accepted', override)\n"
                 "        except Exception:\n            print('refused', override)\n")
        given = [f"{k}={next(a.split('=', 1)[1] for a in script if a.startswith(k + '='))}" for k in stale]
        config = job["train"][3].split("=", 1)[1]
        result = subprocess.run([sys.executable, "-c", probe, str(checkout / Path(script_path).parent / "config"),
                                 config, *given], cwd=checkout, capture_output=True, text=True, timeout=120)
        assert result.stdout.split() == [w for g in given for w in ("refused", g)], result.stdout + result.stderr


# --- the run's code at build time: named files, uncommitted changes, the working dir --------------

GIT = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
       "GIT_COMMITTER_EMAIL": "t@example.invalid", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def code_repo(root: Path) -> str:
    """A git checkout of a run's own code (a reward function); its commit."""
    root.mkdir(parents=True)
    (root / "rewards").mkdir()
    (root / "rewards" / "math.py").write_text("def compute_score(data_source, solution_str, ground_truth, "
                                              "extra_info=None):\n    return float(ground_truth in solution_str)\n")
    (root / ".gitignore").write_text("data/\n")
    env = {**os.environ, **GIT}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "reward"]):
        subprocess.run(["git", "-C", str(root), *args], env=env, check=True)
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def code_spec(tmp_path: Path, reward: str = "rewards/math.py", **extra: object) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "own-code", "project": "p", "model": "/models/m", "code": "code",
        "data": {"train_files": ["data/train.parquet"], "val_files": ["data/test.parquet"]},
        "verl": {**base_verl(), "reward": {"custom_reward_function": {"path": reward, "name": "compute_score"}}},
        "cluster": {"nodes": 1, "gpus_per_node": 8, "slurm": {"cpus_per_task": 8}}, **extra}))
    return spec


def build_code_spec(spec: Path, out: Path, target: str = "ray-job", **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verlc", "build", str(spec), "--target", target, "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **env})


def test_the_code_is_the_jobs_working_dir_and_its_files_are_hashed(tmp_path: Path) -> None:
    commit = code_repo(tmp_path / "code")
    result = build_code_spec(code_spec(tmp_path), tmp_path / "out")
    assert result.returncode == 0, result.stderr
    bundle = tmp_path / "out" / "own-code" / "ray-job"
    job = json.loads((bundle / "verlc_job" / "job.json").read_text())
    reward = tmp_path / "code" / "rewards" / "math.py"
    assert job["code"] == {"folder": "code", "commit": commit, "dirty": False, "diff_sha256": None,
                           "files": {"rewards/math.py": hashlib.sha256(reward.read_bytes()).hexdigest()}}
    assert "working_dir: code\n" in (bundle / "runtime_env.yaml").read_text()
    assert "reward.custom_reward_function.path=rewards/math.py" in job["train"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["code"]["commit"] == commit and not (bundle / "code.diff").exists()
    # Slurm without a container: the job's step runs in the code folder (relative to where sbatch runs)
    result = build_code_spec(code_spec(tmp_path), tmp_path / "out", "slurm")
    assert result.returncode == 0, result.stderr
    assert "\n  cd code\n" in (tmp_path / "out" / "own-code" / "slurm" / "sbatch.sh").read_text()


@pytest.mark.parametrize("reward, says", [
    ("rewards/nope.py", "verl.reward.custom_reward_function.path: no file rewards/nope.py in the run's code"),
    ("../outside.py", "verl.reward.custom_reward_function.path: ../outside.py lies outside the run's code"),
])
def test_a_file_a_setting_names_must_be_in_the_code(tmp_path: Path, reward: str, says: str) -> None:
    code_repo(tmp_path / "code")
    (tmp_path / "outside.py").write_text("x = 1\n")
    result = build_code_spec(code_spec(tmp_path, reward), tmp_path / "out")
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_uncommitted_changes_are_refused_for_a_reproducible_run_unless_accepted_and_then_recorded(
        tmp_path: Path) -> None:
    code_repo(tmp_path / "code")
    reward = tmp_path / "code" / "rewards" / "math.py"
    reward.write_text(reward.read_text() + "# tuned\n")
    (tmp_path / "code" / "notes.txt").write_text("untracked\n")
    spec = code_spec(tmp_path, reproducible=True, verl_version="0.9.1",
                     container={"runtime": "docker", "image": "verl@sha256:" + "0" * 64, "workdir": "/w"})
    refused = build_code_spec(spec, tmp_path / "out")
    assert refused.returncode == 2, refused.stderr
    assert re.search(r"spec\.yaml:\d+:\d+: code: the code in .* has uncommitted changes \(2 files\)", refused.stderr)
    assert not (tmp_path / "out").exists()
    accepted = build_code_spec(spec, tmp_path / "out", VERLC_ACCEPT_CHANGES="1")
    assert accepted.returncode == 0, accepted.stderr
    bundle = tmp_path / "out" / "own-code" / "ray-job"
    job = json.loads((bundle / "verlc_job" / "job.json").read_text())
    diff = (bundle / "code.diff").read_text()
    assert job["code"]["dirty"] is True and job["code"]["diff_sha256"] == hashlib.sha256(diff.encode()).hexdigest()
    assert "+# tuned" in diff and "untracked notes.txt sha256 " in diff
    assert job["code"]["files"]["rewards/math.py"] == hashlib.sha256(reward.read_bytes()).hexdigest()


def test_one_working_dir(tmp_path: Path) -> None:
    code_repo(tmp_path / "code")
    result = build_code_spec(code_spec(tmp_path, ray={"working_dir": "."}), tmp_path / "out")
    assert result.returncode == 2 and "ray.working_dir: the job's working_dir is the run's code" in result.stderr
    from test_kuberay import base as kube_base

    spec = tmp_path / "kube.yaml"  # the pods get the code through their image or a claim: a note says where
    spec.write_text(json.dumps(kube_base(code="code")))
    result = build_code_spec(spec, tmp_path / "out", "kuberay")
    assert result.returncode == 0, result.stderr
    assert "code: note: the pods run the job in /workspace/verl: the image must hold the run's code there" \
        in result.stderr, result.stderr


@pytest.mark.parametrize("rollout, says", [
    (None, "verl: fully_async_ppo_trainer gives the rollout GPUs of its own (rollout.n_gpus_per_node, default 8"),
    ({"nnodes": 2, "n_gpus_per_node": 4}, "verl.rollout.nnodes: the rollout shares the run's nodes"),
    ({"nnodes": 1, "n_gpus_per_node": 8}, "verl.rollout.n_gpus_per_node: rollout.n_gpus_per_node must leave"),
])
def test_an_asynchronous_program_splits_each_node_between_trainer_and_rollout(
        checkouts: Path, tmp_path: Path, rollout: dict[str, int] | None, says: str) -> None:
    code = checkouts / "verl-bcb6386-recipe"
    verl = {**base_verl(), **({"rollout": rollout} if rollout else {})}
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({"name": "async", "project": "p", "model": "m", "verl_commit": ROLLING,
                                "program": "verl.experimental.fully_async_policy.fully_async_main",
                                "code": str(code), "verl": verl,
                                "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                                "cluster": {"nodes": 1, "gpus_per_node": 8}}))
    result = build_code_spec(spec, tmp_path / "out")
    assert result.returncode == 2 and says in result.stderr, result.stderr
    fixed = {**json.loads(spec.read_text()), "verl": {**base_verl(), "rollout": {"nnodes": 1, "n_gpus_per_node": 3}}}
    spec.write_text(json.dumps(fixed))
    result = build_code_spec(spec, tmp_path / "out")
    assert result.returncode == 0, result.stderr
    job = json.loads((tmp_path / "out" / "async" / "ray-job" / "verlc_job" / "job.json").read_text())
    assert "trainer.n_gpus_per_node=5" in job["train"] and "rollout.n_gpus_per_node=3" in job["train"]


def test_explain_knows_a_recipes_own_keys(recipes: list[Path]) -> None:
    from conftest import run_verlc

    sppo = next(s for s in recipes if s.stem.startswith("sppo"))
    result = run_verlc("explain", "actor_rollout_ref.actor.sppo_eta", sppo)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[:4] == [
        "actor_rollout_ref.actor.sppo_eta  (verl 0.8.0.dev0 at commit bcb638649a50, recipe.sppo.main_sppo with "
        "sppo_trainer)", "  type:     a number", "  default:  1.0",
        "  verl builds it as SPPOActorConfig.sppo_eta (recipe.sppo.config.SPPOActorConfig)"]
    dapo = next(s for s in recipes if s.stem.startswith("dapo"))
    result = run_verlc("explain", "algorithm.filter_groups.max_num_gen_batchs", dapo)
    assert result.returncode == 2 and "did you mean 'algorithm.filter_groups.max_num_gen_batches'" in result.stderr


def test_a_spec_pinned_to_a_commit_is_not_checked_against_the_installed_verl(recipes: list[Path]) -> None:
    spec = REPO / "specs" / "recipes" / "dapo-qwen2.5-32b.yaml"
    result = subprocess.run([sys.executable, "-m", "verlc", "validate", str(spec), "--verl-config", "live"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert ": verl_commit: --verl-config live checks against the installed verl; this spec pins verl to commit " \
           "bcb638649a50" in result.stderr, result.stderr


# --- verl's own programs (#43) ------------------------------------------------------------------------------

def own_program_spec(tmp: Path, version: str, module: str, nodes: int = 1) -> Path:
    spec = tmp / "spec.yaml"
    spec.write_text(f"""\
name: sft
project: p
verl_version: "{version}"
program: {module}
model: Qwen/Qwen2.5-0.5B-Instruct
data: {{train_files: [t.parquet], val_files: [v.parquet]}}
verl: {{data: {{max_length: 512}}, trainer: {{logger: [console]}}}}
cluster: {{nodes: {nodes}, gpus_per_node: 4}}
""")
    return spec


@pytest.mark.parametrize(("version", "module", "model_key"), [
    ("0.4.1", "verl.trainer.fsdp_sft_trainer", "model.partial_pretrain"),
    ("0.9.1", "verl.trainer.sft_trainer", "model.path"),
])
def test_an_sft_program_is_started_with_torchrun_on_its_node(tmp_path: Path, version: str, module: str,
                                                             model_key: str) -> None:
    ir = compile_spec(own_program_spec(tmp_path, version, module), CATALOG, display="spec.yaml",
                      source="spec.yaml", targets=["ray-job"])
    assert ir.program_argv == ("torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=4", "-m", module)
    assert f"{model_key}=Qwen/Qwen2.5-0.5B-Instruct" in ir.trainer_argv
    assert not any(a.startswith(("actor_rollout_ref.", "critic.")) for a in ir.trainer_argv)  # not PPO's keys
    assert ir.data_columns == () and ir.startup is None  # the program's own: verlc does not know them


@pytest.mark.parametrize("target", ["slurm", "ray-job"])
def test_an_sft_program_on_more_than_one_node_is_torchrun_on_every_node(tmp_path: Path, target: str) -> None:
    """No --standalone: the runtime adds each node's rank and the rendezvous at its own node (Job.every_node)."""
    spec = own_program_spec(tmp_path, "0.9.1", "verl.trainer.sft_trainer", nodes=2)
    spec.write_text(spec.read_text().replace("gpus_per_node: 4}", "gpus_per_node: 4, slurm: {cpus_per_task: 8}}"))
    built = subprocess.run([sys.executable, "-m", "verlc", "build", str(spec), "--target", target, "--out",
                            str(tmp_path / "out")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    folder = next((tmp_path / "out").glob(f"*/{target}"))
    text = (folder / "sbatch.sh").read_text() if target == "slurm" else (folder / "verlc_job/job.json").read_text()
    job = Job.from_json(text.split("<<'VERLC_JOB'\n", 1)[1].split("\nVERLC_JOB\n", 1)[0]
                        if target == "slurm" else text)
    assert job.every_node and job.nodes == 2 and job.total_gpus == 8
    assert job.train[:5] == ["torchrun", "--nnodes=2", "--nproc_per_node=4", "-m", "verl.trainer.sft_trainer"]
    one = own_program_spec(tmp_path, "0.9.1", "verl.trainer.sft_trainer")
    assert not job_of(compile_spec(one, CATALOG, display="s.yaml", source="s.yaml", targets=["ray-job"]),
                      record=None).every_node


@pytest.mark.parametrize(("module", "nodes", "where", "says"), [
    ("verl.trainer.sft_trainer_ray", 1, "program", "does not build a bundle for it yet"),
])
def test_what_of_verls_own_programs_is_not_built_is_refused_at_its_line(
        tmp_path: Path, module: str, nodes: int, where: str, says: str) -> None:
    spec = own_program_spec(tmp_path, "0.9.1", module, nodes)
    built = subprocess.run([sys.executable, "-m", "verlc", "build", str(spec), "--target", "ray-job", "--out",
                            str(tmp_path / "out")], capture_output=True, text=True)
    assert built.returncode == 2 and not (tmp_path / "out").exists(), built.stderr
    line = next(line for line in built.stderr.splitlines() if f": {where}: " in line)
    assert says in line and line.startswith(f"{spec}:"), built.stderr
    checked = subprocess.run([sys.executable, "-m", "verlc", "validate", str(spec)], capture_output=True, text=True)
    # verl:'s keys are checked against the program's own config: evaluation's has no data.max_length
    assert (checked.returncode == 0) == (module != "verl.trainer.main_eval"), checked.stderr


def test_a_key_of_another_programs_config_is_not_said_to_exist_in_other_releases(tmp_path: Path) -> None:
    """The hint 'exists in verl X' compares the same program's config across releases, not main_ppo's: verl's
    evaluation config never had `trainer`, though ppo_trainer has it in every release."""
    spec = own_program_spec(tmp_path, "0.9.1", "verl.trainer.main_eval")
    checked = subprocess.run([sys.executable, "-m", "verlc", "validate", str(spec)], capture_output=True, text=True)
    line = next(line for line in checked.stderr.splitlines() if ": verl.trainer: " in line)
    assert line.endswith("verl 0.9.1 has no key 'trainer' at the top level"), line
    sft = own_program_spec(tmp_path, "0.7.1", "verl.trainer.sft_trainer")
    sft.write_text(sft.read_text().replace("max_length: 512", "micro_batch_size: 4"))
    checked = subprocess.run([sys.executable, "-m", "verlc", "validate", str(sft)], capture_output=True, text=True)
    assert "verl.data.micro_batch_size: verl 0.7.1 has no key 'micro_batch_size' under 'data'" in checked.stderr
    assert "exists in verl" not in checked.stderr, checked.stderr  # no release's sft_trainer_engine has it


def test_a_program_the_pinned_commit_lacks_is_named_with_the_commits_programs(tmp_path: Path) -> None:
    """#53 item 9: verl removed main_generation; a spec pinned to a commit without it is not told to pin one."""
    from conftest import run_verlc

    (tmp_path / "spec.yaml").write_text("""\
name: gen
project: p
model: /models/m
verl_commit: bcb638649a50e58494a8ddd92085ad1174f674b8
program: verl.trainer.main_generation
data: {train_files: [/d/t.parquet], val_files: [/d/v.parquet]}
cluster: {nodes: 1, gpus_per_node: 8, slurm: {cpus_per_task: 4}}
container: {runtime: none}
""")
    done = run_verlc("validate", "spec.yaml", cwd=tmp_path)
    assert done.returncode == 2 and "pin verl_commit" not in done.stderr, done.stderr
    assert "spec.yaml:5:10: program: cannot find verl.trainer.main_generation" in done.stderr
    assert "verl at bcb638649a50 has no such program (its programs: " in done.stderr
    assert "verl.trainer.main_generation_server" in done.stderr, done.stderr
