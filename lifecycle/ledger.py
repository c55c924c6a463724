"""The run ledger: one append-only JSON Lines file of events, folded into runs.

Each submission appends a `submitted` event; later observations append `state` events and, once the
scheduler says the run ended, a `finished` event and a `timeline` event (its start-up timeline, as its log
showed it then). Nothing is ever rewritten, so the file reviews as a plain diff and two verlc processes can
append at once: every event is one line, written with one `write` under an exclusive lock on the file.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from ..contract.launcher import SubmittedRun

FILE = "runs.jsonl"


class LedgerError(Exception):
    """An unknown or ambiguous run id, or a damaged ledger line: one line for the user."""


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def location(near: Path) -> Path:
    """The ledger of the repository that holds `near` (a spec or a folder): at its git root, or beside it."""
    start = near.resolve()
    folder = start if start.is_dir() else start.parent
    for candidate in (folder, *folder.parents):
        if (candidate / ".git").exists():
            return candidate / FILE
    return folder / FILE


def append(ledger: Path, event: dict) -> None:
    """Append one event (one line, one write, under an exclusive lock: safe against concurrent verlc runs)."""
    line = (json.dumps({"at": now(), **event}, sort_keys=True) + "\n").encode()
    fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock


def events(ledger: Path) -> Iterator[dict]:
    """The ledger's events in order. A last line cut short (a crash mid-write) is skipped, any other bad
    line is an error naming it."""
    if not ledger.exists():
        return
    lines = ledger.read_text().splitlines()
    for number, line in enumerate(lines, 1):
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                return
            raise LedgerError(f"{ledger}:{number}: not a ledger event ({exc.msg})") from None


@dataclass
class Run:
    """A run as its events describe it: the submission, then the latest state seen."""
    run: str
    submitted: dict
    state: str = "SUBMITTED"
    restarts: int = 0
    seen_at: str = ""
    finished_at: str | None = None  # when verlc saw the end
    started_at: str | None = None  # the scheduler's start and end times, where it reports them
    ended_at: str | None = None
    exit_code: int | None = None
    record: str | None = None  # where the in-cluster run record is
    timeline: list[dict] | None = None  # its start-up timeline, kept once it ended (lifecycle/timeline.py to_json)
    history: list[dict] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.finished_at is not None

    @property
    def target(self) -> str:
        return self.submitted["target"]

    @property
    def job_id(self) -> str:
        return str(self.submitted["job_id"])

    @property
    def where(self) -> str:
        return self.submitted.get("where", "")

    @property
    def name(self) -> str:
        """The spec's name (a sweep's variants and a pipeline's stages share it)."""
        return self.submitted.get("name", "")

    @property
    def submission(self) -> SubmittedRun:
        """What its target's launcher is told of it."""
        s = self.submitted
        return SubmittedRun(run=self.run, target=self.target, job_id=self.job_id, where=self.where,
                            bundle=s.get("bundle", ""), log=s.get("log"), record=s.get("record"))


def fold(ledger: Path) -> dict[str, Run]:
    """Every run of the ledger, in submission order."""
    runs: dict[str, Run] = {}
    for event in events(ledger):
        kind, name = event.get("event"), event.get("run")
        if kind == "submitted":
            runs[name] = Run(name, event, seen_at=event["at"])
            continue
        run = runs.get(name)
        if run is None:
            continue
        if kind == "timeline":  # read from its log once it ended: no state of its own
            run.timeline = event["attempts"]
            continue
        run.history.append(event)
        run.state = event.get("state", run.state)
        run.restarts = max(run.restarts, event.get("restarts", 0))
        run.seen_at = event["at"]
        run.started_at = event.get("started") or run.started_at
        run.ended_at = event.get("ended") or run.ended_at
        if event.get("log") and not run.submitted.get("log"):  # a log the scheduler named once the job started
            run.submitted = {**run.submitted, "log": event["log"]}
        if kind == "finished":
            run.finished_at = event["at"]
            run.exit_code = event.get("exit_code")
            run.record = event.get("record") or run.record
    return runs


def find(runs: dict[str, Run], key: str) -> Run:
    """A run by its id, a unique prefix of it, or its job id."""
    found = matching(runs, key)
    if len(found) == 1:
        return found[0]
    raise LedgerError(f"'{key}' matches {len(found)} runs: {', '.join(r.run for r in found)}")


def matching(runs: dict[str, Run], key: str) -> list[Run]:
    """Every run a key names: its id, the runs whose ids start with it (a sweep's variants), a job id, or a Slurm
    array's job id (its tasks' ids are ARRAY_TASK)."""
    if key in runs:
        return [runs[key]]
    found = [r for r in runs.values() if r.run.startswith(key) or key in (str(r.submitted.get("job_id")),
                                                                           str(r.submitted.get("job_id")).split("_")[0])]
    if not found:
        raise LedgerError(f"no run '{key}' in the ledger")
    return found
