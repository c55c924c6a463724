"""Submit, observe, follow and cancel runs; every step the scheduler confirms becomes a ledger event."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

from ..compiler.ir import JobIR
from ..contract.launcher import RESUMES, TRACKER_RUN, Launchers, Observed, is_service_log
from ..runtime.protocol import MANIFEST, RAY_LOGS, RUNNER_STAGES, SERVICE_LOGS, STOP_AFTER
from . import ledger, progress
from . import results as results_of
from . import timeline as timeline_of


def submit(ir: JobIR, spec: Path, target: str, folder: Path, cwd: Path, env: dict[str, str],
           ledger_file: Path, launchers: Launchers, after: str | None = None) -> list[ledger.Run]:
    """Submit the bundle with the target's own tool and record each submission in the ledger; `after`: the job
    a pipeline's stage waits for."""
    manifest = (folder / MANIFEST).read_bytes()
    launcher = launchers(target)
    submissions = launcher.submit(ir, folder, cwd, env, after=after) if after else launcher.submit(ir, folder, cwd,
                                                                                                     env)
    root = ledger_file.parent
    own = {e.name: e.value.display for e in ir.env}
    for s in submissions:
        ledger.append(ledger_file, {
            "event": "submitted", "run": s.run, "target": target, "job_id": s.job_id, "where": s.where,
            "log": s.log, "record": s.record, "name": ir.name, "spec": _shown(spec, root),
            "spec_sha256": ir.spec_sha256, "bundle": str(folder.resolve()),
            "bundle_sha256": hashlib.sha256(manifest).hexdigest(), "verlc_version": ir.verlc_version,
            "verl_version": ir.verl_version, "submit_dir": str(cwd.resolve()), "nodes": ir.nodes,
            "gpus_per_node": ir.gpus_per_node, **({"profile": ir.profile[0]} if ir.profile else {}),
            # the W&B run it logs to: the spec's own, the run it continues (--resume), else its own id
            "tracker_run": own.get("WANDB_RUN_ID") or env.get(TRACKER_RUN) or s.run,
            **({"resumes": env[RESUMES]} if env.get(RESUMES) else {}),
            # VERLC_STOP_AFTER: the run ends after this stage, short of training; its success is not a trained run's
            **({"stop_after": env[STOP_AFTER]} if env.get(STOP_AFTER) not in (None, "", RUNNER_STAGES[-1])
               else {}),
            **({"variant": {k: v for k, v in ir.variants[s.variant].settings}} if s.variant is not None else {}),
            **({"pipeline": ir.pipeline.name, "stage": ir.pipeline.stage, "after": after} if ir.pipeline else {}),
        })
    runs = ledger.fold(ledger_file)
    return [runs[s.run] for s in submissions]


VERL_SAVE_ALLOWANCE = 60  # seconds verl's should_save_ckpt_esi allows for a save (its save_ckpt_duration default)
SAVE_TIMING = "timing_s/save_checkpoint"  # verl's metric of a step that saved a checkpoint


def slow_save_note(ir: JobIR, target: str, earlier: Sequence[ledger.Run], launchers: Launchers) -> str | None:
    """Where verl saves ahead of the job's end (ir.expiry_variable, on a target that `saves_ahead`: the caller
    asks only those), a note when an earlier run of the same spec logged a checkpoint save longer than verl
    allows for one (60 s plus trainer.esi_redundant_time): the save ahead of the time limit would not finish."""
    if not ir.expiry_variable:
        return None
    given = next((o.value for o in ir.overrides if o.key == "trainer.esi_redundant_time"), "0")
    try:
        redundant = float(given)
    except ValueError:
        return None
    allowance = VERL_SAVE_ALLOWANCE + redundant
    slowest: tuple[float, str] | None = None
    for run in earlier:
        if run.target != target or run.name != ir.name:
            continue
        try:
            logged = results_of.read(log_text(run, launchers).splitlines())
        except Exception:  # noqa: BLE001 - an earlier run's log that cannot be read says nothing
            continue
        for _, seconds in results_of.points(logged, SAVE_TIMING):
            if slowest is None or seconds > slowest[0]:
                slowest = (seconds, run.run)
    if slowest is None or slowest[0] <= allowance:
        return None
    needed = int(slowest[0] - VERL_SAVE_ALLOWANCE) + 30
    return (f"note: run {slowest[1]} of this spec saved a checkpoint in {slowest[0]:.0f}s; verl allows "
            f"{allowance:.0f}s for the save it makes ahead of the time limit ({VERL_SAVE_ALLOWANCE}s + "
            f"trainer.esi_redundant_time {given}), so that save would not finish in time: set "
            f"verl.trainer.esi_redundant_time to {needed} or more")


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


