"""The spec: what a user writes, as frozen pydantic models (extra keys forbidden).

verlc owns where and how a run happens (cluster, container, network, Ray); verl's own settings live
under `verl:` in verl's own nesting and are checked against verl's config, not re-modelled here. Each
target's own section (cluster.slurm, kubernetes:, ...) is its folder's; `with_sections` adds them, for the
target registry's Catalog.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Strict, Tag, create_model

from .fields import (
    Bool, Directive, EnvName, EnvValue, Int, Model, Name, Number, Package, SecretName, Seconds, Size, Str, Text,
    Version, matching,
)

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .catalog import Section

# --- model -----------------------------------------------------------------------------------------

def is_hub_id(text: str) -> bool:
    """A model given as text is a hub id (org/name, or name) unless it reads as a path."""
    return not text.startswith((".", "/", "~", "$")) and text.count("/") <= 1


class PinnedModel(Model):
    """A hub model at one revision. verl takes a path: the data stage fills a local folder with that revision
    (from the hub, or the local Hugging Face cache with HF_HUB_OFFLINE=1) unless it holds it already."""

    path: Text = Field(description="The hub id, e.g. Qwen/Qwen2-7B-Instruct.")
    revision: Annotated[str, Strict(), matching(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}", "a hub revision")] = Field(
        description="The hub commit (its 40-hex sha); a branch or tag moves, so reproducible: true needs the sha.")
    local_dir: Text | None = Field(
        None, description="The folder verl gets, on storage every node sees (relative: to the working dir); "
                          "default: models/<org>--<name>-<first 12 of the revision>.")

    @property
    def folder(self) -> str:
        return self.local_dir or f"models/{self.path.replace('/', '--')}-{self.revision[:12]}"


# --- data ------------------------------------------------------------------------------------------

class DataPrep(Model):
    """One of verl's preprocessing scripts, run once before training; skipped when its output exists."""

    dataset: Literal["gsm8k", "math"] = Field(description="Which of verl's preprocessing scripts to run (with "
                                                         "the options of verl_version's scripts: --local_dir "
                                                         "before 0.6.0, --local_save_dir from 0.6.0).")
    dir: Text = Field(description="Output folder for train.parquet and test.parquet (relative to workdir).")
    script: Text | None = Field(None, description="Script path; default: verl's examples/data_preprocess/.")
    local_dataset_path: Text | None = Field(None, description="Read the raw dataset from here, not the hub "
                                                              "(verl's scripts take it from 0.6.0).")


class Data(Model):
    prepare: tuple[DataPrep, ...] = Field((), description="Preprocessing run in the data stage, in order.")
    train_files: tuple[Text, ...] = Field(min_length=1, description="Parquet files verl trains on (data.train_files).")
    val_files: tuple[Text, ...] = Field(min_length=1, description="Parquet files verl validates on (data.val_files).")


# --- cluster ---------------------------------------------------------------------------------------

GpuType = Annotated[str, Strict(), matching(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}",
                                              "a GPU model such as H100, A100-80GB or MI300X")]


class Cluster(Model):
    nodes: Int = Field(ge=1, le=4096, description="Nodes of the run; verl's trainer.nnodes.")
    gpus_per_node: Int = Field(ge=1, le=64, description="GPUs (NPUs on Ascend) per node; verl's "
                                                         "trainer.n_gpus_per_node.")
    accelerator: Literal["cuda", "rocm", "npu"] = Field(
        "cuda", description="NVIDIA (cuda) or AMD (rocm) GPUs, or Huawei Ascend NPUs (npu): Ray's NPU resource, "
                            "HCCL, the Ascend devices and driver in containers.")
    gpu_type: GpuType | None = Field(
        None, description="The GPU model, e.g. H100 or MI300X: SkyPilot's accelerators (H100:8), Slurm's typed "
                          "GRES (--gpus-per-node=H100:8), and the Kubernetes node selector's value "
                          "(kubernetes.gpu_label) when it is a product name as node labels have it "
                          "(NVIDIA-H100-80GB-HBM3); else kuberay needs kubernetes.node_selector.")
    gpu_hour_price: Number | None = Field(None, ge=0, description="What one GPU-hour costs here (in any "
                                                                  "currency): `verlc plan` shows each run's cost.")
    gpu_memory: Size | None = Field(None, description="Each GPU's memory (e.g. 80G: binary units) where gpu_type "
                                                      "is not in verlc's table: `verlc plan`'s memory figures and "
                                                      "the build's check that the run fits.")


