"""Spec -> JobIR. Every derived value is computed here, once; targets only render it."""

from __future__ import annotations

import os
import re
from dataclasses import replace
from typing import TYPE_CHECKING

from .version import VERSION

from .ir import CodeIR, ContainerIR, DataPrepIR, EnvVar, ImageBuildIR, JobIR, ModelFetchIR, RayIR, VariantIR, Var, Word, parse_word
from .code import absolute_files
from . import memory, yaml_text
from .derive import (MODEL_KEYS, checkpoint_dir, critic_in_use, derived_environment, has_key, strings_in,
                     variant_specs)
from .overrides import determinism_defaults, overrides, verl_values
from .services import ROLLOUT_MEMORY, lower_services, lower_tool_config
from .spec import Apptainer, Engine, NoContainer, PinnedModel, Pyxis, Spec, image_file
from .verl import preprocess
from .verl.check import Selection, select, settings
from .verl.hydra import verl_value
from .verl.program import GENERATION_SERVER, TORCHRUN, own_config
from .verl.release import Release
from .verl.rules import Config, absolute
from .verl.workers import Need, known, needs

if TYPE_CHECKING:
    from .catalog import Catalog
    from .load import Sourced

# The columns main_ppo's data set reads of every row (verl's RLHFDataset and reward): the preflight checks each
# data file has them. verl's own other programs read columns their configs name: not checked.
PPO_COLUMNS = ("prompt", "data_source", "reward_model")
# The distribution each of verl's rollout engines (rollout.name) comes in; "hf" is transformers, which verl needs.
ROLLOUT_PACKAGES = {"vllm": "vllm", "sglang": "sglang", "sglang_async": "sglang", "trtllm": "tensorrt_llm"}


