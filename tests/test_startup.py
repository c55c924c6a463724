"""What verl's workers need at start-up (compiler/verl/workers.py), judged against each release's own code, and
the preflight's check of it on a node (runtime/startup.py).

Every fact names a verl file and line: each is read back from that release's installed source here, so a fact
that points at the wrong line, or at a line that does not say it, fails. The build's refusals are tested both
ways (a config verl's workers take is taken), and the registry against verl's own `_ROLLOUT_REGISTRY` object
where this test environment can import the release."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from verlc.compiler.verl.release import RELEASES, snapshot
from verlc.compiler.verl.rules import Config
from verlc.compiler.verl.workers import FA2, needs, read
from verlc.runtime import startup as runtime_startup
from verlc.runtime.job import Expiry, PhaseNeed, RolloutMemory, StartupNeed
from verlc.runtime.train import with_deadline

sys.path.insert(0, str(REPO / "dev"))
from verl_schema import release_package  # noqa: E402  (installs a release's files into .cache, cached)


def line_of(package: Path, where: str) -> str:
    """The source line `verl/x.py:N` names (the part before a " (called from ...)")."""
    path, number = where.split(" ")[0].rsplit(":", 1)
    return (package.parent / path).read_text(encoding="utf-8").splitlines()[int(number) - 1]


@pytest.mark.parametrize("version", RELEASES)
def test_every_fact_points_at_a_line_of_the_release_that_states_it(version: str) -> None:
    package = release_package(version)
    facts = read(package)
    assert facts == snapshot(version).startup, "the shipped schema is stale: run dev/verl_schema.py " + version
    for engine, found in facts["imports"].items():
        for fact in found:
            line = line_of(package, fact["where"])
            assert "import" in line and fact["module"].split(".")[-1] in line, (engine, fact, line)
    for fact in facts["attention"]:
        line = line_of(package, fact["where"])
        assert FA2 in line, (fact, line)
        if fact["unless"] == "attn_implementation":
            assert '"attn_implementation"' in line, (fact, line)
        if "via" in fact:  # the worker's line calls the function that asks for it
            assert "(" in line_of(package, fact["via"]), fact
    for fact in facts["flags"]:
        assert fact["module"] in line_of(package, fact["where"]), fact
    if facts["hf_repeats_n"]:
        generate, repeat = (line_of(package, w) for w in facts["hf_repeats_n"])
        assert "num_return_sequences" in generate and "config.n" in generate, generate
        assert "gen_batch = gen_batch.repeat" in repeat and "rollout.n" in repeat, repeat
    assert facts["loggers"] and "supported_backend" in line_of(package, facts["loggers"]["where"])
    assert "wandb" in facts["loggers"]["names"] and "console" in facts["loggers"]["names"]
    if facts["sglang_model_len"]:  # the assert, written on one line or wrapped over the next few
        path, number = facts["sglang_model_len"].rsplit(":", 1)
        lines = (package.parent / path).read_text(encoding="utf-8").splitlines()[int(number) - 1:int(number) + 3]
        assert lines[0].strip().startswith("assert") and "self.config.max_model_len >= " in " ".join(lines), lines
    if facts["chat_tokens"]:
        assert "create_continuous_token_builder(" in line_of(package, facts["chat_tokens"]["call"])
        for tokens in facts["chat_tokens"]["model_types"].values():
            for text, where, kind in tokens:
                line = line_of(package, where)
                called = "require_token_id(tokenizer, " if kind == "token" else "tokenizer.encode("
                assert called in line and (repr(text)[1:-1] in line or "self._" in line), line
    if facts["expiry_save"]:
        assert "def should_save_ckpt_esi(" in line_of(package, facts["expiry_save"]["check"])
        assert "should_save_ckpt_esi(" in line_of(package, facts["expiry_save"]["called"])


def test_the_facts_the_gpu_run_met_are_read_where_they_hold() -> None:
    """The three start-up deaths seen on a GPU, as facts: 0.5.0's actor asks for flash_attention_2 unless
    override_config._attn_implementation says otherwise and its critic always does; its HF rollout repeats by n
    (0.4.1's trainer repeats after generating, 0.6.0's HF rollout generates one); 0.6.1 has no HF rollout."""
    old = snapshot("0.5.0").startup
    assert {(f["role"], f["unless"]) for f in old["attention"]} >= {("actor_rollout_ref", "_attn_implementation"),
                                                                      ("critic", None)}
    assert {f["module"] for f in old["imports"]["fsdp"] if f["device"] == "cuda"} == {"flash_attn.bert_padding"}
    assert old["hf_repeats_n"] and not snapshot("0.4.1").startup["hf_repeats_n"]
    assert not snapshot("0.6.0").startup["hf_repeats_n"]
    assert "hf/sync" not in snapshot("0.6.1").startup["rollouts"] and "vllm/sync" in snapshot("0.6.1").startup["rollouts"]
    assert ("actor_rollout_ref", "attn_implementation") in {(f["role"], f["unless"])
                                                            for f in snapshot("0.6.1").startup["attention"]}
    assert {f["flag"] for f in old["flags"]} == {"use_liger"}
    new = snapshot("0.9.1").startup  # 0.8 on: the engine workers
    assert ("transfer_queue", "verl/trainer/main_ppo.py:137") in {(f["module"], f["where"]) for f in new["imports"]["fsdp"]}
    assert {(f["role"], f["unless"]) for f in new["attention"]} == {("actor_rollout_ref", "attn_implementation"),
                                                                     ("critic", "attn_implementation")}
    assert not snapshot("0.8.0").startup["imports"]["fsdp"]  # 0.8.0's trainer has no transfer queue


def test_the_engine_workers_needs_are_verls_own(tmp_path: Path) -> None:
    """verl 0.9.1's own code, run here (its verl-core extra's transfer_queue is not installed): the trainer's start
    imports transfer_queue, and HFModelConfig asks for flash_attention_2 unless override_config says otherwise;
    verlc's needs for the same settings say both."""
    sdpa = {"actor_rollout_ref.model.override_config.attn_implementation": "sdpa"}
    assert needed("0.9.1") >= {("import", "transfer_queue"), (FA2, "flash_attn")}
    assert (FA2, "flash_attn") not in needed("0.9.1", **sdpa)
    assert ("import", "verl.workers.rollout.vllm_rollout") in needed(
        "0.9.1", **sdpa, **{"actor_rollout_ref.rollout.name": "vllm"})
    assert ("import", "transfer_queue") not in needed("0.8.0")
    # trainer.use_v1: false starts main_ppo_v0's TaskRunner, which does not import it
    assert ("import", "transfer_queue") not in needed("0.9.1", **{"trainer.use_v1": False})
    package = release_package("0.9.1")
    env = {**os.environ, "PYTHONPATH": str(package.parent)}
    blocked = "import sys; sys.modules['transfer_queue'] = None; import verl.trainer.ppo.v1"
    done = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode != 0 and "transfer_queue" in done.stderr.splitlines()[-1], done.stderr[-2000:]
    # main_ppo_v0's TaskRunner.run: the imports at its top, run by verl itself with transfer_queue blocked
    legacy = ("import ast, importlib, sys; sys.modules['transfer_queue'] = None\n"
              "import verl.trainer.main_ppo, verl.trainer.main_ppo_v0 as v0\n"
              "tree = ast.parse(open(v0.__file__).read())\n"
              "runner = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == 'TaskRunner')\n"
              "run = next(f for f in runner.body if isinstance(f, ast.FunctionDef) and f.name == 'run')\n"
              "for stmt in run.body:\n"
              "    if isinstance(stmt, (ast.Import, ast.ImportFrom)): exec(ast.unparse(stmt))\n"
              "print('started without it')")
    done = subprocess.run([sys.executable, "-c", legacy], capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0 and done.stdout.split()[-3:] == ["started", "without", "it"], done.stderr[-2000:]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 128, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2}))
    asks = ("import json, sys; from verl.workers.config.model import HFModelConfig\n"
            "for oc in ({}, {'attn_implementation': 'sdpa'}):\n"
            "    print(HFModelConfig(path=sys.argv[1], override_config=oc, load_tokenizer=False).hf_config._attn_implementation)")
    done = subprocess.run([sys.executable, "-c", asks, str(tmp_path / "model")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == [FA2, "sdpa"]


def tokenizer_folder(folder: Path, model_type: str, specials: list[str], unk: bool, newline: bool = True) -> Path:
    """A model folder with a config.json of `model_type` and a fast tokenizer (a few words, a newline among them
    where `newline`, `specials` added; an unknown token where `unk`), made offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    # byte-level, as Qwen's (transformers rebuilds a qwen2 model's tokenizer that way): a newline is "Ċ"
    words = {w: i for i, w in enumerate(["<unk>"] * unk + ["a", "b"] + ["Ċ"] * newline)}
    bpe = Tokenizer(models.BPE(vocab=words, merges=[], unk_token="<unk>" if unk else None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>" if unk else None)
    fast.add_special_tokens({"additional_special_tokens": specials})
    folder.mkdir(parents=True)
    fast.save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
    return folder


def test_the_chat_tokens_a_model_family_needs_are_verls_own_verdict(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """verl 0.9.1's agent loop builds each rollout's turns with its model family's builder, which raises where the
    tokenizer lacks a token it requires (the rehearsal's first 0.9.1 run died there on the GPU, 4 minutes after
    the queue: docs/gpu.md). The preflight's verdict on each tokenizer is verl's own, run here."""
    cases = {
        "qwen2 with <|im_end|>": ("qwen2", ["<|im_start|>", "<|im_end|>"], False),
        "qwen2 without it": ("qwen2", ["<|end|>"], False),
        "qwen3 without it, an unknown token": ("qwen3", [], True),  # convert_tokens_to_ids gives <unk>'s id
        "glm4_moe with <|user|> only": ("glm4_moe", ["<|user|>"], False),
        "llama without it": ("llama", [], False),  # no family builder: nothing required
        "qwen2 with <|im_end|>, no newline token": ("qwen2", ["<|im_end|>"], False, False),
    }
    folders = {name: tokenizer_folder(tmp_path / f"m{i}", *case) for i, (name, case) in enumerate(cases.items())}
    verl_says = ("import json, sys\n"
                 "from transformers import AutoTokenizer\n"
                 "from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder\n"
                 "out = {}\n"
                 "for folder in sys.argv[1:]:\n"
                 "    model_type = json.load(open(folder + '/config.json'))['model_type']\n"
                 "    try:\n"
                 "        create_continuous_token_builder(AutoTokenizer.from_pretrained(folder), hf_model_type=model_type)\n"
                 "        out[folder] = True\n"
                 "    except ValueError:\n"
                 "        out[folder] = False\n"
                 "print(json.dumps(out))")
    env = {**os.environ, "PYTHONPATH": str(release_package("0.9.1").parent)}
    done = subprocess.run([sys.executable, "-c", verl_says, *map(str, folders.values())], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = json.loads(done.stdout.splitlines()[-1])
    assert [verdicts[str(f)] for f in folders.values()] == [True, False, True, False, True, False]  # verl's own
    need = next(n for n in needs(snapshot("0.9.1").startup, config("0.9.1").get, use_critic=False,
                                 accelerator="cuda", label="verl 0.9.1") if n.check == "chat_tokens")
    asked = [{**need.__dict__, "model": str(folder)} for folder in folders.values()]
    monkeypatch.setenv("PYTHONPATH", env["PYTHONPATH"])  # the node's verl: 0.9.1's
    found = runtime_startup.startup_found(asked)
    assert "results" in found, found
    assert [r["ok"] for r in found["results"]] == [verdicts[str(f)] for f in folders.values()]
    problems = runtime_startup.startup_problems({"abcdef0123": found}, [StartupNeed(**need.__dict__)] * len(asked))
    assert len(problems) == 3, problems
    assert "does not define required token '<|im_end|>'" in problems[0] and "'<|observation|>'" in problems[1]
    assert "Expected Qwen newline to tokenize to one token" in problems[2], problems[2]
    assert "verl/utils/tokenizer/continuous_token.py:560" in problems[0]
    assert "verl/experimental/agent_loop/agent_loop.py:" in problems[0]  # where the agent loop builds it
    # a model folder this node does not have: not checked, said so
    missing = runtime_startup.startup_found([{**need.__dict__, "model": str(tmp_path / "absent")}])["results"][0]
    assert missing["ok"] is None and "not checked" in missing["detail"]


@pytest.mark.parametrize("version", ["0.7.1", "0.8.0", "0.9.0", "0.9.1"])
def test_the_registry_is_verls_own(version: str) -> None:
    """verl's `_ROLLOUT_REGISTRY` itself, imported from the release (the releases whose code imports under this
    environment's transformers), against what verlc read with ast."""
    code = "import json, verl.workers.rollout.base as b; print(json.dumps(sorted(f'{n}/{m}' for n, m in b._ROLLOUT_REGISTRY)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(release_package(version).parent)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == sorted(snapshot(version).startup["rollouts"])


def config(version: str, **settings: object) -> Config:
    release = snapshot(version)
    return Config(release.tree("ppo_trainer", release.default_engine("ppo_trainer")), dict(settings))


def needed(version: str, use_critic: bool = False, accelerator: str = "cuda", **settings: object) -> set[tuple[str, str]]:
    found = needs(snapshot(version).startup, config(version, **settings).get, use_critic=use_critic,
                  accelerator=accelerator, label=f"verl {version}")
    return {(n.check, n.module) for n in found}


def test_what_a_config_needs_follows_its_settings() -> None:
    sdpa = {"actor_rollout_ref.model.override_config._attn_implementation": "sdpa"}
    assert needed("0.5.0") == {("import", "flash_attn.bert_padding"), (FA2, "flash_attn")}
    assert needed("0.5.0", **sdpa) == {("import", "flash_attn.bert_padding")}
    assert (FA2, "flash_attn") in needed("0.5.0", use_critic=True, **sdpa)  # the critic asks whatever it is told
    assert ("import", "liger_kernel.transformers.monkey_patch") in needed(
        "0.5.0", **{"actor_rollout_ref.model.use_liger": True})
    assert ("import", "megatron.core") in needed("0.5.0", **{"actor_rollout_ref.actor.strategy": "megatron"})
    assert needed("0.5.0", accelerator="npu", **sdpa) == {("import", "torch_npu")}  # no CUDA kernel on Ascend
    # 0.6.1 reads attn_implementation (no underscore) from override_config, and imports its rollout by registry
    assert (FA2, "flash_attn") in needed("0.6.1", **sdpa)
    assert needed("0.6.1", **{"actor_rollout_ref.model.override_config.attn_implementation": "sdpa",
                              "actor_rollout_ref.rollout.name": "vllm"}) == {
        ("import", "verl.workers.rollout.vllm_rollout")}


def build(tmp_path: Path, version: str, verl: dict, run: object) -> subprocess.CompletedProcess[str]:
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "startup", "project": "p", "model": "/models/m", "verl_version": version,
        "data": {"train_files": ["/d/t.parquet"], "val_files": ["/d/v.parquet"]},
        "cluster": {"nodes": 1, "gpus_per_node": 1}, "container": {"runtime": "none"},
        "verl": {"algorithm": {"adv_estimator": "grpo"}, "data": {"train_batch_size": 16},
                 "trainer": {"logger": ["console"]}, **verl}}))
    return run("validate", spec)


