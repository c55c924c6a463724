"""explain, migrate, schema and stage-in: verlc's tools for verl itself (its keys, releases and inputs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .build import EXIT_SPEC, compile_all

EXIT_FAILED = 1  # migrate: decisions are left; stage-in: a step failed


def explain(key: str, version: str | None, spec: Path | None) -> int:
    from ..compiler.diagnostics import SpecError
    from ..compiler.explain import explain

    if spec is not None and version is not None:
        print("verlc: give SPEC or --verl-version, not both: a spec names its release", file=sys.stderr)
        return EXIT_SPEC
    try:
        sys.stdout.write(explain(key, version, spec))
    except SpecError as exc:
        for d in exc.diagnostics:
            print(d if d.file != "<command line>" else f"verlc: {d.message}", file=sys.stderr)
        return EXIT_SPEC
    return 0


def migrate(spec: Path, target: str, write: bool, write_bases: bool, markdown: bool) -> int:
    """Exit 0 when the migrated spec validates against `target`, 1 when decisions are left, 2 on bad input."""
    from ..compiler import migrate
    from ..compiler.diagnostics import SpecError

    try:
        plan = migrate.plan(spec, target, write_bases=write_bases)
    except SpecError as exc:
        for d in exc.diagnostics:
            print(d, file=sys.stderr)
        print(f"verlc: {len(exc.diagnostics)} problem(s): migrate starts from a spec that validates against "
              f"its own verl_version; nothing written", file=sys.stderr)
        return EXIT_SPEC
    text = migrate.report(plan, markdown)
    if write:
        migrate.write(plan)
        sys.stdout.write(text + "".join(f"rewrote {path}\n" for path in plan.files))
    elif markdown:
        sys.stdout.write(text + (f"\n```diff\n{plan.diff()}```\n" if plan.files else ""))
    else:
        sys.stderr.write(text)
        sys.stdout.write(plan.diff())
    return EXIT_FAILED if plan.decisions else 0


def schema(fmt: str, version: str | None) -> int:
    """The spec's JSON Schema (for a verl release's keys under `verl:`), or its Markdown reference."""
    from ..compiler import spec_doc
    from ..compiler.verl.release import RELEASES

    if version is not None and version not in RELEASES:
        print(f"verlc: no schema for verl {version}; known: {', '.join(RELEASES)}", file=sys.stderr)
        return EXIT_SPEC
    sys.stdout.write(spec_doc.json_schema(version) if fmt == "json" else spec_doc.markdown())
    return 0


def stage_in(spec: Path) -> int:
    """The data stage's downloads, here: exit 0 when everything is in place, 1 when a step failed."""
    from ..targets import runtime

    result = compile_all([spec], (), "snapshot")
    if isinstance(result, int):
        return result
    [ir] = result
    if ir.container.runtime == "none":  # where, and with which python3, the job's data stage runs
        if ir.container.workdir is not None:
            os.chdir(runtime.expand(ir.container.workdir.as_json()))
        if ir.container.venv is not None:
            os.environ["PATH"] = f"{runtime.expand(ir.container.venv.as_json())}/bin:{os.environ['PATH']}"
    if ir.model_fetch is None and not ir.data_prep:
        print(f"{spec}: nothing to stage in (no pinned model, no data preparation)")
        return 0
    rc = 0
    if ir.model_fetch is not None:
        rc = runtime.materialize(ir.model_fetch.repo, ir.model_fetch.revision,
                                 runtime.expand(ir.model_fetch.folder.as_json()))
    for step in ir.data_prep:
        rc = rc or runtime.prepare(step.out_dir, list(step.argv))
    offline = any(e.name == "HF_HUB_OFFLINE" for e in ir.env)
    if rc == 0 and not offline:
        print(f"{spec}: staged in {os.getcwd()}; to keep the nodes off the hub, add HF_HUB_OFFLINE: '1' under "
              f"the spec's env")
    return rc
