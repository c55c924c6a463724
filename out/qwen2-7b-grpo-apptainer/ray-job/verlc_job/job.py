# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The job: what the build hands the cluster, typed all the way down.

The build (targets/job_package.py `job_of`) makes a `Job` from the JobIR and writes it as JSON into the bundle; the
runtime reads it back on the cluster. Every part is a frozen dataclass whose field names are its JSON keys, written
here once; a key the runtime does not know is an error, never ignored.

Paths are words (`Word`): text parts and {"env": NAME} parts that `expand` fills in from the node's environment.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Dict, List, Union

# A path or argument as the build leaves it: text, and {"env": NAME} parts expanded on the node (compiler/ir.py Word)
Word = List[Union[str, Dict[str, str]]]


def expand(word: Word) -> str:
    """A word on this node: text parts as they are, {"env": NAME} as this node's NAME."""
    return "".join(p if isinstance(p, str) else os.environ.get(p["env"], "") for p in word)


def record(of: type, **default: Any) -> Any:
    """A Job field that holds records of `of` (one, a list of them, or None): loaded as `of` from JSON."""
    return field(metadata={"of": of}, **default)


def load(cls: type, data: dict[str, Any]) -> Any:
    """A record (or the Job) from its JSON object, its own records loaded as theirs; unknown keys refused."""
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"not a {cls.__name__} of this runtime: unknown keys {', '.join(unknown)}")
    values = {}
    for key, value in data.items():
        of = known[key].metadata.get("of")
        if of is not None and isinstance(value, list):
            value = [load(of, v) for v in value]
        elif of is not None and isinstance(value, dict):
            value = load(of, value)
        values[key] = value
    return cls(**values)


@dataclass(frozen=True)
class DataPrep:
    """One data preparation command, run unless out_dir holds train.parquet and test.parquet already."""
    out_dir: str
    argv: List[str]


@dataclass(frozen=True)
class ModelFetch:
    """A hub model's pinned revision, put into `folder` (what verl gets) unless it holds it already."""
    repo: str
    revision: str
    folder: Word


@dataclass(frozen=True)
class StartupNeed:
    """One thing every node must have for verl's workers to start (compiler/verl/workers.py Need)."""
    check: str  # "import": the module imports; "flash_attention_2": transformers can use flash-attn 2;
    #             "chat_tokens": the model's tokenizer has the special tokens its family's chat builder requires
    module: str
    device: str  # "cuda" or "npu": checked only where the node's torch sees it; "" everywhere
    where: str  # the verl file and line that needs it
    why: str
    avoid: str  # how a spec avoids it, or ""
    model_types: Dict[str, List[str]] = field(default_factory=dict)  # chat_tokens: model_type -> verl's lines


@dataclass(frozen=True)
class Code:
    """The run's code as built: where the job runs, its git state, and each file the build hashed."""
    folder: str
    commit: Union[str, None]
    dirty: bool
    diff_sha256: Union[str, None]
    files: Dict[str, str]  # path in the folder -> sha256


@dataclass(frozen=True)
class Expiry:
    """verl's save ahead of the job's end: the variable verl reads its deadline from, the seconds before the end
    the target needs to stop cleanly, and where the end (epoch seconds) is: a file (a word) or a variable."""
    variable: str
    lead: int
    end_file: Union[Word, None] = None
    end_env: Union[str, None] = None


@dataclass(frozen=True)
class StageInput:
    """An earlier pipeline stage's model, merged in this stage's data stage."""
    stage: str  # its job name
    checkpoint_dir: Word
    layout: str  # the shards' folder in global_step_N ("actor" or "")
    merger: List[str]  # verl's merger argv up to --local_dir
    merged: Word  # the folder of merged steps
    latest: Word  # the link in it to the last one merged (the stage's model)


@dataclass(frozen=True)
class Probe:
    """A service's contract probe (runtime/services.py PROBES runs each kind)."""
    kind: str  # sandbox, retriever, judge, http
    query: Union[str, None] = None
    model: Union[str, None] = None
    method: Union[str, None] = None
    path: Union[str, None] = None
    body: Any = None
    expect: Union[str, None] = None


@dataclass(frozen=True)
class Service:
    """A process beside the trainer: started with the job, ready and probed before training, watched while it
    trains, stopped with it. Its words read the variables (`variables`: attribute -> name) the runtime sets."""
    name: str
    argv: List[Word]
    env: Dict[str, Word]
    image: Union[str, None]  # an image of its own: the target starts its container and sets `variables` (given)
    every_node: bool  # on every node of the trainer
    own_node: bool  # on a node of its own (Services.own_nodes picks it), else on the head node
    gpus: int  # what it holds of its own node's GPUs, through Ray
    listen_all: bool
    ready_http: Union[str, None]
    ready_command: Union[List[Word], None]
    deadline: int
    probe: Union[Probe, None] = record(Probe)
    restart: int
    variables: Dict[str, str]


