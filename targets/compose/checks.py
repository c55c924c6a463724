"""The compose section's own problems (mounts and words), and what the compose target cannot run: a sweep,
a container that is not a docker image, a name Compose refuses."""

from __future__ import annotations

import re
from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.ir import parse_word
from ...compiler.load import Sourced
from ...compiler.verl.check import Selection
from ...compiler.code import has_code
from ...compiler.spec import Engine, Spec
from ...compiler.verl.check import NOTE


def check_section(spec: Spec, sourced: Sourced) -> Iterator[Diagnostic]:
    c = spec.compose
    if c is None:
        return
    for loc, text in [(("compose", "image"), c.image), (("compose", "workdir"), c.workdir),
                      *((("compose", "mounts", i), m) for i, m in enumerate(c.mounts))]:
        try:
            parse_word(text)
        except ValueError as exc:
            yield sourced.diagnostic(loc, str(exc))
    for i, mount in enumerate(c.mounts):
        if ":" not in mount:
            yield sourced.diagnostic(("compose", "mounts", i), "a mount is SRC:DST[:OPTIONS]")


def check_build(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:  # noqa: ARG001
    if has_code(spec):
        yield sourced.diagnostic(("code",) if spec.code else ("program",), (
            f"{NOTE}the compose job runs in the image's workdir: it must hold the run's code (mount it there); "
            f"the preflight checks the files it names"))
    if spec.sweep is not None:
        yield sourced.diagnostic(("sweep",), "the compose target runs one job on one host; build sweeps for "
                                             "slurm (one job array) or ray-job (one submission per variant)",
                                 at_key=True)
    if not isinstance(spec.container, Engine) and spec.compose is None:
        yield sourced.diagnostic(("container", "runtime"), f"the compose target runs docker images; with "
                                 f"runtime {spec.container.runtime}, add compose: {{image: ..., workdir: ...}}")
    build = getattr(spec.container, "build", None)
    if build is not None and spec.compose is None:
        yield sourced.diagnostic(("container", "build"), (
            f"{NOTE}the compose bundle does not build images: build it first, in the folder its context is "
            f"relative to (where you run sbatch): `docker build --file "
            f"{build.dockerfile} --tag {spec.container.image} {build.context}`"), at_key=True)
    nodes = spec.cluster.nodes + sum(1 for s in spec.services.values() if s.on == "own_node")
    if nodes > 1:
        yield sourced.diagnostic(("cluster", "nodes"), (
            f"{NOTE}the compose bundle runs every node's container on one Docker host: its {nodes} Ray nodes ask that "
            f"host for {nodes} x {spec.cluster.gpus_per_node} = {nodes * spec.cluster.gpus_per_node} GPUs (device ids "
            f"0-{nodes * spec.cluster.gpus_per_node - 1}), where a machine of one node has "
            f"{spec.cluster.gpus_per_node}; for several machines, build slurm, kuberay or skypilot"))
    if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", spec.name):
        yield sourced.diagnostic(("name",), "the compose target uses the name as the Compose project "
                                            "name: lowercase letters, digits, '-' and '_' only")
