"""`verlc explain KEY [SPEC]`: a verl key's facts in its release and the others, the rules that read it,
and, for a spec, where its value comes from and the exact override the bundle passes."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from conftest import REPO, run_verlc
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.compiler.verl import rules as rules_module
from verlc.compiler.verl.rules import RULES

MI300 = REPO / "specs" / "qwen2-7b-gsm8k-ppo-mi300.yaml"


def explain(*args: str | Path, cwd: Path = REPO) -> str:
    result = run_verlc("explain", *args, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_key_in_its_release_with_verls_own_words() -> None:
    out = explain("actor_rollout_ref.rollout.mode")
    assert out.splitlines()[:7] == [
        "actor_rollout_ref.rollout.mode  (verl 0.9.1)",
        "  sync: LLM, async: AsyncLLM",
        "  type:     a string",
        "  default:  async",
        "  allowed:  async",
        "  verl builds it as RolloutConfig.mode (verl.workers.config.rollout.RolloutConfig)",
        "  releases: 0.4.0-0.9.1; not in 0.3.0.post1"]
    old = explain("actor_rollout_ref.rollout.mode", "--verl-version", "0.6.0")
    assert "  default:  sync\n" in old and "allowed:  async" not in old


def test_where_a_moved_key_lives_in_every_release() -> None:
    assert "  releases: 0.4.1-0.5.0 as trainer.profile_steps; 0.6.0-0.9.1; not in 0.3.0.post1-0.4.0\n" in \
        explain("global_profiler.steps")
    assert "  releases: 0.3.0.post1-0.7.0; 0.7.1-0.9.1 as reward.reward_manager.name\n" in \
        explain("reward_model.reward_manager", "--verl-version", "0.7.0")


def test_the_rules_that_read_a_key() -> None:
    out = explain("data.train_batch_size")
    assert "  rules:    data.train_batch_size x rollout.n must be divisible by the GPU count" in out
    assert "actor.ppo_mini_batch_size <= data.train_batch_size" in out
    assert "rules:" not in explain("trainer.project_name")


def _yielded_keys() -> set[str]:
    """Every key rules() names in what it yields, its f-strings filled in with the sections it loops over."""
    tree = ast.parse(Path(rules_module.__file__).read_text())
    function = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "rules")
    names = {"actor": ["actor_rollout_ref.actor"], "rollout": ["actor_rollout_ref.rollout"],
             "ref": ["actor_rollout_ref.ref"], "critic": ["critic"],
             "section": ["actor_rollout_ref.rollout", "actor_rollout_ref.ref"],
             "count": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size_per_gpu"]}
    found: set[str] = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Yield) and isinstance(node.value, ast.Tuple):
            for element in node.value.elts[0].elts:  # type: ignore[attr-defined]
                texts = [""]
                for part in element.values if isinstance(element, ast.JoinedStr) else [element]:
                    if isinstance(part, ast.Constant):
                        texts = [t + part.value for t in texts]
                    else:
                        texts = [t + v for t in texts for v in names[part.value.id]]  # type: ignore[attr-defined]
                found.update(texts)
    return found


def test_the_rules_catalogue_covers_every_rule() -> None:
    catalogued = {k for keys, _ in RULES for k in keys}
    yielded = _yielded_keys()
    assert len(yielded) > 15
    assert yielded <= catalogued, sorted(yielded - catalogued)
    source = Path(rules_module.__file__).read_text().split("def rules(", 1)[1]
    for key in catalogued:  # each catalogued key is one rules() reads
        leaf = key.rsplit(".", 1)[-1]
        assert f".{leaf}" in source or f'"{key}"' in source or f'"{leaf.removesuffix("_parallel_size")}"' in source, key


def test_where_a_specs_value_comes_from_and_the_override_it_passes(tmp_path: Path) -> None:
    (tmp_path / "base.yaml").write_text("verl:\n  data:\n    train_batch_size: 256\n")
    (tmp_path / "sweep.yaml").write_text("""\
extends: base.yaml
name: sw
project: p
model: Qwen/Qwen2.5-0.5B-Instruct
data: {train_files: [t.parquet], val_files: [v.parquet]}
verl:
  algorithm: {adv_estimator: grpo}
  actor_rollout_ref:
    actor: {ppo_micro_batch_size_per_gpu: 4}
    rollout: {name: vllm, log_prob_micro_batch_size_per_gpu: 4}
sweep:
  matrix:
    verl.actor_rollout_ref.actor.optim.lr: [1.0e-6, 3.0e-6]
cluster: {nodes: 2, gpus_per_node: 8}
container: {runtime: none}
""")
    cases = {
        "actor_rollout_ref.rollout.name": ("vllm, set at sweep.yaml:10:15", "actor_rollout_ref.rollout.name=vllm"),
        "data.train_batch_size": ("256, set in a base spec at base.yaml:3:5 (extends:)", "data.train_batch_size=256"),
        "actor_rollout_ref.actor.optim.lr": (
            "swept over [1e-06, 3e-06] (sweep.matrix at sweep.yaml:13:5)",
            "actor_rollout_ref.actor.optim.lr=1e-06 | actor_rollout_ref.actor.optim.lr=3e-06 (one variant each)"),
        "trainer.nnodes": ("2, derived by verlc from cluster.nodes (sweep.yaml:14:11)", "trainer.nnodes=2"),
        "trainer.resume_mode": ("auto, set by verlc (verlc: a requeued job resumes from its checkpoints)",
                                "trainer.resume_mode=auto"),
        "actor_rollout_ref.rollout.temperature": ("1.0, verl's default (the spec does not set it)",
                                                  "(none: verl uses its default)"),
    }
    ir = compile_spec(tmp_path / "sweep.yaml", CATALOG, display="sweep.yaml", source="sweep.yaml")
    passed = {o.key: o.arg for o in ir.overrides}
    for key, (origin, override) in cases.items():
        out = explain(key, "sweep.yaml", cwd=tmp_path).splitlines()
        assert out[-2:] == [f"  in sweep.yaml: {origin}", f"  override: {override}"], (key, out[-2:])
        if key in passed:  # what explain says the bundle passes is what the bundle passes
            assert passed[key] == override, key
    variants = {o.arg for v in ir.variants for o in v.overrides if o.key == "actor_rollout_ref.actor.optim.lr"}
    assert variants == {"actor_rollout_ref.actor.optim.lr=1e-06", "actor_rollout_ref.actor.optim.lr=3e-06"}


def test_mistakes_get_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_verlc("explain", "actor_rollout_ref.actor.ppo_mini_batch_sise")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == ("verlc: verl 0.9.1 has no key 'actor_rollout_ref.actor.ppo_mini_batch_sise' (did you "
                             "mean 'actor_rollout_ref.actor.ppo_mini_batch_size'?)\n")
    old = run_verlc("explain", "trainer.profile_steps")
    assert old.returncode == 2 and "verl 0.4.1-0.5.0 has it (verlc explain trainer.profile_steps --verl-version " \
                                   "0.5.0)" in old.stderr
    both = run_verlc("explain", "trainer.nnodes", MI300, "--verl-version", "0.6.0")
    assert both.returncode == 2 and "not both" in both.stderr
    (tmp_path / "bad.yaml").write_text(json.dumps({"name": "x"}))
    bad = run_verlc("explain", "trainer.nnodes", tmp_path / "bad.yaml")
    assert bad.returncode == 2 and "missing required key" in bad.stderr
