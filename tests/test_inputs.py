"""What a run used, pinned and proven: a hub model's revision put into a folder (from a local Hugging Face
cache, hub offline), the run record's comparison groups, and `verlc diff` of two run records."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_verlc

from verlc.runtime import record as incluster
from verlc.targets.job_package import one_program

COMMIT = "0123456789abcdef" * 2 + "01234567"


def hub_cache(home: Path, repo: str = "org/tiny", commit: str = COMMIT) -> dict[str, bytes]:
    """A Hugging Face cache as the hub client leaves it: blobs, a snapshot of symlinks, refs/main."""
    files = {"config.json": b'{"model_type": "qwen2"}', "tokenizer.json": b'{"version": "1.0"}',
             "model.safetensors": os.urandom(4096), "sub/extra.txt": b"x"}
    root = home / "hub" / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    for rel, data in files.items():
        blob = root / "blobs" / f"blob-{rel.replace('/', '-')}"
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return files


def materialize(home: Path, folder: Path, revision: str = COMMIT) -> subprocess.CompletedProcess[str]:
    """The helper as a bundle runs it, with the hub offline: only the local cache can answer."""
    return subprocess.run([sys.executable, "-", "materialize", "--repo", "org/tiny", "--revision", revision,
                           "--folder", str(folder)], input=one_program(), text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, "HF_HOME": str(home), "HF_HUB_OFFLINE": "1"})


def test_a_pinned_revision_comes_from_the_local_cache_with_the_hub_offline(tmp_path: Path) -> None:
    files = hub_cache(tmp_path / "hf")
    folder = tmp_path / "models" / "tiny"
    first = materialize(tmp_path / "hf", folder)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"fetching model org/tiny at {COMMIT} into {folder} from the local Hugging Face cache" in first.stdout
    assert {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
            and p.name != ".verlc-revision.json"} == files
    blob = next((tmp_path / "hf").rglob("blob-model.safetensors"))
    assert (folder / "model.safetensors").stat().st_ino == blob.stat().st_ino  # linked, not a second copy
    record = incluster.model_input(str(folder))
    assert record["revision"] == COMMIT and set(record["files"]) == {"config.json", "tokenizer.json"}

    again = materialize(tmp_path / "hf", folder)
    assert f"model org/tiny at {COMMIT} already in {folder} (4 files); skipping" in again.stdout
    (folder / "sub" / "extra.txt").unlink()  # no longer every file of the revision: fetched again
    refetched = materialize(tmp_path / "hf", folder)
    assert "fetching model" in refetched.stdout and (folder / "sub" / "extra.txt").read_bytes() == b"x"


def test_a_revision_the_cache_lacks_or_a_folder_verlc_did_not_fill_is_a_clear_error(tmp_path: Path) -> None:
    hub_cache(tmp_path / "hf")
    missing = materialize(tmp_path / "hf", tmp_path / "m", revision="f" * 40)
    assert missing.returncode == 1 and f"ERROR: cannot fetch org/tiny at {'f' * 40}: " in missing.stdout
    assert "Traceback" not in missing.stdout + missing.stderr and not (tmp_path / "m").exists()
    theirs = tmp_path / "theirs"
    (theirs / "keep.txt").parent.mkdir()
    (theirs / "keep.txt").write_text("the user's")
    refused = materialize(tmp_path / "hf", theirs)
    assert refused.returncode == 1 and "exists and verlc did not fill it" in refused.stdout
    assert (theirs / "keep.txt").read_text() == "the user's"


def record(**changes: object) -> dict:
    base = {
        "image": "verl@sha256:" + "0" * 64, "gpus": 16, "versions": {"verl": "0.9.1", "torch": "2.13.0"},
        "nodes": [{"host": "n1", "python": "3.11.7", "cpus": 32}, {"host": "n2", "python": "3.11.7", "cpus": 32}],
        "inputs": {"data": [{"path": "data/train.parquet", "bytes": 10, "sha256": "a" * 64, "rows": 3}],
                   "model": {"path": "models/m", "revision": COMMIT, "files": {"config.json": "c" * 64}}},
        "trainer_argv": ["env", "RAY_ADDRESS=10.0.0.1:20100", "python3", "-m", "verl.trainer.main_ppo", "a=1"],
        "verl_config": {"trainer": {"total_epochs": 3, "project_name": "p"}},
    }
    for key, value in changes.items():
        base[key] = value
    return base


def test_two_records_differ_by_group_and_a_rerun_is_judged_on_all_but_resources() -> None:
    moved = record(trainer_argv=["env", "RAY_ADDRESS=10.0.0.9:21300", "python3", "-m", "verl.trainer.main_ppo", "a=1"],
                   nodes=[{"host": "n7", "python": "3.11.7", "cpus": 32}, {"host": "n8", "python": "3.11.7", "cpus": 32}])
    # another allocation and another job's Ray port: the same run
    assert list(incluster.record_differences(record(), moved)) == ["resources"]
    edited = record(inputs={"data": [{"path": "data/train.parquet", "bytes": 10, "sha256": "b" * 64, "rows": 3}],
                            "model": record()["inputs"]["model"]},
                    verl_config={"trainer": {"total_epochs": 4, "project_name": "p"}})
    changes = incluster.record_differences(record(), edited)
    assert changes == {"inputs": [("data data/train.parquet sha256", "a" * 64, "b" * 64)],
                       "verl config": [("verl trainer.total_epochs", 3, 4)]}


def test_a_first_run_recorded_before_inputs_were_is_compared_on_what_it_has(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    older = record()
    for key in ("inputs", "verl_config", "trainer_argv"):
        del older[key]
    (tmp_path / "first.json").write_text(json.dumps(older))
    assert incluster.reference_problems(record(), str(tmp_path / "first.json")) == []
    said = capsys.readouterr().out
    assert "has no inputs (an older verlc wrote it): inputs not compared" in said
    assert "has no verl config (an older verlc wrote it): verl config not compared" in said
    older["versions"]["verl"] = "0.9.0"  # what it has is still compared
    (tmp_path / "first.json").write_text(json.dumps(older))
    assert incluster.reference_problems(record(), str(tmp_path / "first.json")) == [
        f"versions: verl: 0.9.1, but the first run ({tmp_path / 'first.json'}) had 0.9.0"]


def test_verlc_diff_of_two_run_records(tmp_path: Path) -> None:
    (tmp_path / "a.json").write_text(json.dumps(record()))
    (tmp_path / "b.json").write_text(json.dumps(record(versions={"verl": "0.9.2", "torch": "2.13.0"})))
    same = run_verlc("diff", tmp_path / "a.json", tmp_path / "a.json")
    assert same.returncode == 0 and "describe the same run" in same.stdout
    differ = run_verlc("diff", tmp_path / "a.json", tmp_path / "b.json")
    assert differ.returncode == 1
    assert differ.stdout.splitlines()[1:] == ["", "versions:", "  ~ verl: 0.9.1 -> 0.9.2"]
    markdown = run_verlc("diff", tmp_path / "a.json", tmp_path / "b.json", "--format", "markdown")
    assert "**versions**" in markdown.stdout and "| ~ | `verl` | `0.9.1` | `0.9.2` |" in markdown.stdout
    (tmp_path / "c.json").write_text('{"name": "a spec as JSON"}')
    bad = run_verlc("diff", tmp_path / "a.json", tmp_path / "c.json")
    assert bad.returncode == 2 and bad.stderr == f"{tmp_path / 'c.json'}: not a run record (run-record.json, " \
                                                 "written by the preflight)\n"
    missing = run_verlc("diff", tmp_path / "a.json", tmp_path / "nope.json")
    assert missing.returncode == 2 and "nope.json: cannot read a run record: No such file" in missing.stderr


PREPARE = """\
import argparse, pyarrow as pa, pyarrow.parquet as pq
parser = argparse.ArgumentParser()
parser.add_argument("--local_save_dir")
out = parser.parse_args().local_save_dir
table = pa.table({"data_source": ["x"], "prompt": [[{"role": "user", "content": "1+1?"}]],
                  "reward_model": [{"style": "rule", "ground_truth": "2"}]})