def lower(spec: Spec, release: Release, catalog: Catalog, *, spec_file: str, spec_sha256: str,
          notes: tuple[str, ...] = (), targets: tuple[str, ...] = (), built: tuple[str, ...] = (),
          code: CodeIR | None = None, profile: tuple[str, str, str] | None = None,
          sourced: Sourced) -> JobIR:
    """Resolve a checked spec into the IR every target renders from, with the parts of the `built` targets
    (`sourced`: the loaded spec, whose folder a relative model_shape or model path is read from)."""
    chosen = select(spec.verl, release, spec.hydra.config_name, spec.hydra.groups)
    assert isinstance(chosen, Selection), "the checks refuse a spec whose verl config cannot be chosen"
    # verl's config as the trainer will see it: written into the bundle, and read for the rollout engine
    own = own_config(spec.program, release)  # one of verl's programs with its own config (SFT): not PPO's facts
    ppo = not own and spec.program != GENERATION_SERVER  # a PPO trainer: main_ppo's facts hold (workers, columns)
    takes_model = any(has_key(chosen.tree, k) for k in MODEL_KEYS)
    config = Config(chosen.tree, {k: verl_value(v) for k, v in
                                  {**determinism_defaults(spec, chosen), **verl_values(spec, chosen)}.items()})
    ir = JobIR(
        name=spec.name,
        spec_file=spec_file,
        spec_sha256=spec_sha256,
        normalized_spec=normalized(spec),
        verl_config=yaml_text.dump(config.tree),
        reproducible=spec.reproducible,
        verl_schema=f"{release.label.removeprefix('verl ')} ({release.source})",
        verlc_version=VERSION,
        verl_version=spec.verl_version,
        nodes=spec.cluster.nodes + sum(s.on == "own_node" for s in spec.services.values()),
        gpus_per_node=spec.cluster.gpus_per_node,
        accelerator=spec.cluster.accelerator,
        env=environment(spec),
        secrets=spec.secrets,
        container=container(spec, code),
        ray=RayIR(
            address=spec.ray.address,
            working_dir=spec.ray.working_dir,
            port=spec.ray.port,
            dashboard_port=spec.ray.dashboard_port,
            expose_dashboard=spec.ray.expose_dashboard,
            wait_seconds=spec.ray.wait_for_nodes,
            head_interface=spec.network.head_interface,
            debugger_external=spec.ray.debug == "legacy",
            sweep_parallel=spec.ray.sweep_parallel,
        ),
        # what the program reads: verl's evaluation scores a file (its data.path), and takes no model
        data_prep=data_prep(spec, takes_data_files(chosen), config.get("data.path")),
        model=parse_word(spec.model_path) if takes_model else Word(()),
        model_fetch=ModelFetchIR(spec.model.path, spec.model.revision, parse_word(spec.model.folder))
        if isinstance(spec.model, PinnedModel) and takes_model else None,
        data_files=tuple(parse_word(f) for f in (*spec.data.train_files, *spec.data.val_files)),
        services=lower_services(spec),
        tool_config=lower_tool_config(spec),
        named_files=tuple(parse_word(p) for p in absolute_files(
            {s.key: s.value for s in settings(spec.verl, chosen.walker)}).values()),
        checkpoint_dir=checkpoint_word(spec, chosen),
        node_env=node_env(spec, chosen, catalog),
        pins=tuple(sorted({"verl": spec.verl_version, **spec.pins}.items())),
        # PPO's rollout engine, or verl's generation's own (rollout.name)
        rollout_package=ROLLOUT_PACKAGES.get(str(config.get("actor_rollout_ref.rollout.name")
                                                 or config.get("rollout.name"))),
        startup=startup_needs(spec, release, config) if ppo else None,
        rollout_memory=rollout_memory(spec, config) if ppo else None,
        # verl's PPO trainer saves ahead of that deadline; its other programs do not read it
        expiry_variable=(release.startup.get("expiry_save") or {}).get("variable") if ppo else None,
        image=parse_word(getattr(spec.container, "image", None) or "none"),
        trainer_module=spec.program,
        launch=launch(spec),
        # verl's generation server reads only the prompts; verl's other programs' columns are their own
        data_columns=PPO_COLUMNS if ppo else (str(config.get("data.prompt_key")),) if not own else (),
        config_name=chosen.config,
        overrides=overrides(spec, chosen),
        gpu_type=spec.cluster.gpu_type,
        targets=targets,
        variants=variants(spec, chosen),
        stall_timeout=spec.stall_timeout,
        code=code,
        profile=profile,
        verl_commit=spec.verl_commit,
        notes=notes,
        time_limit=catalog.time_limit(spec),
        memory=memory.for_spec(spec, sourced, config) if ppo else None,
    )
    return replace(ir, parts=tuple((name, catalog.get(name).lower(spec, ir)) for name in built))


def launch(spec: Spec) -> tuple[str, ...]:
    """What starts the program: python3 -m for a Ray driver; torchrun, one process per GPU, for verl's programs
    that set up torch.distributed themselves: on one node standalone, on more than one the runtime starts it on
    every node and adds each node's rank and the rendezvous (protocol.Job.every_node)."""
    if spec.program not in TORCHRUN:
        return ("python3", "-m")
    per_node = f"--nproc_per_node={spec.cluster.gpus_per_node}"
    if spec.cluster.nodes == 1:
        return ("torchrun", "--standalone", "--nnodes=1", per_node, "-m")
    return ("torchrun", f"--nnodes={spec.cluster.nodes}", per_node, "-m")


def startup_needs(spec: Spec, release: Release, config: Config) -> tuple[Need, ...] | None:
    """What the workers this config starts need on every node (a sweep's variants share them), from the release's
    start-up facts; None where verlc has none for these workers (the preflight records that it could not know)."""
    if not known(release.startup, config.get):
        return None
    return needs(release.startup, config.get, use_critic=critic_in_use(spec.verl, config.tree),
                 accelerator=spec.cluster.accelerator, label=release.label)


