"""`verlc`: the command line. Parses arguments and calls the command's function in verlc/commands/ (one module
per group) through the COMMANDS table; nothing below sees argparse."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import import_module
from pathlib import Path
from types import ModuleType

from . import __version__
from .runtime.protocol import STAGES

# Exit codes: 0 ok; 1 a run ended unsuccessfully, a check found stale files, migrate left decisions; 2 bad
# input (nothing written); 3 the scheduler or the ledger could not answer; 4 a target's tool is not on PATH;
# 70 a bug in verlc; 130 interrupted.


PROFILE_HELP = ("a site profile (verlc-profiles.yaml at the spec's repository root, else "
                "$XDG_CONFIG_HOME/verlc/) composed under the spec: the spec's own values win")


def _parser() -> argparse.ArgumentParser:
    from .targets import NAMES

    parser = argparse.ArgumentParser(
        prog="verlc", description="Compile verl experiment specs into runnable, reviewable bundles.")
    parser.add_argument("--version", action="version", version=f"verlc {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    build = sub.add_parser("build", help="compile specs into out/<name>/<target>/",
                           description="Compile specs into bundles. All specs build, or nothing is written.")
    build.add_argument("specs", nargs="+", type=Path, metavar="SPEC")
    build.add_argument("--target", required=True, choices=[*NAMES, "all"],
                       help="which bundle to generate; 'all' builds every target")
    build.add_argument("--out", type=Path, default=Path("out"), help="output folder (default: out)")
    build.add_argument("--force", action="store_true",
                       help="overwrite generated files even if they were edited by hand")
    for command in (build, validate := sub.add_parser(
            "validate", help="check specs without writing anything",
            description="Load, validate and check specs against verl's config; print every problem.")):
        command.add_argument("--verl-config", choices=["snapshot", "live"], default="snapshot",
                             help="check `verl:` against the shipped schema of the spec's verl_version "
                                  "(default) or against the installed verl")
        command.add_argument("--strict", action="store_true",
                             help="treat notes (what verlc cannot check, paths a container would lose) as errors")
        command.add_argument("--max-variants", type=int, default=1000, metavar="N",
                             help="refuse sweeps with more variants than this (default 1000)")
        command.add_argument("--profile", metavar="NAME", help=PROFILE_HELP)
    validate.add_argument("specs", nargs="+", type=Path, metavar="SPEC")
    validate.add_argument("--target", choices=[*NAMES, "all"],
                          help="also run the checks of this target (what `build --target` would refuse)")

    check = sub.add_parser("check", help="fail when out/ is not what the specs generate",
                           description="Rebuild in memory and compare with out/: exit 1 with a diff and the "
                                       "command that fixes it when a bundle is stale or was edited by hand. "
                                       "Bundles built with a site profile (out/<name>@<profile>/) are rebuilt "
                                       "with that profile.")
    check.add_argument("specs", nargs="*", type=Path, metavar="SPEC|DIR", default=[Path("specs")],
                       help="spec files or folders of them (default: specs/)")
    check.add_argument("--out", type=Path, default=Path("out"), help="output folder (default: out)")
    check.add_argument("--diff", action="store_true", help="print each out-of-date file's unified diff")

    plan = sub.add_parser("plan", help="the resolved allocation of a run before it is submitted",
                          description="GPUs per role, the rollout's replicas and their TP/DP/PP, each role's "
                                      "batch arithmetic per GPU, a sweep's variants, and GPU-hours per run and "
                                      "per sweep from cluster.slurm.time (a cost with cluster.gpu_hour_price, "
                                      "e.g. from a site profile).")
    plan.add_argument("specs", nargs="+", type=Path, metavar="SPEC")
    plan.add_argument("--profile", metavar="NAME", help=PROFILE_HELP)
    plan.add_argument("--format", choices=("text", "json"), default="text",
                      help="json: each run's memory figures per phase and term (compiler/memory.py)")

    diff = sub.add_parser("diff", help="what differs between two runs (specs, bundle folders or run records)",
                          description="A semantic diff of two specs, or two bundles (their spec.yaml), grouped "
                                      "into verl settings, resources, container, environment and stages; or of "
                                      "two run records (run-record.json in a run's folder), grouped into "
                                      "inputs, versions, verl config and resources.")
    diff.add_argument("a", type=Path, metavar="A")
    diff.add_argument("b", type=Path, metavar="B")
    diff.add_argument("--format", choices=["text", "markdown"], default="text")

    submit = sub.add_parser("submit", help="build (or reuse) a bundle and submit it; record the run",
                            description="Build the spec's bundle into --out (reused when up to date), submit it "
                                        "with the target's own tool from this folder, and append the run to the "
                                        "ledger (runs.jsonl at the spec's git root).")
    submit.add_argument("spec", type=Path, metavar="SPEC")
    submit.add_argument("--target", required=True, choices=NAMES)
    submit.add_argument("--profile", metavar="NAME", help=PROFILE_HELP)
    submit.add_argument("--resume", metavar="RUN",
                        help="ray-job, compose: a new submission that continues RUN (its W&B run id, and verl "
                             "resumes from RUN's checkpoints: the same spec has the same checkpoint folder)")
    submit.add_argument("--out", type=Path, default=Path("out"), help="output folder (default: out)")
    waiting = submit.add_mutually_exclusive_group()
    waiting.add_argument("--wait", action="store_true", help="return when the run ends, with its outcome")
    waiting.add_argument("--follow", action="store_true", help="print stages and training steps until it ends")
    submit.add_argument("--metric", action="append", default=[], metavar="KEY",
                        help="with --follow: a verl metric to show per step (e.g. critic/score/mean)")
    submit.add_argument("--on-end", metavar="CMD",
                        help="with --wait or --follow: run CMD (with sh) as each run ends, with VERLC_RUN, "
                             "VERLC_STATE and VERLC_EXIT_CODE in its environment (e.g. a chat notification)")
    status = sub.add_parser("status", help="the scheduler's state of a run (default: every unfinished run)")
    status.add_argument("run", nargs="?", metavar="RUN", help="run id, a unique prefix of it, or the job id")
    logs = sub.add_parser("logs", help="a run's log (the job's own, with the trainer's lines)")
    logs.add_argument("run", metavar="RUN")
    logs.add_argument("--follow", action="store_true", help="stages and training steps until the run ends")
    logs.add_argument("--stage", choices=STAGES,
                      help="only the lines of one stage")
    logs.add_argument("--metric", action="append", default=[], metavar="KEY", help="with --follow: metrics to show")
    kept = logs.add_mutually_exclusive_group()
    kept.add_argument("--ray", action="store_true",
                      help="Ray's own logs, which each node kept in the run folder when its Ray stopped (slurm)")
    kept.add_argument("--service", metavar="NAME",
                      help="a service's output (from the run folder, or through Ray's log API for a ray-job)")
    logs.add_argument("--node", help="with --ray or --service: one node's logs only")
    cancel = sub.add_parser("cancel", help="cancel a run with the target's own tool")
    cancel.add_argument("run", metavar="RUN")
    attach = sub.add_parser("attach", help="a shell (or CMD) where a running job's commands run on its head node",
                            description="Open a shell, or run CMD, on the head node of a running run, inside its "
                                        "container: e.g. `verlc attach RUN -- ray debug` for Ray's legacy debugger.")
    attach.add_argument("run", metavar="RUN")
    attach.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD", help="what to run instead of a shell")
    runs = sub.add_parser("runs", help="the ledger's runs as a table; with --results, what each run reached",
                          description="Every run of the ledger (or those RUN names: an id, a prefix of ids such as "
                                      "a sweep's, or a job id). With --results: per run (a sweep's variants with "
                                      "their swept values), its state, steps done/total, the last and best value "
                                      "of each metric verl's console logger printed, wall time, GPU-hours and "
                                      "the last checkpoint folder.")
    runs.add_argument("runs", nargs="*", metavar="RUN")
    shown = runs.add_mutually_exclusive_group()
    shown.add_argument("--results", action="store_true", help="metrics from each run's log (see --metric)")
    shown.add_argument("--timeline", action="store_true",
                       help="where each run's start-up time went: its stages, the preflight's checks, its services "
                            "and verl's own start-up milestones up to the first step, per attempt (from its log)")
    runs.add_argument("--metric", action="append", default=[], metavar="KEY[:min]",
                      help="with --results: a metric key, or a prefix ending in / (default: val-core/, "
                           "val/test_score/ and critic/score/mean); best is the highest value, with :min the lowest")
    runs.add_argument("--format", choices=["table", "markdown", "csv", "json"], default="table")
    plot = sub.add_parser("plot", help="a metric against step for runs or a sweep's variants, as PNG or SVG",
                          description="One line per run (labelled by its swept values, or its id), from the "
                                      "console logger's lines in each run's log. The figure carries the plotted "
                                      "series as JSON (PNG text chunk `verlc:series`, SVG description).")
    plot.add_argument("runs", nargs="+", metavar="RUN", help="run ids, prefixes of ids (a sweep's), or job ids")
    what = plot.add_mutually_exclusive_group(required=True)
    what.add_argument("--metric", metavar="KEY")
    what.add_argument("--timeline", action="store_true",
                      help="each run's start-up phases as a bar, up to verl's first step (see runs --timeline)")
    plot.add_argument("-o", "--output", type=Path, default=None, metavar="FILE",
                      help="FILE.png or FILE.svg (default: <metric>.png, or timeline.png, here)")

    stage_in = sub.add_parser(
        "stage-in", help="fetch a spec's pinned model and prepare its data here, for nodes without internet",
        description="Run the data stage's downloads where you submit jobs (this machine has the internet, compute "
                    "nodes often do not): the pinned model's revision into its folder and each data preparation, "
                    "in the current folder (runtime none: the spec's workdir), which must be storage the nodes "
                    "see. The job's data stage then finds both in place and skips them; set HF_HUB_OFFLINE: '1' "
                    "under the spec's env so that nothing on the nodes asks the hub.")
    stage_in.add_argument("spec", type=Path, metavar="SPEC")

    migrate = sub.add_parser(
        "migrate", help="move a spec to another verl release, every change explained",
        description="Rewrite a spec for another verl release: keys the target release moved go to their new "
                    "place, keys it removed are dropped, and each default the spec relied on that changed is "
                    "set to its old value, so the run behaves as before. Prints the report and a unified diff "
                    "(--write: rewrites the file, comments and quoting kept). Exit 0: the result validates "
                    "against the target release; 1: decisions are left for you (listed with their lines).")
    migrate.add_argument("spec", type=Path, metavar="SPEC")
    migrate.add_argument("--to", required=True, metavar="VERSION", help="the verl release to move to")
    migrate.add_argument("--write", action="store_true", help="rewrite the spec in place instead of printing a diff")
    migrate.add_argument("--write-bases", action="store_true",
                         help="also change the bases the spec extends (they may be shared with other specs)")
    migrate.add_argument("--format", choices=["text", "markdown"], default="text",
                         help="markdown: the report (and the diff) for a pull request")

    explain = sub.add_parser(
        "explain", help="what a verl setting is, in which releases, the rules on it, and where a spec sets it",
        description="Type, default, allowed values and verl's own description of a verl key (dotted, as under "
                    "`verl:`), the releases that have it (and its name where it moved), the verl rules that read "
                    "it; with SPEC, where the spec's value comes from and the exact override its bundle passes.")
    explain.add_argument("key", metavar="KEY", help="e.g. actor_rollout_ref.actor.ppo_mini_batch_size")
    explain.add_argument("spec", nargs="?", type=Path, metavar="SPEC")
    explain.add_argument("--verl-version", metavar="VERSION", help="the release to describe (default: the "
                                                                   "spec's verl_version, else 0.9.1)")
    explain.add_argument("--profile", metavar="NAME", help=PROFILE_HELP)

    importing = sub.add_parser(
        "import", help="turn an existing verl launch script into a spec",
        description="Read the trainer command a launch script runs (python3 -m verl.trainer.main_ppo or a recipe's "
                    "program, directly, through `ray job submit` or `uv run`; verl's SFT trainer under torchrun) "
                    "and print it as a spec. The "
                    "script's own shell code runs, from this folder, so that variables, defaults, arithmetic "
                    "and arrays come out as it computes them; no program it names runs: python, ray, torchrun "
                    "and uv are stand-ins that record their arguments. It runs in a sandbox (Linux user, mount, "
                    "network and pid namespaces): every file system read-only but a temporary folder, no "
                    "network, stdin empty, your environment not passed, a deadline and an output cap.")
    importing.add_argument("script", type=Path, metavar="SCRIPT")
    importing.add_argument("args", nargs="*", metavar="ARG", help="the script's own arguments")
    importing.add_argument("-o", "--output", type=Path, metavar="SPEC", help="write the spec here (default: stdout)")
    importing.add_argument("--then", action="append", default=[], metavar="'SCRIPT [ARG...]'",
                           help="a script of the next stage (e.g. the RL run after an SFT script): the scripts "
                                "become one pipeline spec, each a stage, each later stage's model the one before "
                                "it's last checkpoint, merged; repeatable")
    importing.add_argument("--service", action="append", default=[], metavar="'SCRIPT [ARG...]'",
                           help="a script that starts a server the trainer calls (vLLM's or SGLang's OpenAI "
                                "server: an LLM judge, a user simulator): it becomes one of the spec's services, "
                                "and the trainer's settings that name its address use ${services.NAME.url}; "
                                "repeatable"),
    pin = importing.add_mutually_exclusive_group()
    pin.add_argument("--verl-version", metavar="VERSION", help="the release the script was written for (default: "
                                                               "the installed verl, else 0.9.1)")
    pin.add_argument("--verl-commit", metavar="SHA", help="verl pinned to a commit (a recipe's REQUIRED_VERL.txt)")
    importing.add_argument("--verl-checkout", type=Path, metavar="DIR",
                           help="the verl checkout the script runs against: the spec pins its commit (--verl-commit "
                                "names another commit of it) and names it as verl_checkout, where verlc reads a "
                                "commit it has no schema of")
    importing.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                           help="a variable the script reads from its environment (e.g. NNODES=4)")
    importing.add_argument("--timeout", type=float, default=30, metavar="SECONDS",
                           help="stop the script's shell code after this long (default 30)")
    importing.add_argument("--accelerator", choices=("cuda", "rocm", "npu"), default="cuda",
                           help="the host the script's probes (python -c 'import torch_npu', npu-smi, command -v) "
                                "are answered as, and the spec's cluster.accelerator (default cuda)")

    schema = sub.add_parser("schema", help="print the spec's JSON Schema (or its Markdown reference)",
                            description="Print the spec's JSON Schema, for yaml-language-server and editors.")
    schema.add_argument("--format", choices=["json", "markdown"], default="json")
    schema.add_argument("--verl-version", metavar="VERSION",
                        help="the verl release whose keys `verl:` completes (default: verl_version's default)")
    schema.add_argument("--spec", type=Path, metavar="SPEC",
                        help="the schema of SPEC's program (a recipe's own config and keys) at its release or "
                             "commit, for the modeline of specs that run it")
    return parser


def _group(name: str) -> ModuleType:
    """A group of commands (verlc/commands/NAME.py), imported when one of its commands runs."""
    return import_module(f".commands.{name}", __package__)


# command -> what it runs, its arguments unpacked from argparse's namespace here and nowhere below
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "build": lambda a: _group("build").build(a.specs, a.target, a.out, a.force, a.verl_config, a.max_variants,
                                             a.strict, a.profile),
    "validate": lambda a: _group("build").validate(a.specs, a.target, a.verl_config, a.max_variants, a.strict,
                                                   a.profile),
    "check": lambda a: _group("build").check(a.specs, a.out, a.diff),
    "plan": lambda a: _group("build").plan(a.specs, a.profile, a.format),
    "diff": lambda a: _group("build").diff(a.a, a.b, a.format == "markdown"),
    "submit": lambda a: _group("runs").submit(a.spec, a.target, a.out, a.wait, a.follow, a.metric, a.on_end,
                                              a.profile, a.resume),
    "status": lambda a: _group("runs").status(a.run),
    "logs": lambda a: _group("runs").logs(a.run, a.follow, a.stage, a.metric, a.ray, a.service, a.node),
    "cancel": lambda a: _group("runs").cancel(a.run),
    "attach": lambda a: _group("runs").attach(a.run, a.cmd),
    "runs": lambda a: _group("runs").table(a.runs, a.results, a.timeline, a.metric, a.format),
    "plot": lambda a: _group("runs").plot(a.runs, a.metric, a.timeline, a.output),
    "explain": lambda a: _group("verl").explain(a.key, a.verl_version, a.spec, a.profile),
    "migrate": lambda a: _group("verl").migrate(a.spec, a.to, a.write, a.write_bases, a.format == "markdown"),
    "import": lambda a: _group("verl").import_script(a.script, a.args, a.verl_version, a.verl_commit, a.output,
                                                     a.timeout, a.set, a.accelerator, a.then,
                                                     a.verl_checkout, a.service),
    "schema": lambda a: _group("verl").schema(a.format, a.verl_version, a.spec),
    "stage-in": lambda a: _group("verl").stage_in(a.spec),
}


def main(argv: Sequence[str] | None = None) -> int:
    # pydantic looks for plugins (validation observers) by reading every installed package's entry
    # points before it builds the first model; verlc has none to observe, and that scan is a tenth of
    # a cold build (docs/performance.md).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        print("verlc: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`verlc runs | head`): nothing is wrong, nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own flush at exit, too
        return 141
    except Exception as exc:  # a bug in verlc, not in the spec
        if os.environ.get("VERLC_DEBUG") == "1":
            traceback.print_exc()
        else:
            print(f"verlc: internal error: {type(exc).__name__}: {exc} "
                  f"(run with VERLC_DEBUG=1 for the traceback)", file=sys.stderr)
        return 70
