"""Pipelines (#43): a spec's stages compiled one by one, the references between them, the Slurm chain's bundle,
and the runtime's merge of an earlier stage's checkpoint. The chain on the local Slurm cluster is in
test_lifecycle_e2e.py."""

from __future__ import annotations

import re

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, run_verlc, slurm_job

from verlc.runtime.data import merge_inputs
from verlc.runtime.job import StageInput
from verlc.runtime.record import record_items, stage_records

EXAMPLE = REPO / "specs" / "pipelines" / "sft-grpo-qwen2.5-0.5b.yaml"
SHELLCHECK = Path(sys.executable).parent / "shellcheck"

BASE = """\
name: p
targets: [slurm]
verl_version: "0.6.1"
project: proj
model: /models/base
data: {train_files: [train.parquet], val_files: [test.parquet]}
cluster: {nodes: 1, gpus_per_node: 8}
stages:
  sft:
    program: verl.trainer.sft_trainer
    verl: {data: {max_length: 512}}
  rl:
    model: ${stages.sft.model}
    verl:
      algorithm: {adv_estimator: grpo}
      actor_rollout_ref:
        actor: {ppo_micro_batch_size_per_gpu: 4}
        rollout: {name: vllm, log_prob_micro_batch_size_per_gpu: 4}
        ref: {log_prob_micro_batch_size_per_gpu: 4}
"""


