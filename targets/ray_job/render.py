"""Render the ray-job bundle: submit.sh, runtime_env.yaml, the upload check and the verlc_job package."""

from __future__ import annotations

from importlib import resources

from ...compiler.ir import JobIR
from ...compiler import yaml_text
from ..bundle import Bundle, File, finish, finish_chain, header_lines
from ..jinja import environment
from ..job_package import job_package, pipeline_package
from .view import UPLOAD_CHECK, pipeline_view, ray_job_view, runtime_env


def render_chain(irs: list[JobIR]) -> Bundle:
    """out/<pipeline>/ray-job/: one Ray job that runs the stages in turn (verlc_job/stages/)."""
    template = environment("verlc.targets.ray_job").get_template("submit.sh.j2")
    header = "".join(f"# {line}\n" for line in header_lines(irs[0]))
    files = [
        File("submit.sh", template.render(view=pipeline_view(irs)), 0o755),
        File("runtime_env.yaml", header + yaml_text.dump(runtime_env(*irs))),
        File(UPLOAD_CHECK, header + resources.files(__package__).joinpath("upload_size.py").read_text()),
        *pipeline_package(irs, record=None),
    ]
    return finish_chain(irs, "ray-job", files)


def render(ir: JobIR) -> Bundle:
    template = environment("verlc.targets.ray_job").get_template("submit.sh.j2")
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    files = [
        File("submit.sh", template.render(view=ray_job_view(ir)), 0o755),
        File("runtime_env.yaml", header + yaml_text.dump(runtime_env(ir))),
        File(UPLOAD_CHECK, header + resources.files(__package__).joinpath("upload_size.py").read_text()),
        *job_package(ir, record=None),
    ]
    return finish(ir, "ray-job", files)
