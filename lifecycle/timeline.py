"""Where a run's start-up time goes, read back from the event lines of its log (runtime/protocol.py).

Each attempt of a run (a requeued Slurm job has several) is a list of phases: the stages (containers, ray, data,
preflight, train) from their own lines, and inside them what the runtime times as it goes: the job's image on
every node (the Slurm script's pull or build, apart from the containers' start), the last node's arrival, each
preflight check (with its slowest node), each service from its start until it was seen ready, and verl's own
start-up milestones as the runtime stamped them while relaying the trainer's output (protocol.TRAINER_MILESTONES),
up to its first step. A milestone whose line the log lacks is unknown, never estimated. Every time is the clock of the
node that printed it; the runtime's lines all come from the head node, and its preflight measures each node's
clock against the head's (shown with the phases: a node's own lines are off by its offset).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime

from ..runtime.protocol import (CHECK_LINE, CLOCK_OFFSET, CLOCKS_MESSAGE, FIRST_STEP, IMAGE_LINE, SERVICE_FAILED,
                                SERVICE_READY, STEP_TIMES, TRAINER_MESSAGE, TRAINER_MILESTONES, TRAINING_MESSAGE, Event,
                                parse_event)
from .progress import ATTEMPT

SERVICE_STARTED = re.compile(r"service (?P<name>[\w-]+): start(?:ed|ing) on ")
LAST_NODE = re.compile(r"node registered: (?P<node>\S+) .*\((?P<seen>\d+)/(?P=seen)\)$")
TRAINER_PHASES = (*(name for name, _ in TRAINER_MILESTONES), FIRST_STEP)


@dataclass(frozen=True)
class Phase:
    """One phase of an attempt: its start (seconds after the attempt's first line) and length, None where its
    log has no line for it; `part`: a part of the stage above it (a check, a service, a milestone)."""
    name: str
    start: float | None
    seconds: float | None
    part: bool = False
    note: str = ""


@dataclass
class Attempt:
    began: datetime
    phases: list[Phase] = field(default_factory=list)
    first_step: float | None = None  # seconds from the attempt's first line to verl's first step
    median_step: float | None = None
    steps: int | None = None
    clocks: dict[str, tuple[float, float]] = field(default_factory=dict)  # node -> its offset to the head's, within



class _Reader:
    """One attempt's phases, built line by line."""

    def __init__(self, began: datetime) -> None:
        self.attempt = Attempt(began)
        self.stage: tuple[str, float, int] | None = None  # the stage under way, its start and its row
        self.ended = False  # the job's last line ("exit code N") was read
        self.services: dict[str, float] = {}
        self.trainer: float | None = None  # the trainer's start, then its latest milestone
        self.milestones: dict[str, Phase] = {}
        self.images: dict[str, tuple[str, float]] = {}  # node -> how it had the job's image (pulled, built), seconds
        self.image_row: int | None = None

    def since(self, at: datetime) -> float:
        return round((at - self.attempt.began).total_seconds(), 3)

    def end_stage(self, now: float, note: str = "") -> None:
        if self.stage:
            name, start, row = self.stage
            self.attempt.phases[row] = Phase(name, start, round(now - start, 3), note=note)
            if name == "train":
                self.attempt.phases += [Phase(f"verl: {n}", None, None, True, "its line is not in this log")
                                        for n in TRAINER_PHASES if n not in self.milestones]
            self.stage = None

    def read(self, event: Event) -> None:
        message, now = event.message, self.since(event.at)
        part = self.attempt.phases.append
        if event.stage or event.skipped:
            self.end_stage(now)
            if event.stage:
                self.stage = (event.stage, now, len(self.attempt.phases))
                part(Phase(event.stage, now, None))
        elif (m := LAST_NODE.search(message)) and self.stage:
            part(Phase(f"all {m['seen']} nodes in Ray", self.stage[1], round(now - self.stage[1], 3), True,
                       f"the last: {m['node']}"))
        elif (m := IMAGE_LINE.fullmatch(message)) and self.stage:
            self.image(m, now)
        elif (m := CHECK_LINE.fullmatch(message)):
            seconds = float(m["seconds"])
            slowest = f"the slowest node: {m['node']} ({float(m['node_seconds']):.1f}s)" if m["node"] else ""
            part(Phase(f"check {m['name']}", round(now - seconds, 3), seconds, True, slowest))
        elif (m := SERVICE_STARTED.match(message)):
            self.services[m["name"]] = now
        elif (m := SERVICE_READY.match(message)) and m["name"] in self.services:
            part(Phase(f"service {m['name']}", self.services[m["name"]], float(m["seconds"]), True,
                       "from its start until first seen ready"))
        elif (m := SERVICE_FAILED.match(message)) and m["name"] in self.services:
            part(Phase(f"service {m['name']}", self.services[m["name"]], float(m["seconds"]), True,
                       "failed: from its start until it failed (the job's log says why)"))
        elif message.startswith(TRAINING_MESSAGE):
            self.trainer = now
        elif event.exit_code is not None:
            self.ended = True
        elif message.startswith(CLOCKS_MESSAGE):
            self.attempt.clocks = {m["node"]: (float(m["offset"]), float(m["within"]))
                                   for m in CLOCK_OFFSET.finditer(message.removeprefix(CLOCKS_MESSAGE))}
        elif (m := STEP_TIMES.fullmatch(message)):
            self.attempt.steps, self.attempt.median_step = int(m["steps"]), float(m["median"])
        elif message.startswith(TRAINER_MESSAGE) and self.trainer is not None:
            name, _, said = message.removeprefix(TRAINER_MESSAGE).partition(": ")
            name = FIRST_STEP if name.startswith(FIRST_STEP) else name
            if name in TRAINER_PHASES and name not in self.milestones:
                self.milestones[name] = Phase(f"verl: {name}", self.trainer, round(now - self.trainer, 3), True,
                                              said or message.removeprefix(TRAINER_MESSAGE))
                part(self.milestones[name])
                self.trainer = now
                if name == FIRST_STEP:
                    self.attempt.first_step = now

    def image(self, m: re.Match, now: float) -> None:
        """The job's image on each node, as one phase from the stage's start to the last node that had it: its
        note names the slowest pull or build."""
        assert self.stage is not None
        self.images[m["node"]] = (m["how"] or "present", float(m["seconds"] or 0))
        node, (how, seconds) = max(self.images.items(), key=lambda item: item[1][1])
        note = f"the slowest: {node}, {how} in {seconds:.1f}s" if how != "present" else "present on every node"
        phase = Phase(f"image on {len(self.images)} nodes", self.stage[1], round(now - self.stage[1], 3), True, note)
        if self.image_row is None:
            self.image_row = len(self.attempt.phases)
            self.attempt.phases.append(phase)
        else:
            self.attempt.phases[self.image_row] = phase

    def close(self, last: datetime | None, ended: bool) -> Attempt:
        if last is not None:
            self.end_stage(self.since(last), "" if ended or self.ended else "under way at the log's end")
        return self.attempt


def attempts(lines: Iterable[str], ended: bool = False) -> list[Attempt]:
    """Every attempt's timeline in a log, in order; `ended`: the run has ended (its scheduler says so), so its
    last stage ended with the log's last line (a requeued run's earlier attempts always have)."""
    found: list[Attempt] = []
    reader: _Reader | None = None
    last: datetime | None = None
    for line in lines:
        event = parse_event(line)
        if event is None:
            continue
        at = event.at
        if reader is None or ATTEMPT.fullmatch(event.message):
            if reader is not None:
                found.append(reader.close(last, True))
            reader = _Reader(at)
        reader.read(event)
        last = at
    if reader is not None:
        found.append(reader.close(last, ended))
    return found


def to_json(found: list[Attempt]) -> list[dict]:
    """The attempts as the ledger keeps them (the run's timeline outlives its log: a Ray job's, a pod's)."""
    return [{"began": a.began.isoformat(), "phases": [asdict(p) for p in a.phases], "first_step": a.first_step,
             "median_step": a.median_step, "steps": a.steps, "clocks": {n: list(c) for n, c in a.clocks.items()}}
            for a in found]


def from_json(kept: list[dict]) -> list[Attempt]:
    """The attempts `to_json` kept."""
    return [Attempt(datetime.fromisoformat(a["began"]), [Phase(**p) for p in a["phases"]], a["first_step"],
                    a["median_step"], a["steps"], {n: (c[0], c[1]) for n, c in a["clocks"].items()}) for a in kept]


def bar(attempt: Attempt) -> list[tuple[str, float, float]]:
    """An attempt's phases up to verl's first step as (name, start, seconds), one after the other: the stages
    before training, then verl's milestones in place of the train stage (up to its last known one)."""
    out = [(p.name, p.start, p.seconds) for p in attempt.phases
           if not p.part and p.name != "train" and p.start is not None and p.seconds is not None]
    out += [(p.name.removeprefix("verl: "), p.start, p.seconds) for p in attempt.phases
            if p.name.startswith("verl: ") and p.start is not None and p.seconds is not None]
    return out


def seconds(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f}s" if value < 600 else \
        f"{int(value) // 3600}:{int(value) // 60 % 60:02d}:{int(value) % 60:02d}"


COLUMNS = ("run", "attempt", "phase", "start", "duration", "share", "note")


def rows(run: str, found: list[Attempt], queued: float | None = None) -> list[tuple[str, ...]]:
    """A run's timeline as table rows: each attempt's phases, then its time to verl's first step and the median
    step after it; `queued`: the first attempt's wait in the scheduler's queue, where the scheduler said."""
    out = []
    for number, attempt in enumerate(found):
        first = attempt.first_step
        if number == 0 and queued is not None:
            out.append((run, "0", "queue", "", seconds(queued), "", "from the submission to the job's start"))
        for p in attempt.phases:
            share = f"{100 * p.seconds / first:.0f}%" if first and p.seconds is not None and p.start is not None \
                and p.start + p.seconds <= first + 0.001 else ""
            out.append((run, str(number), ("  " if p.part else "") + p.name,
                        "" if p.start is None else f"+{seconds(p.start)}", seconds(p.seconds), share, p.note))
        if attempt.clocks:
            out.append((run, str(number), "node clocks", "", "", "", clock_note(attempt.clocks)))
        out.append((run, str(number), "time to first step", "", seconds(first), "100%" if first else "",
                    "from the job's first line" if first else "no step in this log"))
        if attempt.median_step is not None:
            out.append((run, str(number), "median step", "", seconds(attempt.median_step), "",
                        f"over {attempt.steps} steps"))
    return out


def clock_note(clocks: dict[str, tuple[float, float]]) -> str:
    """The node whose clock is furthest from the head's, as the preflight measured it: beyond its error bound,
    the times of that node's own lines are off by it."""
    node, (offset, within) = max(clocks.items(), key=lambda item: abs(item[1][0]))
    off = abs(offset) > within
    return (f"{node} {offset:+.3f}s (within {within:.3f}s) against the head's, the furthest of {len(clocks)}"
            + (f": {node}'s own lines are {abs(offset):.3f}s {'ahead' if offset > 0 else 'behind'}" if off else ""))
