"""`verlc diff`: what differs between two runs, grouped for a reviewer; specs and bundles alike."""

from __future__ import annotations

from pathlib import Path

from conftest import REPO, run_verlc

A = REPO / "specs" / "qwen2-7b-gsm8k-ppo-mi300.yaml"


def test_a_bundle_and_its_spec_are_the_same_run() -> None:
    result = run_verlc("diff", REPO / "out" / A.stem / "slurm", A)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "describe the same run" in result.stdout


def test_changes_are_grouped_and_marked(tmp_path: Path) -> None:
    changed = tmp_path / "b.yaml"
    changed.write_text(A.read_text().replace("lr: 1e-6", "lr: 2e-6").replace("nodes: 2", "nodes: 1")
                       .replace("  NCCL_DEBUG: INFO\n", ""))
    result = run_verlc("diff", A, changed)
    assert result.returncode == 1, result.stderr
    text = result.stdout
    assert "verl settings:\n" in text and "  ~ actor_rollout_ref.actor.optim.lr: 1e-06 -> 2e-06" in text
    assert "  ~ trainer.nnodes: 2 -> 1" in text
    assert "resources:\n" in text and "  ~ nodes: 2 -> 1" in text
    assert "environment:\n" in text and "  - NCCL_DEBUG = INFO" in text
    markdown = run_verlc("diff", A, changed, "--format", "markdown").stdout
    assert "| ~ | `actor_rollout_ref.actor.optim.lr` | `1e-06` | `2e-06` |" in markdown
