"""What the slurm target cannot run: no sbatch directives; and a log folder Slurm cannot create."""

from __future__ import annotations

import os
from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.load import Sourced
from ...compiler.spec import Spec
from ...compiler.verl.check import NOTE
from .lower import log_dirs

LOG_FOLDER_NOTE = "Slurm does not create the folder"  # `verlc submit` creates it, and leaves this note out


def check_build(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    if spec.cluster.slurm is None:
        yield sourced.diagnostic(("cluster",), "the slurm target needs cluster.slurm (at least cpus_per_task)")
    for folder in log_dirs(spec):
        if "%" not in folder and not os.path.isdir(folder):  # relative to where sbatch is run
            field = "output" if spec.cluster.slurm and folder == os.path.dirname(spec.cluster.slurm.output) \
                else "error"
            yield sourced.diagnostic(("cluster", "slurm", field), (
                f"{NOTE}{LOG_FOLDER_NOTE} {folder}/ and the job dies without a log when it "
                f"is missing: run `mkdir -p {folder}` where you run sbatch (here: {os.getcwd()})"))
