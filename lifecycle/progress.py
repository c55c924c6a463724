"""Progress of a run from its log: the stage lines verlc's bundles print, then verl's console logger.

verl's console logger prints one line per training step, `step:N - key:value - key:value ...`
(`concat_dict_to_str` in verl/utils/logger/aggregate_logger.py: values `:.3f` up to 0.4, `pprint.pformat`
from 0.5, so numpy scalars show as `np.float64(0.5)`), behind Ray's `(TaskRunner pid=...)` prefix, and
`Total training steps: N` once before the first step.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..runtime.protocol import (CHECK_LINE, IMAGE_LINE, SERVICE_READY, SERVICE_TAIL_PREFIX, STEP_LINE, STEP_TIMES,
                                TRAINER_MESSAGE, TRAINING_MESSAGE, Event as Line, parse_event)

TOTAL = re.compile(r"Total training steps: (\d+)")
STEP = STEP_LINE  # verl's console logger line, parsed as the runtime's stall watchdog parses it
NUMBER = re.compile(r"^(?:np\.\w+\((.*)\)|(.*))$")


ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray colours its workers' prefixes: `\x1b[36m(TaskRunner ...)\x1b[0m`


def plain(text: str) -> str:
    """A log without terminal colour codes (for a file, a pipe, a table)."""
    return ANSI.sub("", text)

@dataclass(frozen=True)
class Step:
    step: int
    metrics: dict[str, float]


def parse_step(line: str) -> Step | None:
    """One verl console-logger line, or None."""
    match = STEP.search(line)
    if match is None:
        return None
    metrics = {}
    for pair in match[2].split(" - ")[1:]:
        key, _, raw = pair.rpartition(":")
        inner = NUMBER.match(raw)
        try:
            metrics[key] = float(inner[1] or inner[2]) if inner else float(raw)
        except ValueError:
            continue
    return Step(int(match[1]), metrics)


# The event lines that say why a run stops, fails or starts over (the runtime's and the Slurm script's)
WHY = re.compile(r"(ERROR: |PREFLIGHT FAILED: |USR1: |not requeued: |requeueing job |a node was lost|Slurm sees |"
                 r"every node still answers|stopping after stage |training exited with code |exit code )")


@dataclass(frozen=True)
class Event:
    """Something worth one line: a stage started, a node joined, the step total, a training step, why a run
    stops, fails or is requeued, and how long a phase took as it ends."""
    kind: str  # stage | nodes | total | step | why | took
    text: str
    step: Step | None = None
    total: int | None = None


class Clock:
    """How long each phase took, said as it ends, from the event lines as they come (one per followed run)."""

    def __init__(self) -> None:
        self.stage: tuple[str, datetime] | None = None
        self.trainer: datetime | None = None

    def took(self, line: Line) -> str | None:
        """What ended at this event line, and how long it took; the stage it begins starts the clock."""
        at, message, said = line.at, line.message, None
        if (line.stage or line.skipped or line.exit_code is not None) and self.stage:
            said = f"{self.stage[0]} took {(at - self.stage[1]).total_seconds():.1f}s"
            self.stage = None
        if line.stage:
            self.stage = (line.stage, at)
        if CHECK_LINE.fullmatch(message) or SERVICE_READY.match(message) or \
                ((m := IMAGE_LINE.fullmatch(message)) and m["how"]):  # a pull or a build
            said = message
        elif message.startswith(TRAINING_MESSAGE):
            self.trainer = at
        elif message.startswith(TRAINER_MESSAGE) and self.trainer and not STEP_TIMES.fullmatch(message):
            said = f"verl: {message.removeprefix(TRAINER_MESSAGE).split(': ')[0]}, " \
                   f"{(at - self.trainer).total_seconds():.1f}s after the trainer started"
        return said


# How many of the trainer's own last lines a failed training shows (`--follow`): a Python traceback's cause
TRAINER_TAIL = 12
FAILED_TRAINING = re.compile(r"training exited with code [1-9]\d*$")


def events(lines: Iterable[str], clock: Clock | None = None) -> Iterator[Event]:
    clock = clock or Clock()
    recent: deque[str] = deque(maxlen=TRAINER_TAIL)  # the lines no event was made of: the trainer's own output
    for line in lines:
        event = parse_event(line)
        took = clock.took(event) if event else None
        if took:
            yield Event("took", took)
        if event is None and line.strip() and not parse_step(line):
            recent.append(line.rstrip())
        if event and FAILED_TRAINING.fullmatch(event.message):  # why it failed is in its last lines
            yield from (Event("why", f"[trainer] {kept}") for kept in recent)
        if event and event.stage:
            yield Event("stage", event.stage)
        elif event and event.node_count:
            yield Event("nodes", "ray {}/{} nodes".format(*event.node_count))
        elif event and WHY.match(event.message):
            yield Event("why", event.message)
        elif line.startswith(SERVICE_TAIL_PREFIX):  # a failed service's last lines, which its failure points at
            yield Event("why", line.rstrip())
        elif m := TOTAL.search(line):
            yield Event("total", m[0], total=int(m[1]))
        elif step := parse_step(line):
            yield Event("step", f"step {step.step}", step=step)


ATTEMPT = re.compile(r"job \S+ on .*SLURM_RESTART_COUNT=\d+")  # the Slurm script's first line of each attempt


def attempts_seconds(lines: Iterable[str]) -> int | None:
    """How long a requeued job ran over all its attempts, from its log's own event times (each attempt from its
    first line to its last; the time in Slurm's queue between them left out), or None for a log of one attempt.
    The scheduler reports the last attempt's start only."""
    spans: list[list[datetime]] = []
    for line in lines:
        event = parse_event(line)
        if event is None:
            continue
        at = event.at
        if ATTEMPT.fullmatch(event.message) or not spans:
            spans.append([at, at])
        spans[-1][1] = at
    if len(spans) < 2:
        return None
    return round(sum((end - start).total_seconds() for start, end in spans))


def step_line(step: Step, total: int | None, keys: Sequence[str], tty: bool, width: int = 24) -> str:
    """`step 12/100 [###   ] 12% key=value ...` on a terminal; plain `step 12/100 key=value` otherwise."""
    shown = " ".join(f"{k}={step.metrics[k]:.4g}" for k in keys if k in step.metrics)
    count = f"step {step.step}" + (f"/{total}" if total else "")
    if tty and total:
        done = min(width, round(width * step.step / total))
        count += f" [{'#' * done}{' ' * (width - done)}] {100 * step.step // total}%"
    return f"{count} {shown}".rstrip()


def stage_lines(lines: Iterable[str], stage: str) -> Iterator[str]:
    """The lines a log holds between the start of `stage` and the next stage (every attempt's, on requeue)."""
    inside = False
    for line in lines:
        event = parse_event(line)
        if event and (event.stage or event.skipped):
            inside = event.stage == stage
        if inside:
            yield line
