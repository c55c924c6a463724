"""docs/gpu.md from what dev/gpu/rehearse.sh saw (its folder of logs and events).

    python3 dev/gpu/report.py FOLDER OUTPUT.md

Everything in the page is read from those files: nothing here is typed in by hand except the prose around it.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from pathlib import Path

from verlc.lifecycle.progress import parse_step, plain
from verlc.runtime.protocol import record_from_log

SHOWN = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean", "response_length/mean",
         "timing_s/step")  # the per-step table's columns (every key is in the raw lines below it)
STAGE = re.compile(r"^\[(\S+)Z\] verlc: (stage \w+|preflight passed|PREFLIGHT FAILED|training exited)")
FOLLOW_STEP = re.compile(r"^(\d+\.\d) step (\d+)\b")
SPEC = Path("specs/gpu-rehearsal-reinforce.yaml")
SFT_SPEC = Path("specs/gpu-rehearsal-sft.yaml")
CASES = {  # label: (spec, what it shows)
    "train": (SPEC, "REINFORCE++ trains (verl 0.5.0, HF rollout, n=1)"),
    "critic": (Path("dev/gpu/cases/critic-0.5.0.yaml"), "PPO with a critic on verl 0.5.0: flash-attn demanded"),
    "hf-n4": (Path("dev/gpu/cases/hf-rollout-n4-0.5.0.yaml"), "verl 0.5.0, HF rollout with n=4"),
    "hf-0.6.1": (Path("dev/gpu/cases/hf-rollout-0.6.1.yaml"), "verl 0.6.1, HF rollout (not registered)"),
    "vllm-0.6.1": (Path("dev/gpu/cases/vllm-missing-0.6.1.yaml"), "verl 0.6.1, vLLM rollout, no vLLM installed"),
}


def events(folder: Path) -> dict[str, tuple[float, str]]:
    """Each event's seconds since its part of the rehearsal began, and its detail, as the first part saw it;
    `finished`: every part's time, summed (a rehearsal run in several device calls appends their events)."""
    out: dict[str, tuple[float, str]] = {}
    for line in (folder / "events.tsv").read_text().splitlines():
        name, seconds, detail = (line.split("\t") + ["", ""])[:3]
        if name == "finished":
            out[name] = (float(seconds) + out.get(name, (0.0, ""))[0], detail)
        else:
            out.setdefault(name, (float(seconds), detail))
    return out


def moments(log: str) -> list[tuple[datetime, str]]:
    """(time, what) of each stage line of a job log."""
    return [(datetime.fromisoformat(m[1]), m[2]) for line in log.splitlines() if (m := STAGE.match(line))]


def stage_table(log: str) -> list[str]:
    seen = moments(log)
    rows = ["| stage | started after | took |", "| --- | ---: | ---: |"]
    for (when, what), (after, _) in zip(seen, seen[1:] + [(seen[-1][0], "")]):
        if what.startswith("stage "):
            rows.append(f"| {what.removeprefix('stage ')} | {(when - seen[0][0]).total_seconds():.1f} s | "
                        f"{(after - when).total_seconds():.1f} s |")
    return rows


def timeline(table: Path, log: str) -> list[str]:
    """The run's timeline as verlc printed it; the stage table from the log where the timeline is missing."""
    text = table.read_text().strip() if table.exists() else ""
    return text.splitlines() if text.startswith("| run |") else stage_table(log)


def outcome(folder: Path, label: str, detail: str) -> str:
    """One line: where the case ended, from its log or its build output."""
    build = folder / f"{label}.build"
    if build.exists():
        refused = [ln for ln in build.read_text().splitlines() if ": verl." in ln]
        return f"refused by `verlc build` ({detail}): {refused[0] if refused else build.read_text().strip()[-300:]}"
    log = (folder / f"{label}.log").read_text() if (folder / f"{label}.log").exists() else ""
    failed = [ln.split("PREFLIGHT FAILED: ", 1)[1] for ln in log.splitlines() if "PREFLIGHT FAILED: " in ln]
    if failed:
        return "failed in the preflight, before the trainer started: " + " / ".join(failed)
    steps = [s for ln in log.splitlines() if (s := parse_step(ln))]
    trained = "training exited with code 0" in log
    return (f"trained {steps[-1].step} steps, exit 0" if trained and steps else
            f"ended without a preflight failure or a clean exit ({detail}); see its log")


