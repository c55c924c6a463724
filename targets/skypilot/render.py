"""Render the skypilot bundle: task.yaml (serialized; its `run` script from run.sh.j2), launch.sh, and the
verlc_job package that task.yaml mounts on every node."""

from __future__ import annotations

from ...compiler import yaml_text
from ...compiler.ir import JobIR
from ..bundle import Bundle, File, finish, header_lines
from ..jinja import environment
from ..job_package import job_package
from .lower import SkyIR
from .view import sky_view, task


def render(ir: JobIR) -> Bundle:
    k: SkyIR = ir.part("skypilot")
    jinja = environment("verlc.targets.skypilot")
    view = sky_view(ir)
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    usage = "# Launch: bash launch.sh (a managed job), or from this folder: sky launch -c NAME task.yaml\n"
    run = jinja.get_template("run.sh.j2").render(view=view)
    return finish(ir, "skypilot", [
        File("task.yaml", header + usage + yaml_text.dump(task(ir, k, run))),
        File("launch.sh", jinja.get_template("launch.sh.j2").render(view=view), 0o755),
        *job_package(ir, record=None, image=k.image),  # the run record goes to the job log
    ])
