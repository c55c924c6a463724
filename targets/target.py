"""What a target is: one folder under targets/ of a fixed shape, described by one `Target`.

    targets/<folder>/
      __init__.py   TARGET = Target(name, __name__, Section(where, group, "Model", description))
                    (the registry in targets/__init__.py lists it)
      section.py    its spec section, the pydantic model Section names (the Spec gets it from the registry), and
                    optionally
                    node_words(spec): the section's words that expand on the nodes
                    time_limit(spec): how long one run may take (compiler/catalog.py's TimeLimit)
      checks.py     check_build(spec, sourced, chosen): what this target cannot run of the spec and its verl
                    release or commit (`chosen`; only when it is built), and
                    check_section(spec, sourced) where the section has problems pydantic cannot see
      lower.py      lower(spec, ir) -> its part of the IR, built only when the target is built
      render.py     render(ir) -> Bundle
      launch.py     the Launcher protocol (contract/launcher.py): submit, state, logs, cancel, attach

Only the descriptor is imported with the registry; the section when the Spec is built (every spec), the rest
when the target is built or launched, so building one target loads only that one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..compiler.catalog import Section

if TYPE_CHECKING:
    from ..compiler.diagnostics import Diagnostic
    from ..compiler.ir import JobIR, TimeLimit
    from ..compiler.load import Sourced
    from ..compiler.spec import Spec
    from ..compiler.verl.check import Selection
    from ..contract.launcher import Launcher
    from .bundle import Bundle


@dataclass(frozen=True)
class Target:  # compiler/catalog.py's Target: what the compiler asks of it
    name: str  # as users write it: `--target NAME`, a spec's `targets:`
    package: str  # the folder's module, verlc.targets.<folder>
    section: Section | None = None
    runs_container: bool = False  # runs the spec's docker/podman `container:` on its nodes
    # a new submission may continue an earlier run (`verlc submit --resume RUN`): where the target does not
    # continue a run by itself (Slurm requeues, RayJob retries and SkyPilot recoveries keep a run's id)
    resumable: bool = False
    # how it runs a pipeline's stages (compiler/catalog.py's CHAIN or ONE_JOB; None: it does not): its render's
    # render_chain(irs) writes the pipeline's own bundle; a CHAIN target's launcher's submit takes `after`
    pipelines: str | None = None
    # verl saves a checkpoint ahead of the job's end, which the target always knows (Job.expiry): a submission is
    # warned where an earlier run's save took longer than verl allows for it (lifecycle/runs.py slow_save_note)
    saves_ahead: bool = False

    def has_section(self, spec: Spec) -> bool:
        """Whether the spec writes this target's section."""
        if self.section is None:
            return False
        value: Any = spec
        for part in self.section.at:
            value = getattr(value, part, None)
        return value is not None

    @property
    def section_model(self) -> Any:
        """The pydantic model of the target's section (its section.py, imported now)."""
        assert self.section is not None
        return getattr(self._module("section"), self.section.model)

    def _module(self, name: str) -> Any:
        return import_module(f"{self.package}.{name}")

    def check_section(self, spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
        """Problems of the target's own section beyond its pydantic model, reported whenever a spec is checked
        (checks.check_section, where the target has one)."""
        if not self.has_section(spec):  # nothing to check, and nothing of the target's imported
            return iter(())
        own = getattr(self._module("checks"), "check_section", None)
        return own(spec, sourced) if own else iter(())

    def check_build(self, spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:
        """What this target cannot run of the spec and its verl release or commit (checked when it is built)."""
        return self._module("checks").check_build(spec, sourced, chosen)

    def lower(self, spec: Spec, ir: JobIR) -> Any:
        """This target's part of the IR (`ir.part(name)` in its render and launcher)."""
        return self._module("lower").lower(spec, ir)

    def _section_function(self, name: str, spec: Spec) -> Any:
        """section.py's optional function `name`, where the spec writes the section (else None)."""
        return getattr(self._module("section"), name, None) if self.has_section(spec) else None

    def node_words(self, spec: Spec) -> list[str]:
        """Texts of the target's section that expand on the nodes (their `${env:NAME}` must be set there)."""
        words = self._section_function("node_words", spec)
        return words(spec) if words else []

    def time_limit(self, spec: Spec) -> TimeLimit | None:
        """How long one run may take, where the target's section says (its section.py's time_limit)."""
        limit = self._section_function("time_limit", spec)
        return limit(spec) if limit else None

    def render(self, ir: JobIR) -> Bundle:
        return self._module("render").render(ir)

    def render_chain(self, irs: list[JobIR]) -> Bundle:
        """A pipeline's own bundle (where the target runs `pipelines`): what runs its stages in order."""
        return self._module("render").render_chain(irs)

    def check_pipeline(self, stages: Sequence[tuple[Sourced, JobIR]]) -> Iterator[Diagnostic]:
        """What this target cannot run of a pipeline's stages together (checks.check_pipeline, if it has one)."""
        own = getattr(self._module("checks"), "check_pipeline", None)
        return own(stages) if own else iter(())

    @property
    def launcher(self) -> Launcher:
        return self._module("launch")
