# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The runtime's command line, what bundles call: `python3 - COMMAND ...` (the program on stdin) or
`python3 -m verlc_job COMMAND ...`.

  job          the job: wait for the Ray cluster, data, preflight, train (with the stall watchdog), stopping
               after the stage VERLC_STOP_AFTER names; the package's job.json, or --json from the Slurm script
  pipeline     a pipeline's stages in order (the package's stages/*.json)
  ray-logs     a node's Ray session logs as a tar stream (bounded), then Ray's temp dir removed
  materialize  put a hub model's pinned revision into a folder, unless it holds it already
"""

from __future__ import annotations

import argparse

from .data import materialize
from .job import Job, Variant
from .protocol import RUNNER_STAGES
from .raylogs import ray_logs
from .runner import job, load_job, load_stages, pipeline


def main(argv: list[str]) -> int:
    """The command line bundles call: `python3 - COMMAND ...` (the source on stdin) or `python3 -m verlc_job`."""
    parser = argparse.ArgumentParser(prog="verlc-runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("materialize")
    p.add_argument("--repo", required=True)
    p.add_argument("--revision", required=True)
    p.add_argument("--folder", required=True)
    p = sub.add_parser("ray-logs")
    p.add_argument("--temp-dir", required=True)
    p.add_argument("--limit-mib", type=int, required=True)
    p = sub.add_parser("job")
    p.add_argument("variant", nargs="?", help="a sweep's variant index (jobs/<index>.json); default: job.json")
    p.add_argument("--json", help="the job itself, instead of the package's job.json (the Slurm script passes it)")
    p.add_argument("--begun", choices=RUNNER_STAGES, help="the stage the caller began (the Slurm script starts Ray)")
    p.add_argument("--variant-json", help="a sweep's array task: what its variant changes in --json")
    sub.add_parser("pipeline", help="a pipeline's stages in order (the package's stages/*.json)")
    a = parser.parse_args(argv)
    if a.command == "materialize":
        return materialize(a.repo, a.revision, a.folder)
    if a.command == "ray-logs":
        return ray_logs(a.temp_dir, a.limit_mib)
    if a.command == "pipeline":
        return pipeline(load_stages())
    spec = Job.from_json(a.json) if a.json else load_job(a.variant)
    return job(spec.with_variant(Variant.from_json(a.variant_json)) if a.variant_json else spec, a.begun)