def checkpoints(listing: Path) -> list[str]:
    """The global_step_N folders a run's `ls -R` of its checkpoint folder shows, in step order."""
    found = {m[0] for m in re.finditer(r"global_step_\d+", listing.read_text())} if listing.exists() else set()
    return sorted(found, key=lambda s: int(s.rsplit("_", 1)[1]))


def sft_steps(steps: list) -> list[str]:
    """An SFT run's steps as a table of its train/ and val/ metrics."""
    shown = sorted({k for s in steps for k in s.metrics if k.startswith(("train/", "val/"))})
    return ["| step | " + " | ".join(shown) + " |", "| ---: | " + " | ".join("---:" for _ in shown) + " |",
            *(f"| {s.step} | " + " | ".join(f"{s.metrics[k]:.4g}" if k in s.metrics else "" for k in shown) + " |"
              for s in steps)]


def sft_section(folder: Path, seen: dict[str, tuple[float, str]]) -> list[str]:
    """verl's SFT trainer, started by verlc with torchrun: its spec, stages, steps and outcome."""
    if "sft" not in seen or not (folder / "sft.log").exists():
        return ["", "## SFT under torchrun", "", "Not run in this rehearsal."]
    log = (folder / "sft.log").read_text()
    steps = [s for ln in log.splitlines() if (s := parse_step(ln))]
    saved = checkpoints(folder / "sft-checkpoints.txt")
    launched = next((plain(ln).split("verlc: training: ", 1)[1] for ln in log.splitlines()
                     if "verlc: training: " in ln), "")
    return [
        "", "## SFT under torchrun", "",
        f"Spec: `{SFT_SPEC}`: verl's own SFT program, which sets up torch.distributed itself, so verlc starts it",
        "with torchrun (one process per GPU of the one node) after the same bring-up and preflight.", "",
        "```yaml", SFT_SPEC.read_text().strip(), "```", "",
        "Its start-up timeline (verl's SFT trainer prints none of the main_ppo milestones: unknown, not guessed):",
        "", *timeline(folder / "sft-timeline.md", log), "",
        f"- outcome: {outcome(folder, 'sft', seen['sft'][1])}",
        f"- checkpoints written: {', '.join(saved) or 'none'}",
        *([f"- the trainer's command, as the job logged it: `{launched[:300]}`"] if launched else []), "",
        *sft_steps(steps),
    ]


SFT_TWO_SPEC = Path("specs/gpu-rehearsal-sft-two-nodes.yaml")
TORCHRUN_LINE = re.compile(r"verlc: (torchrun on .*|training: .*|training exited .*)")


def sft_two_section(folder: Path, seen: dict[str, tuple[float, str]]) -> list[str]:
    """verl's SFT trainer on two Ray nodes of a two-GPU machine: where each node's torchrun ran, its steps."""
    title = ["", "## SFT under torchrun on two nodes", ""]
    if "sft-two" not in seen or not (folder / "sft-two.log").exists():
        why = seen.get("sft-two", (0.0, "not run"))[1]
        return [*title, f"Not run in this rehearsal ({why})."]
    log = (folder / "sft-two.log").read_text()
    steps = [s for ln in log.splitlines() if (s := parse_step(ln))]
    return [
        *title,
        f"Spec: `{SFT_TWO_SPEC}`: two Ray nodes on the machine's two GPUs, one each, stand in for two hosts. verlc's",
        "runtime runs rank 0's torchrun where it runs and the other node's as a Ray task pinned there, both with",
        "torchrun's static rendezvous at the first node.", "",
        *stage_table(log), "",
        f"- outcome: {outcome(folder, 'sft-two', seen['sft-two'][1])}",
        f"- checkpoints written: {', '.join(checkpoints(folder / 'sft-two-checkpoints.txt')) or 'none'}",
        "- the job's launch lines:", "", "```",
        *(m[1][:300] for ln in log.splitlines() if (m := TORCHRUN_LINE.search(plain(ln)))), "```", "",
        *sft_steps(steps),
    ]


