"""The benchmark script keeps working (quick mode, no cluster); it asserts no times."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import REPO


def test_benchmark_quick_mode_writes_its_table(tmp_path: Path) -> None:
    out = tmp_path / "performance.md"
    result = subprocess.run([sys.executable, str(REPO / "bench" / "run.py"), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    for row in ("cold `verlc build` scenario A", "time to error, mistyped verl key", "variant sweep",
                "`verlc explain KEY SPEC`", "editor schema per release", "`verlc migrate` scenario A",
                "`verlc import` of one example script"):
        assert row in text
    assert "has no key 'gpu_memory_utilisation'" in text
