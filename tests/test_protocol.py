"""The job protocol (runtime/protocol.py, runtime/job.py): what crosses from the build to the cluster and back,
read and written by the same functions on both sides."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

from conftest import REPO, SPECS, slurm_job, spec_targets
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.lifecycle.progress import events, stage_lines
from verlc.runtime import protocol
from verlc.runtime.job import Job, Variant
from verlc.runtime.protocol import Event, event_line, parse_event
from verlc.runtime.runner import STAGE_TABLE, stage_table
from verlc.targets import render
from verlc.targets.job_package import one_program


def example_jobs() -> list[Job]:
    out = []
    for spec in SPECS:
        target = "ray-job" if "ray-job" in spec_targets(spec) else "compose"  # each ships the job as a file
        ir = compile_spec(spec, CATALOG, display=str(spec), source=spec.name, targets=[target])
        bundle = render(target, ir)
        out += [Job.from_json(f.text) for f in bundle.files if f.path.endswith(".json") and "verlc_job/" in f.path]
    return out


def test_every_example_job_survives_its_file() -> None:
    jobs = example_jobs()
    assert len(jobs) >= len(SPECS)
    for job in jobs:
        assert Job.from_json(job.to_json()) == job
        # every part is typed: a record field holds its records (a dataclass each), never a dict
        for f in fields(Job):
            of, value = f.metadata.get("of"), getattr(job, f.name)
            if of is not None and value is not None:
                assert all(isinstance(v, of) for v in (value if isinstance(value, list) else [value])), f.name
        assert job.total_gpus % job.nodes == 0 and job.train[0] in ("python3", "torchrun")
        assert job.train[job.train.index("-m") + 1] in ("verl.trainer.main_ppo", "verl.trainer.sft_trainer")


def test_every_committed_bundles_job_reads_back_as_the_same_text() -> None:
    """Job -> JSON -> Job -> JSON for the job of every golden bundle (every example spec, recipe and pipeline
    stage, each target that ships the package): the text verlc wrote is what the runtime's Job writes again."""
    from conftest import REPO

    texts = {str(p): p.read_text() for p in sorted((REPO / "out").glob("*/*/verlc_job/**/*.json"))}
    for script in sorted((REPO / "out").glob("*/slurm/sbatch.sh")):  # the job the script passes with --json
        texts[str(script)] = re.search(r"<<'VERLC_JOB'\n(.*?\n)VERLC_JOB\n", script.read_text(), re.S)[1]
    assert len(texts) >= len(SPECS)
    for where, text in texts.items():
        assert Job.from_json(text).to_json() == text, where


def test_a_job_file_with_a_key_this_runtime_does_not_know_is_refused() -> None:
    job = example_jobs()[0]
    text = job.to_json().replace('"name":', '"gpus": 8,\n  "name":')
    try:
        Job.from_json(text)
    except ValueError as exc:
        assert "gpus" in str(exc)
    else:
        raise AssertionError("an unknown key was accepted")


def test_a_variant_changes_only_its_own_fields() -> None:
    job = example_jobs()[0]
    variant = Variant(label="variant 1: data.seed=2", checkpoint_dir=["/ckpt/v1"], reference=None,
                      train_overrides=["data.seed=2"])
    assert Variant.from_json(variant.to_json()) == variant
    changed = job.with_variant(variant)
    assert changed.train == [*job.train, "data.seed=2"] and changed.checkpoint_dir == ["/ckpt/v1"]
    differing = {f.name for f in fields(Job) if getattr(job, f.name) != getattr(changed, f.name)}
    assert differing <= {"variant", "checkpoint_dir", "reference", "train"}


def test_an_event_is_read_back_as_it_was_written_even_behind_a_prefix() -> None:
    for message in ("stage preflight", protocol.skipped_message("train", "preflight"),
                    protocol.node_message("n2 (10.0.0.2)", "GPU", 8, 2, 4), protocol.exit_message(75), "a: [b] c"):
        line = event_line(message, now=1_700_000_000.5)
        assert parse_event(line) == Event("2023-11-14T22:13:20.500Z", message)
        assert parse_event("ray-head-1  | " + line).message == message  # Compose's prefix
    assert parse_event(event_line("stage data")).stage == "data"
    assert parse_event(event_line(protocol.skipped_message("data", "ray"))).skipped == "data"
    assert parse_event(event_line(protocol.skipped_message("data", "ray"))).stage is None
    assert parse_event(event_line(protocol.node_message("n1 (a)", "NPU", 16, 1, 2))).node_count == (1, 2)
    assert parse_event(event_line(protocol.exit_message(143))).exit_code == 143
    assert parse_event("verlc: stage data") is None  # no time: not an event line
    assert parse_event("(TaskRunner pid=1) step:3 - a:1") is None