def rollout(**settings: object) -> dict:
    return {"actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 4},
                                  "rollout": {"tensor_model_parallel_size": 1, "log_prob_micro_batch_size_per_gpu": 4,
                                              **settings},
                                  "ref": {"log_prob_micro_batch_size_per_gpu": 4}}}


@pytest.mark.parametrize(("version", "settings", "refused"), [
    ("0.6.1", {"name": "hf"}, "registry of (name, mode)"),
    ("0.6.1", {"name": "vllm"}, None),
    ("0.6.1", {"name": "sglang", "mode": "async"}, None),
    ("0.5.0", {"name": "hf", "n": 4}, "HF rollout generates rollout.n (4)"),
    ("0.5.0", {"name": "hf", "n": 1}, None),
    ("0.4.1", {"name": "hf", "n": 4}, None),  # its trainer repeats the batch after the rollout
])
def test_the_build_refuses_what_the_workers_refuse_and_takes_what_they_take(
        tmp_path: Path, version: str, settings: dict, refused: str | None) -> None:
    from conftest import run_verlc

    done = build(tmp_path, version, rollout(**settings), run_verlc)
    if refused:
        assert done.returncode == 2 and refused in done.stderr and "spec.yaml:" in done.stderr, done.stderr
        assert "verl itself only finds this once the workers start" in done.stderr
    else:
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("registers", ['("myengine", "async")', '("otherengine", "async")', None],
                         ids=["registers-it", "registers-another", "not-in-the-code"])
