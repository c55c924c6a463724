"""JobIR -> SlurmView: every argv of the sbatch script, ready for the template to quote and print.

The template defines a few shell variables at run time (the head's IP, per-job ports, the
container name); argv here refers to them as `Var`s so they are quoted like everything else.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace

from ...compiler.derive import tracker_env
from ...compiler.ir import Arg, EnvVar, JobIR, Var, Word
from ..bundle import header_lines
from ..job_package import job_of, one_program
from ...runtime import protocol
from ...runtime.job import Expiry, Variant
from ...runtime.protocol import END_TIME, RECORD, RUNS
from .lower import SlurmIR
from .ports import PLAN, PortPlan

# Shell variables the template sets before it uses the argv below.
HEAD_IP, NODE_IP, RAY_PORT, DASHBOARD_PORT = Var("head_ip"), Var("node_ip"), Var("ray_port"), Var("dashboard_port")
CLIENT_PORT, AGENT_PORT, RAY_TMP, CONTAINER = Var("client_port"), Var("agent_port"), Var("ray_tmp"), Var("container")
STEP_LOCK = Var("step_lock")  # the file whose lock the container's step holds on the node (sbatch.sh.j2)
STEP_LOCK_FILE = Word(("/tmp/verlc-step-", Var("SLURM_JOB_ID"), "-", Var("SLURMD_NODENAME"), ".lock"))  # its value
STEP_LOCK_IN_CONTAINER = "/run/verlc-step.lock"
NODE_NAME, NODE_DEV = Var("SLURMD_NODENAME"), Var("node_dev")

CONTAINER_WORD = Word((CONTAINER,))

Line = tuple[Arg, ...]


@dataclass(frozen=True)
class VariantView:
    """What one array task of a sweep changes in the job, as one line of JSON (protocol.Variant)."""

    index: int
    json: str


@dataclass(frozen=True)
class ProtocolView:
    """What the script shares with the runtime and the lifecycle (runtime/protocol.py): the stages, the exit
    code of a lost node, and the run folder's files (under the script's `run_dir`)."""

    stages: tuple[str, ...] = protocol.STAGES
    node_lost: int = protocol.NODE_LOST
    job_log: Word = Word((Var("run_dir"), f"/{protocol.JOB_LOG}"))
    ray_logs: Word = Word((Var("run_dir"), f"/{protocol.RAY_LOGS}"))
    truncated: str = protocol.TRUNCATED
    attach: Word = Word((Var("run_dir"), f"/{protocol.ATTACH}"))
    time_limit_reached: Word = Word((Var("run_dir"), f"/{protocol.TIME_LIMIT_REACHED}"))


@dataclass(frozen=True)
class Stopping:
    """How a job stops inside Slurm's KillWait (30 s by default), in seconds: after the signal, each node's Ray
    gets TERM, KILL `ray_kill_after` later (in a container: the `docker exec` that runs it), then the node keeps
    Ray's logs; the container's own step waits up to `logs_wait` for those logs, then removes the container
    (which ends Ray there), in the `remove_within` left, of which it waits up to `lock_wait` for the engine's
    run command to exit before it removes the lock file. The batch script's cleanup waits KillWait less
    `cleanup_margin` for the steps, at most `cleanup_cap`."""

    ray_kill_after: int = 5
    logs_wait: int = 20
    remove_within: int = 8
    lock_wait: int = 5
    cleanup_margin: int = 2
    cleanup_cap: int = 30
    kill_wait: int = 30  # Slurm's default KillWait, which all of the above must fit

    def fits(self) -> bool:
        """Ray is stopped with time left to keep its logs before the container goes, and the container is
        removed before Slurm's KillWait runs out."""
        return (self.ray_kill_after < self.logs_wait // 2 and self.logs_wait + self.remove_within <= self.kill_wait
                and self.lock_wait < self.remove_within and self.cleanup_cap <= self.kill_wait)


@dataclass(frozen=True)
class ImageServiceView:
    """A service in an image of its own (runtime/protocol.py): the script starts its container on the head node
    in a step of its own, beside Ray's bring-up, after exporting its variables (host, port, url, token: the
    head's address, the services' block's port at `index`, a token made for the run), which the runtime gets too."""

    name: str
    index: int  # its port's place in the services' block (the runtime's order: the spec's)
    host: str
    port: str
    url: str
    token: str
    run: tuple[Line, ...]  # runs its container in the foreground, removed when it stops
    remove: Line  # removes its container (one left by an earlier attempt, or on the step's end); () for apptainer


