"""The run ledger and the progress parser, without a scheduler (tests/test_lifecycle_e2e.py has those)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_verlc
from verlc.compiler.verl.release import RELEASES
from verlc.lifecycle import ledger, progress, results

sys.path.insert(0, str(REPO / "dev"))
from verl_schema import release_package  # noqa: E402


def console_logger(version: str):  # noqa: ANN201
    """verl's own `concat_dict_to_str` of one release: the exact line its console logger prints."""
    path = release_package(version) / "utils" / "logger" / "aggregate_logger.py"
    spec = importlib.util.spec_from_file_location(f"aggregate_logger_{version.replace('.', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.concat_dict_to_str


@pytest.mark.parametrize("version", RELEASES)
def test_the_step_parser_reads_every_releases_console_logger(version: str) -> None:
    metrics = {"critic/score/mean": 0.625, "actor/pg_loss": -0.0123, "actor/lr": 1e-06,
               "response_length/mean": np.float64(211.5), "timing_s/step": 12, "val-core/gsm8k/acc/mean@1": 0.5}
    line = console_logger(version)(dict(metrics), step=17)
    bar = "Epoch 1/4:  12%|\u2588\u258e        | 2/16 [00:03<00:18,  1.30s/it]"  # the SFT trainer's tqdm, same line
    for shown in (line, f"(TaskRunner pid=4242) {line}", f"\x1b[36m(main_task pid=7)\x1b[0m {line}", bar + line):
        step = progress.parse_step(shown)
        assert step is not None and step.step == 17, shown
        assert set(step.metrics) == set(metrics), shown
        for key, value in metrics.items():  # 0.3/0.4 print 3 decimals, later releases the full value
            assert step.metrics[key] == pytest.approx(float(value), abs=5e-4), (key, shown)
    assert progress.parse_step("epoch 3 step:2 of the dataloader") is None
    assert progress.parse_step("global_step:5 - x:1") is None


def test_events_and_lines_from_a_job_log() -> None:
    log = """\
[2026-12-01T03:00:00.000Z] verlc: stage containers: skipped (VERLC_STOP_AFTER=preflight)
[2026-12-01T03:00:00.100Z] verlc: stage ray
[2026-12-01T03:00:01.000Z] verlc: node registered: n1 (10.0.0.1) GPUs=8 (1/2)
[2026-12-01T03:00:02.000Z] verlc: node registered: n2 (10.0.0.2) GPUs=8 (2/2)
[2026-12-01T03:00:03.000Z] verlc: stage train
(TaskRunner pid=9) Total training steps: 40
(TaskRunner pid=9) step:10 - critic/score/mean:0.5 - actor/pg_loss:-0.25
""".splitlines()
    events = [e for e in progress.events(log) if e.kind != "took"]
    assert [e.text for e in events] == ["ray", "ray 1/2 nodes", "ray 2/2 nodes", "train",
                                        "Total training steps: 40", "step 10"]
    assert [e.text for e in progress.events(log) if e.kind == "took"] == ["ray took 2.9s"]  # as the next one began
    step = events[-1].step
    assert progress.step_line(step, 40, ["critic/score/mean"], tty=False) == "step 10/40 critic/score/mean=0.5"
    assert progress.step_line(step, 40, [], tty=True, width=8) == "step 10/40 [##      ] 25%"
    assert list(progress.stage_lines(log, "ray"))[1:] == log[2:4]


def test_follow_says_why_a_run_failed_or_starts_over() -> None:
    """#53 item 11: the preflight's failing line, a requeue and its reason, the cap on requeues, the exit code."""
    log = """\
[2026-12-01T03:00:00.000Z] verlc: stage preflight
[service sandbox] verlc: cannot start 'uvicorn' here: No such file or directory
[2026-12-01T03:00:01.000Z] verlc: PREFLIGHT FAILED: data file data/nope.parquet does not exist (cwd /w)
[2026-12-01T03:00:02.000Z] verlc: USR1: preemption or time limit ahead; stopping and requeueing
[2026-12-01T03:00:03.000Z] verlc: requeueing job 7
[2026-12-01T03:00:04.000Z] verlc: not requeued: max_requeues (3) reached: this job was requeued 3 time(s) already
[2026-12-01T03:00:05.000Z] verlc: preflight passed: 1 nodes, 8 GPUs, 2 data files
[2026-12-01T03:00:06.000Z] verlc: exit code 1
""".splitlines()
    assert [(e.kind, e.text) for e in progress.events(log)] == [
        ("stage", "preflight"),
        ("why", "[service sandbox] verlc: cannot start 'uvicorn' here: No such file or directory"),  # #64 item 9
        ("why", "PREFLIGHT FAILED: data file data/nope.parquet does not exist (cwd /w)"),
        ("why", "USR1: preemption or time limit ahead; stopping and requeueing"),
        ("why", "requeueing job 7"),
        ("why", "not requeued: max_requeues (3) reached: this job was requeued 3 time(s) already"),
        ("took", "preflight took 6.0s"),  # #56: the stage under way when the job ended
        ("why", "exit code 1")]


def test_follow_shows_the_trainers_last_lines_when_training_fails() -> None:
    """A failed trainer's cause is in its own last lines (the GPU run of verl 0.9.1 showed only its exit code):
    `--follow` shows them above the exit, and nothing of them when training succeeds."""
    trainer = [f"(TaskRunnerV1 pid=9) line {i}" for i in range(20)] + [
        "Traceback (most recent call last):", "RuntimeError: CUDA error: no kernel image is available"]
    log = ["[2026-12-01T03:00:00.000Z] verlc: stage train", "(TaskRunnerV1 pid=9) step:1 - critic/score/mean:0.1",
           *trainer, "[2026-12-01T03:00:05.000Z] verlc: training exited with code 1"]
    shown = [e.text for e in progress.events(log) if e.kind == "why"]
    assert shown == [f"[trainer] {line}" for line in trainer[-progress.TRAINER_TAIL:]] + \
        ["training exited with code 1"]
    assert [e.text for e in progress.events(log[:-1] + [log[-1].replace("code 1", "code 0")])
            if e.kind == "why"] == ["training exited with code 0"]


def test_a_requeued_runs_wall_time_counts_every_attempt_and_not_the_queue_between() -> None:
    """#53 item 12: the scheduler's start is the last attempt's; the log has each attempt's own times."""
    log = ["[2026-12-01T03:00:00.000Z] verlc: job 7 on n1 n2; head n1; SLURM_RESTART_COUNT=0",
           "(TaskRunner pid=1) step:1 - critic/score/mean:0.1",
           "[2026-12-01T04:00:00.000Z] verlc: requeueing job 7",
           "[2026-12-01T04:00:30.000Z] verlc: exit code 0",
           "[2026-12-01T05:00:00.000Z] verlc: job 7 on n3 n4; head n3; SLURM_RESTART_COUNT=1",  # 30 min queued
           "[2026-12-01T05:20:00.000Z] verlc: exit code 0"]
    assert progress.attempts_seconds(log) == 3630 + 1200
    assert progress.attempts_seconds(log[:4]) is None  # one attempt: the scheduler's times stand


def test_results_read_the_scores_verls_evaluation_prints() -> None:
    """verl's main_eval prints its per-data-source means as a dict (`print(metric_dict)` of np.mean values): the
    line as this numpy prints it, read as step 0's values, and shown by default."""
    import numpy as np

    printed = str({"test_score/openai/gsm8k": np.mean([1.0, 0.0, 1.0, 1.0]), "test_score/math": np.mean([0.25])})
    logged = results.read(["(pid=1) 100%|##########| 4/4", printed])
    assert results.points(logged, "test_score/openai/gsm8k") == [(0, 0.75)]
    assert results.points(logged, "test_score/math") == [(0, 0.25)]
    defaults = [results.Metric(m) for m in results.DEFAULT_METRICS]
    assert results.chosen_keys([logged], defaults, asked=False) == ["test_score/math", "test_score/openai/gsm8k"]


def test_results_count_a_requeued_runs_repeated_steps_once_with_the_later_value() -> None:
    """verl 0.9.1's own console lines; the run was requeued after step 2 and resumed from step 1's checkpoint."""
    line = console_logger("0.9.1")
    log = ["(TaskRunner pid=1) Total training steps: 4",
           "(TaskRunner pid=1) " + line({"val-core/gsm8k/acc/mean@1": 0.2}, step=0),
           *("(TaskRunner pid=1) " + line({"critic/score/mean": v, "actor/pg_loss": loss}, step=s)
             for s, v, loss in ((1, 0.1, -0.5), (2, 0.2, -0.7))),
           "(TaskRunner pid=1) local_global_step_folder: /ckpt/run/global_step_1",
           "[2026-12-01T03:00:00.000Z] verlc: requeueing job 7",
           "(TaskRunner pid=2) " + line({"critic/score/mean": 0.25, "actor/pg_loss": -0.6}, step=2),
           "(TaskRunner pid=2) " + line({"critic/score/mean": 0.3, "actor/pg_loss": -0.4,
                                         "val-core/gsm8k/acc/mean@1": 0.45}, step=3),
           "(TaskRunner pid=2) local_global_step_folder: /ckpt/run/global_step_3"]
    logged = results.read(log)
    assert results.points(logged, "critic/score/mean") == [(1, 0.1), (2, 0.25), (3, 0.3)]
    assert (logged.total, logged.last_step, logged.checkpoints[-1]) == (4, 3, "/ckpt/run/global_step_3")
    metrics = [results.Metric.parse("val-core/"), results.Metric.parse("actor/pg_loss:min")]
    keys = results.chosen_keys([logged], metrics)
    assert keys == ["val-core/gsm8k/acc/mean@1", "actor/pg_loss"]
    row = results.row("r|1", {"verl.trainer.x": 1}, "a" * 64, "running", logged, keys, metrics, 7200, "2:00:00", 16)
    assert row.values == {"val-core/gsm8k/acc/mean@1": (0.45, 0.45), "actor/pg_loss": (-0.4, -0.6)}
    assert (row.steps, row.gpu_hours) == ("3/4", 32.0)
    table = results.render([row], keys, "markdown").splitlines()
    assert table[2].startswith("| r\\|1 | 1 | running | 3/4 | 0.45 | 0.45 | -0.4 | -0.6 | 2:00:00 | 32 |"), table
    with pytest.raises(results.ResultError, match="they logged: actor/pg_loss, critic/score/mean, val-core/"):
        results.chosen_keys([logged], [results.Metric.parse("actor/kl")])
    defaults = [results.Metric(m) for m in results.DEFAULT_METRICS]
    assert results.chosen_keys([results.Logged()], defaults, asked=False) == []  # a run that has not reached them
    with pytest.raises(results.ResultError, match="no run logged 'critic/score/mean'"):  # asked by name: an error
        results.chosen_keys([results.Logged()], [results.Metric.parse("critic/score/mean")])
    with pytest.raises(results.ResultError, match="a metric key"):
        results.Metric.parse(":min")
    # a plotted line is named by what its variant sweeps, by the keys' last parts unless two are the same
    from verlc.lifecycle.runs import _label
    lr = {"verl.actor_rollout_ref.actor.optim.lr": 1e-6, "verl.critic.optim.lr": 1e-5}
    assert _label(ledger.Run("a-1_0", {"variant": lr})) == \
        "actor_rollout_ref.actor.optim.lr=1e-06 critic.optim.lr=1e-05"
    assert _label(ledger.Run("a-1_0", {"variant": {"verl.data.train_batch_size": 64}})) == "train_batch_size=64"
    assert _label(ledger.Run("a-1", {})) == "a-1"


def test_the_ledger_folds_events_and_finds_runs(tmp_path: Path) -> None:
    book = tmp_path / ledger.FILE
    ledger.append(book, {"event": "submitted", "run": "exp-41", "job_id": "41", "target": "slurm"})
    ledger.append(book, {"event": "submitted", "run": "exp-42", "job_id": "42", "target": "slurm"})
    ledger.append(book, {"event": "state", "run": "exp-41", "state": "RUNNING", "restarts": 0})
    ledger.append(book, {"event": "state", "run": "exp-41", "state": "RUNNING", "restarts": 1})
    ledger.append(book, {"event": "finished", "run": "exp-41", "state": "COMPLETED", "restarts": 1, "exit_code": 0})
    runs = ledger.fold(book)
    assert (runs["exp-41"].state, runs["exp-41"].restarts, runs["exp-41"].final) == ("COMPLETED", 1, True)
    assert (runs["exp-42"].state, runs["exp-42"].final) == ("SUBMITTED", False)
    assert ledger.find(runs, "42").run == "exp-42"
    with pytest.raises(ledger.LedgerError, match="matches 2 runs"):
        ledger.find(runs, "exp-4")
    with pytest.raises(ledger.LedgerError, match="no run 'nope'"):
        ledger.find(runs, "nope")
    with book.open("a") as fh:  # a write cut short by a crash: the last line only
        fh.write('{"event": "state", "ru')
    assert ledger.fold(book)["exp-41"].state == "COMPLETED"
    book.write_text(book.read_text() + '\n{"event": "state", "run": "exp-42", "state": "RUNNING"}\n')
    with pytest.raises(ledger.LedgerError, match=r"runs.jsonl:6: not a ledger event"):
        ledger.fold(book)


def test_a_runs_duration_is_the_schedulers_start_to_end(tmp_path: Path) -> None:
    """verlc notices an end when it next asks; the scheduler's own times say how long the job ran."""
    from verlc.lifecycle import runs

    book = tmp_path / ledger.FILE
    lines = [{"event": "submitted", "run": "r-1", "job_id": "1", "target": "slurm", "at": "2026-12-01T10:00:00Z"},
             {"event": "state", "run": "r-1", "state": "RUNNING", "at": "2026-12-01T10:00:05Z",
              "started": "2026-12-01T10:00:02Z"},
             {"event": "finished", "run": "r-1", "state": "COMPLETED", "at": "2026-12-01T10:01:09Z",
              "started": "2026-12-01T10:00:02Z", "ended": "2026-12-01T10:00:31Z"}]
    book.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert runs.duration(ledger.fold(book)["r-1"]) == "0:00:29"
    older = [{k: v for k, v in line.items() if k not in ("started", "ended")} for line in lines]
    book.write_text("".join(json.dumps(line) + "\n" for line in older))  # a ledger from before: as it was
    assert runs.duration(ledger.fold(book)["r-1"]) == "0:01:09"


def test_slurm_times_become_utc_ledger_times(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from verlc.targets.slurm import launch

    monkeypatch.setenv("TZ", "Europe/Paris")
    time.tzset()
    try:
        assert launch._time("2026-12-01T11:00:31") == "2026-12-01T10:00:31Z"  # the controller's local time
        assert launch._time("Unknown") is None and launch._time(None) is None
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


APPENDER = """
import sys
from verlc.lifecycle import ledger
for i in range(300):
    ledger.append(ledger.Path(sys.argv[1]), {"event": "state", "run": sys.argv[2], "state": "RUNNING",
                                             "n": i, "pad": "x" * 5000})
"""


def test_concurrent_appends_leave_every_event_whole(tmp_path: Path) -> None:
    """Two processes appending 300 events of 5 kB each at once: 600 whole lines (one write each, locked)."""
    book = tmp_path / ledger.FILE
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(book), run]) for run in ("a", "b")]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    lines = book.read_text().splitlines()
    assert len(lines) == 600
    events = [json.loads(line) for line in lines]
    for run in ("a", "b"):
        assert [e["n"] for e in events if e["run"] == run] == list(range(300))


