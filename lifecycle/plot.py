"""`verlc plot`: one metric against step for several runs, one line each, drawn with matplotlib; or their
start-up timelines, a bar each.

Each line is labelled at its end (no legend to hunt through) and in a legend below the axes for lines whose
ends meet. The figure carries what it plots: the series as JSON in the PNG's text chunk `verlc:series` (the
SVG's description), so that a figure in a paper can be checked against the runs it came from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from .results import ResultError

FORMATS = {".png": "png", ".svg": "svg"}
KEY = "verlc:series"


def _pyplot():  # noqa: ANN202
    try:
        import matplotlib
    except ImportError:
        raise ResultError("verlc plot draws with matplotlib: pip install 'verlc[plot]'") from None
    matplotlib.use("Agg")  # files only, no display
    matplotlib.rcParams["svg.hashsalt"] = KEY  # the SVG's element ids from a fixed salt: the same file every time
    from matplotlib import pyplot

    return pyplot


def _format(output: Path) -> str:
    fmt = FORMATS.get(output.suffix.lower())
    if fmt is None:
        raise ResultError(f"{output}: verlc plot writes .png or .svg files")
    return fmt


def _save(figure, output: Path, fmt: str, series: str) -> None:  # noqa: ANN001
    metadata = {KEY: series, "Software": None} if fmt == "png" else {"Description": series, "Date": None}
    try:
        figure.savefig(output, format=fmt, metadata=metadata)
    except OSError as exc:
        raise ResultError(f"cannot write {output}: {exc.strerror or exc}") from None


def draw_timeline(bars: Sequence[tuple[str, list[tuple[str, float, float]]]], output: Path) -> None:
    """One horizontal bar per run, a segment per phase at its own start (seconds after the job's first line),
    a colour per phase name shared by every bar; the series embedded as `draw` embeds its lines."""
    fmt = _format(output)
    pyplot = _pyplot()
    names = list(dict.fromkeys(name for _, phases in bars for name, _, _ in phases))
    colours = {name: pyplot.get_cmap("tab20")(i % 20) for i, name in enumerate(names)}
    series = json.dumps({label: phases for label, phases in bars}, separators=(",", ":"))
    figure, axes = pyplot.subplots(figsize=(9, 1.2 + 0.6 * len(bars)), dpi=120, layout="constrained")
    for row, (label, phases) in enumerate(reversed(bars)):
        for name, start, seconds in phases:
            axes.barh(row, seconds, left=start, height=0.6, color=colours[name], edgecolor="white", linewidth=0.5)
    axes.set_yticks(range(len(bars)), [label for label, _ in reversed(bars)], fontsize=8)
    axes.set_xlabel("seconds after the job's first line")
    axes.set_title("start-up up to verl's first step")
    axes.grid(axis="x", alpha=0.3)
    handles = [pyplot.Rectangle((0, 0), 1, 1, color=colours[n]) for n in names]
    figure.legend(handles, names, loc="outside lower center", ncols=min(len(names), 5), fontsize=8, frameon=False)
    try:
        _save(figure, output, fmt, series)
    finally:
        pyplot.close(figure)


def draw(metric: str, lines: Sequence[tuple[str, list[tuple[int, float]]]], output: Path) -> None:
    fmt = _format(output)
    pyplot = _pyplot()
    from matplotlib.ticker import MaxNLocator

    series = json.dumps({label: points for label, points in lines}, separators=(",", ":"))
    figure, axes = pyplot.subplots(figsize=(8, 4.5), dpi=120, layout="constrained")
    for label, points in lines:
        steps, values = zip(*points)
        drawn = axes.plot(steps, values, marker="o" if len(points) <= 30 else None, markersize=3, label=label)
        axes.annotate(label, (steps[-1], values[-1]), xytext=(5, 0), textcoords="offset points", va="center",
                      fontsize=8, color=drawn[0].get_color())
    axes.set_xlabel("step")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_ylabel(metric)
    axes.set_title(metric)
    axes.grid(alpha=0.3)
    axes.margins(x=0.15)  # room for the end labels
    if len(lines) > 1:
        figure.legend(loc="outside lower center", ncols=min(len(lines), 4), fontsize=8, frameon=False)
    try:
        _save(figure, output, fmt, series)
    finally:
        pyplot.close(figure)
