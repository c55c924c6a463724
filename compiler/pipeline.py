"""The compiler's stages in order: spec file -> Sourced -> Spec -> (checks) -> JobIR."""

from __future__ import annotations

import difflib
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
    release = verl_release_for(spec, sourced, verl_config)
    meant = spec.targets or TARGET_NAMES
    targets = [t for t in targets if t != "all"] + (list(meant) if "all" in targets else [])  # "all": the spec's
    notes = check(spec, sourced, release, targets, max_variants)
    ir = lower(spec, release, spec_file=source, spec_sha256=sourced.sha256, notes=tuple(map(str, notes)),
               targets=tuple(meant), built=tuple(dict.fromkeys(targets)))
    if verl_config == "live":
        _compose_live(ir, sourced)
    return ir


def _verl_problems_anyway(sourced: Sourced, found: Iterable[Diagnostic]) -> list[Diagnostic]:
    """The `verl:` section's own problems when other sections failed validation but verl, verl_version and
    hydra did not: spec mistakes must not hide verl mistakes. Checked against the shipped schema."""
    data = sourced.data if isinstance(sourced.data, dict) else {}
    if any(d.path.split(".")[0].split("[")[0] in ("verl", "verl_version", "hydra", "<spec>", "") for d in found):
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


def verl_release_for(spec: Spec, sourced: Sourced, source: VerlConfigSource) -> Release:
    """The shipped schema of the spec's verl_version, or the installed verl's own files."""
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
