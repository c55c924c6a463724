"""Sweeps: one Slurm job array (or one Ray submission per variant), every variant checked like a spec."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest

from conftest import run_verlc
from verlc.runtime.job import Job, Variant
from test_hostile import BASE, fake_bin, run_script, write  # noqa: F401 - fake_bin is a fixture
from test_hostile import build as build_for_targets
from test_verl_differential import PARSER, composed, hydra_loader

MATRIX = {"verl.actor_rollout_ref.actor.optim.lr": [1e-6, 2e-6, 5e-7, 1e-7, 3e-6],
          "verl.algorithm.kl_ctrl.kl_coef": [0.001, 0.0001, 0.01, 0.005, 0.0005],
          "verl.data.seed": [1, 2, 3, 4]}


def build(tmp: Path, spec: dict):  # noqa: ANN201
    return build_for_targets(tmp, spec, ("slurm", "ray-job"))  # compose refuses sweeps (one host, one job)


def sweep_spec(matrix: dict = MATRIX, **changes: object) -> dict:
    spec = copy.deepcopy(BASE)
    spec["sweep"] = {"matrix": matrix}
    spec.update(changes)
    return spec


def test_a_100_variant_sweep_is_one_job_array_whose_variants_all_compose(tmp_path: Path) -> None:
    ir, bundles = build(tmp_path, sweep_spec())
    assert len(ir.variants) == 100
    slurm = next(b for b in bundles if b.target == "slurm")
    script = next(f.text for f in slurm.files if f.path == "sbatch.sh")
    assert script.count("#SBATCH --array=0-99\n") == 1
    table = next(f.text for f in slurm.files if f.path == "variants.csv")
    rows = list(csv.reader(line for line in table.splitlines() if not line.startswith("#")))
    assert len(rows) == 101 and rows[0][:2] == ["array_index", "experiment"]
    assert len({row[1] for row in rows[1:]}) == 100  # one experiment name each
    for variant in ir.variants:  # Hydra applies each array task's full override list to verl's config
        cfg = copy.deepcopy(composed("dp"))
        overrides = list(ir.trainer_argv_for(variant)[3:])
        hydra_loader.ConfigLoaderImpl._apply_overrides_to_config(PARSER.parse_overrides(overrides), cfg)
        lr, kl, seed = (value for _, value in variant.settings)
        assert (cfg.actor_rollout_ref.actor.optim.lr, cfg.algorithm.kl_ctrl.kl_coef, cfg.data.seed) == (lr, kl, seed)
        assert cfg.trainer.experiment_name == f"e-v{variant.index:03d}"


def test_the_array_can_be_throttled(tmp_path: Path) -> None:
    """#40 item 8: cluster.slurm.array_parallel N runs at most N variants at once (Slurm's --array=...%N)."""
    spec = sweep_spec()
    spec["cluster"] = copy.deepcopy(spec["cluster"])
    spec["cluster"]["slurm"] = {**spec["cluster"]["slurm"], "array_parallel": 4}
    _, bundles = build(tmp_path, spec)
    script = next(f.text for b in bundles if b.target == "slurm" for f in b.files if f.path == "sbatch.sh")
    assert script.count("#SBATCH --array=0-99%4\n") == 1
    spec["cluster"]["slurm"]["array_parallel"] = 0
    problems = build(tmp_path, spec)
    assert any("cluster.slurm.array_parallel: " in p for p in problems), problems