def test_a_rollout_the_runs_external_modules_register_gets_verls_own_verdict(tmp_path: Path,
                                                                            registers: str | None) -> None:
    """#53 item 9: VERL_USE_EXTERNAL_MODULES names a module of the run's code that adds to verl's rollout registry
    as verl loads: verl 0.9.1's own registry (imported with that env) says whether it holds the spec's rollout, and
    verlc says the same; a module that is not in the run's code (installed in the image) is a note: verlc cannot
    know."""
    from conftest import run_verlc

    code = tmp_path / "code"
    code.mkdir()
    if registers:
        (code / "my_rollout.py").write_text("from verl.workers.rollout.base import _ROLLOUT_REGISTRY\n"
                                            f"_ROLLOUT_REGISTRY[{registers}] = 'my_rollout.Adapter'\n")
    probe = ("import json, verl.workers.rollout.base as b; "
             "print(json.dumps(('myengine', 'async') in b._ROLLOUT_REGISTRY))")
    verl = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=code,
                          env={**os.environ, "VERL_USE_EXTERNAL_MODULES": "my_rollout",
                               "PYTHONPATH": f"{release_package('0.9.1').parent}:{code}"})
    build(tmp_path, "0.9.1", rollout(name="myengine"), lambda *a: a)  # the spec alone
    spec = json.loads((tmp_path / "spec.yaml").read_text())
    (tmp_path / "spec.yaml").write_text(json.dumps({**spec, "code": "code",
                                                    "env": {"VERL_USE_EXTERNAL_MODULES": "my_rollout"}}))
    done = run_verlc("validate", tmp_path / "spec.yaml")
    if registers is None:
        assert verl.returncode != 0  # verl itself cannot load without the module: no verdict to match
        assert done.returncode == 0 and "my_rollout (imported as verl loads; not in the run's code" in done.stderr \
            and "verlc cannot know" in done.stderr, done.stderr
        return
    assert verl.returncode == 0, verl.stderr[-2000:]
    takes = json.loads(verl.stdout.splitlines()[-1])
    assert takes == (registers == '("myengine", "async")')
    assert (done.returncode == 0) == takes, done.stderr
    if not takes:
        assert "must be one of myengine" not in done.stderr and "otherengine" in done.stderr, done.stderr


