"""verlc_job/: the in-cluster helper as a Python package, with the job it runs as data.

Shared by the targets that start the job from a fixed command (ray-job ships it with
py_modules, compose mounts it): the job's argv stays JSON end to end, no shell parses it.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from ..compiler.ir import JobIR, VariantIR, Word
from .bundle import File, header_lines
from .protocol import PIPELINE_JOBS, REFERENCE, Job

PACKAGE = "verlc_job"
COMMAND = ("python3", "-m", PACKAGE, "job")
PIPELINE_COMMAND = ("python3", "-m", PACKAGE, "pipeline")


def variant_label(ir: JobIR, variant: VariantIR) -> str:
    """What a sweep's variant logs first, e.g. "variant 3: actor_rollout_ref.actor.optim.lr=1e-06"."""
    settings = " ".join(f"{k.removeprefix('verl.')}={value}" for k, value in variant.settings)
    return f"variant {variant.index}: {settings}"


def job_of(ir: JobIR, *, record: Word | None, variant: VariantIR | None = None, image: str | None = None,
           expiry: dict[str, Any] | None = None) -> Job:
    """What the runtime's `job` runs (targets/protocol.py), in the cluster the job runs in (RAY_ADDRESS).
    `expiry`: where a target that knows the job's end time puts it, for verl's save ahead of it."""
    checkpoints = variant.checkpoint_dir if variant else ir.checkpoint_dir
    return Job(
        generated_from=ir.spec_file,
        spec_sha256=ir.spec_sha256,
        name=ir.name,
        variant=variant_label(ir, variant) if variant else None,
        nodes=ir.nodes,
        total_gpus=ir.total_gpus,
        device=ir.device,
        wait_seconds=ir.ray.wait_seconds,
        data_prep=[{"out_dir": p.out_dir, "argv": list(p.argv)} for p in ir.data_prep],
        model_fetch={"repo": ir.model_fetch.repo, "revision": ir.model_fetch.revision,
                     "folder": ir.model_fetch.folder.as_json()} if ir.model_fetch else None,
        model=ir.model.as_json(),
        checkpoint_dir=checkpoints.as_json(),
        data_files=[f.as_json() for f in ir.data_files],
        data_columns=list(ir.data_columns),
        require_env=list(ir.node_env),
        pins=[f"{name}={version}" for name, version in ir.pins],
        verl_commit=ir.verl_commit,
        code=ir.code.as_json() if ir.code else None,
        rollout_package=ir.rollout_package,
        startup=[n.as_json() for n in ir.startup] if ir.startup is not None else None,
        image=image or ir.image.display,  # the run record names it (a target's own image, if it has one)
        record=record.as_json() if record else None,
        reference=Word((*checkpoints.parts, f"/{REFERENCE}")).as_json() if ir.reproducible else None,
        train=list(ir.trainer_argv_for(variant)),
        stall_timeout=ir.stall_timeout,
        expiry=expiry,
        inputs=[{"stage": i.stage, "checkpoint_dir": i.checkpoint_dir.as_json(), "layout": i.layout,
                 "merger": list(i.merger), "merged": i.merged.as_json(), "latest": i.latest.as_json()}
                for i in ir.pipeline.inputs]
        if ir.pipeline and ir.pipeline.inputs else None,
        every_node=ir.launch[0] == "torchrun" and ir.nodes > 1,  # torchrun --standalone on one node (lower.launch)
    )


def runtime_sources() -> dict[str, str]:
    """The files that run on the cluster, as verlc ships them: the protocol and the runtime."""
    here = resources.files("verlc.targets")
    return {name: here.joinpath(name).read_text() for name in ("protocol.py", "runtime.py")}


def one_program() -> str:
    """The protocol and the runtime as one program for `python3 -` (the Slurm script feeds it on stdin, so that
    it reaches a container as it is): the protocol first, then the runtime without its __future__ import,
    which Python takes only at the start of a file (the protocol's, the same, stands for it)."""
    sources = runtime_sources()
    future = "from __future__ import annotations\n"
    assert future in sources["protocol.py"] and future in sources["runtime.py"]
    return sources["protocol.py"] + "\n\n" + sources["runtime.py"].replace(future, "", 1)


def job_package(ir: JobIR, *, record: Word | None, image: str | None = None,
                expiry: dict[str, Any] | None = None) -> list[File]:
    """verlc_job/: the runtime, the protocol beside it, its entry point, and the job (one per sweep variant)."""
    jobs = {"job.json": job_of(ir, record=record, image=image, expiry=expiry)} if not ir.variants else {
        f"jobs/{v.index}.json": job_of(ir, record=record, variant=v, image=image, expiry=expiry) for v in ir.variants}
    return _package(ir, jobs)


def pipeline_package(irs: list[JobIR], *, record: Word | None) -> list[File]:
    """verlc_job/ of a pipeline run as one job: each stage's job as stages/<NN>-<stage>.json, in order
    (`python3 -m verlc_job pipeline` runs them in turn)."""
    return _package(irs[0], {f"{PIPELINE_JOBS}/{i:02d}-{ir.pipeline.stage if ir.pipeline else ir.name}.json":
                             job_of(ir, record=record) for i, ir in enumerate(irs, 1)})


def _package(ir: JobIR, jobs: dict[str, Job]) -> list[File]:
    header = "".join(f"# {line}\n" for line in header_lines(ir))
    sources = runtime_sources()
    main = "import sys\n\nfrom . import main\n\nsys.exit(main(sys.argv[1:]))\n"
    return [
        File(f"{PACKAGE}/__init__.py", header + sources["runtime.py"]),
        File(f"{PACKAGE}/__main__.py", header + main),
        File(f"{PACKAGE}/protocol.py", header + sources["protocol.py"]),
        *(File(f"{PACKAGE}/{name}", job.to_json()) for name, job in jobs.items()),
    ]
