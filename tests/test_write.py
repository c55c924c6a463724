"""Writes are all or nothing: a build killed part-way leaves out/ exactly as it was."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, run_verlc


def tree(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file()}


def test_sigkill_during_a_multi_spec_build_leaves_out_unchanged(tmp_path: Path) -> None:
    base = (REPO / "specs" / "qwen2-7b-gsm8k-ppo-mi300.yaml").read_text()
    specs = []
    for i in range(200):  # several seconds of checking and rendering: every kill below lands before the write
        spec = tmp_path / f"v{i}.yaml"
        spec.write_text(base.replace("name: qwen2-7b-gsm8k-ppo-mi300", f"name: v{i}"))
        specs.append(spec)
    out = tmp_path / "out"
    assert run_verlc("build", *specs[:3], "--target", "all", "--out", out).returncode == 0
    before = tree(out)
    for spec in specs[:3]:  # the rebuild would change them
        spec.write_text(spec.read_text().replace("total_epochs: 15", "total_epochs: 16"))
    killed = 0
    for delay in (0.3, 0.6, 0.9):
        proc = subprocess.Popen([sys.executable, "-m", "verlc", "build", *map(str, specs), "--target", "all",
                                 "--out", str(out), "--force"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            killed += 1
        proc.wait()
        assert {k: v for k, v in tree(out).items() if not k.startswith(".verlc-staging-")} == before
    assert killed, "the build finished before it could be killed; make it bigger"
    assert run_verlc("build", *specs[:3], "--target", "all", "--out", out, "--force").returncode == 0
    assert not list(out.glob(".verlc-staging-*")), "a later build clears what a killed one left"
    assert tree(out) != before
