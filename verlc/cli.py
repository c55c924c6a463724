"""`verlc`: the command line. Parses arguments, runs the pipeline, prints problems; nothing below sees argparse."""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from . import __version__

EXIT_SPEC = 2  # bad input: the problems are printed, nothing is written
EXIT_FAILED = 1  # submit --wait/--follow: the run ended in a state other than success
# 3: the scheduler or the ledger could not answer (unknown run, unreachable Ray, a job Slurm forgot)
# 4: the target's tool is not on PATH (sbatch, docker compose, ...)


def _parser() -> argparse.ArgumentParser:
    from .targets import NAMES

    parser = argparse.ArgumentParser(
        prog="verlc", description="Compile verl experiment specs into runnable, reviewable bundles.")
    parser.add_argument("--version", action="version", version=f"verlc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = sub.add_parser("build", help="compile specs into out/<name>/<target>/",
                           description="Compile specs into bundles. All specs build, or nothing is written.")
    build.add_argument("specs", nargs="+", type=Path, metavar="SPEC")
    build.add_argument("--target", required=True, choices=[*NAMES, "all"],
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
    validate.add_argument("--target", choices=[*NAMES, "all"],
                          help="also run the checks of this target (what `build --target` would refuse)")

    check = sub.add_parser("check", help="fail when out/ is not what the specs generate",
                           description="Rebuild in memory and compare with out/: exit 1 with a diff and the "
                                       "command that fixes it when a bundle is stale or was edited by hand.")
    check.add_argument("specs", nargs="*", type=Path, metavar="SPEC|DIR", default=[Path("specs")],
                       help="spec files or folders of them (default: specs/)")
    check.add_argument("--out", type=Path, default=Path("out"), help="output folder (default: out)")
    check.add_argument("--diff", action="store_true", help="print each out-of-date file's unified diff")

    diff = sub.add_parser("diff", help="what differs between two runs (specs, bundle folders or run records)",
                          description="A semantic diff of two specs, or two bundles (their spec.yaml), grouped "
                                      "into verl settings, resources, container, environment and stages; or of "
                                      "two run records (run-record.json in a run's folder), grouped into "
                                      "inputs, versions, verl config and resources.")
    diff.add_argument("a", type=Path, metavar="A")
    diff.add_argument("b", type=Path, metavar="B")
    diff.add_argument("--format", choices=["text", "markdown"], default="text")

    submit = sub.add_parser("submit", help="build (or reuse) a bundle and submit it; record the run",
                            description="Build the spec's bundle into --out (reused when up to date), submit it "
                                        "with the target's own tool from this folder, and append the run to the "
                                        "ledger (runs.jsonl at the spec's git root).")
    submit.add_argument("spec", type=Path, metavar="SPEC")
    submit.add_argument("--target", required=True, choices=NAMES)
    submit.add_argument("--out", type=Path, default=Path("out"), help="output folder (default: out)")
    waiting = submit.add_mutually_exclusive_group()
    waiting.add_argument("--wait", action="store_true", help="return when the run ends, with its outcome")
    waiting.add_argument("--follow", action="store_true", help="print stages and training steps until it ends")
    submit.add_argument("--metric", action="append", default=[], metavar="KEY",
                        help="with --follow: a verl metric to show per step (e.g. critic/score/mean)")
    status = sub.add_parser("status", help="the scheduler's state of a run (default: every unfinished run)")
    status.add_argument("run", nargs="?", metavar="RUN", help="run id, a unique prefix of it, or the job id")
    logs = sub.add_parser("logs", help="a run's log (the job's own, with the trainer's lines)")
    logs.add_argument("run", metavar="RUN")
    logs.add_argument("--follow", action="store_true", help="stages and training steps until the run ends")
    logs.add_argument("--stage", choices=["containers", "ray", "data", "preflight", "train"],
                      help="only the lines of one stage")
    logs.add_argument("--metric", action="append", default=[], metavar="KEY", help="with --follow: metrics to show")
    logs.add_argument("--ray", action="store_true",
                      help="Ray's own logs, which each node kept in the run folder when its Ray stopped (slurm)")
    logs.add_argument("--node", help="with --ray: one node's logs only")
    cancel = sub.add_parser("cancel", help="cancel a run with the target's own tool")
    cancel.add_argument("run", metavar="RUN")
    attach = sub.add_parser("attach", help="a shell (or CMD) where a running job's commands run on its head node",
                            description="Open a shell, or run CMD, on the head node of a running run, inside its "
                                        "container: e.g. `verlc attach RUN -- ray debug` for Ray's legacy debugger.")
    attach.add_argument("run", metavar="RUN")
    attach.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="what to run instead of a shell")
    runs = sub.add_parser("runs", help="every run of the ledger, as a table")
    runs.add_argument("--format", choices=["text", "markdown"], default="text")

    stage_in = sub.add_parser(
        "stage-in", help="fetch a spec's pinned model and prepare its data here, for nodes without internet",
        description="Run the data stage's downloads where you submit jobs (this machine has the internet, compute "
                    "nodes often do not): the pinned model's revision into its folder and each data preparation, "
                    "in the current folder (runtime none: the spec's workdir), which must be storage the nodes "
                    "see. The job's data stage then finds both in place and skips them; set HF_HUB_OFFLINE: '1' "
                    "under the spec's env so that nothing on the nodes asks the hub.")
    stage_in.add_argument("spec", type=Path, metavar="SPEC")

    migrate = sub.add_parser(
        "migrate", help="move a spec to another verl release, every change explained",
        description="Rewrite a spec for another verl release: keys the target release moved go to their new "
                    "place, keys it removed are dropped, and each default the spec relied on that changed is "
                    "set to its old value, so the run behaves as before. Prints the report and a unified diff "
                    "(--write: rewrites the file, comments and quoting kept). Exit 0: the result validates "
                    "against the target release; 1: decisions are left for you (listed with their lines).")
    migrate.add_argument("spec", type=Path, metavar="SPEC")
    migrate.add_argument("--to", required=True, metavar="VERSION", help="the verl release to move to")
    migrate.add_argument("--write", action="store_true", help="rewrite the spec in place instead of printing a diff")
    migrate.add_argument("--write-bases", action="store_true",
                         help="also change the bases the spec extends (they may be shared with other specs)")
    migrate.add_argument("--format", choices=["text", "markdown"], default="text",
                         help="markdown: the report (and the diff) for a pull request")

    explain = sub.add_parser(
        "explain", help="what a verl setting is, in which releases, the rules on it, and where a spec sets it",
        description="Type, default, allowed values and verl's own description of a verl key (dotted, as under "
                    "`verl:`), the releases that have it (and its name where it moved), the verl rules that read "
                    "it; with SPEC, where the spec's value comes from and the exact override its bundle passes.")
    explain.add_argument("key", metavar="KEY", help="e.g. actor_rollout_ref.actor.ppo_mini_batch_size")
    explain.add_argument("spec", nargs="?", type=Path, metavar="SPEC")
    explain.add_argument("--verl-version", metavar="VERSION", help="the release to describe (default: the "
                                                                   "spec's verl_version, else 0.9.1)")

    schema = sub.add_parser("schema", help="print the spec's JSON Schema (or its Markdown reference)",
                            description="Print the spec's JSON Schema, for yaml-language-server and editors.")
    schema.add_argument("--format", choices=["json", "markdown"], default="json")
    schema.add_argument("--verl-version", metavar="VERSION",
                        help="the verl release whose keys `verl:` completes (default: verl_version's default)")
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
        if args.command in ("submit", "status", "logs", "cancel", "runs", "attach"):
            return _lifecycle(args)
        if args.command == "explain":
            return _explain(args.key, args.verl_version, args.spec)
        if args.command == "migrate":
            return _migrate(args.spec, args.to, args.write, args.write_bases, args.format == "markdown")
        if args.command == "stage-in":
            return _stage_in(args.spec)
        if args.command == "schema":
            from .compiler import spec_doc

            from .compiler.verl.release import RELEASES

            if args.verl_version is not None and args.verl_version not in RELEASES:
                print(f"verlc: no schema for verl {args.verl_version}; known: {', '.join(RELEASES)}", file=sys.stderr)
                return EXIT_SPEC
            sys.stdout.write(spec_doc.json_schema(args.verl_version) if args.format == "json" else spec_doc.markdown())
            return 0
        return _validate(args.specs, args.target, args.verl_config, args.max_variants, args.strict)
    except KeyboardInterrupt:
        print("verlc: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`verlc runs | head`): nothing is wrong, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit, too
        return 141
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
                 max_variants: int = 1000, strict: bool = False, submitting: bool = False) -> list | int:
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
    from .targets.slurm.checks import LOG_FOLDER_NOTE

    notes = [note for ir in irs for note in ir.notes if not (submitting and LOG_FOLDER_NOTE in note)]
    for note in notes:
        print(note, file=sys.stderr)
    if strict and notes:
        print(f"verlc: {len(notes)} note(s) and --strict; nothing written", file=sys.stderr)
        return EXIT_SPEC
    return irs