@pytest.mark.parametrize(("version", "logger", "refused"), [
    ("0.9.1", ["console", "wandbb"], "'wandbb' is not one of them (did you mean 'wandb'?): its Tracking asserts it "
                                     "(verl/utils/tracking.py:"),
    ("0.9.1", "wandb", None),  # one name: Tracking makes it a list
    ("0.9.1", ["console", "tracking"], None),  # the old name: a warning
    ("0.9.1", ["rl_insight"], None),
    ("0.8.0", ["rl_insight"], "'rl_insight' is not one of them"),  # it came in 0.9.0
    ("0.5.0", ["trackio"], "verl 0.5.0's trainer logs to wandb, mlflow, swanlab, vemlp_wandb, tensorboard, console, "
                           "clearml; 'trackio' is not one of them"),
])
def test_a_logger_the_releases_tracking_does_not_know_is_refused(
        tmp_path: Path, version: str, logger: object, refused: str | None) -> None:
    from conftest import run_verlc

    done = build(tmp_path, version, {**rollout(name="vllm"), "trainer": {"logger": logger}}, run_verlc)
    if refused:
        assert done.returncode == 2 and refused in done.stderr, done.stderr
        assert "spec.yaml:" in done.stderr and "verl itself only finds this once the workers start" in done.stderr
    else:
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(("version", "name", "refused"), [
    ("0.4.1", "sglang", True),  # its SGLang rollout asserts it
    ("0.4.1", "vllm", False),
    ("0.9.1", "sglang", False),
])
def test_a_max_model_len_below_prompt_and_response_is_refused_where_verl_asserts_it_else_noted(
        tmp_path: Path, version: str, name: str, refused: bool) -> None:
    from conftest import run_verlc

    settings = {**rollout(name=name, max_model_len=1024),
                "data": {"train_batch_size": 16, "max_prompt_length": 512, "max_response_length": 1024}}
    done = build(tmp_path, version, settings, run_verlc)
    said = "rollout.max_model_len (1024) is below data.max_prompt_length + data.max_response_length (512 + 1024 = 1536)"
    assert said in done.stderr, done.stderr
    if refused:
        assert done.returncode == 2 and "SGLang rollout asserts it (verl/workers/rollout/sglang_rollout/" in done.stderr
    else:
        assert done.returncode == 0 and "note:" in done.stderr and "cuts a response short" in done.stderr, done.stderr


