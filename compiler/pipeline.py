"""The compiler's stages in order: spec file -> Sourced -> Spec -> (checks) -> JobIR."""

from __future__ import annotations

import difflib
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

from .checks import check
from pydantic import ValidationError

from .diagnostics import Diagnostic, SpecError
from .ir import CodeIR, JobIR, PipelineIR
from . import profile as profiles
from . import stages
from .load import Sourced, load
from .lower import lower
from .catalog import Catalog
from .spec import Hydra, Spec
from .verl.check import check_verl_keys, select, settings
from .validate import validate
from .code import bundle_folder, has_code, inside, named_files, sha256 as file_sha256, state as code_state
from .verl.commit import CommitError, commit_release, git_differs, has_commit
from .verl.program import Program, ProgramError, resolve
from .verl.release import RELEASES, Release, live, snapshot

VerlConfigSource = Literal["snapshot", "live"]


def compile_spec(path: Path, catalog: Catalog, *, display: str, source: str, targets: Iterable[str] = (),
                 verl_config: VerlConfigSource = "snapshot", max_variants: int = 1000,
                 texts: Mapping[Path, str] | None = None, accept_changes: bool = False,
                 profile: str | None = None) -> JobIR:
    """Compile one spec file; raise SpecError listing every problem.

    `display` names the file in diagnostics; `source` names it in the generated files; `targets` are those
    whose checks run ("all": the spec's own `targets`); `texts` stands in for files by resolved path (load());
    `accept_changes`: a reproducible spec builds from code with uncommitted changes (they are recorded);
    `profile`: the site profile composed under the spec (compiler/profile.py); `catalog`: the targets (the
    registry's targets.CATALOG, which the commands hand in).
    """
    sourced = load(path, display, texts=texts)
    if "stages" in sourced.data:
        raise SpecError([sourced.diagnostic(("stages",), "a pipeline: this command takes a spec of one program "
                                                         "(verlc validate, plan, build and submit take pipelines)",
                                            at_key=True)])
    return _compile(sourced, path, catalog, source=source, targets=targets, verl_config=verl_config,
                    max_variants=max_variants, texts=texts, accept_changes=accept_changes, profile=profile)


def compile_file(path: Path, catalog: Catalog, *, display: str, source: str, targets: Iterable[str] = (),
                 verl_config: VerlConfigSource = "snapshot", max_variants: int = 1000,
                 accept_changes: bool = False, profile: str | None = None,
                 texts: Mapping[Path, str] | None = None) -> list[JobIR]:
    """Compile one spec file: one job, or a pipeline's (compiler/stages.py), one per stage in the order they
    run; SpecError listing every problem of every stage. `texts`: as compile_spec's."""
    sourced = load(path, display, texts=texts)
    parts = stages.split(sourced)
    options = dict(source=source, targets=targets, verl_config=verl_config, max_variants=max_variants,
                   accept_changes=accept_changes, profile=profile, texts=texts)
    if parts is None:
        return [_compile(sourced, path, catalog, **options)]  # type: ignore[arg-type]
    running = {t.name: t.pipelines for t in catalog.targets if t.pipelines}
    how = "; ".join(f"{name}: {way}" for name, way in running.items())
    asked = [t for t in (*targets, *(sourced.data.get("targets") or [])) if t in catalog.names]
    problems = [sourced.diagnostic(("stages",), f"the {t} target runs one program per job: a pipeline's stages "
                                                f"run on {' and '.join(running)} ({how}); set targets: to those",
                                   at_key=True)
                for t in dict.fromkeys(asked) if t not in running]
    if not sourced.data.get("targets") and "all" in targets:
        problems.append(sourced.diagnostic(("stages",), f"a pipeline runs on {' and '.join(running)} only ({how}): "
                                                        f"set targets: to those", at_key=True))
    if problems:
        raise SpecError(problems)
    done: dict[str, JobIR] = {}
    compiled: list[tuple[stages.StageSpec, JobIR]] = []
    names = tuple(f"{sourced.data.get('name')}-{p.name}" for p in parts)
    for part in parts:
        inputs: list = []
        try:
            if any(stage not in done for _, stage, _ in part.takes):
                continue  # an earlier stage has problems of its own, reported already
            for loc, stage, output in part.takes:
                producer = done[stage]
                if output == "model":
                    part, taken = stages.take(part, producer, torchrun=producer.launch[0] == "torchrun")
                    inputs.append(taken)
                else:
                    part = stages.take_output(part, loc, producer)
            ir = _compile(part.sourced, path, catalog, **options)  # type: ignore[arg-type]
        except SpecError as exc:
            problems += exc.diagnostics
            continue
        ir = replace(ir, pipeline=PipelineIR(str(sourced.data["name"]), part.name, part.index, names, tuple(inputs)))
        done[part.name] = ir
        compiled.append((part, ir))
    problems += stages.same_checkpoints(compiled)
    if not problems:
        together = [(part.sourced, ir) for part, ir in compiled]
        problems += [p for t in dict.fromkeys(asked) for p in catalog.get(t).check_pipeline(together)]
    if problems:
        raise SpecError(problems)
    return [ir for _, ir in compiled]