def observe(ledger_file: Path, run: ledger.Run, launchers: Launchers) -> Observed:
    """Ask the scheduler; append a `state` event when something changed, `finished` once it ended."""
    seen = launchers(run.target).state(run.submission)
    facts = {k: v for k, v in (("started", seen.started), ("ended", seen.ended)) if v}  # the scheduler's own times
    if seen.log and not run.submitted.get("log"):  # named once the job started (a Slurm array task's)
        facts["log"] = seen.log
    if seen.final:
        if not run.final:
            ledger.append(ledger_file, {"event": "finished", "run": run.run, "state": seen.scheduler_state,
                                        "restarts": max(seen.restarts, run.restarts), "exit_code": seen.exit_code,
                                        "record": run.submitted.get("record"), "source": seen.source, **facts})
            keep_timeline(ledger_file, ledger.fold(ledger_file)[run.run], launchers)
    elif ((seen.scheduler_state, seen.restarts) != (run.state, run.restarts) or (seen.started and not run.started_at)
          or "log" in facts):
        ledger.append(ledger_file, {"event": "state", "run": run.run, "state": seen.scheduler_state,
                                    "restarts": seen.restarts, "source": seen.source, **facts})
    return seen


def cancel(ledger_file: Path, run: ledger.Run, launchers: Launchers) -> Observed:
    """Cancel with the target's tool. Where nothing is left to ask afterwards (Compose's `down`), the
    launcher reports the end itself; otherwise the scheduler is asked as for `status`."""
    ended = launchers(run.target).cancel(run.submission)
    if run.final:  # e.g. `down` after a compose run ended: its containers go, its record stays
        return ended or observe(ledger_file, run, launchers)
    ledger.append(ledger_file, {"event": "cancel", "run": run.run, "source": "verlc cancel"})  # no state of its own
    if ended is not None:
        ledger.append(ledger_file, {"event": "finished", "run": run.run, "state": ended.scheduler_state,
                                    "restarts": run.restarts, "exit_code": None, "source": ended.source})
        keep_timeline(ledger_file, ledger.fold(ledger_file)[run.run], launchers)
        return ended
    return observe(ledger_file, ledger.fold(ledger_file)[run.run], launchers)


def keep_timeline(ledger_file: Path, run: ledger.Run, launchers: Launchers) -> None:
    """An ended run's start-up timeline into the ledger, read from its log while the log is there (a Ray job's
    goes with its cluster, a compose run's with `down`): `verlc runs --timeline` reads it from there on. A log
    that cannot be read now is read when the timeline is asked for."""
    from ..contract.launcher import LaunchError

    try:
        found = timeline_of.attempts(log_text(run, launchers).splitlines(), True)
    except (LaunchError, OSError):
        return
    if found:
        ledger.append(ledger_file, {"event": "timeline", "run": run.run, "attempts": timeline_of.to_json(found)})


def log_text(run: ledger.Run, launchers: Launchers) -> str:
    return launchers(run.target).logs(run.submission)


