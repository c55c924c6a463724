"""Will it fit (compiler/memory.py): each trainer GPU's memory per phase of a PPO step, in `verlc plan` and the
build's check (#66). The parameter count is transformers' own (each architecture built on the meta device); each
term is checked against the arithmetic written out here for two architectures (a GQA model with untied
embeddings, and a mixture-of-experts one); the refusal and the note at their lines."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import run_verlc

GIB = 1024 ** 3
# config.json keys of public models (their published shapes)
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 3584,
             "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
             "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False}
SHAPES = {
    "qwen2.5-7b (GQA, qkv bias)": QWEN25_7B,
    "qwen2.5-0.5b (tied embeddings)": {**QWEN25_7B, "hidden_size": 896, "intermediate_size": 4864,
                                       "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                                       "vocab_size": 151936, "tie_word_embeddings": True},
    "llama-3.1-8b (no bias)": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                               "num_key_value_heads": 8, "vocab_size": 128256, "attention_bias": False},
    "qwen3-8b (q/k norms, head_dim)": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                       "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                                       "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                                       "vocab_size": 151936},
    "qwen1.5-moe-a2.7b (shared expert)": {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
                                          "hidden_size": 2048, "intermediate_size": 5632,
                                          "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
                                          "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
                                          "num_attention_heads": 16, "num_key_value_heads": 16,
                                          "vocab_size": 151936},
    "qwen3-30b-a3b (128 experts)": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
                                    "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                                    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                                    "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                                    "vocab_size": 151936},
}


def test_the_parameter_count_is_transformers_own() -> None:
    """Each architecture built by transformers on the meta device (no memory): its parameters, counted."""
    code = ("import json, sys, torch\nfrom transformers import AutoConfig, AutoModelForCausalLM\n"
            "out = {}\nfor name, keys in json.loads(sys.argv[1]).items():\n"
            "    config = AutoConfig.for_model(**{k: v for k, v in keys.items() if k != 'architectures'})\n"
            "    with torch.device('meta'):\n        model = AutoModelForCausalLM.from_config(config)\n"
            "    out[name] = sum(p.numel() for p in model.parameters())\nprint(json.dumps(out))")
    import sys

    from verlc.compiler.memory import Shape

    done = subprocess.run([sys.executable, "-c", code, json.dumps(SHAPES)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    counted = json.loads(done.stdout.splitlines()[-1])
    assert {name: Shape.read(keys).parameters for name, keys in SHAPES.items()} == counted


SPEC = """\
name: fit
project: p
verl_version: "0.9.1"
model: Qwen/Qwen2.5-7B-Instruct
model_shape: {shape}
data: {{train_files: [/d/train.parquet], val_files: [/d/test.parquet]}}
verl:
  algorithm: {{adv_estimator: grpo}}
  data: {{train_batch_size: 64, max_prompt_length: 1024, max_response_length: {response}}}
  actor_rollout_ref:
    model: {{use_remove_padding: {rmpad}}}
    actor: {{ppo_mini_batch_size: 16, ppo_micro_batch_size_per_gpu: {micro}, use_kl_loss: true}}
    rollout:
      name: vllm
      n: 4
      gpu_memory_utilization: {share}
      log_prob_micro_batch_size_per_gpu: {logprob}
    ref: {{log_prob_micro_batch_size_per_gpu: {logprob}}}
  trainer: {{logger: [console], save_freq: 10}}