def test_the_lifecycle_reads_the_runtimes_lines_with_the_protocol() -> None:
    log = [event_line(m) for m in ("stage ray", protocol.node_message("n1 (x)", "GPU", 8, 1, 2), "stage data",
                                   "stage preflight", protocol.skipped_message("train", "preflight"))]
    kinds = [(e.kind, e.text) for e in events(log) if e.kind != "took"]
    assert kinds == [("stage", "ray"), ("nodes", "ray 1/2 nodes"), ("stage", "data"), ("stage", "preflight")]
    assert list(stage_lines(log, "data")) == [log[2]]


def test_stop_after_names_a_stage() -> None:
    assert protocol.stop_after_problem("preflight") is None
    assert protocol.stop_after_problem("containers") is not None  # the Slurm script's own stage, not the runner's
    assert protocol.stop_after_problem("containers", protocol.STAGES) is None
    assert "expected ray, data, preflight or train" in protocol.stop_after_problem("trian")


def test_run_ids() -> None:
    assert protocol.run_id("exp", "42") == "exp-42"
    assert protocol.run_id("exp", "42", 0) == "exp-42_0"


def test_the_protocol_needs_only_the_standard_library() -> None:
    tree = ast.parse(open(protocol.__file__, encoding="utf-8").read())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_the_one_program_the_slurm_script_runs_starts_without_the_package(tmp_path) -> None:  # noqa: ANN001
    """`python3 -` with the protocol and the runtime on stdin, as the Slurm script runs it: a bad stage is refused
    with the protocol's words and its exit code."""
    job = example_jobs()[0]
    result = subprocess.run([sys.executable, "-", "job", "--json", job.to_json()], input=one_program(), text=True,
                            capture_output=True, timeout=60, env={"VERLC_STOP_AFTER": "trian", "PATH": "/usr/bin"})
    assert result.returncode == protocol.USAGE, result.stderr
    event = parse_event(result.stdout.strip())
    assert event and event.message == "ERROR: " + protocol.stop_after_problem("trian")


def test_the_slurm_scripts_own_event_lines_are_read_back_by_the_protocol() -> None:
    """The batch script writes its events in bash (`log`, `begin_stage`): run those functions as a rendered script
    has them, over the stages of its view, and read what they print with the protocol's parser."""
    spec = next(s for s in SPECS if s.name == "quickstart-gsm8k-1node.yaml")
    ir = compile_spec(spec, CATALOG, display=str(spec), source=spec.name, targets=["slurm"])
    script = next(f.text for f in render("slurm", ir).files if f.path.endswith("sbatch.sh"))
    stages = re.search(r"^readonly stages=\(.*\)$", script, re.M)[0]
    functions = script[script.index("log() {"):script.index("\n}\n", script.index("begin_stage() {")) + 3]
    program = f'{stages}\n{functions}\nfor s in "${{stages[@]}}"; do begin_stage "$s" || :; done\n' \
              f'log "exit code 143"\n'
    printed = subprocess.run(["bash", "-c", program], capture_output=True, text=True, check=True,
                             env={**os.environ, "VERLC_STOP_AFTER": "data"}).stdout
    events = [parse_event(line) for line in printed.splitlines()]
    assert all(events), printed
    upto = protocol.STAGES.index("data") + 1
    assert [e.stage for e in events[:upto]] == list(protocol.STAGES[:upto]), printed
    assert [e.skipped for e in events[upto:-1]] == list(protocol.STAGES[upto:]), printed
    assert events[upto].message == protocol.skipped_message(protocol.STAGES[upto], "data")
    assert events[-1].exit_code == 143


def test_the_runner_runs_each_stage_of_the_protocol_through_its_table() -> None:
    assert tuple(STAGE_TABLE) == protocol.RUNNER_STAGES
    try:
        stage_table({stage: print for stage in protocol.RUNNER_STAGES[:-1]}, (*protocol.RUNNER_STAGES, "eval"))
    except RuntimeError as exc:
        assert "no runner for eval, train" in str(exc)
    else:
        raise AssertionError("a stage without a runner was taken")


