"""JobIR -> the Compose file as data. It goes out through a YAML serializer, never a template.

Compose interpolates `$` in every value, so literal text is escaped (`$$`) and only the spec's
${HOME}/${USER} references stay as Compose variables.
"""

from __future__ import annotations

from typing import Any

from ...compiler.derive import tracker_env
from ...compiler.ir import ContainerIR, JobIR, Var, Word
from ...runtime.protocol import RUNNER_STAGES, STOP_AFTER
from ..job_package import COMMAND, PACKAGE
from ..shared import OWN_SERVICE_PORT, path_list, persistent_home

HEAD = "ray-head"
RUN_LABEL = "verlc.run"
GCS_PORT = 6379
DASHBOARD_PORT = 8265
HELPER_DIR = "/opt/verlc"  # where ./verlc_job is mounted, on PYTHONPATH, in every service
SERVICE_PREFIX = "service-"  # a service in an image of its own: the Compose service `service-NAME`, at OWN_SERVICE_PORT


def text(value: str | Word) -> str:
    """A value for Compose: `$` escaped in literal text, spec variables as ${NAME}."""
    parts = value.parts if isinstance(value, Word) else (value,)
    return "".join(f"${{{p.name}}}" if isinstance(p, Var) else p.replace("$", "$$") for p in parts)


def _gpu_settings(ir: JobIR, c: ContainerIR, node: int) -> dict[str, Any]:
    """Node `node`'s GPUs: NVIDIA through a device reservation, AMD through /dev/kfd and /dev/dri; its NPUs
    (Ascend) as their device files, the node's share of the host's (each container numbers its own from 0)."""
    ids = [str(node * ir.gpus_per_node + i) for i in range(ir.gpus_per_node)]
    out: dict[str, Any] = {"privileged": True} if "--privileged" in c.gpu_args else {}
    if ir.accelerator == "npu":
        first = {f"/dev/davinci{i}" for i in range(ir.gpus_per_node)}  # the container's, on one node of its own
        return {**out, "devices": [f"/dev/davinci{i}" for i in ids] + [text(d) for d in c.devices if d not in first]}
    if ir.accelerator == "rocm":
        return {**out, "devices": [text(d) for d in c.devices], "group_add": ["video"]}
    out["deploy"] = {"resources": {"reservations": {"devices": [
        {"driver": "nvidia", "device_ids": ids, "capabilities": ["gpu"]}]}}}
    if c.devices:
        out["devices"] = [text(d) for d in c.devices]
    return out


def _service(ir: JobIR, c: ContainerIR, command: list[str], node: int | None) -> dict[str, Any]:
    assert c.image is not None
    # a bare NAME comes from the host: secrets, and the env vars the spec reads on "the node" (this host)
    env = [f"{e.name}={text(e.value)}" for e in ir.env if e.name != "PYTHONPATH"] + list(ir.secrets) \
        + list(ir.node_env)
    # the run's W&B run, from `verlc submit` (launch.py): unset where compose is run by hand
    env += list(tracker_env((e.name for e in ir.env), None))
    # verlc's job package on every node (Ray imports the helper's remote functions from it there), then the spec's
    env.append(f"PYTHONPATH={path_list(HELPER_DIR, *(text(e.value) for e in ir.env if e.name == 'PYTHONPATH'))}")
    checkpoints = checkpoint_mount(ir)
    service: dict[str, Any] = {
        "image": text(c.image),
        "init": True,
        "shm_size": c.shm_size,
        "working_dir": text(c.workdir),
        "environment": env,
        "volumes": [text(m) for m in c.mounts] + ([] if _own_hf_cache(c) else [f"{HF_VOLUME}:{HF_CACHE}"])
        + [f"./{PACKAGE}:{HELPER_DIR}/{PACKAGE}:ro"] + ([checkpoints] if checkpoints else []),
        "command": command,
    }
    if node is not None:
        service.update(_gpu_settings(ir, c, node))
    return service


# The Hugging Face cache of every container: the spec's mount where it has one there (Compose keeps one mount per
# target, so a second one would silently replace the user's cache), else a named volume that outlives the stack.
HF_CACHE = "/root/.cache/huggingface"
HF_VOLUME = "hf-cache"


def _mount_targets(c: ContainerIR) -> list[str]:
    return [text(m).split(":")[1] for m in c.mounts]


def _own_hf_cache(c: ContainerIR) -> bool:
    return any(t.rstrip("/") == HF_CACHE for t in _mount_targets(c))


CHECKPOINTS = "checkpoints"  # the bundle's folder for the checkpoints, where no mount of the spec's holds them


def checkpoint_mount(ir: JobIR) -> str | None:
    """The bind mount that puts verl's checkpoint folder on this host, for every service: each node's ranks
    write their own shards there (FSDP). None: one of the spec's mounts, on every service too, holds it."""
    c: ContainerIR = ir.part("compose")
    absolute = isinstance(ir.checkpoint_dir.parts[0], Var) or ir.checkpoint_dir.parts[0].startswith("/")
    path = text(ir.checkpoint_dir) if absolute else \
        f"{text(c.workdir)}/{text(ir.checkpoint_dir)}"  # verl writes relative to its working dir
    if "$" not in path and persistent_home(path, None, _mount_targets(c)) is not None:
        return None
    return f"./{CHECKPOINTS}:{path}"


def run_time_folders(ir: JobIR) -> tuple[str, ...]:
    """What runs write into the bundle folder: the run record, the checkpoints verlc mounts, and mount sources
    relative to it."""
    sources = [text(m).split(":")[0] for m in ir.part("compose").mounts]
    relative = [s.removeprefix("./").split("/")[0] for s in sources if not s.startswith(("/", "$", "~", "../"))]
    own = [CHECKPOINTS] if checkpoint_mount(ir) else []
    return tuple(sorted({"runs", *own, *(r for r in relative if r not in ("", "."))}))