def rollout_memory(spec: Spec, config: Config) -> float | None:
    """The share of each GPU's total memory vLLM's rollout asks to find free at its start (vLLM's request_memory
    refuses to start below it), where the rollout is vLLM on CUDA or ROCm; None elsewhere."""
    share = config.get(ROLLOUT_MEMORY)
    if config.get("actor_rollout_ref.rollout.name") != "vllm" or spec.cluster.accelerator == "npu":
        return None
    return float(share) if isinstance(share, int | float) and not isinstance(share, bool) else None


def takes_data_files(chosen: Selection) -> bool:
    """Whether the program reads the spec's data files (verl's generation and evaluation read data.path)."""
    return any(has_key(chosen.tree, k) for k in ("data.train_files", "data.val_files"))


def data_prep(spec: Spec, takes_files: bool, data_path: object) -> tuple[DataPrepIR, ...]:
    """verl's preprocessing scripts (relative to the workdir, a verl checkout) with the options of the
    spec's release; the checks refuse an option the release's scripts lack. A program that reads no data
    files (`takes_files`) gets only the steps whose folder holds its `data_path`."""
    path = os.path.normpath(str(data_path or "")) + "/"
    steps = [p for p in spec.data.prepare if takes_files or path.startswith(os.path.normpath(p.dir) + "/")]
    options = preprocess.options(spec.verl_version)
    return tuple(
        DataPrepIR(p.dataset, p.dir, (
            "python3", p.script or preprocess.SCRIPTS[p.dataset], options.out_dir, p.dir,
            *((options.local_dataset or preprocess.LOCAL_DATASET, p.local_dataset_path) if p.local_dataset_path
              else ()),
        ))
        for p in steps
    )


_INTERPOLATION = re.compile(r"\$\{([^{}]*)\}")
_ENV_REF = re.compile(r"(?:oc\.)?env:([A-Za-z_][A-Za-z0-9_]*)(?:,.*)?")


def checkpoint_word(spec: Spec, chosen: Selection) -> Word:
    """verl's checkpoint folder as the preflight must see it: references to other verl settings resolved
    now (their values are known), `${env:NAME}` left to expand on the node."""
    raw = checkpoint_dir(spec)
    config: Config | None = None  # built only for a reference to another setting: copying verl's tree costs
    parts: list[str | Var] = []
    pos = 0
    for match in _INTERPOLATION.finditer(raw):
        parts.append(raw[pos:match.start()])
        env = _ENV_REF.fullmatch(match[1].strip())
        if env:
            parts.append(Var(env[1]))
        else:
            config = config or Config(chosen.tree, verl_values(spec, chosen))
            ref = match[1].strip().removeprefix("oc.select:").split(",")[0]
            parts.append(str(config.get(absolute("trainer.default_local_dir", ref))))
        pos = match.end()
    parts.append(raw[pos:])
    return Word(tuple(p for p in parts if p != ""))


def node_env(spec: Spec, chosen: Selection, catalog: Catalog) -> tuple[str, ...]:
    """Every environment variable the spec reads on the nodes (`${env:NAME}` anywhere): the preflight
    requires each set and non-empty on every node, and containers get them from the host."""
    found: set[str] = set()
    words = [*(e.value for e in environment(spec)), checkpoint_word(spec, chosen), parse_word(spec.model_path),
             *(parse_word(f) for f in (*spec.data.train_files, *spec.data.val_files))]
    c = container(spec)
    words += [w for w in (c.image, c.workdir, c.venv, *c.mounts, *c.run_args) if w is not None]
    words += [parse_word(text) for target in catalog.targets for text in target.node_words(spec)]  # their sections'
    for word in words:
        found.update(word.variables)
    for s in settings(spec.verl, chosen.walker):
        for text in strings_in(s.value):
            found.update(m[1] for m in (_ENV_REF.fullmatch(i.strip()) for i in _INTERPOLATION.findall(text)) if m)
    return tuple(sorted(found - {"HOME", "USER"}))