def service_lines(ir: JobIR) -> tuple[str, ...]:
    """What a reviewer reads of each service at the script's top: where it runs, its port, when it is ready and
    what request checks it (the runtime does it all: runtime/services.py)."""
    lines = []
    for index, s in enumerate(ir.services):
        where = ("every node (127.0.0.1 there)" if s.every_node else f"a node of its own ({s.gpus} GPUs)"
                 if s.own_node else "the head node") + (", every interface" if s.listen_all else "")
        ready = (f"GET {s.ready_http} answers 2xx" if s.ready_http else
                 "its ready command exits 0" if s.ready_command else "its port accepts a connection")
        what = f"image {s.image}" if s.image else "the job's image"
        lines.append(f"  {s.name}: on {where}, in {what}; port ${dict(s.variables)['port']} (the job's services' "
                     f"port {index + 1})")
        lines.append(f"    ready when {ready} within {s.deadline} s of its start"
                     + (f", then one {s.probe.kind} request" if s.probe else "")
                     + (f"; started again up to {s.restart} time(s)" if s.restart else "")
                     + (f"; {s.gpu_memory:g} of each GPU's memory" if s.gpu_memory else ""))
    return ("Services, started beside Ray's bring-up and checked before the preflight:", *lines) if lines else ()


@dataclass(frozen=True)
class SlurmView:
    """Everything `sbatch.sh.j2` prints, already resolved; built by `slurm_view`."""

    header: tuple[str, ...]
    services: tuple[str, ...]  # the header's lines on the services (service_lines)
    directives: tuple[str, ...]
    log_dirs: tuple[str, ...]
    requeue: bool
    requeue_grace: int
    max_requeues: int
    modules: tuple[str, ...]
    env: tuple[EnvVar, ...]
    secrets: tuple[str, ...]
    nodes: int
    gpus_per_node: int
    hccl_ports: tuple[tuple[str, int, int], ...]  # (name, first, last): HCCL's (Ascend) and the services' ports
    ports: PortPlan  # the job's block of ports (ports.py)
    stopping: Stopping  # how long each part of a stop may take
    ray_port: int | None
    dashboard_port: int | None
    expose_dashboard: bool
    head_interface: str | None
    container_name: Word | None  # docker/podman: the job's container on the node named by shell variable `node`
    run_dir: Word
    workdir: Word | None  # `cd` here before anything runs (runtime none)
    venv: Word | None
    image_check: Line | None  # succeeds when the node has the image
    image_fetch: Line | None  # gets it where it has not: builds it (container.build) or pulls it
    end_file: Word | None  # where the script keeps the job's end time for the runtime (verl's save ahead of it)
    image_file: Word | None  # an image file pinned by its sha256 (image_sha256), checked on every node
    image_sha256: str | None
    container_run: tuple[Line, ...] | None  # runs the container in the foreground, removed when it stops
    container_remove: Line | None
    container_check: Line | None  # succeeds while the container exists
    step_lock: Word  # the file whose lock the container's step holds (docker/podman)
    step_args: Line
    exec_prefix: Line
    image_services: tuple[ImageServiceView, ...]
    services_block: str  # the variable the script exports the services' block of ports in (FIRST-LAST)
    ray_head: tuple[Line, ...]
    ray_worker: tuple[Line, ...]
    runtime_sockets: tuple[str, ...]  # variables the runtime's step gets as Ray's: its address's interface
    job: str  # the job the runtime runs (wait, data, preflight, train) as JSON; a sweep's without its varied keys
    variants: tuple[VariantView, ...]  # a sweep: each array task's changes to it
    runtime_file: str  # the runtime's file in the run folder
    runtime_source: str  # the runtime (runtime/) as one program, embedded after the job's logic
    runtime_banner: tuple[str, ...]
    protocol: ProtocolView = ProtocolView()


def _word(*parts: str | Var) -> Word:
    """A Word of these parts, adjacent text joined."""
    joined: list[str | Var] = []
    for part in parts:
        if isinstance(part, str) and joined and isinstance(joined[-1], str):
            joined[-1] += part
        else:
            joined.append(part)
    return Word(tuple(joined))


def run_id_words(ir: JobIR) -> tuple[str | Var, ...]:
    """The run id (protocol.run_id), as `verlc submit` records it (launch.py), from Slurm's variables in the job:
    its job id, and for a sweep's array task the array's job id and the task's index."""
    if ir.variants:
        return protocol.run_id_parts(ir.name, Var("SLURM_ARRAY_JOB_ID"), Var("SLURM_ARRAY_TASK_ID"))
    return protocol.run_id_parts(ir.name, Var("SLURM_JOB_ID"))