def _validate(specs: Sequence[Path], target: str | None, verl_config: str, max_variants: int,
              strict: bool) -> int:
    targets = [target] if target else []  # "all": each spec's own targets
    result = _compile_all(specs, targets, verl_config, max_variants, strict)
    if isinstance(result, int):
        return result
    for ir in result:
        print(f"{ir.spec_file}: ok ({ir.name}: {ir.nodes} node(s) x {ir.gpus_per_node} GPUs, "
              f"{len(ir.overrides)} verl overrides checked against verl {ir.verl_schema}"
              + (f", {len(ir.variants)} variants" if ir.variants else "") + ")")
    return 0


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


def _build(specs: Sequence[Path], target: str, out: Path, force: bool, verl_config: str,
           max_variants: int, strict: bool) -> int:
    from .targets import render
    from .targets.bundle import EditedError, write

    shown, out = out, out.resolve()  # messages name the folder as the user gave it
    result = _compile_all(specs, [target], verl_config, max_variants, strict)
    if isinstance(result, int):
        return result
    if _name_clash(result):
        return EXIT_SPEC
    bundles = [render(name, ir) for ir in result for name in (ir.targets if target == "all" else [target])]
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
    from .targets import render
    from .targets.bundle import differences

    specs = sorted({p for path in paths for p in (sorted(path.glob("*.yaml")) if path.is_dir() else [path])})
    if not specs:
        print(f"verlc: no specs in {' '.join(map(str, paths))}", file=sys.stderr)
        return EXIT_SPEC
    result = _compile_all(specs, ["all"], "snapshot")
    if isinstance(result, int):
        return result
    if _name_clash(result):
        return EXIT_SPEC
    problems = []
    for ir in result:
        for name in ir.targets:
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

    if a.suffix == ".json" or b.suffix == ".json":
        return _diff_records(a, b, markdown)
    specs = [p / "spec.yaml" if p.is_dir() else p for p in (a, b)]  # a bundle carries its normalized spec
    result = _compile_all(specs, (), "snapshot", max_variants=10**9)
    if isinstance(result, int):
        return result
    changes = diff.changes(result[0], result[1])
    sys.stdout.write(diff.render(str(a), str(b), changes, markdown))
    return 1 if changes else 0