PIPELINE_SPEC = Path("specs/pipelines/gpu-rehearsal-pipeline.yaml")
PIPELINE_LINE = re.compile(r"verlc: (pipeline stage .*|merging stage .*|stage \S+'s model: .*|pipeline done: .*|"
                           r"ERROR: .*|preflight passed: .*|training exited .*)$")


def pipeline_section(folder: Path, seen: dict[str, tuple[float, str]]) -> list[str]:
    """A pipeline in one Ray job: each stage's steps, the merge of the first one's checkpoint, and what the second
    stage's run record keeps of the merged model."""
    if "pipeline" not in seen or not (folder / "pipeline.log").exists():
        return ["", "## A pipeline: SFT, verl's merger, a stage from the merged model", "", "Not run in this rehearsal."]
    log = (folder / "pipeline.log").read_text()
    stages: list[tuple[str, list]] = []
    for line in log.splitlines():
        if "verlc: pipeline stage " in line:
            stages.append((plain(line).split("verlc: pipeline stage ", 1)[1], []))
        elif stages and (step := parse_step(line)):
            stages[-1][1].append(step)
    merged = {}
    for stage in record_from_log(plain(log)).get("inputs", {}).get("stages", []):  # the last stage's record
        merged = {"stage": stage["stage"], "step": stage["step"], "files": stage["files"]}
    lines = [
        "", "## A pipeline: SFT, verl's merger, a stage from the merged model", "",
        f"Spec: `{PIPELINE_SPEC}`: two stages in one Ray job (the ray-job target runs a pipeline's stages in turn;",
        "on Slurm each is a job, chained with afterok). The second stage's model is `${stages.sft.model}`: its data",
        "stage runs verl's own `verl.model_merger` on the first stage's last checkpoint, and its preflight records",
        "every merged file's sha256.", "",
        "```yaml", PIPELINE_SPEC.read_text().strip(), "```", "",
        f"- outcome: `verlc submit --follow` {seen['pipeline'][1].split(' run ')[0]}",
        "- the job's pipeline lines:", "", "```",
        *(plain(ln).split("verlc: ", 1)[1][:200] for ln in log.splitlines() if PIPELINE_LINE.search(plain(ln))),
        "```", "",
    ]
    firsts = []
    for name, steps in stages:
        losses = [(s.step, s.metrics["train/loss"]) for s in steps if "train/loss" in s.metrics]
        firsts.append(losses[0][1] if losses else None)
        lines.append(f"- stage {name}: train/loss by step: "
                     + (", ".join(f"{step}: {loss:.4g}" for step, loss in losses) or "none logged"))
    if len(firsts) == 2 and None not in firsts:
        lines.append(f"- the second stage's first loss ({firsts[1]:.4g}) against the first stage's first, on the "
                     f"base model ({firsts[0]:.4g}): " + ("lower, as a model that already had the first stage's "
                                                          "training would be" if firsts[1] < firsts[0] else
                                                          "not lower: check that it loaded the merged model"))
    if merged:
        lines += ["", f"What the second stage's run record keeps of its model (stage {merged['stage']}, step "
                      f"{merged['step']}, merged):", "", "| file | sha256 |", "| --- | --- |",
                  *(f"| {name} | `{digest[:16]}...` |" for name, digest in sorted(merged["files"].items()))]
    return lines


JUDGE_SPEC = Path("specs/gpu-rehearsal-judge.yaml")
ANSWERED = re.compile(r'"POST /v1/chat/completions HTTP/1\.1" 200')


def gpu_users(sampled: Path) -> tuple[float, list[tuple[str, str, str]]]:
    """The sample of `nvidia-smi --query-compute-apps` with the most processes on the GPU: when it was taken
    (seconds since the rehearsal began) and its (pid, MiB, command line) rows."""
    samples: list[tuple[float, list[tuple[str, str, str]]]] = []
    for line in sampled.read_text().splitlines() if sampled.exists() else []:
        if line.startswith("at "):
            samples.append((float(line.split()[1]), []))
        elif samples and line.count("\t") >= 2:
            samples[-1][1].append(tuple(line.split("\t", 2)))  # type: ignore[arg-type]
    return max(samples, key=lambda s: len(s[1]), default=(0.0, []))


