"""The ray-job target runs on a cluster the user has: nothing of a spec stops it (its settings are `ray:`), but
one working dir: the run's code, when the spec has one."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

from ...compiler.diagnostics import Diagnostic
from ...compiler.ir import JobIR
from ...compiler.load import Sourced
from ...compiler.verl.check import Selection
from ...compiler.code import has_code
from ...compiler.spec import Spec
from ...compiler.verl.check import NOTE
from ..shared import image_services_refused


def check_build(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:  # noqa: ARG001
    if has_code(spec) and "working_dir" in spec.ray.model_fields_set:
        yield sourced.diagnostic(("ray", "working_dir"), "the job's working_dir is the run's code (code:); "
                                                         "drop ray.working_dir", at_key=True)
    yield from image_services_refused(spec, sourced, "ray-job", "it submits to a Ray cluster that is not verlc's, "
                                      "where nothing starts a container; run the service in the job's image "
                                      "(command:), or build for slurm, compose or kuberay")
    if spec.sweep is not None:
        count = math.prod(len(values) for values in spec.sweep.matrix.values())
        at_once = spec.ray.sweep_parallel
        yield sourced.diagnostic(("sweep",), (
            f"{NOTE}submit.sh submits the sweep's {count} variants at once to one Ray cluster, and they run "
            + ("in turn: each waits there for the ones before it to end (ray.sweep_parallel: 1; raise it for a "
               "cluster sized for several)" if at_once == 1 else
               f"{at_once} at a time (ray.sweep_parallel): each waits there until fewer than {at_once} of the ones "
               f"before it are still to end; the cluster must have the GPUs of {at_once} variants")), at_key=True)
        own = [name for name, s in spec.services.items() if s.on == "own_node"]
        for name in own if at_once > 1 else []:
            yield sourced.diagnostic(("services", name, "on"), (
                f"the variants that run at once on the cluster (ray.sweep_parallel: {at_once}) would each give "
                f"services.{name} a node of its own by the same choice, the same node: run them in turn "
                f"(ray.sweep_parallel: 1), or put {name} on the head or every node"))
    if spec.ray.node_timeout is not None:
        yield sourced.diagnostic(("ray", "node_timeout"), (
            f"{NOTE}the cluster's Ray reads its health-check settings when its head starts, and the ray-job target "
            f"submits to a running cluster: set RAY_health_check_period_ms (and _timeout_ms, _failure_threshold) "
            f"where it starts; the job still ends naming a node Ray declares dead"))
    if spec.cluster.accelerator == "npu":
        yield sourced.diagnostic(("cluster", "accelerator"), (
            f"{NOTE}the cluster's Ray nodes must have their NPUs as Ray's NPU resource (ray start "
            f"--resources='{{\"NPU\": {spec.cluster.gpus_per_node}}}', or Ray's own detection of "
            f"ASCEND_RT_VISIBLE_DEVICES) and HCCL's settings where they start; the job waits for "
            f"{spec.cluster.nodes * spec.cluster.gpus_per_node} NPUs"))


def check_pipeline(stages: Sequence[tuple[Sourced, JobIR]]) -> Iterator[Diagnostic]:
    """A pipeline runs as one Ray job: one runtime env (working dir, env vars) and one address for every stage."""
    from .view import runtime_env

    first_sourced, first = stages[0]
    env, where = runtime_env(first), first.ray.address
    for sourced, ir in stages[1:]:
        own = runtime_env(ir)
        if own["env_vars"] != env["env_vars"]:
            yield sourced.diagnostic(("env",), "the ray-job target runs a pipeline's stages in one Ray job, with one "
                                               "environment: this stage's env differs from the first stage's "
                                               "(give the stages one env, or build the pipeline for slurm)")
        if own["working_dir"] != env["working_dir"] or ir.ray.address != where:
            yield sourced.diagnostic(("ray",), "the ray-job target runs a pipeline's stages in one Ray job: every "
                                               "stage has the first one's working dir (code:, ray.working_dir) and "
                                               "ray.address")
