"""The compiler's stages in order: spec file -> Sourced -> Spec -> (checks) -> JobIR."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from .checks import check
from .ir import JobIR
from .load import load
from .lower import lower
from .validate import validate


def compile_spec(path: Path, *, display: str, source: str, targets: Iterable[str] = ()) -> JobIR:
    """Compile one spec file; raise SpecError listing every problem.

    `display` names the file in diagnostics; `source` names it in the generated files.
    """
    sourced = load(path, display)
    spec = validate(sourced)
    check(spec, sourced, targets)
    return lower(spec, spec_file=source, spec_sha256=sourced.sha256)
