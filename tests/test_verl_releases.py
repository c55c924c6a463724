"""verlc's verdict on `verl:` sections equals verl's own, for every shipped release.

For each release, a corpus of override sets drawn from that release's config surface (real keys with
their values and other types, misspellings, new keys in closed, open and dataclass-built sections,
explicit `+` keys, declared-but-unlisted dataclass fields, keyed-map entries, mappings for null
defaults, interpolations) plus the cases users reported, is judged twice:
- by verlc (the whole compiler, as `verlc validate` runs it), and
- by tests/verl_oracle.py: that release's own files, in one process per release: Hydra applies the
  overrides verlc would pass, OmegaConf resolves them, and the dataclasses verl builds take their
  keys (0.9.1: verl's own classes, imported; older releases: read from their source with ast).
Both must agree on every case, and a rejection must name the key.
"""

from __future__ import annotations

import ast
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
from verlc.compiler.diagnostics import SpecError
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.compiler.verl.check import select, settings
from verlc.compiler.verl.hydra import hydra_value, verl_value
from verlc.compiler.verl.place import Walker
from verlc.compiler.verl.program import GENERATION_SERVER, RAY_PROGRAMS, TORCHRUN
from verlc.compiler.verl.release import MISSING, RELEASES, snapshot

sys.path.insert(0, str(REPO / "dev"))
from verl_schema import release_package  # noqa: E402

# The release the test environment installs: its dataclasses can be imported (torch is there).
IMPORTABLE = "0.9.1"
CASES_PER_RELEASE = int(os.environ.get("VERLC_CASES", "160"))
# Keys that verl's consistency rules or its workers' start-up asserts read, or that verlc derives: their verdicts
# are tested elsewhere (test_verl_rules.py, test_startup.py, test_check.py); here a key's own verdict must not
# depend on a rule (the oracle composes the config; it starts no worker).
RULED = ("batch_size", "parallel_size", "nnodes", "n_gpus", "use_dynamic_bsz", "use_kl", "use_remove_padding",
         "strategy", "do_sample", "loss_agg_mode", "enable", "adv_estimator", "model_engine", ".path",
         "_files", "project_name", "experiment_name", "rollout.n", "temperature", "_target_", "default_local_dir",
         "resume_mode", "critic.", "mode", "name", "total_training_steps", "ulysses", "logger",
         "max_model_len")
ENV_ON_NODE = {"VERLC_TEST_SCRATCH": "/scratch/verlc"}