def job_env(ir: JobIR) -> tuple[EnvVar, ...]:
    """What the Slurm job adds to the environment; the spec's own env wins.

    A requeued job keeps its Slurm job id: the same id for Weights & Biases makes it continue the run it
    started (verl's wandb.init reads these) instead of opening a new one. Ray (2.5x on) drains a node for
    30 s on SIGTERM before stopping it, longer than Slurm leaves a cancelled job (KillWait, 30 s by
    default) to clean up and keep its logs: nothing in a verl job needs draining."""
    own = {e.name for e in ir.env}
    tracker = tracker_env(own, _word(*run_id_words(ir)))
    derived = (*(EnvVar(k, v if isinstance(v, Word) else _word(v), "verlc: requeues resume the W&B run")
                 for k, v in tracker.items()),
               EnvVar("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", _word("0"), "verlc: Ray stops within KillWait"))
    return tuple(e for e in derived if e.name not in own)


def image_services(ir: JobIR, env_names: tuple[str, ...]) -> tuple[ImageServiceView, ...]:
    """The services in images of their own, each run by the job's engine (docker, podman or apptainer: checks.py)
    on the head's network, with the job's env and its own, its arguments after its image. docker and podman name
    its container, which its step removes; apptainer's ends with its step's process (it passes the step's env)."""
    out = []
    for index, s in enumerate(ir.services):
        if s.image is None:
            continue
        engine, variables = ir.container.runtime, dict(s.variables)
        own_env = tuple(("--env", Word((f"{k}=", *w.parts))) for k, w in s.env)
        if engine == "apptainer":  # `run`: the image's own runscript (a Docker image's entrypoint), given the args
            run: tuple[Line, ...] = (("apptainer", "run"), *own_env, (s.image, *s.argv))
            remove: Line = ()
        else:
            name = _word(f"verlc-{ir.name}-", Var("SLURM_JOB_ID"), f"-service-{s.name}")
            run = ((engine, "run", "--rm", "--init", "--network=host", "--name", name),
                   *(("--env", n) for n in (*env_names, *variables.values())), *own_env, (s.image, *s.argv))
            remove = (engine, "rm", "--force", name)
        out.append(ImageServiceView(s.name, index, variables["host"], variables["port"], variables["url"],
                                    variables["token"], run, remove))
    return tuple(out)


RUNTIME_FILE = "verlc-runtime.py"
USR1_EARLY = 60  # how much earlier than asked Slurm may send --signal (event handling's resolution, sbatch(1))


