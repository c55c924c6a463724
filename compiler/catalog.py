"""What the compiler knows of the targets: handed to it, never imported.

compiler/ does not import targets/ (tests/test_layering.py checks it). The target registry
(targets/__init__.py) makes a `Catalog` of its targets, and the composition root (verlc/) hands it to the
stages that need them: validation (each target's spec section), the checks, lowering (each built target's
part of the IR), `verlc diff`'s groups and the site profile's keys. A target is described by the `Target`
protocol below; targets/target.py implements it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pydantic import BaseModel

    from .diagnostics import Diagnostic
    from .ir import JobIR, TimeLimit
    from .load import Sourced
    from .spec import Spec
    from .verl.check import Selection


# How a target runs a pipeline's stages (compiler/stages.py): a job per stage, each once the one before it
# succeeded (its launcher's submit takes `after`), or the stages in turn in one job.
CHAIN, ONE_JOB = "a chain of jobs", "one job"


@dataclass(frozen=True)
class Section:
    """A target's own settings in a spec: where they go, their model, and the group `verlc diff` shows them in."""

    at: tuple[str, ...]  # ("kubernetes",) at the top level, or ("cluster", "slurm") inside the cluster section
    group: str  # resources, container, ...
    model: str  # the pydantic model's name in the target's section.py (imported only when the Spec is built)
    description: str


class Target(Protocol):
    """What the compiler asks of a target (targets/target.py's descriptor)."""

    @property
    def name(self) -> str: ...
    @property
    def section(self) -> Section | None: ...
    @property
    def runs_container(self) -> bool: ...
    @property
    def pipelines(self) -> str | None: ...  # how it runs a pipeline's stages: CHAIN, ONE_JOB, or None: it does not

    def check_pipeline(self, stages: Sequence[tuple[Sourced, JobIR]]) -> Iterator[Diagnostic]: ...
    @property
    def section_model(self) -> type[BaseModel]: ...

    def check_section(self, spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]: ...
    def check_build(self, spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]: ...
    def lower(self, spec: Spec, ir: JobIR) -> Any: ...
    def node_words(self, spec: Spec) -> list[str]: ...
    def time_limit(self, spec: Spec) -> TimeLimit | None: ...


@dataclass(frozen=True)
class Catalog:
    targets: tuple[Target, ...]
    spec: type[Spec]  # the Spec with every target's section (spec.with_sections)

    @classmethod
    def of(cls, targets: Iterable[Target]) -> Catalog:
        from .spec import with_sections

        targets = tuple(targets)
        return cls(targets, with_sections(tuple(t.name for t in targets),
                                          [(t.section, t.section_model) for t in targets if t.section is not None]))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.targets)

    def get(self, name: str) -> Target:
        """The target called `name` (one of names)."""
        return next(t for t in self.targets if t.name == name)

    def time_limit(self, spec: Spec) -> TimeLimit | None:
        """The limit some target's section puts on one run (the first; none bounds it where None)."""
        return next((limit for t in self.targets if (limit := t.time_limit(spec)) is not None), None)

    @property
    def top_sections(self) -> dict[str, str]:
        """The targets' own top-level sections of a spec (compose:, kubernetes:, ...) and their diff groups."""
        return {t.section.at[0]: t.section.group for t in self.targets if t.section and len(t.section.at) == 1}
