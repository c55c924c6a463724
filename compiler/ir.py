"""JobIR: the fully resolved job every target renders from. Frozen; no target reads the Spec.

Strings that may expand a variable at run time (`${HOME}`, `~`) are `Word`s: literal parts and
variable references kept apart, so each target quotes the literal parts in its own output language.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from .verl.workers import Need

if TYPE_CHECKING:
    from .memory import Estimate

# `${env:NAME}` is the environment variable NAME on the node where the value is used. ${HOME}, ${USER}
# and a leading ~ are kept as short spellings of the two every node has.
SHORT_VARIABLES = ("HOME", "USER")


@dataclass(frozen=True)
class Var:
    """A variable expanded where the command runs (never a spec value)."""

    name: str


@dataclass(frozen=True)
class Word:
    """One argument: literal text and variable references, in order."""

    parts: tuple[str | Var, ...]

    @property
    def display(self) -> str:
        """For people and for formats that expand ${NAME} themselves (Ray env_vars, Compose)."""
        return "".join(p if isinstance(p, str) else f"${{{p.name}}}" for p in self.parts)

    @property
    def variables(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parts if isinstance(p, Var))

    def as_json(self) -> list[str | dict[str, str]]:
        """For the in-cluster helper, which expands {"env": NAME} on the node and nothing else."""
        return [p if isinstance(p, str) else {"env": p.name} for p in self.parts]



Arg = str | Word

_REFERENCE = re.compile(r"\$\$|\$\{(?:env:)?([A-Za-z_][A-Za-z0-9_]*)\}|\$")


def parse_word(text: str) -> Word:
    """Split `text` into literal parts and variable references: `${env:NAME}`, ${HOME}, ${USER}, and a
    leading `~/` for ${HOME}/.

    `$$` is a literal `$`. Any other `$` is rejected so that nothing expands by accident.
    """
    parts: list[str | Var] = []
    if text == "~" or text.startswith("~/"):
        parts.append(Var("HOME"))
        text = text[1:]
    pos = 0
    for match in _REFERENCE.finditer(text):
        if match.start() > pos:
            parts.append(text[pos:match.start()])
        if match[0] == "$$":
            parts.append("$")
        elif match[1] and (match[0].startswith("${env:") or match[1] in SHORT_VARIABLES):
            parts.append(Var(match[1]))
        else:
            bare = re.match(r"[A-Za-z_][A-Za-z0-9_]*", text[match.end():]) if match[0] == "$" else None
            if bare:  # `$USER`: a shell habit that nothing here expands
                short = f"${{{bare[0]}}}" if bare[0] in SHORT_VARIABLES else f"${{env:{bare[0]}}}"
                raise ValueError(f"${bare[0]} would stay literal: write {short} for the environment variable "
                                 f"on the node, or $$ for a literal $")
            name = f" for the variable {match[1]}" if match[1] else ""
            raise ValueError(f"write ${{env:NAME}}{name} (the environment variable on the node; ${{HOME}}, "
                             f"${{USER}} and a leading ~ also work); write $$ for a literal $")
        pos = match.end()
    if pos < len(text):
        parts.append(text[pos:])
    merged: list[str | Var] = []
    for part in parts:  # adjacent literals become one, so equal texts give equal Words
        if merged and isinstance(part, str) and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    return Word(tuple(merged))


@dataclass(frozen=True)
class EnvVar:
    name: str
    value: Word
    origin: str  # the spec path it comes from, shown to reviewers


@dataclass(frozen=True)
class Override:
    """One verl Hydra override, value already in Hydra's syntax."""

    key: str
    value: str
    origin: str
    prefix: str = ""  # Hydra's '+' (add) or '++' (add or override), as the spec wrote it

    @property
    def arg(self) -> str:
        return f"{self.prefix}{self.key}={self.value}"


@dataclass(frozen=True)
class ImageBuildIR:
    dockerfile: Word
    context: Word


