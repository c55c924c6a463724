"""Values verlc derives from a spec, needed by both the checks and the lowering.

Below both stages: the checks refuse a spec that contradicts a derived value, and the lowering writes
them out. Nothing here looks at verl's schema; verl's facts live in compiler/verl/.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .ir import EnvVar, Word
from .spec import Spec

T = TypeVar("T")


@dataclass(frozen=True)
class Derived:
    """A verl key whose value verlc fills in from another part of the spec."""

    key: str
    value: Any
    source: str  # the spec path it is derived from


def critic_in_use(verl: dict[str, Any], config: dict[str, Any] | None = None) -> bool:
    """verl builds a critic for GAE unless critic.enable says otherwise: the spec's values, else the composed
    config's (a program's own config may choose another estimator), else verl's default estimator, GAE."""
    def given(section: str, key: str) -> tuple[bool, Any]:
        for tree in (verl, config or {}):
            node = tree.get(section)
            if isinstance(node, dict) and key in node:
                return True, node[key]
        return False, None

    found, enable = given("critic", "enable")
    if found and enable is not None:
        return bool(enable)
    found, estimator = given("algorithm", "adv_estimator")
    return estimator == "gae" if found else True


def rollout_pool(verl: dict[str, Any]) -> tuple[Any, Any] | None:
    """(rollout.nnodes, rollout.n_gpus_per_node) where the spec gives the rollout a pool of its own: verl's
    asynchronous programs (fully_async_policy, one_step_off_policy) place the trainer and the rollout on
    separate GPUs, trainer.n_gpus_per_node + rollout.n_gpus_per_node of each node."""
    pool = verl.get("rollout")
    if isinstance(pool, dict) and ("n_gpus_per_node" in pool or "nnodes" in pool):
        return pool.get("nnodes"), pool.get("n_gpus_per_node")
    return None


# Where verl's programs take the model from, in their own configs: PPO's actor (and critic), the SFT engine's
# and generation's model.path, fsdp_sft_trainer's model.partial_pretrain (verl 0.3-0.7.0).
MODEL_KEYS = ("actor_rollout_ref.model.path", "model.path", "model.partial_pretrain")


def has_key(tree: dict[str, Any], key: str) -> bool:
    """Whether the composed config `tree` has the dotted `key`."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


# A spec's tool_config: the runtime writes it on every node, at a path it puts in this variable; verl's key reads it.
TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
TOOL_CONFIG_VARIABLE = "VERLC_TOOL_CONFIG"


def derived(spec: Spec, tree: dict[str, Any]) -> tuple[Derived, ...]:
    """Every verl key verlc sets itself that the program's composed config (`tree`) has; setting one to another
    value under `verl:` is an error. With a rollout pool of its own (rollout_pool), the trainer gets the rest of
    each node's GPUs."""
    pool = rollout_pool(spec.verl)
    rollout_gpus = pool[1] if pool and isinstance(pool[1], int) and not isinstance(pool[1], bool) else 0
    items = [
        Derived("trainer.nnodes", spec.cluster.nodes, "cluster.nodes"),
        Derived("trainer.n_gpus_per_node", spec.cluster.gpus_per_node - rollout_gpus,
                "cluster.gpus_per_node" + (" - verl.rollout.n_gpus_per_node" if rollout_gpus else "")),
        Derived("trainer.project_name", spec.project, "project"),
        Derived("trainer.experiment_name", spec.experiment or spec.name,
                "experiment" if spec.experiment else "name"),
        # the first place the program's config takes its model from (PPO's actor, else an SFT trainer's)
        Derived(next((k for k in MODEL_KEYS if has_key(tree, k)), MODEL_KEYS[0]), spec.model_path, "model"),
        Derived("data.train_files", list(spec.data.train_files), "data.train_files"),
        Derived("data.val_files", list(spec.data.val_files), "data.val_files"),
        # verl's generation and evaluation read one file: the spec's first (generation's prompts, evaluation's
        # generated responses)
        Derived("data.path", spec.data.train_files[0], "data.train_files"),
    ]
    if critic_in_use(spec.verl):
        items.append(Derived("critic.model.path", spec.model_path, "model"))
    if spec.tool_config is not None:
        items.append(Derived(TOOL_CONFIG_KEY, "${oc.env:" + TOOL_CONFIG_VARIABLE + "}", "tool_config"))
    return tuple(d for d in items if has_key(tree, d.key))


def own_checkpoint_dir(spec: Spec) -> str | None:
    """trainer.default_local_dir as the spec writes it, if it does."""
    trainer = spec.verl.get("trainer")
    given = trainer.get("default_local_dir") if isinstance(trainer, dict) else None
    return str(given) if given else None


def checkpoint_dir(spec: Spec) -> str:
    """Where verl saves checkpoints: trainer.default_local_dir, or verl's default for this run."""
    return own_checkpoint_dir(spec) or f"checkpoints/{spec.project}/{spec.experiment or spec.name}"


