"""How the runtime (runtime/) and its job reach the cluster, decided here once.

`job_of` makes the runtime's typed Job from the JobIR. `job_package` ships both as the package verlc_job/ (the
runtime's modules, and the job as JSON), for the targets that start the job from a fixed command (ray-job ships it
with py_modules, compose mounts it, kuberay and skypilot put it beside the command); `one_program` makes the same
modules one program for `python3 -`, which the Slurm script embeds. The job's argv stays JSON end to end: no shell
parses it.
"""

from __future__ import annotations

import ast
import functools
from importlib import resources

from ..compiler.ir import JobIR, VariantIR, Word
from .bundle import File
from ..compiler.derive import TOOL_CONFIG_VARIABLE
from ..compiler.services import ROLLOUT_MEMORY
from ..runtime.job import (Code, DataPrep, Expiry, Job, ModelFetch, PhaseNeed, Probe, RolloutMemory, Service,
                           StageInput, StartupNeed, ToolConfig)
from ..runtime.protocol import PIPELINE_JOBS, REFERENCE

PACKAGE = "verlc_job"
COMMAND = ("python3", "-m", PACKAGE, "job")
PIPELINE_COMMAND = ("python3", "-m", PACKAGE, "pipeline")


def variant_label(ir: JobIR, variant: VariantIR) -> str:
    """What a sweep's variant logs first, e.g. "variant 3: actor_rollout_ref.actor.optim.lr=1e-06"."""
    settings = " ".join(f"{k.removeprefix('verl.')}={value}" for k, value in variant.settings)
    return f"variant {variant.index}: {settings}"


def job_of(ir: JobIR, *, record: Word | None, variant: VariantIR | None = None, image: str | None = None,
           expiry: Expiry | None = None, run_folder: Word | None = None) -> Job:
    """What the runtime's `job` runs (runtime/job.py), in the cluster the job runs in (RAY_ADDRESS).
    `expiry`: where a target that knows the job's end time puts it, for verl's save ahead of it; `run_folder`:
    the folder a target makes for the run before the runtime starts."""
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
        data_prep=[DataPrep(out_dir=p.out_dir, argv=list(p.argv)) for p in ir.data_prep],
        model_fetch=ModelFetch(repo=ir.model_fetch.repo, revision=ir.model_fetch.revision,
                               folder=ir.model_fetch.folder.as_json()) if ir.model_fetch else None,
        model=ir.model.as_json(),
        checkpoint_dir=checkpoints.as_json(),
        data_files=[f.as_json() for f in ir.data_files],
        files=[f.as_json() for f in ir.named_files],
        data_columns=list(ir.data_columns),
        require_env=list(ir.node_env),
        pins=[f"{name}={version}" for name, version in ir.pins],
        verl_commit=ir.verl_commit,
        code=Code(folder=ir.code.folder, commit=ir.code.commit, dirty=ir.code.dirty, diff_sha256=ir.code.diff_sha256,
                  files=dict(ir.code.files)) if ir.code else None,
        rollout_package=ir.rollout_package,
        startup=[StartupNeed(check=n.check, module=n.module, device=n.device, where=n.where, why=n.why,
                             avoid=n.avoid, model_types=n.model_types) for n in ir.startup]
        if ir.startup is not None else None,
        image=image or ir.image.display,  # the run record names it (a target's own image, if it has one)
        record=record.as_json() if record else None,
        reference=Word((*checkpoints.parts, f"/{REFERENCE}")).as_json() if ir.reproducible else None,
        train=list(ir.trainer_argv_for(variant)),
        stall_timeout=ir.stall_timeout,
        expiry=expiry,
        run_folder=run_folder.as_json() if run_folder else None,
        inputs=[StageInput(stage=i.stage, checkpoint_dir=i.checkpoint_dir.as_json(), layout=i.layout,
                           merger=list(i.merger), merged=i.merged.as_json(), latest=i.latest.as_json())
                for i in ir.pipeline.inputs]
        if ir.pipeline and ir.pipeline.inputs else None,
        every_node=ir.launch[0] == "torchrun" and ir.nodes > 1,  # torchrun --standalone on one node (lower.launch)
        services=[Service(
            name=s.name, argv=[w.as_json() for w in s.argv], env={k: w.as_json() for k, w in s.env}, image=s.image,
            every_node=s.every_node, own_node=s.own_node, gpus=s.gpus, listen_all=s.listen_all,
            ready_http=s.ready_http,
            ready_command=[w.as_json() for w in s.ready_command] if s.ready_command else None, deadline=s.deadline,
            probe=Probe(**vars(s.probe)) if s.probe else None, restart=s.restart, variables=dict(s.variables))
            for s in ir.services],
        tool_config=ToolConfig(TOOL_CONFIG_VARIABLE, ir.tool_config) if ir.tool_config is not None else None,
        rollout_memory=rollout_memory(ir, variant),
    )