def _compile(sourced: Sourced, path: Path, catalog: Catalog, *, source: str, targets: Iterable[str],
             verl_config: VerlConfigSource, max_variants: int, texts: Mapping[Path, str] | None = None,
             accept_changes: bool, profile: str | None) -> JobIR:
    site, profile_notes = None, []
    if profile is not None:
        sourced, site, profile_notes = profiles.under(sourced, path, profile, catalog, texts)
    try:
        spec = validate(sourced, catalog.spec)
    except SpecError as exc:
        raise SpecError([*exc.diagnostics, *_verl_problems_anyway(sourced, exc.diagnostics)]) from None
    release = verl_release_for(spec, sourced, verl_config, path)
    spec, program, root = program_for(spec, sourced, release, path)
    release = program.release
    meant = spec.targets or catalog.names
    targets = [t for t in targets if t != "all"] + (list(meant) if "all" in targets else [])  # "all": the spec's
    notes = (*profile_notes, *(sourced.diagnostic(("program",), n) for n in program.notes),
             *check(spec, sourced, release, catalog, targets, max_variants, code=root))
    code = None
    if root is not None:
        code, code_notes = code_for(spec, sourced, program, root, path, accept_changes)
        notes = (*notes, *code_notes)
    else:
        notes = (*notes, *_unshipped(spec, sourced, program, path))
    ir = lower(spec, release, catalog, spec_file=source, spec_sha256=sourced.sha256, notes=tuple(map(str, notes)),
               targets=tuple(meant), built=tuple(dict.fromkeys(targets)), code=code,
               profile=(site.name, site.file, site.sha256) if site else None, sourced=sourced)
    if verl_config == "live":
        _compose_live(ir, sourced)
    return ir


def _verl_problems_anyway(sourced: Sourced, found: Iterable[Diagnostic]) -> list[Diagnostic]:
    """The `verl:` section's own problems when other sections failed validation but verl, verl_version and
    hydra did not: spec mistakes must not hide verl mistakes. Checked against the shipped schema."""
    data = sourced.data if isinstance(sourced.data, dict) else {}
    if "verl_commit" in data or "program" in data or any(
            d.path.split(".")[0].split("[")[0] in ("verl", "verl_version", "hydra", "<spec>", "") for d in found):
        return []
    try:
        hydra = Hydra.model_validate(data.get("hydra", {}))
        release = snapshot(str(data.get("verl_version", Spec.model_fields["verl_version"].default)))
    except (ValidationError, KeyError):
        return []
    verl = data.get("verl", {})
    chosen = select(verl, release, hydra.config_name) if isinstance(verl, dict) else "no verl section"
    if isinstance(chosen, str) or hydra.groups:
        return []
    return check_verl_keys(verl, sourced, chosen)


def folder(spec_path: Path, value: str | None) -> Path | None:
    """A folder the spec names, relative to the spec's own folder."""
    return None if value is None else (spec_path.parent / os.path.expanduser(value)).resolve()


def code_folder(spec: Spec, spec_path: Path) -> Path | None:
    """The run's code: the spec's `code:`, else (for a program of its own) the git checkout holding the spec."""
    if spec.code is not None or not has_code(spec):
        return folder(spec_path, spec.code)
    found = subprocess.run(["git", "-C", str(spec_path.parent.resolve()), "rev-parse", "--show-toplevel"],
                           capture_output=True, text=True)
    return Path(found.stdout.strip()) if found.returncode == 0 else None


