"""explain, migrate, schema and stage-in: verlc's tools for verl itself (its keys, releases and inputs)."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .build import EXIT_SPEC, compile_all

EXIT_FAILED = 1  # migrate: decisions are left; stage-in: a step failed


def explain(key: str, version: str | None, spec: Path | None, profile: str | None = None) -> int:
    from ..compiler.diagnostics import SpecError
    from ..compiler.explain import explain
    from ..targets import CATALOG

    if spec is not None and version is not None:
        print("verlc: give SPEC or --verl-version, not both: a spec names its release", file=sys.stderr)
        return EXIT_SPEC
    if profile is not None and spec is None:
        print("verlc: --profile composes a site profile under SPEC; give SPEC", file=sys.stderr)
        return EXIT_SPEC
    try:
        sys.stdout.write(explain(key, CATALOG, version, spec, profile))
    except SpecError as exc:
        for d in exc.diagnostics:
            print(d if d.file != "<command line>" else f"verlc: {d.message}", file=sys.stderr)
        return EXIT_SPEC
    return 0


def migrate(spec: Path, target: str, write: bool, write_bases: bool, markdown: bool) -> int:
    """Exit 0 when the migrated spec validates against `target`, 1 when decisions are left, 2 on bad input."""
    from ..compiler import migrate
    from ..compiler.diagnostics import SpecError
    from ..targets import CATALOG

    try:
        plan = migrate.plan(spec, target, CATALOG, write_bases=write_bases)
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


def schema(fmt: str, version: str | None, spec: Path | None = None) -> int:
    """The spec's JSON Schema (for a verl release's keys under `verl:`, or for SPEC's program at its release or
    commit), or its Markdown reference."""
    from ..compiler import spec_doc
    from ..compiler.verl.release import RELEASES
    from ..targets import CATALOG

    if spec is not None:
        if version is not None or fmt != "json":
            print("verlc: --spec gives the JSON Schema of SPEC's program at its own release or commit: leave out "
                  "--verl-version and --format", file=sys.stderr)
            return EXIT_SPEC
        return _program_schema(spec)
    if version is not None and version not in RELEASES:
        print(f"verlc: no schema for verl {version}; known: {', '.join(RELEASES)}", file=sys.stderr)
        return EXIT_SPEC
    sys.stdout.write(spec_doc.json_schema(CATALOG, version) if fmt == "json" else spec_doc.markdown(CATALOG))
    return 0


def _program_schema(path: Path) -> int:
    from ..compiler import spec_doc
    from ..compiler.diagnostics import SpecError
    from ..compiler.load import load
    from ..compiler.pipeline import program_for, verl_release_for
    from ..compiler.validate import validate
    from ..targets import CATALOG

    try:
        sourced = load(path, str(path))
        spec = validate(sourced, CATALOG.spec)
        _, program, _ = program_for(spec, sourced, verl_release_for(spec, sourced, "snapshot", path), path)
    except SpecError as exc:
        for d in exc.diagnostics:
            print(d, file=sys.stderr)
        return EXIT_SPEC
    sys.stdout.write(spec_doc.json_schema(CATALOG, program=program))
    print(f"verlc: save it beside the spec (e.g. {path.stem}.schema.json) and make the spec's first line "
          f"`# yaml-language-server: $schema={path.stem}.schema.json`", file=sys.stderr)
    return 0


def stage_in(spec: Path) -> int:
    """The data stage's downloads, here: exit 0 when everything is in place, 1 when a step failed."""
    from ..runtime.data import materialize, prepare
    from ..runtime.job import expand

    result = compile_all([spec], (), "snapshot")
    if isinstance(result, int):
        return result
    ir = result[0]  # a pipeline's stages share the container: where the data stage runs
    if ir.container.runtime == "none":  # where, and with which python3, the job's data stage runs
        if ir.container.workdir is not None:
            os.chdir(expand(ir.container.workdir.as_json()))
        if ir.container.venv is not None:
            os.environ["PATH"] = f"{expand(ir.container.venv.as_json())}/bin:{os.environ['PATH']}"
    fetches = list(dict.fromkeys(i.model_fetch for i in result if i.model_fetch is not None))  # each stage's
    preparing = list(dict.fromkeys(step for i in result for step in i.data_prep))
    if not fetches and not preparing:
        print(f"{spec}: nothing to stage in (no pinned model, no data preparation)")
        return 0
    rc = 0
    for fetch in fetches:
        rc = rc or materialize(fetch.repo, fetch.revision, expand(fetch.folder.as_json()))
    for step in preparing:
        rc = rc or prepare(step.out_dir, list(step.argv))
    offline = any(e.name == "HF_HUB_OFFLINE" for e in ir.env)
    if rc == 0 and not offline:
        print(f"{spec}: staged in {os.getcwd()}; to keep the nodes off the hub, add HF_HUB_OFFLINE: '1' under "
              f"the spec's env")
    return rc