def test_an_array_task_runs_its_own_variant(tmp_path: Path, fake_bin: Path) -> None:  # noqa: F811
    ir, bundles = build(tmp_path, sweep_spec())
    folder = write(next(b for b in bundles if b.target == "slurm"), tmp_path / "out")
    # an array task's environment as Slurm sets it (SLURM_JOB_ID, the task's own id, comes from run_script)
    (folder / "run.sh").write_text(f"export SLURM_ARRAY_JOB_ID=4200 SLURM_ARRAY_TASK_ID=37\n"
                                   f"exec bash {folder / 'sbatch.sh'}\n")
    calls = run_script(folder, "run.sh", fake_bin, tmp_path)
    argv = [c for c in calls if "--json" in c][-1]  # the runtime's job step: the job and this task's variant
    job = Job.from_json(argv[argv.index("--json") + 1]).with_variant(
        Variant.from_json(argv[argv.index("--variant-json") + 1]))
    assert job.train == list(ir.trainer_argv_for(ir.variants[37]))
    assert job.variant.startswith("variant 37: ")
    assert job.checkpoint_dir == ir.variants[37].checkpoint_dir.as_json()
    # the script holds the job once and a line per variant: well under Slurm's 4 MB batch script limit. Measured
    # against the same spec without a sweep (the embedded runtime grows with verlc): the job JSON (2 KB or more)
    # once per variant would add over 2 KB each
    plain = copy.deepcopy(BASE)
    (tmp_path / "plain").mkdir()
    _, single = build(tmp_path / "plain", plain)
    base = len(next(f.text for b in single if b.target == "slurm" for f in b.files if f.path == "sbatch.sh").encode())
    size = len((folder / "sbatch.sh").read_bytes())
    assert size < 4 * 2 ** 20 and (size - base) / 100 < 1000, (size, base)


def test_ray_job_submits_each_variant(tmp_path: Path, fake_bin: Path) -> None:  # noqa: F811
    matrix = {"verl.data.seed": [1, 2, 3]}
    ir, bundles = build(tmp_path, sweep_spec(matrix))
    folder = write(next(b for b in bundles if b.target == "ray-job"), tmp_path / "out")
    calls = run_script(folder, "submit.sh", fake_bin, tmp_path)
    entrypoints = [c[c.index("--") + 1:] for c in calls if c[:3] == ["ray", "job", "submit"]]
    assert entrypoints == [["python3", "-m", "verlc_job", "job", str(i)] for i in range(3)]
    for i in range(3):
        job = json.loads((folder / "verlc_job" / "jobs" / f"{i}.json").read_text())
        assert job["train"] == list(ir.trainer_argv_for(ir.variants[i]))


def test_a_bad_value_is_reported_at_its_place_in_the_sweep(tmp_path: Path) -> None:
    spec = sweep_spec({"verl.actor_rollout_ref.actor.ppo_mini_batch_size": [64, 2048],
                       "verl.actor_rollout_ref.actor.optim.lr": [1e-6, "fast"]})
    problems = build(tmp_path, spec)
    assert isinstance(problems, list)
    assert any(": sweep.matrix.verl.actor_rollout_ref.actor.optim.lr[1]: expects a number" in p for p in problems)
    assert any(": sweep.matrix.verl.actor_rollout_ref.actor.ppo_mini_batch_size[1]: " in p and "(2048)" in p
               for p in problems)


def test_derived_keys_cannot_vary(tmp_path: Path) -> None:
    problems = build(tmp_path, sweep_spec({"verl.trainer.nnodes": [1, 2]}))
    assert isinstance(problems, list) and any("verlc derives trainer.nnodes" in p for p in problems)


@pytest.mark.parametrize(("limit", "code"), [(None, 2), ("2000", 0)])
def test_max_variants_guards_accidents(tmp_path: Path, limit: str | None, code: int) -> None:
    matrix = {"verl.data.seed": list(range(11)), "verl.actor_rollout_ref.actor.optim.lr": [1e-6 * i for i in range(1, 11)],
              "verl.algorithm.kl_ctrl.kl_coef": [0.001 * i for i in range(1, 11)]}  # 1,100 variants
    (tmp_path / "spec.yaml").write_text(json.dumps(sweep_spec(matrix)))
    result = run_verlc("validate", "spec.yaml", *(["--max-variants", limit] if limit else []), cwd=tmp_path)
    assert result.returncode == code, result.stderr
    if code:
        assert "1100 variants; more than --max-variants 1000" in result.stderr


