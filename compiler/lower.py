"""Spec -> JobIR. Every derived value is computed here, once; targets only render it."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from verlc import __version__

from .ir import (
    ContainerIR, DataPrepIR, EnvVar, ImageBuildIR, JobIR, Override, RayIR, SlurmIR, VariantIR, Word, parse_word,
)
from .overrides import derived, flatten, hydra_value
from .verl_checks import Config, engine_of, prefix
from . import yaml_text
from .verl_schema import VerlSchema
from .spec import Apptainer, Engine, NoContainer, Pyxis, Spec

TRAINER_MODULE = "verl.trainer.main_ppo"

# verl's preprocessing scripts, relative to a verl checkout (the container's workdir).
PREPARE_SCRIPTS = {
    "gsm8k": "examples/data_preprocess/gsm8k.py",
    "math": "examples/data_preprocess/math_dataset.py",
}


def lower(spec: Spec, schema: VerlSchema, *, spec_file: str, spec_sha256: str) -> JobIR:
    """Resolve a checked spec into the IR every target renders from."""
    slurm = spec.cluster.slurm
    engine = engine_of(spec, schema)
    return JobIR(
        name=spec.name,
        spec_file=spec_file,
        spec_sha256=spec_sha256,
        normalized_spec=normalized(spec),
        verl_config=dump_yaml(Config(schema.engines[engine],
                                     {**determinism_defaults(spec, schema), **verl_values(spec)}).tree),
        reproducible=spec.reproducible,
        verl_schema=f"{schema.version} ({schema.source})",
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
            wait_seconds=spec.ray.wait_for_nodes,
            head_interface=spec.network.head_interface,
            num_cpus=slurm.cpus_per_task if slurm else None,
            num_gpus=spec.cluster.gpus_per_node,
            debugger_external=spec.ray.debug == "legacy",
        ),
        data_prep=tuple(
            DataPrepIR(p.dataset, p.dir, (
                "python3", p.script or PREPARE_SCRIPTS[p.dataset], "--local_save_dir", p.dir,
                *(("--local_dataset_path", p.local_dataset_path) if p.local_dataset_path else ()),
            ))
            for p in spec.data.prepare
        ),
        model=spec.model,
        data_files=(*spec.data.train_files, *spec.data.val_files),
        checkpoint_dir=checkpoint_dir(spec),
        pins=tuple(sorted({"verl": spec.verl_version, **spec.pins}.items())),
        image=parse_word(getattr(spec.container, "image", None) or "none"),
        trainer_module=TRAINER_MODULE,
        overrides=overrides(spec, schema, engine),
        slurm=slurm_ir(spec),
        compose=compose_container(spec),
        variants=variants(spec, schema, engine),
    )


def overrides(spec: Spec, schema: VerlSchema, engine: str) -> tuple[Override, ...]:
    """Derived keys plus the spec's `verl:` leaves, sorted by key: one stable line each.

    The config group choice `model_engine` comes first: Hydra applies it before the keys it selects."""
    out = {d.key: Override(d.key, hydra_value(d.value), d.source) for d in derived(spec)}
    for s in flatten(spec.verl):
        out.setdefault(s.key, Override(s.key, hydra_value(s.value), ".".join(map(str, s.loc)),
                                       prefix(schema, engine, s.key)))
    for key, value in resume_defaults(spec).items():
        out.setdefault(key, Override(key, hydra_value(value), "verlc: a requeued job resumes from its checkpoints"))
    for key, value in determinism_defaults(spec, schema).items():
        out.setdefault(key, Override(key, hydra_value(value), "reproducible"))
    return tuple(out[k] for k in sorted(out, key=lambda k: (k != "model_engine", k)))


# verl's determinism settings (verl docs/advance/determinism.md; issues #3126, #997): a seed only
# shuffles data, so reproducible runs also need the engines' full determinism.
DETERMINISM = {
    "data.seed": 42,
    "actor_rollout_ref.rollout.seed": 42,
    "actor_rollout_ref.rollout.full_determinism": True,
    "actor_rollout_ref.actor.fsdp_config.full_determinism": True,
    "actor_rollout_ref.ref.fsdp_config.full_determinism": True,
    "critic.fsdp.full_determinism": True,
}


def determinism_defaults(spec: Spec, schema: VerlSchema) -> dict[str, Any]:
    """With `reproducible: true`, verl's determinism settings the spec's engine has."""
    if not spec.reproducible:
        return {}
    base = schema.engines[engine_of(spec, schema)]
    return {k: v for k, v in DETERMINISM.items() if _has(base, k)}


def _has(tree: dict[str, Any], key: str) -> bool:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return False
        tree = tree[part]
    return True


def resume_defaults(spec: Spec) -> dict[str, Any]:
    """Written out unless the spec sets them, so that a requeued or re-run job finds its checkpoints
    where the first run put them (verl's own default interpolates names that could change)."""
    return {"trainer.default_local_dir": checkpoint_dir(spec), "trainer.resume_mode": "auto"}


def verl_values(spec: Spec) -> dict[str, Any]:
    """Every verl key the spec sets, derived ones included, as dotted key -> value."""
    values = {**resume_defaults(spec), **{s.key: s.value for s in flatten(spec.verl) if s.key != "model_engine"}}
    values.update({d.key: d.value for d in derived(spec)})
    return values


def checkpoint_dir(spec: Spec) -> str:
    """Where verl saves checkpoints: trainer.default_local_dir, or verl's default for this run."""
    trainer = spec.verl.get("trainer")
    given = trainer.get("default_local_dir") if isinstance(trainer, dict) else None
    return str(given) if given else f"checkpoints/{spec.project}/{spec.experiment or spec.name}"


def environment(spec: Spec) -> tuple[EnvVar, ...]:
    """Env for every node, set before Ray starts (verl #158): derived first, then the spec's own."""
    return (*derived_environment(spec), *(EnvVar(n, parse_word(v), "env") for n, v in spec.env.items()))


def derived_environment(spec: Spec) -> tuple[EnvVar, ...]:
    """The env vars verlc sets itself, each with the spec path it follows from."""
    env: list[EnvVar] = [EnvVar("PYTHONUNBUFFERED", Word(("1",)), "verlc: stream trainer logs")]
    if spec.cluster.accelerator == "rocm":
        devices = Word((",".join(str(i) for i in range(spec.cluster.gpus_per_node)),))
        for name in ("HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"):
            env.append(EnvVar(name, devices, "cluster.gpus_per_node"))
        # Ray >= 2.45 would otherwise rewrite HIP_VISIBLE_DEVICES per actor (verl #1471, #1575).
        env.append(EnvVar("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", Word(("1",)), "cluster.accelerator"))
        env.append(EnvVar("HSA_NO_SCRATCH_RECLAIM", Word(("1",)), "cluster.accelerator"))
    nccl = spec.network.nccl
    for name, value, field in (
        ("NCCL_IB_HCA", ",".join(nccl.ib_hca) or None, "ib_hca"),
        ("NCCL_IB_GID_INDEX", nccl.ib_gid_index, "ib_gid_index"),
        ("NCCL_CROSS_NIC", nccl.cross_nic, "cross_nic"),
        ("NCCL_PROTO", nccl.proto, "proto"),
        ("NCCL_SOCKET_IFNAME", nccl.socket_ifname, "socket_ifname"),
    ):
        if value is not None:
            env.append(EnvVar(name, Word((str(value),)), f"network.nccl.{field}"))
    if spec.ray.debug == "post_mortem":
        env.append(EnvVar("RAY_DEBUG_POST_MORTEM", Word(("1",)), "ray.debug"))
    elif spec.ray.debug == "legacy":
        env.append(EnvVar("RAY_DEBUG", Word(("legacy",)), "ray.debug"))
    return tuple(env)


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


def variant_specs(spec: Spec) -> list[tuple[tuple[tuple[str, Any], ...], Spec]]:
    """Every combination of the sweep's settings, in matrix order, as (settings, the variant's spec)."""
    if spec.sweep is None:
        return []
    keys = list(spec.sweep.matrix)
    out = []
    for index, values in enumerate(itertools.product(*spec.sweep.matrix.values())):
        verl = copy.deepcopy(spec.verl)
        for key, value in zip(keys, values):
            node = verl
            *parents, last = key.split(".")[1:]
            for part in parents:
                node = node.setdefault(part, {})
            node[last] = value
        experiment = f"{spec.experiment or spec.name}-v{index:03d}"
        out.append((tuple(zip(keys, values)), spec.model_copy(update={"verl": verl, "experiment": experiment})))
    return out


def variants(spec: Spec, schema: VerlSchema, engine: str) -> tuple[VariantIR, ...]:
    base = {o.key: o for o in overrides(spec, schema, engine)}
    out = []
    for index, (settings, variant) in enumerate(variant_specs(spec)):
        changed = tuple(o for o in overrides(variant, schema, engine) if base.get(o.key) != o)
        out.append(VariantIR(index, settings, changed, checkpoint_dir(variant)))
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
        ("gpus-per-node", spec.cluster.gpus_per_node),
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
        modules=s.modules,
        requeue=s.requeue_grace is not None,
    )


def normalized(spec: Spec) -> str:
    """The spec with every default filled in and its bases merged in, as YAML: what the bundle was built from."""
    return dump_yaml(spec.model_dump(mode="json", exclude={"extends"}))


def dump_yaml(data: Any) -> str:
    """Block-style YAML in the data's own key order."""
    return yaml_text.dump(data)
