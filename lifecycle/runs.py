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
from ..targets import launcher, render
from ..targets.bundle import MANIFEST, differences, write
from . import ledger, progress
from .scheduler import Observed


def prepare_bundle(ir: JobIR, target: str, out: Path) -> tuple[Path, bool]:
    """The bundle folder for `ir`: reused when it is what the spec generates (its manifest and files
    match), written otherwise. Hand edits are never overwritten (EditedError). True when written."""
    bundle = render(target, ir)
    folder = out / bundle.folder
    if folder.is_dir() and not differences(bundle, folder):
        return folder, False
    write([bundle], out)
    return folder, True


def submit(ir: JobIR, spec: Path, target: str, folder: Path, cwd: Path, env: dict[str, str],
           ledger_file: Path) -> list[ledger.Run]:
    """Submit the bundle with the target's own tool and record each submission in the ledger."""
    manifest = (folder / MANIFEST).read_bytes()
    submissions = launcher(target).submit(ir, folder, cwd, env)
    root = ledger_file.parent
    for s in submissions:
        ledger.append(ledger_file, {
            "event": "submitted", "run": s.run, "target": target, "job_id": s.job_id, "where": s.where,
            "log": s.log, "record": s.record, "name": ir.name, "spec": _shown(spec, root),
            "spec_sha256": ir.spec_sha256, "bundle": str(folder.resolve()),
            "bundle_sha256": hashlib.sha256(manifest).hexdigest(), "verlc_version": ir.verlc_version,
            "verl_version": ir.verl_version, "submit_dir": str(cwd.resolve()),
        })
    runs = ledger.fold(ledger_file)
    return [runs[s.run] for s in submissions]


def _shown(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path.resolve())


def observe(ledger_file: Path, run: ledger.Run) -> Observed:
    """Ask the scheduler; append a `state` event when something changed, `finished` once it ended."""
    seen = launcher(run.target).state(run.submitted)
    times = {k: v for k, v in (("started", seen.started), ("ended", seen.ended)) if v}  # the scheduler's own
    if seen.final:
        if not run.final:
            ledger.append(ledger_file, {"event": "finished", "run": run.run, "state": seen.state,
                                        "restarts": max(seen.restarts, run.restarts), "exit_code": seen.exit_code,
                                        "record": run.submitted.get("record"), "source": seen.source, **times})
    elif (seen.state, seen.restarts) != (run.state, run.restarts) or (seen.started and not run.started_at):
        ledger.append(ledger_file, {"event": "state", "run": run.run, "state": seen.state,
                                    "restarts": seen.restarts, "source": seen.source, **times})
    return seen


def cancel(ledger_file: Path, run: ledger.Run) -> Observed:
    """Cancel with the target's tool. Where nothing is left to ask afterwards (Compose's `down`), the
    launcher reports the end itself; otherwise the scheduler is asked as for `status`."""
    ended = launcher(run.target).cancel(run.submitted)
    if run.final:  # e.g. `down` after a compose run ended: its containers go, its record stays
        return ended or observe(ledger_file, run)
    ledger.append(ledger_file, {"event": "state", "run": run.run, "state": "CANCEL_REQUESTED",
                                "restarts": run.restarts, "source": "verlc cancel"})
    if ended is not None:
        ledger.append(ledger_file, {"event": "finished", "run": run.run, "state": ended.state,
                                    "restarts": run.restarts, "exit_code": None, "source": ended.source})
        return ended
    return observe(ledger_file, ledger.fold(ledger_file)[run.run])


def log_text(run: ledger.Run) -> str:
    return launcher(run.target).logs(run.submitted)


def follow(ledger_file: Path, run: ledger.Run, keys: Sequence[str], out: TextIO, *, tty: bool,
           poll: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> Observed:
    """Print one line per stage and per training step until the run ends; its final state is returned."""
    printed, total, last_state = 0, None, None
    while True:
        run = ledger.fold(ledger_file)[run.run]
        seen = observe(ledger_file, run)
        if (seen.state, seen.restarts) != last_state:
            last_state = (seen.state, seen.restarts)
            out.write(f"{run.run}: {seen.state.lower()}"
                      + (f" (restart {seen.restarts})" if seen.restarts else "") + "\n")
        lines = log_text(run).splitlines()
        if len(lines) < printed:  # a requeued job's log starts over when not appended to
            printed = 0
        for event in progress.events(lines[printed:]):
            if event.kind == "total":
                total = event.total
            elif event.kind == "step" and event.step:
                end = "\r" if tty else "\n"
                out.write(progress.step_line(event.step, total, keys, tty) + end)
            else:
                out.write(f"{run.run}: {event.text}\n")
        printed = len(lines)
        out.flush()
        if seen.final:
            if tty:
                out.write("\n")
            return seen
        sleep(poll)


def duration(run: ledger.Run) -> str:
    """How long the job ran, by the scheduler's start and end times where it gave them; else from the
    submission to when verlc saw it end."""
    start = _parse(run.started_at or run.submitted["at"])
    end = _parse(run.ended_at or run.finished_at) if run.finished_at else datetime.now(timezone.utc)
    seconds = int((end - start).total_seconds())
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def _parse(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)


COLUMNS = ("run", "spec", "target", "where", "job", "state", "submitted", "duration", "spec sha256")


def table(runs: Sequence[ledger.Run], markdown: bool) -> str:
    rows = [(r.run, r.submitted["spec"], r.target, r.where, str(r.job_id),
             r.state.lower() + (f" ({r.restarts} restarts)" if r.restarts else ""), r.submitted["at"],
             duration(r), r.submitted["spec_sha256"][:12]) for r in runs]
    if markdown:
        escape = lambda cell: cell.replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join(escape(c) for c in row) + " |" for row in rows]
        return "\n".join(lines) + "\n"
    widths = [max(len(c) for c in col) for col in zip(COLUMNS, *rows)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n" for row in (COLUMNS, *rows))


def ray_logs(run: ledger.Run, node: str | None) -> str:
    """The Ray logs each node kept in the run folder (`ray-logs/<node>/`), as `==> file <==` sections."""
    from .scheduler import LaunchError

    folder = Path(run.record).parent / "ray-logs" if run.record else None
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
