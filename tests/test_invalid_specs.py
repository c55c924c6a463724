"""Bad input: every file in tests/invalid/ gets its expected `file:line:col: path: message` lines,
exit code 2, no traceback, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO, run_verlc

INVALID = sorted((REPO / "tests" / "invalid").glob("*.yaml"))


def expected(spec: Path) -> list[str]:
    return [line.removeprefix("# expect: ") for line in spec.read_text().splitlines()
            if line.startswith("# expect: ")]


def test_corpus_is_large_enough() -> None:
    assert len(INVALID) >= 15
    assert all(expected(p) for p in INVALID), "every invalid spec states its expected errors"


@pytest.mark.parametrize("spec", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_spec(spec: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_verlc("build", spec.name, "--target", "slurm", "--out", out, cwd=spec.parent)
    assert result.returncode == 2, result.stderr
    problems = result.stderr.splitlines()
    assert problems[-1].endswith("; nothing written")
    assert problems[:-1] == expected(spec)
    assert "Traceback" not in result.stderr
    assert not out.exists()


def test_directory_instead_of_a_file(tmp_path: Path) -> None:
    result = run_verlc("validate", tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{tmp_path}:1:1: <spec>: is a directory, not a spec file")


def test_binary_file(tmp_path: Path) -> None:
    spec = tmp_path / "bin.yaml"
    spec.write_bytes(b"name: x\n\xff\xfe\x00garbage")
    result = run_verlc("validate", spec)
    assert result.returncode == 2
    assert result.stderr.startswith(f"{spec}:2:1: <spec>: not UTF-8 text")


def test_huge_file(tmp_path: Path) -> None:
    spec = tmp_path / "huge.yaml"
    spec.write_text("name: " + "x" * (10 << 20) + "\n")
    result = run_verlc("validate", spec)
    assert result.returncode == 2
    assert "a spec must be under 1048576 bytes" in result.stderr


def test_unknown_target() -> None:
    result = run_verlc("build", "specs/x.yaml", "--target", "kubernetes")
    assert result.returncode == 2
    assert "invalid choice: 'kubernetes'" in result.stderr and "Traceback" not in result.stderr


def test_all_specs_fail_together_and_nothing_is_written(tmp_path: Path) -> None:
    """Two specs, one broken: both are reported or built, never half of them."""
    good = sorted((REPO / "specs").glob("*.yaml"))[0]
    bad = REPO / "tests" / "invalid" / "nodes-zero.yaml"
    result = run_verlc("build", good, bad, "--target", "slurm", "--out", tmp_path / "out")
    assert result.returncode == 2
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
