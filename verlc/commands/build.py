"""build, validate, check and diff: the compiler's commands. Problems go to stderr as file:line:col lines."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_SPEC = 2  # bad input: the problems are printed, nothing is written


def _source_name(spec: Path) -> str:
    """How generated files name their spec: relative to the enclosing git checkout, so the same
    spec gives the same bytes from any working directory or output folder."""
    path = spec.resolve()
    for folder in path.parents:
        if (folder / ".git").exists():
            return path.relative_to(folder).as_posix()
    return path.name


def compile_all(specs: Sequence[Path], targets: Sequence[str], verl_config: str,
                 max_variants: int = 1000, strict: bool = False, submitting: bool = False,
                 profile: str | None = None, say_notes: bool = True) -> list | int:
    from ..compiler.diagnostics import SpecError
    from ..compiler.pipeline import compile_file
    from ..targets import CATALOG

    irs, problems = [], []
    for spec in specs:
        try:
            irs.extend(compile_file(spec, CATALOG, display=str(spec), source=_source_name(spec), targets=targets,
                                    verl_config=verl_config, max_variants=max_variants,
                                    accept_changes=os.environ.get("VERLC_ACCEPT_CHANGES") == "1", profile=profile))
        except SpecError as exc:
            problems.extend(exc.diagnostics)
    if problems:
        for d in problems:
            print(d, file=sys.stderr)
        print(f"verlc: {len(problems)} problem(s); nothing written", file=sys.stderr)
        return EXIT_SPEC
    notes = [note for ir in irs for note in ir.notes]
    if submitting:  # `verlc submit` creates the Slurm log folders itself: that note does not apply
        from ..targets.slurm.checks import LOG_FOLDER_NOTE

        notes = [note for note in notes if LOG_FOLDER_NOTE not in note]
    for note in notes if say_notes else ():  # `verlc check` judges out/, not the specs: their notes are build's
        print(note, file=sys.stderr)
    if strict and notes:
        print(f"verlc: {len(notes)} note(s) and --strict; nothing written", file=sys.stderr)
        return EXIT_SPEC
    return irs


def validate(specs: Sequence[Path], target: str | None, verl_config: str, max_variants: int,
              strict: bool, profile: str | None = None) -> int:
    targets = [target] if target else []  # "all": each spec's own targets
    result = compile_all(specs, targets, verl_config, max_variants, strict, profile=profile)
    if isinstance(result, int):
        return result
    for ir in result:
        stage = f"stage {ir.pipeline.stage}, " if ir.pipeline else ""
        print(f"{ir.spec_file}: ok ({stage}{ir.name}: {ir.nodes} node(s) x {ir.gpus_per_node} {ir.device}s, "
              f"{len(ir.overrides)} verl overrides checked against verl {ir.verl_schema}"
              + (f", {len(ir.variants)} variants" if ir.variants else "") + ")")
    return 0


def plan(specs: Sequence[Path], profile: str | None = None, form: str = "text") -> int:
    """The resolved allocation of each spec's run, after the checks `validate` runs (a spec with problems gets
    its problems, not a plan); `form` json: each run's memory figures (compiler/memory.py)."""
    from ..compiler.plan import plan as plan_of

    result = compile_all(specs, [], "snapshot", profile=profile)
    if isinstance(result, int):
        return result
    if form == "json":
        print(json.dumps([{"spec": ir.spec_file, "name": ir.name, "memory": ir.memory.as_json()
                           if ir.memory is not None else None} for ir in result], indent=2))
        return 0
    sys.stdout.write("\n".join(plan_of(ir) for ir in result))
    for name, hours in _pipeline_hours(result).items():
        print(f"\npipeline {name}: its stages one after another, at most {hours:g} GPU-hours in all")
    return 0