def strings_in(value: Any) -> list[str]:
    """Every string in a verl value (lists and mappings walked), in order."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for v in value for t in strings_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in strings_in(v)]
    return []


def resume_defaults(spec: Spec, tree: dict[str, Any]) -> dict[str, Any]:
    """Written out unless the spec sets them, so that a requeued or re-run job finds its checkpoints
    where the first run put them (verl's own default interpolates names that could change); those of the
    two keys the program's config (`tree`) has."""
    return {k: v for k, v in (("trainer.default_local_dir", checkpoint_dir(spec)), ("trainer.resume_mode", "auto"))
            if has_key(tree, k)}


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
    if spec.cluster.accelerator == "npu":
        env += npu_environment(spec)
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
    if spec.ray.node_timeout is not None:  # read by Ray's GCS when the head starts: dead after 5 failed checks,
        period = str(max(500, spec.ray.node_timeout * 100))  # each a period's wait, then a timeout's
        for name, value in (("RAY_health_check_period_ms", period), ("RAY_health_check_timeout_ms", period),
                            ("RAY_health_check_failure_threshold", "5")):
            env.append(EnvVar(name, Word((value,)), "ray.node_timeout"))
    if spec.ray.debug == "post_mortem":
        env.append(EnvVar("RAY_DEBUG_POST_MORTEM", Word(("1",)), "ray.debug"))
    elif spec.ray.debug == "legacy":
        env.append(EnvVar("RAY_DEBUG", Word(("legacy",)), "ray.debug"))
    return tuple(env)


# HCCL's host and NPU socket ports: two ranges of a job's block of 100 ports (below 32768, Linux's first
# ephemeral port, and above Ray's worker ports). The Slurm script derives the block from the job id, like
# its Ray ports; a target whose job has the network to itself (a host, a pod) uses the first block.
HCCL_PORTS = {"HCCL_HOST_SOCKET_PORT_RANGE": (10, 54), "HCCL_NPU_SOCKET_PORT_RANGE": (55, 99)}
PORT_BLOCK = 20000


def npu_environment(spec: Spec) -> list[EnvVar]:
    """Ascend NPUs as verl's Ascend guide sets them up: every NPU of the node visible, Ray leaving that to
    verl's workers, and HCCL's interface, timeouts and ports."""
    devices = Word((",".join(str(i) for i in range(spec.cluster.gpus_per_node)),))
    env = [EnvVar("ASCEND_RT_VISIBLE_DEVICES", devices, "cluster.gpus_per_node"),
           EnvVar("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES", Word(("1",)), "cluster.accelerator")]
    hccl = spec.network.hccl
    if spec.network.head_interface:  # else the Slurm script sets it to the interface of Ray's address
        env.append(EnvVar("HCCL_SOCKET_IFNAME", Word((spec.network.head_interface,)), "network.head_interface"))
    env += [EnvVar("HCCL_CONNECT_TIMEOUT", Word((str(hccl.connect_timeout),)), "network.hccl.connect_timeout"),
            EnvVar("HCCL_EXEC_TIMEOUT", Word((str(hccl.exec_timeout),)), "network.hccl.exec_timeout")]
    env += [EnvVar(name, Word((f"{PORT_BLOCK + first}-{PORT_BLOCK + last}",)), "verlc: HCCL ports of the job")
            for name, (first, last) in HCCL_PORTS.items() if not hccl_picks_ports(spec, name)]
    return env


def hccl_picks_ports(spec: Spec, name: str) -> bool:
    """Whether the spec leaves HCCL's ports of `name` to HCCL (`auto`, as verl's own runtime env sets them):
    HCCL then takes them from the OS's ephemeral ports, which no job's block reaches (PORT_BLOCK + 100 per
    block, below 32768), so verlc's port plan leaves that variable out."""
    return name in HCCL_PORTS and str(spec.env.get(name, "")) == "auto"


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
                if not isinstance(node.get(part), dict):
                    node[part] = {}  # a null default (or a value) that the sweep fills with keys
                node = node[part]
            node[last] = value
        experiment = f"{spec.experiment or spec.name}-v{index:03d}"
        given = own_checkpoint_dir(spec)
        if given is not None and "verl.trainer.default_local_dir" not in spec.sweep.matrix \
                and "experiment_name}" not in given:
            # One folder for every variant would make them resume from each other's checkpoints and share
            # one first-run record: each variant checkpoints under the given folder, in one of its own.
            verl["trainer"]["default_local_dir"] = f"{given.rstrip('/')}/{experiment}"
        out.append((tuple(zip(keys, values)), spec.model_copy(update={"verl": verl, "experiment": experiment})))
    return out


def tracker_env(own: Iterable[str], run: T) -> dict[str, T | str]:
    """The experiment tracker's run of a run, set on every node (verl's trainer logs from a Ray actor, which has
    its node's env): W&B's run id is verlc's run id, which a Slurm requeue, a RayJob retry, a SkyPilot recovery
    and `verlc submit --resume` keep, so that one run is one curve. What the spec's own env sets wins."""
    names = set(own)
    return {k: v for k, v in (("WANDB_RUN_ID", run), ("WANDB_RESUME", "allow")) if k not in names}
