"""submit, status, logs, cancel, attach and runs: a run's lifecycle with each target's own tools.

Exit codes: 0 ok, 1 the run ended unsuccessfully (--wait/--follow), 2 bad spec, 3 the scheduler or the ledger
cannot answer (unknown run, unreachable Ray, a job Slurm forgot), 4 the target's tool is not on PATH.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .build import EXIT_SPEC, compile_all

EXIT_FAILED = 1  # submit --wait/--follow: the run ended in a state other than success


def one_line_errors(command: Callable[..., int]) -> Callable[..., int]:
    """One clear line and an exit code for anything the scheduler, the ledger or a bundle refuses."""
    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> int:
        from ..lifecycle import ledger
        from ..lifecycle.results import ResultError
        from ..contract.launcher import LaunchError
        from ..targets.bundle import EditedError

        try:
            return command(*args, **kwargs)
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
        except ResultError as exc:  # a metric no run logged, a bad --metric, an output matplotlib cannot write
            print(f"verlc: {exc}", file=sys.stderr)
            return EXIT_SPEC
        except KeyboardInterrupt:  # Ctrl-C while following: the run itself goes on
            print("\nverlc: stopped following; the run goes on (`verlc status` shows it)", file=sys.stderr)
            return 130
    return run


def launcher(target: str) -> Any:
    """The target's Launcher, from the target registry: what the lifecycle's functions are handed
    (lifecycle/ imports no target)."""
    from ..targets import launcher as of

    return of(target)


def _prepare_bundle(bundle: Any, out: Path) -> tuple[Path, bool]:
    """The bundle's folder under `out`: reused when it is what the spec generates (its manifest and files
    match), written otherwise. Hand edits are never overwritten (EditedError). True when written."""
    from ..targets.bundle import differences, write

    folder = out / bundle.folder
    if folder.is_dir() and not differences(bundle, folder):
        return folder, False
    write([bundle], out)
    return folder, True


def _book() -> tuple[Path, dict]:
    from ..lifecycle import ledger

    book = ledger.location(Path.cwd())
    return book, ledger.fold(book)


@one_line_errors
def submit(spec: Path, target: str, out: Path, wait: bool, follow: bool, metrics: list[str],
           on_end: str | None, profile: str | None = None, resume: str | None = None) -> int:
    from ..lifecycle import ledger, runs
    from ..contract.launcher import RESUMES, TRACKER_RUN, State

    if on_end is not None and not (wait or follow):
        print("verlc: --on-end runs when the run ends: it goes with --wait or --follow", file=sys.stderr)
        return EXIT_SPEC
    env = dict(os.environ)
    if resume is not None:
        from ..targets import TARGETS

        resumable = [t.name for t in TARGETS if t.resumable]
        if target not in resumable:
            print(f"verlc: --resume is for {' and '.join(resumable)}: a {target} run continues by itself "
                  "(Slurm requeues, RayJob retries and SkyPilot recoveries keep its id)", file=sys.stderr)
            return EXIT_SPEC
        earlier = ledger.find(ledger.fold(ledger.location(spec)), resume)
        if earlier.target != target:
            print(f"verlc: {earlier.run} ran on {earlier.target}, not {target}", file=sys.stderr)
            return EXIT_SPEC
        env.update({TRACKER_RUN: earlier.submitted.get("tracker_run") or earlier.run, RESUMES: earlier.run})
    result = compile_all([spec], [target], "snapshot", submitting=True, profile=profile)
    if isinstance(result, int):
        return result
    if result[0].pipeline is not None:
        if resume is not None:
            print("verlc: --resume continues one run; this spec is a pipeline (each stage resumes from its own "
                  "checkpoints when resubmitted)", file=sys.stderr)
            return EXIT_SPEC
        submitted = _submit_pipeline(result, spec, target, out, env)
        if not (wait or follow):
            return 0
        outcomes = _until_done(ledger.location(spec), submitted, follow, metrics, on_end)
        failed = next((r for r, o in zip(submitted, outcomes) if o.state is not State.SUCCEEDED), None)
        if failed is not None:
            stage = failed.submitted.get("stage")
            print(f"verlc: the pipeline stopped at stage {stage}" if stage else
                  f"verlc: the pipeline stopped (`verlc logs {failed.run}` names the stage)", file=sys.stderr)
        return EXIT_FAILED if failed is not None else 0
    [ir] = result
    if resume is not None and ir.variants:
        print("verlc: --resume continues one run; this spec is a sweep (resubmit its variant's spec)", file=sys.stderr)
        return EXIT_SPEC
    from ..targets import get, render

    note = runs.slow_save_note(ir, target, list(ledger.fold(ledger.location(spec)).values()), launcher) \
        if get(target).saves_ahead else None
    if note:
        print(note, file=sys.stderr)
    folder, written = _prepare_bundle(render(target, ir), out.resolve())
    print(f"{'wrote' if written else 'up to date:'} {out / folder.parent.name / folder.name}/")
    book = ledger.location(spec)
    submitted = runs.submit(ir, spec, target, folder, Path.cwd(), env, book, launcher)
    for run in submitted:
        print(f"submitted {run.run} (job {run.job_id} on {run.where}); ledger: {book}")
    if not (wait or follow):
        return 0
    outcomes = _until_done(book, submitted, follow, metrics, on_end)
    return 0 if all(o.state is State.SUCCEEDED for o in outcomes) else EXIT_FAILED


def _submit_pipeline(irs: list, spec: Path, target: str, out: Path, env: dict[str, str]) -> list:
    """A pipeline: its own bundle, then (a target that chains jobs) each stage's bundle and job after the one
    before it, or (one job) the pipeline's bundle as one run."""
    from dataclasses import replace

    from ..compiler.catalog import ONE_JOB
    from ..lifecycle import ledger, runs
    from ..targets import get, render

    chain = get(target).render_chain(irs)
    folder, written = _prepare_bundle(chain, out.resolve())
    book = ledger.location(spec)
    if get(target).pipelines == ONE_JOB:
        print(f"{'wrote' if written else 'up to date:'} {out / chain.folder}/")
        whole = replace(irs[0], name=irs[0].pipeline.name, pipeline=None)  # one run: the stages in turn
        submitted = runs.submit(whole, spec, target, folder, Path.cwd(), env, book, launcher)
        for run in submitted:
            print(f"submitted {run.run} (stages {', '.join(ir.pipeline.stage for ir in irs)} in turn; job "
                  f"{run.job_id} on {run.where}); ledger: {book}")
        return submitted
    submitted, after = [], None
    for ir in irs:
        folder, written = _prepare_bundle(render(target, ir), out.resolve())
        print(f"{'wrote' if written else 'up to date:'} {out / folder.parent.name / folder.name}/")
        [run] = runs.submit(ir, spec, target, folder, Path.cwd(), env, book, launcher, after=after)
        print(f"submitted stage {ir.pipeline.stage}: {run.run} (job {run.job_id} on {run.where}"
              + (f", after job {after}" if after else "") + f"); ledger: {book}")
        submitted.append(run)
        after = str(run.job_id)
    return submitted


