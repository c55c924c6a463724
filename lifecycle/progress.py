"""Progress of a run from its log: the stage lines verlc's bundles print, then verl's console logger.

verl's console logger prints one line per training step, `step:N - key:value - key:value ...`
(`concat_dict_to_str` in verl/utils/logger/aggregate_logger.py: values `:.3f` up to 0.4, `pprint.pformat`
from 0.5, so numpy scalars show as `np.float64(0.5)`), behind Ray's `(TaskRunner pid=...)` prefix, and
`Total training steps: N` once before the first step.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from ..targets.protocol import STEP_LINE, parse_event

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


@dataclass(frozen=True)
class Event:
    """Something worth one line: a stage started, a node joined, the step total, a training step."""
    kind: str  # stage | nodes | total | step
    text: str
    step: Step | None = None
    total: int | None = None


def events(lines: Iterable[str]) -> Iterator[Event]:
    for line in lines:
        event = parse_event(line)
        if event and event.stage:
            yield Event("stage", event.stage)
        elif event and event.node_count:
            yield Event("nodes", "ray {}/{} nodes".format(*event.node_count))
        elif m := TOTAL.search(line):
            yield Event("total", m[0], total=int(m[1]))
        elif step := parse_step(line):
            yield Event("step", f"step {step.step}", step=step)


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