def _explain(key: str, version: str | None, spec: Path | None) -> int:
    from .compiler.diagnostics import SpecError
    from .compiler.explain import explain

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


def _migrate(spec: Path, target: str, write: bool, write_bases: bool, markdown: bool) -> int:
    """Exit 0 when the migrated spec validates against `target`, 1 when decisions are left, 2 on bad input."""
    from .compiler import migrate
    from .compiler.diagnostics import SpecError

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


def _stage_in(spec: Path) -> int:
    """The data stage's downloads, here: exit 0 when everything is in place, 1 when a step failed."""
    from .targets import incluster

    result = _compile_all([spec], (), "snapshot")
    if isinstance(result, int):
        return result
    [ir] = result
    if ir.container.runtime == "none":  # where, and with which python3, the job's data stage runs
        if ir.container.workdir is not None:
            os.chdir(incluster.expand(ir.container.workdir.as_json()))
        if ir.container.venv is not None:
            os.environ["PATH"] = f"{incluster.expand(ir.container.venv.as_json())}/bin:{os.environ['PATH']}"
    if ir.model_fetch is None and not ir.data_prep:
        print(f"{spec}: nothing to stage in (no pinned model, no data preparation)")
        return 0
    rc = 0
    if ir.model_fetch is not None:
        rc = incluster.cmd_materialize(argparse.Namespace(
            repo=ir.model_fetch.repo, revision=ir.model_fetch.revision,
            folder=incluster.expand(ir.model_fetch.folder.as_json())))
    for step in ir.data_prep:
        rc = rc or incluster.cmd_prepare(argparse.Namespace(out_dir=step.out_dir, cmd=list(step.argv)))
    offline = any(e.name == "HF_HUB_OFFLINE" for e in ir.env)
    if rc == 0 and not offline:
        print(f"{spec}: staged in {os.getcwd()}; to keep the nodes off the hub, add HF_HUB_OFFLINE: '1' under "
              f"the spec's env")
    return rc


def _diff_records(a: Path, b: Path, markdown: bool) -> int:
    """Two run records (what the preflight wrote): exit 0 when the same, 1 when they differ, 2 on bad input."""
    from .compiler import diff
    from .targets.incluster import record_differences

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


