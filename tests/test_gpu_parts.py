"""dev/gpu/parts.py: a wheel too large for one call to the GPU machine, sent in parts (#65), run as a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

PARTS = REPO / "dev" / "gpu" / "parts.py"


def parts(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(PARTS), *map(str, args)], capture_output=True, text=True, timeout=60)


def test_a_file_split_into_parts_joins_back_byte_for_byte_and_each_call_fits_its_budget(tmp_path: Path) -> None:
    wheel = tmp_path / "vllm-0.24.0-cp38-abi3-manylinux.whl"
    wheel.write_bytes(os.urandom(5 * (1 << 20) + 12345))
    done = parts("split", wheel, tmp_path / "parts", "--size", 2)
    assert done.returncode == 0, done.stderr
    manifest = Path(done.stdout.strip())
    data = json.loads(manifest.read_text())
    assert [p["size"] for p in data["parts"]] == [2 << 20, 2 << 20, (1 << 20) + 12345]
    plan = parts("calls", tmp_path / "parts", "--budget", 3)
    assert plan.stdout.splitlines() == [f"call {i + 1}: {wheel.name}.part{i:03d}" for i in range(3)], plan.stdout
    out = tmp_path / "joined.whl"
    joined = parts("join", manifest, out)
    assert joined.returncode == 0, joined.stderr
    assert out.read_bytes() == wheel.read_bytes()


def test_a_missing_or_changed_part_is_named_and_nothing_is_joined(tmp_path: Path) -> None:
    wheel = tmp_path / "big.whl"
    wheel.write_bytes(os.urandom(3 << 20))
    manifest = Path(parts("split", wheel, tmp_path / "p", "--size", 1).stdout.strip())
    (tmp_path / "p" / "big.whl.part001").unlink()
    changed = tmp_path / "p" / "big.whl.part002"
    changed.write_bytes(b"x" + changed.read_bytes()[1:])
    out = tmp_path / "big-joined.whl"
    done = parts("join", manifest, out)
    assert done.returncode == 3
    assert "big.whl.part001: missing" in done.stderr and "big.whl.part002: not the part" in done.stderr
    assert not out.exists() and not list(tmp_path.glob("*.joining"))
