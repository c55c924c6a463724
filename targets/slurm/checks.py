"""What the slurm target cannot run: no sbatch directives, a loopback head on several nodes; and a log folder
Slurm cannot create."""

from __future__ import annotations

import os
from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.load import Sourced
from ...compiler.verl.check import Selection
from ...compiler.code import has_code
from ...compiler.spec import NoContainer, Spec
from ...compiler.verl.check import NOTE
from .lower import log_dirs

LOG_FOLDER_NOTE = "Slurm does not create the folder"  # `verlc submit` creates it, and leaves this note out


def check_build(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
    if spec.cluster.slurm is None:
        yield sourced.diagnostic(("cluster",), "the slurm target needs cluster.slurm (at least cpus_per_task)")
    if spec.network.head_interface == "lo" and spec.cluster.nodes > 1:
        yield sourced.diagnostic(("network", "head_interface"), (
            f"lo is the loopback interface: on {spec.cluster.nodes} nodes every worker would look for the Ray "
            f"head at its own 127.0.0.1; name the interface the nodes reach each other on, or leave it out"))
    c = spec.container
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
            and slurm.requeue_grace is not None and not chosen.release.startup.get("expiry_save")):
        yield sourced.diagnostic(("cluster", "slurm", "time"), (
            f"{NOTE}{chosen.release.label}'s trainer cannot save a checkpoint ahead of the time limit (verl's "
            f"should_save_ckpt_esi came with 0.5.0): the steps since its last trainer.save_freq checkpoint are "
            f"lost at each requeue"))
    for folder in log_dirs(spec):
        if "%" not in folder and not os.path.isdir(folder):  # relative to where sbatch is run
            field = "output" if spec.cluster.slurm and folder == os.path.dirname(spec.cluster.slurm.output) \
                else "error"
            yield sourced.diagnostic(("cluster", "slurm", field), (
                f"{NOTE}{LOG_FOLDER_NOTE} {folder}/ and the job dies without a log when it "
                f"is missing: run `mkdir -p {folder}` where you run sbatch (here: {os.getcwd()})"))
