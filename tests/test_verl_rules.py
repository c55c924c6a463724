"""verl checks beyond the differential tests: rules verl only finds once workers start, the snapshot
kept in step with verl, live and snapshot giving the same verdicts, and the bundled config."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from conftest import REPO, SPECS, run_verlc, slurm_job
from test_verl_differential import verlc_problems
from verlc.compiler.verl.commit import COMMITS
from verlc.compiler.verl.release import RELEASES
from verlc.compiler.verl.rules import WORKERS_NOTE

INVALID = sorted((REPO / "tests" / "invalid").glob("*.yaml"))
GOOD = {"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 64, "ppo_micro_batch_size_per_gpu": 4},
                              "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4}},
        "algorithm": {"adv_estimator": "grpo"}, "data": {"train_batch_size": 256}}


def with_(**changes: object) -> dict:
    import copy

    verl = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        node = verl
        *parents, last = dotted.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return verl


def test_a_good_config_passes(tmp_path: Path) -> None:
    assert verlc_problems(tmp_path, GOOD, nodes=2, gpus=8) == []


@pytest.mark.parametrize(("changes", "nodes", "gpus", "expected"), [
    # verl #606/#1524: 64 x 1 / 16 GPUs = 4 per GPU, not divisible by 8
    ({"actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 8}, 2, 8, "the per-GPU mini batch (64 x 1 / 16 = 4)"),
    # 8 x 1 / 16 = 0 per GPU
    ({"actor_rollout_ref__actor__ppo_mini_batch_size": 8}, 2, 8, "is 0 per GPU"),
    # verl's RolloutReplica (0.6.0 on): a replica of TP 8 cannot fill whole nodes of 6 GPUs
    ({"actor_rollout_ref__rollout__tensor_model_parallel_size": 8, "data__train_batch_size": 192,
      "actor_rollout_ref__actor__ppo_mini_batch_size": 48}, 3, 6, "must fill whole nodes of 6 GPUs"),
    ({"actor_rollout_ref__rollout__tensor_model_parallel_size": 4, "data__train_batch_size": 192,
      "actor_rollout_ref__actor__ppo_mini_batch_size": 48, "actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 1},
     1, 6, "6 GPUs are not divisible by rollout TP x DP x PP = 4 x 1 x 1"),
])
def test_rules_verl_finds_only_once_workers_start(tmp_path: Path, changes: dict, nodes: int, gpus: int,
                                                   expected: str) -> None:
    problems = verlc_problems(tmp_path, with_(**changes), nodes=nodes, gpus=gpus)
    assert any(expected in p and p.endswith(WORKERS_NOTE) for p in problems), problems


def test_every_shipped_schema_is_what_its_release_says() -> None:
    """dev/verl_schema.py regenerates every release's schema and descriptions from its own files; any drift fails."""
    result = subprocess.run([sys.executable, str(REPO / "dev" / "verl_schema.py"), "--check"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    # read again, or read from the very same inputs before (schemas/inputs.json: the reader is deterministic)
    again = r"( \(read from the same inputs before\))?\n"
    for version in RELEASES:  # the facts every check reads, and the descriptions editors and explain show
        for name in (f"{version}.json.gz", f"{version}.docs.json.gz"):
            assert re.search(rf"compiler/verl/schemas/{re.escape(name)}: matches verl {re.escape(version)}'s own "
                             rf"files{again}", result.stdout), name
    for commit in COMMITS:  # the commits recipes pin, from their source in ../shared/verl-recipe
        assert re.search(rf"compiler/verl/schemas/{commit}.json.gz: matches verl {commit[:12]}'s own files{again}",
                         result.stdout), commit


def test_the_record_of_each_schemas_inputs_is_current() -> None:
    """compiler/verl/schemas/inputs.json names the inputs each shipped file was read from, so that the check above
    reads only what changed. A stale record does not make the check wrong, only slow: every release read again,
    five minutes of the suite on both cores (it happened: an edit of compiler/verl/ left unrecorded). Record it
    with `dev/verl_schema.py --check --record` after editing what reads the releases."""
    sys.path.insert(0, str(REPO / "dev"))
    try:
        import verl_schema
    finally:
        sys.path.pop(0)
    recorded, folder = json.loads(verl_schema.INPUTS.read_text()), REPO / "compiler" / "verl" / "schemas"
    shipped = [*((n, verl_schema.release_package(v)) for v in verl_schema.RELEASES
                 for n in (f"{v}.json.gz", f"{v}.docs.json.gz")),
               *((f"{c}.json.gz", verl_schema.commit_tarball(c)) for c in verl_schema.COMMITS)]
    # what --check would read again (a commit whose source is not here is not read at all)
    stale = sorted(name for name, source in shipped if source is not None
                   and not verl_schema.unchanged(name, folder / name, source, recorded))
    assert stale == [], f"not recorded as read from these inputs: {stale}; run dev/verl_schema.py --check --record"


def test_a_schema_is_read_again_once_any_of_its_inputs_changes(tmp_path: Path) -> None:
    """The check skips a release whose shipped files were read (or found equal) from the very same inputs:
    a byte changed in the release's files, in the shipped file, or in what reads them, reads it again."""
    import shutil

    sys.path.insert(0, str(REPO / "dev"))
    import verl_schema

    name, shipped = "0.3.0.post1.json.gz", REPO / "compiler" / "verl" / "schemas" / "0.3.0.post1.json.gz"
    package = tmp_path / "verl"
    shutil.copytree(verl_schema.release_package("0.3.0.post1"), package)
    # the record as a read of these inputs by today's reader writes it (the committed one may predate an edit
    # of the reader, which only makes the suite's check read everything again)
    recorded = {name: {"inputs": verl_schema.inputs_digest(package),
                       "sha256": hashlib.sha256(shipped.read_bytes()).hexdigest()}}
    assert verl_schema.unchanged(name, shipped, package, recorded)
    config = package / "trainer" / "config" / "ppo_trainer.yaml"
    config.write_text(config.read_text() + "# edited\n")
    assert not verl_schema.unchanged(name, shipped, package, recorded)
    config.write_text(config.read_text().removesuffix("# edited\n"))
    assert verl_schema.unchanged(name, shipped, package, recorded)
    edited = tmp_path / name
    edited.write_bytes(shipped.read_bytes() + b"\0")
    assert not verl_schema.unchanged(name, edited, package, recorded)
    assert not verl_schema.unchanged(name, shipped, package, {**recorded, name: {**recorded[name], "inputs": "0"}})


def test_hydra_parses_each_file_once_and_sees_an_edited_one(tmp_path: Path) -> None:
    """Reading a release or a commit composes its configs hundreds of times; each YAML file is parsed once per
    process, and every composition still gets what Hydra alone composes from the files as they are."""
    from omegaconf import OmegaConf

    from verlc.compiler.verl import extract

    (tmp_path / "optim").mkdir()
    (tmp_path / "trainer.yaml").write_text("defaults:\n  - optim: adam\n  - _self_\nsteps: 1\n")
    (tmp_path / "optim" / "adam.yaml").write_text("lr: 0.1\nbetas: [0.9, 0.99]\n")
    (tmp_path / "optim" / "sgd.yaml").write_text("lr: 0.5\n")
    shipped = vars(OmegaConf)["load"]
    assert extract.compose(tmp_path, "trainer", []) == {"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "steps": 1}
    assert extract.compose(tmp_path, "trainer", ["optim=sgd", "steps=2"]) == {"optim": {"lr": 0.5}, "steps": 2}
    assert extract.compose(tmp_path, "trainer", ["optim.lr=0.3"])["optim"] == {"lr": 0.3, "betas": [0.9, 0.99]}
    parsed = sorted(Path(key[0]).name for key in extract._PARSED if key[0].startswith(str(tmp_path.resolve())))
    assert parsed == ["adam.yaml", "sgd.yaml", "trainer.yaml"]  # three files parsed once each, over three compositions
    (tmp_path / "optim" / "adam.yaml").write_text("lr: 0.25\n")  # an edited file is parsed again
    assert extract.compose(tmp_path, "trainer", [])["optim"] == {"lr": 0.25}
    assert vars(OmegaConf)["load"] is shipped  # OmegaConf as it was, outside the compositions


def test_live_reads_the_installed_verl_as_the_snapshot_does() -> None:
    from verlc.compiler.verl.release import live, snapshot

    installed, shipped = live(), snapshot(live().version)
    assert (installed.configs, installed.classes, installed.allowed, installed.targets) == (
        shipped.configs, shipped.classes, shipped.allowed, shipped.targets)


def test_live_and_snapshot_give_the_same_verdicts() -> None:
    """Every example and every invalid spec: the same problems, at the same places, either way. Live mode reads the
    installed verl, so the specs written for another release (the GPU rehearsals' 0.5.0 and 0.6.1) and the unknown-version
    spec are left out: for them it checks the installed verl's version instead."""
    from importlib.metadata import version

    from verlc.compiler.load import load

    examples = [p for p in SPECS if load(p).data.get("verl_version", "0.9.1") == version("verl")]  # with extends:
    assert {p.stem for p in SPECS} - {p.stem for p in examples} == {"gpu-rehearsal-reinforce", "gpu-rehearsal-judge",
                                                                  "gpu-rehearsal-sft", "gpu-rehearsal-sft-two-nodes",
                                                                  "search-r1-retriever"}  # 0.7.1: its SearchTool
    specs = [*examples, *(p for p in INVALID if p.stem != "verl-unknown-version")]
    for group in (examples, specs):
        snap = run_verlc("validate", *group)
        live = run_verlc("validate", "--verl-config", "live", *group)
        assert snap.returncode == live.returncode
        assert snap.stderr == live.stderr
        assert snap.stdout.replace("(snapshot)", "(live)") == live.stdout


def test_unknown_verl_version_names_the_known_ones(tmp_path: Path) -> None:
    result = run_verlc("validate", REPO / "tests" / "invalid" / "verl-unknown-version.yaml")
    assert result.returncode == 2 and f"known: {', '.join(RELEASES)}" in result.stderr


def test_bundled_config_is_what_verl_prints_with_cfg_job(tmp_path: Path) -> None:
    """verl-config.yaml equals `python -m verl.trainer.main_ppo <overrides> --cfg job` for scenario A."""
    from verlc.compiler.pipeline import compile_spec
    from verlc.targets import CATALOG

    spec = REPO / "specs" / "qwen2-7b-gsm8k-ppo-mi300.yaml"
    bundle = REPO / "out" / spec.stem / "slurm"
    overrides = list(compile_spec(spec, CATALOG, display="a", source="a").trainer_argv[3:])
    assert slurm_job((bundle / "sbatch.sh").read_text())["train"][3:] == overrides
    printed = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides, "--cfg", "job"],
                             capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert printed.returncode == 0, printed.stderr[-2000:]
    yaml = YAML(typ="safe", pure=True)
    assert yaml.load(bundle.joinpath("verl-config.yaml").read_text()) == yaml.load(printed.stdout)
