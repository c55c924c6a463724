"""Slurm options a site needs that verlc models (exclusive, constraint, reservation, the GRES form) and the escape
hatch for the rest (cluster.slurm.sbatch), checked against the real sbatch's option names (#53 item 10)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from conftest import require_tool, run_verlc
from verlc.targets.slurm.checks import OWNED, SBATCH_OPTIONS

SPEC = """\
name: site
project: p
model: /models/m
data: {train_files: [/d/train.parquet], val_files: [/d/test.parquet]}
cluster:
  nodes: 2
  gpus_per_node: 8
  gpu_type: H100
  slurm:
    cpus_per_task: 32
    exclusive: true
    constraint: h100&ib
    reservation: grpo-week
    typed_gpus: false
    sbatch: SBATCH
container: {runtime: none}
verl: {algorithm: {adv_estimator: grpo}, actor_rollout_ref: {actor: {ppo_micro_batch_size_per_gpu: 4},
                           rollout: {name: vllm, log_prob_micro_batch_size_per_gpu: 4}}}
"""


def recognized(option: str) -> bool:
    """Whether the real sbatch's option parser knows --option."""
    conf = Path(__file__).parent.parent / ".cache" / "sbatch-options.conf"
    conf.parent.mkdir(exist_ok=True)
    conf.write_text("ClusterName=options\nSlurmctldHost=localhost\n")
    # --usage, after the option, ends sbatch once its options are parsed: nothing is submitted
    done = subprocess.run([require_tool("sbatch"), f"--{option}=1", "--usage"], capture_output=True, text=True,
                          timeout=30, env={"SLURM_CONF": str(conf), "PATH": "/usr/bin:/bin"})
    return "unrecognized option" not in done.stderr


def test_every_option_verlc_passes_on_is_one_of_the_real_sbatchs() -> None:
    assert not recognized("no-such-option")  # the probe can tell
    unknown = [o for o in sorted(SBATCH_OPTIONS | set(OWNED)) if not recognized(o)]
    assert unknown == [], unknown


def test_site_options_reach_the_sbatch_script(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC.replace("SBATCH", "{hint: nomultithread, overcommit: true}"))
    done = run_verlc("build", "spec.yaml", "--target", "slurm", "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    directives = re.findall(r"^#SBATCH (\S+)$", (tmp_path / "out" / "site" / "slurm" / "sbatch.sh").read_text(), re.M)
    for wanted in ("--exclusive", "--constraint=h100&ib", "--reservation=grpo-week", "--hint=nomultithread",
                   "--overcommit", "--gpus-per-node=8"):
        assert wanted in directives, directives
    (tmp_path / "typed.yaml").write_text(SPEC.replace("SBATCH", "{}").replace("    typed_gpus: false\n", "")
                                         .replace("name: site", "name: typed"))
    done = run_verlc("build", "typed.yaml", "--target", "slurm", "--out", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "#SBATCH --gpus-per-node=H100:8\n" in (tmp_path / "out" / "typed" / "slurm" / "sbatch.sh").read_text()


def test_an_option_verlc_sets_or_sbatch_lacks_is_refused_at_its_key(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC.replace("SBATCH", "\n      ntasks: 16\n      time: '1:00:00'"
                                                               "\n      gres-flag: enforce-binding"))
    done = run_verlc("validate", "spec.yaml", "--target", "slurm", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert "spec.yaml:16:7: cluster.slurm.sbatch.ntasks: verlc sets --ntasks itself: one task per node, Ray's" \
           in lines, lines
    assert "spec.yaml:17:7: cluster.slurm.sbatch.time: verlc sets --time from cluster.slurm.time: set it there" \
           in lines, lines
    assert "spec.yaml:18:7: cluster.slurm.sbatch.gres-flag: sbatch has no option --gres-flag (did you mean " \
           "gres-flags?)" in lines, lines


def test_a_memory_without_a_unit_is_noted_as_megabytes(tmp_path: Path) -> None:
    (tmp_path / "spec.yaml").write_text(SPEC.replace("SBATCH", "{}").replace("    exclusive: true\n",
                                                                              "    mem: '200'\n"))
    done = run_verlc("validate", "spec.yaml", "--target", "slurm", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "spec.yaml:11:10: cluster.slurm.mem: note: Slurm reads a number without a unit as megabytes: " \
           "--mem=200 is 200 MB per node; write 200G for gigabytes" in done.stderr, done.stderr