def baseline(version: str) -> dict[str, Any]:
    return {"algorithm": {"adv_estimator": "grpo"},
            "actor_rollout_ref": {"actor": {"ppo_micro_batch_size_per_gpu": 4},
                                  "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 4}}}


def nest(flat: dict[str, Any], into: dict[str, Any]) -> dict[str, Any]:
    tree = json.loads(json.dumps(into))
    for key, value in flat.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return tree


def leaves(tree: dict[str, Any], path: str = "") -> list[tuple[str, Any]]:
    out = []
    for key, value in tree.items():
        here = f"{path}.{key}" if path else key
        if isinstance(value, dict) and value:
            out += leaves(value, here)
        elif not isinstance(value, dict):
            out.append((here, value))
    return out


def sections(tree: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    for key, value in tree.items():
        here = f"{path}.{key}" if path else key
        if isinstance(value, dict):
            out.append((here, value))
            out += sections(value, here)
    return out


def other_type(value: Any) -> Any:
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int):
        return 0.5
    if isinstance(value, float):
        return 1  # an int where a float is declared: accepted
    if isinstance(value, str):
        return 3
    if isinstance(value, list):
        return {"a": 1}
    return None


def corpus(version: str) -> list[dict[str, Any]]:
    """Cases drawn from the release's composed configs and dataclasses (seeded: the same every run)."""
    release = snapshot(version)
    rng = random.Random(f"verlc-{version}-{os.environ.get('VERLC_SEED', '')}")
    cases: list[dict[str, Any]] = []
    combos = [(c, e) for c in release.configs for e in release.engines(c)]
    while len(cases) < CASES_PER_RELEASE:
        config, engine = rng.choice(combos)
        tree = release.tree(config, engine)
        walker = Walker(release, config, engine)
        real = [(k, v) for k, v in leaves(tree) if not any(r in k for r in RULED)
                and v != MISSING and not (isinstance(v, str) and "${" in v)]
        kind = rng.choice(["real", "real", "type", "typo", "new-closed", "plus-plain", "plus-dataclass",
                           "declared", "open", "entry", "null-dict", "interp", "plus-null", "plus-set",
                           "plus-merge", "force", "plus-path"])
        plus = rng.choice(["", "+"])  # open, declared and entry keys: as Hydra needs them, or without
        key, default = rng.choice(real)
        parts = key.split(".")
        flat: dict[str, Any] = {}
        if kind == "real":
            flat[key] = default
        elif kind == "type":
            flat[key] = other_type(default)
        elif kind == "typo":
            i = rng.randrange(len(parts))
            word = parts[i]
            j = rng.randrange(len(word))
            parts[i] = word[:j] + word[j + 1:] if len(word) > 1 and rng.random() < 0.5 else word[:j] + "x" + word[j:]
            flat[".".join(parts)] = default
        elif kind == "new-closed":
            flat[".".join([*parts[:-1], "brand_new_setting"])] = 1
        elif kind in ("plus-plain", "plus-dataclass"):
            wanted = kind == "plus-dataclass"
            candidates = [p for p, node in sections(tree) if ("_target_" in node) == wanted and node
                          and not any(r in p for r in ("critic",))]
            if not candidates:
                continue
            flat[f"{rng.choice(candidates)}.+my_plugin_flag"] = True
        elif kind == "declared":
            found = [(p, f) for p, node in sections(tree) if isinstance(node.get("_target_"), str)
                     for cls in [walker.built(node)] if cls
                     for f in cls.fields if f not in node and not f.startswith("_")
                     and not any(r in f"{p}.{f}" for r in RULED)]
            if not found:
                continue
            path, field = rng.choice(found)
            place = walker.place(f"{path}.{field}".split("."))
            field = plus + field
            sample = {"int": 1, "float": 0.5, "bool": True, "str": "x", "list": ["a"], "dict": {"k": 1},
                      "none": None}
            kinds = [k for k in place.kinds if k in sample]
            if not kinds:
                continue
            flat[f"{path}.{field}"] = sample[rng.choice(kinds)]
        elif kind == "open":
            candidates = [p for p, node in sections(tree) if walker.context(p.split(".")) is not None
                          and walker.context(p.split(".")).open]
            if not candidates:
                continue
            flat[f"{rng.choice(candidates)}.{plus}SOME_SETTING"] = "on"
        elif kind == "entry":
            maps = [(p, f) for p, node in sections(tree) for f in [walker.place(p.split("."))]
                    if any(k.startswith("M:") for k in f.kinds)]
            if not maps:
                continue
            path, place = rng.choice(maps)
            cls = release.classes[next(k for k in place.kinds if k.startswith("M:"))[2:]]
            field = rng.choice([f for f in cls.fields if not f.startswith("_")] + ["not_a_field"])
            flat[f"{path}.{plus}second_entry.{field}"] = None
        elif kind == "null-dict":
            nulls = [k for k, v in leaves(tree) if v is None and "dict" in walker.place(k.split(".")).kinds]
            if not nulls:
                continue
            flat[rng.choice(nulls)] = {"some_option": 1.0}
        elif kind == "interp":
            strings = [k for k, v in real if isinstance(v, str) or v is None]
            if not strings:
                continue
            target = rng.choice(strings)
            flat[target] = rng.choice(["/lustre/${USER}/x", "${env:VERLC_TEST_SCRATCH}/x", "${trainer.project_name}",
                                       "${oc.select:trainer.project_name,x}", "${no_such.key}", "${.no_such_sibling}"])
        elif kind == "plus-null":  # Hydra's '+' takes a key whose value is null
            nulls = [k for k, v in real if v is None]
            if not nulls:
                continue
            *head, leaf = rng.choice(nulls).split(".")
            flat[".".join([*head, "+" + leaf])] = rng.choice(["x", 2, {"a": 1}])
        elif kind == "plus-set":  # ... and refuses a plain value over one that is set
            *head, leaf = key.split(".")
            if default is None:
                continue
            flat[".".join([*head, "+" + leaf])] = default
        elif kind == "plus-merge":  # ... and merges a mapping or a list into what is there
            lists = [k for k, v in real if isinstance(v, list)]
            mappings = [(p, node) for p, node in sections(tree) if node and "_target_" not in node
                        and not any(r in p for r in RULED)]
            if lists and rng.random() < 0.5:
                *head, leaf = rng.choice(lists).split(".")
                flat[".".join([*head, "+" + leaf])] = ["a", "b"]
            elif mappings:
                path, node = rng.choice(mappings)
                *head, leaf = path.split(".")
                sub = next((k for k, v in node.items() if not isinstance(v, dict)), None)
                if sub is None:
                    continue
                flat[".".join([*head, "+" + leaf])] = {sub: node[sub]}
            else:
                continue
        elif kind == "force":  # '++' adds or sets, always
            *head, leaf = key.split(".")
            flat[".".join([*head, "++" + rng.choice([leaf, "brand_new_setting"])])] = default
        elif kind == "plus-path":  # '+' on the first new key, the leaf or between, 1-3 levels below a section
            candidates = [p for p, node in sections(tree) if node and not any(r in p for r in ("critic",))]
            if not candidates:
                continue
            new = ["new_a", "new_b", "new_c"][:rng.randint(1, 3)]
            at = rng.randrange(len(new))
            new[at] = "+" + new[at]
            flat[".".join([rng.choice(candidates), *new])] = rng.choice([1, "x"])
        cases.append({"kind": kind, "config": config, "engine": engine, "flat": flat})
    return cases + reported(version)


def reported(version: str) -> list[dict[str, Any]]:
    """What users reported verlc got wrong (issue: verl checks you can trust; a spec's keys and Hydra's `+`/`++`
    mean exactly what they mean to verl), where the release has the key's section."""
    megatron = "ppo_megatron_trainer"
    cases = [
        {"actor_rollout_ref.actor.entropy_coeff": 0.001},
        {"actor_rollout_ref.rollout.top_p": 0.9},
        {"actor_rollout_ref.rollout.val_kwargs.temperature": 0.6},
        {"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype": "bf16"},
        {"actor_rollout_ref.actor.fsdp_config.turbo_config.enable": True},
        {"distillation.teacher_models.teacher_math.model_path": "/models/t"},
        {"distillation.teacher_models.+teacher_math.model_path": "/models/t"},
        {"trainer.logger": "console"},
        {"trainer.default_local_dir": "/lustre/${USER}/ckpt"},
        {"trainer.default_local_dir": "/lustre/${env:VERLC_TEST_SCRATCH}/ckpt"},
        {"actor_rollout_ref.actor.optim.override_optimizer_config": {"offload_fraction": 1.0}},
        {"algorithm.gdpo_reward_keys": ["acc", "format"]},
        {"trainer.+my_plugin_flag": True},
        {"actor_rollout_ref.actor.+my_plugin_flag": True},
        {"reward.reward_kwargs.+max_resp_len": 8192},
        {"reward.+reward_kwargs.max_resp_len": 8192},
        {"++trainer.total_epochs": 2},
        {"trainer.++my_plugin_flag": True},
        ({"actor_rollout_ref.actor.megatron.override_transformer_config.+recompute_method": "uniform"}, megatron),
        ({"actor_rollout_ref.ref.megatron.override_transformer_config.+gradient_accumulation_fusion": True}, megatron),
        ({"critic.model.enable_gradient_checkpointin": True}, megatron),
        ({"critic.model.+enable_gradient_checkpointin": True}, megatron),
    ]
    release = snapshot(version)
    out = []
    for case in cases:
        flat, config = case if isinstance(case, tuple) else (case, "ppo_trainer")
        if config not in release.configs:
            continue
        key = next(iter(flat)).replace("+", "")
        parts = key.split(".")
        # keep a case only where the release has its section (the key itself may be unknown)
        if Walker(release, config, release.default_engine(config)).context(parts[:2]) is None:
            continue
        out.append({"kind": "reported", "config": config, "engine": release.default_engine(config), "flat": flat})
    return out


def _bare(value: Any) -> Any:
    """A spec mapping's keys without Hydra's prefixes (the user's dict value on the command line)."""
    if isinstance(value, dict):
        return {k.lstrip("+"): _bare(v) for k, v in value.items()}
    return value


def user_overrides(version: str, flat: dict[str, Any]) -> list[str]:
    """The case as a verl user writes it on main_ppo's command line: the baseline's keys, then each key of the
    case with the strongest Hydra prefix on its path (`a.+b.c` is `+a.b.c`), its value as one override."""
    written = {".".join(p.lstrip("+") for p in key.split(".")): key for key in flat}
    out = [f"{k}={hydra_value(v)}" for k, v in leaves(baseline(version)) if k not in written]
    for clean, key in written.items():
        prefix = "++" if "++" in key else "+" if "+" in key else ""
        out.append(f"{prefix}{clean}={hydra_value(verl_value(_bare(flat[key])))}")
    return out


def verlc_verdict(tmp: Path, version: str, case: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(problems, the overrides verlc would pass for the verl section)."""
    release = snapshot(version)
    verl = nest(case["flat"], baseline(version))
    if case["engine"] != release.default_engine(case["config"]) and case["engine"]:
        verl["model_engine"] = case["engine"]
    spec = tmp / "spec.yaml"
    spec.write_text(json.dumps({"name": "diff", "project": "p", "model": "m", "verl_version": version,
                                "hydra": {"config_name": case["config"]}, "verl": verl,
                                "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                                "cluster": {"nodes": 1, "gpus_per_node": 8}}))
    try:
        compile_spec(spec, CATALOG, display="spec.yaml", source="spec.yaml")
        problems: list[str] = []
    except SpecError as exc:
        problems = [f"{d.path}: {d.message}" for d in exc.diagnostics]
    chosen = select(verl, release, case["config"])
    assert not isinstance(chosen, str), chosen
    return problems, [s.arg for s in settings(verl, chosen.walker)]


def oracle(version: str, cases: list[dict[str, Any]]) -> list[str]:
    package = release_package(version)
    if version == IMPORTABLE:
        from verlc.compiler.verl.release import installed_package

        package = installed_package()
    args = [sys.executable, str(REPO / "tests" / "verl_oracle.py"), str(package)]
    if version == IMPORTABLE:
        args.append("--import")
    result = subprocess.run(args, input=json.dumps(cases), capture_output=True, text=True, timeout=900,
                            env={**os.environ, **ENV_ON_NODE, "HYDRA_FULL_ERROR": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def judged(tmp: Path, version: str, cases: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[str], str]]:
    """(case, verlc's problems, verl's verdict) for each case: verl judges the case as a user writes it on the
    command line, and where verlc accepts it, verlc's own overrides must make the very same config."""
    out = []
    for case in cases:
        problems, overrides = verlc_verdict(tmp, version, case)
        mine = user_overrides(version, case["flat"])
        values = {k: v for k, v in leaves(baseline(version))}
        values.update({".".join(p.lstrip("+") for p in k.split(".")): verl_value(_bare(v))
                       for k, v in case["flat"].items()})
        case.update(overrides=mine, keys=[o.split("=", 1)[0].lstrip("+") for o in mine], values=values,
                    verlc=None if problems else overrides)
        out.append((case, problems))
    verdicts = oracle(version, [{k: c[k] for k in ("config", "engine", "overrides", "keys", "values", "verlc")}
                                for c in cases])
    return [(case, problems, verl_says) for (case, problems), verl_says in zip(out, verdicts)]


@pytest.mark.parametrize("version", RELEASES)
def test_verlc_and_verl_agree_on_every_case(tmp_path: Path, version: str) -> None:
    cases = corpus(version)
    results = judged(tmp_path, version, cases)
    verdicts = [v for _, _, v in results]
    disagreements = []
    for case, problems, verl_says in results:
        named = all(any(("verl." + k.replace("+", "")).startswith(p.split(": ")[0].replace("+", "")) for p in problems)
                    for k in case["flat"]) if problems else True
        if bool(problems) != bool(verl_says) or not named:
            disagreements.append(f"{case['kind']} {case['config']}/{case['engine']} {case['flat']}\n"
                                 f"  verlc: {problems or 'accepts'}\n  verl:  {verl_says or 'accepts'}")
    kinds = sorted({c["kind"] for c in cases})
    print(f"verl {version}: {len(cases)} cases ({', '.join(kinds)}), "
          f"{sum(bool(v) for v in verdicts)} rejected by verl")
    assert not disagreements, f"{len(disagreements)} of {len(cases)} cases:\n" + "\n".join(disagreements[:25])


def hydra_forms(engine: str) -> dict[str, tuple[dict[str, Any], str | None]]:
    """Each form of Hydra's override syntax as a spec writes it: (the case, the override verlc must pass, or
    None where verl refuses it)."""
    one_value = ("actor_rollout_ref.ref.megatron.override_transformer_config" if engine == "megatron"
                 else "actor_rollout_ref.actor.optim.override_optimizer_config")
    return {
        "set": ({"trainer.total_epochs": 2}, "trainer.total_epochs=2"),
        "add-over-null": ({"trainer.+max_actor_ckpt_to_keep": 2}, "+trainer.max_actor_ckpt_to_keep=2"),
        "add-over-a-value": ({"trainer.+total_epochs": 2}, None),
        "add-a-mapping-over-a-mapping": ({"actor_rollout_ref.rollout.+val_kwargs": {"n": 2}},
                                         "++actor_rollout_ref.rollout.val_kwargs.n=2"),
        "add-or-set-existing": ({"trainer.++total_epochs": 2}, "++trainer.total_epochs=2"),
        "add-or-set-new": ({"trainer.++my_plugin_flag": True}, "++trainer.my_plugin_flag=true"),
        "add-on-the-leaf-1": ({"trainer.+my_flag": 1}, "+trainer.my_flag=1"),
        "add-on-the-leaf-3": ({"trainer.new_a.new_b.+my_flag": 1}, "+trainer.new_a.new_b.my_flag=1"),
        "add-on-the-first-new-key": ({"trainer.+new_a.new_b": "x"}, "+trainer.new_a.new_b=x"),
        "add-in-between": ({"trainer.new_a.+new_b.my_flag": 1}, "+trainer.new_a.new_b.my_flag=1"),
        "add-inside-a-mapping-verl-holds-as-one-value": ({f"{one_value}.+gradient_accumulation_fusion": True},
                                                         f"{one_value}={{gradient_accumulation_fusion:true}}"),
        "new-key-of-a-free-form-mapping-without-add": ({"actor_rollout_ref.model.override_config.my_typo": 1}, None),
        "new-key-of-a-free-form-mapping": ({"actor_rollout_ref.model.override_config.+my_setting": 1},
                                           "+actor_rollout_ref.model.override_config.my_setting=1"),
        "add-a-key-a-built-dataclass-lacks": ({"actor_rollout_ref.actor.+my_plugin_flag": 1}, None),
        # keys that are no part of a dotted key, in a mapping that takes any key: one dict value, escaped (#53)
        "dict-keys-with-dots-and-braces": (
            {"actor_rollout_ref.model.+override_config": {"rope_scaling.type": "linear", "layers.{*}.mlp": "x y"}},
            r"+actor_rollout_ref.model.override_config={rope_scaling.type:linear,layers.\{*\}.mlp:'x y'}"),
        "dict-keys-with-dots-without-plus": (
            {"actor_rollout_ref.model.override_config": {"rope_scaling.type": "linear"}}, None),
    }


@pytest.mark.parametrize(("version", "engine"), [("0.8.0", "megatron"), ("0.9.1", "dp")])
def test_each_form_of_hydras_syntax_means_what_it_means_to_verl(tmp_path: Path, version: str, engine: str) -> None:
    """One case per form on a megatron-engine config (0.8.0) and a dp config (0.9.1): verlc's verdict is the
    release's own, and the bundle passes the override Hydra needs for the same config."""
    forms = hydra_forms(engine)
    cases = [{"kind": name, "config": "ppo_trainer", "engine": engine, "flat": flat}
             for name, (flat, _) in forms.items()]
    for case, problems, verl_says in judged(tmp_path, version, cases):
        expected = forms[case["kind"]][1]
        assert bool(problems) == bool(verl_says) == (expected is None), (case["kind"], problems, verl_says)
        if expected is not None:
            assert expected in case["verlc"], (case["kind"], case["verlc"])


# Two overrides of verl's example scripts that the real-config corpus counted as accepted with '+' (issue "Seen
# training on a GPU", item 5): run_qwen3-8b_npu.sh's entropy_from_logits_with_chunking and
# run_qwen3_5-35b-megatron.sh's attention_backend. Both keys are in the composed YAML of these releases, so
# Hydra itself refuses '+' ("Could not append to config. An item is already at ...") and takes '++' or no prefix
# (v0.7.1's scripts write '++'). verlc's verdict must be verl's for every prefix.
PLUS_CASES = [
    ("0.6.1", "ppo_trainer", "actor_rollout_ref.actor.{}entropy_from_logits_with_chunking", True),
    ("0.7.1", "ppo_trainer", "actor_rollout_ref.actor.{}entropy_from_logits_with_chunking", True),
    ("0.7.1", "ppo_megatron_trainer", "actor_rollout_ref.actor.megatron.override_transformer_config.{}attention_backend",
     "auto"),
    ("0.8.0", "ppo_megatron_trainer", "actor_rollout_ref.actor.megatron.override_transformer_config.{}attention_backend",
     "auto"),
]


@pytest.mark.parametrize(("version", "config", "key", "value"), PLUS_CASES)
def test_a_plus_on_a_key_of_the_composed_yaml_is_judged_as_hydra_judges_it(
        tmp_path: Path, version: str, config: str, key: str, value: Any) -> None:
    cases = [{"kind": prefix or "none", "config": config, "engine": snapshot(version).default_engine(config),
              "flat": {key.format(prefix): value}} for prefix in ("+", "++", "")]
    verdicts = []
    for case, problems, verl_says in judged(tmp_path, version, cases):
        assert bool(problems) == bool(verl_says), (case["kind"], problems, verl_says)
        verdicts.append(bool(verl_says))
    assert verdicts == [True, False, False]  # verl refuses '+' here, and takes '++' and no prefix


# --- verl's SFT programs: their own configs (#43) -------------------------------------------------------

# ... and verl's generation and evaluation, which verlc builds too (RAY_PROGRAMS)
SFT_PROGRAMS = [(v, m) for v in RELEASES for m in ("verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer",
                                                   *RAY_PROGRAMS) if m in snapshot(v).programs]
SFT_CASES = 24  # real keys of the program's config at their own values, and as many misspelled


def sft_corpus(version: str, module: str, tmp: Path) -> list[dict[str, Any]]:
    """Leaves of the program's own config (verlc's copy), each set to its default value (verl accepts) and
    misspelled (Hydra refuses: the config is struct); leaves verlc sets itself (the model, data files, run
    names, resume settings) are left out: setting them under `verl:` is refused by design."""
    release = snapshot(version)
    name = release.programs[module]
    engine, trees = release.program_configs[name]
    spec = tmp / "base.yaml"
    spec.write_text(json.dumps(sft_spec(version, module, {})))
    own = {o.key for o in compile_spec(spec, CATALOG, display="base.yaml", source="base.yaml").overrides}
    simple = [(k, v) for k, v in leaves(trees[engine]) if k not in own and v is not None and v != MISSING
              and isinstance(v, (bool, int, float, str)) and not (isinstance(v, str) and "${" in v)]
    chosen = random.Random(f"{version} {module}").sample(simple, min(SFT_CASES, len(simple)))
    cases = []
    for key, value in chosen:
        wrong = key.rsplit(".", 1)
        wrong[-1] += "x"
        for flat in ({key: value}, {".".join(wrong): value}):
            cases.append({"config": name, "engine": engine, "flat": flat})
    return cases


def sft_spec(version: str, module: str, flat: dict[str, Any]) -> dict[str, Any]:
    return {"name": "sft", "project": "p", "model": "m", "verl_version": version, "program": module,
            "verl": nest(flat, {}), "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
            "cluster": {"nodes": 1, "gpus_per_node": 8}}


@pytest.mark.parametrize(("version", "module"), SFT_PROGRAMS)
def test_verlc_and_verl_agree_on_each_sft_programs_keys(tmp_path: Path, version: str, module: str) -> None:
    """An SFT (generation, evaluation) spec's `verl:` is judged against the program's own config of that
    release, as verl judges it: Hydra applying the user's overrides on that config (the oracle, one process per
    release)."""
    cases = sft_corpus(version, module, tmp_path)
    # the reading works: at least 4 keys (verl 0.3's evaluation config has 4 such leaves; SFT's give 24)
    assert len(cases) >= 8, f"too few keys read from verl {version}'s {module} config"
    problems = []
    for case in cases:
        spec = tmp_path / "spec.yaml"
        spec.write_text(json.dumps(sft_spec(version, module, case["flat"])))
        try:
            compile_spec(spec, CATALOG, display="spec.yaml", source="spec.yaml")
            problems.append([])
        except SpecError as exc:
            problems.append([f"{d.path}: {d.message}" for d in exc.diagnostics])
        (key, value), = case["flat"].items()
        case.update(overrides=[f"{key}={hydra_value(verl_value(value))}"], keys=[key], values={key: value}, verlc=None)
    verdicts = oracle(version, [{k: c[k] for k in ("config", "engine", "overrides", "keys", "values", "verlc")}
                                for c in cases])
    disagreements = [f"{c['flat']}\n  verlc: {p or 'accepts'}\n  verl:  {v or 'accepts'}"
                     for c, p, v in zip(cases, problems, verdicts) if bool(p) != bool(v)
                     or (p and not any(f"verl.{next(iter(c['flat']))}" in line for line in p))]
    print(f"verl {version} {module}: {len(cases)} cases, {sum(bool(v) for v in verdicts)} rejected by verl")
    assert sum(bool(v) for v in verdicts) == len(cases) // 2, "every misspelled key, and only those, is refused"
    assert not disagreements, f"{len(disagreements)} of {len(cases)} cases:\n" + "\n".join(disagreements[:25])


def _starts(source: str) -> set[str]:
    """How a module's code starts its workers, read with ast: "ray" where it imports Ray (a Ray driver; ray.init
    may be implicit, or in a function it imports), "torchrun" where it sets up torch.distributed's process
    group itself (each torchrun rank does)."""
    calls = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "ray" for a in node.names):
            calls.add("ray")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray" and not node.level:
            calls.add("ray")
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name in ("init_process_group", "initialize_global_process_group"):
                calls.add("torchrun")
    return calls


@pytest.mark.parametrize("version", RELEASES)
def test_the_programs_verlc_starts_with_torchrun_are_those_that_start_no_ray(version: str) -> None:
    """verlc's TORCHRUN list equals what each release's own code says: of verl's Hydra programs, those that set up
    torch.distributed themselves and do not use Ray."""
    package = release_package(version)
    read = {m: _starts((package.parent / (m.replace(".", "/") + ".py")).read_text()) for m in snapshot(version).programs}
    assert {m for m, calls in read.items() if calls == {"torchrun"}} == \
        {m for m in read if m in TORCHRUN}, read
    assert "ray" in read["verl.trainer.main_ppo"] and any(m in TORCHRUN for m in read), read  # the reading works


@pytest.mark.parametrize("version", RELEASES)
def test_what_a_pipeline_takes_of_an_earlier_stage_is_in_each_releases_code(version: str) -> None:
    """compiler/stages.py's facts against each release's own files: `python -m verl.model_merger merge` with
    --backend, --local_dir and --target_dir exists from MERGER_FROM; the SFT trainers name their last checkpoint
    in latest_checkpointed_iteration.txt (verl's tracker) from SFT_TRACKER_FROM; main_ppo's Ray trainer always,
    with the model's shards in global_step_N/actor."""
    from verlc.compiler.stages import MERGER_FROM, SFT_TRACKER_FROM, version as version_of

    package = release_package(version)
    merger = package / "model_merger"
    arguments = (merger / "base_model_merger.py").read_text() if merger.is_dir() else ""
    has_merger = (merger / "__main__.py").is_file() and all(
        f'"{option}"' in arguments for option in ("merge", "--backend", "--local_dir", "--target_dir"))
    assert has_merger == (version_of(version) >= MERGER_FROM), version
    sft = [package / "trainer" / f"{name}.py" for name in ("fsdp_sft_trainer", "sft_trainer")]
    tracked = [f for f in sft if f.is_file() and re.search(r"get_checkpoint_tracker_filename|CheckpointHandler",
                                                            f.read_text())]
    assert bool(tracked) == (version_of(version) >= SFT_TRACKER_FROM), (version, tracked)
    ppo = (package / "trainer" / "ppo" / "ray_trainer.py").read_text()
    assert re.search(r"""["']latest_checkpointed_iteration\.txt["']""", ppo) and re.search(r"""["']actor["']\)""", ppo), \
        version


@pytest.mark.parametrize("version", [v for v in RELEASES if GENERATION_SERVER in snapshot(v).programs])
def test_verls_generation_server_reads_what_verlc_says_in_each_release(version: str) -> None:
    """compiler/verl/program.py's facts about main_generation_server against each release's own module: it composes
    ppo_trainer, trains nothing (no Ray trainer, no fit), reads data.train_files and data.prompt_key and writes
    data.output_path, which that config lacks (verlc refuses a spec without it)."""
    source = (release_package(version) / "trainer" / "main_generation_server.py").read_text()
    tree = ast.parse(source)
    names = {ast.unparse(node) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    assert {"config.data.train_files", "config.data.prompt_key", "config.data.output_path"} <= names, version
    assert not any(n.endswith(".fit") for n in names) and "RayPPOTrainer" not in source, version
    configs = {kw.value.value for node in ast.walk(tree) if isinstance(node, ast.Call)
               and ast.unparse(node.func) == "hydra.main" for kw in node.keywords if kw.arg == "config_name"}
    assert configs == {"ppo_trainer"} == {snapshot(version).programs[GENERATION_SERVER]}, (version, configs)
    chosen = select({}, snapshot(version), "ppo_trainer")
    assert "prompt_key" in chosen.tree["data"] and "output_path" not in chosen.tree["data"], version


GROUP_CASES = 24  # (group choice, one of its keys) pairs per release, each set right and misspelled


def group_corpus(version: str, tmp: Path) -> list[dict[str, Any]]:
    """For each config of the release verlc composes (main_ppo's and each program's), each other option of a
    group its defaults list chooses that the shipped schema composes: one leaf the option puts there, at its
    own value and misspelled (sampled), and per config one group its defaults list does not choose."""
    release = snapshot(version)
    configs = {"ppo_trainer": "verl.trainer.main_ppo",
               **{name: module for module, name in sorted(release.programs.items())
                  if name in release.program_configs and (version, module) in SFT_PROGRAMS}}
    pairs, refused = [], []
    for config, module in configs.items():
        engine = (release.configs.get(config) or release.program_configs[config])[0]
        known = release.group_choices(config, engine)
        base = tmp / "base.yaml"
        base.write_text(json.dumps(_group_spec(version, module, config, {}, {})))
        own = {o.key for o in compile_spec(base, CATALOG, display="base.yaml", source="base.yaml").overrides}
        for key, entry in sorted(known.items()):
            for option, ref in sorted(entry["options"].items()):
                subtree = release.choice(config, engine, key, option) if ref is not None else None
                if not isinstance(subtree, dict) or any(v == MISSING for _, v in leaves(subtree)):
                    continue  # an abstract option (verl's base actor.yaml: strategy ???) leaves mandatory keys
                simple = [(f"{entry['package']}.{k}", v) for k, v in leaves(subtree)
                          if v is not None and v != MISSING and isinstance(v, (bool, int, float, str))
                          and not (isinstance(v, str) and "${" in v)]
                simple = [(k, v) for k, v in simple if k not in own and not any(r in k for r in RULED)]
                if simple:
                    leaf = random.Random(f"{version} {config} {key} {option}").choice(simple)
                    pairs.append((config, module, engine, {key: option}, leaf))
        unchosen = sorted(g for g in release.groups if "/" not in g and g not in known and g != "model_engine")
        if known and unchosen:
            refused.append((config, module, engine, {unchosen[0]: release.groups[unchosen[0]][0]}, None))
    cases = []
    for config, module, engine, groups, leaf in random.Random(version).sample(pairs, min(GROUP_CASES, len(pairs))):
        wrong = leaf[0].rsplit(".", 1)
        wrong[-1] += "x"
        for flat in ({leaf[0]: leaf[1]}, {".".join(wrong): leaf[1]}):
            cases.append({"config": config, "module": module, "engine": engine, "groups": groups, "flat": flat})
    cases += [{"config": c, "module": m, "engine": e, "groups": g, "flat": {}} for c, m, e, g, _ in refused]
    return cases


def _group_spec(version: str, module: str, config: str, groups: dict[str, str], flat: dict[str, Any]
                ) -> dict[str, Any]:
    if module == "verl.trainer.main_ppo":
        return {"name": "groups", "project": "p", "model": "m", "verl_version": version,
                "hydra": {"config_name": config, "groups": groups}, "verl": nest(flat, baseline(version)),
                "data": {"train_files": ["t.parquet"], "val_files": ["v.parquet"]},
                "cluster": {"nodes": 1, "gpus_per_node": 8}}
    return {**sft_spec(version, module, flat), "hydra": {"groups": groups}}


@pytest.mark.parametrize("version", RELEASES)
def test_a_config_group_choice_is_composed_as_hydra_composes_it(tmp_path: Path, version: str) -> None:
    """`hydra.groups` choosing another option of a group (verl's SFT examples: engine=megatron optim=megatron):
    the keys that option brings are judged as verl judges them, Hydra composing the choice (the oracle), and a
    group the config's defaults list does not choose is refused as Hydra refuses it."""
    cases = group_corpus(version, tmp_path)
    if not snapshot(version).groups:
        assert not cases  # verl 0.3 has no config groups
        return
    assert len(cases) >= 4, f"too few group choices read from verl {version}'s configs"  # 0.5.0: 5
    problems = []
    for case in cases:
        spec = tmp_path / "spec.yaml"
        spec.write_text(json.dumps(_group_spec(version, case["module"], case["config"], case["groups"], case["flat"])))
        try:
            compile_spec(spec, CATALOG, display="spec.yaml", source="spec.yaml")
            problems.append([])
        except SpecError as exc:
            problems.append([f"{d.path}: {d.message}" for d in exc.diagnostics])
        case.update(overrides=[f"{k}={hydra_value(verl_value(v))}" for k, v in case["flat"].items()],
                    keys=list(case["flat"]), values=dict(case["flat"]), verlc=None,
                    groups_argv=[f"{k}={o}" for k, o in case["groups"].items()])
    verdicts = oracle(version, [{"config": c["config"], "engine": c["engine"], "overrides": c["overrides"],
                                 "keys": c["keys"], "values": c["values"], "verlc": None,
                                 "groups": c["groups_argv"]} for c in cases])
    disagreements = [f"{c['groups']} {c['flat']}\n  verlc: {p or 'accepts'}\n  verl:  {v or 'accepts'}"
                     for c, p, v in zip(cases, problems, verdicts) if bool(p) != bool(v)
                     or (p and c["flat"] and not any(f"verl.{next(iter(c['flat']))}" in line for line in p))
                     or (p and not c["flat"] and not any("hydra.groups." in line for line in p))]
    print(f"verl {version}: {len(cases)} group cases, {sum(bool(v) for v in verdicts)} rejected by verl")
    assert not disagreements, f"{len(disagreements)} of {len(cases)} cases:\n" + "\n".join(disagreements[:25])