def follow(ledger_file: Path, chosen: Sequence[ledger.Run], keys: Sequence[str], out: TextIO, launchers: Launchers,
           *, tty: bool, ended: Callable[[ledger.Run, Observed], None] | None = None, poll: float = 2.0,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Observed]:
    """Print one line per stage and per training step of each run, one run after the other (a sweep's variants:
    every step line named by its run), until each has ended; `ended` is called as each one ends. Each run's
    final state is returned by its id."""
    finals: dict[str, Observed] = {}
    for first in chosen:
        one = len(chosen) == 1
        printed, total, last_state, clock = 0, None, None, progress.Clock()
        while True:
            run = ledger.fold(ledger_file)[first.run]
            seen = observe(ledger_file, run, launchers)
            lines = log_text(run, launchers).splitlines()
            if len(lines) < printed:  # a requeued job's log starts over when not appended to
                printed = 0
            for event in progress.events(lines[printed:], clock):
                if event.kind == "total":
                    total = event.total
                elif event.kind == "step" and event.step:
                    shown = progress.step_line(event.step, total, keys, tty and one)
                    out.write(shown + "\r" if tty and one else f"{'' if one else f'{run.run}: '}{shown}\n")
                else:
                    out.write(f"{run.run}: {event.text}\n")
            printed = len(lines)
            # the state after the lines that led to it (a failing preflight's, a requeue's reason)
            if (seen.scheduler_state, seen.restarts) != last_state:
                last_state = (seen.scheduler_state, seen.restarts)
                out.write(f"{run.run}: {seen.scheduler_state.lower()}"
                          + (f" (restart {seen.restarts})" if seen.restarts else "") + "\n")
            out.flush()
            if seen.final:
                if tty and one:
                    out.write("\n")
                finals[run.run] = seen
                if ended is not None:
                    ended(run, seen)
                break
            sleep(poll)
    return finals


def seconds(run: ledger.Run) -> int:
    """How long the job ran, by the scheduler's start and end times where it gave them; else from the
    submission to when verlc saw it end (or now, while it runs)."""
    start = _parse(run.started_at or run.submitted["at"])
    end = _parse(run.ended_at or run.finished_at) if run.finished_at else datetime.now(timezone.utc)
    return max(0, int((end - start).total_seconds()))


def duration(run: ledger.Run) -> str:
    return clock(seconds(run))


def clock(took: int) -> str:
    """Seconds as H:MM:SS."""
    return f"{took // 3600}:{took // 60 % 60:02d}:{took % 60:02d}"