def test_the_critics_flash_attn_is_a_note_at_build(tmp_path: Path) -> None:
    from conftest import run_verlc

    critic = {"algorithm": {"adv_estimator": "gae"}, "critic": {"ppo_micro_batch_size_per_gpu": 4}}
    done = build(tmp_path, "0.5.0", {**rollout(name="hf"), **critic}, run_verlc)
    assert done.returncode == 0, done.stderr
    assert "note: verl 0.5.0's critic loads its model with flash_attention_2" in done.stderr
    assert "verl/utils/model.py:" in done.stderr
    assert "critic loads" not in build(tmp_path, "0.5.0", rollout(name="hf"), run_verlc).stderr  # GRPO: no critic


def test_the_preflight_imports_each_need_in_a_fresh_python_and_names_what_fails() -> None:
    wanted = [
        {"check": "import", "module": "json", "device": "", "where": "verl/a.py:1", "why": "w1", "avoid": ""},
        {"check": "import", "module": "no_such_module_xyz", "device": "", "where": "verl/b.py:2",
         "why": "verl 0.5.0: the actor worker imports it", "avoid": "set x: false"},
        {"check": FA2, "module": "flash_attn", "device": "cuda", "where": "verl/c.py:3", "why": "w3", "avoid": ""},
        {"check": "import", "module": "torch_npu", "device": "npu", "where": "verl/d.py:4", "why": "w4", "avoid": ""},
    ]
    found = runtime_startup.startup_found(wanted)
    results = found["results"]
    assert [r["ok"] for r in results[:2]] == [True, False]
    assert "ModuleNotFoundError" in results[1]["detail"] and "no_such_module_xyz" in results[1]["detail"]
    assert results[2]["ok"] is None and "CUDA" in results[2]["detail"]  # this machine's torch sees no GPU
    assert results[3]["ok"] is None
    needs = [StartupNeed(**need) for need in wanted]
    problems = runtime_startup.startup_problems({"abcdef0123": found}, needs)
    assert problems == [f"node {found['host']} (abcdef01): no_such_module_xyz: {results[1]['detail']}; "
                        f"verl 0.5.0: the actor worker imports it (verl/b.py:2); set x: false"]
    record = runtime_startup.startup_record({"abcdef0123": found}, needs)
    assert record["needs"][1]["nodes"][found["host"]]["ok"] is False
    assert "unknown" in runtime_startup.startup_record({}, None)


