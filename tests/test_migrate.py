"""`verlc migrate`: a spec moved to another verl release keeps what its user wrote and how it behaves.

The property test moves every example spec, and a spec written for each release, to every other release
(up and back down), and checks the rewritten spec three ways: verlc's compiler against the target release,
verl's own Hydra and dataclasses for that release (tests/verl_oracle.py, one process per release), and the
resolved config (`verl-config.yaml`, resolved by OmegaConf rather than verlc): every setting the user
wrote is there, at its new name, and every default the spec relied on has its old value.
"""

from __future__ import annotations

import json
import random
import re
import multiprocessing
import shutil
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from conftest import MAIN_PPO_SPECS, run_verlc
from test_verl_releases import RULED, baseline, leaves, nest, oracle
from verlc.compiler import migrate
from verlc.compiler.verl import moves as verl_moves
from verlc.compiler.verl.hydra import SERVICE_ATTRIBUTES, service_variable
from verlc.compiler.diagnostics import SpecError
from verlc.compiler.load import load
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.compiler.verl.check import select, settings
from verlc.compiler.verl.place import KNOWN, Walker
from verlc.compiler.verl.release import DEFAULT_CONFIG, MISSING, RELEASES, snapshot

OLD_SPEC = """\
# A PPO run written for verl 0.5.0.
name: old-run
verl_version: 0.5.0
project: p
model: Qwen/Qwen2.5-0.5B-Instruct
data:
  train_files: [data/train.parquet]
  val_files: [data/test.parquet]
verl:
  data: {train_batch_size: 256, max_prompt_length: 512}
  actor_rollout_ref:
    actor:
      optim: {lr: 1e-6}   # the paper's lr
      ppo_mini_batch_size: 64
      ppo_micro_batch_size_per_gpu: 4
    rollout: {name: "vllm", log_prob_micro_batch_size_per_gpu: 8}
    ref: {log_prob_micro_batch_size_per_gpu: 4}
  critic: {optim: {lr: 1e-5}, ppo_micro_batch_size_per_gpu: 4}
  reward_model:
    reward_manager: dapo   # DAPO's overlong reward
  trainer: {logger: [console], total_epochs: 3, profile_steps: [1, 2]}
cluster: {nodes: 1, gpus_per_node: 8}
container: {runtime: none}
"""


# --- the moves table --------------------------------------------------------------------------------


def has(version: str, key: str) -> bool:
    """Whether the release's default trainer config has `key` (in its YAML or declared by a dataclass)."""
    release = snapshot(version)
    places = [Walker(release, c, e).place(key.split(".")) for c in release.configs for e in release.engines(c)]
    return any(p.status == KNOWN and (p.in_yaml or (p.owner and key.rsplit(".", 1)[-1] in p.owner.fields))
               for p in places)


@pytest.mark.parametrize("move", verl_moves.MOVES, ids=lambda m: f"{m.release}:{m.old}")
def test_each_move_is_what_the_releases_show(move: verl_moves.Move) -> None:
    before = RELEASES[RELEASES.index(move.release) - 1]
    assert has(before, move.old), f"verl {before} has no {move.old}"
    assert not has(before, move.new) or move.new.startswith(move.old), f"verl {before} has {move.new} already"
    assert has(move.release, move.new), f"verl {move.release} has no {move.new}"
    # the old name is gone, or kept only for old specs (a deprecated alias or a placeholder section)
    assert not has(move.release, move.old) or verl_moves.placeholder(move.old, move.release)


def test_carry_follows_chained_moves_both_ways() -> None:
    key = "actor_rollout_ref.rollout.skip_dump_dir"
    up, moves = verl_moves.carry(key, "0.7.1", "0.9.1")
    assert up == "skip.rollout.dump_dir" and [m.release for m in moves] == ["0.8.0", "0.9.0"]
    assert verl_moves.carry(up, "0.9.1", "0.7.1")[0] == key
    assert verl_moves.carry("reward_model.rollout.max_num_seqs", "0.6.0", "0.8.0")[0] == \
        "reward.reward_model.rollout.max_num_seqs"
    assert verl_moves.carry("reward_model.enable", "0.7.1", "0.9.1") == ("reward_model.enable", ())
    assert verl_moves.carry("trainer.total_epochs", "0.3.0.post1", "0.9.1") == ("trainer.total_epochs", ())


# --- the command ------------------------------------------------------------------------------------