# --- container -------------------------------------------------------------------------------------

class ImageBuild(Model):
    """Build the image on a node only when that node does not have it yet."""

    dockerfile: Text = Field(description="The Dockerfile to build from.")
    context: Text = Field(".", description="The build context folder.")


class Engine(Model):
    """A long-lived container per node under Docker or Podman (host network, --init). On Slurm it lives while its
    job step does: its main process is `flock` (util-linux, in every Debian, Ubuntu or RHEL-based image) waiting
    for the step's lock."""

    runtime: Literal["docker", "podman"] = Field(description="The container engine on every node.")
    image: Text = Field(description="The image: verl, ray and verl's data-prep scripts at workdir.")
    build: ImageBuild | None = Field(None, description="Build the image on nodes that lack it.")
    workdir: Text = Field(description="Working directory inside the container, e.g. the verl checkout.")
    shm_size: Size = Field("64G", description="Shared memory of the container (--shm-size).")
    mounts: tuple[Text, ...] = Field((), description="SRC:DST[:OPTS]; ${env:NAME}, ${HOME}, ${USER} and ~ expand.")
    devices: tuple[Text, ...] = Field((), description="Extra devices, e.g. /dev/infiniband.")
    privileged: Bool = Field(False, description="--privileged: every device and capability of the host, for sites "
                                                "whose Ascend driver needs it; default: only the accelerators' "
                                                "devices and driver files.")
    run_args: tuple[Text, ...] = Field((), description="Extra `run` arguments, one word each.")


class Apptainer(Model):
    runtime: Literal["apptainer"] = Field(description="apptainer exec on every node.")
    image: Text = Field(description="Path to the .sif image (pinned: /path/verl.sif@sha256:<sha256sum of it>), or "
                                    "docker://... (pinned: @sha256:<digest>).")
    workdir: Text = Field(description="Working directory inside the container (--pwd).")
    mounts: tuple[Text, ...] = Field((), description="--bind SRC:DST[:OPTS]; ${env:NAME}, ${HOME}, ${USER} and ~ "
                                                     "expand.")


class Pyxis(Model):
    """srun --container-image (NVIDIA Pyxis/enroot)."""

    runtime: Literal["pyxis"] = Field(description="srun --container-image (NVIDIA Pyxis/enroot).")
    image: Text = Field(description="An enroot image: nvcr.io#nvidia/pytorch:24.05-py3 (registry#image), or a "
                                     ".sqsh path (pinned: /path/verl.sqsh@sha256:<sha256sum of it>).")
    workdir: Text = Field(description="Working directory inside the container (--container-workdir).")
    mounts: tuple[Text, ...] = Field((), description="--container-mounts SRC:DST[:OPTS].")


class NoContainer(Model):
    runtime: Literal["none"] = Field(description="Run on the nodes' own Python.")
    workdir: Text | None = Field(None, description="Default: the directory sbatch was called from.")
    venv: Text | None = Field(None, description="A virtualenv whose bin/ goes first on PATH.")


Container = Annotated[Union[Engine, Apptainer, Pyxis, NoContainer], Field(discriminator="runtime")]

_FILE_PIN = re.compile(r"(?P<file>.+)@sha256:(?P<sha256>[0-9a-f]{64})")