def test_the_gpu_memory_check_takes_vllms_own_rule_and_names_what_holds_the_gpu(tmp_path: Path) -> None:
    """vLLM refuses to start unless ceil(total x gpu_memory_utilization) bytes are free (vLLM 0.24.0's
    request_memory, vllm/v1/worker/utils.py): the preflight's verdict is that rule, byte for byte, on stand-in
    figures; the probe itself runs here (no GPU: nothing to measure, nothing refused); a vLLM rollout's share
    reaches the job, an SGLang one's does not (SGLang asks a share of the free memory, not the total)."""
    gib = 1 << 30
    total = 80 * gib
    share = 0.4
    asked = math.ceil(total * share)  # vLLM's own arithmetic
    holder = {"pid": 4242, "mib": 40960, "command": "vllm serve /models/judge"}

    def node(free: int) -> dict:
        return {"abcdef0123": {"host": "n1", "gpus": [{"index": 0, "name": "H100", "free": free, "total": total}],
                               "holders": [holder]}}

    assert runtime_startup.memory_problems(node(asked), RolloutMemory(share)) == []
    short = runtime_startup.memory_problems(node(asked - 1), RolloutMemory(share))
    assert len(short) == 1 and "node n1 (abcdef01)" in short[0] and "GPU 0 (H100)" in short[0]
    assert "pid 4242 40.0 GiB (vllm serve /models/judge)" in short[0] and "0.4 of its total (32.0 GiB)" in short[0]
    found = runtime_startup.memory_found()
    assert found["gpus"] == [] and runtime_startup.memory_problems({"x" * 10: found}, RolloutMemory(share)) == []
    # the plan's predicted phases (compiler/memory.py), the services' shares aside: a GPU that has vLLM's share
    # free but not the peak (another process, or a smaller card than the spec declares)
    need = asked + 5 * gib
    phases = [PhaseNeed("rollout", 5 * gib, share), PhaseNeed("update (actor)", 20 * gib)]
    planned = RolloutMemory(share, phases, total)
    assert runtime_startup.memory_problems(node(need), planned) == []
    over = runtime_startup.memory_problems(node(need - 1), planned)
    assert len(over) == 1 and "takes 37.0 GiB of it at its peak (rollout;" in over[0] and "pid 4242" in over[0]
    assert "declares" not in over[0]
    sglang = RolloutMemory(None, [PhaseNeed("rollout", need)], total)
    assert runtime_startup.memory_problems(node(need - 1), sglang) == over
    # on a card other than the one declared, the rollout's share is of that card: a spec declaring 140 GiB needs
    # 5 + 0.4 x 140 = 61 GiB, but on an 80 GiB card 37 GiB; a smaller card's update can become the peak
    declared = RolloutMemory(share, phases, 140 * gib)
    assert declared.peak() == PhaseNeed("rollout", 5 * gib + math.ceil(share * 140 * gib))
    assert runtime_startup.memory_problems(node(need), declared) == []
    smaller = runtime_startup.memory_problems(node(need - 1), declared)
    assert smaller == [over[0].replace("; `verlc plan`", "; the spec declares a GPU of 140.0 GiB; `verlc plan`")]

    def card(gib_total: int, free: int) -> dict:
        return {"abcdef0123": {"host": "n1", "gpus": [{"index": 0, "name": "L4", "free": free,
                                                       "total": gib_total * gib}], "holders": []}}

    assert declared.peak(24 * gib) == PhaseNeed("update (actor)", 20 * gib)  # 5 + 0.4 x 24 = 14.6 < 20
    short = runtime_startup.memory_problems(card(24, 20 * gib - 1), declared)
    assert len(short) == 1 and "takes 20.0 GiB of it at its peak (update (actor); the spec declares" in short[0]
    failed = {"abcdef0123": {"host": "n1", "error": "the measurement exited with code 1: boom"}}
    assert runtime_startup.memory_problems(failed, RolloutMemory(share)) == [
        "GPU memory: node n1 (abcdef01): the measurement exited with code 1: boom"]
    for engine, expected in (("vllm", {"share": 0.55, "phases": [], "gpu": None}), ("sglang", None)):
        spec = tmp_path / f"{engine}.yaml"
        spec.write_text(json.dumps({
            "name": engine, "project": "p", "model": "/models/m", "verl_version": "0.9.1",
            "data": {"train_files": ["/d/t.parquet"], "val_files": ["/d/v.parquet"]},
            "cluster": {"nodes": 1, "gpus_per_node": 1}, "container": {"runtime": "none"}, "targets": ["ray-job"],
            "verl": {"algorithm": {"adv_estimator": "grpo"}, "data": {"train_batch_size": 16},
                     "trainer": {"logger": ["console"]}, **rollout(name=engine, gpu_memory_utilization=0.55)}}))
        built = subprocess.run([sys.executable, "-m", "verlc", "build", str(spec), "--target", "ray-job", "--out",
                                str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
        assert built.returncode == 0, built.stderr
        job = json.loads((tmp_path / "out" / engine / "ray-job" / "verlc_job" / "job.json").read_text())
        assert job["rollout_memory"] == expected


def test_the_deadline_reaches_the_jobs_ray_env_merged_with_what_is_there(tmp_path: Path) -> None:
    """#42: verl reads its deadline in its own Ray actor: the runtime puts it into the job-level runtime env that
    Ray's ray.init() merges (keeping a `ray job submit` runtime env's own entries), read from the target's file."""
    from verlc.compiler.verl.workers import read

    end = tmp_path / "end-time"
    end.write_text("2000000000\n")
    expiry = Expiry(variable="MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP", lead=300, end_file=[str(end)])
    submitted = {"RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": {"env_vars": {"A": "1"},
                                                                            "working_dir": "w"}, "metadata": {}})}
    env = with_deadline(submitted, expiry)
    job = json.loads(env["RAY_JOB_CONFIG_JSON_ENV_VAR"])
    assert job["runtime_env"] == {"env_vars": {"A": "1", expiry.variable: "1999999700"}, "working_dir": "w"}
    assert env[expiry.variable] == "1999999700" and job["metadata"] == {}
    end.unlink()  # no end time known: the environment as it was
    assert with_deadline(submitted, expiry) == submitted
    # the variable is the one each release's should_save_ckpt_esi reads (0.5.0 on), none before
    for version, has in (("0.4.1", False), ("0.5.0", True), ("0.9.1", True)):
        fact = read(release_package(version)).get("expiry_save")
        assert (fact or {}).get("variable") == (expiry.variable if has else None), version


