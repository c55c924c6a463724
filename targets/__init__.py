"""The targets verlc renders. `TARGETS` is the one list of them: the spec's `targets:`, the CLI's choices and
the docs come from it, and `CATALOG` is what the compiler gets of them (compiler/catalog.py: the Spec with
each target's section, the checks and lowering it calls). Each is one folder of the shape targets/target.py
describes; adding a target is adding a folder and a line here.

Importing this registers each target's descriptor only; a target's section model (with CATALOG), checks,
lowering, render and launcher are imported when first needed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from functools import cache

from . import compose, kuberay, ray_job, skypilot, slurm
from .target import Target

if TYPE_CHECKING:
    from ..compiler.catalog import Catalog
    from ..compiler.ir import JobIR
    from ..contract.launcher import Launcher
    from .bundle import Bundle

TARGETS: tuple[Target, ...] = (slurm.TARGET, ray_job.TARGET, compose.TARGET, kuberay.TARGET, skypilot.TARGET)
NAMES: tuple[str, ...] = tuple(t.name for t in TARGETS)


@cache
def _catalog() -> Catalog:
    from ..compiler.catalog import Catalog

    return Catalog.of(TARGETS)


def __getattr__(name: str) -> Catalog:
    """`CATALOG`, built on first use (it imports every section's model and builds the Spec): `verlc status` and
    the other commands that only ask a target's launcher do not pay for it."""
    if name == "CATALOG":
        return _catalog()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def get(name: str) -> Target:
    """The target called `name` (one of NAMES)."""
    return next(t for t in TARGETS if t.name == name)


def render(name: str, ir: JobIR) -> Bundle:
    """The bundle of target `name` for one compiled spec."""
    return get(name).render(ir)


def launcher(name: str) -> Launcher:
    """The target's lifecycle (its launch.py): submit, state, logs, cancel and attach with its own tools."""
    return get(name).launcher