def _parse(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


COLUMNS = ("run", "spec", "target", "where", "job", "state", "submitted", "duration", "spec sha256")


def shown_state(run: ledger.Run) -> str:
    """A run's state as tables show it: a run that ended where VERLC_STOP_AFTER stopped it says so."""
    stop = run.submitted.get("stop_after")
    if stop and run.final and run.exit_code == 0:
        return f"stopped after {stop}"
    return run.state.lower()


def pipelines(runs: Sequence[ledger.Run]) -> list[list[ledger.Run]]:
    """The runs grouped as submitted: a pipeline's stages (chained by the job each waits for) in one group, in
    the order they run; any other run alone."""
    by_job = {(r.target, str(r.job_id)): r for r in runs}
    groups: dict[str, list[ledger.Run]] = {}
    for r in runs:
        first = r
        while first.submitted.get("after") and (first.target, first.submitted["after"]) in by_job:
            first = by_job[(first.target, first.submitted["after"])]
        groups.setdefault(first.run, []).append(r)
    return list(groups.values())


def pipeline_state(stages: Sequence[ledger.Run]) -> str:
    """A pipeline's state: its stages' own, and the stage that failed (which stopped the chain)."""
    failed = next((r for r in stages if r.final and shown_state(r) in ("failed", "cancelled")), None)
    shown = ", ".join(f"{r.submitted['stage']} {shown_state(r)}" for r in stages)
    return f"{failed.submitted['stage']} {shown_state(failed)}, the chain stopped ({shown})" if failed else shown


def table(runs: Sequence[ledger.Run], fmt: str) -> str:
    """One row per run; a pipeline's stages in one row (its first stage's run id, each stage's job)."""
    rows = []
    for group in pipelines(runs):
        r = group[0]
        if r.submitted.get("pipeline"):
            took = clock(sum(seconds(g) for g in group if g.started_at))  # a stage waiting for another has not run
            rows.append((r.submitted["pipeline"],
                         r.submitted["spec"], r.target, r.where, ",".join(str(g.job_id) for g in group),
                         pipeline_state(group), r.submitted["at"], took, r.submitted["spec_sha256"][:12]))
            continue
        rows.append((r.run, r.submitted["spec"], r.target, r.where, str(r.job_id),
                     shown_state(r) + (f" ({r.restarts} restarts)" if r.restarts else ""), r.submitted["at"],
                     duration(r), r.submitted["spec_sha256"][:12]))
    return results_of.tabulate(COLUMNS, rows, fmt)


def results(ledger_file: Path, chosen: Sequence[ledger.Run], asked: Sequence[str], fmt: str,
            launchers: Launchers) -> str:
    """The results table of these runs: each run's state (asked of the scheduler while it runs), its steps,
    the last and best value of each metric its log printed, wall time, GPU-hours and last checkpoint."""
    metrics = [results_of.Metric.parse(m) for m in asked] or [results_of.Metric(m) for m in results_of.DEFAULT_METRICS]
    for run in chosen:
        if not run.final:
            observe(ledger_file, run, launchers)  # a run still going: its state as the scheduler says it now
    folded = ledger.fold(ledger_file)  # with what observing recorded (the state, an array task's log path)
    texts = {r.run: log_text(folded[r.run], launchers).splitlines() for r in chosen}
    logs = [(folded[r.run], results_of.read(texts[r.run])) for r in chosen]
    keys = results_of.chosen_keys([logged for _, logged in logs], metrics, asked=bool(asked))
    rows = []
    for run, logged in logs:
        # a requeued run: every attempt's time counts (the scheduler's times are the last attempt's)
        took = (progress.attempts_seconds(texts[run.run]) if run.restarts else None) or seconds(run)
        rows.append(results_of.row(run.run, run.submitted.get("variant") or {}, run.submitted["spec_sha256"],
                                   shown_state(run), logged, keys, metrics, took, clock(took),
                                   run.submitted.get("nodes", 0) * run.submitted.get("gpus_per_node", 0) or None))
    return results_of.render(rows, keys, fmt)


def plot(ledger_file: Path, chosen: Sequence[ledger.Run], metric: str, output: Path, launchers: Launchers
         ) -> list[str]:
    """Draw `metric` against step for each run into `output`; the lines' labels are returned. A run whose
    log has no such metric is an error that lists the metrics it did log."""
    from .plot import draw

    lines = []
    for run in chosen:
        logged = results_of.read(log_text(run, launchers).splitlines())
        points = results_of.points(logged, metric)
        if not points:
            raise results_of.ResultError(f"{run.run} logged no {metric!r}; it logged: "
                                         f"{', '.join(sorted(logged.series)) or 'no metric yet'}")
        lines.append((_label(run), points))
    draw(metric, lines, output)
    return [label for label, _ in lines]


def timeline(ledger_file: Path, chosen: Sequence[ledger.Run], fmt: str, launchers: Launchers) -> str:
    """Where each run's start-up time went (lifecycle/timeline.py), every attempt of each: a table."""
    body = []
    for run, found in _timelines(ledger_file, chosen, launchers):
        queued = None
        if run.started_at and not run.restarts:  # the scheduler's start is the last attempt's
            queued = max(0.0, (_parse(run.started_at) - _parse(run.submitted["at"])).total_seconds())
        body += timeline_of.rows(run.run, found, queued)
    return results_of.tabulate(timeline_of.COLUMNS, body, fmt)


def _timelines(ledger_file: Path, chosen: Sequence[ledger.Run], launchers: Launchers
               ) -> list[tuple[ledger.Run, list[timeline_of.Attempt]]]:
    for run in chosen:
        if not run.final:
            observe(ledger_file, run, launchers)  # a run still going: where its log is now
    folded = ledger.fold(ledger_file)
    out = []
    for r in chosen:
        kept = folded[r.run].timeline
        found = timeline_of.from_json(kept) if kept else \
            timeline_of.attempts(log_text(folded[r.run], launchers).splitlines(), folded[r.run].final)
        if not found:
            raise results_of.ResultError(f"{r.run}: its log has no verlc line yet (state {shown_state(folded[r.run])})")
        out.append((folded[r.run], found))
    return out


def plot_timeline(ledger_file: Path, chosen: Sequence[ledger.Run], output: Path, launchers: Launchers
                  ) -> list[str]:
    """Each run's phases up to its first step as one bar (its last attempt), into `output`; the bars' labels."""
    from .plot import draw_timeline

    bars = [(_label(run), timeline_of.bar(found[-1])) for run, found in _timelines(ledger_file, chosen, launchers)]
    draw_timeline(bars, output)
    return [label for label, _ in bars]


def _label(run: ledger.Run) -> str:
    """A plotted line's name: a sweep variant's swept values by their last key part (the whole key where two
    parts are the same, such as actor and critic lr), else the run id."""
    swept = run.submitted.get("variant") or {}
    short = [k.rsplit(".", 1)[-1] for k in swept]
    names = short if len(set(short)) == len(short) else [k.removeprefix("verl.") for k in swept]
    return " ".join(f"{n}={v}" for n, v in zip(names, swept.values())) or run.run


def ray_logs(run: ledger.Run, node: str | None) -> str:
    """The Ray logs each node kept in the run folder (protocol.RAY_LOGS/<node>/), as `==> file <==` sections."""
    from ..contract.launcher import LaunchError

    folder = Path(run.record).parent / RAY_LOGS if run.record else None
    if folder is None or not folder.is_dir():
        raise LaunchError(f"{run.run} kept no Ray logs (the slurm target keeps them in the run folder when "
                          f"Ray stops)")
    nodes = sorted(p for p in folder.iterdir() if p.is_dir() and (node is None or p.name == node))
    if not nodes:
        raise LaunchError(f"no Ray logs of node {node} in {folder}: it has {', '.join(sorted(os.listdir(folder)))}")
    out = []
    for path in sorted(f for n in nodes for f in n.rglob("*") if f.is_file()):
        out.append(f"==> {path.relative_to(folder)} <==\n{path.read_text(errors='replace')}")
    return "\n".join(out)


def service_logs(run: ledger.Run, name: str, node: str | None, launchers: Launchers) -> str:
    """A service's output: from the run folder where it is on this machine (protocol.SERVICE_LOGS/NAME.log on
    the head, NAME-NODE.log for a service on every node), else as its scheduler keeps it (a ray-job's through
    Ray's log API); the one file as it is, several as `==> file <==` sections."""
    from ..contract.launcher import LaunchError

    folder = Path(run.record).parent / SERVICE_LOGS if run.record else None
    here = folder is not None and folder.is_dir()
    logs = {p.name: p.read_text(errors="replace") for p in sorted(folder.glob("*.log"))
            if is_service_log(p.name, name, node)} if here else {}
    if not logs:  # the scheduler's (a ray-job's through Ray's log API; a container of its own's, Compose's)
        try:
            logs = launchers(run.target).service_logs(run.submission, name, node)
        except LaunchError:
            if not here:
                raise
            kept = sorted(p.name for p in folder.glob("*.log"))
            raise LaunchError(f"no log of service {name!r}{f' on node {node}' if node else ''} in {folder}: it "
                              f"has {', '.join(kept) or 'none'}") from None
    if len(logs) == 1:
        return next(iter(logs.values()))
    return "\n".join(f"==> {file} <==\n{text}" for file, text in sorted(logs.items()))