def import_script(script: Path, args: Sequence[str], version: str | None, commit: str | None, out: Path | None,
                  timeout: float, given: Sequence[str], accelerator: str = "cuda", then: Sequence[str] = (),
                  checkout: Path | None = None, services: Sequence[str] = ()) -> int:
    """The spec a launch script's trainer command means: on stdout, or written to `out`; with `then` (the next
    stages' scripts, each with its arguments), a pipeline spec of them all. Exit 2 with the reasons, positioned
    in the script, when it cannot be read or its spec does not validate."""
    import shlex

    from ..compiler.diagnostics import Diagnostic
    from ..compiler.import_script import ImportFailed

    scripts = [(script, tuple(args))]
    servers: list[tuple[Path, tuple[str, ...]]] = []
    for option, item in [*(("--then", i) for i in then), *(("--service", i) for i in services)]:
        words = shlex.split(item)
        if not words:
            print(f"verlc: {option} names a script (and its arguments)", file=sys.stderr)
            return EXIT_SPEC
        (scripts if option == "--then" else servers).append((Path(words[0]), tuple(words[1:])))
    if servers and len(scripts) > 1:
        print("verlc: --service with --then: a pipeline's services are not imported yet; import the stage that "
              "calls the server with --service, then add the others as its pipeline", file=sys.stderr)
        return EXIT_SPEC
    for path, _ in [*scripts, *servers]:
        if not path.is_file():
            print(f"verlc: no script {path}", file=sys.stderr)
            return EXIT_SPEC
    if out is not None and out.exists():
        print(f"verlc: {out} exists: import writes a new spec (remove it, or name another file)", file=sys.stderr)
        return EXIT_SPEC
    if checkout is not None:
        if version is not None:
            print("verlc: --verl-checkout pins the checkout's commit; --verl-version names a release instead: "
                  "give one", file=sys.stderr)
            return EXIT_SPEC
        head = _checkout_commit(checkout, commit)
        if head is None:
            return EXIT_SPEC
        commit = head
    variables = {}
    for item in given:
        name, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            print(f"verlc: --set {item}: give NAME=VALUE", file=sys.stderr)
            return EXIT_SPEC
        variables[name] = value
    try:
        found = [read_server(path, words, timeout, variables, accelerator) for path, words in servers]
        read = [read_script(path, words, version, commit, out, timeout, variables, accelerator, checkout, found)
                for path, words in scripts]
        imported, notes, _ = read[0] if len(read) == 1 else _pipeline([r[0] for r in read], out)
        notes = [n for r in read for n in r[1]] + notes if len(read) > 1 else notes
    except ImportFailed as exc:
        for d in exc.diagnostics:
            print(d, file=sys.stderr)
        print(f"verlc: {' then '.join(str(p) for p, _ in scripts)}: cannot import ({len(exc.diagnostics)} "
              f"problem(s)); nothing written", file=sys.stderr)
        return EXIT_SPEC
    except RuntimeError as exc:  # no Hydra to parse the overrides with
        print(Diagnostic(str(script), 1, 1, "script", str(exc)), file=sys.stderr)
        return EXIT_SPEC
    for note in [*(f"{imported.script}: note: {n}" for n in imported.notes), *notes]:
        print(note, file=sys.stderr)
    text = imported.text()
    if out is None:
        sys.stdout.write(text)
    else:
        temp = out.with_name(f".{out.name}.verlc-tmp")
        temp.write_text(text)
        os.replace(temp, out)
        print(f"wrote {out} ({len(imported.left)} item(s) of the script left as comments)", file=sys.stderr)
    return 0