def judge_section(folder: Path, seen: dict[str, tuple[float, str]]) -> list[str]:
    """The run with an LLM judge beside the trainer on its GPU: the service's readiness and probe as the run
    record keeps them, the requests it answered while verl trained, and who held the GPU meanwhile."""
    title = ["", "## An LLM judge beside the trainer, on its GPU", ""]
    if "judge" not in seen or not (folder / "judge.log").exists():
        return [*title, "Not run in this rehearsal."]
    log = (folder / "judge.log").read_text()
    service = (folder / "judge-service.log").read_text() if (folder / "judge-service.log").exists() else ""
    record = record_from_log(plain(log)).get("services", {}).get("judge", {})
    steps = [s for ln in log.splitlines() if (s := parse_step(ln))]
    at, users = gpu_users(folder / "judge-gpu.txt")
    return [
        *title,
        f"Spec: `{JUDGE_SPEC}`: the training run above with `services.judge`, a real OpenAI-compatible server",
        "(`transformers serve`, the machine's own transformers) that the job starts on the head node beside the",
        "trainer, on the same GPU, and whose verdict is the reward: verl's reward function is the GenRM example's",
        "(`specs/genrm/judge_reward.py`), unchanged, which asks the judge for every response at the address and with",
        "the token verlc gives every process of the job. The judge serves the rehearsal's random model: its verdict",
        "is noise, and what this shows is the wiring on a GPU, not a judge worth training against.", "",
        "```yaml", JUDGE_SPEC.read_text().strip(), "```", "",
        f"- outcome: {outcome(folder, 'judge', seen['judge'][1])}",
        f"- the run record's service entry: `{json.dumps(record, sort_keys=True)}`",
        "- every response's reward came from the judge: the reward function raises where the judge cannot be "
        "reached (three attempts), and the run trained every step",
        f"- chat requests the judge answered (200) while the job ran, counted in its log: "
        f"{len(ANSWERED.findall(service))}" if "POST /v1/" in service else
        f"- its log: not read (`verlc logs RUN --service judge` said: {service.strip()[:200] or 'nothing'})",
        "- critic/score/mean (the judge's verdicts) by step: "
        + (", ".join(f"{s.step}: {s.metrics['critic/score/mean']:.3g}" for s in steps
                     if 'critic/score/mean' in s.metrics) or "none logged"),
        f"- the processes on the GPU at once, sampled by `nvidia-smi` {at:.0f} s into the rehearsal:", "",
        "| pid | GPU memory (MiB) | command |", "| ---: | ---: | --- |",
        *(f"| {pid} | {mib} | `{command.strip()[:110]}` |" for pid, mib, command in users), "",
        "Its start-up timeline (the services' phase beside the others):", "",
        *timeline(folder / "judge-timeline.md", log),
    ]


