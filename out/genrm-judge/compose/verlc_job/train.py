# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The train stage: verl's trainer with the deadline of verl's save ahead of the job's end, watched for a
stall, a lost node and (torchrun on every node) the other nodes' trainers; and the guard against a requeued attempt
that would repeat the last one."""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

from .cluster import LOST_SETTLE, alive_nodes, connect, lost_nodes, node_label
from .data import saved_step
from .job import Expiry, RolloutMemory, expand
from .protocol import (FIRST_STEP, NODE_LOST, OUT_OF_MEMORY, STEP_LINE, TIME_LIMIT_REACHED, TRAIN_STARTS,
                       TRAINER_MESSAGE, TRAINER_MILESTONES, say, step_times_message)
from .services import Services
from .torchrun import OTHERS_GRACE, OtherNodes, every_node, free_port, torchrun_argv


RAY_JOB_CONFIG = "RAY_JOB_CONFIG_JSON_ENV_VAR"  # Ray's: the job-level runtime env its driver's ray.init() merges


def with_deadline(env: dict, expiry: Expiry | None) -> dict:
    """The trainer's environment with verl's deadline (expiry.variable, epoch seconds): the job's end as the
    target last saw it (in the file expiry.end_file, or the variable expiry.end_env) less the lead the target
    needs to stop cleanly. verl's trainer reads it in its own Ray actor, so it goes into the job's runtime env as
    well (Ray merges that with the one verl's ray.init() passes), which every actor and worker of the job gets;
    read at each start (a requeue too)."""
    if not expiry:
        return env
    try:
        if expiry.end_env:
            end = int(env[expiry.end_env])
        else:
            with open(expand(expiry.end_file or []), encoding="utf-8") as fh:
                end = int(fh.read().strip())
    except (KeyError, OSError, ValueError):
        say("the job's end time is not known here: verl saves checkpoints at trainer.save_freq only")
        return env
    deadline, name = end - expiry.lead, expiry.variable
    shown = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
    say(f"{name}={deadline}: verl saves a checkpoint once a step and a save no longer fit before {shown} (the "
        f"job's end, less {expiry.lead}s to stop cleanly)")
    return in_job_env(env, {name: str(deadline)})


def in_job_env(env: dict, variables: dict[str, str]) -> dict:
    """The trainer's environment with `variables`, also in its Ray job's runtime env (Ray merges it with the one
    verl's ray.init() passes), which every actor and worker of the job gets, on every node."""
    job = json.loads(env.get(RAY_JOB_CONFIG) or "{}")
    runtime_env = job.get("runtime_env") or {}
    runtime_env["env_vars"] = {**(runtime_env.get("env_vars") or {}), **variables}
    job["runtime_env"] = runtime_env
    return {**env, **variables, RAY_JOB_CONFIG: json.dumps(job)}


def repeats_last_attempt(checkpoint_dir: str, run_folder: str) -> str | None:
    """Why this attempt of a requeued job must not train, or None. Each attempt notes in the run folder the step
    of the latest checkpoint when its training began (train-start.json); the Slurm script notes an attempt
    stopped at the time limit (time-limit-reached). If the last attempt reached the limit and saved no newer
    checkpoint, this one would repeat the same steps and reach the limit again, requeue after requeue."""
    attempt = int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    starts_file = os.path.join(run_folder, TRAIN_STARTS)
    try:
        with open(starts_file, encoding="utf-8") as fh:
            starts = json.load(fh)
    except (OSError, ValueError):
        starts = {}
    try:
        with open(os.path.join(run_folder, TIME_LIMIT_REACHED), encoding="utf-8") as fh:
            at_limit = int(fh.read().strip())
    except (OSError, ValueError):
        at_limit = None
    now = saved_step(checkpoint_dir)
    last = str(attempt - 1)
    if attempt and at_limit == attempt - 1 and last in starts and starts[last] == now:
        since = f"step {now}" if now is not None else "none at all"
        return (f"the last attempt of this job ran to its time limit and saved no new checkpoint (the latest is "
                f"{since}, as when it began): training again would repeat the same steps and be stopped at the "
                f"limit again; not training. Raise cluster.slurm.time or lower trainer.save_freq")
    starts[str(attempt)] = now
    with open(starts_file + ".tmp", "w", encoding="utf-8") as fh:
        json.dump(starts, fh)
    os.replace(starts_file + ".tmp", starts_file)
    return None


def train(argv: list[str], env: dict, stall_timeout: int | None, address: str | None = None, nodes: int = 1,
          device: str = "GPU", services: Services | None = None, memory: RolloutMemory | None = None) -> int:
    """Run verl's trainer. With a stall timeout, end it when its output shows no new step for that long (124);
    with a Ray address, end it when Ray declares one of its nodes dead (NODE_LOST): verl would otherwise wait
    on the dead node's workers, in a collective that never returns. With `nodes` (a torchrun launch on every
    node): rank 0 here, the others as Ray tasks (OtherNodes); one node's failure stops them all, named. A service
    that fails for good (after its restarts) ends it too, named. Running out of memory is said, GPU or host
    (`memory`: the plan's prediction, to say beside it)."""
    ray = started = None
    if address:
        try:
            ray = connect(address)
            started = alive_nodes(ray)
        except Exception as exc:  # the cluster was checked just before: say so, but train anyway
            if nodes > 1:
                say(f"ERROR: cannot reach Ray to start torchrun on the other nodes: {exc}")
                return 1
            say(f"cannot watch Ray's nodes during training: {exc}")
    others = None
    if nodes > 1 and ray is not None:
        placed = every_node(ray, nodes, device)
        if isinstance(placed, str):
            say(f"ERROR: {placed}")
            return 1
        argv, others = on_other_nodes(ray, placed, argv, env, nodes, device)
    trainer = Trainer(argv, env, stall_timeout, others, services, memory)
    return trainer.watch(ray, started)


def on_other_nodes(ray, placed: tuple, argv: list[str], env: dict, nodes: int,  # noqa: ANN001
                   device: str) -> tuple[list[str], OtherNodes]:
    """The other nodes' torchrun started, and rank 0's argv (torchrun's static rendezvous at this node)."""
    own, rest = placed
    host, port = own["NodeManagerAddress"], free_port()
    say(f"torchrun on {nodes} nodes, rendezvous at {host}:{port}: node rank 0 {node_label(own)} (here), "
        + ", ".join(f"{rank} {node_label(n)}" for rank, n in enumerate(rest, 1)))
    added = {k: v for k, v in env.items() if os.environ.get(k) != v}  # each node's Ray has the job's env
    others = OtherNodes(ray, rest, lambda rank: torchrun_argv(argv, rank, host, port), added, device)
    return torchrun_argv(argv, 0, host, port), others


class Milestones:
    """verl's start-up milestones (protocol.TRAINER_MILESTONES) and its first step, each stamped once as an event
    line when the trainer prints it; then the median time between its step lines."""

    def __init__(self) -> None:
        self.left = list(TRAINER_MILESTONES)
        self.steps: list[float] = []

    def seen(self, line: str) -> bool:
        """Stamp what `line` shows; whether it is a step line."""
        for milestone in self.left:
            found = milestone[1].search(line)
            if found:
                self.left.remove(milestone)
                say(f"{TRAINER_MESSAGE}{milestone[0]}: {found[0][:200]}")
                break
        step = STEP_LINE.search(line)
        if step is None:
            return False
        keys = re.findall(r" - ([^\s:]+):", step[2])
        if keys and all(k.startswith("val") for k in keys):  # the validation before training (its step 0, or the
            return True  # checkpoint's step), not a training step
        if not self.steps:
            say(f"{TRAINER_MESSAGE}{FIRST_STEP} (step {step[1]})")
        self.steps.append(time.monotonic())
        return True

    def summary(self) -> None:
        gaps = [b - a for a, b in zip(self.steps, self.steps[1:])]
        if gaps:
            say(step_times_message(len(self.steps), statistics.median(gaps)))


class OutOfMemory:
    """Says, once each, that the trainer's processes ran out of a GPU's memory or of a node's host memory
    (protocol.OUT_OF_MEMORY), with what verlc's plan predicted for each GPU (`memory`: the job's)."""

    def __init__(self, memory: RolloutMemory | None) -> None:
        self.memory, self.said = memory, set()

    def seen(self, line: str) -> None:
        for kind, pattern in OUT_OF_MEMORY:
            found = pattern.search(line)
            if found is None or kind in self.said:
                continue
            self.said.add(kind)
            shown = line.strip()[:240]
            if kind == "host":
                say(f"ERROR: a node ran out of host memory, not GPU memory ({shown}): Ray's memory monitor killed a "
                    f"worker; give the trainer's nodes more memory (cluster.slurm.mem), or keep less on the CPU "
                    f"(param_offload, optimizer_offload)")
            elif self.memory is not None and (peak := self.memory.peak()) is not None:
                say(f"ERROR: verl ran out of GPU memory ({shown}); verlc's plan: {peak.bytes / 2 ** 30:.1f} GiB of "
                    f"each GPU at the peak ({peak.name}); `verlc plan` shows each phase and what would fit")
            else:
                say(f"ERROR: verl ran out of GPU memory ({shown}); `verlc plan` predicts each phase's memory where "
                    f"the spec gives model_shape (the model's config.json)")


class Trainer:
    """verl's trainer as a process group of its own: its output relayed (stamping its start-up milestones, and
    watching its step lines for a stall), the job's TERM and INT passed on, and ended, with the other nodes'
    trainers, whatever stops it."""

    def __init__(self, argv: list[str], env: dict, stall_timeout: int | None, others: OtherNodes | None,
                 services: Services | None = None, memory: RolloutMemory | None = None) -> None:
        self.stall_timeout, self.others, self.services = stall_timeout, others, services
        self.out_of_memory = OutOfMemory(memory)
        self.proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.last_step = time.monotonic()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        self.reader = threading.Thread(target=self.relay, daemon=True)
        self.reader.start()

    def on_signal(self, signum: int, _frame: object) -> None:
        """The job is ending (scancel, a time limit): the trainer has a session of its own, so pass the signal on;
        every node's Ray is being stopped too."""
        try:
            os.killpg(self.proc.pid, signum)
        except ProcessLookupError:
            pass
        if self.others:
            self.others.stop(within=0)
        sys.exit(128 + signum)

    def relay(self) -> None:
        milestones = Milestones()
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            sys.stdout.write(line)
            sys.stdout.flush()
            self.out_of_memory.seen(line)
            if milestones.seen(line):
                self.last_step = time.monotonic()
        milestones.summary()

    def end(self, code: int) -> int:
        """Stop the trainer (TERM, then KILL after 30 s) and the other nodes'; `code` is the run's."""
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.others:
            self.others.stop()
        self.reader.join(5)
        return code

    def watch(self, ray, started: list[dict] | None) -> int:  # noqa: ANN001
        """Until the trainer exits: a stall (124), another node's trainer failing (1), a node Ray declares dead
        (NODE_LOST) end it; then the other nodes' trainers are given OTHERS_GRACE to end well."""
        checked = time.monotonic()
        while self.proc.poll() is None:
            if self.stall_timeout and time.monotonic() - self.last_step > self.stall_timeout:
                say(f"ERROR: no new training step for {self.stall_timeout}s (stall_timeout): stopping the run")
                return self.end(124)
            failed = self.others.failed() if self.others else None
            if failed:
                say(f"ERROR: {failed}: stopping the run")
                return self.end(1)
            if time.monotonic() - checked >= 2:
                checked = time.monotonic()
                if started and lost_during_training(ray, started):
                    return self.end(NODE_LOST)
                failed = self.services.failed() if self.services else None
                if failed:
                    say(f"ERROR: {failed}: stopping the run")
                    return self.end(1)
            time.sleep(1)
        self.reader.join(5)
        if self.others and self.proc.returncode == 0:
            failed = self.others.finish(OTHERS_GRACE)
            if failed:
                say(f"ERROR: {failed}")
                return 1
        elif self.others:
            self.others.stop()
        return self.proc.returncode


def lost_during_training(ray, started: list[dict]) -> bool:  # noqa: ANN001
    """Whether Ray declared nodes of `started` dead (said, naming each): nodes cut off together are declared dead
    within a few health-check periods of each other, so one message waits LOST_SETTLE for the rest."""
    try:
        lost = lost_nodes(ray, started)
    except Exception:  # a slow answer from the GCS is not a lost node
        return False
    if not lost:
        return False
    settle = time.monotonic() + LOST_SETTLE
    while time.monotonic() < settle and len(lost) < len(started) - 1:
        time.sleep(0.5)
        try:
            lost = lost_nodes(ray, started) or lost
        except Exception:
            pass
    names = ", ".join(node_label(n) for n in lost)
    whole = len(started) > 2 and len(lost) == len(started) - 1
    say(f"ERROR: Ray declared node(s) {names} dead during training (they stopped answering its health checks; "
        "ray.node_timeout): stopping the run" + (
            "; every other node at once: this head node may have lost its network" if whole else ""))
    return True
