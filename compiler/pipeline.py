"""The compiler's stages in order: spec file -> Sourced -> Spec -> (checks) -> JobIR."""

from __future__ import annotations

import difflib
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Literal

from .checks import check
from pydantic import ValidationError

from .diagnostics import Diagnostic, SpecError
from .ir import JobIR
from .load import Sourced, load
from .lower import lower
from .spec import TARGET_NAMES, Hydra, Spec
from .verl.check import check_verl_keys, select
from .validate import validate
from .verl.commit import CommitError, commit_release
from .verl.program import ProgramError, resolve
from .verl.release import RELEASES, Release, live, snapshot

VerlConfigSource = Literal["snapshot", "live"]


def compile_spec(path: Path, *, display: str, source: str, targets: Iterable[str] = (),
                 verl_config: VerlConfigSource = "snapshot", max_variants: int = 1000,
                texts: Mapping[Path, str] | None = None) -> JobIR:
    """Compile one spec file; raise SpecError listing every problem.

    `display` names the file in diagnostics; `source` names it in the generated files; `targets` are those
    whose checks run ("all": the spec's own `targets`); `texts` stands in for files by resolved path (load()).
    """
    sourced = load(path, display, texts=texts)
    try:
        spec = validate(sourced)
    except SpecError as exc:
        raise SpecError([*exc.diagnostics, *_verl_problems_anyway(sourced, exc.diagnostics)]) from None
    release = verl_release_for(spec, sourced, verl_config, path)
    spec, release, program_notes = program_for(spec, sourced, release, path)
    meant = spec.targets or TARGET_NAMES
    targets = [t for t in targets if t != "all"] + (list(meant) if "all" in targets else [])  # "all": the spec's
    notes = (*program_notes, *check(spec, sourced, release, targets, max_variants))
    ir = lower(spec, release, spec_file=source, spec_sha256=sourced.sha256, notes=tuple(map(str, notes)),
               targets=tuple(meant), built=tuple(dict.fromkeys(targets)))
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
    if spec.code is not None or spec.program.split(".")[0] == "verl":
        return folder(spec_path, spec.code)
    found = subprocess.run(["git", "-C", str(spec_path.parent.resolve()), "rev-parse", "--show-toplevel"],
                           capture_output=True, text=True)
    return Path(found.stdout.strip()) if found.returncode == 0 else None


def program_for(spec: Spec, sourced: Sourced, release: Release, spec_path: Path
                ) -> tuple[Spec, Release, tuple[Diagnostic, ...]]:
    """The spec (verl_version filled from its commit) and the release with the program's composed config as
    its primary one; notes on what the composition left to Hydra."""
    if release.commit is not None:
        if "verl_version" in spec.model_fields_set and spec.verl_version != release.version:
            raise SpecError([sourced.diagnostic(("verl_version",), f"verl commit {release.commit[:12]} installs "
                                                f"as verl {release.version}, not {spec.verl_version} (leave "
                                                f"verl_version out: it follows the commit)")])
        spec = spec.model_copy(update={"verl_version": release.version})
    code = code_folder(spec, spec_path)
    if spec.code is not None and (code is None or not code.is_dir()):
        raise SpecError([sourced.diagnostic(("code",), f"no folder {code}")])
    try:
        program = resolve(spec.program, spec.hydra.config_name, release, code=code, verl_source=None)
    except ProgramError as exc:
        raise SpecError([sourced.diagnostic(exc.where, str(exc))]) from None
    return spec, program.release, tuple(sourced.diagnostic(("program",), n) for n in program.notes)


def verl_release_for(spec: Spec, sourced: Sourced, source: VerlConfigSource, spec_path: Path | None = None
                     ) -> Release:
    """The shipped schema of the spec's verl_version, its commit's schema, or the installed verl's own files."""
    if spec.verl_commit is not None:
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