@dataclass(frozen=True)
class ContainerIR:
    runtime: Literal["docker", "podman", "apptainer", "pyxis", "none"]
    image: Word | None
    image_sha256: str | None  # an image file's pin, checked on every node (the image is then the file's path)
    build: ImageBuildIR | None
    workdir: Word | None
    shm_size: str | None
    mounts: tuple[Word, ...]
    devices: tuple[str, ...]  # derived from the accelerator, then the spec's extras
    gpu_args: tuple[str, ...]  # runtime flags that expose GPUs (--gpus all, --nv, --rocm, ...)
    run_args: tuple[Word, ...]
    venv: Word | None


@dataclass(frozen=True)
class RayIR:
    address: str | None  # where jobs are submitted (ray-job target)
    working_dir: str
    port: int | None  # None: derived from the job id where the job runs
    dashboard_port: int | None
    expose_dashboard: bool  # False: the dashboard and Jobs API answer on the head's loopback only
    wait_seconds: int
    head_interface: str | None
    debugger_external: bool  # legacy `ray debug`: every node's Ray accepts debugger connections from other hosts

    @property
    def start_options(self) -> tuple[str, ...]:
        """What every node's `ray start` takes from the spec (head and workers alike): breakpoints stop in verl's
        workers on any node, and `ray debug` on the head attaches to them there."""
        return ("--ray-debugger-external",) if self.debugger_external else ()
    sweep_parallel: int = 1  # ray-job: how many of a sweep's variants run at once on the cluster


@dataclass(frozen=True)
class DataPrepIR:
    dataset: str
    out_dir: str
    argv: tuple[str, ...]  # the preprocessing command, run in the workdir


@dataclass(frozen=True)
class ModelFetchIR:
    repo: str  # the hub id
    revision: str
    folder: Word  # where the revision goes, and what verl gets


@dataclass(frozen=True)
class VariantIR:
    """One cell of a sweep: the overrides that differ from the base run."""

    index: int
    settings: tuple[tuple[str, Any], ...]  # (verl key, value) as the sweep gives them
    overrides: tuple[Override, ...]  # replace the base run's overrides with the same keys
    checkpoint_dir: Word


@dataclass(frozen=True)
class StageInputIR:
    """An earlier stage's last checkpoint, merged into a Hugging Face folder before this stage starts (the runtime's
    data stage runs verl's model merger on it unless that step is merged already)."""

    stage: str  # the earlier stage's job name (<pipeline>-<stage>)
    checkpoint_dir: Word  # its verl trainer.default_local_dir: the latest_checkpointed_iteration.txt it keeps
    layout: str  # where the model's shards are in a global_step_N folder: "actor" (verl's Ray trainers) or ""
    merger: tuple[str, ...]  # verl's merger, up to --local_dir and --target_dir
    merged: Word  # <checkpoint_dir>/verlc-merged: the merged global_step_N folders
    latest: Word  # the link in `merged` to the last one merged: the model this stage's verl gets


@dataclass(frozen=True)
class PipelineIR:
    """Where a job stands in its pipeline (a spec with `stages:`)."""

    name: str  # the pipeline's (the spec's name)
    stage: str  # this stage's own name
    index: int  # 0-based, in the order the stages run
    stages: tuple[str, ...]  # every stage's job name, in order
    inputs: tuple[StageInputIR, ...] = ()

    @property
    def after(self) -> str | None:
        """The job this one waits for (afterok), the stage before it."""
        return self.stages[self.index - 1] if self.index else None


CODE_DIFF = "code.diff"  # a bundle's copy of the code's uncommitted changes


@dataclass(frozen=True)
class CodeIR:
    """What the job's working dir holds, as built."""

    folder: str                             # as the bundle's commands see it (relative: to where they run)
    commit: str | None                      # git HEAD (None: not a git checkout)
    dirty: bool                             # uncommitted changes (tracked or untracked files)
    diff: str                               # those changes as text ("" when clean): the bundle's code.diff
    files: tuple[tuple[str, str], ...]      # (path in the folder, sha256): the program's config and named files

    @property
    def diff_sha256(self) -> str | None:
        return hashlib.sha256(self.diff.encode()).hexdigest() if self.dirty else None

    def as_json(self) -> dict[str, object]:
        return {"folder": self.folder, "commit": self.commit, "dirty": self.dirty, "diff_sha256": self.diff_sha256,
                "files": dict(self.files)}