cluster: {{nodes: 1, gpus_per_node: 8, {gpu}, slurm: {{cpus_per_task: 8, time: "10:00:00"}}}}
container: {{runtime: none}}
"""


def spec(tmp_path: Path, *, shape: object = QWEN25_7B, micro: int = 4, share: float = 0.6,
         gpu: str = "gpu_memory: 80G", response: int = 1024, logprob: int = 8, rmpad: str = "false") -> Path:
    """Without remove_padding (verl pads every sequence to the maximum lengths) unless `rmpad` says otherwise."""
    path = tmp_path / "spec.yaml"
    path.write_text(SPEC.format(shape=json.dumps(shape), micro=micro, share=share, gpu=gpu, response=response,
                                logprob=logprob, rmpad=rmpad))
    return path


def planned(path: Path) -> dict:
    result = run_verlc("plan", path, "--format", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)[0]["memory"]


def test_each_term_is_the_arithmetic_of_the_shape_and_the_config(tmp_path: Path) -> None:
    """Qwen2.5-7B (GQA: 4 of 28 heads for k and v; bias on q, k, v; untied) on 8 GPUs of 80 GiB, by hand."""
    h, layers, kv, i, vocab, gpus = 3584, 28, 4 * 128, 18944, 152064, 8
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h  # q, k, v, o; the MLP; two norms
    root = 2 * vocab * h + h  # embeddings, lm_head, final norm
    p = layers * layer + root
    assert p == 7_615_616_512
    gpu = 80 * GIB
    weights, adam, grads, ref = (math.ceil(p * width / gpus) for width in (4, 8, 4, 2))
    contexts = GIB  # the trainer's and the rollout server's, 0.5 GiB each
    vllm = math.ceil(0.6 * gpu)
    graphs = 804 * 2 ** 20  # vLLM's CUDA graphs, kept while it sleeps: measured at 28 layers (docs/gpu.md)
    found = planned(spec(tmp_path))
    phases = {p["name"]: p for p in found["phases"]}
    terms = {name: [t["bytes"] for t in phase["terms"]] for name, phase in phases.items()}
    assert found["parameters"] == p and found["gpu_bytes"] == gpu
    assert terms["rollout"] == [weights, adam, ref, contexts, vllm]
    # the weight sync: vLLM's bf16 weights at TP 2 (verl 0.9.1's default) and the bucket, 2048 MiB by default
    assert terms["weight sync"] == [weights, adam, ref, graphs, contexts, math.ceil(p * 2 / 2), 2048 * 2 ** 20]
    # log-probs: 8 responses of 2048 tokens; one layer's activations; the logits x 7 bytes
    per_token = 2 * (4 * h + 2 * (h + 2 * kv) + h + 4 * i)
    tokens = 8 * 2048
    assert terms["log-probs (actor)"] == [weights, adam, ref, graphs, contexts, 4 * layer, 2 * root,
                                          tokens * per_token, tokens * vocab * 7]
    # the update: micro batch 4 x 2048 tokens, gradient checkpointing (verl's default): each layer's input kept
    tokens = 4 * 2048
    assert terms["update (actor)"] == [weights, adam, ref, graphs, contexts, grads, 4 * layer, 2 * root,
                                       tokens * (2 * h * layers + per_token), tokens * vocab * 7]
    # the optimizer's step: torch's foreach AdamW takes the square root of every second moment at once, an fp32
    # copy of the shard (within 1% of what verl's actor measured on the H100: docs/gpu.md)
    assert terms["optimizer step (actor)"] == [weights, adam, ref, graphs, contexts, grads, weights]
    assert found["peak"] == {"phase": "rollout", "bytes": sum(terms["rollout"])}
    assert all(t["source"] for phase in found["phases"] for t in phase["terms"])


@pytest.mark.parametrize("rollout, asleep", [
    ("", "graphs"), ("enforce_eager: true", None), ("free_cache_engine: false", "share")])
def test_what_the_rollout_keeps_while_the_actor_works_follows_its_sleep(tmp_path: Path, rollout: str,
                                                                       asleep: str | None) -> None:
    """vLLM asleep keeps its CUDA graphs (none with enforce_eager: it captures none); with free_cache_engine off it
    never sleeps, so its whole share stays through every phase, and the weight sync wakes no weights."""
    path = spec(tmp_path, share=0.4)  # the rollout's 0.4 fits beside every phase even where it never sleeps
    if rollout:
        path.write_text(path.read_text().replace("      n: 4\n", f"      n: 4\n      {rollout}\n"))
    phases = {p["name"]: p for p in planned(path)["phases"]}
    vllm = math.ceil(0.4 * 80 * GIB)
    for name in ("log-probs (actor)", "update (actor)", "optimizer step (actor)", "weight sync"):
        kept = [t["bytes"] for t in phases[name]["terms"] if t["what"].startswith("vLLM")]
        woken = [7_615_616_512] if name == "weight sync" and asleep != "share" else []  # bf16 at TP 2
        assert kept == {"graphs": [804 * 2 ** 20], None: [], "share": [vllm]}[asleep] + woken, (name, kept)
    assert [t["bytes"] for t in phases["rollout"]["terms"] if t["what"].startswith("vLLM")] == [vllm]


def test_a_rollout_that_never_sleeps_is_refused_where_its_share_does_not_fit_beside_the_actor(tmp_path: Path) -> None:
    """free_cache_engine off: vLLM's 0.6 of the GPU stays through the log-probs, which no longer fit; turning its
    sleep back on is the first fix named."""
    path = spec(tmp_path)
    path.write_text(path.read_text().replace("      n: 4\n", "      n: 4\n      free_cache_engine: false\n"))
    result = run_verlc("validate", path)
    assert result.returncode == 2, result.stdout + result.stderr
    said = [m for m in result.stderr.splitlines() if "in log-probs (actor)" in m]
    assert len(said) == 1 and "vLLM: gpu_memory_utilization 0.6 of the GPU's total" in said[0], result.stderr
    assert "it fits with actor_rollout_ref.rollout.free_cache_engine true" in said[0], said[0]


@pytest.mark.parametrize("override, temporary", [
    ("{fused: true}", None), ("{foreach: false}", "largest"), ("{}", "shard")])
def test_the_optimizer_steps_temporary_follows_torchs_implementation(tmp_path: Path, override: str,
                                                                     temporary: str) -> None:
    """fused AdamW allocates nothing beside its state; foreach off, one parameter's square root at a time (the
    embedding, 152064 x 3584 fp32 on each of 8 GPUs)."""
    path = spec(tmp_path)
    path.write_text(path.read_text().replace(
        "use_kl_loss: true}", f"use_kl_loss: true, optim: {{override_optimizer_config: {override}}}}}"))
    step = next(p for p in planned(path)["phases"] if p["name"] == "optimizer step (actor)")
    # beside the weights, moments, reference, vLLM's CUDA graphs, contexts and gradients
    extra = step["bytes"] - sum(t["bytes"] for t in step["terms"][:6])
    assert extra == {None: 0, "largest": math.ceil(4 * 152064 * 3584 / 8),
                     "shard": math.ceil(4 * 7_615_616_512 / 8)}[temporary]


def test_vllms_weights_that_fill_its_share_are_refused_at_the_share(tmp_path: Path) -> None:
    """Qwen3-30B-A3B at vLLM's TP 2 (verl 0.9.1's default): 28.4 GiB of bf16 weights on each rollout GPU, more
    than 0.3 of 80 GiB; vLLM would find no memory for its KV cache. At TP 4 (14.2 GiB) it starts."""
    path = spec(tmp_path, shape=SHAPES["qwen3-30b-a3b (128 experts)"], micro=2, share=0.3)
    result = run_verlc("validate", path)
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "gpu_memory_utilization" in text)
    said = [m for m in result.stderr.splitlines() if "vLLM's weights alone" in m]
    assert result.returncode == 2 and len(said) == 1, result.stderr
    assert said[0].startswith(f"{path}:{line}:") and "28.4 GiB" in said[0] and "(24.0 GiB)" in said[0], said
    path.write_text(path.read_text().replace("      n: 4\n", "      n: 4\n      tensor_model_parallel_size: 4\n"))
    assert "vLLM's weights alone" not in run_verlc("validate", path).stderr


def test_an_optimizer_step_that_cannot_fit_names_fused_adamw(tmp_path: Path) -> None:
    """A 7B GRPO run on one GPU of 150 GiB: its rollout and its update fit, the foreach step's fp32 temporary
    beside the full AdamW state does not (157.8 GiB); torch's fused AdamW fits."""
    path = spec(tmp_path, share=0.3, gpu="gpu_memory: 150G")
    path.write_text(path.read_text().replace("gpus_per_node: 8", "gpus_per_node: 1").replace(
        "      n: 4\n", "      n: 4\n      tensor_model_parallel_size: 1\n"))
    result = run_verlc("validate", path)
    assert result.returncode == 2, result.stdout + result.stderr
    message, last = result.stderr.strip().splitlines()
    assert last == "verlc: 1 problem(s); nothing written"
    assert message.startswith(f"{path}:8:3: verl: each trainer GPU would need 157.8 GiB in optimizer step (actor)")
    assert "actor_rollout_ref.actor.optim.override_optimizer_config {fused: true}" in message, message
    fixed = path.read_text().replace("use_kl_loss: true}",
                                     "use_kl_loss: true, optim: {override_optimizer_config: {fused: true}}}")
    path.write_text(fixed)
    assert run_verlc("validate", path).returncode == 0


