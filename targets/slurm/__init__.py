"""The Slurm target: one sbatch script that brings up Ray in containers and runs verl."""

from .render import render

__all__ = ["render"]
