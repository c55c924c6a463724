"""Spec -> JobIR. Every derived value is computed here, once; targets only render it."""

from __future__ import annotations

import re
from typing import Any

from verlc import __version__

from .ir import (
    ContainerIR, DataPrepIR, EnvVar, ImageBuildIR, JobIR, KubeIR, ModelFetchIR, MountIR, Override, RayIR, SkyIR,
    SlurmIR, TolerationIR, VariantIR, Var, Word, parse_word,
)
from . import yaml_text
from .derive import (
    GPU_LABEL, checkpoint_dir, derived, derived_environment, node_image, node_workdir, rayjob_names,
    resume_defaults, slurm_log_dirs, variant_specs,
)
from .spec import Apptainer, Engine, Kubernetes, NoContainer, PinnedModel, Pyxis, Skypilot, Spec
from .verl import determinism, preprocess
from .verl.check import Selection, select, settings
from .verl.hydra import hydra_value, verl_value
from .verl.release import DEFAULT_CONFIG, Release
from .verl.rules import Config, absolute

TRAINER_MODULE = "verl.trainer.main_ppo"
# The distribution each of verl's rollout engines (rollout.name) comes in; "hf" is transformers, which verl needs.
ROLLOUT_PACKAGES = {"vllm": "vllm", "sglang": "sglang", "sglang_async": "sglang", "trtllm": "tensorrt_llm"}


def lower(spec: Spec, release: Release, *, spec_file: str, spec_sha256: str, notes: tuple[str, ...] = (),
          targets: tuple[str, ...] = ()) -> JobIR:
    """Resolve a checked spec into the IR every target renders from."""
    slurm = spec.cluster.slurm
    chosen = select(spec.verl, release, spec.hydra.config_name)
    assert isinstance(chosen, Selection), "the checks refuse a spec whose verl config cannot be chosen"
    return JobIR(
        name=spec.name,
        spec_file=spec_file,
        spec_sha256=spec_sha256,
        normalized_spec=normalized(spec),
        verl_config=yaml_text.dump(Config(chosen.tree, {k: verl_value(v) for k, v in
                                                   {**determinism_defaults(spec, chosen), **verl_values(spec, chosen)}.items()}).tree),
        reproducible=spec.reproducible,
        verl_schema=f"{release.version} ({release.source})",
        verlc_version=__version__,
        verl_version=spec.verl_version,
        nodes=spec.cluster.nodes,
        gpus_per_node=spec.cluster.gpus_per_node,
        accelerator=spec.cluster.accelerator,
        env=environment(spec),
        secrets=spec.secrets,
        container=container(spec),
        ray=RayIR(
            address=spec.ray.address,
            working_dir=spec.ray.working_dir,
            port=spec.ray.port,
            dashboard_port=spec.ray.dashboard_port,
            expose_dashboard=spec.ray.expose_dashboard,
            wait_seconds=spec.ray.wait_for_nodes,
            head_interface=spec.network.head_interface,
            num_cpus=slurm.cpus_per_task if slurm else None,
            num_gpus=spec.cluster.gpus_per_node,
            debugger_external=spec.ray.debug == "legacy",
        ),
        data_prep=data_prep(spec),
        model=parse_word(spec.model_path),
        model_fetch=ModelFetchIR(spec.model.path, spec.model.revision, parse_word(spec.model.folder))
        if isinstance(spec.model, PinnedModel) else None,
        data_files=tuple(parse_word(f) for f in (*spec.data.train_files, *spec.data.val_files)),
        checkpoint_dir=checkpoint_word(spec, chosen),
        node_env=node_env(spec, chosen),
        pins=tuple(sorted({"verl": spec.verl_version, **spec.pins}.items())),
        rollout_package=ROLLOUT_PACKAGES.get(str(Config(chosen.tree, verl_values(spec, chosen)).get(
            "actor_rollout_ref.rollout.name"))),
        image=parse_word(getattr(spec.container, "image", None) or "none"),
        trainer_module=TRAINER_MODULE,
        config_name=spec.hydra.config_name,
        overrides=overrides(spec, chosen),
        slurm=slurm_ir(spec),
        compose=compose_container(spec),
        kubernetes=kube_ir(spec),
        skypilot=sky_ir(spec),
        gpu_type=spec.cluster.gpu_type,
        targets=targets,
        variants=variants(spec, chosen),
        stall_timeout=spec.stall_timeout,
        notes=notes,
    )