def test_a_stage_the_runtime_has_no_runner_for_stops_it_when_it_loads(tmp_path) -> None:  # noqa: ANN001
    """A stage added to the protocol alone: the shipped program fails as it starts, naming the stage, and runs
    nothing (before the table, such a stage ran training)."""
    program = one_program()
    written = re.search(r"^STAGES = \(.*\)$", program, re.M)[0]
    assert eval(written.partition("=")[2]) == protocol.STAGES
    added = program.replace(written, f"STAGES = {(*protocol.STAGES[:-1], 'eval', protocol.STAGES[-1])!r}")
    job = example_jobs()[0]
    result = subprocess.run([sys.executable, "-", "job", "--json", job.to_json()], input=added, text=True,
                            capture_output=True, timeout=60, cwd=tmp_path, env={"PATH": "/usr/bin"})
    assert result.returncode != 0 and "no runner for eval" in result.stderr, result.stderr
    assert result.stdout == ""


def test_every_verlc_line_a_bundle_prints_is_an_event_the_protocol_reads() -> None:
    """What the committed bundles' bash prints as verlc's goes through their `log`, whose lines the protocol's
    parser reads (an `echo "verlc: ..."` has no time stamp: the lifecycle would not see it)."""
    from conftest import REPO

    logs, stray = set(), []
    for path in sorted((REPO / "out").rglob("*")):
        if not path.is_file() or path.suffix in (".json", ".py", ".diff"):
            continue
        for line in path.read_text().splitlines():
            code = line.split("  # ")[0].strip()
            if "verlc: " not in code or code.startswith("#"):
                continue
            if code.startswith("log() {"):
                logs.add(code)
            elif re.search(r"\b(echo|printf)\b", code):
                stray.append(f"{path.relative_to(REPO)}: {code}")
    assert not stray, "\n".join(stray)
    assert len(logs) >= 1
    for log in logs:
        printed = subprocess.run(["bash", "-c", f"{log}\nlog 'stage ray'"], capture_output=True, text=True,
                                 check=True).stdout
        assert parse_event(printed) == Event(parse_event(printed).time, "stage ray"), (log, printed)


def test_the_run_record_reaches_the_log_as_short_lines_that_read_back() -> None:
    """#53: the record in the job's log is a line per group and per item of a mapping (not one 3 KB line),
    and reading the log back gives the last preflight's record."""
    from verlc.runtime.protocol import event_line, record_from_log, record_messages

    record = {"gpus": 16, "nodes": ["n1", "n2"], "pins": {"verl": "0.9.1"}, "accepted_changes": [],
              "inputs": {"model": {"path": "/m", "revision": "a" * 40, "files": {f"shard-{i}.safetensors": "b" * 64
                                                                                for i in range(4)}},
                         "data": {f"/data/part-{i}.parquet": "c" * 64 for i in range(6)}, "files": {}},
              "versions": {"ray": "2.60.0", "torch": "2.13.0", "verl": "0.9.1", "vllm": "0.17.0"}}
    lines = [event_line(m) for m in record_messages(record)]
    assert len(json.dumps(record)) > 1200 and len(lines) == 11 and max(map(len, lines)) < 700, lines
    earlier = [event_line(m) for m in record_messages({**record, "gpus": 8})]
    assert record_from_log("\n".join([*earlier, "other output", *lines, event_line("stage train")])) == record


def test_a_run_folder_the_job_cannot_see_stops_it_before_any_stage(tmp_path: Path, capsys) -> None:  # noqa: ANN001
    """#53: Slurm makes the run folder on the host; a container that does not mount it would lose the run record
    and the end time. The Slurm bundles name it in the job, and the runtime stops before its first stage, saying
    which folder and what to mount, where it does not see it."""
    from dataclasses import replace

    from verlc.runtime import runner

    script = (REPO / "out" / "dapo-qwen2.5-32b" / "slurm" / "sbatch.sh").read_text()
    folder = slurm_job(script)["run_folder"]
    assert folder == [{"env": "SLURM_SUBMIT_DIR"}, "/verlc-runs/dapo-qwen2.5-32b-", {"env": "SLURM_JOB_ID"}]
    job = replace(Job.from_json(json.dumps(slurm_job(script))),
                  run_folder=[str(tmp_path / "submit" / "verlc-runs" / "run-1")])
    assert runner.job(job) == protocol.USAGE
    said = capsys.readouterr().out
    assert f"ERROR: the run folder {tmp_path}/submit/verlc-runs/run-1 is not here, where the job runs" in said
    assert f"container.mounts ['{tmp_path}/submit:{tmp_path}/submit']" in said and "stage ray" not in said
