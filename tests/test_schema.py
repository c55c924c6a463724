"""`verlc schema`: the committed JSON Schema and docs/spec.md are what the models generate, and the
example specs (which point their editors at the schema) validate against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from ruamel.yaml import YAML

from conftest import REPO, SPECS, run_verlc


@pytest.mark.parametrize(("args", "path"), [((), "verlc.schema.json"), (("--format", "markdown"), "docs/spec.md")])
def test_generated_reference_is_fresh(args: tuple[str, ...], path: str) -> None:
    result = run_verlc("schema", *args)
    assert result.returncode == 0
    assert (REPO / path).read_text() == result.stdout, f"{path} is stale: run verlc schema {' '.join(args)} > {path}"


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_examples_carry_the_modeline_and_validate(spec) -> None:  # noqa: ANN001
    jsonschema = pytest.importorskip("jsonschema")
    text = spec.read_text()
    assert text.startswith("# yaml-language-server: $schema=../verlc.schema.json\n")
    schema = json.loads((REPO / "verlc.schema.json").read_text())
    jsonschema.validate(YAML(typ="safe", pure=True).load(text), schema)


def test_every_key_has_a_description() -> None:
    rows = [line for line in run_verlc("schema", "--format", "markdown").stdout.splitlines()
            if line.startswith("| `")]
    assert rows and all(not line.endswith("|  |") for line in rows), [r for r in rows if r.endswith("|  |")]


def test_a_reader_that_stops_early_is_not_an_internal_error() -> None:
    """`verlc schema | head -1`: the pipe closes under the writer; verlc ends quietly (141, as a shell's SIGPIPE)."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone before the first write
    try:
        writer = subprocess.run([sys.executable, "-m", "verlc", "schema"], stdout=write, stderr=subprocess.PIPE,
                                text=True, timeout=60)
    finally:
        os.close(write)
    assert (writer.returncode, writer.stderr) == (141, "")