def _pipeline(parts: list, out: Path | None) -> tuple[Any, list[str], list]:
    """The imported scripts as one pipeline spec, compiled as `verlc build` would (its problems at the imported
    spec's lines: the scripts' own were checked one by one)."""
    from ..compiler.diagnostics import SpecError
    from ..compiler.import_script import ImportFailed, pipeline_of
    from ..compiler.pipeline import compile_file
    from ..targets import CATALOG

    spec_path = (out or Path.cwd() / "imported.yaml").resolve()
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", spec_path.stem).strip("-._")[:50] or "imported"
    imported = pipeline_of(parts, name)
    try:
        irs = compile_file(spec_path, CATALOG, display="<imported pipeline>", source=spec_path.name,
                           targets=["slurm"], texts={spec_path: imported.text()})
    except SpecError as exc:
        raise ImportFailed(list(exc.diagnostics)) from None
    return imported, [], irs  # its notes are the scripts' own, said at their lines already


def read_server(script: Path, args: tuple[str, ...], timeout: float, variables: dict[str, str],
                accelerator: str) -> tuple[str, Any]:
    """The server a --service script starts (compiler/import_service.py), run in the sandbox as a trainer's
    script is: (the script as shown, the Server). ImportFailed, positioned in the script, where it starts none."""
    from .. import sandbox
    from ..compiler.diagnostics import Diagnostic
    from ..compiler.import_script import ImportFailed
    from ..compiler.import_service import find_server

    shown = str(script)
    try:
        outcome = sandbox.run(script, args, Path.cwd(), timeout, variables, accelerator)
    except sandbox.SandboxError as exc:
        raise ImportFailed([Diagnostic(shown, 1, 1, "script", str(exc))]) from None
    return shown, find_server(outcome.calls, outcome.base_env, shown, script.read_text(errors="replace"))