def program_for(spec: Spec, sourced: Sourced, release: Release, spec_path: Path
                ) -> tuple[Spec, Program, Path | None]:
    """The spec (verl_version filled from its commit), the program (its release has the program's composed
    config as its primary one) and the run's code folder, if the spec has one."""
    if release.commit is not None:
        if "verl_version" in spec.model_fields_set and spec.verl_version != release.version:
            raise SpecError([sourced.diagnostic(("verl_version",), f"verl commit {release.commit[:12]} installs "
                                                f"as verl {release.version}, not {spec.verl_version} (leave "
                                                f"verl_version out: it follows the commit)")])
        spec = spec.model_copy(update={"verl_version": release.version})
    code = code_folder(spec, spec_path)
    if spec.code is not None and (code is None or not code.is_dir()):
        raise SpecError([sourced.diagnostic(("code",), f"no folder {code}: the run's code must be checked out "
                                                       f"there first (the spec's comments may say how)")])
    try:
        program = resolve(spec.program, spec.hydra.config_name, release, code=code, verl_source=None,
                          config_dir=spec.hydra.config_dir)
    except ProgramError as exc:
        raise SpecError([sourced.diagnostic(exc.where, str(exc))]) from None
    return spec, program, code


def code_for(spec: Spec, sourced: Sourced, program: Program, root: Path, spec_path: Path,
             accept_changes: bool) -> tuple[CodeIR, tuple[Diagnostic, ...]]:
    """The run's code as built: its git state and the files the program and the spec's settings name, each
    of which must exist inside it; a reproducible run refuses uncommitted changes unless told to accept them."""
    problems: list[Diagnostic] = []
    notes: list[Diagnostic] = []
    commit, dirty, diff = code_state(root)
    where = ("code",) if spec.code is not None else ("program",)
    if dirty and spec.reproducible and not accept_changes:
        changed = sum(1 for line in diff.splitlines() if line.startswith(("diff --git", "untracked ")))
        problems.append(sourced.diagnostic(where, f"the code in {root} has uncommitted changes ({changed} files): "
                                                  f"a reproducible run names a commit; commit them, or build with "
                                                  f"VERLC_ACCEPT_CHANGES=1 (the diff is then recorded with the run)"))
    if spec.verl_commit and (root / "verl" / "__init__.py").is_file():
        # python3 -m PROGRAM puts the working dir first on sys.path: the code's verl/ is the verl that runs
        if commit is None or not has_commit(root, spec.verl_commit):
            notes.append(sourced.diagnostic(("verl_commit",), f"note: the code's verl/ is what the job imports; "
                                            f"its history lacks {spec.verl_commit[:12]}, so verlc cannot tell "
                                            f"whether it is that commit (the preflight checks each node's "
                                            f"installed verl)"))
        elif git_differs(root, spec.verl_commit, "verl"):
            problems.append(sourced.diagnostic(("verl_commit",), f"the code's verl/ (what the job imports) differs "
                                                                 f"from commit {spec.verl_commit[:12]}: check it "
                                                                 f"out, or pin the commit it is"))
    files: dict[str, str] = {}
    config = program.config_dir / f"{program.config_name}.yaml" if program.config_dir else None
    if config is not None and config.resolve().is_relative_to(root.resolve()):
        files[config.resolve().relative_to(root.resolve()).as_posix()] = file_sha256(config)
    for relative, loc in _named_files(spec, program):
        if not inside(root, relative):
            problems.append(sourced.diagnostic(loc, f"{relative} lies outside the run's code ({root}): the job "
                                                    f"would not have it"))
        elif not (root / relative).is_file():
            problems.append(sourced.diagnostic(loc, f"no file {relative} in the run's code ({root})"))
        else:
            files[os.path.normpath(relative)] = file_sha256(root / relative)
    if problems:
        raise SpecError(problems)
    return CodeIR(bundle_folder(spec_path, root), commit, dirty, diff, tuple(sorted(files.items()))), tuple(notes)