def data_prep(spec: Spec) -> tuple[DataPrepIR, ...]:
    """verl's preprocessing scripts (relative to the workdir, a verl checkout) with the options of the
    spec's release; the checks refuse an option the release's scripts lack."""
    options = preprocess.options(spec.verl_version)
    return tuple(
        DataPrepIR(p.dataset, p.dir, (
            "python3", p.script or preprocess.SCRIPTS[p.dataset], options.out_dir, p.dir,
            *((options.local_dataset or preprocess.LOCAL_DATASET, p.local_dataset_path) if p.local_dataset_path
              else ()),
        ))
        for p in spec.data.prepare
    )


def overrides(spec: Spec, chosen: Selection) -> tuple[Override, ...]:
    """Derived keys plus the spec's `verl:` leaves, sorted by key: one stable line each.

    What selects the config comes first, in the order Hydra reads it: `--config-name` (when not verl's
    default), the plugin search path, then config group choices (model_engine among them)."""
    head: list[Override] = []
    if spec.hydra.config_name != DEFAULT_CONFIG:
        head.append(Override("--config-name", spec.hydra.config_name, "hydra.config_name"))
    if spec.hydra.searchpath:
        head.append(Override("hydra.searchpath", hydra_value(list(spec.hydra.searchpath)), "hydra.searchpath"))
    groups = {k: Override(k, v, f"hydra.groups.{k}") for k, v in spec.hydra.groups.items()}
    if "model_engine" in spec.verl:
        groups["model_engine"] = Override("model_engine", hydra_value(spec.verl["model_engine"]), "verl.model_engine")
    head += [groups[k] for k in sorted(groups)]
    out = {d.key: Override(d.key, hydra_value(verl_value(d.value)), d.source) for d in derived(spec)}
    for s in settings(spec.verl, chosen.walker):
        out.setdefault(s.key, Override(s.key, hydra_value(verl_value(s.value)), ".".join(map(str, s.loc)),
                                       "+" if s.plus else ""))
    for key, value in resume_defaults(spec).items():
        out.setdefault(key, Override(key, hydra_value(verl_value(value)),
                                     "verlc: a requeued job resumes from its checkpoints"))
    for key, value in determinism_defaults(spec, chosen).items():
        out.setdefault(key, Override(key, hydra_value(value), "reproducible"))
    return (*head, *(out[k] for k in sorted(out)))


def determinism_defaults(spec: Spec, chosen: Selection) -> dict[str, Any]:
    """With `reproducible: true`, verl's determinism settings that the spec's release and engine have."""
    return determinism.available(chosen) if spec.reproducible else {}


def verl_values(spec: Spec, chosen: Selection) -> dict[str, Any]:
    """Every verl key the spec sets, derived ones included, as dotted key -> value."""
    values = {**resume_defaults(spec), **{s.key: s.value for s in settings(spec.verl, chosen.walker)}}
    values.update({d.key: d.value for d in derived(spec)})
    return values


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


