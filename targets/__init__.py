"""Targets turn a JobIR into a Bundle of files. Adding a target means adding a folder and a line here."""

from __future__ import annotations

from collections.abc import Callable

from ..compiler.ir import JobIR
from .bundle import Bundle
from .compose import render as render_compose
from .ray_job import render as render_ray_job
from .slurm import render as render_slurm

TARGETS: dict[str, Callable[[JobIR], Bundle]] = {
    "slurm": render_slurm,
    "ray-job": render_ray_job,
    "compose": render_compose,
}
