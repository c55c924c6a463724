"""#56: a run's start-up timeline. verl's milestones are known by lines each release's trainer prints (checked here
against every release's own code); the runtime stamps them as it relays the trainer's output; the lifecycle reads
the phases back from the log, per attempt, and never estimates a phase whose line is missing. The end-to-end
checks on logs of real runs are in tests/test_lifecycle_e2e.py (a Slurm and a Ray sweep, and `--follow`)."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from test_verl_releases import release_package
from verlc.lifecycle import progress, timeline
from verlc.runtime import protocol
from verlc.runtime.train import Milestones
from verlc.compiler.verl.release import RELEASES

# What each milestone's print looks like in verl's code (the text around the formatted values), and a line as
# it prints it: the facts the patterns carry.
PRINTED = {
    "dataloader ready": ("Total training steps: {", "(TaskRunner pid=7) Total training steps: 435"),
    "first model loaded": ("contains {n_params:.2f}{scale} parameters",
                           "(WorkerDict pid=9) Qwen2ForCausalLM contains 494.03M parameters"),
    "workers up": ("Training from scratch", "(TaskRunner pid=7) Training from scratch"),
    "initial validation done": ("Initial validation metrics: {", "(TaskRunner pid=7) Initial validation metrics: {}"),
}


@pytest.mark.parametrize("version", RELEASES)
def test_every_release_prints_the_lines_its_milestones_are_known_by(version: str) -> None:
    trainer = release_package(version)
    code = "\n".join(p.read_text() for p in [trainer / "trainer" / "ppo" / "ray_trainer.py",
                                              trainer / "utils" / "model.py"])
    for name, pattern in protocol.TRAINER_MILESTONES:
        text, line = PRINTED[name]
        assert text in code, f"verl {version} no longer prints {text!r}: the milestone {name!r} would be unknown"
        assert pattern.search(line) and not any(p.search(line) for n, p in protocol.TRAINER_MILESTONES if n != name)
    assert "Load from checkpoint folder" in code  # a resumed run's "workers up"


def stamped(lines: list[str]) -> list[str]:
    """The event lines the runtime says while relaying these trainer lines."""
    said = io.StringIO()
    milestones = Milestones()
    with contextlib.redirect_stdout(said):
        for line in lines:
            milestones.seen(line + "\n")
        milestones.summary()
    return [protocol.parse_event(s).message for s in said.getvalue().splitlines()]


def test_the_runtime_stamps_each_milestone_once_and_the_first_training_step_not_the_validations() -> None:
    lines = [PRINTED[n][1] for n in ("dataloader ready", "first model loaded")] + [
        "(WorkerDict pid=9) Qwen2ForCausalLM contains 494.03M parameters",  # the reference model: not again
        "(TaskRunner pid=7) Load from checkpoint folder: ckpt/global_step_40",
        PRINTED["initial validation done"][1],
        "(TaskRunner pid=7) step:40 - val-core/gsm8k/reward/mean@1:0.41",  # the validation, at the checkpoint's step
        "(TaskRunner pid=7) step:41 - critic/score/mean:0.5 - timing_s/step:12.1",
        "(TaskRunner pid=7) step:42 - critic/score/mean:0.6"]
    said = stamped(lines)
    assert said[:5] == ["trainer: dataloader ready: Total training steps: 435",
                        "trainer: first model loaded: contains 494.03M parameters",
                        "trainer: workers up: Load from checkpoint folder: ckpt/global_step_40",
                        "trainer: initial validation done: Initial validation metrics",
                        "trainer: first step (step 41)"]
    assert len(said) == 6 and protocol.STEP_TIMES.fullmatch(said[5]) and said[5].startswith("trainer: 2 steps")


def log(*events: tuple[float, str]) -> list[str]:
    return [protocol.event_line(message, 1_800_000_000 + at) for at, message in events]


TWO_ATTEMPTS = log(
    (0, "job 7 on n1 n2; head n1; SLURM_RESTART_COUNT=0"), (0.2, "stage containers"),
    (0.5, "image on n1: present"), (0.6, "image on n2: pulling"), (12.7, "image on n2: pulled in 12.1s"),
    (30, "stage ray"),
    (30.5, "service judge: started on the head node at http://10.0.0.1:20500"),
    (34, "node registered: n1 (10.0.0.1) GPUs=8 (1/2)"), (41, "node registered: n2 (10.0.0.2) GPUs=8 (2/2)"),
    (41.5, "stage data"), (50, "stage preflight"), (50.4, protocol.check_message("cluster", 0.4)),
    (53, protocol.check_message("nodes", 2.6, ("n2", 2.45))), (53.1, protocol.clocks_message({"n1": (0.0004, 0.002),
                                                                                "n2": (-1.25, 0.004)})),
    (60, "service judge: ready in 9.5s, judge probe passed"),
    (60.1, protocol.check_message("services", 7)), (61, "stage train"), (61.2, "training: python3 -m x"),
    (70, "trainer: dataloader ready: Total training steps: 9"), (100, "trainer: workers up: Training from scratch"),
    (130, "trainer: first step (step 1)"), (200, "exit code 143"),
    (500, "job 7 on n3 n2; head n3; SLURM_RESTART_COUNT=1"), (501, "stage containers"), (530, "stage ray"))


def test_each_attempt_has_its_phases_and_a_missing_milestone_is_unknown() -> None:
    first, second = timeline.attempts(TWO_ATTEMPTS)
    phases = {p.name: p for p in first.phases}
    assert [p.name for p in first.phases if not p.part] == ["containers", "ray", "data", "preflight", "train"]
    assert (phases["ray"].start, phases["ray"].seconds) == (30, 11.5)
    # the image apart from the containers' start: from the stage's start to the last node that had it
    image = phases["image on 2 nodes"]
    assert (image.start, image.seconds, image.note) == (0.2, 12.5, "the slowest: n2, pulled in 12.1s")
    assert phases["all 2 nodes in Ray"].seconds == 11 and phases["all 2 nodes in Ray"].note == "the last: n2"
    assert (phases["check nodes"].start, phases["check nodes"].seconds) == (50.4, 2.6)
    assert phases["check nodes"].note == "the slowest node: n2 (2.5s)" and phases["check cluster"].note == ""
    # from its start until first seen ready (the runtime's own measure, #64 item 8), not until the preflight's line
    assert (phases["service judge"].start, phases["service judge"].seconds) == (30.5, 9.5)
    assert (phases["verl: dataloader ready"].start, phases["verl: dataloader ready"].seconds) == (61.2, 8.8)
    assert (phases["verl: workers up"].start, phases["verl: workers up"].seconds) == (70, 30)
    unknown = [p.name for p in first.phases if p.seconds is None]
    assert unknown == ["verl: first model loaded", "verl: initial validation done"]
    assert first.first_step == 130 and first.median_step is None
    assert [p.name for p in second.phases] == ["containers", "ray"] and second.first_step is None
    assert [p.name for p in first.phases][:2] == ["containers", "image on 2 nodes"]
    assert second.phases[-1].note == "under way at the log's end"
    assert timeline.attempts(TWO_ATTEMPTS, ended=True)[1].phases[-1].note == ""  # the scheduler says it ended
    rows = timeline.rows("r-7", [first, second], queued=12)
    assert rows[0][2:5] == ("queue", "", "12.0s")
    by = {(r[1], r[2].strip()): r for r in rows}
    assert by[("0", "verl: workers up")][5] == f"{100 * 30 / 130:.0f}%"
    assert by[("0", "train")][5] == ""  # it runs past the first step: no share of the time to it
    assert by[("1", "time to first step")][4:] == ("unknown", "", "no step in this log")
    assert timeline.bar(first)[-2:] == [("workers up", 70, 30), ("first step", 100, 30)]
    # the node clocks the preflight measured: the furthest from the head's, beyond its bound, is named
    assert first.clocks == {"n1": (0.0, 0.002), "n2": (-1.25, 0.004)} and second.clocks == {}
    assert by[("0", "node clocks")][6] == ("n2 -1.250s (within 0.004s) against the head's, the furthest of 2: "
                                           "n2's own lines are 1.250s behind")
    assert ("1", "node clocks") not in by
    assert timeline.clock_note({"n1": (0.0, 0.002), "n2": (0.003, 0.004)}) == \
        "n2 +0.003s (within 0.004s) against the head's, the furthest of 2"  # within its bound: nothing said


def test_a_service_that_failed_is_in_the_timeline_with_its_time_until_it_failed() -> None:
    """#64 item 8: a failed service is a phase too (from its start until it failed, its note says so), beside one
    that was ready; the runtime's own messages, as it says them."""
    lines = log((0, "job 8 on n1; head n1; SLURM_RESTART_COUNT=0"), (1, "stage ray"),
                (2, "service sandbox: started on the head node at http://10.0.0.1:20500"),
                (3, "service judge: started on the head node at http://10.0.0.1:20501"),
                (20, protocol.service_ready_message("judge", 3.2)), (21, protocol.service_failed_message("sandbox", 19.4)),
                (21.5, "exit code 1"))
    [attempt] = timeline.attempts(lines)
    phases = {p.name: p for p in attempt.phases}
    assert (phases["service judge"].start, phases["service judge"].seconds) == (3, 3.2)
    failed = phases["service sandbox"]
    assert (failed.start, failed.seconds) == (2, 19.4) and failed.note.startswith("failed"), failed


