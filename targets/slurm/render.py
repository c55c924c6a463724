"""Render the Slurm bundle: sbatch.sh from its view, plus the spec and manifest every bundle has."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

from ...compiler.ir import JobIR
from ..bundle import Bundle, File, finish, finish_chain, header_lines
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


@dataclass(frozen=True)
class ChainStage:
    name: str  # the stage's own name
    bundle: str  # its bundle's folder, relative to out/


@dataclass(frozen=True)
class ChainView:
    name: str
    header: tuple[str, ...]
    secrets: tuple[str, ...]
    log_dirs: tuple[str, ...]
    stages: tuple[ChainStage, ...]


def chain_view(irs: list[JobIR]) -> ChainView:
    first = irs[0]
    assert first.pipeline is not None
    return ChainView(
        name=first.pipeline.name,
        header=header_lines(first),
        secrets=tuple(dict.fromkeys(s for ir in irs for s in ir.secrets)),
        log_dirs=tuple(sorted({d for ir in irs for d in ir.part("slurm").log_dirs})),
        stages=tuple(ChainStage(ir.pipeline.stage, Bundle(ir.name, "slurm", (), profile=ir.profile[0] if ir.profile
                                                           else None).folder) for ir in irs if ir.pipeline),
    )


def render_chain(irs: list[JobIR]) -> Bundle:
    """out/<pipeline>/slurm/: submit.sh, which submits each stage's sbatch.sh after the one before it."""
    template = environment("verlc.targets.slurm").get_template("chain.sh.j2")
    return finish_chain(irs, "slurm", [File("submit.sh", template.render(view=chain_view(irs)), 0o755)])
