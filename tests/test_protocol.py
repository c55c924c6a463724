"""The job protocol (targets/protocol.py): what crosses from the build to the cluster and back, read and written by
the same functions on both sides."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from dataclasses import fields

from conftest import SPECS
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG
from verlc.lifecycle.progress import events, stage_lines
from verlc.targets import protocol, render
from verlc.targets.job_package import one_program
from verlc.targets.protocol import Event, Job, Variant, event_line, parse_event


def example_jobs() -> list[Job]:
    out = []
    for spec in SPECS:
        ir = compile_spec(spec, CATALOG, display=str(spec), source=spec.name, targets=["ray-job"])
        bundle = render("ray-job", ir)
        out += [Job.from_json(f.text) for f in bundle.files if f.path.endswith(".json") and "verlc_job/" in f.path]
    return out


def test_every_example_job_survives_its_file() -> None:
    jobs = example_jobs()
    assert len(jobs) >= len(SPECS)
    for job in jobs:
        assert Job.from_json(job.to_json()) == job
        assert job.total_gpus % job.nodes == 0 and job.train[0] in ("python3", "torchrun")
        assert job.train[job.train.index("-m") + 1] in ("verl.trainer.main_ppo", "verl.trainer.sft_trainer")


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
    kinds = [(e.kind, e.text) for e in events(log)]
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