@dataclass(frozen=True)
class TimeLimit:
    """How long one run may take, where a target's section bounds it (the plan's GPU-hours)."""

    seconds: int
    origin: str  # the spec's key and value, as the plan shows them: "cluster.slurm.time 2-00:00:00"
    retries: int = 0  # further attempts that may each run to the limit
    retries_origin: str = ""  # the key that allows them


@dataclass(frozen=True)
class ProbeIR:
    """A service's contract probe (spec.py's probes): one kind, and what that kind asks."""

    kind: str  # sandbox, retriever, judge, http
    query: str | None = None  # retriever
    model: str | None = None  # judge
    method: str | None = None  # http
    path: str | None = None  # http
    body: Any = None  # http: a POST's JSON
    expect: str | None = None  # http


@dataclass(frozen=True)
class ServiceIR:
    """A process beside the trainer, resolved: its words' `${services.NAME.ATTR}` are env parts of the variables
    the runtime sets (`variables`: attribute -> variable, compiler/verl/hydra.py service_variable)."""

    name: str
    argv: tuple[Word, ...]  # with an image: the arguments after it (none: the image's own command)
    env: tuple[tuple[str, Word], ...]
    image: str | None  # an image of its own, whose container the target starts and stops (else the runtime's)
    every_node: bool  # on every node of the trainer
    own_node: bool  # on a node of its own (the allocation's last), else on the head node
    gpus: int  # the GPUs it holds on its own node, through Ray (0 elsewhere)
    listen_all: bool  # every interface, else the head's own address (127.0.0.1 on every node)
    ready_http: str | None  # a path that must answer 2xx
    ready_command: tuple[Word, ...] | None  # a command that must exit 0
    deadline: int  # seconds from its start until it must be ready
    probe: ProbeIR | None
    restart: int  # how many times an exited service is started again
    variables: tuple[tuple[str, str], ...]
    gpu_memory: float | None = None  # the share of each GPU's memory it takes beside the trainer (plan, checks)