def test_migrate_prints_a_diff_and_a_report_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "old.yaml"
    spec.write_text(OLD_SPEC)
    result = run_verlc("migrate", "old.yaml", "--to", "0.9.1", cwd=tmp_path)
    assert spec.read_text() == OLD_SPEC
    assert result.returncode == 1, result.stderr  # rollout.mode: 0.9.1 refuses 0.6.0's sync
    assert result.stdout.startswith("--- a/old.yaml\n+++ b/old.yaml\n")
    assert "-verl_version: 0.5.0\n+verl_version: 0.9.1\n" in result.stdout
    report = result.stderr
    assert "reward_model.reward_manager: -> reward.reward_manager.name (verl 0.7.1) (old.yaml:20:5)" in report
    assert "trainer.profile_steps: -> global_profiler.steps (verl 0.6.0) (old.yaml:21:49)" in report
    assert "actor_rollout_ref.rollout.max_num_seqs: 1024 (verl 0.9.1's default: 256)" in report
    assert "actor_rollout_ref.rollout.mode: the spec relied on verl 0.5.0's default sync; 0.9.1's is async" in report
    assert "actor_rollout_ref.rollout.load_format: the spec relied on verl 0.5.0's default dummy_dtensor" in report
    assert "2 decision(s) left for you; the migrated spec validates against verl 0.9.1" in report