def test_a_mixture_of_experts_keeps_the_activations_of_the_experts_a_token_goes_to(tmp_path: Path) -> None:
    """Qwen3-30B-A3B: 128 experts of 768, 8 per token; q/k norms; head_dim 128 beside hidden 2048 (on GPUs of
    96 GiB: its optimizer step takes 80.3 GiB)."""
    shape = SHAPES["qwen3-30b-a3b (128 experts)"]
    h, q, kv, e, inter, vocab = 2048, 32 * 128, 4 * 128, 128, 768, 151936
    layer = h * q + 2 * h * kv + q * h + 2 * 128 + h * e + e * 3 * h * inter + 2 * h
    # vLLM's weights at TP 4 within its share: 14.2 GiB
    path = spec(tmp_path, shape=shape, micro=2, share=0.3, gpu="gpu_memory: 96G")
    path.write_text(path.read_text().replace("      n: 4\n", "      n: 4\n      tensor_model_parallel_size: 4\n"))
    found = planned(path)
    assert found["parameters"] == 48 * layer + 2 * vocab * h + h == 30_532_122_624
    update = next(p for p in found["phases"] if p["name"] == "update (actor)")
    per_token = 2 * (4 * h + 2 * (q + 2 * kv) + q + 4 * 8 * inter)
    assert 2 * 2048 * (2 * h * 48 + per_token) in [t["bytes"] for t in update["terms"]]