def test_follow_says_how_long_each_phase_took_as_it_ends() -> None:
    clock = progress.Clock()
    said = [e.text for chunk in (TWO_ATTEMPTS[:8], TWO_ATTEMPTS[8:]) for e in progress.events(chunk, clock)
            if e.kind == "took"]
    assert said[:4] == ["image on n2: pulled in 12.1s", "containers took 29.8s", "ray took 11.5s", "data took 8.5s"]
    assert "check nodes: 2.600s (the slowest node: n2 2.450s)" in said and "preflight took 11.0s" in said
    assert "verl: workers up, 38.8s after the trainer started" in said
    assert "train took 139.0s" in said and not any(re.match(r"\d+ steps", s) for s in said)


def test_an_ended_runs_timeline_is_kept_in_the_ledger_and_outlives_its_log(tmp_path) -> None:  # noqa: ANN001
    """#56 item 1: once verlc sees a run end, its timeline goes into the ledger's record of it, read from the log
    while it is there; `runs --timeline` reads it from there on (a Ray job's log goes with its cluster)."""
    from verlc.contract.launcher import LaunchError, Observed
    from verlc.lifecycle import ledger, runs

    class Scheduler:  # a launcher whose log is there until the run is gone
        def __init__(self) -> None:
            self.log: str | None = "\n".join(TWO_ATTEMPTS)
            self.final = False

        def state(self, _run: object) -> Observed:
            return Observed("COMPLETED" if self.final else "RUNNING", final=self.final, exit_code=0 if self.final
                            else None, source="stand-in")

        def logs(self, _run: object) -> str:
            if self.log is None:
                raise LaunchError("the job's log is gone with its cluster")
            return self.log

    scheduler = Scheduler()
    book = tmp_path / ledger.FILE
    ledger.append(book, {"event": "submitted", "run": "r-7", "job_id": "7", "target": "slurm"})
    runs.observe(book, ledger.fold(book)["r-7"], lambda _target: scheduler)
    assert ledger.fold(book)["r-7"].timeline is None  # not before it ended: the log still grows
    scheduler.final = True
    runs.observe(book, ledger.fold(book)["r-7"], lambda _target: scheduler)
    run = ledger.fold(book)["r-7"]
    assert run.final and [e["event"] for e in run.history] == ["state", "finished"]  # the timeline: no state
    from_log = runs.timeline(book, [run], "json", lambda _target: scheduler)
    scheduler.log = None
    assert runs.timeline(book, [run], "json", lambda _target: scheduler) == from_log
    assert timeline.from_json(run.timeline) == timeline.attempts(TWO_ATTEMPTS, ended=True)