def test_write_keeps_comments_quotes_and_order(tmp_path: Path) -> None:
    spec = tmp_path / "old.yaml"
    spec.write_text(OLD_SPEC)
    result = run_verlc("migrate", "old.yaml", "--to", "0.9.1", "--write", cwd=tmp_path)
    assert result.returncode == 1 and "rewrote old.yaml" in result.stdout, result.stderr
    text = spec.read_text()
    assert "      optim: {lr: 1e-6}   # the paper's lr\n" in text
    assert 'rollout: {name: "vllm", log_prob_micro_batch_size_per_gpu: 8, enforce_eager: true, max_num_seqs: 1024' in text
    assert "  reward:\n    reward_manager:\n      name: dapo  # DAPO's overlong reward\n" in text
    assert "reward_model" not in text and "profile_steps" not in text
    # the moved section took the old one's place, before `trainer`
    assert text.index("  reward:") < text.index("  trainer:")
    assert [k for k in yaml.safe_load(text)] == [k for k in yaml.safe_load(OLD_SPEC)]
    assert not list(tmp_path.glob(".*verlc-migrate"))
    checked = run_verlc("validate", "old.yaml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stderr
    again = run_verlc("migrate", "old.yaml", "--to", "0.9.1", cwd=tmp_path)
    assert again.returncode == 0 and again.stdout == "" and "nothing to do" in again.stderr


def test_markdown_report_for_a_pull_request(tmp_path: Path) -> None:
    (tmp_path / "old.yaml").write_text(OLD_SPEC)
    result = run_verlc("migrate", "old.yaml", "--to", "0.9.1", "--format", "markdown", cwd=tmp_path)
    out = result.stdout
    assert out.startswith("# verlc migrate old.yaml: verl 0.5.0 -> 0.9.1\n\n## Moved\n\n- `reward_model.reward_manager`")
    decisions = out.split("\n## Decisions for you (not migrated automatically)\n\n", 1)[1].split("\n\n", 1)[0]
    assert [line.split("`")[1] for line in decisions.splitlines()] == [
        "actor_rollout_ref.rollout.load_format", "actor_rollout_ref.rollout.mode"]
    assert "\n```diff\n--- a/old.yaml\n" in out and out.endswith("```\n")


def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    spec = tmp_path / "old.yaml"
    spec.write_text(OLD_SPEC.replace("ppo_mini_batch_size: 64", "ppo_mini_batch_sise: 64"))
    before = spec.read_text()
    result = run_verlc("migrate", "old.yaml", "--to", "0.9.1", "--write", cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert "old.yaml:14:7: verl.actor_rollout_ref.actor.ppo_mini_batch_sise: verl 0.5.0" in result.stderr
    assert spec.read_text() == before
    spec.write_text(OLD_SPEC)
    result = run_verlc("migrate", "old.yaml", "--to", "0.9.9", cwd=tmp_path)
    assert result.returncode == 2 and "verlc has no schema for verl 0.9.9" in result.stderr


BASE = """\
verl_version: 0.5.0
verl:
  trainer:
    profile_steps: [3]   # shared by every run of this study
    total_epochs: 2
"""


def test_keys_from_a_base_change_only_with_write_bases(tmp_path: Path) -> None:
    base = tmp_path / "base.yaml"
    base.write_text(BASE)
    spec = tmp_path / "run.yaml"
    spec.write_text("extends: base.yaml\n" + "\n".join(
        line for line in OLD_SPEC.splitlines() if "verl_version" not in line and "trainer:" not in line) + "\n")
    result = run_verlc("migrate", "run.yaml", "--to", "0.6.1", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert ("trainer.profile_steps: moved in a base spec: -> global_profiler.steps (verl 0.6.0); rerun with "
            "--write-bases to rewrite the base (base.yaml:4:5)") in result.stderr
    assert "--- a/run.yaml" in result.stdout and "--- a/base.yaml" not in result.stdout
    result = run_verlc("migrate", "run.yaml", "--to", "0.6.1", "--write", cwd=tmp_path)
    assert result.returncode == 1 and base.read_text() == BASE
    spec.write_text(spec.read_text().replace("verl_version: 0.6.1\n", ""))
    result = run_verlc("migrate", "run.yaml", "--to", "0.6.1", "--write", "--write-bases", cwd=tmp_path)
    assert "rewrote base.yaml" in result.stdout and "rewrote run.yaml" in result.stdout, result.stderr
    assert "    total_epochs: 2\n  global_profiler:\n    steps: [3]  # shared by every run of this study\n" \
        not in base.read_text()
    assert "  global_profiler:\n    steps: [3]  # shared by every run of this study\n" in base.read_text()
    assert "verl_version: 0.6.1" in spec.read_text()
    assert run_verlc("validate", "run.yaml", cwd=tmp_path).returncode == 0


# --- the property: every spec, every release pair, both ways ------------------------------------------

SKIP = (*RULED, "_target_", "path", "dir", "file", "seed", "port", "profiler", "tool_config", "nsight", "save_")


@cache
def written_for(version: str) -> dict[str, Any]:
    """A spec's `verl:` section as a user of `version` would write it: the baseline, a seeded sample of that
    release's settings at their defaults, and every key the moves table carries; valid in `version`."""
    release = snapshot(version)
    tree = release.tree(DEFAULT_CONFIG, release.default_engine(DEFAULT_CONFIG))
    rng = random.Random(f"migrate-{version}")
    plain = [(k, v) for k, v in leaves(tree) if isinstance(v, (bool, int, float, str)) and v != MISSING
             and not (isinstance(v, str) and "${" in v) and not any(s in k for s in SKIP)
             and not verl_moves.placeholder(k, version)]
    flat = dict(rng.sample(plain, min(12, len(plain))))
    flat.update((k, v) for m in verl_moves.MOVES for k, v in leaves(tree)
                if (k == m.old or k.startswith(m.old + ".")) and "_target_" not in k
                and isinstance(v, (bool, int, float, str, list))
                and v != MISSING and not (isinstance(v, str) and "${" in v))
    return nest(flat, baseline(version))


def spec_text(verl: dict[str, Any], version: str) -> str:
    return json.dumps({"name": "m", "project": "p", "model": "Qwen/Qwen2.5-0.5B-Instruct", "verl_version": version,
                       "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                       "cluster": {"nodes": 1, "gpus_per_node": 8}, "container": {"runtime": "none"},
                       "verl": verl}, indent=2) + "\n"


def resolved(path: Path) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """The rewritten spec's `verl:` section, its settings (dotted key -> value) and its resolved verl config
    (the bundle's verl-config.yaml, resolved by OmegaConf rather than verlc)."""
    ir = compile_spec(path, CATALOG, display=str(path), source=path.name)
    data = load(path).data
    chosen = select(data["verl"], snapshot(data.get("verl_version", "0.9.1")))
    assert not isinstance(chosen, str), chosen
    return (data["verl"], {s.key: s.value for s in settings(data["verl"], chosen.walker)},
            OmegaConf.create(yaml.load(ir.verl_config, Loader=yaml.CSafeLoader)))


def value_at(config: Any, key: str) -> Any:
    try:
        found = OmegaConf.select(config, key, throw_on_resolution_failure=False)
    except Exception:  # an interpolation of an env var that is not set here
        return "<unresolvable>"
    return OmegaConf.to_container(found) if OmegaConf.is_config(found) else found


def pairs() -> list[tuple[str, str, str]]:
    """A spec written for each release to every newer release (and back, in the test); the examples, which
    are written for the newest, to every older one (and back)."""
    out = [(f"example:{s.name}", "0.9.1", v) for s in MAIN_PPO_SPECS for v in RELEASES if v != "0.9.1"]
    out += [("written", a, b) for i, a in enumerate(RELEASES) for b in RELEASES[i + 1:]]
    return out


def migrated(job: tuple[int, str, str, str, Path]) -> tuple[list[str], dict[str, Any] | None, bool, bool]:
    """One migration there and back: (problems, the oracle's case for the migrated spec, whether it validates,
    whether it left decisions)."""
    n, kind, source, target, tmp_path = job
    failures: list[str] = []
    folder = tmp_path / str(n)
    folder.mkdir()
    spec = folder / "spec.yaml"
    if kind.startswith("example:"):
        shutil.copy(next(s for s in MAIN_PPO_SPECS if s.name == kind[8:]), spec)
    else:
        spec.write_text(spec_text(written_for(source), source))
    _, wrote, before = resolved(spec)
    p = migrate.plan(spec, target, CATALOG)
    migrate.write(p)
    label = f"{kind} {source} -> {target}"
    try:
        kept, _, after = resolved(spec)
    except SpecError as exc:
        assert p.decisions and not p.valid, f"{label}: plan said valid, but {exc}"
        return failures, None, False, bool(p.decisions)
    assert p.valid, f"{label}: the plan said invalid, the compiler accepts it"
    lost = {c.key for c in p.changes if c.kind in ("dropped", "decision", "review")}
    for key, value in wrote.items():
        new_key, _ = verl_moves.carry(key, source, target)
        if key in lost or new_key in lost:
            continue
        if value_at(after, new_key) != value_at(before, key):
            failures.append(f"{label}: {key}={value!r} became {new_key}={value_at(after, new_key)!r}")
    for c in p.of("pinned"):
        old_key = verl_moves.carry(c.key, target, source)[0]
        if value_at(after, c.key) != value_at(before, old_key):
            failures.append(f"{label}: pinned {c.key} is {value_at(after, c.key)!r}, "
                            f"was {value_at(before, old_key)!r}")
    release = snapshot(target)
    chosen = select(kept, release)
    found = settings(kept, chosen.walker)
    case = {"config": DEFAULT_CONFIG, "engine": chosen.engine, "label": label, "target": target,
            "overrides": [s.arg for s in found], "keys": [s.key for s in found],
            "values": {s.key: s.value for s in found}}
    back = migrate.plan(spec, source, CATALOG)
    if back.valid:
        migrate.write(back)
        _, again, _ = resolved(spec)
        for key, value in wrote.items():
            if key in again and again[key] != value and key not in lost:
                failures.append(f"{label} and back: {key}={value!r} came back as {again[key]!r}")
    return failures, case, True, bool(p.decisions)


def service_addresses() -> list[tuple[str, str, str]]:
    """(service, attribute, a value as the runtime sets it) for every service of the example specs."""
    names = {n for s in MAIN_PPO_SPECS for n in (yaml.safe_load(s.read_text()).get("services") or {})}
    assert names, "no example spec has a service: the oracle's service variables are untested"
    values = {"url": "http://10.0.0.1:8080", "host": "10.0.0.1", "port": "8080", "token": "t0k3n"}
    return [(n, a, values[a]) for n in sorted(names) for a in SERVICE_ATTRIBUTES]


def test_every_spec_to_every_release_and_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation, settings kept, behaviour kept, and verl's own verdict on every migrated spec."""
    monkeypatch.setenv("SCRATCH", "/scratch")  # an example's checkpoint folder names it (resolved on the node)
    monkeypatch.setenv("GPU_REHEARSAL", "/gpu-rehearsal")  # the GPU rehearsal's paths (its folder on that machine)
    for name, attribute, value in service_addresses():  # ${services.N.A}: set by the runtime where the job runs
        monkeypatch.setenv(service_variable(name, attribute), value)
    cases: dict[str, list[dict[str, Any]]] = {v: [] for v in RELEASES}
    failures: list[str] = []
    checked = decided = 0
    with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:  # one per core
        done = pool.map(migrated, [(n, *pair, tmp_path) for n, pair in enumerate(pairs())])
        for problems, case, valid, with_decisions in done:
            failures += problems
            checked += valid
            decided += with_decisions
            if case is not None:
                cases[case["target"]].append(case)
    assert not failures, f"{len(failures)} problems:\n" + "\n".join(failures[:30])
    print(f"{len(pairs())} migrations: {checked} validate, {decided} with decisions for the user")

    def verdicts(version: str) -> list[str]:
        return oracle(version, [{k: c[k] for k in ("config", "engine", "overrides", "keys", "values")}
                                for c in cases[version]])

    refused = []
    with ThreadPoolExecutor(2) as pool:  # one oracle process per release, two at a time (two cores)
        for version, says in zip(cases, pool.map(verdicts, cases)):
            refused += [f"{c['label']}: {v}" for c, v in zip(cases[version], says) if v]
    assert not refused, "verl refuses migrated specs:\n" + "\n".join(refused[:20])


def test_a_swept_key_moves_with_its_values(tmp_path: Path) -> None:
    spec = tmp_path / "sweep.yaml"
    spec.write_text(OLD_SPEC.replace("  reward_model:\n    reward_manager: dapo   # DAPO's overlong reward\n", "")
                    .replace("cluster: {nodes: 1, gpus_per_node: 8}\n", (
                        "sweep:\n  matrix:\n    verl.reward_model.reward_manager: [dapo, naive]   # the reward to "
                        "compare\ncluster: {nodes: 1, gpus_per_node: 8}\n")))
    result = run_verlc("migrate", "sweep.yaml", "--to", "0.8.0", "--write", cwd=tmp_path)
    assert "verl.reward_model.reward_manager: -> verl.reward.reward_manager.name (verl 0.7.1)" in result.stdout, \
        result.stdout + result.stderr
    assert re.search(r"\n    verl\.reward\.reward_manager\.name: \[dapo, naive\] +# the reward to compare\n",
                     spec.read_text()), spec.read_text()
    assert run_verlc("validate", "sweep.yaml", cwd=tmp_path).returncode == 0


GRPO_041 = """\
name: grpo-run
verl_version: 0.4.1
project: p
model: {path: Qwen/Qwen2.5-0.5B-Instruct, revision: 0123456789abcdef0123456789abcdef01234567}
reproducible: true
data: {train_files: [data/train.parquet], val_files: [data/test.parquet]}
verl:
  algorithm: {adv_estimator: grpo}
  actor_rollout_ref:
    actor: {ppo_micro_batch_size_per_gpu: 4, use_kl_loss: true}
    rollout: {name: vllm, n: 4, log_prob_micro_batch_size_per_gpu: 8}
    ref: {log_prob_micro_batch_size_per_gpu: 8}
cluster: {nodes: 1, gpus_per_node: 8}
container: {runtime: pyxis, image: "nvcr.io#v/verl@sha256:%s", workdir: /w}
secrets: [WANDB_API_KEY]
""" % ("0" * 64)


def test_a_grpo_spec_pins_nothing_of_the_critic_it_does_not_use(tmp_path: Path) -> None:
    """GRPO runs no critic: pinning its defaults only made validation note 'critic settings given'."""
    spec = tmp_path / "grpo.yaml"
    spec.write_text(GRPO_041)
    p = migrate.plan(spec, "0.9.1", CATALOG)
    assert not [c for c in p.changes if c.key.startswith("critic.")], [c for c in p.changes if "critic" in c.key]
    assert any("changed default(s) of the critic were not pinned" in line for line in migrate.report(p).splitlines())
    migrate.write(p)
    result = run_verlc("validate", spec, "--strict")
    assert "critic" not in result.stderr, result.stderr


def test_an_old_default_the_new_release_does_not_know_is_a_decision_not_a_pin(tmp_path: Path) -> None:
    """0.4.1's rollout.load_format default dummy_dtensor names a loader 0.9.1 no longer has."""
    spec = tmp_path / "grpo.yaml"
    spec.write_text(GRPO_041)
    p = migrate.plan(spec, "0.9.1", CATALOG)
    assert "actor_rollout_ref.rollout.load_format" not in {c.key for c in p.of("pinned")}
    decision = next(c for c in p.decisions if c.key == "actor_rollout_ref.rollout.load_format")
    assert "dummy_dtensor" in decision.text and "0.9.1's is dummy" in decision.text
    assert "load_format" not in p.files[spec][1]  # not written into the spec


def test_the_report_says_what_reproducible_turns_on_in_each_release(tmp_path: Path) -> None:
    spec = tmp_path / "grpo.yaml"
    spec.write_text(GRPO_041)
    report = migrate.report(migrate.plan(spec, "0.9.1", CATALOG))
    assert ("reproducible: true: on verl 0.9.1, reproducible: true sets data.seed, actor_rollout_ref.rollout.seed, "
            "actor_rollout_ref.rollout.full_determinism") in report
    assert "verl 0.4.1 has none of verl's determinism settings" in report
    built = run_verlc("validate", spec)  # and the build says it for the old release
    assert ("grpo.yaml:5:1: reproducible: note: verl 0.4.1 has none of verl's determinism settings: reproducible: "
            "true cannot make its training deterministic") in built.stderr, built.stderr