def _lifecycle(args: argparse.Namespace) -> int:
    """submit / status / logs / cancel / runs: one clear line and an exit code for anything that fails."""
    from .lifecycle import ledger
    from .lifecycle.scheduler import LaunchError
    from .targets.bundle import EditedError

    try:
        if args.command == "submit":
            return _submit(args)
        book = ledger.location(Path.cwd())
        runs = ledger.fold(book)
        if args.command == "runs":
            from .lifecycle.runs import table

            sys.stdout.write(table(list(runs.values()), args.format == "markdown"))
            return 0
        return {"status": _status, "logs": _logs, "cancel": _cancel, "attach": _attach}[args.command](args, book, runs)
    except LaunchError as exc:
        print(f"verlc: {exc}", file=sys.stderr)
        return exc.code
    except ledger.LedgerError as exc:  # an unknown run id, a damaged ledger line
        print(f"verlc: {exc}", file=sys.stderr)
        return 3
    except EditedError as exc:
        print(f"verlc: {', '.join(exc.args[0])}: edited by hand since it was generated; not submitting "
              "(move the edits into the spec, or rebuild with --force)", file=sys.stderr)
        return EXIT_SPEC
    except KeyboardInterrupt:  # Ctrl-C while following: the run itself goes on
        print("\nverlc: stopped following; the run goes on (`verlc status` shows it)", file=sys.stderr)
        return 130


def _submit(args: argparse.Namespace) -> int:
    from .lifecycle import ledger, runs
    from .lifecycle.scheduler import State

    result = _compile_all([args.spec], [args.target], "snapshot", submitting=True)
    if isinstance(result, int):
        return result
    [ir] = result
    folder, written = runs.prepare_bundle(ir, args.target, args.out.resolve())
    print(f"{'wrote' if written else 'up to date:'} {args.out / ir.name / args.target}/")
    book = ledger.location(args.spec)
    submitted = runs.submit(ir, args.spec, args.target, folder, Path.cwd(), dict(os.environ), book)
    for run in submitted:
        print(f"submitted {run.run} (job {run.job_id} on {run.where}); ledger: {book}")
    if not (args.wait or args.follow):
        return 0
    outcomes = [_until_done(book, run, args.follow, args.metric) for run in submitted]
    return 0 if all(o.status is State.SUCCEEDED for o in outcomes) else EXIT_FAILED


def _until_done(book: Path, run, follow: bool, metrics: list[str]):  # noqa: ANN001, ANN202
    import io

    from .lifecycle import runs

    seen = runs.follow(book, run, metrics, sys.stdout if follow else io.StringIO(), tty=sys.stdout.isatty())
    if not follow:  # --follow has printed every state already
        print(f"{run.run}: {seen.state.lower()}" + (f" (exit code {seen.exit_code})" if seen.exit_code else ""))
    return seen


def _status(args: argparse.Namespace, book: Path, known: dict) -> int:
    from .lifecycle import ledger, runs

    chosen = [ledger.find(known, args.run)] if args.run else [r for r in known.values() if not r.final]
    for run in chosen:
        seen = runs.observe(book, run)
        print(f"{run.run}: {seen.state.lower()}" + (f", {seen.restarts} restart(s)" if seen.restarts else "")
              + (f", exit code {seen.exit_code}" if seen.exit_code is not None else "")
              + f" (job {run.job_id} on {run.where}, from {seen.source})")
    if not chosen:
        print("no unfinished runs in " + str(book))
    return 0


def _logs(args: argparse.Namespace, book: Path, known: dict) -> int:
    from .lifecycle import ledger, progress, runs

    run = ledger.find(known, args.run)
    if args.ray:
        sys.stdout.write(runs.ray_logs(run, args.node))
        return 0
    if args.follow:
        runs.follow(book, run, args.metric, sys.stdout, tty=sys.stdout.isatty())
        return 0
    text = runs.log_text(run)
    if args.stage:
        text = "".join(progress.stage_lines(text.splitlines(True), args.stage))
    sys.stdout.write(text)
    return 0


def _cancel(args: argparse.Namespace, book: Path, known: dict) -> int:
    from .lifecycle import ledger, runs

    run = ledger.find(known, args.run)
    seen = runs.cancel(book, run)
    print(f"{run.run}: cancel sent; now {seen.state.lower()}")
    return 0


def _attach(args: argparse.Namespace, book: Path, known: dict) -> int:
    import subprocess

    from .lifecycle import ledger
    from .targets import launcher

    run = ledger.find(known, args.run)
    if run.final:
        print(f"verlc: {run.run} has ended ({run.state.lower()}): nothing to attach to", file=sys.stderr)
        return 3
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    return subprocess.call(launcher(run.target).attach(run.submitted, cmd))