def main(folder: Path, output: Path) -> None:
    seen = events(folder)
    versions = (folder / "versions.txt").read_text().strip().splitlines()
    train_log = (folder / "train.log").read_text()
    follow = (folder / "train.follow").read_text().splitlines()
    first_step = next((float(m[1]) for ln in follow if (m := FOLLOW_STEP.match(ln)) and int(m[2]) >= 1), None)
    steps = [s for ln in train_log.splitlines() if (s := parse_step(ln))]
    step_lines = [plain(ln).split(")", 1)[-1].strip() for ln in train_log.splitlines() if parse_step(ln)]
    saved = checkpoints(folder / "checkpoints.txt")
    trained_moments = moments(train_log)
    ran = trained_moments[0][0].strftime("%Y-%m-%d %H:%M UTC") if trained_moments else "unknown"
    lines = [
        "# verlc on a GPU: the rehearsal",
        "",
        f"Last run: **{ran}**, by `dev/gpu/rehearse.sh` (written by `dev/gpu/report.py` from what it saw). Run it",
        "again when the runtime, the preflight or the trainer command changes: `bash dev/gpu/wheels.sh` here, then",
        "`bash dev/gpu/rehearse.sh` on a machine with an NVIDIA GPU (the device tool: `.whl` carried; its parts in",
        "two calls where one call's 10 minutes are too few, their folders merged for this report), and copy its",
        "`gpu.md`, `gpu-rehearsal.svg` and `gpu-timeline.svg` into docs/. The test suite has no GPU and cannot run it.",
        "",
        "What it does: installs verl, Ray and verlc from wheels (no network), makes a 2-layer random Qwen2, its",
        "tokenizer and GSM8K-shaped data offline (`dev/gpu/fixtures.py`), starts a one-node Ray head, and submits",
        "verlc's ray-job bundles with `verlc submit` (which runs each bundle's own `submit.sh`). The machine has no",
        "flash-attn for its torch: `dev/gpu/standin/flash_attn` provides the names verl 0.5.0's actor imports on CUDA",
        "(and raises if they are called; the spec turns `use_remove_padding` off) and has no package metadata, so",
        "transformers still refuses `flash_attention_2`.",
        "",
        "## Machine and versions",
        "",
        *(f"- {v}" for v in versions),
        "",
        "## The training run",
        "",
        f"Spec: `{SPEC}` (its reward function: `specs/gpu-rehearsal/reward.py`).",
        "",
        "```yaml",
        SPEC.read_text().strip(),
        "```",
        "",
        "Before the job: " + ", ".join(f"{name} {seen[name][0]:.0f} s" for name in ("installed", "fixtures",
                                                                                   "ray-head") if name in seen)
        + " after the script started (cumulative).",
        "",
        "Where its start-up time went, `verlc runs --timeline RUN --format markdown` (#56: the stages, each",
        "preflight check, and verl's own start-up milestones as the runtime stamped them from the trainer's output):",
        "",
        *timeline(folder / "timeline.md", train_log),
        "",
        f"- time from `verlc submit` to step 1: {first_step:.1f} s" if first_step is not None else
        "- step 1 was not reached",
        f"- steps done: {steps[-1].step if steps else 0}; {seen.get('train', (0, 'unknown'))[1].split(' run ')[0]} "
        f"(`verlc submit --follow`'s exit code)",
        f"- checkpoints written: {', '.join(saved) or 'none'}",
        "",
        "verl's console logger, some of its keys per step (step 0 is the validation before training):",
        "",
        "| step | " + " | ".join(SHOWN) + " |",
        "| ---: | " + " | ".join("---:" for _ in SHOWN) + " |",
        *(f"| {s.step} | " + " | ".join(f"{s.metrics[k]:.4g}" if k in s.metrics else "" for k in SHOWN) + " |"
          for s in steps if s.step > 0),
        "",
        "<details><summary>Every line verl's console logger printed</summary>",
        "",
        "```",
        *step_lines,
        "```",
        "",
        "</details>",
        "",
        "`verlc runs --results --format markdown`, as it read the run's log:",
        "",
        (folder / "results.md").read_text().strip(),
        "",
        "`verlc plot RUN --timeline -o gpu-timeline.svg`:",
        "",
        "![the training run's start-up, phase by phase](gpu-timeline.svg)",
        "",
        "`verlc plot RUN --metric critic/score/mean -o gpu-rehearsal.svg`:",
        "",
        "![critic/score/mean per step](gpu-rehearsal.svg)",
        "",
        "## Configs that must fail before the trainer",
        "",
        "Each one died at the trainer's start-up in an earlier rehearsal (about 50 s after the job began; on a real",
        "cluster after the queue and the bring-up of every node). Now:",
        "",
        "| case | spec | where it ended |",
        "| --- | --- | --- |",
    ]
    for label, (spec, what) in CASES.items():
        if label == "train" or label not in seen:
            continue
        text = outcome(folder, label, seen[label][1]).replace("|", "\\|")
        lines.append(f"| {what} | `{spec}` | {text} |")
    lines += judge_section(folder, seen)
    lines += sft_section(folder, seen)
    lines += pipeline_section(folder, seen)
    lines += sft_two_section(folder, seen)
    lines += ["", f"The whole rehearsal took {seen.get('finished', (0.0, ''))[0]:.0f} s.", ""]
    output.write_text("\n".join(lines))
    print(f"wrote {output}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
