"""Render the Slurm bundle: sbatch.sh from its view, plus the spec and manifest every bundle has."""

from __future__ import annotations

import csv
import io
import json

from ...compiler.ir import JobIR
from ..bundle import Bundle, File, finish, header_lines
from ..jinja import environment
from .view import slurm_view


def render(ir: JobIR) -> Bundle:
    template = environment("verlc.targets.slurm").get_template("sbatch.sh.j2")
    script = template.render(view=slurm_view(ir))
    files = [File("sbatch.sh", script, 0o755)]
    if ir.variants:
        files.append(File("variants.csv", variants_table(ir)))
    return finish(ir, "slurm", files)


def variants_table(ir: JobIR) -> str:
    """The sweep as a table for people and tools: array index, experiment, each varied setting."""
    keys = [k for k, _ in ir.variants[0].settings]
    buf = io.StringIO()
    buf.write("".join(f"# {line}\n" for line in header_lines(ir)))
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["array_index", "experiment", "checkpoint_dir", *keys])
    for v in ir.variants:
        experiment = next(o.value for o in v.overrides if o.key == "trainer.experiment_name")
        writer.writerow([v.index, experiment, v.checkpoint_dir.display,
                         *(json.dumps(val) for _, val in v.settings)])
    return buf.getvalue()