for split in ("train", "test"):
    pq.write_table(table, f"{out}/{split}.parquet")
print("prepared", out)
"""


def test_stage_in_fetches_the_model_and_prepares_the_data_where_the_job_is_submitted(tmp_path: Path) -> None:
    hub_cache(tmp_path / "hf")
    (tmp_path / "work" / "data" / "tiny").mkdir(parents=True)
    (tmp_path / "work" / "prep.py").write_text(PREPARE)  # relative paths: to the workdir, as in the job
    (tmp_path / "spec.yaml").write_text(f"""\
name: stage-in
project: p
model: {{path: org/tiny, revision: {COMMIT}}}
data:
  prepare: [{{dataset: gsm8k, dir: data/tiny, script: prep.py}}]
  train_files: [data/tiny/train.parquet]
  val_files: [data/tiny/test.parquet]
verl: {{actor_rollout_ref: {{rollout: {{name: vllm, log_prob_micro_batch_size_per_gpu: 4}},
                            actor: {{ppo_micro_batch_size_per_gpu: 4}}}},
       critic: {{ppo_micro_batch_size_per_gpu: 4}}}}
cluster: {{nodes: 1, gpus_per_node: 8}}
container: {{runtime: none, workdir: {tmp_path / 'work'}, venv: {sys.prefix}}}
""")
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    staged = run_verlc("stage-in", tmp_path / "spec.yaml", env=env)
    assert staged.returncode == 0, staged.stdout + staged.stderr
    folder = tmp_path / "work" / "models" / f"org--tiny-{COMMIT[:12]}"  # in the workdir, as the job sees it
    assert (folder / "config.json").read_bytes() == b'{"model_type": "qwen2"}'
    assert (tmp_path / "work" / "data" / "tiny" / "train.parquet").is_file()
    assert "add HF_HUB_OFFLINE: '1' under the spec's env" in staged.stdout
    again = run_verlc("stage-in", tmp_path / "spec.yaml", env=env)
    assert "already in" in again.stdout and "already prepared; skipping" in again.stdout
    bad = run_verlc("stage-in", tmp_path / "nope.yaml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_the_records_verl_config_is_verls_own_composition_without_importing_verl(tmp_path: Path) -> None:
    """#56 item 3: the preflight's verl config check composes the trainer's config from the folder of the
    node's verl without importing verl (which loads torch and Ray: most of the check's 10 s on a GPU node): the
    tree is Hydra's own composition of that folder with the run's overrides; a package that is not there, or
    has no config folder, is 'unresolved' with why."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    job = REPO / "out" / "quickstart-gsm8k-1node" / "ray-job" / "verlc_job" / "job.json"
    train = json.loads(job.read_text())["train"]
    probe = ("import json, sys; from verlc.runtime.record import resolved_verl_config; "
             "tree = resolved_verl_config(json.loads(sys.argv[1])); "
             "print(json.dumps([tree, sorted(m for m in ('verl', 'torch', 'ray') if m in sys.modules)]))")
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(train)], capture_output=True, text=True,
                          check=True, cwd=tmp_path)
    tree, imported = json.loads(done.stdout)
    assert imported == [], imported
    folder = Path(incluster.config_folder("verl.trainer.main_ppo"))
    import verl

    assert folder == Path(verl.__file__).parent / "trainer" / "config"
    overrides = [a for a in train[train.index("-m") + 2:] if not a.startswith("-")]
    with initialize_config_dir(config_dir=str(folder), version_base=None):
        assert tree == OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=overrides), resolve=True)
    assert tree["trainer"]["project_name"] and "unresolved" not in tree
    # a package no node has (not `recipe`: TransferQueue, which verl 0.9.1's nodes need, installs a top-level
    # package of that name)
    assert incluster.resolved_verl_config([*train[:train.index("-m") + 1], "no_such_recipe.dapo.main_dapo"]) == \
        {"unresolved": "ModuleNotFoundError: No module named 'no_such_recipe'"}
    assert incluster.resolved_verl_config(["python3", "-m", "verl.main_ppo"]) == \
        {"unresolved": "ModuleNotFoundError: no config folder beside verl.main_ppo"}