def image_file(c: Apptainer | Pyxis) -> tuple[str, str | None] | None:
    """An image that is a file on the nodes (a .sif, an enroot .sqsh), not a registry's: its path and the sha256
    it is pinned to (`/images/verl.sif@sha256:<sha256sum of the file>`), which the job checks on every node; None
    for a registry image (docker://..., registry#image), pinned by its digest like Docker's."""
    if isinstance(c, Apptainer):
        is_file = "://" not in c.image
    else:  # enroot: a path (absolute or ./) or a .sqsh; anything else names a registry image
        is_file = c.image.startswith(("/", "./", "../")) or c.image.split("@")[0].endswith(".sqsh")
    if not is_file:
        return None
    m = _FILE_PIN.fullmatch(c.image)
    return (m["file"], m["sha256"]) if m else (c.image, None)


# --- network, ray ----------------------------------------------------------------------------------

class Nccl(Model):
    ib_hca: tuple[Directive, ...] = Field((), description="NCCL_IB_HCA: the InfiniBand adapters to use.")
    ib_gid_index: Int | None = Field(None, ge=0, description="NCCL_IB_GID_INDEX (RoCE).")
    cross_nic: Literal[0, 1, 2] | None = Field(None, description="NCCL_CROSS_NIC.")
    proto: Literal["Simple", "LL", "LL128"] | None = Field(None, description="NCCL_PROTO.")
    socket_ifname: Directive | None = Field(None, description="NCCL_SOCKET_IFNAME: the NIC for NCCL's sockets.")


class Hccl(Model):
    """Huawei's collective library on Ascend NPUs (cluster.accelerator: npu); its socket interface is
    network.head_interface's, and its port ranges are derived per job."""

    connect_timeout: Seconds = Field(3600, description="HCCL_CONNECT_TIMEOUT: how long ranks wait for each other "
                                                       "to connect (verl's Ascend guide: 3600 s).")
    exec_timeout: Seconds = Field(3600, description="HCCL_EXEC_TIMEOUT: how long a collective may take.")


class Network(Model):
    head_interface: Directive | None = Field(
        None, description="NIC whose IPv4 address Ray (and gloo) use on every node; default (slurm): Slurm's "
                          "address of the node (NodeAddr), else the one it reaches the controller from.")
    nccl: Nccl = Field(Nccl(), description="NCCL/RCCL settings, exported on every node before Ray starts.")
    hccl: Hccl = Field(Hccl(), description="HCCL settings (cluster.accelerator: npu), exported on every node.")


class Ray(Model):
    address: Text | None = Field(
        None, description="ray-job target: the cluster's dashboard, e.g. http://head:8265; RAY_ADDRESS overrides it.")
    working_dir: Text = Field(".", description="ray-job target: uploaded as the job's working directory "
                                               "(relative to where submit.sh runs; verl's checkout in verl's docs).")
    port: Int | None = Field(None, ge=1024, le=65535, description="GCS port; default: derived from the job id.")
    dashboard_port: Int | None = Field(None, ge=1024, le=65535, description="Dashboard port; default: derived "
                                                                            "from the job id (slurm), 8265 (compose).")
    expose_dashboard: Bool = Field(
        False, description="slurm/compose targets: serve Ray's dashboard and Jobs API on every address of the "
                           "head (anyone who reaches it can then run code as you); default: loopback only.")
    wait_for_nodes: Seconds = Field(600, description="Deadline for every node and GPU to register.")
    node_timeout: Seconds | None = Field(
        None, ge=5, description="How long a node may stop answering Ray's health checks before Ray declares it "
                                "dead; the run then ends naming it (with requeue_grace, the Slurm job requeues). "
                                "Set where verlc starts Ray. Default: Ray's own (a check every 3 s, dead after 5 "
                                "that fail, each after up to 10 s: 15 to 65 s).")
    debug: Literal["off", "post_mortem", "legacy"] = Field("off", description="Ray's debugger: post_mortem on "
                                                                              "exceptions, or legacy `ray debug`.")
    sweep_parallel: Int = Field(1, ge=1, description="ray-job target: how many variants of a sweep run on the "
                                                     "cluster at once; every variant is submitted, and each waits "
                                                     "for its turn. Default 1: in turn, each with the cluster's "
                                                     "GPUs; raise it for a cluster sized for several.")


# --- sweeps ----------------------------------------------------------------------------------------