def slurm_view(ir: JobIR) -> SlurmView:
    runtime = one_program()
    slurm: SlurmIR = ir.part("slurm")
    c = ir.container
    # HCCL's ports come from the job's block of ports (the template exports them once it has the block)
    own = {e.name for e in ir.env if e.origin == "env"}  # `auto`: HCCL picks them (compiler/derive.py)
    hccl_ports = tuple(h for h in PLAN.hccl if h[0] not in own) if ir.device == "NPU" else ()
    # and the services' ports (the runtime starts them: runtime/services.py), the same way
    hccl_ports += ((protocol.SERVICE_PORTS, *PLAN.services),) if ir.services else ()
    ports = tuple(name for name, *_ in hccl_ports)
    env = tuple(e for e in (*ir.env, *job_env(ir)) if e.name not in ports)
    env_names = (*(e.name for e in env), *ports, *ir.secrets, *ir.node_env)

    # The job's container on each node; docker/podman add the node's name, which keeps the names apart
    # where nodes share a host and its container store (pyxis keeps containers per node by itself).
    job_container = (f"verlc-{ir.name}-", Var("SLURM_JOB_ID"))
    image_check: Line | None = None
    image_fetch: Line | None = None
    container_run: tuple[Line, ...] | None = None
    container_remove: Line | None = None
    container_check: Line | None = None
    step_args: Line = ()
    exec_prefix: Line = ()
    if c.runtime in ("docker", "podman"):
        assert c.image is not None and c.workdir is not None
        # the image before the containers, on every node at once: its pull (or build) is a phase of its own in
        # the run's timeline, apart from the containers' start
        image_check = (c.runtime, "image", "inspect", c.image)
        image_fetch = (c.runtime, "build", "--file", c.build.dockerfile, "--tag", c.image, c.build.context) \
            if c.build else (c.runtime, "pull", c.image)
        container_run = (
            # In the foreground of a job step, whose task removes the container when Slurm ends the step
            # (after the node's Ray has kept its logs: --sig-proxy=false keeps the engine from passing the
            # signal straight into the container). Its own /dev/shm of shm_size (no --ipc=host: podman
            # refuses it beside --shm-size). Its main process waits for the lock the step's task holds, so
            # the container ends (and --rm removes it) as soon as that task is gone, however it went: also a
            # container the engine only started after the step had ended (a signal during its creation).
            (c.runtime, "run", "--rm", "--init", "--network=host", "--sig-proxy=false"),
            ("--name", CONTAINER_WORD),
            (f"--shm-size={c.shm_size}",),
            *((f"--device={d}",) for d in c.devices),
            *((c.gpu_args,) if c.gpu_args else ()),
            *(("--env", n) for n in env_names),
            *(("--volume", m) for m in c.mounts),
            ("--workdir", c.workdir),
            ("--volume", Word((STEP_LOCK, f":{STEP_LOCK_IN_CONTAINER}"))),
            *((a,) for a in c.run_args),
            (c.image, "flock", STEP_LOCK_IN_CONTAINER, "true"),
        )
        container_remove = (c.runtime, "rm", "--force", CONTAINER_WORD)
        container_check = (c.runtime, "container", "inspect", CONTAINER_WORD)
        # the variables of services in images of their own pass from the step's env into the runtime's
        given = tuple(a for s in ir.services if s.image for _, v in s.variables for a in ("--env", v))
        exec_prefix = (c.runtime, "exec", "--interactive", *given, CONTAINER_WORD)
    elif c.runtime == "apptainer":
        assert c.image is not None and c.workdir is not None
        exec_prefix = ("apptainer", "exec", *c.gpu_args,
                       *(a for m in c.mounts for a in ("--bind", m)), "--pwd", c.workdir, c.image)
    elif c.runtime == "pyxis":
        assert c.image is not None and c.workdir is not None
        step_args = (_word("--container-image=", *c.image.parts), _word("--container-name=", *job_container),
                     _word("--container-workdir=", *c.workdir.parts))
        if c.mounts:
            parts: list[str | Var] = ["--container-mounts="]
            for i, m in enumerate(c.mounts):
                parts += [","] * (i > 0) + list(m.parts)
            step_args += (Word(tuple(parts)),)

    ray_common: tuple[Line, ...] = (
        (ir.ray_resources,),
        (f"--num-cpus={slurm.ray_cpus}",),
        (_word("--temp-dir=", RAY_TMP),),
        (_word("--dashboard-agent-listen-port=", AGENT_PORT),),
        (_word("--node-name=", NODE_NAME),),  # Ray's name for the node (dashboard, preflight) is Slurm's
        ("--disable-usage-stats",),
        *((option,) for option in ir.ray.start_options),
    )
    # Ray's processes, and so verl's workers, open gloo's sockets on the interface of Ray's own address: gloo
    # would otherwise bind the address of the host name (127.0.1.1 on Debian). The spec's own env wins.
    # So does HCCL on Ascend NPUs, unless network.head_interface names the interface for it.
    sockets = ("GLOO_SOCKET_IFNAME", *(("HCCL_SOCKET_IFNAME",) if ir.device == "NPU" else ()))
    own_sockets = tuple(_word(f"{name}=", NODE_DEV) for name in sockets if name not in env_names)
    # the runtime's step on the head too: the trainers it starts there (torchrun's rank 0) open theirs alike
    head_sockets = tuple(name for name in sockets if name not in env_names)
    # Every process of the node's Ray keeps its temp files in Ray's temp dir, which the cleanup removes: the
    # dashboard's forkserver (Ray 2.4x on) leaves a /tmp/pymp-* folder at each stop otherwise. The spec's wins.
    own_tmp = (_word("TMPDIR=", RAY_TMP),) if "TMPDIR" not in env_names else ()
    ray_head = (
        ("env", *own_sockets, *own_tmp),
        ("ray", "start", "--head", "--block"),
        (_word("--node-ip-address=", HEAD_IP), _word("--port=", RAY_PORT)),
        # The dashboard serves the Jobs API, which runs code as this user: loopback unless the spec opens it.
        (f"--dashboard-host={'0.0.0.0' if ir.ray.expose_dashboard else '127.0.0.1'}",
         _word("--dashboard-port=", DASHBOARD_PORT)),
        (_word("--ray-client-server-port=", CLIENT_PORT),),
        *ray_common,
    )
    # A worker asks the GCS for the head node's record 20 times, 2 s apart, then gives up (Ray's
    # RAY_NUM_REDIS_GET_RETRIES): started beside the head on a loaded host it can ask before the head registered
    # ("No node info found for head node in GCS", seen on the test cluster). It asks until the bring-up's
    # deadline (ray.wait_for_nodes) instead.
    retries = f"RAY_NUM_REDIS_GET_RETRIES={max(20, ir.ray.wait_seconds // 2)}"
    ray_worker = (
        ("env", *own_sockets, *own_tmp, retries),
        ("ray", "start", "--block", _word("--address=", HEAD_IP, ":", RAY_PORT)),
        (_word("--node-ip-address=", NODE_IP),),
        *ray_common,
    )
    run_dir = _word(Var("SLURM_SUBMIT_DIR"), f"/{RUNS}/", *run_id_words(ir))
    record = Word((*run_dir.parts, f"/{RECORD}"))
    # verl (0.5.0 on) saves a checkpoint ahead of the deadline in expiry_variable: the job's end time, which the
    # script keeps in the run folder as Slurm has it (scontrol update moves it), less the USR1 lead before it
    end_file = Word((*run_dir.parts, f"/{END_TIME}"))
    # Slurm may send the --signal up to 60 s before the time it was asked for (sbatch(1)): the lead covers that
    expiry = Expiry(variable=ir.expiry_variable, lead=slurm.requeue_grace + USR1_EARLY if slurm.requeue_grace else 0,
                    end_file=end_file.as_json()) if ir.expiry_variable else None
    job = job_of(ir, record=record, expiry=expiry, run_folder=run_dir)
    variants = []
    if ir.variants:  # the base job without the varied keys; each array task adds its own values back
        varied = set(ir.varied_keys)
        job = replace(job, train=[*ir.program_argv, *(o.arg for o in ir.overrides if o.key not in varied)])
        for v in ir.variants:
            full = job_of(ir, record=record, variant=v, expiry=expiry, run_folder=run_dir)
            patch = Variant(label=full.variant, checkpoint_dir=full.checkpoint_dir, reference=full.reference,
                            train_overrides=[o.arg for o in ir.variant_overrides(v)])
            assert job.with_variant(patch) == full
            variants.append(VariantView(v.index, patch.to_json()))
    throttle = f"%{slurm.array_parallel}" if slurm.array_parallel else ""
    array = (f"--array=0-{len(ir.variants) - 1}{throttle}",) if ir.variants else ()
    return SlurmView(
        header=header_lines(ir),
        services=service_lines(ir),
        log_dirs=slurm.log_dirs,
        directives=(*(f"--{k}={v}" if v else f"--{k}" for k, v in slurm.directives), *array, "--export=ALL"),
        requeue=slurm.requeue,
        requeue_grace=slurm.requeue_grace,
        max_requeues=slurm.max_requeues,
        modules=slurm.modules,
        env=env,
        secrets=ir.secrets,
        nodes=ir.nodes,
        gpus_per_node=ir.gpus_per_node,
        hccl_ports=hccl_ports,
        ports=PLAN,
        stopping=Stopping(),
        ray_port=ir.ray.port,
        dashboard_port=ir.ray.dashboard_port,
        expose_dashboard=ir.ray.expose_dashboard,
        head_interface=ir.ray.head_interface,
        container_name=_word(*job_container, "-", Var("node")) if c.runtime in ("docker", "podman") else None,
        run_dir=run_dir,
        workdir=c.workdir if c.runtime == "none" else None,
        venv=c.venv,
        image_check=image_check,
        image_fetch=image_fetch,
        end_file=end_file if expiry else None,
        image_file=c.image if c.image_sha256 else None,
        image_sha256=c.image_sha256,
        container_run=container_run,
        container_remove=container_remove,
        container_check=container_check,
        step_lock=STEP_LOCK_FILE,
        step_args=step_args,
        exec_prefix=exec_prefix,
        image_services=image_services(ir, env_names),
        services_block=protocol.SERVICE_PORTS,
        ray_head=ray_head,
        ray_worker=ray_worker,
        runtime_sockets=head_sockets,
        job=job.to_json(),
        variants=tuple(variants),
        runtime_file=RUNTIME_FILE,
        runtime_source=runtime,
        runtime_banner=(f"runtime/ of verlc {ir.verlc_version}, as one program, sha256 "
                        f"{hashlib.sha256(runtime.encode()).hexdigest()}:",
                        "what every verlc bundle runs on the cluster (the others ship its modules as verlc_job/, after",
                        "their header). Nothing below is specific to this job."),
    )

