"""`verlc plot`: one metric against step for several runs, one line each, drawn with matplotlib.

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


def draw(metric: str, lines: Sequence[tuple[str, list[tuple[int, float]]]], output: Path) -> None:
    fmt = FORMATS.get(output.suffix.lower())
    if fmt is None:
        raise ResultError(f"{output}: verlc plot writes .png or .svg files")
    try:
        import matplotlib
    except ImportError:
        raise ResultError("verlc plot draws with matplotlib: pip install 'verlc[plot]'") from None
    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot
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
    metadata = {KEY: series, "Software": None} if fmt == "png" else {"Description": series, "Date": None}
    try:
        figure.savefig(output, format=fmt, metadata=metadata)
    except OSError as exc:
        raise ResultError(f"cannot write {output}: {exc.strerror or exc}") from None
    finally:
        pyplot.close(figure)
