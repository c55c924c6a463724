"""Render the compose bundle: compose.yaml (serialized, not templated) and the verlc_job package."""

from __future__ import annotations

from ...compiler.ir import JobIR, Word
from ...compiler import yaml_text
from ..bundle import Bundle, File, finish, header_lines
from ..job_package import job_package
from ...runtime.protocol import RECORD, RUNNER_STAGES, STOP_AFTER
from ..shared import image_service_tokens
from .view import HEAD, compose_file, run_time_folders

RECORD_IN_CONTAINER = f"/verlc/runs/{RECORD}"  # ./runs/ on the host


def render(ir: JobIR) -> Bundle:
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    usage = (f"# Run:  docker compose up --abort-on-container-exit --exit-code-from {HEAD}\n"
             f"#       {STOP_AFTER}={RUNNER_STAGES[-2]} docker compose up ...   (stages: {', '.join(RUNNER_STAGES)})\n")
    tokens = image_service_tokens(ir)
    if tokens:  # a service in an image of its own takes a token made for each run (verlc submit makes them)
        usage += f"#       by hand, first:  export {' '.join(f'{t}=$(openssl rand -hex 24)' for t in tokens)}\n"
    files = [
        File("compose.yaml", header + usage + yaml_text.dump(compose_file(ir))),
        *job_package(ir, record=Word((RECORD_IN_CONTAINER,))),  # the job runs on the head
    ]
    return finish(ir, "compose", files, run_time_folders(ir))