def compose_file(ir: JobIR) -> dict[str, Any]:
    c: ContainerIR = ir.part("compose")
    assert c is not None and c.workdir is not None, "checks require a docker image for the compose target"
    ray_common = [ir.ray_resources, "--disable-usage-stats", *ir.ray.start_options]
    # The job runs on the head, as `ray job submit` runs a driver there: a Ray driver needs a Ray node of
    # its own (ray.init finds the cluster through the local raylet). `ray start` returns once the head is
    # up; the job is the container's main process, so the service ends with the job and its exit code.
    head = _service(ir, c, ["bash", "-c", text(f'ray start --head "$@" && exec {" ".join(COMMAND)}'), "verlc-head",
                            f"--port={GCS_PORT}", "--dashboard-host=0.0.0.0",
                            f"--dashboard-port={DASHBOARD_PORT}", *ray_common], 0)
    head["environment"].append(f"{STOP_AFTER}=${{{STOP_AFTER}:-{RUNNER_STAGES[-1]}}}")
    if ir.reproducible:
        head["environment"].append("VERLC_ACCEPT_CHANGES=${VERLC_ACCEPT_CHANGES:-}")
    head["volumes"] += ["./runs:/verlc/runs"]
    # The dashboard serves the Jobs API (code runs as the container's user): published on the host's
    # loopback only, unless the spec opens it, on the spec's dashboard port.
    host = f"{'' if ir.ray.expose_dashboard else '127.0.0.1:'}{ir.ray.dashboard_port or DASHBOARD_PORT}"
    head["ports"] = [f"{host}:{DASHBOARD_PORT}"]
    # What `docker ps` shows as the head's health. Nothing waits for it: podman without systemd never runs a
    # healthcheck, so a worker gated on it would never start; each worker waits for the head's GCS itself.
    head["healthcheck"] = {"test": ["CMD", "ray", "status", f"--address=127.0.0.1:{GCS_PORT}"],
                           "interval": "5s", "timeout": "10s", "retries": 60, "start_period": "10s"}
    head["restart"] = "no"
    # which verlc run the stack is (`verlc submit` sets VERLC_RUN; empty when brought up by hand): one bundle
    # is one stack, so a later run's `up` replaces an earlier run's containers, and its launcher must know whose
    # they are
    head["labels"] = {RUN_LABEL: "${VERLC_RUN:-}"}
    services = {HEAD: head}
    # A worker joins once the head's GCS port answers, within the spec's wait for the nodes (the runtime's ray
    # stage then waits for every node and GPU); it ends with the head's Ray, which it joined with --block.
    join = (f"deadline=$((SECONDS + {ir.ray.wait_seconds})); "
            f"until (exec 3<>/dev/tcp/{HEAD}/{GCS_PORT}) 2>/dev/null; do "
            f"if ((SECONDS >= deadline)); then echo \"the Ray head {HEAD}:{GCS_PORT} did not answer within "
            f"{ir.ray.wait_seconds}s\" >&2; exit 1; fi; sleep 1; done; exec ray start --block \"$@\"")
    for node in range(1, ir.nodes):
        worker = _service(ir, c, ["bash", "-c", text(join), "verlc-worker", f"--address={HEAD}:{GCS_PORT}",
                                  *ray_common], node)
        worker["depends_on"] = {HEAD: {"condition": "service_started"}}
        services[f"ray-worker-{node}"] = worker
    given = image_services(ir)
    for name, (_, variables) in given.items():
        head["environment"] += variables  # the runtime takes them (runtime/protocol.py)
        head.setdefault("depends_on", {})[name] = {"condition": "service_started"}
    return {"name": ir.name, "services": {**services, **{name: s for name, (s, _) in given.items()}},
            **({} if _own_hf_cache(c) else {"volumes": {HF_VOLUME: {}}})}


def image_services(ir: JobIR) -> dict[str, tuple[dict[str, Any], list[str]]]:
    """The services in images of their own (runtime/protocol.py), each a Compose service on the job's network,
    reached at its service name and a port of its own; its token from `verlc submit` (launch.py), which makes one
    for each run (by hand: export VERLC_SERVICE_<NAME>_TOKEN). The head starts once it has started, not once it is
    healthy: the runtime waits for it beside the bring-up, with its deadline and its probe (a healthcheck would
    need a client in the image, and podman without systemd runs none). Each with its variables, as the head's
    environment has them too."""
    out: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for index, s in enumerate(x for x in ir.services if x.image):
        variables = dict(s.variables)
        host, port = f"{SERVICE_PREFIX}{s.name}", OWN_SERVICE_PORT + index
        values = {variables["host"]: host, variables["port"]: str(port), variables["url"]: f"http://{host}:{port}"}
        # `${NAME:-}`, not `:?`: Compose interpolates the file for every command (ps, logs, down), not only `up`
        token = f"${{{variables['token']}:-}}"

        def word(w: Word, values: dict[str, str] = values) -> str:  # its own variables are known here
            return text(Word(tuple(values[p.name] if isinstance(p, Var) and p.name in values else p for p in w.parts)))

        given = [*(f"{k}={v}" for k, v in values.items()), f"{variables['token']}={token}"]
        out[host] = ({
            "image": s.image,
            "init": True,
            **({"command": [word(w) for w in s.argv]} if s.argv else {}),
            "environment": [*(f"{e.name}={text(e.value)}" for e in ir.env), *(f"{k}={word(w)}" for k, w in s.env),
                            *given],
            "restart": "no",
            "labels": {RUN_LABEL: "${VERLC_RUN:-}"},
        }, given)
    return out