def node_env(spec: Spec, chosen: Selection) -> tuple[str, ...]:
    """Every environment variable the spec reads on the nodes (`${env:NAME}` anywhere): the preflight
    requires each set and non-empty on every node, and containers get them from the host."""
    found: set[str] = set()
    words = [*(e.value for e in environment(spec)), checkpoint_word(spec, chosen), parse_word(spec.model_path),
             *(parse_word(f) for f in (*spec.data.train_files, *spec.data.val_files))]
    c = container(spec)
    words += [w for w in (c.image, c.workdir, c.venv, *c.mounts, *c.run_args) if w is not None]
    if spec.compose is not None:
        words += [parse_word(spec.compose.image), parse_word(spec.compose.workdir),
                  *(parse_word(m) for m in spec.compose.mounts)]
    for word in words:
        found.update(word.variables)
    for s in settings(spec.verl, chosen.walker):
        for text in _strings(s.value):
            found.update(m[1] for m in (_ENV_REF.fullmatch(i.strip()) for i in _INTERPOLATION.findall(text)) if m)
    return tuple(sorted(found - {"HOME", "USER"}))


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in _strings(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _strings(v)]
    return []


def environment(spec: Spec) -> tuple[EnvVar, ...]:
    """Env for every node, set before Ray starts (verl #158): derived first, then the spec's own."""
    return (*derived_environment(spec), *(EnvVar(n, parse_word(v), "env") for n, v in spec.env.items()))


def container(spec: Spec) -> ContainerIR:
    c = spec.container
    rocm = spec.cluster.accelerator == "rocm"
    if isinstance(c, Engine):
        if rocm:
            devices, gpu_args = ("/dev/kfd", "/dev/dri"), ("--group-add", "video")
        elif c.runtime == "podman":
            devices, gpu_args = ("nvidia.com/gpu=all",), ()  # CDI
        else:
            devices, gpu_args = (), ("--gpus", "all")
        return ContainerIR(
            runtime=c.runtime, image=parse_word(c.image),
            build=ImageBuildIR(parse_word(c.build.dockerfile), parse_word(c.build.context)) if c.build else None,
            workdir=parse_word(c.workdir), shm_size=c.shm_size,
            mounts=tuple(parse_word(m) for m in c.mounts),
            devices=(*devices, *c.devices), gpu_args=gpu_args,
            run_args=tuple(parse_word(a) for a in c.run_args), venv=None,
        )
    if isinstance(c, (Apptainer, Pyxis)):
        gpu_args = () if isinstance(c, Pyxis) else (("--rocm",) if rocm else ("--nv",))
        return ContainerIR(
            runtime=c.runtime, image=parse_word(c.image), build=None, workdir=parse_word(c.workdir),
            shm_size=None, mounts=tuple(parse_word(m) for m in c.mounts), devices=(), gpu_args=gpu_args,
            run_args=(), venv=None,
        )
    assert isinstance(c, NoContainer)
    return ContainerIR(
        runtime="none", image=None, build=None,
        workdir=parse_word(c.workdir) if c.workdir else None, shm_size=None, mounts=(), devices=(),
        gpu_args=(), run_args=(), venv=parse_word(c.venv) if c.venv else None,
    )


def variants(spec: Spec, chosen: Selection) -> tuple[VariantIR, ...]:
    base = {o.key: o for o in overrides(spec, chosen)}
    out = []
    for index, (matrix_values, variant) in enumerate(variant_specs(spec)):
        changed = tuple(o for o in overrides(variant, chosen) if base.get(o.key) != o)
        out.append(VariantIR(index, matrix_values, changed, checkpoint_word(variant, chosen)))
    return tuple(out)


def compose_container(spec: Spec) -> ContainerIR | None:
    """Docker/podman as the spec says, else the `compose:` section's image on docker."""
    if isinstance(spec.container, Engine):
        return container(spec)
    c = spec.compose
    if c is None:
        return None
    engine = Engine(runtime="docker", image=c.image, workdir=c.workdir, shm_size=c.shm_size, mounts=c.mounts)
    return container(spec.model_copy(update={"container": engine}))


