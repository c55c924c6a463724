"""The ray-job target needs nothing beyond the common IR (its address and working dir are in `ir.ray`)."""

from __future__ import annotations

from ...compiler.ir import JobIR
from ...compiler.spec import Spec


def lower(spec: Spec, ir: JobIR) -> None:
    return None