def read_script(script: Path, args: tuple[str, ...], version: str | None, commit: str | None,
                out: Path | None, timeout: float, variables: dict[str, str], accelerator: str = "cuda",
                checkout: Path | None = None, servers: Sequence[tuple[str, Any]] = ()) -> tuple[Any, list[str], Any]:
    """Run the script's shell code in the sandbox, read its trainer command as a spec and compile that spec
    as `verlc build` would: (the Imported spec, verlc's notes on it, its JobIR). ImportFailed, positioned in the
    script, when any step cannot be done."""
    from concurrent.futures import ThreadPoolExecutor
    from importlib import import_module, metadata

    from .. import sandbox
    from ..compiler.diagnostics import Diagnostic, SpecError
    from ..compiler.import_script import DEFAULT_VERSION, ImportFailed, find_trainer, locate, sbatch_environment, to_spec

    shown = str(script)
    text = script.read_text(errors="replace")
    allocation = {k: v for k, v in sbatch_environment(text).items() if k not in variables}  # as Slurm sets them
    with ThreadPoolExecutor(1) as side:  # the script runs while this process imports the compiler and Hydra
        running = side.submit(sandbox.run, script, args, Path.cwd(), timeout, {**allocation, **variables},
                              accelerator)
        from ..compiler.pipeline import compile_spec
        from ..targets import CATALOG
        from ..compiler.verl.release import RELEASES
        try:
            import_module("hydra.core.override_parser.overrides_parser")  # what parse() uses, loaded meanwhile
        except ImportError:
            pass  # parse() says what to install
        try:
            outcome = running.result()
        except sandbox.SandboxError as exc:
            raise ImportFailed([Diagnostic(shown, 1, 1, "script", str(exc))]) from None
    try:
        trainer = find_trainer(outcome.calls, shown, text)
    except ImportFailed as exc:
        if outcome.exit_code != 0:
            last = (outcome.output.strip().splitlines() or ["(no output)"])[-1][:300]
            exc = ImportFailed([*exc.diagnostics, Diagnostic(shown, 1, 1, "script", f"it ended with exit code "
                                                                                    f"{outcome.exit_code}: {last}"
                                                                                    + _hint(last))])
        raise exc from None
    note = None
    if version is None and commit is None:
        try:
            version = metadata.version("verl")
            note = f"verl_version {version}: the verl installed here (--verl-version names another)"
        except metadata.PackageNotFoundError:
            version = None
        if version not in RELEASES:
            note = (f"verl_version {DEFAULT_VERSION}: no verl release is installed here"
                    + (f" (verl {version} is not one verlc knows)" if version else "")
                    + "; --verl-version names the one the script was written for")
            version = DEFAULT_VERSION
    spec_path = (out or Path.cwd() / "imported.yaml").resolve()
    code = os.path.relpath(trainer.call.cwd or Path.cwd(), spec_path.parent)
    name = _unique_name(script, spec_path)
    imported = to_spec(trainer, outcome.base_env, shown, text, verl_version=version or DEFAULT_VERSION,
                       version_note=note, verl_commit=commit, code=code, name=name, accelerator=accelerator,
                       checkout=checkout and checkout.resolve(),
                       checkout_as=checkout and os.path.relpath(checkout.resolve(), spec_path.parent))
    imported.left += _limits_left(outcome.limits, text)
    imported.notes += _frozen_commands(text)
    server_notes = []
    for where, server in servers:
        from ..compiler.import_service import add_service

        server_notes += add_service(imported, server, where, text)
    def in_script(path: str, message: str) -> Diagnostic:
        """A problem of the imported spec at the script's line that gave `path` its value."""
        key = path.replace("+", "")
        line = next((n for k, n in imported.lines.items() if _related(k.replace("+", ""), key)), None)
        found = (line, 1) if line else locate(text, f"-m {trainer.module}")
        return Diagnostic(shown, found[0], found[1], path, message)

    display = "<imported spec>"
    try:
        ir = compile_spec(spec_path, CATALOG, display=display, source=spec_path.name, targets=imported.spec["targets"],
                          texts={spec_path: imported.text()})
    except SpecError as exc:
        raise ImportFailed([in_script(d.path, d.message) for d in exc.diagnostics]) from None
    notes = [*server_notes, *probe_notes(outcome, shown, text)]
    if allocation:
        notes.append(str(Diagnostic(shown, *locate(text, "#SBATCH"), "script", "note: the script ran with the "
                                    "variables its #SBATCH lines make Slurm set: " + ", ".join(
                                        f"{k}={v}" for k, v in sorted(allocation.items())) + " (--set overrides)")))
    for note in ir.notes:
        found = re.fullmatch(rf"{re.escape(display)}:\d+:\d+: (\S+): (.*)", note, re.S)
        notes.append(str(in_script(found[1], found[2])) if found else note)
    return imported, notes, ir


def probe_notes(outcome: Any, shown: str, text: str) -> list[str]:
    """A note for each probe of the host the script made, at its line, with the answer it got."""
    import shlex

    from .. import sandbox
    from ..compiler.diagnostics import Diagnostic
    from ..compiler.import_script import locate

    host = f"a plain {outcome.accelerator.upper()} host (--accelerator answers as another)"
    notes = []
    for call, code in outcome.probes():
        words = [call.tool, *call.argv[1:]]
        where = locate(text, call.argv[2] if call.argv[1:2] == ("-c",) else "", call.tool)
        notes.append(str(Diagnostic(shown, *where, "script", f"note: the script probed its host with "
                                                           f"`{shlex.join(words)}`: exit {code}, as on {host}")))
    for name in dict.fromkeys(outcome.looked_up):
        there = name not in sandbox.ABSENT[outcome.accelerator][1]
        where = locate(text, f"command -v {name}", f"command -V {name}")
        notes.append(str(Diagnostic(shown, *where, "script", f"note: the script probed its host with `command -v "
                                                           f"{name}`: {'found' if there else 'not found'}, as on "
                                                           f"{host}")))
    return notes