def test_a_run_that_cannot_fit_is_refused_at_the_setting_that_tips_it(tmp_path: Path) -> None:
    """7B on 40 GiB A100s with vLLM at 0.9: the rollout phase holds the training state beside vLLM's 0.9."""
    path = spec(tmp_path, share=0.9, gpu="gpu_type: A100-40GB")
    result = run_verlc("validate", path)
    assert result.returncode == 2, result.stdout + result.stderr
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "gpu_memory_utilization" in text)
    message, last = result.stderr.strip().splitlines()
    assert last == "verlc: 1 problem(s); nothing written"
    assert message.startswith(f"{path}:{line}:") and "verl.actor_rollout_ref.rollout.gpu_memory_utilization" in message
    assert "each trainer GPU would need" in message and "GiB in rollout" in message and "40.0 GiB" in message
    assert "it fits with actor_rollout_ref.rollout.gpu_memory_utilization 0." in message, message
    assert "Traceback" not in result.stderr
    # the fix it names does fit
    fixed = float(message.split("it fits with actor_rollout_ref.rollout.gpu_memory_utilization ")[1].split()[0])
    assert run_verlc("validate", spec(tmp_path, share=fixed, gpu="gpu_type: A100-40GB")).returncode == 0


def test_an_update_that_cannot_fit_names_the_micro_batch_that_does(tmp_path: Path) -> None:
    """8 responses of 9216 tokens a micro batch: the logits alone are 8 x 9216 x 152064 x 7 bytes, 73 GiB."""
    path = spec(tmp_path, micro=8, share=0.3, response=8192, logprob=2)
    result = run_verlc("validate", path)
    assert result.returncode == 2, result.stdout
    message, last = result.stderr.strip().splitlines()
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "ppo_micro_batch_size_per_gpu" in text)
    assert message.startswith(f"{path}:{line}:") and "in update (actor)" in message, message
    smaller = int(message.split("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu ")[1].split()[0])
    fixed = spec(tmp_path, micro=smaller, share=0.3, response=8192, logprob=2)
    assert smaller < 8 and run_verlc("validate", fixed).returncode == 0
    # with remove_padding a micro batch holds its sequences' own lengths: the same figure is an upper bound, a note
    bound = run_verlc("validate", spec(tmp_path, micro=8, share=0.3, response=8192, logprob=2, rmpad="true"))
    assert bound.returncode == 0, bound.stderr
    assert "note: each trainer GPU needs up to 121.6 GiB in update (actor)" in bound.stdout + bound.stderr


def test_a_peak_within_ten_percent_of_the_gpu_is_a_note(tmp_path: Path) -> None:
    found = planned(spec(tmp_path, share=0.6))
    room = found["gpu_bytes"] - found["peak"]["bytes"]
    near = 0.6 + (room - 0.05 * found["gpu_bytes"]) / found["gpu_bytes"]  # the peak at 95% of the GPU
    result = run_verlc("validate", spec(tmp_path, share=round(near, 3)))
    assert result.returncode == 0 and "note: the predicted peak on each trainer GPU" in result.stdout + result.stderr


def test_the_plan_shows_each_phase_and_says_where_it_cannot_know(tmp_path: Path) -> None:
    shown = run_verlc("plan", spec(tmp_path))
    assert shown.returncode == 0, shown.stderr
    for phase in ("rollout", "log-probs (actor)", "log-probs (reference)", "update (actor)"):
        assert f"            {phase}" in shown.stdout
    assert "Qwen2ForCausalLM, 7.62B parameters (model_shape)" in shown.stdout and "<- the peak" in shown.stdout
    (tmp_path / "hub.yaml").write_text(spec(tmp_path).read_text().replace("model_shape:", "# model_shape:"))
    unknown = run_verlc("plan", tmp_path / "hub.yaml")
    assert "memory:   not estimated: the model's config.json is not readable here (Qwen/Qwen2.5-7B-Instruct)" \
        in unknown.stdout