def _until_done(book: Path, submitted: list, follow: bool, metrics: list[str], on_end: str | None) -> list:
    """Wait for every run (a sweep's one after another), printing their progress with --follow; --on-end's
    command as each one ends. Their final states, in the order given."""
    import io
    import subprocess

    from ..lifecycle import ledger, runs

    def ended(run: ledger.Run, seen: runs.Observed) -> None:
        if not follow:  # --follow has printed every state already
            print(f"{run.run}: {seen.scheduler_state.lower()}" + (f" (exit code {seen.exit_code})" if seen.exit_code else ""))
        if on_end is not None:  # the run's outcome stays the exit code; the command's failure is only reported
            sys.stdout.flush()
            told = {"VERLC_RUN": run.run, "VERLC_STATE": seen.scheduler_state,
                    "VERLC_EXIT_CODE": "" if seen.exit_code is None else str(seen.exit_code)}
            code = subprocess.call(["sh", "-c", on_end], env={**os.environ, **told})
            if code:
                print(f"verlc: --on-end exited with code {code} for {run.run}", file=sys.stderr)

    chosen = [ledger.fold(book)[r.run] for r in submitted]
    finals = runs.follow(book, chosen, metrics, sys.stdout if follow else io.StringIO(), launcher,
                         tty=sys.stdout.isatty(), ended=ended)
    return [finals[r.run] for r in submitted]


