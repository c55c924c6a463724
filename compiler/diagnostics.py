"""User-facing problems: `file:line:col: dotted.path: message`, all of them at once."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Diagnostic:
    """One problem in one input file, pointing at the line and column it came from."""

    file: str
    line: int
    col: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}: {self.path or '<spec>'}: {self.message}"


class SpecError(Exception):
    """Raised with every problem found; the CLI prints them and exits 2."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics: tuple[Diagnostic, ...] = tuple(sorted(set(diagnostics)))
        super().__init__("\n".join(str(d) for d in self.diagnostics))


def dotted(loc: Sequence[str | int]) -> str:
    """Render a location such as ('data', 'prepare', 0, 'dir') as `data.prepare[0].dir`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' (did you mean X?)' suffix for a near miss, or ''."""
    close = difflib.get_close_matches(word, sorted(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
