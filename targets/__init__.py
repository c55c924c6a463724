"""The targets verlc renders. `TARGETS` is the one list of them: the spec's `targets:`, the CLI's choices and
the docs come from it, and `CATALOG` is what the compiler gets of them (compiler/catalog.py: the Spec with
each target's section, the checks and lowering it calls). Each is one folder of the shape targets/target.py
describes; adding a target is adding a folder and a line here.

Importing this registers each target's descriptor and spec section only; a target's checks, lowering,
render and launcher are imported when it is first built or launched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..compiler.catalog import Catalog
from . import compose, kuberay, ray_job, skypilot, slurm
from .target import Target

if TYPE_CHECKING:
    from ..compiler.ir import JobIR
    from ..lifecycle.scheduler import Launcher
    from .bundle import Bundle

TARGETS: tuple[Target, ...] = (slurm.TARGET, ray_job.TARGET, compose.TARGET, kuberay.TARGET, skypilot.TARGET)
NAMES: tuple[str, ...] = tuple(t.name for t in TARGETS)
CATALOG = Catalog.of(TARGETS)


def get(name: str) -> Target:
    """The target called `name` (one of NAMES)."""
    return next(t for t in TARGETS if t.name == name)


def render(name: str, ir: JobIR) -> Bundle:
    """The bundle of target `name` for one compiled spec."""
    return get(name).render(ir)


def launcher(name: str) -> Launcher:
    """The target's lifecycle (its launch.py): submit, state, logs, cancel and attach with its own tools."""
    return get(name).launcher
