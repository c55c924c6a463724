"""Render the Slurm bundle: sbatch.sh from its view, plus the spec and manifest every bundle has."""

from __future__ import annotations

from ...compiler.ir import JobIR
from ..bundle import Bundle, File, finish
from ..jinja import environment
from .view import slurm_view


def render(ir: JobIR) -> Bundle:
    template = environment("verlc.targets.slurm").get_template("sbatch.sh.j2")
    script = template.render(view=slurm_view(ir))
    return finish(ir, "slurm", [File("sbatch.sh", script, 0o755)])
