"""Will it fit: each GPU's memory, phase by phase of a PPO step, predicted before the queue (`verlc plan`, and
the build's check that refuses a run whose peak is more than a GPU has).

The inputs are what verlc already holds: the model's shape (its config.json: the spec's `model_shape`, else the
model's own folder where the build can read it, else a pinned hub model's: compiler/hub.py), the config verl runs
with (resolved), the allocation, the GPU's memory (`cluster.gpu_memory`, else the table below by
`cluster.gpu_type`) and the services' shares.

Scope: verl's FSDP workers (actor strategy fsdp or fsdp2) with the rollout in verl's hybrid engine (vLLM or
SGLang on the trainer's GPUs, taking turns with the actor, the reference and the critic). Megatron, a rollout on
GPUs of its own and LoRA are not modelled: `estimate` says so instead of a figure.

What each term is, and where verl says so (verl 0.9.1's files; the FSDP workers of earlier releases keep the same
dtypes and offload switches):
- the trained roles' weights are fp32 (workers/engine/fsdp/transformer_impl.py:262: a trained model's dtype is
  fp32 unless fsdp_config.model_dtype says otherwise; forward-only ones, the reference, bf16), sharded by FSDP over
  every trainer GPU (fsdp_size -1); their gradients fp32 (MixedPrecision's reduce_dtype, same file :395), and
  AdamW's two moments per weight, fp32;
- FSDP gathers one decoder layer at a time in bf16 (param_dtype) with the next one prefetched, and keeps the root
  unit (embeddings, final norm, lm_head) gathered for the whole pass;
- param_offload keeps a role's weights on the CPU outside its own phases, optimizer_offload its optimizer state
  outside the update (workers/engine_workers.py:811: the actor's weights go to the CPU after the weight sync);
- vLLM takes gpu_memory_utilization of the GPU's total memory, SGLang of its free memory as it starts (verl's
  docs/perf/perf_tuning.rst); with free_cache_engine (the default) the rollout sleeps during the other phases,
  giving back its weights and KV cache but not its CUDA graphs (same doc); without it the engine never sleeps
  and keeps its whole share through every phase (verl's vLLM server: sleep, wake_up and the weight sync's resume
  all return at once when free_cache_engine is off);
- vLLM's CUDA graphs while it sleeps (from vLLM 0.21 they are inside its share while it is awake): what its
  process kept beside its CUDA context through the actor's phases, measured on the H100 with vLLM 0.24 and
  verl's capture sizes (max_num_seqs 256: 51 sizes, FULL_AND_PIECEWISE) at 2 and 28 decoder layers, 418 and 804
  MiB: a part of every graph (the capture's buffers, the first graph's pool) and a part per decoder layer (the
  piecewise graphs, one per layer and size). Two depths of one GPU and one capture list; none with
  enforce_eager, and SGLang's graphs are not counted;
- the logits' peak as verl computes log-probs and entropy: tokens x vocab x 7 bytes (fp32 logits, the autocast
  copy for softmax and logsumexp, the softmax output; same doc);
- a decoder layer's activations kept for the backward (bf16, flash attention: no seq x seq term): its two norms'
  inputs and outputs, q, k and v before and after RoPE, the attention's output, and the MLP's gate, up, activation
  and product; with gradient checkpointing only each layer's input is kept, and one layer's are recomputed at a
  time;
- the weight sync before each rollout (verl 0.9's vLLM path): the actor's weights, vLLM's (bf16) woken without
  its KV cache, and a bucket of update_weights_bucket_megabytes (2 GiB by default) in the trainer's process;
- the optimizer step: torch's AdamW, foreach on CUDA by default, takes the square root of every second moment at
  once, a temporary fp32 copy of the GPU's shard beside the weights, gradients and moments (torch/optim/adam.py;
  measured within 1% on the H100, docs/gpu.md): the update's peak when it outweighs the backward's activations;
- one CUDA context per process on a GPU, 0.5 GiB (measured on the H100: docs/gpu.md), the trainer's and the rollout
  server's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .derive import critic_in_use
from .services import gpu_shares

if TYPE_CHECKING:
    from .load import Sourced
    from .spec import Spec
    from .verl.rules import Config

GIB = 1024 ** 3
CONTEXT = GIB // 2  # a CUDA context (the H100: docs/gpu.md)
# vLLM's CUDA graphs while it sleeps, MiB at two depths (decoder layers) measured on the H100 (docs/gpu.md): the
# line through them, a part of every graph and a part per layer
GRAPHS_MEASURED = ((2, 418), (28, 804))
ACTOR, ROLLOUT, REF, CRITIC = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.ref", "critic"
NEAR = 0.9  # a peak above this share of a GPU gets a note

# Each GPU's memory as torch reports it (total_memory), by cluster.gpu_type: measured where docs/gpu.md says so,
# else the vendor's capacity.
GPU_MEMORY = {
    "H100": (85_031_714_816, "measured on the H100 (docs/gpu.md)"),
    "H100-80GB": (85_031_714_816, "measured on the H100 (docs/gpu.md)"),
    "H200": (150_000_000_000, "NVIDIA's 141 GB (torch reports about 139.7 GiB)"),
    "A100-80GB": (85_899_345_920, "NVIDIA's 80 GB"),
    "A100": (42_949_672_960, "NVIDIA's 40 GB"),
    "A100-40GB": (42_949_672_960, "NVIDIA's 40 GB"),
    "A6000": (51_527_024_640, "NVIDIA's 48 GB"),
    "L40S": (51_527_024_640, "NVIDIA's 48 GB"),
    "MI300X": (206_158_430_208, "AMD's 192 GB"),
}


def vllm_graphs(layers: int) -> int:
    """Bytes of vLLM's CUDA graphs for a model of `layers` decoder layers, on the line through GRAPHS_MEASURED."""
    (l0, m0), (l1, m1) = GRAPHS_MEASURED
    return -(-2 ** 20 * (m0 * (l1 - l0) + (m1 - m0) * (layers - l0)) // (l1 - l0))  # ceil, in integers


@dataclass(frozen=True)
class Shape:
    """What a model's config.json says about its size (decoder-only transformers: Llama, Qwen2/3, Mistral and
    their mixture-of-experts kin)."""

    architecture: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool
    qk_norm: bool
    experts: int = 0  # routed experts of a mixture-of-experts layer (0: a dense MLP)
    active: int = 0  # experts each token goes to
    expert_intermediate: int = 0
    shared_intermediate: int = 0  # a shared expert beside the routed ones (Qwen2-MoE)

    @classmethod
    def read(cls, config: dict[str, Any]) -> Shape:
        """From a config.json's keys; ValueError naming the key that is missing or not a whole number."""
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config

        def number(*keys: str, default: int | None = None) -> int:
            for key in keys:
                value = text.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
            if default is not None:
                return default
            raise ValueError(f"config.json has no {keys[0]} (a whole number above 0)")

        hidden, heads = number("hidden_size"), number("num_attention_heads")
        model_type = str(text.get("model_type") or config.get("model_type") or "")
        experts = number("num_experts", "n_routed_experts", "num_local_experts", default=0)
        return cls(
            architecture=str((config.get("architectures") or [model_type or "unknown"])[0]),
            hidden=hidden, layers=number("num_hidden_layers"), heads=heads,
            kv_heads=number("num_key_value_heads", default=heads),
            head_dim=number("head_dim", default=hidden // heads),
            intermediate=number("intermediate_size"), vocab=number("vocab_size"),
            tied=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            qkv_bias=bool(text.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            experts=experts,
            active=number("num_experts_per_tok", default=1) if experts else 0,
            expert_intermediate=number("moe_intermediate_size", default=number("intermediate_size")) if experts else 0,
            shared_intermediate=number("shared_expert_intermediate_size", default=0) if experts else 0,
        )

    @property
    def layer_parameters(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0) \
            + (2 * self.head_dim if self.qk_norm else 0)
        if self.experts:
            mlp = h * self.experts + self.experts * 3 * h * self.expert_intermediate
            if self.shared_intermediate:
                mlp += 3 * h * self.shared_intermediate + h  # the shared expert and its gate
        else:
            mlp = 3 * h * self.intermediate
        return attention + mlp + 2 * h  # and the layer's two RMSNorms

    @property
    def root_parameters(self) -> int:
        """The embeddings, the final norm and lm_head (one matrix with the embeddings where they are tied)."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def parameters(self) -> int:
        return self.layers * self.layer_parameters + self.root_parameters

    def activations_per_token(self) -> int:
        """Bytes one decoder layer keeps per token for the backward (bf16): see the module's docstring."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        mlp = 4 * (self.active * self.expert_intermediate + self.shared_intermediate) if self.experts \
            else 4 * self.intermediate
        return 2 * (4 * h + 2 * (q + 2 * kv) + q + mlp)


@dataclass(frozen=True)
class Term:
    what: str
    bytes: int
    source: str
    # the share of the GPU's total memory in `bytes` (the rollout engine's): on another card it is another figure
    of_total: float = 0.0


@dataclass(frozen=True)
class Phase:
    name: str
    terms: tuple[Term, ...]
    tipping: str  # the setting that sizes this phase most: where a refusal points
    # the tokens are an upper bound, not what verl packs: with remove_padding and a fixed micro batch, a micro
    # batch holds its responses' own lengths, at most max_prompt_length + max_response_length each
    bound: bool = False

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.terms)


@dataclass(frozen=True)
class Estimate:
    """Each phase's memory on one trainer GPU, or why there is no figure (`unknown`; `bad_shape`: the spec's
    model_shape does not give the model's size, a problem at its line)."""

    gpu: int | None = None
    gpu_origin: str = ""
    shape: Shape | None = None
    shape_origin: str = ""
    phases: tuple[Phase, ...] = ()
    unknown: str = ""
    bad_shape: str = ""

    @property
    def peak(self) -> Phase | None:
        return max(self.phases, key=lambda p: p.bytes) if self.phases else None

    def trainer_phases(self) -> list[tuple[str, int, float]]:
        """What the trainer itself takes of a GPU in each phase, without the services' shares (they are on the GPU
        already when the preflight measures it): the phase, its fixed bytes, and the share of the GPU's total on
        top of them (the rollout engine's), so that the preflight can set it against another card than this."""
        assert self.gpu is not None or not self.phases
        own = [(p.name, [t for t in p.terms if not t.source.startswith("services.")]) for p in self.phases]
        return [(name, sum(t.bytes - math.ceil(t.of_total * self.gpu) for t in terms),  # type: ignore[operator]
                 sum(t.of_total for t in terms)) for name, terms in own]

    def as_json(self) -> dict[str, Any]:
        if self.unknown:
            return {"unknown": self.unknown}
        peak = self.peak
        assert peak is not None
        return {"gpu_bytes": self.gpu, "gpu_origin": self.gpu_origin, "model": self.shape.architecture if self.shape
                else None, "parameters": self.shape.parameters if self.shape else None,
                "model_origin": self.shape_origin, "peak": {"phase": peak.name, "bytes": peak.bytes},
                "phases": [{"name": p.name, "bytes": p.bytes, "upper_bound": p.bound,
                            "terms": [{"what": t.what, "bytes": t.bytes, "source": t.source} for t in p.terms]}
                           for p in self.phases]}


def gib(n: float) -> str:
    return f"{n / GIB:.1f}"


def size_bytes(text: str) -> int:
    """A Size (e.g. 80G; k, m, g: binary multiples, as docker's sizes) in bytes."""
    unit = text[-1].lower() if text[-1].isalpha() else ""
    return int(text.rstrip("bkmgBKMG")) * {"": 1, "b": 1, "k": 1024, "m": 1024 ** 2, "g": GIB}[unit]


def gpu_memory(given: str | None, gpu_type: str | None) -> tuple[int | None, str]:
    if given:
        return size_bytes(given), f"cluster.gpu_memory {given}"
    if gpu_type:
        known = GPU_MEMORY.get(gpu_type.upper().replace("NVIDIA-", "").replace("_", "-"))
        if known:
            return known[0], f"{gpu_type}: {known[1]}"
        return None, (f"cluster.gpu_type {gpu_type} is not in verlc's table ({', '.join(GPU_MEMORY)}): give "
                      f"cluster.gpu_memory")
    return None, "no cluster.gpu_type or cluster.gpu_memory"


def model_shape(given: str | dict | None, model_path: str, base: Path,
                pinned: tuple[str, str] | None = None) -> tuple[Shape | None, str]:
    """The model's shape: from `model_shape` (a config.json's keys, or the file relative to `base`; ValueError
    where it does not give the size), else the model's own config.json where the build can read it, else a
    `pinned` hub model's (repo, revision) config.json (compiler/hub.py); else None and why (a config.json that
    does not give the size is not the spec's mistake)."""
    if isinstance(given, dict):
        return Shape.read(given), "model_shape"
    if given:
        path = base / given
        if not path.is_file():
            raise ValueError(f"{given} does not exist")
        return Shape.read(json.loads(path.read_text(encoding="utf-8"))), f"model_shape {given}"
    own = base / model_path / "config.json"
    if own.is_file():
        origin = f"{model_path}/config.json"
        try:
            return Shape.read(json.loads(own.read_text(encoding="utf-8"))), origin
        except (ValueError, OSError) as exc:
            return None, f"{origin} does not give the model's size ({exc}): give model_shape"
    if pinned is None:
        return None, (f"the model's config.json is not readable here ({model_path}): give model_shape (the file, "
                      f"or its keys), or pin the hub model ({{path, revision}}) for verlc to read it from the hub")
    from . import hub

    repo, revision = pinned
    origin = f"{repo}@{revision[:12]} config.json"
    try:
        keys, where = hub.config(repo, revision)
    except OSError as exc:
        return None, f"{origin} could not be read: {exc}; give model_shape"
    try:
        return Shape.read(keys), f"{origin} ({where})"
    except ValueError as exc:
        return None, f"{origin} does not give the model's size ({exc}): give model_shape"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def estimate(get: Callable[[str], Any], *, gpus: int, gpu: int | None, gpu_origin: str, shape: Shape | None,
             shape_origin: str, shares: dict[str, float], critic: bool, reference: bool) -> Estimate:
    """Each phase's memory on one trainer GPU for the config `get` reads (`gpus`: the trainer's GPUs; `shares`: the
    services' gpu_memory on those GPUs, by name), or why verlc cannot say."""
    if gpu is None or shape is None:
        return Estimate(unknown=gpu_origin if gpu is None else shape_origin)
    if get(f"{ACTOR}.strategy") not in ("fsdp", "fsdp2"):
        return Estimate(unknown=f"actor strategy {get(f'{ACTOR}.strategy')}: only FSDP is modelled")
    if _int(get("rollout.n_gpus_per_node")) or (_int(get("actor_rollout_ref.model.lora_rank")) or 0) > 0:
        return Estimate(unknown="a rollout on GPUs of its own, or LoRA: not modelled")
    if get(f"{ROLLOUT}.name") not in ("vllm", "sglang"):
        return Estimate(unknown=f"rollout {get(f'{ROLLOUT}.name')}: only vLLM and SGLang are modelled")
    share = get(f"{ROLLOUT}.gpu_memory_utilization")
    if not isinstance(share, (int, float)) or isinstance(share, bool):
        return Estimate(unknown=f"{ROLLOUT}.gpu_memory_utilization is {share!r}")
    step = _Step(get, gpus, gpu, shape, shares, critic, reference, share)
    phases: list[Phase | None] = [step.sync(), step.rollout(),
                                  step.forward("log-probs (actor)", ROLLOUT, "actor", True)]
    if reference:
        phases.append(step.forward("log-probs (reference)", REF, "ref", True))
    if critic:
        phases.append(step.forward("values (critic)", CRITIC, "critic", False))
    phases.append(step.update("update (actor)", ACTOR, "actor", True))
    phases.append(step.step("optimizer step (actor)", ACTOR, "actor"))
    if critic:
        phases.append(step.update("update (critic)", CRITIC, "critic", False))
        phases.append(step.step("optimizer step (critic)", CRITIC, "critic"))
    return Estimate(gpu=gpu, gpu_origin=gpu_origin, shape=shape, shape_origin=shape_origin,
                    phases=tuple(p for p in phases if p is not None))


class _Step:
    """The terms of one PPO step on one trainer GPU, and the phases built from them (see the module's docstring
    for where each comes from)."""

    def __init__(self, get: Callable[[str], Any], gpus: int, gpu: int, shape: Shape, shares: dict[str, float],
                 critic: bool, reference: bool, share: float) -> None:
        self.get, self.gpus, self.gpu, self.shape, self.share = get, gpus, gpu, shape, share
        self.vllm = get(f"{ROLLOUT}.name") == "vllm"
        # verl's rollout sleeps between its turns unless free_cache_engine is off (every release's default: on)
        self.sleeps = get(f"{ROLLOUT}.free_cache_engine") is not False
        self.graphs = Term(f"vLLM asleep: its CUDA graphs ({shape.layers} layers)",
                           vllm_graphs(shape.layers),
                           "measured on the H100, vLLM 0.24 (docs/gpu.md); sleep keeps them") \
            if self.vllm and self.sleeps and not get(f"{ROLLOUT}.enforce_eager") else None
        self.seq = (_int(get("data.max_prompt_length")) or 0) + (_int(get("data.max_response_length")) or 0)
        self.states = {"actor": self._trained(ACTOR, "actor"), **({"critic": self._trained(CRITIC, "critic")}
                                                                   if critic else {})}
        self.reference = Term(f"reference weights (bf16, 1/{gpus})", self._shard(2),
                              "verl/workers/engine/fsdp/transformer_impl.py:262 (forward only: bf16)") \
            if reference else None
        self.services = [Term(f"services.{name} ({s:g} of the GPU)", math.ceil(s * gpu), f"services.{name}.gpu_memory")
                         for name, s in shares.items()]
        self.gathered = Term("gathered layers (bf16: this one and the next)", 2 * 2 * shape.layer_parameters,
                             "FSDP: param_dtype bf16, forward prefetch")
        self.root = Term("gathered root (embeddings, lm_head; bf16)", 2 * shape.root_parameters, "FSDP's root unit")
        self.contexts = Term("CUDA contexts (trainer, rollout server)", 2 * CONTEXT, "measured: docs/gpu.md")

    def _shard(self, width: int) -> int:
        return math.ceil(self.shape.parameters * width / self.gpus)

    def _trained(self, section: str, label: str) -> dict[str, Term]:
        dtype = self.get(f"{section}.fsdp_config.model_dtype") or "fp32"
        width = 2 if str(dtype) in ("bf16", "bfloat16", "fp16", "float16") else 4
        return {
            "weights": Term(f"{label} weights ({dtype}, 1/{self.gpus})", self._shard(width),
                            "verl/workers/engine/fsdp/transformer_impl.py:262"),
            "optimizer": Term(f"{label} AdamW moments (fp32, 1/{self.gpus})", self._shard(8),
                              "AdamW: two fp32 moments"),
            "gradients": Term(f"{label} gradients (fp32, 1/{self.gpus})", self._shard(4),
                              "verl/workers/engine/fsdp/transformer_impl.py:395 (reduce_dtype fp32)"),
        }

    def _offloaded(self, section: str, what: str) -> bool:
        return bool(self.get(f"{section}.fsdp_config.{what}_offload"))

    def resident(self, now: str, *, optimizer: bool = True) -> list[Term]:
        """What is on the GPU during the phase of role `now` ("actor", "ref", "critic"; "rollout" for none)
        besides that phase's own work: each role's weights and optimizer unless offloaded, its own always (its
        optimizer only where `optimizer`: the update), the rollout engine outside its own phase (its whole share
        where it never sleeps, else vLLM's CUDA graphs), the services' shares and the CUDA contexts."""
        terms = []
        for role, section in (("actor", ACTOR), ("critic", CRITIC)):
            state = self.states.get(role)
            if state is None:
                continue
            if now == role or not self._offloaded(section, "param"):
                terms.append(state["weights"])
            if (now == role and optimizer) or not self._offloaded(section, "optimizer"):
                terms.append(state["optimizer"])
            if role == "actor" and self.reference and (now == "ref" or not self._offloaded(REF, "param")):
                terms.append(self.reference)
        if now != "rollout" and not self.sleeps:
            terms.append(self.engine())
        elif now != "rollout" and self.graphs:
            terms.append(self.graphs)
        return terms + self.services + [self.contexts]

    def engine(self) -> Term:
        """vLLM takes its share of the total; SGLang of what is free as it starts, beside what stays."""
        share = self.share
        if self.vllm:
            return Term(f"vLLM: gpu_memory_utilization {share:g} of the GPU's total (weights, KV cache)",
                        math.ceil(share * self.gpu), "verl docs/perf/perf_tuning.rst; vLLM's request_memory", share)
        before = sum(t.bytes for t in self.resident("rollout"))
        return Term(f"SGLang: mem_fraction_static {share:g} of the memory free at its start",
                    math.ceil(share * max(self.gpu - before, 0)), "verl docs/perf/perf_tuning.rst", share)

    def rollout(self) -> Phase:
        return Phase("rollout", (*self.resident("rollout"), self.engine()), f"{ROLLOUT}.gpu_memory_utilization")

    def sync(self) -> Phase | None:
        """The weight sync before each rollout, where verl sends the actor's weights to vLLM through a bucket
        (verl 0.9's checkpoint engine; other releases and engines: no phase): vLLM's weights are back (bf16, its
        TP's share), its KV cache not yet; the actor's weights are on the GPU whatever param_offload says
        (verl/workers/engine_workers.py: resume weights, update_weights, then offload and resume the KV cache),
        and the bucket is a buffer of update_weights_bucket_megabytes in the trainer's process
        (verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py; measured on the H100: docs/gpu.md). On
        a 1.5B shape, nvidia-smi saw the trainer's process 4 GiB (18%) above these terms during the sync, torch's
        cache from the update or a staged copy (docs/gpu.md): where the sync is the peak, it may be low by that."""
        key = f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes"
        megabytes = _int(self.get(key))
        if not self.vllm or megabytes is None:
            return None
        weights, width, tp = rollout_weights(self.get, self.shape)
        woken = [Term(f"vLLM's weights ({width} bytes each, 1/{tp}), woken for the sync", weights,
                      "verl/workers/engine_workers.py (resume weights, then the KV cache)")] if self.sleeps else []
        return Phase("weight sync", (
            *self.resident("actor", optimizer=False), *woken,
            Term(f"the sync's bucket ({megabytes} MiB)", megabytes * 2 ** 20,
                 "verl/workers/rollout/vllm_rollout/bucketed_weight_transfer.py")), key)

    def tokens(self, section: str, micro_key: str, tokens_key: str) -> tuple[int, str, bool]:
        """A micro batch's tokens on one GPU (Ulysses splits them), the setting that sizes it, and whether that is
        only an upper bound: verl packs micro batches up to the token budget with use_dynamic_bsz; without
        remove_padding it pads every sequence to max_prompt_length + max_response_length; with it and a fixed
        micro batch, each holds its own length."""
        get = self.get
        sp = _int(get(f"{section}.ulysses_sequence_parallel_size")) or 1
        if get(f"{section}.use_dynamic_bsz") or get(f"{ACTOR}.use_dynamic_bsz") and section != CRITIC:
            return math.ceil((_int(get(f"{section}.{tokens_key}")) or 0) / sp), f"{section}.{tokens_key}", False
        model = "critic.model" if section == CRITIC else "actor_rollout_ref.model"
        return math.ceil((_int(get(f"{section}.{micro_key}")) or 1) * self.seq / sp), f"{section}.{micro_key}", \
            bool(get(f"{model}.use_remove_padding"))

    def logits(self, count: int) -> Term:
        return Term(f"logits, log-probs and entropy ({count} tokens x vocab {self.shape.vocab} x 7 bytes)",
                    count * self.shape.vocab * 7, "verl docs/perf/perf_tuning.rst")

    def forward(self, name: str, section: str, role: str, logits: bool) -> Phase:
        """A forward pass without gradients (log-probs, values): one layer's activations at a time."""
        count, key, bound = self.tokens(section, "forward_micro_batch_size_per_gpu", "forward_max_token_len_per_gpu") \
            if section == CRITIC else self.tokens(section, "log_prob_micro_batch_size_per_gpu",
                                                  "log_prob_max_token_len_per_gpu")
        work = [self.gathered, self.root, Term(f"one layer's activations ({count} tokens)",
                                               count * self.shape.activations_per_token(),
                                               "the layer's tensors (docstring)")]
        return Phase(name, (*self.resident(role, optimizer=False), *work, *([self.logits(count)] if logits else [])),
                     key, bound)

    def update(self, name: str, section: str, role: str, logits: bool) -> Phase:
        """A forward and backward pass per micro batch, the role's gradients and optimizer on the GPU."""
        count, key, bound = self.tokens(section, "ppo_micro_batch_size_per_gpu", "ppo_max_token_len_per_gpu")
        per_token = self.shape.activations_per_token()
        model = "actor_rollout_ref.model" if role == "actor" else "critic.model"
        if self.get(f"{model}.enable_gradient_checkpointing"):
            kept = Term(f"activations ({count} tokens; gradient checkpointing: each layer's input, one layer "
                        f"recomputed)", count * (2 * self.shape.hidden * self.shape.layers + per_token),
                        f"{model}.enable_gradient_checkpointing")
        else:
            kept = Term(f"activations ({count} tokens x {self.shape.layers} layers)",
                        count * per_token * self.shape.layers, f"{model}.enable_gradient_checkpointing false")
        work = [self.states[role]["gradients"], self.gathered, self.root, kept]
        return Phase(name, (*self.resident(role), *work, *([self.logits(count)] if logits else [])), key, bound)

    def step(self, name: str, section: str, role: str) -> Phase | None:
        """The optimizer's step after the last micro batch: what torch's AdamW allocates beside the weights,
        gradients and moments. With the foreach implementation (torch's default on CUDA) `_foreach_sqrt` of the
        second moments is a full fp32 copy of the GPU's shard (torch/optim/adam.py, _multi_tensor_adam; measured
        on the H100: docs/gpu.md); with foreach off, one parameter's at a time (the largest: the embedding);
        fused, nothing. Other optimizers than torch.optim's: no phase (not modelled)."""
        if (self.get(f"{section}.optim.optimizer_impl") or "torch.optim") != "torch.optim" or \
                str(self.get(f"{section}.optim.optimizer") or "AdamW") not in ("AdamW", "Adam"):
            return None
        key = f"{section}.optim.override_optimizer_config"
        override = self.get(key)
        override = override if isinstance(override, dict) else {}
        source = "torch.optim.AdamW's step (torch/optim/adam.py); measured: docs/gpu.md"
        if override.get("fused"):
            temporary = []
        elif override.get("foreach") is False:
            temporary = [Term("AdamW step: one parameter's square root at a time (fp32, the largest)",
                              math.ceil(4 * self.shape.vocab * self.shape.hidden / self.gpus), source)]
        else:
            temporary = [Term(f"AdamW step: the second moments' square root (foreach; fp32, 1/{self.gpus})",
                              self._shard(4), source)]
        return Phase(name, (*self.resident(role), self.states[role]["gradients"], *temporary), key)


def rollout_weights(get: Callable[[str], Any], shape: Shape) -> tuple[int, int, int]:
    """The rollout's weights on each of its GPUs: bytes, bytes a parameter (rollout.dtype) and its TP size."""
    width = 4 if str(get(f"{ROLLOUT}.dtype")) in ("float32", "fp32") else 2
    tp = _int(get(f"{ROLLOUT}.tensor_model_parallel_size")) or 1
    return math.ceil(shape.parameters * width / tp), width, tp


def vllm_weights_over_share(get: Callable[[str], Any], found: Estimate) -> str:
    """Why vLLM cannot start where its weights alone fill its share of a GPU (vLLM sizes the KV cache from what
    its share leaves after the weights and the profiling pass, and refuses to start where nothing is left), or
    "": only the weights are counted, so a share that fits them may still be refused by vLLM."""
    if get(f"{ROLLOUT}.name") != "vllm" or found.gpu is None or found.shape is None:
        return ""
    share = get(f"{ROLLOUT}.gpu_memory_utilization")
    if not isinstance(share, (int, float)) or isinstance(share, bool):
        return ""
    (weights, width, tp), room = rollout_weights(get, found.shape), share * found.gpu
    if weights < room:
        return ""
    return (f"vLLM's weights alone take {gib(weights)} GiB of each rollout GPU ({found.shape.parameters / 1e9:.2f}B "
            f"parameters, {width} bytes each, over tensor_model_parallel_size {tp}), more than its share "
            f"{share:g} of {gib(found.gpu)} GiB ({gib(room)} GiB): vLLM has no memory left for the KV cache and "
            f"refuses to start, after the queue and the model load; raise {ROLLOUT}.gpu_memory_utilization or "
            f"{ROLLOUT}.tensor_model_parallel_size")


def for_spec(spec: Spec, sourced: Sourced, config: Config, changes: dict[str, Any] | None = None) -> Estimate:
    """The estimate for a spec's PPO run with verl's config (resolved), and `changes` to it; the spec's own folder
    is where a relative model_shape or model path is read."""
    gpu, gpu_origin = gpu_memory(spec.cluster.gpu_memory, spec.cluster.gpu_type)
    try:
        pinned = None if isinstance(spec.model, str) else (spec.model.path, spec.model.revision)
        shape, shape_origin = model_shape(spec.model_shape, spec.model_path, Path(sourced.file).parent, pinned)
    except (ValueError, OSError) as exc:
        return Estimate(unknown=f"model_shape: {exc}", bad_shape=str(exc))
    def get(key: str) -> Any:
        return changes[key] if changes and key in changes else config.get(key)

    gpus = (_int(get("trainer.nnodes")) or 1) * (_int(get("trainer.n_gpus_per_node")) or 1)
    shares, _, _ = gpu_shares(spec, sourced)
    reference = bool(get(f"{ACTOR}.use_kl_loss") or get("algorithm.use_kl_in_reward"))
    return estimate(get, gpus=gpus, gpu=gpu, gpu_origin=gpu_origin, shape=shape, shape_origin=shape_origin,
                    shares=shares, critic=critic_in_use(spec.verl, config.tree), reference=reference)


def fixes(spec: Spec, sourced: Sourced, config: Config, found: Estimate, phase: Phase) -> list[str]:
    """Settings that would bring `phase` within the GPU, each with what that phase then takes: the rollout's
    sleep where it is off, a lower gpu_memory_utilization, the actor's offload, a smaller micro batch (or token
    budget) of the phase's own."""
    assert found.gpu is not None
    out = []

    def fits(changes: dict[str, Any]) -> int | None:
        tried = next(p for p in for_spec(spec, sourced, config, changes).phases if p.name == phase.name)
        return tried.bytes if tried.bytes <= found.gpu else None

    if config.get(f"{ROLLOUT}.free_cache_engine") is False and phase.name != "rollout":
        taken = fits({f"{ROLLOUT}.free_cache_engine": True})
        if taken is not None:
            out.append(f"{ROLLOUT}.free_cache_engine true: the rollout gives its share back between its turns "
                       f"({gib(taken)} GiB)")
    share = config.get(f"{ROLLOUT}.gpu_memory_utilization")
    if phase.tipping == f"{ROLLOUT}.gpu_memory_utilization":
        for lower in (round(share - step / 100, 2) for step in range(5, int(share * 100), 5)):
            taken = fits({phase.tipping: lower})
            if taken is not None:
                out.append(f"{phase.tipping} {lower:g} ({gib(taken)} GiB)")
                break
    taken = fits({f"{ACTOR}.fsdp_config.param_offload": True, f"{ACTOR}.fsdp_config.optimizer_offload": True,
                  f"{REF}.fsdp_config.param_offload": True})
    if taken is not None:
        out.append(f"param_offload and optimizer_offload on the actor, and the reference's param_offload "
                   f"({gib(taken)} GiB)")
    if phase.tipping.endswith(".optim.override_optimizer_config"):
        given = config.get(phase.tipping)
        taken = fits({phase.tipping: {**(given if isinstance(given, dict) else {}), "fused": True}})
        if taken is not None:
            out.append(f"{phase.tipping} {{fused: true}}: torch's fused AdamW ({gib(taken)} GiB)")
    value = config.get(phase.tipping)
    if phase.tipping != f"{ROLLOUT}.gpu_memory_utilization" and _int(value) and value > 1:
        for smaller in sorted({value // 2 ** k for k in range(1, 20)} - {0}, reverse=True):
            taken = fits({phase.tipping: smaller})
            if taken is not None:
                out.append(f"{phase.tipping} {smaller} ({gib(taken)} GiB)")
                break
    return out