def _pipeline_hours(irs: list) -> dict[str, float]:
    """Each pipeline's GPU-hours bound: the sum of its stages' (each bounded by its time limit, no retry)."""
    from ..compiler.plan import gpu_hours

    found: dict[str, float] = {}
    for ir in irs:
        hours = gpu_hours(ir)
        if ir.pipeline is not None and hours is not None:
            found[ir.pipeline.name] = found.get(ir.pipeline.name, 0.0) + hours
    return found


def bundles_of(irs: list, target: str) -> list:
    """Every bundle of these jobs for `target` ("all": each job's own targets), and each pipeline's own bundle
    (out/<pipeline>/<target>/): beside its stages' bundles where the target chains a job per stage, alone where
    it runs the stages in one job."""
    from ..compiler.catalog import ONE_JOB
    from ..targets import get, render

    bundles = [render(name, ir) for ir in irs for name in (ir.targets if target == "all" else [target])
               if ir.pipeline is None or get(name).pipelines != ONE_JOB]
    pipelines: dict[str, list] = {}
    for ir in irs:
        if ir.pipeline is not None:
            pipelines.setdefault(ir.pipeline.name, []).append(ir)
    for group in pipelines.values():
        bundles += [get(name).render_chain(group) for name in (group[0].targets if target == "all" else [target])]
    return bundles


def _name_clash(irs: list) -> bool:
    """Two specs of one name would write (and compare) the same bundle folder: say so."""
    seen: dict[str, str] = {}
    for ir in irs:
        if ir.name in seen:
            print(f"verlc: {ir.spec_file} and {seen[ir.name]} both have name '{ir.name}'; their bundles would "
                  f"overwrite each other in one folder: rename one", file=sys.stderr)
            return True
        seen[ir.name] = ir.spec_file
    return False


def build(specs: Sequence[Path], target: str, out: Path, force: bool, verl_config: str,
           max_variants: int, strict: bool, profile: str | None = None) -> int:
    from ..targets.bundle import EditedError, OtherSpecError, write

    shown, out = out, out.resolve()  # messages name the folder as the user gave it
    result = compile_all(specs, [target], verl_config, max_variants, strict, profile=profile)
    if isinstance(result, int):
        return result
    if _name_clash(result):
        return EXIT_SPEC
    bundles = bundles_of(result, target)
    try:
        write(bundles, out, force=force)
    except EditedError as exc:
        for rel in exc.args[0]:
            print(f"verlc: {out / rel}: edited by hand since it was generated", file=sys.stderr)
        print("verlc: nothing written; move your edits into the spec, or pass --force to discard them",
              file=sys.stderr)
        return EXIT_SPEC
    except OtherSpecError as exc:
        for folder, old, new in exc.args[0]:
            print(f"verlc: {shown / folder}/ was built from {old} (its manifest says so), not {new}: two specs of "
                  f"one name", file=sys.stderr)
        print("verlc: nothing written; rename one of the specs, or pass --force to replace the bundle",
              file=sys.stderr)
        return EXIT_SPEC
    for b in bundles:
        print(f"wrote {shown / b.folder}/ ({len(b.files)} files)")
    return 0


def _built_with(out: Path) -> dict[str, set[str | None]]:
    """Spec (as bundles name it) -> the site profiles its bundles in `out` were built with (None: without one),
    from each bundle's manifest."""
    found: dict[str, set[str | None]] = {}
    for manifest in sorted(out.glob("*/*/manifest.json")):
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            continue  # not a bundle verlc can read: `differences` names what is wrong with it
        if isinstance(data, dict) and isinstance(data.get("spec"), str):
            found.setdefault(data["spec"], set()).add((data.get("profile") or {}).get("name"))
    return found