def test_variants_of_a_spec_that_fixes_the_checkpoint_folder_each_get_their_own(tmp_path: Path) -> None:
    """A fixed trainer.default_local_dir shared by every variant made them resume from each other's
    checkpoints (and share one first-run record): each variant now checkpoints in a folder of its own."""
    spec = sweep_spec({"verl.actor_rollout_ref.actor.optim.lr": [1e-6, 2e-6]}, reproducible=False)
    spec["verl"] = {**spec["verl"], "trainer": {"default_local_dir": "/lustre/ckpt/run"}}
    ir, bundles = build(tmp_path, spec)
    folders = [v.checkpoint_dir.display for v in ir.variants]
    assert folders == ["/lustre/ckpt/run/e-v000", "/lustre/ckpt/run/e-v001"]
    for variant, folder in zip(ir.variants, folders):  # the trainer, the preflight and the record agree
        assert f"trainer.default_local_dir={folder}" in ir.trainer_argv_for(variant)
    assert any("each sweep variant checkpoints in a folder of its own under /lustre/ckpt/run" in n for n in ir.notes)
    slurm = next(b for b in bundles if b.target == "slurm")
    table = next(f.text for f in slurm.files if f.path == "variants.csv")
    assert "/lustre/ckpt/run/e-v000" in table and "/lustre/ckpt/run/e-v001" in table
    for index in range(2):  # ray-job: each variant's job description
        ray_job = next(b for b in bundles if b.target == "ray-job")
        job = json.loads(next(f.text for f in ray_job.files if f.path == f"verlc_job/jobs/{index}.json"))
        assert job["checkpoint_dir"] == [folders[index]]


def test_a_folder_named_after_the_experiment_already_differs_per_variant(tmp_path: Path) -> None:
    spec = sweep_spec({"verl.data.seed": [1, 2]})
    spec["verl"] = {**spec["verl"], "trainer": {"default_local_dir": "/ckpt/${trainer.experiment_name}"}}
    ir, _ = build(tmp_path, spec)
    assert [v.checkpoint_dir.display for v in ir.variants] == ["/ckpt/e-v000", "/ckpt/e-v001"]


def test_variants_that_would_share_a_checkpoint_folder_are_refused(tmp_path: Path) -> None:
    # one folder for two variants (the same value twice is refused as the same variant: test_invalid_specs)
    problems = build(tmp_path, sweep_spec({"verl.trainer.default_local_dir": ["/ckpt/a"],
                                           "verl.actor_rollout_ref.actor.optim.lr": [1.0e-6, 2.0e-6]}))
    assert isinstance(problems, list)
    assert any("sweep.matrix.verl.trainer.default_local_dir: variants 0 and 1 would both checkpoint in /ckpt/a" in p
               for p in problems), problems


def test_a_sweep_key_without_its_verl_prefix_is_named_at_the_key(tmp_path: Path) -> None:
    """#40 item 16: the message pointed at the key's values (and named the path with pydantic's `.[key]`)."""
    from conftest import REPO, run_verlc

    line = "sweep: {matrix: {actor_rollout_ref.actor.optim.lr: [1.0e-6, 2.0e-6]}}"
    text = (REPO / "specs" / "quickstart-gsm8k-1node.yaml").read_text() + line + "\n"
    (tmp_path / "spec.yaml").write_text(text)
    result = run_verlc("validate", "spec.yaml", cwd=tmp_path)
    row = text.count("\n")
    assert result.returncode == 2, result.stderr
    assert f"spec.yaml:{row}:{line.index('actor') + 1}: sweep.matrix.actor_rollout_ref.actor.optim.lr: " \
           f"'actor_rollout_ref.actor.optim.lr' is not a verl setting such as verl.actor_rollout_ref" in result.stderr
