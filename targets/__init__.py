"""Targets turn a JobIR into a Bundle of files. Adding a target means adding a folder and a line here.

A target's code is imported when it is first rendered, so building one target loads only that one.
"""

from __future__ import annotations

from importlib import import_module
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..compiler.ir import JobIR
    from .bundle import Bundle

TARGETS: dict[str, str] = {  # target name -> its folder under targets/, whose `render(JobIR) -> Bundle` builds it
    "slurm": "slurm",
    "ray-job": "ray_job",
    "compose": "compose",
    "kuberay": "kuberay",
    "skypilot": "skypilot",
}


def render(target: str, ir: JobIR) -> Bundle:
    """The bundle of `target` for one compiled spec."""
    return import_module(f".{TARGETS[target]}", __name__).render(ir)


def launcher(target: str) -> ModuleType:
    """The target's lifecycle module (`launch.py`): submit, state, logs and cancel with its own tools."""
    return import_module(f".{TARGETS[target]}.launch", __name__)