def test_lifecycle_commands_fail_with_one_line_and_a_documented_code(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()  # the ledger lives at the git root
    unknown = run_verlc("status", "nope", cwd=tmp_path)
    assert (unknown.returncode, unknown.stderr) == (3, "verlc: no run 'nope' in the ledger\n")
    assert run_verlc("runs", cwd=tmp_path).stdout.startswith("run  spec  target")
    spec = REPO / "specs" / "quickstart-gsm8k-1node.yaml"
    no_slurm = run_verlc("submit", spec, "--target", "slurm", "--out", tmp_path / "out", cwd=tmp_path,
                         env={"PATH": "/usr/bin/nonexistent"})
    assert no_slurm.returncode == 4 and no_slurm.stderr.strip().endswith(
        "verlc: sbatch is not on PATH (the slurm target submits with sbatch)"), no_slurm.stderr
    no_ray = run_verlc("submit", spec, "--target", "ray-job", "--out", tmp_path / "out", cwd=tmp_path,
                       env={"RAY_ADDRESS": "http://127.0.0.1:9"})
    assert no_ray.returncode == 3 and "cannot reach the Ray dashboard at http://127.0.0.1:9" in no_ray.stderr
    assert "Traceback" not in no_slurm.stderr + no_ray.stderr
    assert not (tmp_path / ledger.FILE).exists(), "nothing was submitted, so nothing is recorded"


def test_a_slurm_submit_checks_the_specs_secrets_before_sbatch(tmp_path: Path) -> None:
    """A sweep's array tasks each died at their start ("WANDB_API_KEY is not set") after the queue: verlc submit
    refuses first, names the secret, and queues nothing."""
    (tmp_path / ".git").mkdir()
    spec = tmp_path / "spec.yaml"
    spec.write_text((REPO / "specs" / "quickstart-gsm8k-1node.yaml").read_text() + "secrets: [WANDB_API_KEY]\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text(f"#!/bin/sh\ntouch {tmp_path}/queued\necho 1\n")
    (fake / "sbatch").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    done = subprocess.run([sys.executable, "-m", "verlc", "submit", str(spec), "--target", "slurm", "--out",
                           str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**env, "PATH": f"{fake}:{os.environ['PATH']}"})
    assert done.returncode == 2, done.stderr
    assert "WANDB_API_KEY is not set: the spec's secrets come from this shell" in done.stderr, done.stderr
    assert not (tmp_path / "queued").exists() and not (tmp_path / ledger.FILE).exists()


def test_a_run_stopped_by_verlc_stop_after_shows_where_it_stopped(tmp_path: Path) -> None:
    """A bring-up-only run (VERLC_STOP_AFTER=preflight) ends with exit 0 like a trained one; the tables say where it
    stopped instead of `completed`. A failed one still shows its failure."""
    from verlc.lifecycle.runs import shown_state

    book = tmp_path / ledger.FILE
    for run, stop, code, state in (("a-1", "preflight", 0, "COMPLETED"), ("a-2", None, 0, "COMPLETED"),
                                   ("a-3", "preflight", 1, "FAILED")):
        ledger.append(book, {"event": "submitted", "run": run, "job_id": run[2:], "target": "slurm",
                             **({"stop_after": stop} if stop else {})})
        ledger.append(book, {"event": "finished", "run": run, "state": state, "restarts": 0, "exit_code": code})
    runs = ledger.fold(book)
    assert [shown_state(runs[r]) for r in ("a-1", "a-2", "a-3")] == ["stopped after preflight", "completed", "failed"]


def test_cancel_of_a_sweeps_prefix_or_array_job_id_cancels_each_unfinished_variant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """#40 item 8: docs/running.md says RUN may be the job id; a sweep's array job id (or the prefix of its runs)
    names every variant, and was refused as ambiguous."""
    from verlc.commands import runs as commands
    from verlc.lifecycle import runs
    from verlc.contract.launcher import Observed

    (tmp_path / ".git").mkdir()
    book = tmp_path / ledger.FILE
    for i in range(3):
        ledger.append(book, {"event": "submitted", "run": f"s-7_{i}", "job_id": f"7_{i}", "target": "slurm"})
    ledger.append(book, {"event": "finished", "run": "s-7_2", "state": "COMPLETED", "restarts": 0, "exit_code": 0})
    ledger.append(book, {"event": "submitted", "run": "other-8", "job_id": "8", "target": "slurm"})
    sent: list[str] = []
    monkeypatch.setattr(runs, "cancel", lambda _book, run, _launchers: sent.append(run.run) or Observed(
        scheduler_state="CANCELLED", restarts=0, source="test"))
    monkeypatch.chdir(tmp_path)
    for key in ("s-7", "7"):
        sent.clear()
        assert commands.cancel(key) == 0
        assert sent == ["s-7_0", "s-7_1"], sent  # the ended variant is left alone, other runs too
    assert commands.cancel("s-7_2") == 0 and sent[-1] == "s-7_2"  # named alone: cancelled as asked
    assert "s-7_0: cancel sent; now cancelled" in capsys.readouterr().out


def test_logs_written_to_a_file_or_a_pipe_carry_no_colour_codes() -> None:
    """Ray colours its workers' prefixes; `verlc logs` strips the codes unless it writes to a terminal."""
    from verlc.lifecycle import progress

    line = "\x1b[36m(TaskRunner pid=7)\x1b[0m step:1 - critic/score/mean:0.5\n"
    assert progress.plain(line) == "(TaskRunner pid=7) step:1 - critic/score/mean:0.5\n"
    assert progress.parse_step(progress.plain(line)).metrics == {"critic/score/mean": 0.5}


def test_a_save_slower_than_verls_allowance_in_an_earlier_run_is_noted_at_submit(tmp_path: Path) -> None:
    """#42: verl saves ahead of the time limit allowing 60 s plus trainer.esi_redundant_time for the save; an
    earlier run of the same spec whose log shows a slower save (timing_s/save_checkpoint) gets a note at submit
    naming the run and the setting, and none once the setting covers it."""
    (tmp_path / ".git").mkdir()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 7\n")
    (fake / "scontrol").write_text("#!/bin/sh\nexit 1\n")
    for tool in ("sbatch", "scontrol"):
        (fake / tool).chmod(0o755)
    earlier = tmp_path / "slurm-6.out"
    earlier.write_text("(TaskRunner pid=1) step:10 - timing_s/step:300.0 - timing_s/save_checkpoint:151.5\n"
                       "(TaskRunner pid=1) step:11 - timing_s/step:290.0\n")
    book = tmp_path / ledger.FILE
    ledger.append(book, {"event": "submitted", "run": "quickstart-gsm8k-1node-6", "job_id": "6", "target": "slurm",
                         "name": "quickstart-gsm8k-1node", "log": str(earlier)})

    def submit(extra: str) -> str:
        spec = tmp_path / "spec.yaml"
        text = (REPO / "specs" / "quickstart-gsm8k-1node.yaml").read_text()
        spec.write_text(text.replace("save_freq: 100}", "save_freq: 100" + extra + "}"))
        done = subprocess.run([sys.executable, "-m", "verlc", "submit", str(spec), "--target", "slurm", "--out",
                               str(tmp_path / "out")], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"})
        assert "Traceback" not in done.stderr, done.stderr
        return done.stderr

    noted = submit("")
    assert ("note: run quickstart-gsm8k-1node-6 of this spec saved a checkpoint in 152s; verl allows 60s" in noted
            and "set verl.trainer.esi_redundant_time to 121 or more" in noted), noted
    assert "saved a checkpoint in" not in submit(", esi_redundant_time: 121")
