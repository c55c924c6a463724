"""Results of runs, from what verl printed: its console logger's step lines in the job's log.

A run's metrics are the `step:N - key:value ...` lines (progress.parse_step), and the scores verl's evaluation
prints (as step 0's), validation included: verl logs
its validation metrics (`val-core/<data source>/<variable>/<metric>`, `val/test_score/<data source>` before
0.3) on the step they ran at, and the run's initial validation at step 0. A step printed twice (a requeued
run that resumed from an earlier checkpoint) counts once, with the later value. Checkpoints are the folders
verl's trainer names as it saves them (`local_global_step_folder: PATH`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from . import progress

# what `verlc runs --results` shows without --metric: verl's validation scores, the training reward, and the
# scores of verl's evaluation (main_eval)
DEFAULT_METRICS = ("val-core/", "val/test_score/", "critic/score/mean", "test_score/")
CHECKPOINT = re.compile(r"local_global_step_folder: (\S+)")
# verl's evaluation prints its scores once, as a dict: {'test_score/<data source>': 0.5} (np.float64(0.5) with
# numpy 2); they count as step 0's
EVAL_SCORES = re.compile(r"\{'test_score/.*\}\s*$")
EVAL_SCORE = re.compile(r"'(test_score/[^']+)': (?:np\.float64\()?(-?[0-9.]+(?:e[-+]?[0-9]+)?|nan)")


class ResultError(Exception):
    """A metric no run logged, a bad --metric: one line for the user."""


@dataclass(frozen=True)
class Metric:
    """A metric as asked for: a key, or a prefix ending in `/`; the best value is the highest unless `:min`."""
    pattern: str
    lowest: bool = False

    @classmethod
    def parse(cls, text: str) -> Metric:
        pattern, _, order = text.rpartition(":") if text.endswith((":min", ":max")) else (text, "", "")
        if not pattern:
            raise ResultError(f"--metric {text!r}: a metric key such as critic/score/mean (optionally :min or :max)")
        return cls(pattern, order == "min")

    def matches(self, key: str) -> bool:
        return key.startswith(self.pattern) if self.pattern.endswith("/") else key == self.pattern


@dataclass
class Logged:
    """What one run's log holds: each metric's value per step, the step total, the checkpoints saved."""
    series: dict[str, dict[int, float]] = field(default_factory=dict)
    total: int | None = None
    checkpoints: list[str] = field(default_factory=list)

    @property
    def last_step(self) -> int | None:
        steps = [s for values in self.series.values() for s in values]
        return max(steps) if steps else None


def read(lines: Iterable[str]) -> Logged:
    logged = Logged()
    for line in lines:
        if step := progress.parse_step(line):
            for key, value in step.metrics.items():
                logged.series.setdefault(key, {})[step.step] = value
        elif m := progress.TOTAL.search(line):
            logged.total = int(m[1])
        elif m := CHECKPOINT.search(line):
            logged.checkpoints.append(m[1])
        elif EVAL_SCORES.search(line):
            for key, value in EVAL_SCORE.findall(line):
                logged.series.setdefault(key, {})[0] = float(value)
    return logged


def points(logged: Logged, key: str) -> list[tuple[int, float]]:
    """One metric's (step, value) pairs in step order."""
    return sorted(logged.series.get(key, {}).items())


def chosen_keys(logs: Sequence[Logged], metrics: Sequence[Metric], asked: bool = True) -> list[str]:
    """The keys the metrics name, in the order asked, each key once; a metric no run logged is an error
    naming what they did log (unless it is a default no one asked for, which a run may not have reached yet)."""
    logged = sorted({k for log in logs for k in log.series})
    keys: list[str] = []
    for metric in metrics:
        found = [k for k in logged if metric.matches(k)]
        if not found and (asked or metric.pattern not in DEFAULT_METRICS):
            raise ResultError(f"no run logged {metric.pattern!r}; they logged: {', '.join(logged) or 'no metric yet'}")
        keys += [k for k in found if k not in keys]
    return keys


def best(values: Iterable[float], metric: Metric) -> float:
    return min(values) if metric.lowest else max(values)


@dataclass(frozen=True)
class Row:
    """One run (or a sweep's variant) in the results table."""
    run: str
    swept: dict[str, object]
    spec_sha256: str
    state: str
    steps: str
    values: dict[str, tuple[float, float]]  # key -> (last, best)
    wall: str
    gpu_hours: float | None
    checkpoint: str


def row(run: str, swept: dict[str, object], spec_sha256: str, state: str, logged: Logged, keys: Sequence[str],
        metrics: Sequence[Metric], wall_seconds: int, wall: str, gpus: int | None) -> Row:
    values = {}
    for key in keys:
        series = points(logged, key)
        if series:
            metric = next(m for m in metrics if m.matches(key))
            values[key] = (series[-1][1], best((v for _, v in series), metric))
    done = logged.last_step
    steps = f"{done if done is not None else '-'}/{logged.total if logged.total else '?'}"
    return Row(run, swept, spec_sha256, state, steps, values, wall,
               round(gpus * wall_seconds / 3600, 2) if gpus else None,
               logged.checkpoints[-1] if logged.checkpoints else "")


def _cells(rows: Sequence[Row], keys: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    swept = sorted({k for r in rows for k in r.swept})
    header = ["run", *(k.removeprefix("verl.") for k in swept), "state", "steps",
              *(f"{k} {which}" for k in keys for which in ("last", "best")), "wall", "GPU-hours", "checkpoint",
              "spec sha256"]
    body = []
    for r in rows:
        shown = [f"{r.values[k][i]:.4g}" if k in r.values else "" for k in keys for i in (0, 1)]
        body.append([r.run, *(json.dumps(r.swept[k]) if k in r.swept else "" for k in swept), r.state, r.steps,
                     *shown, r.wall, "" if r.gpu_hours is None else f"{r.gpu_hours:g}", r.checkpoint,
                     r.spec_sha256[:12]])
    return header, body


def render(rows: Sequence[Row], keys: Sequence[str], fmt: str) -> str:
    if fmt == "json":
        return json.dumps([{"run": r.run, "swept": r.swept, "state": r.state, "steps": r.steps,
                            "metrics": {k: {"last": v[0], "best": v[1]} for k, v in r.values.items()},
                            "wall": r.wall, "gpu_hours": r.gpu_hours, "checkpoint": r.checkpoint,
                            "spec_sha256": r.spec_sha256} for r in rows], indent=2) + "\n"
    return tabulate(*_cells(rows, keys), fmt)


def tabulate(header: Sequence[str], body: Sequence[Sequence[str]], fmt: str) -> str:
    """A table as aligned text, Markdown (ready for a pull request or a paper's appendix), CSV or JSON rows."""
    if fmt == "json":
        return json.dumps([dict(zip(header, r)) for r in body], indent=2) + "\n"
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([header, *body])
        return out.getvalue()
    if fmt == "markdown":
        escape = lambda cell: cell.replace("|", "\\|")  # noqa: E731
        lines = ["| " + " | ".join(map(escape, header)) + " |", "|" + "---|" * len(header)]
        return "\n".join(lines + ["| " + " | ".join(map(escape, r)) + " |" for r in body]) + "\n"
    widths = [max(len(c) for c in column) for column in zip(header, *body)]
    return "".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "\n" for r in (header, *body))