def test_the_model_folders_own_config_is_read_and_a_bad_shape_is_refused_at_its_line(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(QWEN25_7B))
    text = spec(tmp_path).read_text().replace("model: Qwen/Qwen2.5-7B-Instruct", "model: ./model")
    (tmp_path / "local.yaml").write_text("\n".join(line for line in text.splitlines()
                                                   if not line.startswith("model_shape")) + "\n")
    assert planned(tmp_path / "local.yaml")["model_origin"] == "./model/config.json"
    bad = spec(tmp_path, shape={k: v for k, v in QWEN25_7B.items() if k != "vocab_size"})
    result = run_verlc("validate", bad)
    assert result.returncode == 2
    assert f"{bad}:5:14: model_shape: config.json has no vocab_size (a whole number above 0)\n" in result.stderr


@pytest.mark.parametrize("gpu", ["gpu_type: B300", "none"])
def test_an_unknown_gpu_says_what_to_give(tmp_path: Path, gpu: str) -> None:
    path = spec(tmp_path, gpu="gpu_type: B300")
    if gpu != "gpu_type: B300":
        path.write_text(path.read_text().replace("gpu_type: B300, ", ""))
    shown = run_verlc("plan", path)
    assert shown.returncode == 0, shown.stderr
    assert ("give cluster.gpu_memory" if "B300" in gpu else "no cluster.gpu_type or cluster.gpu_memory") in shown.stdout


def test_the_preflight_gets_the_predicted_peak(tmp_path: Path) -> None:
    """The job's rollout_memory carries the peak the plan predicts (the runtime's memory check finds it free on
    every GPU before the trainer starts: tests/test_startup.py); a sweep's variants carry none."""
    path = spec(tmp_path)
    path.write_text(path.read_text().replace("name: fit\n", "name: fit\ntargets: [ray-job]\n"))
    found = planned(path)
    built = run_verlc("build", path, "--target", "ray-job", "--out", tmp_path / "out")
    assert built.returncode == 0, built.stderr
    job = json.loads((tmp_path / "out" / "fit" / "ray-job" / "verlc_job" / "job.json").read_text())
    memory = job["rollout_memory"]
    assert memory["share"] == 0.6 and memory["gpu"] == found["gpu_bytes"]
    assert [p["name"] for p in memory["phases"]] == [p["name"] for p in found["phases"]]
    # each phase's own bytes on the declared GPU (no services in this spec), the rollout's share of the card in it
    assert [p["bytes"] + math.ceil(p["of_total"] * memory["gpu"]) for p in memory["phases"]] == [
        p["bytes"] for p in found["phases"]]
    assert [p["of_total"] for p in memory["phases"]] == [0.6 if p["name"] == "rollout" else 0.0
                                                         for p in found["phases"]]
    # a sweep: each variant's own vLLM share, and no peak (the variants' settings change it)
    path.write_text(path.read_text().replace("      gpu_memory_utilization: 0.6\n", "") +
                    "sweep: {matrix: {verl.actor_rollout_ref.rollout.gpu_memory_utilization: [0.5, 0.55]}}\n")
    built = run_verlc("build", path, "--target", "ray-job", "--out", tmp_path / "sweep")
    assert built.returncode == 0, built.stderr
    jobs = sorted((tmp_path / "sweep").rglob("jobs/*.json"))
    assert [json.loads(j.read_text())["rollout_memory"] for j in jobs] == [
        {"share": 0.5, "phases": [], "gpu": None}, {"share": 0.55, "phases": [], "gpu": None}]