@one_line_errors
def status(key: str | None) -> int:
    from ..lifecycle import ledger, runs

    book, known = _book()
    chosen = [ledger.find(known, key)] if key else [r for r in known.values() if not r.final]
    for run in chosen:
        seen = runs.observe(book, run, launcher)
        # a run VERLC_STOP_AFTER ended early says so (as `verlc runs` does), once the ledger has its end
        state = runs.shown_state(ledger.fold(book)[run.run]) if seen.final else seen.scheduler_state.lower()
        print(f"{run.run}: {state}" + (f", {seen.restarts} restart(s)" if seen.restarts else "")
              + (f", exit code {seen.exit_code}" if seen.exit_code is not None else "")
              + f" (job {run.job_id} on {run.where}, from {seen.source})")
    if not chosen:
        print("no unfinished runs in " + str(book))
    return 0


@one_line_errors
def logs(key: str, follow: bool, stage: str | None, metrics: list[str], ray: bool, service: str | None,
         node: str | None) -> int:
    from ..lifecycle import ledger, progress, runs

    book, known = _book()
    run = ledger.find(known, key)
    if ray:
        sys.stdout.write(runs.ray_logs(run, node))
        return 0
    if service:
        sys.stdout.write(runs.service_logs(run, service, node, launcher))
        return 0
    if follow:
        runs.follow(book, [run], metrics, sys.stdout, launcher, tty=sys.stdout.isatty())
        return 0
    text = runs.log_text(run, launcher)
    if stage:
        text = "".join(progress.stage_lines(text.splitlines(True), stage))
    sys.stdout.write(text if sys.stdout.isatty() else progress.plain(text))  # colours only where they show
    return 0


@one_line_errors
def cancel(key: str) -> int:
    from ..lifecycle import ledger, runs

    book, known = _book()
    named = ledger.matching(known, key)  # a sweep's prefix or its array job id: each of its variants
    going = [r for r in named if not r.final] if len(named) > 1 else named  # one run: cancelled even if ended
    for run in going:  # (Compose's `down` of an ended run removes its containers)
        seen = runs.cancel(book, run, launcher)
        print(f"{run.run}: cancel sent; now {seen.scheduler_state.lower()}")
    if not going:
        print(f"verlc: the {len(named)} runs '{key}' names have ended: {', '.join(r.run for r in named)}")
    return 0


@one_line_errors
def attach(key: str, cmd: list[str]) -> int:
    import subprocess

    from ..lifecycle import ledger

    _, known = _book()
    run = ledger.find(known, key)
    if run.final:
        print(f"verlc: {run.run} has ended ({run.state.lower()}): nothing to attach to", file=sys.stderr)
        return 3
    return subprocess.call(launcher(run.target).attach(run.submission, cmd[1:] if cmd[:1] == ["--"] else cmd))


def _chosen(known: dict, keys: list[str]) -> list:
    from ..lifecycle import ledger

    return [run for key in keys for run in ledger.matching(known, key)] if keys else list(known.values())


@one_line_errors
def table(keys: list[str], results: bool, timeline: bool, metrics: list[str], fmt: str) -> int:
    from ..lifecycle import runs

    book, known = _book()
    chosen = _chosen(known, keys)
    if results:
        sys.stdout.write(runs.results(book, chosen, metrics, fmt, launcher))
    elif timeline:
        sys.stdout.write(runs.timeline(book, chosen, fmt, launcher))
    elif metrics:
        print("verlc: --metric goes with --results", file=sys.stderr)
        return EXIT_SPEC
    else:
        sys.stdout.write(runs.table(chosen, fmt))
    return 0


@one_line_errors
def plot(keys: list[str], metric: str | None, timeline: bool, output: Path | None) -> int:
    from ..lifecycle import runs

    book, known = _book()
    if timeline:
        output = output or Path("timeline.png")
        lines = runs.plot_timeline(book, _chosen(known, keys), output, launcher)
        print(f"wrote {output}: the start-up timeline of {', '.join(lines)}")
        return 0
    output = output or Path(metric.replace("/", "_") + ".png")
    lines = runs.plot(book, _chosen(known, keys), metric, output, launcher)
    print(f"wrote {output}: {metric} of {', '.join(lines)}")
    return 0
