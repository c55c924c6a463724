"""YAML 1.2 semantics and positions, as the loader promises."""

from __future__ import annotations

from pathlib import Path

import pytest

from verlc.compiler.diagnostics import SpecError
from verlc.compiler.load import load


def test_yaml_12_scalars(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("lr: 1e-6\nflag: no\nyes_word: yes\non: on\noctal: 010\nnull_: ~\n")
    data = load(spec).data
    assert data == {"lr": 1e-6, "flag": "no", "yes_word": "yes", "on": "on", "octal": 10, "null_": None}
    assert isinstance(data["lr"], float)


def test_positions_are_one_based(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("a:\n  b: [1, {c: 2}]\n")
    sourced = load(spec)
    assert sourced.position(("a", "b", 1, "c")) == (2, 14)
    assert sourced.position(("a", "b"), at_key=True) == (2, 3)
    assert sourced.position(("a", "missing")) == (2, 3)  # the nearest parent that exists


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("a: 1\nb: 2\na: 3\n")
    with pytest.raises(SpecError) as err:
        load(spec)
    assert str(err.value.diagnostics[0]).startswith(f"{spec}:3:1: <spec>: invalid YAML: found duplicate key")


def test_non_string_keys_are_errors(tmp_path: Path) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text("a:\n  1: x\n")
    with pytest.raises(SpecError) as err:
        load(spec)
    assert str(err.value.diagnostics[0]) == f"{spec}:2:3: a: keys must be strings, got 1"