def check(paths: Sequence[Path], out: Path, show_diff: bool) -> int:
    """Each spec's bundles as built: with each site profile its bundles in `out` name (out/<name>@<profile>/),
    and without one where it has bundles without one or none at all."""
    from ..targets.bundle import differences

    specs = sorted({p for path in paths for p in (sorted(path.glob("*.yaml")) if path.is_dir() else [path])})
    if not specs:
        print(f"verlc: no specs in {' '.join(map(str, paths))}", file=sys.stderr)
        return EXIT_SPEC
    built = _built_with(out)
    by_profile: dict[str | None, list[Path]] = {}
    for spec in specs:
        for profile in sorted(built.get(_source_name(spec)) or {None}, key=lambda p: p or ""):
            by_profile.setdefault(profile, []).append(spec)
    problems, fixes = [], []
    for profile, group in by_profile.items():
        result = compile_all(group, ["all"], "snapshot", profile=profile, say_notes=False)
        if isinstance(result, int):
            return result
        if _name_clash(result):
            return EXIT_SPEC
        stale = []
        for bundle in bundles_of(result, "all"):
            stale += differences(bundle, out / bundle.folder)
        if stale:
            problems += stale
            fixes.append(f"verlc build {' '.join(map(str, group))} --target all --out {out}"
                         + (f" --profile {profile}" if profile else "")
                         + (" --force" if any(": edited by hand" in s for s, _ in stale) else ""))
    if problems:
        for summary, _ in problems:
            print(summary, file=sys.stderr)
        for _, diff_text in problems if show_diff else ():
            if diff_text:
                print(diff_text, file=sys.stderr)
        print(f"verlc: {len(problems)} generated file(s) out of date"
              + ("" if show_diff else " (`verlc check --diff` shows the changes)") + "; fix with: "
              + "; ".join(fixes), file=sys.stderr)
        return 1
    print(f"{out}/ is up to date with {len(specs)} spec(s)")
    return 0


def diff(a: Path, b: Path, markdown: bool) -> int:
    """Exit 0 when A and B describe the same run, 1 when they differ, 2 on bad input."""
    from ..compiler import diff
    from ..targets import CATALOG

    if a.suffix == ".json" or b.suffix == ".json":
        return _diff_records(a, b, markdown)
    specs = [p / "spec.yaml" if p.is_dir() else p for p in (a, b)]  # a bundle carries its normalized spec
    results = [compile_all([spec], (), "snapshot", max_variants=10**9) for spec in specs]
    if isinstance(results[0], int) or isinstance(results[1], int):
        return next(r for r in results if isinstance(r, int))
    old, new = ({ir.pipeline.stage if ir.pipeline else "": ir for ir in result} for result in results)
    if old.keys() != new.keys():  # a pipeline and a spec of one program, or other stages
        print(f"verlc: {a} and {b} are not runs of the same stages ({', '.join(old) or 'one program'} and "
              f"{', '.join(new) or 'one program'}): diff their stages' bundles", file=sys.stderr)
        return EXIT_SPEC
    differ = False
    for stage in old:
        changes = diff.changes(old[stage], new[stage], CATALOG)
        if stage:
            sys.stdout.write(f"stage {stage}:\n")
        sys.stdout.write(diff.render(str(a), str(b), changes, markdown))
        differ = differ or bool(changes)
    return 1 if differ else 0


def _diff_records(a: Path, b: Path, markdown: bool) -> int:
    """Two run records (what the preflight wrote): exit 0 when the same, 1 when they differ, 2 on bad input."""
    from ..compiler import diff
    from ..runtime.record import record_differences

    records = []
    for path in (a, b):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read a run record: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
            return 2
        if not isinstance(record, dict) or not {"nodes", "versions"} <= record.keys():
            print(f"{path}: not a run record (run-record.json, written by the preflight)", file=sys.stderr)
            return 2
        records.append(record)

    def shown(value: object) -> str | None:
        return value if isinstance(value, str) or value is None else json.dumps(value)

    changes = {group: [(item, shown(old), shown(new)) for item, old, new in rows]
               for group, rows in record_differences(*records).items()}
    sys.stdout.write(diff.render(str(a), str(b), changes, markdown))
    return 1 if changes else 0