@dataclass(frozen=True)
class PhaseNeed:
    """One phase of a training step on each trainer GPU as verlc's plan predicts it (compiler/memory.py), the
    services' shares aside: `bytes`, and `of_total` of the GPU's own total memory on top (the rollout engine's
    share, which grows and shrinks with the card: vLLM's gpu_memory_utilization)."""
    name: str
    bytes: int
    of_total: float = 0.0

    def on(self, total: int) -> int:
        return self.bytes + math.ceil(self.of_total * total)  # as vLLM rounds its share


@dataclass(frozen=True)
class RolloutMemory:
    """What the trainer will take of each GPU, which the preflight measures free (with the services up, before the
    trainer takes its own): vLLM's rollout asks, when it starts, for `share` of each GPU's total memory free
    (vLLM's request_memory; None: not vLLM), and verlc's plan predicts each phase (`phases`; none: no prediction)
    on the GPU the spec declares, of `gpu` bytes, and so on any other."""
    share: Union[float, None]
    phases: List[PhaseNeed] = record(PhaseNeed, default=())
    gpu: Union[int, None] = None

    def peak(self, total: Union[int, None] = None) -> Union[PhaseNeed, None]:
        """The plan's largest phase on a GPU of `total` bytes (None: the declared one's), as a fixed need."""
        total = self.gpu if total is None else total
        if not self.phases or total is None:
            return None
        return max((PhaseNeed(p.name, p.on(total)) for p in self.phases), key=lambda p: p.bytes)


@dataclass(frozen=True)
class ToolConfig:
    """verl's multi-turn tool config from the spec: the runtime writes `content` (JSON, which is YAML) on every
    node before training, at a path it puts in `variable`, which verl's tool_config_path reads."""
    variable: str
    content: Any


@dataclass(frozen=True)
class Job:
    """What the runtime runs: wait for the cluster, data, preflight, train."""
    generated_from: str
    spec_sha256: str
    name: str
    variant: Union[str, None]  # a sweep variant's label, logged first
    nodes: int
    total_gpus: int  # over every node
    device: str  # Ray's resource name of the accelerators: GPU, or NPU on Ascend
    wait_seconds: int
    data_prep: List[DataPrep] = record(DataPrep)
    model_fetch: Union[ModelFetch, None] = record(ModelFetch)
    model: Word
    checkpoint_dir: Word
    data_files: List[Word]
    data_columns: List[str]  # every data file must have them (none: not checked)
    require_env: List[str]
    pins: List[str]  # "package=version"
    verl_commit: Union[str, None]
    code: Union[Code, None] = record(Code)
    rollout_package: Union[str, None]
    startup: Union[List[StartupNeed], None] = record(StartupNeed)  # None: verlc cannot know this release's
    image: str
    record: Union[Word, None]  # where the preflight writes the run record
    reference: Union[Word, None]  # a reproducible job's first run record
    train: List[str]  # the trainer's argv
    stall_timeout: Union[int, None]
    expiry: Union[Expiry, None] = record(Expiry, default=None)
    # a pipeline stage's models from earlier stages
    inputs: Union[List[StageInput], None] = record(StageInput, default=None)
    # torchrun on every node (a program that sets up torch.distributed itself, on more than one node): node i
    # runs `train` with --node_rank=i and the rendezvous at the runtime's own node, rank 0
    every_node: bool = False
    # files outside the run's code that verl's settings name by an absolute path (a tool config, a reward
    # function): checked on every node and hashed into the run record
    files: List[Word] = field(default_factory=list)
    # the folder the scheduler made for the run before the runtime started (Slurm's run folder): the run record
    # and the job's end time are there, so the runtime must see it where it runs (in the job's container)
    run_folder: Union[Word, None] = None
    # processes beside the trainer (a sandbox, a judge, a retriever), in the spec's order
    services: List[Service] = record(Service, default_factory=list)
    tool_config: Union[ToolConfig, None] = record(ToolConfig, default=None)
    rollout_memory: Union[RolloutMemory, None] = record(RolloutMemory, default=None)

    def to_json(self) -> str:
        """For review: one key per line, and a long list (the trainer's argv) one item per line."""
        lines = []
        for key, value in asdict(self).items():
            text = json.dumps(value, ensure_ascii=False)
            if isinstance(value, list) and value and len(text) > 100:
                text = "[\n" + ",\n".join(f"    {json.dumps(v, ensure_ascii=False)}" for v in value) + "\n  ]"
            lines.append(f"  {json.dumps(key)}: {text}")
        return "{\n" + ",\n".join(lines) + "\n}\n"

    @classmethod
    def from_json(cls, text: str) -> Job:
        return load(cls, json.loads(text))

    def with_variant(self, variant: Variant) -> Job:
        """A sweep's job for one variant: the base job's trainer overrides, then the variant's."""
        return replace(self, variant=variant.label, checkpoint_dir=variant.checkpoint_dir,
                       reference=variant.reference, train=[*self.train, *variant.train_overrides])


@dataclass(frozen=True)
class Variant:
    """What one array task of a sweep changes in its job (the Slurm script passes it beside the job)."""
    label: str
    checkpoint_dir: Word
    reference: Union[Word, None]
    train_overrides: List[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> Variant:
        return load(cls, json.loads(text))
