"""Spec -> the slurm target's part of the IR: the sbatch directives, log folders and requeueing."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ...compiler.ir import JobIR
from ...compiler.spec import Spec


@dataclass(frozen=True)
class SlurmIR:
    directives: tuple[tuple[str, str], ...]  # (option, value) in a fixed order
    log_dirs: tuple[str, ...]  # folders of --output/--error: Slurm opens the files before the script runs
    modules: tuple[str, ...]
    ray_cpus: int  # Ray gets exactly the task's CPUs (ray start --num-cpus)
    requeue: bool  # on USR1: clean up, then `scontrol requeue`
    requeue_grace: int  # seconds before the time limit that USR1 comes
    max_requeues: int
    array_parallel: int | None  # a sweep's array tasks at once (--array=...%N)


def log_dirs(spec: Spec) -> tuple[str, ...]:
    """The folders of the job's --output/--error files. Slurm opens them before the script runs, so it
    cannot create them, and a missing one kills the job with no log at all."""
    s = spec.cluster.slurm
    if s is None:
        return ()
    return tuple(sorted({os.path.dirname(f) for f in (s.output, s.error) if f and os.path.dirname(f)}))


def accelerators(spec: Spec) -> list[tuple[str, str | int | None]]:
    """The node's GPUs (a typed GRES when the spec names the GPU model), or its NPUs as the site's GRES."""
    c, s = spec.cluster, spec.cluster.slurm
    assert s is not None
    typed = f"{c.gpu_type}:{c.gpus_per_node}" if c.gpu_type and s.typed_gpus else c.gpus_per_node
    if c.accelerator != "npu":
        return [("gpus-per-node", typed)]
    return [("gres", f"{s.npu_gres}:{typed}")] if s.npu_gres else []


def lower(spec: Spec, ir: JobIR) -> SlurmIR:
    s = spec.cluster.slurm
    assert s is not None, "the checks refuse the slurm target without cluster.slurm"
    directives: list[tuple[str, str | int | None]] = [
        ("job-name", spec.name),
        ("nodes", ir.nodes),  # the trainer's and the services' own
        ("ntasks-per-node", 1),  # one Ray node per host; Ray schedules the GPUs
        ("cpus-per-task", s.cpus_per_task),
        *accelerators(spec),
        ("mem", s.mem),
        ("time", s.time),
        ("partition", s.partition),
        ("account", s.account),
        ("qos", s.qos),
        ("nodelist", s.nodelist),
        ("exclude", s.exclude),
        ("exclusive", "" if s.exclusive else None),
        ("constraint", s.constraint),
        ("reservation", s.reservation),
        ("output", s.output),
        ("error", s.error),
        ("mail-type", ",".join(s.mail_type) or None),
        ("mail-user", s.mail_user),
        *sorted((option, "" if value is True else str(value)) for option, value in s.sbatch.items()),
    ]
    if s.requeue_grace is not None:
        directives += [
            ("signal", f"B:USR1@{s.requeue_grace}"),  # to the batch shell, whose trap stops and requeues
            ("requeue", ""),
            ("open-mode", "append"),  # keep the first run's log when the job restarts
        ]
    else:  # the spec decides, not the site's JobRequeue: otherwise a node failure would restart the job anyway
        directives.append(("no-requeue", ""))
    return SlurmIR(
        directives=tuple((k, str(v)) for k, v in directives if v is not None),
        log_dirs=log_dirs(spec),
        modules=s.modules,
        ray_cpus=s.cpus_per_task,
        requeue=s.requeue_grace is not None,
        requeue_grace=s.requeue_grace or 0,
        max_requeues=s.max_requeues,
        array_parallel=s.array_parallel,
    )
