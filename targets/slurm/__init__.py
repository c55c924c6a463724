"""The slurm target: one sbatch script that brings up Ray in containers and runs verl."""

from ...compiler.catalog import CHAIN
from ..target import Section, Target

TARGET = Target("slurm", __name__, Section(("cluster", "slurm"), "resources", "Slurm",
                                         "sbatch directives; the slurm target needs them."), runs_container=True,
                pipelines=CHAIN, saves_ahead=True)