SweepKey = Annotated[str, Strict(), matching(r"verl(\.[A-Za-z_][A-Za-z0-9_]*)+",
                                              "a verl setting such as verl.actor_rollout_ref.actor.optim.lr")]


class Sweep(Model):
    """Every combination of these verl settings is one variant: a Slurm array task, a Ray job."""

    matrix: dict[SweepKey, Annotated[tuple[Any, ...], Field(min_length=1)]] = Field(
        min_length=1, description="verl.<key>: [values]; every combination is one variant, with its own "
                                  "experiment name and checkpoint folder (under trainer.default_local_dir when "
                                  "the spec fixes it).")


# --- verl's Hydra composition -------------------------------------------------------------------

GroupKey = Annotated[str, Strict(), matching(
    r"[A-Za-z_][A-Za-z0-9_/]*(@[A-Za-z_][A-Za-z0-9_.]*)?", "a Hydra config group, optionally @package "
    "(e.g. actor@actor_rollout_ref.actor)")]
GroupOption = Annotated[str, Strict(), matching(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", "a config group option name")]
# Hydra reads an entry without a scheme as file:// (its config repository's get_scheme)
SearchPath = Annotated[str, Strict(), matching(
    r"((pkg|file)://)?[A-Za-z0-9_./-]{1,255}", "a Hydra search path such as pkg://my_plugin.config, "
    "file:///opt/plugin/config or /opt/plugin/config")]


class Hydra(Model):
    """How Hydra composes the program's config: --config-name, config group choices, plugin search paths."""

    config_name: Name | None = Field(None, description="The program's --config-name, a config in its config "
                                                       "folder (e.g. ppo_megatron_trainer on verl releases before "
                                                       "model_engine); default: the one its @hydra.main names "
                                                       "(main_ppo: ppo_trainer).")
    config_dir: Text | None = Field(
        None, description="A folder of configs of the run's own, relative to the run's code (Hydra's --config-dir): "
                          "searched after the program's own config folder, so config_name can name a config in "
                          "it (verl's sglang_multiturn examples' gsm8k_multiturn_grpo).")
    groups: dict[GroupKey, GroupOption] = Field(
        default_factory=dict, description="Config group choices, as `group@package: option` (model_engine is "
                                          "verl.model_engine).")
    searchpath: tuple[SearchPath, ...] = Field((), description="Where Hydra also looks for configs (a plugin's "
                                                                "groups); passed as hydra.searchpath.")


# --- the program and its code ----------------------------------------------------------------------

Module = Annotated[str, Strict(), matching(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+",
                                           "a Python module such as recipe.dapo.main_dapo")]
Commit = Annotated[str, Strict(), matching(r"[0-9a-f]{40}", "a full git commit (40 lowercase hex digits)")]


# --- a pipeline's stages ---------------------------------------------------------------------------

class Stage(Model):
    """One program of a pipeline: these settings on top of the spec's own (mappings merge, lists are replaced),
    checked as a spec of its own. The stages run in the order written, each once the one before it succeeded;
    its Slurm job and its runs are named <name>-<stage>."""

    program: Module | None = Field(None, description="The verl program this stage starts (default: the spec's "
                                                     "program), e.g. verl.trainer.sft_trainer.")
    model: Any = Field(None, description="The model, as the spec's model:; or an earlier stage's: "
                                         "${stages.NAME.model} is that stage's last checkpoint merged into a "
                                         "Hugging Face folder (verl.model_merger, run before this stage starts).")
    project: Text | None = Field(None, description="verl's trainer.project_name, where it differs from the spec's.")
    experiment: Text | None = Field(None, description="verl's trainer.experiment_name (default: the stage's name "
                                                      "<name>-<stage>).")
    data: dict[Str, Any] | None = Field(None, description="The data, as the spec's data:; a data file may be "
                                                          "an earlier stage's file of responses (verl's "
                                                          "generation's data.output_path): ${stages.NAME.output}.")
    verl: dict[Str, Any] | None = Field(None, description="The stage's verl settings, checked against its "
                                                          "program's own config.")
    hydra: dict[Str, Any] | None = Field(None, description="As the spec's hydra:.")
    cluster: dict[Str, Any] | None = Field(None, description="Resources where they differ from the spec's.")
    env: dict[EnvName, EnvValue] | None = Field(None, description="Env of this stage's nodes, over the spec's.")
    stall_timeout: Seconds | None = Field(None, description="As the spec's stall_timeout.")


# --- the spec --------------------------------------------------------------------------------------

# --- services beside the trainer -----------------------------------------------------------------------

# A service's name: a word of `${services.NAME.url}` and of the environment variables the runtime sets for it.
ServiceName = Annotated[str, Strict(), matching(
    r"[a-z][a-z0-9_]{0,31}", "a service name: 1-32 lowercase letters, digits or '_', starting with a letter")]
HttpPath = Annotated[str, Strict(), matching(r"/[A-Za-z0-9._~/%?=&+-]{0,255}", "an HTTP path such as /health")]


class Ready(Model):
    """When a service is ready: a path that answers 2xx, or a command that exits 0, by a deadline."""
    http: HttpPath | None = Field(None, description="A path on the service that must answer 2xx, e.g. /health.")
    command: tuple[Text, ...] | None = Field(None, min_length=1, description="A command (argv) run on the "
                                             "service's node that exits 0 once it is ready.")
    deadline: Seconds = Field(300, description="Seconds from the service's start until it must be ready.")


class SandboxProbe(Model):
    kind: Literal["sandbox"] = Field(description="A code sandbox (SandboxFusion's API): POST /run_code runs "
                                                 "print(1) in Python and must print 1.")


class RetrieverProbe(Model):
    kind: Literal["retriever"] = Field(description="A retriever (Search-R1's API): POST /retrieve with one query "
                                                   "must return at least one document.")
    query: Text = Field("what is reinforcement learning", description="The query it asks.")


class JudgeProbe(Model):
    kind: Literal["judge"] = Field(description="An OpenAI-compatible LLM server: GET /v1/models must list `model` "
                                               "and POST /v1/chat/completions must answer one message.")
    model: Text = Field(description="The model the server must serve, as its /v1/models lists it.")


class HttpProbe(Model):
    kind: Literal["http"] = Field(description="Any HTTP request, whose 2xx answer must contain `expect`.")
    method: Literal["GET", "POST"] = Field("GET", description="The request's method.")
    path: HttpPath = Field(description="The request's path.")
    json_body: Any = Field(None, description="A POST's JSON body.")
    expect: Text = Field(description="Text the answer must contain.")


Probe = Annotated[Union[SandboxProbe, RetrieverProbe, JudgeProbe, HttpProbe], Discriminator("kind")]


class Service(Model):
    """A process beside the trainer (a code sandbox, an LLM judge, a retriever), started with the job in the
    job's image or in an image of its own, checked with a real request before training, watched while it
    trains, stopped with it."""
    command: tuple[Text, ...] = Field((), description="Its argv; it must listen on "
                                      "${services.NAME.host}:${services.NAME.port} (verlc picks the port); "
                                      "${services.NAME.token} is a secret made for each run. With image: the "
                                      "arguments after the image (default: the image's own command).")
    image: Text | None = Field(None, description="An image of its own (e.g. SandboxFusion's), which the target "
                                                 "starts on the head node beside the job's container, on the "
                                                 "node's network, with the service's variables in its env "
                                                 "(VERLC_SERVICE_<NAME>_URL, _HOST, _PORT, _TOKEN); default: "
                                                 "the job's image, started by verlc's runtime.")
    on: Literal["head", "every_node", "own_node"] = Field(
        "head", description="The head node; every node of the trainer (each node's trainer processes reach their "
                            "own node's, at 127.0.0.1); or a node of its own, added to the job's allocation (a "
                            "node like the trainer's, which the trainer does not use).")
    gpus: Int | None = Field(None, ge=0, description="With on: own_node, the GPUs of its node it holds (Ray gives "
                                                     "them to its process; default: every GPU of the node).")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description="Its environment, over the job's.")
    ready: Ready = Field(Ready(), description="When it is ready (default: its port accepts a connection).")
    probe: Probe | None = Field(None, description="One real request before training, and what the answer must "
                                                  "hold.")
    restart: Int = Field(0, ge=0, le=10, description="How many times a service that exits is started again "
                                                     "before the job fails.")
    gpu_memory: Number | None = Field(
        None, gt=0, lt=1, description="The share of a GPU's memory it takes on the GPUs it shares with the trainer "
                                      "(a vLLM judge's --gpu-memory-utilization): the build refuses a spec whose "
                                      "services on a node and verl's rollout "
                                      "(actor_rollout_ref.rollout.gpu_memory_utilization) take more than a GPU.")
    listen: Literal["private", "all"] = Field("private", description="private: the head node's own address "
                                              "(127.0.0.1 for a service on every node), and the preflight fails "
                                              "one that listens on every interface; all: every interface.")


TARGETS_MEANING = "The bundles this spec is meant for: what `--target all` builds and checks (default: every target)."


class Spec(Model):
    """One verl run: what to train (model, data, verl settings) and where and how it runs."""

    extends: Text | tuple[Text, ...] | None = Field(
        None, description="Base spec file(s), relative to this one: their settings first, this file's on top "
                          "(mappings merge, lists are replaced).")
    name: Name = Field(description="Names the bundle folder, the Slurm job, containers and Ray submissions.")
    targets: tuple[Name, ...] | None = Field(None, min_length=1, description=TARGETS_MEANING)  # with_sections: names
    verl_version: Str = Field("0.9.1", description="The verl release whose config `verl:` is checked against; "
                                                   "the preflight requires the cluster to run it. With "
                                                   "verl_commit: the version that commit installs as (default).")
    verl_commit: Commit | None = Field(
        None, description="verl pinned to a git commit (recipes' REQUIRED_VERL.txt): `verl:` is checked against "
                          "that commit's configs and dataclasses (shipped, cached, or read from verl_checkout), "
                          "and the preflight requires every node's verl to be that commit.")
    verl_checkout: Text | None = Field(
        None, description="A local git checkout of verl holding verl_commit, read when verlc has no schema of "
                          "it yet (relative to the spec; default: code).")
    program: Module = Field("verl.trainer.main_ppo", description="The Ray driver program the job starts "
                            "(python3 -m PROGRAM), e.g. recipe.dapo.main_dapo or "
                            "verl.experimental.fully_async_policy.fully_async_main; its Hydra config is composed "
                            "as Hydra composes it for that module.")
    code: Text | None = Field(None, description="The run's own code (recipes, reward functions, configs), relative "
                                                "to the spec: shipped to the job as its working directory and "
                                                "recorded (git commit, uncommitted diff); default: the git "
                                                "checkout holding the spec, when the program or a setting needs "
                                                "it.")
    project: Text = Field(description="verl's trainer.project_name (the logger's project).")
    experiment: Text | None = Field(None, description="verl's trainer.experiment_name; default: name.")
    model: Annotated[Annotated[Text, Tag("text")] | Annotated[PinnedModel, Tag("pinned")],
                     Discriminator(lambda v: "pinned" if isinstance(v, (dict, PinnedModel)) else "text")] = Field(
        description="HF model id or path, used for the actor, the reference and the critic; or a hub model "
                    "pinned to a revision: {path: ORG/NAME, revision: COMMIT}.")
    model_shape: Text | dict[Str, Any] | None = Field(
        None, description="The model's config.json (its path, relative to the spec, or its keys: hidden_size, "
                          "num_hidden_layers, ...) for `verlc plan`'s memory figures and the build's check that "
                          "the run fits; default: the model folder's own config.json where the build can read it, else a "
                          "pinned hub model's (the Hugging Face cache's, else fetched from the hub once and kept "
                          "in verlc's cache; HF_HUB_OFFLINE=1 fetches nothing).")
    data: Data = Field(description="Preprocessing to run and the parquet files verl reads.")
    verl: dict[Str, Any] = Field(default_factory=dict, description="verl's trainer config, verl's nesting; keys "
                                 "mean what Hydra's overrides mean: key (set), +key (add), ++key (add or set); see "
                                 "'Hydra's prefixes in verl:' below.")
    hydra: Hydra = Field(Hydra(), description="Which verl config Hydra composes: config name, groups, plugins.")
    cluster: Cluster = Field(description="Nodes, GPUs, accelerator, and the Slurm directives.")
    container: Container = Field(NoContainer(runtime="none"), description="Where verl runs on each node.")
    network: Network = Field(Network(), description="Which NIC Ray uses; NCCL/RCCL settings.")
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, description="Set on every node before Ray starts; "
                                         "${env:NAME} (and ${HOME}, ${USER}, a leading ~) expand on the node.")
    secrets: tuple[SecretName, ...] = Field((), description="Names only; values come from the submitting shell.")
    pins: dict[Package, Version] = Field(
        default_factory=dict, description="Exact package versions every node must have (verl: verl_version).")
    ray: Ray = Field(Ray(), description="Ray's ports, bring-up deadline, debugger, and the ray-job address.")
    sweep: Sweep | None = Field(None, description="A matrix of verl settings; each combination is a variant.")
    stall_timeout: Seconds | None = Field(
        None, description="End a run whose training log shows no new step (verl's console logger) for this long, "
                          "so a hung job does not burn its allocation; seconds or a duration (e.g. 2h). "
                          "Default: never.")
    stages: dict[Name, Stage] | None = Field(
        None, min_length=1, description="A pipeline: programs run one after another (SFT, then RL from its "
                                        "model, ...), each a stage of its own on top of this spec's settings; "
                                        "on Slurm each is a job that starts once the one before it succeeded "
                                        "(afterok).")
    services: dict[ServiceName, Service] = Field(
        default_factory=dict, max_length=10, description="Processes beside the trainer (a sandbox, a judge, a retriever): "
                                          "verl's settings, env and other services reach each at "
                                          "${services.NAME.url} (.host, .port).")
    tool_config: dict[Str, Any] | None = Field(
        None, description="verl's multi-turn tool config, as verl reads it ({tools: [{class_name, config, "
                          "tool_schema}]}); its strings may hold ${services.NAME.url} (.host, .port, .token). The "
                          "runtime writes it on every node before training and verlc points "
                          "actor_rollout_ref.rollout.multi_turn.tool_config_path at it.")
    reproducible: Bool = Field(False, description="Require an image pinned by digest (an image file by its own sha256, "
                                                  "checked on every node), an explicit verl_version and "
                                                  "a hub model pinned to its commit; turn on verl's determinism "
                                                  "settings; and stop a re-run whose inputs (data, model files), "
                                                  "image, versions or verl config differ from the first run's "
                                                  "record.")

    @property
    def model_path(self) -> str:
        """The model as verl gets it: the text given, or the folder a pinned revision is put in."""
        return self.model if isinstance(self.model, str) else self.model.folder


def with_sections(names: tuple[str, ...], sections: Sequence[tuple[Section, type[BaseModel]]]) -> type[Spec]:
    """The Spec of these targets: `targets:` one of their names, and each target's own section (with its model)
    where it says (the top level, or inside `cluster:`), optional. The target registry's Catalog holds it."""
    assert all(len(s.at) == 1 or s.at[0] == "cluster" for s, _ in sections), "a target's section nests only in cluster:"
    top = {s.at[0]: (model | None, Field(None, description=s.description)) for s, model in sections if len(s.at) == 1}
    nested = {s.at[1]: (model | None, Field(None, description=s.description)) for s, model in sections
              if len(s.at) == 2}
    cluster = create_model("Cluster", __base__=Cluster, __module__=__name__, __doc__=Cluster.__doc__, **nested)
    field = Spec.model_fields["cluster"]
    return create_model("Spec", __base__=Spec, __module__=__name__, __doc__=Spec.__doc__,
                        targets=(tuple[Literal[names], ...] | None,  # type: ignore[valid-type]
                                 Field(None, min_length=1, description=TARGETS_MEANING)),
                        cluster=(cluster, Field(description=field.description)), **top)