def problems(tmp_path: Path, text: str) -> list[str]:
    """`verlc validate`'s problem lines for a spec (it must refuse it: exit 2, nothing half-done)."""
    (tmp_path / "p.yaml").write_text(text)
    result = run_verlc("validate", "p.yaml", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return [line for line in result.stderr.splitlines() if not line.startswith("verlc:")]


def test_each_stage_is_a_job_of_its_own_and_the_later_takes_the_earlier_ones_merged_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    built = run_verlc("build", EXAMPLE, "--target", "slurm", "--out", out)
    assert built.returncode == 0, built.stderr
    name = "sft-grpo-qwen2p5-0p5b"
    assert sorted(p.name for p in out.iterdir()) == [name, f"{name}-eval", f"{name}-generate", f"{name}-grpo",
                                                     f"{name}-sft"]
    sft = slurm_job((out / f"{name}-sft" / "slurm" / "sbatch.sh").read_text())
    grpo = slurm_job((out / f"{name}-grpo" / "slurm" / "sbatch.sh").read_text())
    assert sft["train"][:6] == ["torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=8", "-m",
                                "verl.trainer.sft_trainer"] and sft["inputs"] is None
    assert grpo["train"][:3] == ["python3", "-m", "verl.trainer.main_ppo"]
    checkpoints = f"checkpoints/verl_sft_grpo/{name}-sft"
    assert sft["checkpoint_dir"] == [checkpoints]
    assert f"actor_rollout_ref.model.path={checkpoints}/verlc-merged/latest" in grpo["train"]
    assert grpo["model"] == [f"{checkpoints}/verlc-merged/latest"]
    assert grpo["inputs"] == [{"stage": f"{name}-sft", "checkpoint_dir": [checkpoints], "layout": "",
                               "merger": ["python3", "-m", "verl.model_merger", "merge", "--backend", "fsdp"],
                               "merged": [f"{checkpoints}/verlc-merged"],
                               "latest": [f"{checkpoints}/verlc-merged/latest"]}]
    # each stage's verl settings went to its own program: SFT's data.max_length, GRPO's rollout.n
    assert "data.max_length=1024" in sft["train"] and "actor_rollout_ref.rollout.n=5" in grpo["train"]
    # verl's generation answers the prompts with GRPO's merged model; verl's evaluation scores its file
    generate = slurm_job((out / f"{name}-generate" / "slurm" / "sbatch.sh").read_text())
    evaluate = slurm_job((out / f"{name}-eval" / "slurm" / "sbatch.sh").read_text())
    grpo_checkpoints = f"checkpoints/verl_sft_grpo/{name}-grpo"
    assert generate["train"][:4] == ["python3", "-m", "verl.trainer.main_generation", "--config-name=generation"]
    assert f"model.path={grpo_checkpoints}/verlc-merged/latest" in generate["train"]
    assert "data.path=data/gsm8k/test.parquet" in generate["train"] and generate["rollout_package"] == "vllm"
    assert [(i["stage"], i["layout"]) for i in generate["inputs"]] == [(f"{name}-grpo", "actor")]
    output = "outputs/sft-grpo-gsm8k-test.parquet"
    assert f"data.output_path={output}" in generate["train"]
    assert evaluate["train"] == ["python3", "-m", "verl.trainer.main_eval", "--config-name=evaluation",
                                 f"data.path={output}"]
    assert evaluate["model"] == [] and evaluate["data_files"] == [[output], [output]]
    submit = (out / name / "slurm" / "submit.sh").read_text()
    first = submit.index(f'"$bundles"/{name}-sft/slurm/sbatch.sh')
    assert first < submit.index(f'"$bundles"/{name}-grpo/slurm/sbatch.sh')
    assert submit.count('--dependency="afterok:$job" --kill-on-invalid-dep=yes') == 3
    manifest = json.loads((out / name / "slurm" / "manifest.json").read_text())
    assert manifest["stages"] == [f"{name}-{s}" for s in ("sft", "grpo", "generate", "eval")]
    assert manifest["pipeline"] == name
    checked = subprocess.run([str(SHELLCHECK), str(out / name / "slurm" / "submit.sh")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout
    again = run_verlc("build", EXAMPLE, "--target", "slurm", "--out", tmp_path / "again")
    assert again.returncode == 0
    for path in out.rglob("*"):
        if path.is_file():
            assert path.read_bytes() == (tmp_path / "again" / path.relative_to(out)).read_bytes(), path


@pytest.mark.parametrize(("edit", "expected"), [
    (("${stages.sft.model}", "${stages.sfft.model}"),
     "p.yaml:13:12: stages.rl.model: no stage 'sfft' (stages: sft, rl) (did you mean 'sft'?)"),
    (("${stages.sft.model}", "${stages.rl.model}"),
     "p.yaml:13:12: stages.rl.model: stage rl cannot take its own output"),
    (("${stages.sft.model}", "${stages.sft.checkpoint}"),
     "p.yaml:13:12: stages.rl.model: verl loads a model from a Hugging Face folder, not from verl's sharded "
     "checkpoint: ${stages.sft.model} is stage sft's last checkpoint merged into one"),
    (("${stages.sft.model}", "${stages.sft.weights}"),
     "p.yaml:13:12: stages.rl.model: stage sft has no output 'weights'; a stage's outputs: ${stages.sft.model} (a "
     "model:), ${stages.sft.output} (a data.train_files)"),
    (("${stages.sft.model}", "/m/${stages.sft.model}"),
     "p.yaml:13:12: stages.rl.model: '/m/${stages.sft.model}': an earlier stage's output is the whole value, "
     "${stages.NAME.OUTPUT}"),
    (("model: /models/base", "model: ${stages.sft.model}"),
     "p.yaml:5:8: model: an earlier stage's output is taken by a stage's model: (${stages.NAME.model}) or data "
     "files (${stages.NAME.output}) only"),
    (("verl_version: \"0.6.1\"", "verl_version: \"0.4.1\"", "program: verl.trainer.sft_trainer",
      "program: verl.trainer.fsdp_sft_trainer"),
     "p.yaml:13:12: stages.rl.model: verl 0.4.1's SFT trainer saves a Hugging Face folder per step and names none "
     "the last (from 0.5.0 it does): give stage sft's global_step_N folder"),
    (("targets: [slurm]", "targets: [slurm, compose]"),
     "p.yaml:8:1: stages: the compose target runs one program per job: a pipeline's stages run on slurm and "
     "ray-job (slurm: a chain of jobs; ray-job: one job); set targets: to those"),
    (("    verl: {data: {max_length: 512}}", "    verl: {data: {max_lenght: 512}}"),
     "p.yaml:11:19: stages.sft.verl.data.max_lenght: verl 0.6.1 has no key 'max_lenght' under 'data' (did you "
     "mean 'max_length'?)"),
    (("    program: verl.trainer.sft_trainer", "    programme: verl.trainer.sft_trainer"),
     "p.yaml:10:5: stages.sft.programme: unknown key 'programme' (did you mean 'program'?)"),
    (("  rl:\n", "  rl:\n    data: {train_files: [\"${stages.sft.output}\"], val_files: [v.parquet]}\n"),
     "p.yaml:13:26: stages.rl.data.train_files[0]: stage sft (verl.trainer.sft_trainer) writes no file of "
     "responses: verl's generation (verl.trainer.main_generation or verl.trainer.main_generation_server) does"),
    (("  rl:\n", "  rl:\n    data: {train_files: [\"${stages.sft.model}\"], val_files: [v.parquet]}\n"),
     "p.yaml:13:26: stages.rl.data.train_files[0]: ${stages.sft.model} goes in a stage's model:, not here"),
    (("cluster: {nodes: 1, gpus_per_node: 8}", "cluster: {nodes: 1, gpus_per_node: 8}\nsweep: {matrix: "
      "{verl.trainer.total_epochs: [1, 2]}}"),
     "p.yaml:8:1: sweep: a pipeline is not swept: sweep one stage as a spec of its own"),
])
def test_what_a_stage_cannot_take_is_refused_at_its_line(tmp_path: Path, edit: tuple[str, ...], expected: str) -> None:
    text = BASE
    for old, new in zip(edit[::2], edit[1::2]):  # (old, new) pairs
        assert old in text
        text = text.replace(old, new, 1)
    assert expected in problems(tmp_path, text)


GENERATION_SERVER = """\
name: g
targets: [slurm]
verl_version: "0.7.1"
project: proj
model: /models/base
data: {train_files: [prompts.parquet], val_files: [prompts.parquet]}
cluster: {nodes: 1, gpus_per_node: 8, slurm: {cpus_per_task: 8}}
stages:
  generate:
    program: verl.trainer.main_generation_server
    verl:
      actor_rollout_ref: {rollout: {name: vllm, n: 4}}
      +data: {output_path: /results/responses.parquet}
  eval:
    program: verl.trainer.main_eval
    data: {train_files: ["${stages.generate.output}"]}
"""


def test_verls_generation_server_is_a_stage_whose_responses_a_later_stage_scores(tmp_path: Path) -> None:
    """verl 0.7's only generation program (main_generation_server, on main_ppo's config): it builds as a Ray program
    that trains nothing (its data columns are the prompts only; no PPO worker facts, no save ahead of the end), its
    data.output_path (added with '+') is the evaluation's data file, and without it verlc refuses the spec."""
    (tmp_path / "g.yaml").write_text(GENERATION_SERVER)
    built = run_verlc("build", "g.yaml", "--target", "slurm", "--out", "out", cwd=tmp_path)
    assert built.returncode == 0, built.stderr
    jobs = {}
    for stage in ("generate", "eval"):
        script = (tmp_path / "out" / f"g-{stage}" / "slurm" / "sbatch.sh").read_text()
        jobs[stage] = json.loads(script.split("<<'VERLC_JOB'\n", 1)[1].split("\nVERLC_JOB\n", 1)[0])
    generate = jobs["generate"]
    assert generate["train"][:4] == ["python3", "-m", "verl.trainer.main_generation_server", "--config-name=ppo_trainer"]
    assert "++data.output_path=/results/responses.parquet" in generate["train"], generate["train"]
    assert (generate["data_columns"], generate["startup"], generate["expiry"]) == (["prompt"], None, None)
    assert generate["rollout_package"] == "vllm"
    assert jobs["eval"]["data_files"][0] == ["/results/responses.parquet"], jobs["eval"]["data_files"]
    found = problems(tmp_path, GENERATION_SERVER.replace("      +data: {output_path: /results/responses.parquet}\n", ""))
    assert "p.yaml:10:14: stages.generate.program: verl.trainer.main_generation_server writes its responses to " \
           "data.output_path, which ppo_trainer lacks" in "\n".join(found), found


def test_two_stages_saving_into_one_folder_are_refused(tmp_path: Path) -> None:
    text = BASE.replace("name: p\n", "name: p\nexperiment: shared\n")
    found = problems(tmp_path, text)
    assert any(": stages.rl: stages sft and rl would save checkpoints into one folder (checkpoints/proj/shared)" in line
               for line in found), found


def test_commands_that_take_one_program_say_so_for_a_pipeline(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(BASE)
    result = run_verlc("explain", "trainer.save_freq", "p.yaml", cwd=tmp_path)
    assert result.returncode == 2 and "p.yaml:8:1: stages: a pipeline: this command takes a spec of one program" \
        in result.stderr, result.stderr


# ---- the runtime's merge of an earlier stage's checkpoint ---------------------------------------------------

MERGER = """\
import os, sys
args = dict(zip(sys.argv[2::2], sys.argv[3::2]))  # after `merge`
if os.environ.get("MERGER_FAILS"):
    os.makedirs(args["--target_dir"]); open(os.path.join(args["--target_dir"], "half"), "w").close(); sys.exit(3)
os.makedirs(args["--target_dir"])
for name in ("config.json", "model.safetensors"):
    with open(os.path.join(args["--target_dir"], name), "w") as fh:
        fh.write(args["--local_dir"])
"""


def stage_entry(tmp_path: Path) -> StageInput:
    (tmp_path / "merger.py").write_text(MERGER)
    return StageInput(stage="p-sft", checkpoint_dir=[str(tmp_path / "ckpt")], layout="actor",
                      merger=[sys.executable, str(tmp_path / "merger.py"), "merge"],
                      merged=[str(tmp_path / "ckpt"), "/verlc-merged"],
                      latest=[str(tmp_path / "ckpt"), "/verlc-merged/latest"])


def test_the_data_stage_merges_the_last_checkpoint_once_and_points_latest_at_it(tmp_path: Path, capsys) -> None:
    entry = stage_entry(tmp_path)
    assert merge_inputs([entry]) == 1  # no checkpoint yet
    assert "stage p-sft left no checkpoint in" in capsys.readouterr().out
    for step in (2, 4):
        (tmp_path / "ckpt" / f"global_step_{step}" / "actor").mkdir(parents=True)
        (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text(str(step))
        assert merge_inputs([entry]) == 0
    merged = tmp_path / "ckpt" / "verlc-merged"
    assert os.readlink(merged / "latest") == "global_step_4"
    assert (merged / "global_step_4" / "config.json").read_text() == str(tmp_path / "ckpt" / "global_step_4" / "actor")
    assert sorted(p.name for p in merged.iterdir()) == ["global_step_2", "global_step_4", "latest"]
    capsys.readouterr()
    assert merge_inputs([entry]) == 0
    assert "stage p-sft's step 4 is merged already" in capsys.readouterr().out
    [record], found = stage_records([entry])
    assert found == [] and record["step"] == 4 and set(record["files"]) == {"config.json", "model.safetensors"}
    items = record_items({"inputs": {"stages": [record]}})["inputs"]
    assert items["stage p-sft step"] == 4 and "stage p-sft model model.safetensors sha256" in items


def test_a_merge_that_fails_leaves_no_model_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    entry = stage_entry(tmp_path)
    (tmp_path / "ckpt" / "global_step_3" / "actor").mkdir(parents=True)
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("3")
    monkeypatch.setenv("MERGER_FAILS", "1")
    assert merge_inputs([entry]) == 3
    assert "ERROR: verl's model merger exited with 3" in capsys.readouterr().out
    merged = tmp_path / "ckpt" / "verlc-merged"
    assert not merged.exists() or list(merged.iterdir()) == []
    [record], found = stage_records([entry])
    assert found == [f"stage p-sft's merged model {merged}/global_step_3 is missing (the data stage merges it)"]


def test_plan_shows_each_stage_and_the_pipelines_gpu_hours() -> None:
    result = run_verlc("plan", EXAMPLE)
    assert result.returncode == 0, result.stderr
    heads = [line.split(":")[0] for line in result.stdout.splitlines() if " node(s) x " in line]
    assert heads == [f"sft-grpo-qwen2p5-0p5b-{s}" for s in ("sft", "grpo", "generate", "eval")], result.stdout
    hours = 12 * 8 * 4  # the spec's cluster.slurm.time 12:00:00 x 8 GPUs, for each of its four stages
    assert f"pipeline sft-grpo-qwen2p5-0p5b: its stages one after another, at most {hours} GPU-hours in all" \
        in result.stdout
    # generation: the rollout alone, its prompts and responses; evaluation: no GPU used (#53); neither has
    # actor updates or a training batch
    stages = dict(re.findall(r"^sft-grpo-qwen2p5-0p5b-(\w+): .*?\n((?:  .*\n)+)", result.stdout, re.M))
    assert "GPUs:     the rollout alone on 8 (nothing is trained)" in stages["generate"], stages["generate"]
    assert "rollout:  vllm, 8 replica(s) of TP 1" in stages["generate"]
    assert re.search(r"prompts:  \d+ at a time x \d+ response\(s\) each, into data.output_path", stages["generate"])
    assert "GPUs:     none used: it scores the responses in data.path" in stages["eval"], stages["eval"]
    for stage in ("generate", "eval"):
        assert "actor:" not in stages[stage] and "step:" not in stages[stage] and "None" not in stages[stage]


def test_stage_in_takes_every_stages_downloads(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text(BASE.replace("model: /models/base", "model: /models/base\ndata:\n  prepare: "
                                                  "[{dataset: gsm8k, dir: prepared}]\n  train_files: [train.parquet]"
                                                  "\n  val_files: [test.parquet]").replace(
        "data: {train_files: [train.parquet], val_files: [test.parquet]}\n", ""))
    (tmp_path / "prepared").mkdir()
    for name in ("train.parquet", "test.parquet"):
        (tmp_path / "prepared" / name).write_bytes(b"")
    result = run_verlc("stage-in", "p.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("data in prepared already prepared; skipping") == 1, result.stdout  # once, not per stage


def test_a_stage_fetches_and_prepares_only_what_its_program_reads(tmp_path: Path) -> None:
    """#53: with the spec's model pinned and its gsm8k prepared, and no stage saying `prepare: []`: verl's
    evaluation (it scores the generation's output file and takes no model) fetches no model and prepares
    nothing; the generation, whose prompts are in the prepared folder, prepares them; the SFT stage (its own
    files) prepares nothing."""
    from verlc.compiler.pipeline import compile_file
    from verlc.targets import CATALOG

    text = EXAMPLE.read_text().replace("model: Qwen/Qwen2.5-0.5B-Instruct\n", "model: {path: Qwen/Qwen2.5-0.5B-"
                                       "Instruct, revision: 7ae557604adf67be50417f59c2c2f167def9a775}\n", 1)
    head, _, stages = text.partition("\nstages:\n")
    stages = re.sub(r"(  (?:generate|eval):\n(?:    .*\n|\s*#.*\n)*?)      prepare: \[\]\n", r"\1", stages)
    assert stages.count("prepare: []") == 1  # the SFT stage's own
    spec = tmp_path / "p.yaml"
    spec.write_text(head + "\nstages:\n" + stages)
    irs = {ir.pipeline.stage: ir for ir in compile_file(spec, CATALOG, display="p.yaml", source="p.yaml")}
    assert [p.out_dir for p in irs["generate"].data_prep] == ["data/gsm8k"]
    assert irs["eval"].data_prep == () and irs["eval"].model_fetch is None and irs["eval"].model.parts == ()
    assert irs["sft"].data_prep == () and irs["sft"].model_fetch is not None