@pytest.mark.parametrize(("version", "target", "noted"), [
    ("0.4.1", "slurm", True), ("0.5.0", "slurm", False), ("0.4.1", "ray-job", False)])
def test_a_release_without_verls_save_ahead_of_the_deadline_is_a_note_where_slurm_requeues_at_its_limit(
        tmp_path: Path, version: str, target: str, noted: bool) -> None:
    """#42: on releases before 0.5.0 (no should_save_ckpt_esi, read from their code) a Slurm job requeued at its
    time limit loses the steps since its last checkpoint: the Slurm build says so; a target without the limit
    does not."""
    from conftest import run_verlc

    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "deadline", "project": "p", "model": "/models/m", "verl_version": version, "targets": [target],
        "data": {"train_files": ["/d/t.parquet"], "val_files": ["/d/v.parquet"]},
        "cluster": {"nodes": 1, "gpus_per_node": 1,
                    "slurm": {"cpus_per_task": 8, "time": "04:00:00", "requeue_grace": 300}},
        "container": {"runtime": "none"},
        "verl": {"algorithm": {"adv_estimator": "grpo"}, "data": {"train_batch_size": 16},
                 "trainer": {"logger": ["console"], "save_freq": 10}, **rollout(name="vllm")}}))
    done = run_verlc("build", spec, "--target", target, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    assert ("cannot save a checkpoint ahead of the time limit" in done.stderr) == noted, done.stderr
    if noted:  # #53: verl's evaluation saves no checkpoint at all: no note of what it cannot save
        data = json.loads(spec.read_text())
        data.update(program="verl.trainer.main_eval", verl={})
        spec.write_text(json.dumps(data))
        done = run_verlc("build", spec, "--target", target, "--out", tmp_path / "eval", "--force")
        assert done.returncode == 0 and "checkpoint" not in done.stderr, done.stderr


# (train_batch_size, rollout.n, GPUs, sequence parallel, log-prob micro batch): #64 item 5's case first
MICRO_CASES = [(1024, 5, 32, 1, 7), (1024, 5, 32, 1, 8), (1024, 5, 32, 1, 160), (512, 8, 16, 2, 12),
               (512, 8, 16, 2, 16), (256, 4, 8, 1, 3), (256, 4, 8, 4, 64), (96, 5, 8, 1, 5)]

ENGINE_ORACLE = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import torch
from tensordict import TensorDict
from verl.utils import tensordict_utils as tu
from verl.workers.engine.utils import prepare_micro_batches
verdicts = []
for rank, micro in json.load(sys.stdin):
    data = TensorDict({"input_ids": torch.zeros(rank, 2, dtype=torch.long)}, batch_size=[rank])
    tu.assign_non_tensor(data, use_dynamic_bsz=False, micro_batch_size_per_gpu=micro)
    try:
        prepare_micro_batches(data)
        verdicts.append(True)
    except AssertionError:
        verdicts.append(False)
print(json.dumps(verdicts))
"""


def test_the_engine_workers_log_prob_micro_batch_rule_is_verls_own() -> None:
    """#64 item 5: verl 0.9.1's engine workers split each data-parallel rank's share of compute_log_prob (and the
    reference's) with prepare_micro_batches, which asserts the micro batch divides it: verlc's verdict on each case
    is that function's own, called with the rank's batch (the installed verl is 0.9.1)."""
    from verlc.compiler.verl.workers import startup_rules

    ranks = [[train * n // (gpus // sp), micro] for train, n, gpus, sp, micro in MICRO_CASES]
    done = subprocess.run([sys.executable, "-c", ENGINE_ORACLE], input=json.dumps(ranks), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    verls = json.loads(done.stdout)
    release = snapshot("0.9.1")
    verlcs = []
    for train, n, gpus, sp, micro in MICRO_CASES:
        config = Config(release.tree("ppo_trainer", release.default_engine("ppo_trainer")), {
            "data.train_batch_size": train, "actor_rollout_ref.rollout.n": n, "trainer.nnodes": gpus // 8 or 1,
            "trainer.n_gpus_per_node": min(gpus, 8), "actor_rollout_ref.actor.ulysses_sequence_parallel_size": sp,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": micro})
        refused = [m for keys, m, r in startup_rules(release.startup, config.get, use_critic=False,
                                                      label=release.label) if r and "prepare_micro_batches" in m]
        verlcs.append(not refused)
    assert verlcs == verls
    assert verls[0] is False and verls[1] is True  # 160 per rank: 7 does not divide it, 8 does
    # where the release has the legacy workers too (0.7.1), only trainer.use_legacy_worker_impl: disable runs these
    legacy = snapshot("0.7.1")
    fact = legacy.startup["engine_micro_batches"]
    assert fact and fact["legacy"] and not snapshot("0.9.1").startup["engine_micro_batches"]["legacy"]
    assert "total_data_size %" in line_of(release_package("0.9.1"), release.startup["engine_micro_batches"]["where"])
