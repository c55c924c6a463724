"""verlc_job/: the in-cluster helper as a Python package, with the job it runs as data.

Shared by the targets that start the job from a fixed command (ray-job ships it with
py_modules, compose mounts it): the job's argv stays JSON end to end, no shell parses it.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from ..compiler.ir import JobIR, VariantIR, Word
from .bundle import File, header_lines

PACKAGE = "verlc_job"
REFERENCE = "verlc-first-run.json"  # a reproducible job's first run record, next to its checkpoints
COMMAND = ("python3", "-m", PACKAGE, "job")


def variant_label(ir: JobIR, variant: VariantIR) -> str:
    """What a sweep's variant logs first, e.g. "variant 3: actor_rollout_ref.actor.optim.lr=1e-06"."""
    settings = " ".join(f"{k.removeprefix('verl.')}={value}" for k, value in variant.settings)
    return f"variant {variant.index}: {settings}"


def job_description(ir: JobIR, *, record: Word | None, variant: VariantIR | None = None,
                    image: str | None = None, expiry: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the runtime's `job` runs: wait, data, preflight, train (targets/runtime.py), in the cluster the job
    runs in (RAY_ADDRESS). `expiry`: where a target that knows the job's end time puts it, for verl's save
    ahead of it ({"variable", "lead" seconds, "end_file" with the end in epoch seconds})."""
    checkpoints = variant.checkpoint_dir if variant else ir.checkpoint_dir
    return {
        "generated_from": ir.spec_file,
        "spec_sha256": ir.spec_sha256,
        "name": ir.name,
        "variant": variant_label(ir, variant) if variant else None,
        "nodes": ir.nodes,
        "gpus": ir.total_gpus,
        "device": ir.device,  # Ray's resource name of the accelerators: GPU, or NPU on Ascend
        "wait_seconds": ir.ray.wait_seconds,
        "data_prep": [{"out_dir": p.out_dir, "argv": list(p.argv)} for p in ir.data_prep],
        "model_fetch": {"repo": ir.model_fetch.repo, "revision": ir.model_fetch.revision,
                        "folder": ir.model_fetch.folder.as_json()} if ir.model_fetch else None,
        # Paths as parts: text, and {"env": NAME} that the helper expands on the node.
        "model": ir.model.as_json(),
        "checkpoint_dir": checkpoints.as_json(),
        "data_files": [f.as_json() for f in ir.data_files],
        "require_env": list(ir.node_env),
        "pins": [f"{name}={version}" for name, version in ir.pins],
        "verl_commit": ir.verl_commit,
        "code": ir.code.as_json() if ir.code else None,
        "rollout_package": ir.rollout_package,
        "startup": [n.as_json() for n in ir.startup] if ir.startup is not None else None,
        "image": image or ir.image.display,  # the run record names it (a target's own image, if it has one)
        "record": record.as_json() if record else None,
        "reference": Word((*checkpoints.parts, f"/{REFERENCE}")).as_json() if ir.reproducible else None,
        "train": list(ir.trainer_argv_for(variant)),
        "stall_timeout": ir.stall_timeout,
        "expiry": expiry,
    }


def job_json(description: dict[str, Any]) -> str:
    """The job as JSON for review: one key per line, and a long list (the trainer's argv) one item per line."""
    def item(value: object) -> str:
        return json.dumps(value, ensure_ascii=False)

    lines = []
    for key, value in description.items():
        text = item(value)
        if isinstance(value, list) and value and len(text) > 100:
            text = "[\n" + ",\n".join(f"    {item(v)}" for v in value) + "\n  ]"
        lines.append(f"  {item(key)}: {text}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def job_package(ir: JobIR, *, record: Word | None, image: str | None = None) -> list[File]:
    """verlc_job/: the runtime, its entry point, and the job (one per sweep variant) as JSON."""
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    source = resources.files("verlc.targets").joinpath("runtime.py").read_text()
    main = "import sys\n\nfrom . import main\n\nsys.exit(main(sys.argv[1:]))\n"
    jobs = {"job.json": job_description(ir, record=record, image=image)} if not ir.variants else {
        f"jobs/{v.index}.json": job_description(ir, record=record, variant=v, image=image)
        for v in ir.variants}
    return [
        File(f"{PACKAGE}/__init__.py", header + source),
        File(f"{PACKAGE}/__main__.py", header + main),
        *(File(f"{PACKAGE}/{name}", job_json(job))
          for name, job in jobs.items()),
    ]
