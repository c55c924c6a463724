"""What the slurm target cannot run: no sbatch directives, a loopback head on several nodes; and a log folder
Slurm cannot create."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.load import Sourced
from ...compiler.verl.check import Selection
from ...compiler.verl.program import saves_checkpoints
from ...compiler.code import has_code
from ...compiler.spec import NoContainer, Spec
from ...compiler.verl.check import NOTE
from ..shared import image_services_refused
from .lower import log_dirs
from .section import HINTS

LOG_FOLDER_NOTE = "Slurm does not create the folder"  # `verlc submit` creates it, and leaves this note out


def check_build(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    if spec.cluster.slurm is None:
        yield sourced.diagnostic(("cluster",), "the slurm target needs cluster.slurm (at least cpus_per_task)")
    if spec.network.head_interface == "lo" and spec.cluster.nodes > 1:
        yield sourced.diagnostic(("network", "head_interface"), (
            f"lo is the loopback interface: on {spec.cluster.nodes} nodes every worker would look for the Ray "
            f"head at its own 127.0.0.1; name the interface the nodes reach each other on, or leave it out"))
    c = spec.container
    if c.runtime not in ("docker", "podman", "apptainer"):
        yield from image_services_refused(spec, sourced, "slurm", (
            "the job runs on the nodes' own Python (container.runtime: none), with no engine to run it"
            if isinstance(c, NoContainer) else
            "verlc starts a service's own image with docker, podman or apptainer (container.runtime), not yet "
            "with pyxis (whose srun runs a command in an image, not the image's own entrypoint)"))
    if has_code(spec) and isinstance(c, NoContainer) and c.workdir is not None:
        yield sourced.diagnostic(("container", "workdir"), "the job runs in the run's code (code:) on every "
                                                           "node; drop container.workdir", at_key=True)
    elif has_code(spec) and not isinstance(c, NoContainer):
        yield sourced.diagnostic(("container", "workdir"), (
            f"{NOTE}the job runs in {c.workdir} inside the container: that folder must hold the run's code "
            f"(mount it there from storage every node sees); the preflight checks the files it names"))
    slurm, trainer = spec.cluster.slurm, spec.verl.get("trainer")
    given = isinstance(trainer, dict) and "save_freq" in trainer
    save_freq = trainer["save_freq"] if given else -1  # verl's default in every release: never
    default = "" if given else " (verl's default)"
    if (slurm is not None and slurm.time is not None and slurm.requeue_grace is not None
            and spec.program == "verl.trainer.main_ppo" and isinstance(save_freq, int) and save_freq <= 0):
        yield sourced.diagnostic(("cluster", "slurm", "time"), (
            f"{NOTE}trainer.save_freq is {save_freq}{default}: verl saves no "
            f"checkpoint, so a job requeued at the time limit (or after a preemption or a lost node) starts "
            f"training over, and one that reaches the limit again is not requeued; set trainer.save_freq"))
    if (isinstance(chosen, Selection) and slurm is not None and slurm.time is not None
            and slurm.requeue_grace is not None and not chosen.release.startup.get("expiry_save")
            and saves_checkpoints(spec.program)):
        yield sourced.diagnostic(("cluster", "slurm", "time"), (
            f"{NOTE}{chosen.release.label}'s trainer cannot save a checkpoint ahead of the time limit (verl's "
            f"should_save_ckpt_esi came with 0.5.0): the steps since its last trainer.save_freq checkpoint are "
            f"lost at each requeue"))
    if slurm is not None and slurm.mem is not None and slurm.mem.isdigit() and int(slurm.mem) > 0:
        yield sourced.diagnostic(("cluster", "slurm", "mem"), (
            f"{NOTE}Slurm reads a number without a unit as megabytes: --mem={slurm.mem} is {slurm.mem} MB per "
            f"node; write {slurm.mem}G for gigabytes"))
    for folder in log_dirs(spec):
        if "%" not in folder and not os.path.isdir(folder):  # relative to where sbatch is run
            field = "output" if spec.cluster.slurm and folder == os.path.dirname(spec.cluster.slurm.output) \
                else "error"
            yield sourced.diagnostic(("cluster", "slurm", field), (
                f"{NOTE}{LOG_FOLDER_NOTE} {folder}/ and the job dies without a log when it "
                f"is missing: run `mkdir -p {folder}` where you run sbatch (here: {os.getcwd()})"))


# The long options of sbatch (Slurm 22.05, which every later release keeps) that cluster.slurm.sbatch may pass:
# each is checked against the real sbatch by tests/test_slurm_options.py
SBATCH_OPTIONS = frozenset((
    "account acctg-freq array batch bb bbf begin chdir cluster-constraint clusters comment constraint container "
    "contiguous core-spec cores-per-socket cpu-freq cpus-per-gpu cpus-per-task deadline delay-boot dependency "
    "distribution error exclude exclusive export export-file extra get-user-env gid gpu-bind gpu-freq gpus "
    "gpus-per-node gpus-per-socket gpus-per-task gres gres-flags hint hold ignore-pbs input job-name "
    "kill-on-invalid-dep licenses mail-type mail-user mcs-label mem mem-bind mem-per-cpu mem-per-gpu mincpus network "
    "nice no-kill no-requeue nodefile nodelist nodes ntasks ntasks-per-core ntasks-per-gpu ntasks-per-node "
    "ntasks-per-socket open-mode output overcommit oversubscribe partition power prefer priority profile propagate "
    "qos reboot requeue reservation signal sockets-per-node spread-job switches test-only thread-spec "
    "threads-per-core time time-min tmp uid use-min-nodes wait-all-nodes wckey").split())
# Those verlc sets from a key of the spec, and those it sets itself, with why
FROM_SPEC = {
    **{o: f"cluster.slurm.{o.replace('-', '_')}" for o in (
        "cpus-per-task", "mem", "time", "partition", "account", "qos", "nodelist", "exclude", "exclusive",
        "constraint", "reservation", "output", "error", "mail-type", "mail-user")},
    "job-name": "name", "nodes": "cluster.nodes", "gpus-per-node": "cluster.gpus_per_node and cluster.gpu_type",
    "gpus": "cluster.gpus_per_node", "gpus-per-task": "cluster.gpus_per_node",
    "gres": "cluster.gpus_per_node (NPUs: cluster.slurm.npu_gres)", "array": "sweep (cluster.slurm.array_parallel)",
    "signal": "cluster.slurm.requeue_grace", "requeue": "cluster.slurm.requeue_grace",
    "no-requeue": "cluster.slurm.requeue_grace", "dependency": "stages (a pipeline chains its stages)",
}
FIXED = {
    "open-mode": "a requeued job appends to its log", "export": "the job exports the submitting shell's environment",
    "ntasks-per-node": "one task per node, Ray's", "ntasks": "one task per node, Ray's",
    "chdir": "the job runs where sbatch runs, as the bundle's relative paths expect",
}
OWNED = {**FROM_SPEC, **FIXED}


def check_section(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    """cluster.slurm.sbatch: sbatch's own options, and none that verlc sets itself."""
    slurm = spec.cluster.slurm
    for option in slurm.sbatch if slurm is not None else ():
        where = ("cluster", "slurm", "sbatch", option)
        if option in FROM_SPEC:
            yield sourced.diagnostic(where, f"verlc sets --{option} from {FROM_SPEC[option]}: set it there",
                                     at_key=True)
        elif option in FIXED:
            yield sourced.diagnostic(where, f"verlc sets --{option} itself: {FIXED[option]}", at_key=True)
        elif option == "hint" and slurm.sbatch[option] not in HINTS:
            near = difflib.get_close_matches(str(slurm.sbatch[option]), HINTS, n=1)
            yield sourced.diagnostic(where, f"sbatch takes --hint={' | '.join(HINTS)}; it refuses "
                                            f"{slurm.sbatch[option]!r}"
                                            + (f" (did you mean {near[0]}?)" if near else ""))
        elif option not in SBATCH_OPTIONS:
            near = difflib.get_close_matches(option, sorted(SBATCH_OPTIONS), n=1)
            yield sourced.diagnostic(where, f"sbatch has no option --{option}"
                                            + (f" (did you mean {near[0]}?)" if near else ""), at_key=True)
