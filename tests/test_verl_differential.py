"""verlc's consistency rules against verl 0.9.1's own `validate_config`, on generated settings (hypothesis).

verlc's start-up rules accept exactly what verl's `validate_config` accepts, run on the config Hydra
composes with a tiny local model folder (nothing contacts a hub). A disagreement is a failing test.
Rules verl only discovers once workers start are marked in verlc's messages and are outside what
validate_config can judge; test_verl_rules.py covers them. Key, type and value verdicts for every
release are in test_verl_releases.py.
"""

from __future__ import annotations

import copy
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from verlc.compiler.diagnostics import SpecError
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.compiler.verl.hydra import hydra_value
from verlc.compiler.verl.release import installed_package
from verlc.compiler.verl.rules import WORKERS_NOTE

os.environ.setdefault("HF_HUB_OFFLINE", "1")
hydra_loader = pytest.importorskip("hydra._internal.config_loader_impl",
                                   reason="hydra-core comes with verl; the test command installs it")
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402

PARSER = OverridesParser.create()
BASELINE = {"actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 4},
                                  "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4}},
            "critic": {"ppo_micro_batch_size_per_gpu": 4}}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-model")
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
        "vocab_size": 1000, "max_position_embeddings": 512, "torch_dtype": "float32"}))
    return folder


@cache
def composed(engine: str) -> Any:
    """verl's config for one engine, composed once by Hydra; overrides are applied to copies."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=str(installed_package() / "trainer" / "config"), version_base=None):
        return hydra_compose("ppo_trainer", overrides=[f"model_engine={engine}"])


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    tree: dict[str, Any] = copy.deepcopy(BASELINE)
    for key, value in flat.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def verlc_problems(tmp: Path, verl: dict[str, Any], nodes: int = 1, gpus: int = 8, model: str = "m") -> list[str]:
    spec = tmp / "spec.yaml"
    spec.write_text(json.dumps({  # JSON is YAML
        "name": "diff", "project": "p", "model": model, "verl": verl,
        "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
        "cluster": {"nodes": nodes, "gpus_per_node": gpus}}))
    try:
        compile_spec(spec, CATALOG, display="spec.yaml", source="spec.yaml")
    except SpecError as exc:
        return [d.message for d in exc.diagnostics]
    return []


rule_knobs = st.fixed_dictionaries({
    "nodes": st.sampled_from([1, 2, 4]),
    "gpus": st.sampled_from([1, 2, 4, 8]),
    "data.train_batch_size": st.sampled_from([8, 16, 32, 64, 100, 256]),
    "actor_rollout_ref.rollout.n": st.sampled_from([1, 2, 3, 5]),
    "actor_rollout_ref.actor.ppo_mini_batch_size": st.sampled_from([4, 8, 16, 64, 128, 512]),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": st.sampled_from([None, 1, 2, 4, 8]),
    "actor_rollout_ref.actor.ppo_micro_batch_size": st.sampled_from([None, None, 8, 16]),
    "actor_rollout_ref.actor.use_dynamic_bsz": st.sampled_from([False, False, True]),
    "actor_rollout_ref.actor.use_kl_loss": st.booleans(),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": st.sampled_from([1, 1, 2]),
    "actor_rollout_ref.actor.loss_agg_mode": st.sampled_from(["token-mean", "seq-mean-token-sum", "token-avg"]),
    "actor_rollout_ref.model.use_remove_padding": st.booleans(),
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": st.sampled_from([None, 4, 4]),
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": st.sampled_from([None, 4]),
    "algorithm.adv_estimator": st.sampled_from(["gae", "grpo"]),
    "critic.ppo_micro_batch_size_per_gpu": st.sampled_from([None, 4, 4]),
    "critic.ppo_micro_batch_size": st.sampled_from([None, None, 16]),
})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rule_knobs)
def test_rule_verdicts_match_validate_config(tmp_path: Path, model_dir: Path, knobs: dict[str, Any]) -> None:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    knobs = dict(knobs)
    nodes, gpus = knobs.pop("nodes"), knobs.pop("gpus")
    if knobs["algorithm.adv_estimator"] != "gae":  # verlc refuses critic settings without a critic
        knobs = {k: v for k, v in knobs.items() if not k.startswith("critic.")}
    flat = {"actor_rollout_ref.rollout.name": "vllm", **knobs}
    verl = nest({})
    verl.pop("critic")
    for key, value in flat.items():  # nest() without the baseline's micro batch sizes
        node = verl
        *parents, last = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    verl["actor_rollout_ref"]["actor"].setdefault("ppo_micro_batch_size_per_gpu", None)
    problems = [p for p in verlc_problems(tmp_path, verl, nodes, gpus, str(model_dir)) if WORKERS_NOTE not in p]

    overrides = [f"{k}={hydra_value(v)}" for k, v in flat.items()] + [
        f"trainer.nnodes={nodes}", f"trainer.n_gpus_per_node={gpus}",
        f"actor_rollout_ref.model.path={model_dir}", f"critic.model.path={model_dir}"]
    cfg = copy.deepcopy(composed("dp"))
    hydra_loader.ConfigLoaderImpl._apply_overrides_to_config(PARSER.parse_overrides(overrides), cfg)
    try:
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
        verl_says = ""
    except Exception as exc:  # verl raises AssertionError, ValueError and others
        verl_says = f"{type(exc).__name__}: {exc}" or type(exc).__name__
    event("verl rejects" if verl_says else "verl accepts")
    assert bool(problems) == bool(verl_says), f"verlc: {problems}\nverl: {verl_says or 'accepts'}\n{overrides}"