def rollout_memory(ir: JobIR, variant: VariantIR | None) -> RolloutMemory | None:
    """What the trainer takes of each GPU, for the preflight to find free: vLLM's share (a sweep variant's own
    gpu_memory_utilization, else the base's), and the plan's phases (not for a sweep's variants, whose settings
    change them: `verlc plan` shows the base's)."""
    share = None
    if ir.rollout_memory is not None:
        own = dict(variant.settings).get(f"verl.{ROLLOUT_MEMORY}") if variant else None  # a sweep's spec path
        share = float(own) if isinstance(own, int | float) and not isinstance(own, bool) else ir.rollout_memory
    if ir.memory is None or not ir.memory.phases or ir.variants:
        return RolloutMemory(share) if share is not None else None
    return RolloutMemory(share, [PhaseNeed(*phase) for phase in ir.memory.trainer_phases()], ir.memory.gpu)


def runtime_sources() -> dict[str, str]:
    """The runtime's modules (runtime/, without its __init__ and __main__), as verlc ships them: name -> source."""
    here = resources.files("verlc.runtime")
    return {p.name.removesuffix(".py"): p.read_text() for p in sorted(here.iterdir(), key=lambda p: p.name)
            if p.name.endswith(".py") and not p.name.startswith("__")}


@functools.cache  # once per process: the runtime's files do not change while verlc runs
def one_program() -> str:
    """The runtime as one program for `python3 -` (the Slurm script feeds it on stdin, so that it reaches a
    container as it is): its modules in the order they import each other, each without its imports of the others
    (their names are the program's own, each defined once), then what `python3 -m` runs (runtime/__main__.py)."""
    sources = runtime_sources()
    siblings = {name: _siblings(name, text) for name, text in sources.items()}
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        assert name not in path, f"runtime modules import each other in a circle: {' -> '.join((*path, name))}"
        for used, _ in siblings[name]:
            visit(used, (*path, name))
        order.append(name)

    for name in sources:
        visit(name, ())
    defined: dict[str, str] = {}
    parts = ["from __future__ import annotations\n"]
    for name in order:
        for top in _top_names(sources[name]):
            assert top not in defined, f"runtime/{name}.py and runtime/{defined[top]}.py both define {top}"
            defined[top] = name
        parts.append(f"\n\n# ==== runtime/{name}.py ====\n" + _without_imports(sources[name], siblings[name]))
    main = resources.files("verlc.runtime").joinpath("__main__.py").read_text()
    parts.append("\n\n# ==== runtime/__main__.py ====\n" + _without_imports(main, _siblings("__main__", main)))
    return "".join(parts)


def _siblings(name: str, text: str) -> list[tuple[str, ast.ImportFrom]]:
    """The runtime modules `text` imports, as `from .module import names` at its top level: the one form the
    program can stand for (any other relative import is refused)."""
    tree = ast.parse(text, f"runtime/{name}.py")
    found = [(n.module, n) for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module]
    other = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level
             and all(n is not node for _, node in found)]
    assert not other, f"runtime/{name}.py:{other[0].lineno}: only `from .module import names`, at the top level"
    return found


def _without_imports(text: str, imports: list[tuple[str, ast.ImportFrom]]) -> str:
    """`text` without its __future__ import (the program's first line stands for it) and its sibling imports."""
    lines = text.splitlines(keepends=True)
    drop = {i for _, node in imports for i in range(node.lineno - 1, node.end_lineno)}
    drop |= {n.lineno - 1 for n in ast.parse(text).body
             if isinstance(n, ast.ImportFrom) and n.module == "__future__"}
    return "".join(line for i, line in enumerate(lines) if i not in drop)


def _top_names(text: str) -> list[str]:
    """The names a module defines at its top level (functions, classes, assignments)."""
    names = []
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return names


def job_package(ir: JobIR, *, record: Word | None, image: str | None = None,
                expiry: Expiry | None = None) -> list[File]:
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
    """The runtime's modules under a header of their own, the same in every bundle (nothing of the spec: a spec's
    edit changes its jobs, not the runtime's copies), then the jobs."""
    header = (f"# verlc {ir.verlc_version}'s runtime (runtime/ in verlc's source), shipped as it is in every bundle.\n"
              "# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.\n")
    package = resources.files("verlc.runtime")
    own = [(name, package.joinpath(name).read_text()) for name in ("__init__.py", "__main__.py")]
    return [
        *(File(f"{PACKAGE}/{name}", header + text) for name, text in own),
        *(File(f"{PACKAGE}/{name}.py", header + text) for name, text in runtime_sources().items()),
        *(File(f"{PACKAGE}/{name}", job.to_json()) for name, job in jobs.items()),
    ]
