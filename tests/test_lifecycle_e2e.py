"""`verlc submit/status/logs/cancel/runs` against the real schedulers: the local Slurm (no accounting, so
state comes from scontrol and, once Slurm forgets a job, from its log) and a local Ray head."""

from __future__ import annotations

import hashlib
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import failing_first, run_verlc
from test_ray_job import build as build_ray_job
from test_ray_job import ray_env, ray_head  # noqa: F401
from test_slurm_e2e import (SLURM_CONF, SUBMIT_ENV, build, fake_venv, slurm, stand_in, wait_for,  # noqa: F401
                            write_fixtures)

from verlc.lifecycle import ledger
from verlc.runtime.protocol import TOOL_CONFIG_FILE, parse_event


def verlc(root: Path, *args: str, stop_after: str = "preflight", env: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """verlc as the user runs it from the run folder (the submit dir), in the submitting shell's env."""
    return run_verlc(*args, cwd=root, env={**SUBMIT_ENV, **(env or {}), "HOME": str(root),
                                           "VERLC_STOP_AFTER": stop_after}, timeout=timeout)


def runs_of(root: Path) -> dict[str, ledger.Run]:
    return ledger.fold(root / ledger.FILE)  # no git here: the ledger is beside the spec


def until_final(root: Path, run: str, timeout: float = 180, env: dict[str, str] | None = None) -> None:
    """Ask `verlc status` (which appends what the scheduler says) until the ledger has the run's end."""
    def ended() -> bool:
        assert verlc(root, "status", run, env=env).returncode == 0
        return runs_of(root)[run].final
    wait_for(ended, timeout, f"{run} to end")


def test_submit_follow_shows_each_stage_and_the_ledger_keeps_the_run(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    build(tmp_path)
    followed = verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", "--out", "out", "--follow")
    assert followed.returncode == 0, followed.stdout + followed.stderr
    out = followed.stdout
    assert out.startswith("up to date: out/"), out  # the bundle build() wrote is reused, not rewritten
    [run] = runs_of(tmp_path).values()
    lines = [line.removeprefix(f"{run.run}: ") for line in out.splitlines()]
    stages = [line for line in lines if line in ("ray", "ray 1/2 nodes", "ray 2/2 nodes", "data", "preflight")]
    assert stages == ["ray", "ray 1/2 nodes", "ray 2/2 nodes", "data", "preflight"], out
    took = [line.split(" took ")[0] for line in lines if re.fullmatch(r"\w+ took \d+\.\ds", line)]
    assert took == ["containers", "ray", "data", "preflight"], out  # #56: each stage's time as it ends
    # two nodes' tasks: the check names the slowest of them (#56 item 4)
    assert any(re.fullmatch(r"check all-reduce: \d+\.\d{3}s \(the slowest node: n[12] \d+\.\d{3}s\)", line)
               for line in lines), out
    assert lines[-1] == "completed" and "exit code 0" in lines, out  # why it ended, then the state (#53 item 11)
    assert "stopping after stage preflight (VERLC_STOP_AFTER)" in lines, out
    status = verlc(tmp_path, "status", run.run).stdout
    assert status.startswith(f"{run.run}: stopped after preflight, exit code 0"), status  # #53 item 11
    assert (run.state, run.final, run.exit_code) == ("COMPLETED", True, 0)
    assert run.submitted["spec"] == "spec.yaml" and run.submitted["target"] == "slurm"
    manifest = (tmp_path / "out" / run.name / "slurm" / "manifest.json").read_bytes()
    assert run.submitted["bundle_sha256"] == hashlib.sha256(manifest).hexdigest()
    assert Path(run.record).is_file() and json.loads(Path(run.record).read_text())["gpus"] == 16
    table = verlc(tmp_path, "runs").stdout.splitlines()
    assert table[0].split()[:3] == ["run", "spec", "target"] and table[1].split()[:3] == [run.run, "spec.yaml", "slurm"]
    assert run.submitted["stop_after"] == "preflight" and "stopped after preflight" in table[1], table
    assert "| run | spec |" in verlc(tmp_path, "runs", "--format", "markdown").stdout
    stage = verlc(tmp_path, "logs", run.job_id, "--stage", "preflight").stdout
    assert "verlc: stage preflight" in stage and "preflight passed: 2 nodes, 16 GPUs" in stage
    assert "stage ray" not in stage
    ray_logs = verlc(tmp_path, "logs", run.run, "--ray", "--node", "n2").stdout
    assert "==> n2/raylet.out <==" in ray_logs and "==> n1/" not in ray_logs
    missing = verlc(tmp_path, "logs", run.run, "--ray", "--node", "n9")
    assert missing.returncode == 3 and "no Ray logs of node n9" in missing.stderr and "n1, n2" in missing.stderr


def test_cancel_ends_a_training_run_and_the_ledger_records_it(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    build(tmp_path, venv=fake_venv(tmp_path))
    submitted = verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", stop_after="train")
    assert submitted.returncode == 0, submitted.stderr
    [run] = runs_of(tmp_path).values()
    wait_for(lambda: "TRAINER restart=0" in verlc(tmp_path, "logs", run.run).stdout, 180, "training to start")
    status = verlc(tmp_path, "status")
    assert status.stdout.startswith(f"{run.run}: running (job {run.job_id} on "), status.stdout
    attached = verlc(tmp_path, "attach", run.run, "--", "printenv", "SLURMD_NODENAME", "SLURM_JOB_ID")
    assert (attached.returncode, attached.stdout) == (0, f"n1\n{run.job_id}\n"), attached.stderr
    cancelled = verlc(tmp_path, "cancel", run.run)
    assert cancelled.returncode == 0 and cancelled.stdout.startswith(f"{run.run}: cancel sent"), cancelled.stderr
    until_final(tmp_path, run.run)
    assert runs_of(tmp_path)[run.run].state == "CANCELLED"
    wait_for(lambda: "cleaning up" in verlc(tmp_path, "logs", run.run).stdout, 60, "the cleanup to run")
    ended = verlc(tmp_path, "attach", run.run)
    assert ended.returncode == 3 and "has ended (cancelled): nothing to attach to" in ended.stderr
    events = [e["event"] for e in ledger.events(tmp_path / ledger.FILE)]
    # the end once, then the timeline read from its log then (#56: the ledger keeps it)
    assert events[0] == "submitted" and events[-2:] == ["finished", "timeline"] and events.count("finished") == 1


def test_two_concurrent_submits_leave_two_intact_records(slurm: None, tmp_path: Path) -> None:
    write_fixtures(tmp_path)
    build(tmp_path)
    env = {**SUBMIT_ENV, "HOME": str(tmp_path), "VERLC_STOP_AFTER": "ray"}
    both = [subprocess.Popen([sys.executable, "-m", "verlc", "submit", "spec.yaml", "--target", "slurm"],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    assert [p.wait(timeout=120) for p in both] == [0, 0], [p.stderr.read() for p in both]
    runs = runs_of(tmp_path)
    assert len(runs) == 2 and len({r.job_id for r in runs.values()}) == 2
    for run in runs.values():
        until_final(tmp_path, run.run)
        assert runs_of(tmp_path)[run.run].state == "COMPLETED"


# A stand-in for verl's SFT trainer (no GPU here), run by a stand-in `torchrun`: it saves, as verl's FSDP trainers
# do, a checkpoint of a tiny Qwen2 (its initial weights) at step 2 -- global_step_2/ with the rank's state dict,
# fsdp_config.json and huggingface/ (the config and the tokenizer: a byte-level one with Qwen's chat tokens, which
# verl 0.9.1's agent loop requires of a qwen2 model), then latest_checkpointed_iteration.txt -- or exits 1 when
# told to fail. The next stage's data stage then runs verl's own merger on it, for real.
SFT_STANDIN = """\
import json, os, sys
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

print("SFT argv: " + " ".join(sys.argv[1:]), flush=True)
if os.environ.get("FAIL_SFT"):
    sys.exit(1)
folder = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("trainer.default_local_dir="))
step = os.path.join(folder, "global_step_2")
config = Qwen2Config(vocab_size=272, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                     architectures=["Qwen2ForCausalLM"])
torch.manual_seed(0)
model = AutoModelForCausalLM.from_config(config)
os.makedirs(os.path.join(step, "huggingface"), exist_ok=True)
config.save_pretrained(os.path.join(step, "huggingface"))
bpe = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}, merges=[]))
bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|endoftext|>", eos_token="<|im_end|>")
tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
tokenizer.save_pretrained(os.path.join(step, "huggingface"))
torch.save(model.state_dict(), os.path.join(step, "model_world_size_1_rank_0.pt"))
with open(os.path.join(step, "fsdp_config.json"), "w") as fh:
    json.dump({"FSDP_version": 1, "world_size": 1}, fh)
for i in (1, 2):
    print(f"step:{i} - train/loss:0.5", flush=True)
with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as fh:
    fh.write("2")
"""


def pipeline(root: Path, *, fail_sft: bool) -> None:
    """spec.yaml: SFT (verl's sft_trainer under the stand-in torchrun) then GRPO from its merged model (verl's
    main_ppo, whose stand-in prints its argv and two steps), one node each."""
    write_fixtures(root)
    venv = fake_venv(root)
    (root / "sft_standin.py").write_text(SFT_STANDIN)
    fail = "export FAIL_SFT=1\n" if fail_sft else ""
    stand_in(venv, "torchrun", f"#!/usr/bin/env bash\n{fail}exec {sys.executable} {root}/sft_standin.py \"$@\"\n")
    (root / "spec.yaml").write_text(f"""\
name: chain
targets: [slurm]
project: e2e
model: {root}/model
data: {{train_files: [data/train.parquet], val_files: [data/test.parquet]}}
cluster: {{nodes: 1, gpus_per_node: 8, slurm: {{cpus_per_task: 1, output: {root}/slurm-%j.out}}}}
container: {{runtime: none, workdir: {root}, venv: {venv}}}
stages:
  sft:
    program: verl.trainer.sft_trainer
    verl: {{data: {{max_length: 512}}, trainer: {{logger: [console], default_local_dir: {root}/ckpt/sft}}}}
  grpo:
    model: ${{stages.sft.model}}
    verl:
      algorithm: {{adv_estimator: grpo}}
      actor_rollout_ref:
        actor: {{ppo_micro_batch_size_per_gpu: 4}}
        rollout: {{name: vllm, log_prob_micro_batch_size_per_gpu: 4}}
        ref: {{log_prob_micro_batch_size_per_gpu: 4}}
      trainer: {{logger: [console]}}
""")


def scontrol(job: str) -> dict[str, str]:
    shown = subprocess.run(["scontrol", "show", "job", "--oneliner", job], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", shown))


def test_a_pipeline_runs_its_stages_in_order_and_a_failed_stage_stops_the_chain(slurm: None, tmp_path: Path) -> None:
    """#43: one `verlc submit` of a pipeline spec submits a job per stage, each after the one before it (afterok);
    the GRPO stage starts from the SFT stage's checkpoint merged by verl's own merger, which its run record hashes;
    where the SFT stage fails, Slurm cancels the GRPO stage and `verlc runs` names the stage that stopped it."""
    roots = {"ok": tmp_path / "ok", "bad": tmp_path / "bad", "cancelled": tmp_path / "cancelled"}
    for name, root in roots.items():
        root.mkdir()
        pipeline(root, fail_sft=name == "bad")
        held = {"VERLC_PAUSE_AT": "data"} if name == "cancelled" else {}  # the SFT job waits there until cancelled
        submitted = verlc(root, "submit", "spec.yaml", "--target", "slurm", stop_after="train",
                          env={"FAKE_STEPS": "2", **held})
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        sft, grpo = runs_of(root).values()
        assert (sft.submitted["stage"], grpo.submitted["stage"]) == ("sft", "grpo")
        assert grpo.submitted["after"] == sft.job_id and sft.submitted.get("after") is None
        waiting = scontrol(grpo.job_id)  # the SFT job's bring-up takes longer than this
        assert waiting["JobState"] == "PENDING" and waiting["Dependency"].startswith(f"afterok:{sft.job_id}"), waiting
        assert (root / "out" / "chain" / "slurm" / "submit.sh").is_file()
    root = roots["cancelled"]
    sft, grpo = runs_of(root).values()
    wait_for(lambda: "paused at data" in (root / f"slurm-{sft.job_id}.out").read_text()
             if (root / f"slurm-{sft.job_id}.out").exists() else False, 300, "the SFT job to pause")
    cancelled = verlc(root, "cancel", "chain")  # the pipeline's name: every stage not ended
    assert cancelled.returncode == 0 and f"{sft.run}: cancel sent" in cancelled.stdout \
        and f"{grpo.run}: cancel sent" in cancelled.stdout, cancelled.stdout + cancelled.stderr
    for root in roots.values():
        for run in runs_of(root).values():
            until_final(root, run.run, timeout=400)
    sft, grpo = runs_of(roots["cancelled"]).values()
    assert (sft.state, grpo.state) == ("CANCELLED", "CANCELLED")
    assert not (roots["cancelled"] / f"slurm-{grpo.job_id}.out").exists()  # it never ran

    root = roots["ok"]
    sft, grpo = runs_of(root).values()
    assert (sft.state, grpo.state) == ("COMPLETED", "COMPLETED")
    first, second = scontrol(sft.job_id), scontrol(grpo.job_id)
    assert second["StartTime"] >= first["EndTime"], (first, second)  # Slurm's own times: one after the other
    output = Path(grpo.submitted["log"] or "").read_text() if grpo.submitted.get("log") else \
        (root / f"slurm-{grpo.job_id}.out").read_text()
    assert f"merging stage chain-sft's checkpoint (step 2) into a Hugging Face folder: python3 -m " \
           f"verl.model_merger merge --backend fsdp --local_dir {root}/ckpt/sft/global_step_2 " in output, output
    merged = root / "ckpt" / "sft" / "verlc-merged"
    assert (merged / "latest").resolve() == merged / "global_step_2" and (merged / "global_step_2" /
                                                                          "model.safetensors").is_file()
    assert f"actor_rollout_ref.model.path={merged}/latest" in output and "preflight passed" in output, output
    record = json.loads(Path(grpo.record).read_text())
    [stage] = record["inputs"]["stages"]
    weights = (merged / "global_step_2" / "model.safetensors").read_bytes()
    assert stage["stage"] == "chain-sft" and stage["step"] == 2
    assert stage["files"]["model.safetensors"] == hashlib.sha256(weights).hexdigest(), stage
    table = verlc(root, "runs").stdout.splitlines()
    assert len(table) == 2 and table[1].split()[0] == "chain", table
    assert f"{sft.job_id},{grpo.job_id}" in table[1] and "sft completed, grpo completed" in table[1], table

    root = roots["bad"]
    sft, grpo = runs_of(root).values()
    assert sft.state == "FAILED" and grpo.state == "CANCELLED", (sft.state, grpo.state)
    assert scontrol(grpo.job_id).get("StartTime") in (None, "None", "Unknown") or not \
        (root / f"slurm-{grpo.job_id}.out").exists()  # it never ran
    table = verlc(root, "runs").stdout.splitlines()
    assert "sft failed, the chain stopped (sft failed, grpo cancelled)" in table[1], table


def test_services_on_slurm_reach_the_trainer_come_back_after_a_requeue_and_their_logs_are_kept(
        slurm: None, tmp_path: Path) -> None:
    """#55 on the local Slurm cluster: a sandbox on a node of its own (a third node of the allocation, whose GPUs
    it holds; its run's token required) and a retriever on each of the trainer's two nodes, started by the job's
    runtime, ready and probed before the stand-in trainer (no GPU here: it trains nothing) reaches both at the
    addresses verlc wired, the retriever also through the spec's tool
    config (in the run folder, which every node sees). Requeued ahead of preemption while it trains,
    the job brings them back at addresses of the same form (the job's port block) with a new token; nothing of
    them runs once the job ended, their output is in the run folder (`verlc logs RUN --service NAME`), and no
    token is in a log, the record or the bundle."""
    from test_ray_job import SERVICES_TOOLS, SERVICES_VERL, service_fixtures, service_processes

    services = service_fixtures(tmp_path)
    services["sandbox"]["on"] = "own_node"
    reward = json.dumps(SERVICES_VERL["reward"])
    build(tmp_path, venv=fake_venv(tmp_path), grace="60s", verl=f", reward: {reward}",
          extra=f"services: {json.dumps(services)}\ntool_config: {json.dumps(SERVICES_TOOLS)}\n")
    env = {"FAKE_TRAINER": "trainer.py", "TRAINER_WAITS_FOR_REQUEUE": "1"}
    submitted = verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", "--out", "out", stop_after="train", env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    [run] = runs_of(tmp_path).values()
    wait_for(lambda: "STAND-IN TRAINER: waiting to be requeued" in verlc(tmp_path, "logs", run.run).stdout, 300,
             "the first attempt's trainer", seen=lambda: failing_first(verlc(tmp_path, "logs", run.run).stdout))
    subprocess.run(["scancel", "--signal=USR1", "--batch", run.job_id], check=True)  # as ahead of preemption
    until_final(tmp_path, run.run, timeout=600, env=env)
    run = runs_of(tmp_path)[run.run]
    log = verlc(tmp_path, "logs", run.run).stdout
    assert (run.state, run.restarts) == ("COMPLETED", 1), failing_first(log)
    assert "\n#SBATCH --nodes=3\n" in next((tmp_path / "out").glob("*/slurm/sbatch.sh")).read_text()
    assert " trainer.nnodes=2 " in log and "trainer.nnodes=3" not in log, log  # the trainer keeps its two nodes
    started = re.findall(r"service sandbox: starting on (n\d) \((10\.77\.0\.\d+)\), a node of its own \(8 GPUs\) "
                         r"at http://(10\.77\.0\.\d+):(\d+)", log)
    heads = re.findall(r"verlc: job \d+ on .*; head (\w+);", log)
    assert len(started) == 2 and started[0][3] == started[1][3], started  # its node's address, the block's port
    assert all(node != head and ip == at for (node, ip, at, _), head in zip(started, heads)), (started, heads)
    for name in ("sandbox", "retriever"):
        assert len(re.findall(rf"service {name}: ready in [\d.]+s, {name} probe passed", log)) == 2, log
    assert len(re.findall(r"sandbox at http://10\.77\.0\.\d+:\d+/run_code printed 42", log)) == 2, log
    assert len(re.findall(r"retriever at http://127\.0\.0\.1:\d+/retrieve found pg", log)) == 2, log
    assert log.count("services stopped: sandbox, retriever") == 2, log
    # the tool config in the run folder (every node sees it), reached through verl's key in each attempt, and
    # kept with the run as verl read it
    kept_config = Path(run.record).parent / TOOL_CONFIG_FILE
    assert log.count(f"tool config: {kept_config} (VERLC_TOOL_CONFIG)") == 2, log
    assert '"retrieval_service_url": "${oc.env:VERLC_SERVICE_RETRIEVER_URL}/retrieve"' in kept_config.read_text()
    assert len(re.findall(r"the tool config at /\S+ reached the retriever at http://127\.0\.0\.1:\d+/retrieve: ppo",
                          log)) == 2, log
    record = json.loads(Path(run.record).read_text())
    assert record["services"]["sandbox"]["probe_passed"] and record["services"]["retriever"]["probe_passed"]
    assert not service_processes(tmp_path)
    sandbox = verlc(tmp_path, "logs", run.run, "--service", "sandbox")
    assert sandbox.returncode == 0 and sandbox.stdout.count("sandbox listening on 10.77.0.") == 2, sandbox.stderr
    nodes = verlc(tmp_path, "logs", run.run, "--service", "retriever").stdout
    assert len(re.findall(r"^==> retriever-n\d\.log <==$", nodes, re.M)) >= 2, nodes
    head = run_head(log)
    one = verlc(tmp_path, "logs", run.run, "--service", "retriever", "--node", head).stdout
    assert "==>" not in one and "retriever: 3 documents, listening on 127.0.0.1:" in one, one
    missing = verlc(tmp_path, "logs", run.run, "--service", "judge")
    assert missing.returncode == 3 and "no log of service 'judge'" in missing.stderr, missing.stderr
    tokens = (tmp_path / "token.seen").read_text().split()
    assert len(tokens) == 2 and tokens[0] != tokens[1] and all(len(t) >= 32 for t in tokens), tokens
    kept = log + Path(run.record).read_text() + sandbox.stdout + nodes
    assert not [t for t in tokens if t in kept]
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()
                and any(t in p.read_text(errors="replace") for t in tokens)]


def run_head(log: str) -> str:
    """The job's head node, as its log names it ("head n3")."""
    found = re.search(r"verlc: job \d+ on .*; head (\w+);", log)
    assert found, log
    return found[1]


def test_state_of_a_job_slurm_forgot_comes_from_its_log_and_else_is_an_error(slurm: None, tmp_path: Path) -> None:
    """Without accounting, a job slurmctld no longer knows has only its own log: its last exit line."""
    from verlc.contract.launcher import LaunchError, SubmittedRun
    from verlc.targets.slurm import launch

    log = tmp_path / "slurm-999999.out"
    log.write_text("[2026-12-01T03:00:00.000Z] verlc: cleaning up (exit code 1)\n"
                   "[2026-12-01T03:00:01.000Z] verlc: exit code 1\n")
    forgotten = SubmittedRun(run="e2e-999999", target="slurm", job_id="999999", where="", bundle="", log=str(log))
    seen = launch.state(forgotten)
    assert (seen.scheduler_state, seen.exit_code, seen.final) == ("FAILED", 1, True) and "log" in seen.source
    log.write_text("[2026-12-01T03:00:00.000Z] verlc: stage ray\n")
    try:
        launch.state(forgotten)
    except LaunchError as exc:
        assert "Slurm no longer knows job 999999" in str(exc)
    else:
        raise AssertionError("a job with neither Slurm's state nor an exit line must be an error")


def test_ray_job_submit_status_logs_and_runs_against_a_real_head(ray_head: str, tmp_path: Path) -> None:  # noqa: F811
    write_fixtures(tmp_path)
    build_ray_job(tmp_path)
    env = ray_env({"RAY_ADDRESS": ray_head, "VERLC_STOP_AFTER": "preflight"})
    result = subprocess.run([sys.executable, "-m", "verlc", "submit", "spec.yaml", "--target", "ray-job", "--wait"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    [run] = runs_of(tmp_path).values()
    assert (run.state, run.where) == ("SUCCEEDED", ray_head)
    logs = subprocess.run([sys.executable, "-m", "verlc", "logs", run.run, "--stage", "preflight"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=60)
    assert "preflight passed: 1 nodes, 8 GPUs" in logs.stdout, logs.stdout + logs.stderr


LR = "verl.actor_rollout_ref.actor.optim.lr"


def expected(lr: float) -> dict:
    """What FAKE_METRICS printed for a run with this lr (tests/test_slurm_e2e.py), as --results shows it."""
    x = lr * 1e5
    return {"critic/score/mean": {"last": x + 0.3, "best": x + 0.3},
            "val-core/gsm8k/reward/mean@1": {"last": x + 0.5, "best": x + 0.5},
            "actor/pg_loss": {"last": -0.01, "best": -0.03}}  # :min


def check_results(root: Path, runs: list[ledger.Run], env: dict[str, str] | None = None) -> None:
    asked = ("--metric", "critic/score/mean", "--metric", "val-core/", "--metric", "actor/pg_loss:min")
    shown = verlc(root, "runs", "--results", *asked, "--format", "json", env=env)
    assert shown.returncode == 0, shown.stderr
    rows = {row["run"]: row for row in json.loads(shown.stdout)}
    assert sorted(rows) == sorted(r.run for r in runs)
    for run in runs:
        row = rows[run.run]
        lr = run.submitted["variant"][LR]
        assert row["swept"] == {LR: lr}
        assert row["metrics"].keys() == expected(lr).keys()
        for key, want in expected(lr).items():
            assert row["metrics"][key] == pytest.approx(want), (key, row)
        assert (row["steps"], row["checkpoint"]) == ("3/3", "ckpt/global_step_3"), row
        assert row["spec_sha256"] == run.submitted["spec_sha256"]
        nodes, gpus = run.submitted["nodes"], run.submitted["gpus_per_node"]
        hours, wall = row["gpu_hours"], sum(int(p) * 60 ** i for i, p in enumerate(reversed(row["wall"].split(":"))))
        assert abs(hours - nodes * gpus * wall / 3600) < 0.01, row
    markdown = verlc(root, "runs", "--results", *asked, "--format", "markdown", env=env).stdout.splitlines()
    assert markdown[0].startswith("| run | actor_rollout_ref.actor.optim.lr | state | steps | critic/score/mean last |")
    assert len(markdown) == 2 + len(runs) and all(r.submitted["spec_sha256"][:12] in markdown[2 + i]
                                                   for i, r in enumerate(runs))
    # the defaults: verl's validation scores and the training reward, every key a run logged
    default = verlc(root, "runs", "--results", "--format", "csv", env=env).stdout.splitlines()[0].split(",")
    assert [c for c in default if c.endswith(" last")] == ["val-core/gsm8k/reward/mean@1 last", "critic/score/mean last"]
    missing = verlc(root, "runs", "--results", "--metric", "critic/nope", env=env)
    assert missing.returncode == 2 and missing.stderr.strip() == (
        "verlc: no run logged 'critic/nope'; they logged: actor/pg_loss, critic/score/mean, timing_s/step, "
        "val-core/gsm8k/reward/mean@1"), missing.stderr


def check_plot(root: Path, key: str, runs: list[ledger.Run], env: dict[str, str] | None = None) -> None:
    from PIL import Image

    drawn = verlc(root, "plot", key, "--metric", "critic/score/mean", "-o", "score.png", env=env)
    assert drawn.returncode == 0, drawn.stderr
    with Image.open(root / "score.png") as image:
        image.load()  # decodes every pixel
        assert image.format == "PNG" and image.size == (960, 540)
        series = json.loads(image.text["verlc:series"])
    labels = {f"lr={r.submitted['variant'][LR]}": r for r in runs}
    assert series.keys() == labels.keys(), series
    for label, run in labels.items():
        x = run.submitted["variant"][LR] * 1e5
        assert [step for step, _ in series[label]] == [1, 2, 3], series
        assert [value for _, value in series[label]] == pytest.approx([x + i / 10 for i in (1, 2, 3)]), series
    svg = verlc(root, "plot", key, "--metric", "critic/score/mean", "-o", "score.svg", env=env)
    assert svg.returncode == 0, svg.stderr
    text = (root / "score.svg").read_text()
    assert text.startswith("<?xml") and "<svg " in text
    assert json.loads(html.unescape(text.split("<dc:description>")[1].split("</dc:description>")[0])) == series
    none = verlc(root, "plot", key, "--metric", "critic/nope", "-o", "nope.png", env=env)
    assert none.returncode == 2 and "logged no 'critic/nope'; it logged: actor/pg_loss, critic/score/mean" in none.stderr
    assert not (root / "nope.png").exists()


MILESTONES = ["verl: dataloader ready", "verl: first model loaded", "verl: workers up", "verl: initial validation done",
              "verl: first step"]


def check_timeline(root: Path, key: str, runs: list[ledger.Run], env: dict[str, str] | None = None) -> None:
    """#56: each run's start-up timeline, read from its log: the stages, the nodes' arrival, each preflight check
    within the preflight, and verl's milestones as the runtime stamped the fake trainer's lines (verl's own text),
    up to the first training step (step 0 is the validation before it); and a bar per run, the same bytes twice."""
    shown = verlc(root, "runs", key, "--timeline", "--format", "json", env=env)
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    for run in runs:
        mine = {row["phase"].strip(): row for row in rows if row["run"] == run.run}
        phases = list(mine)
        stages = [p for p in phases if p in ("containers", "ray", "data", "preflight", "train")]
        assert stages[-4:] == ["ray", "data", "preflight", "train"], phases
        assert any(re.fullmatch(r"all \d+ nodes in Ray", p) for p in phases), phases
        assert [p for p in phases if p.startswith("verl: ")] == MILESTONES, phases
        at = lambda p: float(mine[p]["start"].strip("+s"))  # noqa: E731
        checks = [p for p in phases if p.startswith("check ")]
        assert {"check cluster", "check nodes", "check all-reduce", "check paths"} <= set(checks), phases
        took = lambda p: float(mine[p]["duration"].rstrip("s"))  # noqa: E731
        # within the preflight: from its line to the train stage's line, to the table's resolution. The bound is the
        # train stage's start, never the preflight's start plus its length: two numbers rounded to 0.1 s sum to one
        # up to 0.1 s off (it failed so: +0.3s and 5.1s beside a check at +5.5s and the train stage's +5.5s). A check's
        # start is its line's time less its length, so it can round to 0.1 s before the stage line that preceded it.
        table = "\n".join(f"{row['phase']:<32} {row['start']:>8} {row['duration']:>8} {row['note']}"
                          for row in mine.values())
        assert all(at("preflight") - 0.1 <= at(c) <= at("train") for c in checks), f"{run.run}:\n{table}"
        # the head hashed the inputs while the nodes answered (#56 item 3): the two checks overlap
        assert at("check inputs") < at("check nodes") + took("check nodes"), rows
        # each node's clock against the head's (one host here: every offset within its bound, none named off)
        assert re.fullmatch(r"\S+ [+-]\d+\.\d{3}s \(within \d+\.\d{3}s\) against the head's, the furthest of "
                            rf"{run.submitted['nodes']}", mine["node clocks"]["note"]), mine["node clocks"]
        assert mine["verl: workers up"]["note"] == "Training from scratch", mine
        assert mine["verl: first step"]["note"] == "first step (step 1)", mine  # not the validation's step 0
        assert mine["median step"]["note"] == "over 3 steps", mine
        assert mine["time to first step"]["duration"] != "unknown" and at("verl: first step") >= at("train")
    table = verlc(root, "runs", key, "--timeline", env=env).stdout.splitlines()
    assert table[0].split() == ["run", "attempt", "phase", "start", "duration", "share", "note"], table
    drawn = [verlc(root, "plot", key, "--timeline", "-o", f"timeline{i}.svg", env=env) for i in (1, 2)]
    assert all(d.returncode == 0 for d in drawn), drawn[0].stderr
    first = (root / "timeline1.svg").read_bytes()
    assert first == (root / "timeline2.svg").read_bytes()
    text = first.decode()
    bars = json.loads(html.unescape(text.split("<dc:description>")[1].split("</dc:description>")[0]))
    assert bars.keys() == {f"lr={r.submitted['variant'][LR]}" for r in runs}, bars
    assert all([name for name, _, _ in phases][-1] == "first step" for phases in bars.values()), bars


def test_results_and_plot_of_a_slurm_sweep_are_what_its_logs_printed(slurm: None, tmp_path: Path) -> None:
    """A 2-variant sweep (a job array: one run per task), each task's fake trainer printing verl's lines; Slurm
    mails the end of each task (dev/slurm.sh's MailProg records them) and --on-end runs once per run."""
    write_fixtures(tmp_path)
    build(tmp_path, venv=fake_venv(tmp_path), slurm=", mail_type: [END, ARRAY_TASKS], mail_user: me@lab.example")
    spec = tmp_path / "spec.yaml"
    spec.write_text(spec.read_text() + f"sweep: {{matrix: {{{LR}: [1.0e-6, 2.0e-6]}}}}\n")
    on_end = 'printf "%s %s %s\\n" "$VERLC_RUN" "$VERLC_STATE" "$VERLC_EXIT_CODE" >> ended.txt'
    mails = Path(SLURM_CONF).parent / "mail.log"
    before = mails.read_text() if mails.exists() else ""
    done = verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", "--out", "out", "--follow", "--on-end",
                 on_end, stop_after="train", env={"FAKE_METRICS": "1"}, timeout=600)  # 2 jobs: >120 s under load
    assert done.returncode == 0, done.stdout + done.stderr
    runs = list(runs_of(tmp_path).values())
    job = runs[0].job_id.split("_")[0]
    assert [r.run for r in runs] == [f"{runs[0].name}-{job}_{i}" for i in range(2)]
    # followed one after another, each line named by its run (#40 item 8); --on-end as each one ended
    assert all(f"{r.run}: step 3" in done.stdout and f"{r.run}: completed" in done.stdout for r in runs), done.stdout
    assert sorted((tmp_path / "ended.txt").read_text().splitlines()) == [f"{r.run} COMPLETED 0" for r in runs]
    sent = lambda: mails.read_text().removeprefix(before).splitlines()  # noqa: E731 - this job's mails
    wait_for(lambda: all(any(f"Job_id={job}_{i} " in m for m in sent()) for i in range(2)), 60,
             "Slurm's mail of each array task's end")
    for i in range(2):
        [mail] = [line for line in sent() if f"Job_id={job}_{i} " in line]
        assert "Ended" in mail and "COMPLETED" in mail and mail.endswith(" me@lab.example"), mail
    assert [r.submitted["variant"] for r in runs] == [{LR: 1e-6}, {LR: 2e-6}]
    assert all(r.state == "COMPLETED" and Path(r.submitted["log"]).is_file() for r in runs), runs
    assert all(Path(r.record).is_file() for r in runs)  # each task's own run folder
    check_results(tmp_path, runs)
    check_plot(tmp_path, f"{runs[0].name}-{job}", runs)
    check_timeline(tmp_path, f"{runs[0].name}-{job}", runs)


def test_results_and_plot_of_a_ray_job_sweep_are_what_its_logs_printed(ray_head: str, tmp_path: Path) -> None:  # noqa: F811
    write_fixtures(tmp_path)
    fake = fake_venv(tmp_path) / "bin"
    build_ray_job(tmp_path, env={"PATH": f"{fake}:/usr/bin:/bin", "FAKE_METRICS": "1"},
                  sweep={"matrix": {LR: [1e-6, 2e-6]}})
    env = ray_env({"RAY_ADDRESS": ray_head, "VERLC_STOP_AFTER": "train"})
    done = subprocess.run([sys.executable, "-m", "verlc", "submit", "spec.yaml", "--target", "ray-job", "--follow"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    runs = list(runs_of(tmp_path).values())
    assert [r.submitted["variant"] for r in runs] == [{LR: 1e-6}, {LR: 2e-6}]
    assert all(r.state == "SUCCEEDED" for r in runs), runs
    # --follow followed the whole sweep, one run after the other
    assert all(f"{r.run}: step 3" in done.stdout and f"{r.run}: succeeded" in done.stdout for r in runs), done.stdout
    # #53 item 4: submitted together to a cluster sized for one, the variants ran in turn: the second waited on
    # the cluster for the first to end, and its stages began after the first one's last line
    first, second = ([e for e in map(parse_event, verlc(tmp_path, "logs", r.run, env=env).stdout.splitlines()) if e]
                     for r in runs)
    waited = [e for e in second if e.message.startswith("waiting for its turn")]
    assert [e.message for e in waited] == [f"waiting for its turn: 1 variant(s) submitted before it still to end "
                                           f"({runs[0].run}); 1 at a time (ray.sweep_parallel)"], second
    came = next(e for e in second if e.message.startswith("its turn came after"))
    assert came.time >= first[-1].time and next(e for e in second if e.stage == "data").time >= first[-1].time
    check_results(tmp_path, runs, env=env)
    check_plot(tmp_path, "rayjob-e2e", runs, env=env)
    check_timeline(tmp_path, "rayjob-e2e", runs, env=env)


def test_a_ray_job_resubmit_continues_the_runs_wandb_run(ray_head: str, tmp_path: Path) -> None:  # noqa: F811
    """Each ray-job run logs to the W&B run of its own id (every node: the job's runtime env); `verlc submit
    --resume RUN` is a new submission that logs to RUN's. Slurm, KubeRay and SkyPilot keep their runs' ids
    themselves: --resume is refused there."""
    write_fixtures(tmp_path)
    fake = fake_venv(tmp_path) / "bin"
    build_ray_job(tmp_path, env={"PATH": f"{fake}:/usr/bin:/bin", "FAKE_METRICS": "1"})
    env = ray_env({"RAY_ADDRESS": ray_head, "VERLC_STOP_AFTER": "train"})

    def submit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "verlc", "submit", "spec.yaml", "--wait", *args], cwd=tmp_path,
                              env=env, capture_output=True, text=True, timeout=600)

    first = submit("--target", "ray-job")
    assert first.returncode == 0, first.stdout + first.stderr
    [run] = runs_of(tmp_path).values()
    again = submit("--target", "ray-job", "--resume", run.run)
    assert again.returncode == 0, again.stdout + again.stderr
    second = list(runs_of(tmp_path).values())[-1]
    assert second.run != run.run and (second.submitted["tracker_run"], second.submitted["resumes"]) == (run.run, run.run)
    for each in (run, second):
        logs = verlc(tmp_path, "logs", each.run, env=env).stdout
        assert f"TRAINER restart=0 wandb={run.run}/allow " in logs, logs
    refused = verlc(tmp_path, "submit", "spec.yaml", "--target", "slurm", "--resume", run.run, env=env)
    assert refused.returncode == 2 and "--resume is for ray-job and compose" in refused.stderr, refused.stderr