def slurm_ir(spec: Spec) -> SlurmIR | None:
    s = spec.cluster.slurm
    if s is None:
        return None
    directives: list[tuple[str, str | int | None]] = [
        ("job-name", spec.name),
        ("nodes", spec.cluster.nodes),
        ("ntasks-per-node", 1),  # one Ray node per host; Ray schedules the GPUs
        ("cpus-per-task", s.cpus_per_task),
        ("gpus-per-node", f"{spec.cluster.gpu_type}:{spec.cluster.gpus_per_node}" if spec.cluster.gpu_type
         else spec.cluster.gpus_per_node),  # a typed GRES when the spec names the GPU model
        ("mem", s.mem),
        ("time", s.time),
        ("partition", s.partition),
        ("account", s.account),
        ("qos", s.qos),
        ("nodelist", s.nodelist),
        ("exclude", s.exclude),
        ("output", s.output),
        ("error", s.error),
    ]
    if s.requeue_grace is not None:
        directives += [
            ("signal", f"B:USR1@{s.requeue_grace}"),  # to the batch shell, whose trap stops and requeues
            ("requeue", ""),
            ("open-mode", "append"),  # keep the first run's log when the job restarts
        ]
    return SlurmIR(
        directives=tuple((k, str(v)) for k, v in directives if v is not None),
        log_dirs=slurm_log_dirs(spec),
        modules=s.modules,
        requeue=s.requeue_grace is not None,
    )


GPU_RESOURCE = {"cuda": "nvidia.com/gpu", "rocm": "amd.com/gpu"}  # the device plugins' resource names


def kube_ir(spec: Spec) -> KubeIR | None:
    k = spec.kubernetes or Kubernetes()
    image, workdir = node_image(spec, k.image), node_workdir(spec, k.workdir)
    if image is None or workdir is None:
        return None  # the checks refuse the kuberay target without them
    selector = dict(k.node_selector)
    if spec.cluster.gpu_type:
        selector.setdefault(k.gpu_label or GPU_LABEL[spec.cluster.accelerator], spec.cluster.gpu_type)
    return KubeIR(
        names=rayjob_names(spec), namespace=k.namespace, image=image, workdir=workdir,
        service_account=k.service_account, image_pull_secret=k.image_pull_secret, secret=k.secret,
        node_selector=tuple(sorted(selector.items())),
        tolerations=tuple(TolerationIR(t.key, t.operator, t.value, t.effect) for t in k.tolerations),
        priority_class=k.priority_class, gpu_resource=GPU_RESOURCE[spec.cluster.accelerator],
        cpus=k.cpus, memory=k.memory, shm_size=k.shm_size,
        volumes=tuple(MountIR(v.claim, v.mount, "ro" if v.read_only else "") for v in k.volumes),
        retries=k.retries, ttl_after_finished=k.ttl_after_finished, deadline=k.deadline,
    )


def sky_ir(spec: Spec) -> SkyIR | None:
    k = spec.skypilot or Skypilot()
    image, workdir = node_image(spec, k.image), node_workdir(spec, k.workdir)
    if image is None or workdir is None or spec.cluster.gpu_type is None:
        return None  # the checks refuse the skypilot target without them
    count = len(variant_specs(spec))
    base = spec.name
    return SkyIR(
        names=tuple(f"{base}-v{i:03d}" for i in range(count)) if count else (base,),
        image=image, workdir=workdir, accelerators=f"{spec.cluster.gpu_type}:{spec.cluster.gpus_per_node}",
        infra=k.infra, use_spot=k.use_spot, cpus=k.cpus, memory=k.memory, disk_size=k.disk_size,
        buckets=tuple(MountIR(b.source, b.mount, b.mode) for b in k.buckets),
        volumes=tuple(MountIR(v.name, v.mount) for v in k.volumes),
        recovery=None if k.recovery == "off" else k.recovery, max_restarts_on_errors=k.max_restarts_on_errors,
    )


def normalized(spec: Spec) -> str:
    """The spec with every default filled in and its bases merged in, as YAML: what the bundle was built from."""
    return yaml_text.dump(spec.model_dump(mode="json", exclude={"extends"}))
