"""Render the ray-job bundle: submit.sh, runtime_env.yaml and the verlc_job package."""

from __future__ import annotations

import json
from importlib import resources

from ...compiler.ir import JobIR
from ...compiler.lower import dump_yaml
from ..bundle import Bundle, File, finish, header_lines
from ..jinja import environment
from .view import PACKAGE, job_description, ray_job_view, runtime_env


def helper_package(ir: JobIR, job: dict) -> list[File]:
    """The in-cluster helper as a package Ray can ship (py_modules) and Compose can mount."""
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    source = resources.files("verlc.targets").joinpath("incluster.py").read_text()
    main = "import sys\n\nfrom . import main\n\nsys.exit(main(sys.argv[1:]))\n"
    described = {"generated_from": ir.spec_file, "spec_sha256": ir.spec_sha256, **job}
    return [
        File(f"{PACKAGE}/__init__.py", header + source),
        File(f"{PACKAGE}/__main__.py", header + main),
        File(f"{PACKAGE}/job.json", json.dumps(described, indent=2, ensure_ascii=False) + "\n"),
    ]


def render(ir: JobIR) -> Bundle:
    template = environment("verlc.targets.ray_job").get_template("submit.sh.j2")
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    files = [
        File("submit.sh", template.render(view=ray_job_view(ir)), 0o755),
        File("runtime_env.yaml", header + dump_yaml(runtime_env(ir))),
        *helper_package(ir, job_description(ir, address=None, record=None)),
    ]
    return finish(ir, "ray-job", files)