# What a script's `ulimit` meant for the run, by option: the open-files limit (verl's scripts raise it before
# Ray) Ray raises itself in every process it starts (ray.init: the soft limit up to min(hard, 65536)).
_LIMIT_WHY = {
    "-n": "the open-files limit: Ray raises each of its processes' soft limit to min(hard, 65536) itself; a hard "
          "limit below that is the nodes' (Slurm's PropagateResourceLimits, the container engine's --ulimit)",
}


def _checkout_commit(checkout: Path, commit: str | None) -> str | None:
    """The commit an import pins with --verl-checkout: `commit` if the checkout has it, else its HEAD; None
    (said why) when the folder is not a git checkout or lacks the commit."""
    from ..compiler.verl.commit import git, has_commit

    if not checkout.is_dir():
        print(f"verlc: --verl-checkout {checkout}: no such folder", file=sys.stderr)
        return None
    head = git(checkout, "rev-parse", "--verify", f"{commit or 'HEAD'}^{{commit}}")
    if head.returncode != 0 or not has_commit(checkout, head.stdout.decode().strip()):
        print(f"verlc: --verl-checkout {checkout}: " + (f"has no commit {commit}" if commit else
              "not a git checkout (verlc pins the commit it holds)"), file=sys.stderr)
        return None
    return head.stdout.decode().strip()


def _unique_name(script: Path, spec_path: Path) -> str:
    """The imported spec's name: the script's file name, unless a spec beside the one being written has that
    name (two scripts of one file name, e.g. run.sh of two recipes, whose bundles would share a folder): then
    the script's folder and file name, numbered if still taken."""
    from ruamel.yaml import YAML

    def clean(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-._")[:63] or "imported"

    taken = set()
    for other in spec_path.parent.glob("*.y*ml"):
        try:
            data = YAML(typ="safe").load(other.read_text(errors="replace")) if other != spec_path else None
        except Exception:  # noqa: BLE001 (not a spec: it names nothing)
            continue
        if isinstance(data, dict) and isinstance(data.get("name"), str):
            taken.add(data["name"])
    name = clean(script.stem)
    if name in taken:
        name = clean(f"{script.resolve().parent.name}-{script.stem}")
    base, n = name, 2
    while name in taken:
        name, n = f"{base[:60]}-{n}", n + 1
    return name


def _limits_left(limits: tuple[str, ...], text: str) -> list[str]:
    """A line of the spec's header for each limit the script set: the spec has no place for one."""
    from ..compiler.import_script import locate

    left = []
    for limit in dict.fromkeys(limits):
        option = next((w for w in limit.split() if w.startswith("-") and w not in ("-S", "-H")), "-f")
        why = _LIMIT_WHY.get(option, "a limit of the nodes' processes, not of the trainer command: set it where "
                                     "the cluster sets limits (Slurm's PropagateResourceLimits, the container "
                                     "engine's --ulimit)")
        left.append(f"line {locate(text, f'ulimit {limit}', 'ulimit')[0]}: ulimit {limit}: {why}")
    return left


def _frozen_commands(text: str) -> list[str]:
    """A note for each `$(date ...)` in the script: it ran once, at import, and its output is now a constant."""
    notes = []
    for found in re.finditer(r"\$\(date\b[^)]*\)|`date\b[^`]*`", text):
        line = text.count("\n", 0, found.start()) + 1
        notes.append(f"line {line}: `{found[0]}` ran once, at import: what it printed is now a constant in the "
                     f"spec, the same for every run of it (verlc tells runs apart by their run id: verlc runs)")
    return notes


def _hint(output: str) -> str:
    """What to do about the script's last line of output, where verlc can say."""
    if "unbound variable" in output:
        return " (a variable the script reads from its environment: verlc import --set NAME=VALUE)"
    if "No such file or directory" in output:
        return " (a file this machine lacks; run verlc import where the script is meant to run, or --set the " \
               "variable that names it)"
    return ""


def _related(a: str, b: str) -> bool:
    """Whether one dotted key is the other or lies below it."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")