def _named_files(spec: Spec, program: Program) -> list[tuple[str, tuple[str | int, ...]]]:
    """(relative path, where the spec says it) of each file a verl setting names in the run's code."""
    chosen = select(spec.verl, program.release, spec.hydra.config_name, spec.hydra.groups)
    given = {s.key: s for s in settings(spec.verl, chosen.walker)} if not isinstance(chosen, str) else {}
    return [(relative, given[key].loc) for key, relative in named_files({k: s.value for k, s in given.items()}).items()]


def _unshipped(spec: Spec, sourced: Sourced, program: Program, spec_path: Path) -> list[Diagnostic]:
    """Without a code folder, a file a verl setting names by a relative path is read from wherever the job runs,
    which verlc neither ships nor sees: a note for each, saying whether it is beside the spec."""
    notes = []
    for relative, loc in _named_files(spec, program):
        beside = (spec_path.parent / relative).is_file()
        notes.append(sourced.diagnostic(loc, (
            f"note: {relative} is read from the job's working directory, which this spec does not ship (it has no "
            f"`code:`); " + ("it is beside the spec: `code: .` ships it, and verlc then checks and hashes it" if beside
                             else f"there is no {relative} beside the spec either: set `code:` to the folder that "
                                  f"holds it, and verlc then checks, ships and hashes it"))))
    return notes


def verl_release_for(spec: Spec, sourced: Sourced, source: VerlConfigSource, spec_path: Path | None = None
                     ) -> Release:
    """The shipped schema of the spec's verl_version, its commit's schema, or the installed verl's own files."""
    if spec.verl_commit is not None:
        if source == "live":
            raise SpecError([sourced.diagnostic(("verl_commit",), f"--verl-config live checks against the installed "
                                                f"verl; this spec pins verl to commit {spec.verl_commit[:12]}, whose "
                                                f"own configs verlc reads: leave --verl-config live out")])
        checkout = folder(spec_path, spec.verl_checkout or spec.code) if spec_path else None
        if spec.verl_checkout is not None and (checkout is None or not checkout.is_dir()):
            raise SpecError([sourced.diagnostic(("verl_checkout",), f"no folder {checkout}")])
        try:
            return commit_release(spec.verl_commit, checkout)
        except CommitError as exc:
            where = ("verl_checkout",) if spec.verl_checkout else ("verl_commit",)
            raise SpecError([sourced.diagnostic(where, str(exc))]) from None
    if source == "live":
        try:
            release = live()
        except Exception as exc:  # no verl, or a verl whose config does not compose
            message = " ".join(str(exc).split())
            raise SpecError([sourced.diagnostic(("verl_version",), f"--verl-config live: {message}")]) from None
        if release.version != spec.verl_version:
            raise SpecError([sourced.diagnostic(("verl_version",), f"the spec targets verl {spec.verl_version} "
                                                f"but verl {release.version} is installed")])
        return release
    try:
        return snapshot(spec.verl_version)
    except KeyError:
        known = RELEASES
        near = difflib.get_close_matches(spec.verl_version, known, n=1, cutoff=0.6)
        raise SpecError([sourced.diagnostic(
            ("verl_version",), f"verlc has no schema for verl {spec.verl_version}; known: {', '.join(known)} "
                               f"({f'did you mean {near[0]}? ' if near else ''}or check against an installed "
                               f"verl with --verl-config live)")]) from None


def _compose_live(ir: JobIR, sourced: Sourced) -> None:
    """Hydra's own verdict on the exact overrides the bundle will pass."""
    from .verl.extract import compose
    from .verl.release import installed_package

    try:
        compose(installed_package() / "trainer" / "config", ir.config_name,
                [o.arg for o in ir.overrides if not o.key.startswith("--")])
    except Exception as exc:
        message = " ".join(str(exc).split())
        named = [o for o in ir.overrides if f"'{o.key}'" in message or f"'{o.arg}'" in message]
        loc: tuple[str | int, ...] = ("verl",)
        if named and named[0].origin.startswith("hydra.groups."):
            loc = ("hydra", "groups", named[0].origin.removeprefix("hydra.groups."))
        elif named and named[0].origin.startswith(("verl.", "hydra.")):
            loc = tuple(named[0].origin.split("."))
        raise SpecError([sourced.diagnostic(loc, f"verl's config (composed by Hydra with the installed verl) "
                                                 f"refuses this: {message}", at_key=True)]) from None
