"""The README is a front page whose commands work: every `verlc` command of its tour runs, as written, from a
copy of the repository's example specs; every page it points to exists."""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

from conftest import REPO, run_verlc

README = (REPO / "README.md").read_text()


def tour_commands() -> list[list[str]]:
    tour = README.split("\n## A short tour\n", 1)[1].split("\n## ", 1)[0]
    return [shlex.split(line.strip())[1:] for line in tour.splitlines() if line.startswith("    verlc ")]


def test_every_command_of_the_tour_runs_as_written(tmp_path: Path) -> None:
    commands = tour_commands()
    assert [c[0] for c in commands] == ["validate", "plan", "explain", "build", "diff"], commands
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    for args in commands:
        result = run_verlc(*args, cwd=tmp_path)
        expected = 1 if args[0] == "diff" else 0  # the tour says: diff exits 1 when the specs differ
        assert result.returncode == expected and "Traceback" not in result.stderr, (args, result.stderr)
        assert result.stdout.strip(), args  # each prints what the tour says it does
    built = tmp_path / "out" / "qwen2-7b-gsm8k-ppo-mi300" / "slurm"
    assert sorted(p.name for p in built.iterdir()) == ["manifest.json", "sbatch.sh", "spec.yaml", "verl-config.yaml"]


def test_the_front_page_is_short_and_every_page_it_names_exists() -> None:
    assert len(README.splitlines()) < 120
    assert README.count("\n    python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/verlc build ") == 1
    assert README.count("\n    bash dev/test.sh\n") == 1
    for page in sorted(set(re.findall(r"docs/[\w.-]+\.md", README))):
        assert (REPO / page).is_file(), page
