"""The ray-job target runs on a cluster the user has: nothing of a spec stops it (its settings are `ray:`), but
one working dir: the run's code, when the spec has one."""

from __future__ import annotations

from collections.abc import Iterator

from ...compiler.diagnostics import Diagnostic
from ...compiler.load import Sourced
from ...compiler.verl.check import Selection
from ...compiler.code import has_code
from ...compiler.spec import Spec
from ...compiler.verl.check import NOTE


def check_build(spec: Spec, sourced: Sourced, chosen: Selection | str) -> Iterator[Diagnostic]:  # noqa: ARG001
    if has_code(spec) and "working_dir" in spec.ray.model_fields_set:
        yield sourced.diagnostic(("ray", "working_dir"), "the job's working_dir is the run's code (code:); "
                                                         "drop ray.working_dir", at_key=True)
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
