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


def test_what_runs_wrote_into_a_compose_bundle_survives_rebuilds_and_check(tmp_path: Path) -> None:
    """The compose bundle's runs write run records (runs/) and relative mounts (data/) into its folder:
    a rebuild keeps them, `check` ignores them, git ignores them, and a build killed between swapping the
    folder and moving them back has the next build restore them."""
    spec = REPO / "specs" / "quickstart-gsm8k-1node.yaml"
    out = tmp_path / "out"
    assert run_verlc("build", spec, "--target", "all", "--out", out).returncode == 0
    bundle = out / "quickstart-gsm8k-1node" / "compose"
    assert (bundle / ".gitignore").read_text().endswith("/data/\n/runs/\n")
    (bundle / "runs").mkdir()
    (bundle / "runs" / "run-record.json").write_text("{}")
    (bundle / "data" / "gsm8k").mkdir(parents=True)
    (bundle / "data" / "gsm8k" / "train.parquet").write_bytes(b"PAR1")
    assert run_verlc("check", spec, "--out", out).returncode == 0
    edited = tmp_path / "s.yaml"
    edited.write_text(spec.read_text().replace("total_epochs: 3", "total_epochs: 4"))
    # another file of the same spec name: its build replaces the bundle only when forced (#53 item 8)
    assert run_verlc("build", edited, "--target", "compose", "--out", out).returncode == 2
    assert run_verlc("build", edited, "--target", "compose", "--out", out, "--force").returncode == 0
    assert "trainer.total_epochs=4" in (bundle / "verlc_job" / "job.json").read_text()
    assert (bundle / "runs" / "run-record.json").read_text() == "{}"
    assert (bundle / "data" / "gsm8k" / "train.parquet").read_bytes() == b"PAR1"
    # a build killed after the swap, before moving them: the new folder is in place, the old one (holding
    # runs/ and data/) still in the killed build's staging folder
    staging = out / ".verlc-staging-killed" / ".old" / "quickstart-gsm8k-1node"
    staging.mkdir(parents=True)
    os.replace(bundle, staging / "compose")
    assert run_verlc("build", spec, "--target", "compose", "--out", tmp_path / "fresh").returncode == 0
    os.replace(tmp_path / "fresh" / "quickstart-gsm8k-1node" / "compose", bundle)
    assert run_verlc("build", spec, "--target", "compose", "--out", out).returncode == 0
    assert (bundle / "runs" / "run-record.json").read_text() == "{}"
    assert (bundle / "data" / "gsm8k" / "train.parquet").read_bytes() == b"PAR1"
    assert not list(out.glob(".verlc-staging-*"))
