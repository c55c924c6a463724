"""`verlc`: the command line. Parses arguments, runs the pipeline, prints problems; nothing below sees argparse."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from . import __version__

EXIT_SPEC = 2  # bad input: the problems are printed, nothing is written


def _parser() -> argparse.ArgumentParser:
    from .targets import TARGETS

    parser = argparse.ArgumentParser(
        prog="verlc", description="Compile verl experiment specs into runnable, reviewable bundles.")
    parser.add_argument("--version", action="version", version=f"verlc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = sub.add_parser("build", help="compile specs into out/<name>/<target>/",
                           description="Compile specs into bundles. All specs build, or nothing is written.")
    build.add_argument("specs", nargs="+", type=Path, metavar="SPEC")
    build.add_argument("--target", required=True, choices=[*TARGETS, "all"],
                       help="which bundle to generate; 'all' builds every target")
    build.add_argument("--out", type=Path, default=Path("out"), help="output folder (default: out)")
    build.add_argument("--force", action="store_true",
                       help="overwrite generated files even if they were edited by hand")
    for command in (build, validate := sub.add_parser(
            "validate", help="check specs without writing anything",
            description="Load, validate and check specs against verl's config; print every problem.")):
        command.add_argument("--verl-config", choices=["snapshot", "live"], default="snapshot",
                             help="check `verl:` against the shipped schema of the spec's verl_version "
                                  "(default) or against the installed verl")
        command.add_argument("--strict", action="store_true",
                             help="treat notes (what verlc cannot check, paths a container would lose) as errors")
        command.add_argument("--max-variants", type=int, default=1000, metavar="N",
                             help="refuse sweeps with more variants than this (default 1000)")
    validate.add_argument("specs", nargs="+", type=Path, metavar="SPEC")
    validate.add_argument("--target", choices=[*TARGETS, "all"],
                          help="also run the checks of this target (what `build --target` would refuse)")

    check = sub.add_parser("check", help="fail when out/ is not what the specs generate",
                           description="Rebuild in memory and compare with out/: exit 1 with a diff and the "
                                       "command that fixes it when a bundle is stale or was edited by hand.")
    check.add_argument("specs", nargs="*", type=Path, metavar="SPEC|DIR", default=[Path("specs")],
                       help="spec files or folders of them (default: specs/)")
    check.add_argument("--out", type=Path, default=Path("out"), help="output folder (default: out)")
    check.add_argument("--diff", action="store_true", help="print each out-of-date file's unified diff")

    diff = sub.add_parser("diff", help="what differs between two runs (specs or bundle folders)",
                          description="A semantic diff of two specs, or two bundles (their spec.yaml), grouped "
                                      "into verl settings, resources, container, environment and stages.")
    diff.add_argument("a", type=Path, metavar="A")
    diff.add_argument("b", type=Path, metavar="B")
    diff.add_argument("--format", choices=["text", "markdown"], default="text")

    schema = sub.add_parser("schema", help="print the spec's JSON Schema (or its Markdown reference)",
                            description="Print the spec's JSON Schema, for yaml-language-server and editors.")
    schema.add_argument("--format", choices=["json", "markdown"], default="json")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # pydantic looks for plugins (validation observers) by reading every installed package's entry
    # points before it builds the first model; verlc has none to observe, and that scan is a tenth of
    # a cold build (docs/performance.md).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            return _build(args.specs, args.target, args.out, args.force, args.verl_config, args.max_variants,
                          args.strict)
        if args.command == "check":
            return _check(args.specs, args.out, args.diff)
        if args.command == "diff":
            return _diff(args.a, args.b, args.format == "markdown")
        if args.command == "schema":
            from .compiler import spec_doc

            sys.stdout.write(spec_doc.json_schema() if args.format == "json" else spec_doc.markdown())
            return 0
        return _validate(args.specs, args.target, args.verl_config, args.max_variants, args.strict)
    except KeyboardInterrupt:
        print("verlc: interrupted; nothing was written", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug in verlc, not in the spec
        if os.environ.get("VERLC_DEBUG") == "1":
            traceback.print_exc()
        else:
            print(f"verlc: internal error: {type(exc).__name__}: {exc} "
                  f"(run with VERLC_DEBUG=1 for the traceback)", file=sys.stderr)
        return 70


def _source_name(spec: Path) -> str:
    """How generated files name their spec: relative to the enclosing git checkout, so the same
    spec gives the same bytes from any working directory or output folder."""
    path = spec.resolve()
    for folder in path.parents:
        if (folder / ".git").exists():
            return path.relative_to(folder).as_posix()
    return path.name


def _compile_all(specs: Sequence[Path], targets: Sequence[str], verl_config: str,
                 max_variants: int = 1000, strict: bool = False) -> list | int:
    from .compiler.diagnostics import SpecError
    from .compiler.pipeline import compile_spec

    irs, problems = [], []
    for spec in specs:
        try:
            irs.append(compile_spec(spec, display=str(spec), source=_source_name(spec), targets=targets,
                                    verl_config=verl_config, max_variants=max_variants))
        except SpecError as exc:
            problems.extend(exc.diagnostics)
    if problems:
        for d in problems:
            print(d, file=sys.stderr)
        print(f"verlc: {len(problems)} problem(s); nothing written", file=sys.stderr)
        return EXIT_SPEC
    notes = [note for ir in irs for note in ir.notes]
    for note in notes:
        print(note, file=sys.stderr)
    if strict and notes:
        print(f"verlc: {len(notes)} note(s) and --strict; nothing written", file=sys.stderr)
        return EXIT_SPEC
    return irs


def _validate(specs: Sequence[Path], target: str | None, verl_config: str, max_variants: int,
              strict: bool) -> int:
    from .targets import TARGETS

    targets = list(TARGETS) if target == "all" else [target] if target else []
    result = _compile_all(specs, targets, verl_config, max_variants, strict)
    if isinstance(result, int):
        return result
    for ir in result:
        print(f"{ir.spec_file}: ok ({ir.name}: {ir.nodes} node(s) x {ir.gpus_per_node} GPUs, "
              f"{len(ir.overrides)} verl overrides checked against verl {ir.verl_schema}"
              + (f", {len(ir.variants)} variants" if ir.variants else "") + ")")
    return 0


def _build(specs: Sequence[Path], target: str, out: Path, force: bool, verl_config: str,
           max_variants: int, strict: bool) -> int:
    from .targets import TARGETS, render
    from .targets.bundle import EditedError, write

    names = list(TARGETS) if target == "all" else [target]
    shown, out = out, out.resolve()  # messages name the folder as the user gave it
    result = _compile_all(specs, names, verl_config, max_variants, strict)
    if isinstance(result, int):
        return result
    seen: dict[str, str] = {}
    for ir in result:
        if ir.name in seen:
            print(f"verlc: {ir.spec_file} and {seen[ir.name]} both have name '{ir.name}'; "
                  f"bundles would overwrite each other", file=sys.stderr)
            return EXIT_SPEC
        seen[ir.name] = ir.spec_file
    bundles = [render(name, ir) for ir in result for name in names]
    try:
        write(bundles, out, force=force)
    except EditedError as exc:
        for rel in exc.args[0]:
            print(f"verlc: {out / rel}: edited by hand since it was generated", file=sys.stderr)
        print("verlc: nothing written; move your edits into the spec, or pass --force to discard them",
              file=sys.stderr)
        return EXIT_SPEC
    for b in bundles:
        print(f"wrote {shown / b.folder}/ ({len(b.files)} files)")
    return 0


def _check(paths: Sequence[Path], out: Path, show_diff: bool) -> int:
    from .targets import TARGETS, render
    from .targets.bundle import differences

    specs = sorted({p for path in paths for p in (sorted(path.glob("*.yaml")) if path.is_dir() else [path])})
    if not specs:
        print(f"verlc: no specs in {' '.join(map(str, paths))}", file=sys.stderr)
        return EXIT_SPEC
    result = _compile_all(specs, list(TARGETS), "snapshot")
    if isinstance(result, int):
        return result
    problems = []
    for ir in result:
        for name in TARGETS:
            bundle = render(name, ir)
            problems += differences(bundle, out / bundle.folder)
    if problems:
        for summary, _ in problems:
            print(summary, file=sys.stderr)
        for _, diff_text in problems if show_diff else ():
            if diff_text:
                print(diff_text, file=sys.stderr)
        print(f"verlc: {len(problems)} generated file(s) out of date"
              + ("" if show_diff else " (`verlc check --diff` shows the changes)") + "; fix with: "
              f"verlc build {' '.join(map(str, specs))} --target all --out {out}"
              + (" --force" if any(": edited by hand" in s for s, _ in problems) else ""), file=sys.stderr)
        return 1
    print(f"{out}/ is up to date with {len(specs)} spec(s)")
    return 0


def _diff(a: Path, b: Path, markdown: bool) -> int:
    """Exit 0 when A and B describe the same run, 1 when they differ, 2 on bad input."""
    from .compiler import diff

    specs = [p / "spec.yaml" if p.is_dir() else p for p in (a, b)]  # a bundle carries its normalized spec
    result = _compile_all(specs, (), "snapshot", max_variants=10**9)
    if isinstance(result, int):
        return result
    changes = diff.changes(result[0], result[1])
    sys.stdout.write(diff.render(str(a), str(b), changes, markdown))
    return 1 if changes else 0
