"""`verlc schema --format markdown`: docs/spec.md is what the models generate, and every key has a
description. The JSON Schemas for editors (one per verl release) are tested in test_editor.py."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import REPO, run_verlc


def test_generated_reference_is_fresh() -> None:
    result = run_verlc("schema", "--format", "markdown")
    assert result.returncode == 0
    assert (REPO / "docs/spec.md").read_text() == result.stdout, "docs/spec.md is stale: run verlc schema " \
        "--format markdown > docs/spec.md"


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