@dataclass(frozen=True)
class JobIR:
    name: str
    spec_file: str
    spec_sha256: str
    normalized_spec: str  # YAML text of the validated spec with every default filled in
    verl_config: str  # YAML text of verl's config with the overrides applied (what `--cfg job` shows)
    verl_schema: str  # which schema checked it: "<version> (snapshot|live)"
    reproducible: bool  # re-runs must match the first run's record (image, versions)
    verlc_version: str
    verl_version: str
    nodes: int  # the allocation's: the trainer's (cluster.nodes, trainer.nnodes), then the services' own
    gpus_per_node: int
    accelerator: Literal["cuda", "rocm", "npu"]
    env: tuple[EnvVar, ...]
    secrets: tuple[str, ...]
    container: ContainerIR
    ray: RayIR
    data_prep: tuple[DataPrepIR, ...]
    model: Word  # what verl gets (a pinned model: the folder model_fetch fills); empty: the program takes none
    model_fetch: ModelFetchIR | None  # a hub model pinned to a revision, put into a folder in the data stage
    data_files: tuple[Word, ...]  # train then val, checked by the preflight
    checkpoint_dir: Word  # verl's trainer.default_local_dir, resolved (env vars expand on the node)
    node_env: tuple[str, ...]  # env vars the spec reads on the nodes: the preflight requires them set
    pins: tuple[tuple[str, str], ...]  # (package, exact version) every node must have
    rollout_package: str | None  # the package of the rollout engine (rollout.name): on every node
    startup: tuple[Need, ...] | None  # what the workers need at start-up, on every node (None: verlc cannot know)
    # vLLM's rollout: the share of each GPU's total memory it asks to find free when it starts (None: no vLLM)
    rollout_memory: float | None
    expiry_variable: str | None  # where verl's trainer reads a deadline to save a checkpoint before (0.5.0 on)
    image: Word  # the image a run record names ("none" without a container)
    trainer_module: str
    launch: tuple[str, ...]  # what starts the program: python3 -m (a Ray driver), or torchrun ... -m
    data_columns: tuple[str, ...]  # the columns the program reads of every data file (the preflight checks)
    config_name: str  # verl's Hydra config (`--config-name`, the first override when not ppo_trainer)
    overrides: tuple[Override, ...]
    gpu_type: str | None
    targets: tuple[str, ...]  # the bundles the spec is meant for (`--target all`)
    variants: tuple[VariantIR, ...]  # empty without a sweep
    stall_timeout: int | None  # seconds without a new training step before the run is ended
    code: CodeIR | None = None  # the run's own code: the job's working dir (None: the target's own default)
    verl_commit: str | None = None  # verl pinned to a git commit: the preflight checks what each node imports
    profile: tuple[str, str, str] | None = None  # the site profile composed under the spec: (name, file, sha256)
    notes: tuple[str, ...] = ()  # what verlc could not check, and why (shown by validate and build)
    parts: tuple[tuple[str, Any], ...] = ()  # (target, its own IR part): each target built, lowered by its folder
    pipeline: PipelineIR | None = None  # a stage of a pipeline (compiler/stages.py)
    time_limit: TimeLimit | None = None  # how long one run may take, where a target's section says
    named_files: tuple[Word, ...] = ()  # absolute files verl's settings name (a tool config): on every node, hashed
    services: tuple[ServiceIR, ...] = ()  # processes beside the trainer, started and watched by the runtime
    tool_config: dict[str, Any] | None = None  # verl's multi-turn tool config, as verl's OmegaConf resolves it
    memory: Estimate | None = None  # will it fit: each trainer GPU's memory per phase (PPO programs only)

    def part(self, target: str) -> Any:
        """The IR part target `target` lowered for itself (targets/<folder>/lower.py)."""
        found = dict(self.parts)
        assert target in found, f"the {target} target was not lowered for this spec (build it with --target)"
        return found[target]

    @cached_property  # asked for each variant: once per job, not once per variant over every variant
    def varied_keys(self) -> tuple[str, ...]:
        """The verl keys some variant of a sweep sets differently from the base run."""
        return tuple(sorted({o.key for v in self.variants for o in v.overrides}))

    def variant_overrides(self, variant: VariantIR) -> tuple[Override, ...]:
        """Values of the varied keys for one variant (the base run's where this variant keeps them)."""
        own = {o.key: o for o in variant.overrides}
        base = {o.key: o for o in self.overrides}
        return tuple(own.get(k) or base[k] for k in self.varied_keys)

    def trainer_argv_for(self, variant: VariantIR | None) -> tuple[str, ...]:
        """The trainer's argv for one variant: the base overrides, then the variant's varied keys."""
        if variant is None:
            return self.trainer_argv
        varied = set(self.varied_keys)
        merged = [*(o for o in self.overrides if o.key not in varied), *self.variant_overrides(variant)]
        return (*self.program_argv, *(o.arg for o in merged))

    @property
    def device(self) -> str:
        """What the accelerators are called: Ray's resource name (GPU, NPU), and the word messages use."""
        return "NPU" if self.accelerator == "npu" else "GPU"

    @property
    def ray_resources(self) -> str:
        """`ray start`'s option giving a node its accelerators: --num-gpus, or the NPU resource (Ray's own
        name for Ascend NPUs) as JSON."""
        n = self.gpus_per_node
        return f'--resources={{"NPU": {n}}}' if self.accelerator == "npu" else f"--num-gpus={n}"

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def service_nodes(self) -> int:
        """The allocation's nodes of services of their own (its last nodes; the trainer has the others)."""
        return sum(s.own_node for s in self.services)

    @property
    def program_argv(self) -> tuple[str, ...]:
        """The program's argv without its overrides."""
        return (*self.launch, self.trainer_module)

    @property
    def trainer_argv(self) -> tuple[str, ...]:
        return (*self.program_argv, *(o.arg for o in self.overrides))