# Published runs and their outcomes, in verl 0.9.1's terms (per-GPU micro batches; a log-prob micro batch that
# 0.9.1's engine workers take), each with where it was published. What verlc says of each must never contradict
# the outcome: a run that worked is not refused, one that ran out of memory is not called a fit. verlc's figures
# follow verl 0.9.1's code; the older releases these ran on differ in places (FSDP1, vLLM before 0.7).
QWEN25_05B = SHAPES["qwen2.5-0.5b (tied embeddings)"]
QWEN25_3B = {**QWEN25_7B, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
             "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True}
QWEN_14B = {**QWEN25_7B, "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 48,
            "num_attention_heads": 40, "num_key_value_heads": 8}
ACTOR_KL = {"use_kl_loss": True, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "entropy_coeff": 0}
CASES = {
    "verl docs/start/quickstart.rst: PPO, Qwen2.5-0.5B, one GPU 'with at least 24 GB'": (
        "works", "note", "rollout", QWEN25_05B, {"nodes": 1, "gpus_per_node": 1, "gpu_memory": "24G"}, {
            "data": {"train_batch_size": 256, "max_prompt_length": 512, "max_response_length": 512},
            "actor_rollout_ref": {
                "actor": {"ppo_mini_batch_size": 64, "ppo_micro_batch_size_per_gpu": 4},
                "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 8, "gpu_memory_utilization": 0.4,
                            "tensor_model_parallel_size": 1},
                "ref": {"log_prob_micro_batch_size_per_gpu": 4}},
            "critic": {"ppo_micro_batch_size_per_gpu": 4}, "algorithm": {"kl_ctrl": {"kl_coef": 0.001}}}),
    "verl v0.7.1 examples/sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn.sh, 'run on 8xH100'": (
        "works", "note", "update (actor)", QWEN25_3B, {"nodes": 1, "gpus_per_node": 8, "gpu_type": "H100"}, {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {"train_batch_size": 256, "max_prompt_length": 1024, "max_response_length": 1024},
            "actor_rollout_ref": {
                "model": {"use_remove_padding": True, "enable_gradient_checkpointing": True},
                "actor": {"ppo_mini_batch_size": 256, "ppo_micro_batch_size_per_gpu": 32, **ACTOR_KL},
                "rollout": {"name": "sglang", "log_prob_micro_batch_size_per_gpu": 32, "gpu_memory_utilization": 0.85,
                            "n": 16},
                "ref": {"log_prob_micro_batch_size_per_gpu": 32, "fsdp_config": {"param_offload": True}}}}),
    "verl issue #328: GRPO, a 7B, rollout.n 64 on 4 GPUs, everything offloaded: out of memory": (
        "OOM", "note", "log-probs (actor)", QWEN25_7B, {"nodes": 1, "gpus_per_node": 4, "gpu_memory": "80G"}, {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {"train_batch_size": 4, "max_prompt_length": 400, "max_response_length": 2048},
            "actor_rollout_ref": {
                "model": {"use_remove_padding": True, "enable_gradient_checkpointing": True},
                "actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 16, **ACTOR_KL,
                          "fsdp_config": {"param_offload": True, "optimizer_offload": True}},
                "rollout": {"name": "vllm", "log_prob_micro_batch_size_per_gpu": 32, "gpu_memory_utilization": 0.6,
                            "n": 64},
                "ref": {"log_prob_micro_batch_size_per_gpu": 32, "fsdp_config": {"param_offload": True}}}}),
    "verl issue #855: GRPO, DeepSeek-R1-Distill-Qwen-14B on 8 x H100, no offload: out of memory": (
        "OOM", "note", "update (actor)", QWEN_14B, {"nodes": 1, "gpus_per_node": 8, "gpu_type": "H100"}, {
            "algorithm": {"adv_estimator": "grpo"},
            "data": {"train_batch_size": 1024, "max_prompt_length": 512, "max_response_length": 512},
            "actor_rollout_ref": {
                "model": {"use_remove_padding": True, "enable_gradient_checkpointing": True},
                "actor": {"ppo_mini_batch_size": 512, "use_dynamic_bsz": True, "ppo_max_token_len_per_gpu": 24000,
                          **ACTOR_KL},
                # gpu_memory_utilization and rollout.n are cut off in the issue's text: verl 0.9.1's defaults
                "rollout": {"name": "vllm", "tensor_model_parallel_size": 8, "n": 5}}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_published_runs_are_never_contradicted(tmp_path: Path, case: str) -> None:
    outcome, verdict, phase, shape, cluster, verl = CASES[case]
    path = tmp_path / "case.yaml"
    path.write_text(json.dumps({
        "name": "case", "project": "p", "verl_version": "0.9.1", "model": "/models/m", "model_shape": shape,
        "data": {"train_files": ["/d/t.parquet"], "val_files": ["/d/v.parquet"]},
        "verl": {**verl, "trainer": {"logger": ["console"]}}, "cluster": cluster, "container": {"runtime": "none"},
        "targets": ["ray-job"]}))
    result = run_verlc("validate", path)
    said = result.stdout + result.stderr
    found = "refused" if result.returncode == 2 else "note" if "note: each trainer GPU" in said or \
        "note: the predicted peak" in said else "fits"
    assert found != ("refused" if outcome == "works" else "fits"), said
    assert (found, planned(path)["peak"]["phase"]) == (verdict, phase), said


def test_running_out_of_gpu_or_host_memory_is_said_apart_once_each() -> None:
    """The trainer's lines as torch, vLLM (0.24.0, vllm/v1/worker/utils.py) and Ray's memory monitor print them:
    the runtime says which memory ran out, once each, with the plan's prediction beside a GPU's."""
    import contextlib
    import io

    from verlc.runtime.job import PhaseNeed, RolloutMemory
    from verlc.runtime.protocol import parse_event
    from verlc.runtime.train import OutOfMemory

    lines = [
        "(WorkerDict pid=9) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a "
        "total capacity of 79.19 GiB of which 1.05 GiB is free.",
        "(WorkerDict pid=9) torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",  # not again
        "ValueError: Free memory on device cuda:0 (70.1/79.19 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.27 GiB).",
        "ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.",
        "Memory on the node (IP: 10.0.0.1) was 120.52GB / 125.81GB (0.957933), which exceeds the memory usage "
        "threshold of 0.95. Ray killed this worker",
        "(TaskRunner pid=7) step:3 - critic/score/mean:0.5",
    ]
    for memory, beside in ((RolloutMemory(0.5, [PhaseNeed("rollout", 10 * GIB, 0.4),
                                                 PhaseNeed("update (actor)", 45 * GIB)], 80 * GIB),
                            "verlc's plan: 45.0 GiB of each GPU at the peak (update (actor))"),
                           (None, "`verlc plan` predicts each phase's memory where the spec gives model_shape")):
        said = io.StringIO()
        watch = OutOfMemory(memory)
        with contextlib.redirect_stdout(said):
            for line in lines:
                watch.seen(line)
        messages = [parse_event(s).message for s in said.getvalue().splitlines()]
        assert len(messages) == 2, messages
        assert messages[0].startswith("ERROR: verl ran out of GPU memory (") and beside in messages[0]
        assert messages[1].startswith("ERROR: a node ran out of host memory, not GPU memory (ray.exceptions")


def test_a_model_folder_whose_config_does_not_give_the_size_is_not_estimated_nor_refused(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    text = spec(tmp_path).read_text().replace("model: Qwen/Qwen2.5-7B-Instruct", "model: ./model")
    (tmp_path / "local.yaml").write_text("\n".join(line for line in text.splitlines()
                                                   if not line.startswith("model_shape")) + "\n")
    shown = run_verlc("plan", tmp_path / "local.yaml")
    assert shown.returncode == 0, shown.stderr
    assert "not estimated: ./model/config.json does not give the model's size (config.json has no hidden_size" \
        in shown.stdout
    # whatever the folder is called (a name starting "model_shape" is not the spec's model_shape)
    (tmp_path / "model").rename(tmp_path / "model_shape_of_mine")
    named = (tmp_path / "local.yaml").read_text().replace("./model", "model_shape_of_mine")
    (tmp_path / "named.yaml").write_text(named)
    assert run_verlc("validate", tmp_path / "named.yaml").returncode == 0


COMMIT = "a09a35458c702b33eeacc393d103063234e8bc28"  # any commit: the stand-in hub serves it


@contextmanager
def hub(config: dict, token: str | None = None) -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """A stand-in for the Hugging Face hub (a real HTTP server): each repo's config.json at COMMIT, answered 401
    without `token` where one is given (a gated model); its address, and each request (path, Authorization)."""
    asked: list[tuple[str, str]] = []

    class Hub(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            asked.append((self.path, self.headers.get("Authorization", "")))
            body = json.dumps(config).encode()
            if token and self.headers.get("Authorization") != f"Bearer {token}":
                self.send_response(401)
                body = b'{"error": "Access to model is restricted"}'
            elif not self.path.endswith(f"/resolve/{COMMIT}/config.json"):
                self.send_response(404)
                body = b'{"error": "Revision Not Found"}'
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", asked
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# The suite's process may hold HF_HUB_OFFLINE=1 (tests/test_verl_differential.py sets it as it is imported), and a
# developer's shell a token: neither here.
ONLINE = {"HF_HUB_OFFLINE": "", "HF_TOKEN": ""}


def pinned_spec(tmp_path: Path, revision: str = COMMIT) -> Path:
    text = spec(tmp_path).read_text().replace("model: Qwen/Qwen2.5-7B-Instruct",
                                              f"model: {{path: Qwen/Qwen2.5-7B-Instruct, revision: {revision}}}")
    path = tmp_path / "pinned.yaml"
    path.write_text("\n".join(line for line in text.splitlines() if not line.startswith("model_shape")) + "\n")
    return path


def test_a_pinned_hub_models_config_is_fetched_once_and_then_read_from_the_cache(tmp_path: Path) -> None:
    """The build asks the hub once (one request, whatever the number of estimates it makes), keeps a commit's
    config.json in verlc's cache, and reads it there with the hub gone."""
    env = {"HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "cache"), **ONLINE}
    path = pinned_spec(tmp_path)
    with hub(QWEN25_7B) as (address, asked):
        env["HF_ENDPOINT"] = address
        fetched = run_verlc("plan", path, "--format", "json", env=env)
    assert fetched.returncode == 0, fetched.stderr
    memory = json.loads(fetched.stdout)[0]["memory"]
    assert memory["model_origin"] == f"Qwen/Qwen2.5-7B-Instruct@{COMMIT[:12]} config.json (the hub)", memory
    assert asked == [(f"/Qwen/Qwen2.5-7B-Instruct/resolve/{COMMIT}/config.json", "")]
    cached = run_verlc("plan", path, "--format", "json", env=env)  # the stand-in's address answers no more
    again = json.loads(cached.stdout)[0]["memory"]
    assert again["model_origin"].endswith("(verlc's cache)") and again["phases"] == memory["phases"], cached.stdout
    assert memory["parameters"] == planned(spec(tmp_path))["parameters"]  # the same model as given inline


def test_a_pinned_model_in_the_hugging_face_cache_is_read_there_without_the_hub(tmp_path: Path) -> None:
    """A branch the cache recorded (refs/main) resolves to its snapshot, as huggingface_hub resolves it offline."""
    repo = tmp_path / "hf" / "hub" / "models--Qwen--Qwen2.5-7B-Instruct"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "snapshots" / COMMIT).mkdir(parents=True)
    (repo / "snapshots" / COMMIT / "config.json").write_text(json.dumps(QWEN25_7B))
    env = {"HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    shown = run_verlc("plan", pinned_spec(tmp_path, "main"), env=env)
    assert shown.returncode == 0, shown.stderr
    assert "Qwen2ForCausalLM, 7.62B parameters (Qwen/Qwen2.5-7B-Instruct@main config.json (the Hugging Face " \
           "cache))" in shown.stdout, shown.stdout


def test_a_hub_config_that_cannot_be_had_says_why_and_the_build_goes_on(tmp_path: Path) -> None:
    """Gated without a token, offline, an unreachable hub: "not estimated", with the reason and what to do; a
    token reaches the hub as huggingface_hub sends it."""
    env = {"HF_HOME": str(tmp_path / "hf"), "XDG_CACHE_HOME": str(tmp_path / "cache"), **ONLINE}
    path = pinned_spec(tmp_path)
    with hub(QWEN25_7B, token="hf_secret") as (address, asked):
        env["HF_ENDPOINT"] = address
        gated = run_verlc("plan", path, env=env)
        assert gated.returncode == 0, gated.stderr
        assert f"not estimated: Qwen/Qwen2.5-7B-Instruct@{COMMIT[:12]} config.json could not be read: " \
               f"{address}/Qwen/Qwen2.5-7B-Instruct/resolve/{COMMIT}/config.json answered 401 Unauthorized (a " \
               f"gated model: set HF_TOKEN); give model_shape" in gated.stdout, gated.stdout
        assert run_verlc("build", path, "--target", "slurm", "--out", tmp_path / "out", env=env).returncode == 0
        offline = run_verlc("plan", path, env={**env, "HF_HUB_OFFLINE": "1"})
        assert "could not be read: HF_HUB_OFFLINE is set and neither the Hugging Face cache nor verlc's holds it" \
               in offline.stdout, offline.stdout
        made = len(asked)
        allowed = run_verlc("plan", path, "--format", "json", env={**env, "HF_TOKEN": "hf_secret"})
        assert asked[made:] == [(f"/Qwen/Qwen2.5-7B-Instruct/resolve/{COMMIT}/config.json", "Bearer hf_secret")]
        assert json.loads(allowed.stdout)[0]["memory"]["model_origin"].endswith("(the hub)")
    with socket.socket() as sock:  # a port nothing listens on once this closes
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    unreachable = run_verlc("plan", pinned_spec(tmp_path, "v1.0"), env={**env, "HF_ENDPOINT":
                                                                       f"http://127.0.0.1:{closed}"})
    assert unreachable.returncode == 0, unreachable.stderr
    assert "could not be reached: [Errno 111] Connection refused; give model_shape" in unreachable.stdout


@pytest.mark.parametrize("example", [p for p in sorted((Path(__file__).parent.parent / "specs").glob("*.yaml"))],
                         ids=lambda p: p.stem)
def test_the_example_plans_are_their_goldens(example: Path, snapshot) -> None:  # noqa: ANN001
    """`verlc plan` of each example spec, memory included, as reviewed (tests/goldens/plan/). Refresh with:
    pytest tests/test_memory.py -k example_plans --snapshot-update"""
    shown = run_verlc("plan", example)
    assert shown.returncode == 0, shown.stderr
    snapshot.snapshot_dir = Path(__file__).parent / "goldens" / "plan"
    snapshot.assert_match(shown.stdout, f"{example.stem}.txt")