def environment(spec: Spec) -> tuple[EnvVar, ...]:
    """Env for every node, set before Ray starts (verl #158): derived first, then the spec's own."""
    return (*derived_environment(spec), *(EnvVar(n, parse_word(v), "env") for n, v in spec.env.items()))


# Ascend NPUs in a container without --privileged (Ascend's container guides): the device files besides each
# NPU's /dev/davinciN, and the host's driver and its tools, read-only.
ASCEND_DEVICES = ("/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc")
ASCEND_DRIVER = ("/usr/local/dcmi", "/usr/local/bin/npu-smi", "/usr/local/Ascend/driver", "/etc/ascend_install.info")


def container(spec: Spec, code: CodeIR | None = None) -> ContainerIR:
    """How each node runs the job; without a container, in the run's code folder when it has one."""
    c = spec.container
    rocm, npu = spec.cluster.accelerator == "rocm", spec.cluster.accelerator == "npu"
    driver = tuple(parse_word(f"{path}:{path}:ro") for path in ASCEND_DRIVER) if npu else ()
    if isinstance(c, Engine):
        if npu:
            devices, gpu_args = (*(f"/dev/davinci{i}" for i in range(spec.cluster.gpus_per_node)),
                                 *ASCEND_DEVICES), ()
        elif rocm:
            devices, gpu_args = ("/dev/kfd", "/dev/dri"), ("--group-add", "video")
        elif c.runtime == "podman":
            devices, gpu_args = ("nvidia.com/gpu=all",), ()  # CDI
        else:
            devices, gpu_args = (), ("--gpus", "all")
        gpu_args = ("--privileged", *gpu_args) if c.privileged else gpu_args
        return ContainerIR(
            runtime=c.runtime, image=parse_word(c.image), image_sha256=None,
            build=ImageBuildIR(parse_word(c.build.dockerfile), parse_word(c.build.context)) if c.build else None,
            workdir=parse_word(c.workdir), shm_size=c.shm_size,
            mounts=(*driver, *(parse_word(m) for m in c.mounts)),
            devices=(*devices, *c.devices), gpu_args=gpu_args,
            run_args=tuple(parse_word(a) for a in c.run_args), venv=None,
        )
    if isinstance(c, (Apptainer, Pyxis)):
        # apptainer shares the host's /dev: the NPUs need only the driver's files bound in
        gpu_args = () if isinstance(c, Pyxis) or npu else (("--rocm",) if rocm else ("--nv",))
        image, sha256 = image_file(c) or (c.image, None)
        return ContainerIR(
            runtime=c.runtime, image=parse_word(image), image_sha256=sha256, build=None, workdir=parse_word(c.workdir),
            shm_size=None, mounts=(*driver, *(parse_word(m) for m in c.mounts)), devices=(), gpu_args=gpu_args,
            run_args=(), venv=None,
        )
    assert isinstance(c, NoContainer)
    return ContainerIR(
        runtime="none", image=None, image_sha256=None, build=None,
        workdir=parse_word(c.workdir) if c.workdir else parse_word(code.folder) if code else None, shm_size=None,
        mounts=(), devices=(),
        gpu_args=(), run_args=(), venv=parse_word(c.venv) if c.venv else None,
    )


def variants(spec: Spec, chosen: Selection) -> tuple[VariantIR, ...]:
    base = {o.key: o for o in overrides(spec, chosen)}
    out = []
    for index, (matrix_values, variant) in enumerate(variant_specs(spec)):
        changed = tuple(o for o in overrides(variant, chosen) if base.get(o.key) != o)
        out.append(VariantIR(index, matrix_values, changed, checkpoint_word(variant, chosen)))
    return tuple(out)


def normalized(spec: Spec) -> str:
    """The spec with every default filled in and its bases merged in, as YAML: what the bundle was built from."""
    return yaml_text.dump(spec.model_dump(mode="json", exclude={"extends"}))
