"""The ray-job target runs on a cluster the user has: nothing of a spec stops it (its settings are `ray:`)."""

from __future__ import annotations

from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.load import Sourced
from ...compiler.spec import Spec


def check_build(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    return iter(())
