"""A pipeline: one spec whose `stages:` are verl programs run one after another (SFT, then RL from its model).

Each stage is compiled as a spec of its own: the file's settings with the stage's on top (mappings merge, lists
are replaced), named <name>-<stage>, its problems reported at the stage's own lines (stages.NAME.verl...). A
stage takes an earlier one's output by name. In its `model:`, `${stages.NAME.model}` is stage NAME's last
checkpoint merged into a Hugging Face folder, which is what verl's programs load: the later stage's data stage
runs verl's own model merger on that checkpoint (the runtime, runtime/data.py) into
<NAME's checkpoint folder>/verlc-merged/global_step_<N>, and points verlc-merged/latest at it, the model path the
later stage's verl gets. In its data files, `${stages.NAME.output}` is the file of responses verl's generation
(stage NAME) writes, its data.output_path, which verl's evaluation scores.

Facts of verl's code this relies on (tests/test_verl_releases.py reads each release's files for them): verl's
trainers name their last checkpoint in <trainer.default_local_dir>/latest_checkpointed_iteration.txt (the Ray
trainers always; the SFT trainers from 0.5.0, which saved a Hugging Face folder per step before); a Ray trainer's
model shards are in global_step_<N>/actor, an SFT trainer's in global_step_<N>; `python -m verl.model_merger
merge --backend fsdp|megatron --local_dir CHECKPOINT --target_dir FOLDER` exists from 0.4.1.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError
from ruamel.yaml.comments import CommentedMap

from .diagnostics import Diagnostic, SpecError, did_you_mean
from .fields import Model
from .ir import JobIR, StageInputIR, Var, Word, parse_word
from .load import Sourced, merge
from .spec import Stage
from .verl.program import GENERATION

REFERENCE = re.compile(r"\$\{stages\.(?P<stage>[^.{}]*)\.(?P<output>[^{}]*)\}")
# A stage's outputs and where a later stage takes each: its model (merged) as the later one's model:, verl's
# generation's file of responses (its data.output_path) as a data file (verl's evaluation scores it)
OUTPUTS = {"model": "model:", "output": "data.train_files"}
MERGED = "verlc-merged"  # in the earlier stage's checkpoint folder: global_step_<N>/ merged, and `latest`
LATEST = "latest"
MERGER_FROM = (0, 4, 1)  # verl.model_merger's first release
SFT_TRACKER_FROM = (0, 5, 0)  # the first release whose SFT trainers write latest_checkpointed_iteration.txt


@dataclass(frozen=True)
class StageSpec:
    """One stage as a spec of its own, and what it takes of earlier stages."""

    name: str  # the stage's own name (sft)
    index: int
    sourced: Sourced
    takes: tuple[tuple[tuple[str | int, ...], str, str], ...] = ()  # (where in the stage, earlier stage, output)


class _Stages(Model):
    stages: dict[str, Stage]


def split(sourced: Sourced) -> list[StageSpec] | None:
    """The stages of a pipeline spec, each as a spec of its own (None: the spec is not a pipeline); SpecError
    for a stage's unknown key or a reference to an output no earlier stage produces."""
    raw = sourced.data.get("stages")
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise SpecError([sourced.diagnostic(("stages",), "stages is a mapping of stage names to their settings "
                                                         "(at least one)")])
    _validate(sourced, raw)
    problems = [*_misplaced(sourced)]
    if sourced.data.get("sweep") is not None:
        problems.append(sourced.diagnostic(("sweep",), "a pipeline is not swept: sweep one stage as a spec of its "
                                                       "own", at_key=True))
    names = list(raw)
    top = {k: v for k, v in sourced.data.items() if k != "stages"}
    parts = []
    for index, (name, own) in enumerate(raw.items()):
        own = {k: v for k, v in own.items() if v is not None}
        takes = []
        for loc, text in _references(own):
            if not _placed(loc) or not REFERENCE.fullmatch(text):
                continue  # _misplaced says so
            stage, problem = _reference(text, names, index, loc)
            if problem:
                problems.append(sourced.diagnostic(("stages", name, *loc), problem))
            else:
                takes.append((loc, stage, REFERENCE.fullmatch(text)["output"]))
        data = merge(top, own)
        if isinstance(top.get("name"), str):
            data["name"] = f"{top['name']}-{name}"
        shown, tree = _holder(sourced, name)
        layers = (*sourced.layers, (shown, tree["stages"][name]))  # the stage's own lines: its problems' places
        parts.append(StageSpec(name, index, replace(sourced, data=data, layers=layers, stage=name), tuple(takes)))
    if problems:
        raise SpecError(problems)
    return parts


def _holder(sourced: Sourced, stage: str) -> tuple[str, CommentedMap]:
    """The layer (file) that writes this stage."""
    return next((shown, tree) for shown, tree in reversed(sourced.layers)
                if isinstance(tree.get("stages"), CommentedMap) and stage in tree["stages"])


def _validate(sourced: Sourced, raw: dict[str, Any]) -> None:
    from .validate import _diagnostic

    try:
        _Stages.model_validate({"stages": raw})
    except ValidationError as exc:
        raise SpecError(_diagnostic(sourced, err, _Stages) for err in exc.errors(include_url=False)) from None
    bad = [n for n in raw if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", n)]
    if bad:
        raise SpecError([sourced.diagnostic(("stages", n), f"stage name '{n}': lowercase letters, digits, - and _ "
                                                           f"(up to 32), as it names Slurm jobs and runs",
                                            at_key=True) for n in bad])


def _references(value: Any, loc: tuple[str | int, ...] = ()) -> Iterator[tuple[tuple[str | int, ...], str]]:
    """(where, text) of every string under `value` that mentions a stage's output (`${stages.`)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _references(v, (*loc, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _references(v, (*loc, i))
    elif isinstance(value, str) and "${stages." in value:
        yield loc, value


def _placed(loc: tuple[str | int, ...]) -> bool:
    """Whether a stage's setting at `loc` may take an earlier stage's output: its model, or a data file."""
    return loc == ("model",) or (len(loc) == 3 and loc[:2] in (("data", "train_files"), ("data", "val_files")))


def _misplaced(sourced: Sourced) -> Iterator[Diagnostic]:
    """`${stages...}` anywhere but a stage's model or data files, or as part of a value: refused where it stands."""
    for loc, text in _references(sourced.data):
        if len(loc) >= 3 and loc[0] == "stages" and _placed(loc[2:]):
            if not REFERENCE.fullmatch(text):
                yield sourced.diagnostic(loc, f"{text!r}: an earlier stage's output is the whole value, "
                                              f"${{stages.NAME.OUTPUT}}")
            continue
        yield sourced.diagnostic(loc, "an earlier stage's output is taken by a stage's model: (${stages.NAME.model}) "
                                      "or data files (${stages.NAME.output}) only")


def _reference(text: str, names: list[str], index: int, loc: tuple[str | int, ...]
               ) -> tuple[str | None, str | None]:
    """(the stage a `${stages.NAME.OUTPUT}` at `loc` of a stage names, or why it cannot be taken)."""
    m = REFERENCE.fullmatch(text)
    assert m is not None
    stage, output = m["stage"], m["output"]
    if stage not in names:
        return None, f"no stage '{stage}' (stages: {', '.join(names)})" + did_you_mean(stage, names)
    if names.index(stage) == index:
        return None, f"stage {stage} cannot take its own output"
    if names.index(stage) > index:
        return None, f"stage {stage} runs after this one: a stage takes the output of an earlier stage"
    wanted = "model" if loc == ("model",) else "output"
    if output == "checkpoint" and wanted == "model":
        return None, (f"verl loads a model from a Hugging Face folder, not from verl's sharded checkpoint: "
                      f"${{stages.{stage}.model}} is stage {stage}'s last checkpoint merged into one")
    if output not in OUTPUTS:
        known = ", ".join(f"${{stages.{stage}.{o}}} (a {where})" for o, where in OUTPUTS.items())
        return None, f"stage {stage} has no output '{output}'; a stage's outputs: {known}" + did_you_mean(
            output, list(OUTPUTS))
    if output != wanted:
        return None, f"${{stages.{stage}.{output}}} goes in a stage's {OUTPUTS[output]}, not here"
    return stage, None


def version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text)[:3])


def word_text(word: Word) -> str:
    """A Word as a spec writes it: variables as ${env:NAME}, a literal $ as $$."""
    return "".join(f"${{env:{p.name}}}" if isinstance(p, Var) else p.replace("$", "$$") for p in word.parts)


def composed(ir: JobIR) -> dict[str, Any]:
    """A stage's verl config as its bundle has it (the IR's YAML text)."""
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(ir.verl_config) or {}


def backend(producer: JobIR) -> str:
    """verl's merger backend for the earlier stage's checkpoint: megatron where its trainer ran Megatron."""
    tree = composed(producer)
    strategies = [((tree.get("actor_rollout_ref") or {}).get("actor") or {}).get("strategy"),
                  (tree.get("engine") or {}).get("strategy") if isinstance(tree.get("engine"), dict) else None]
    return "megatron" if "megatron" in strategies else "fsdp"


def _stage_of(ir: JobIR) -> str:
    return ir.pipeline.stage if ir.pipeline else ir.name


def take_output(part: StageSpec, loc: tuple[str | int, ...], producer: JobIR) -> StageSpec:
    """The stage with the data file at `loc` set to the file verl's generation (the earlier stage) writes: its
    data.output_path, known at build time."""
    stage = _stage_of(producer)
    if producer.trainer_module not in GENERATION:
        raise SpecError([part.sourced.diagnostic(loc, f"stage {stage} ({producer.trainer_module}) writes no file of "
                                                      f"responses: verl's generation ({' or '.join(GENERATION)}) "
                                                      f"does")])
    path = (composed(producer).get("data") or {}).get("output_path")
    if not isinstance(path, str) or "${" in path:
        raise SpecError([part.sourced.diagnostic(loc, f"stage {stage}'s data.output_path ({path!r}) is not a path "
                                                      f"verlc can know: set it in that stage's verl:")])
    data = copy.deepcopy(part.sourced.data)
    node: Any = data
    for key in loc[:-1]:
        node = node[key]
    node[loc[-1]] = path.replace("$", "$$")
    return replace(part, sourced=replace(part.sourced, data=data))


def take(part: StageSpec, producer: JobIR, torchrun: bool) -> tuple[StageSpec, StageInputIR]:
    """The stage with its model set to the earlier stage's merged model, and what its data stage merges;
    SpecError at the stage's model: where verl's code cannot give that model (`torchrun`: the earlier stage
    is one of verl's SFT trainers)."""
    at, stage = ("model",), _stage_of(producer)
    released = version(producer.verl_version)
    if released < MERGER_FROM:
        raise SpecError([part.sourced.diagnostic(at, f"verl {producer.verl_version} has no verl.model_merger (from "
                                                     f"0.4.1): merge stage {stage}'s checkpoint by hand and give the "
                                                     f"folder")])
    if torchrun and released < SFT_TRACKER_FROM:
        raise SpecError([part.sourced.diagnostic(at, f"verl {producer.verl_version}'s SFT trainer saves a Hugging "
                                                     f"Face folder per step and names none the last (from 0.5.0 it "
                                                     f"does): give stage {stage}'s global_step_N folder")])
    merged = f"{word_text(producer.checkpoint_dir)}/{MERGED}"
    stage_input = StageInputIR(
        stage=producer.name, checkpoint_dir=producer.checkpoint_dir, layout="" if torchrun else "actor",
        merger=("python3", "-m", "verl.model_merger", "merge", "--backend", backend(producer)),
        merged=parse_word(merged), latest=parse_word(f"{merged}/{LATEST}"))
    data = {**part.sourced.data, "model": f"{merged}/{LATEST}"}
    return replace(part, sourced=replace(part.sourced, data=data)), stage_input


def same_checkpoints(irs: list[tuple[StageSpec, JobIR]]) -> list[Diagnostic]:
    """Two stages saving into one checkpoint folder would resume from each other's checkpoints: refused at the
    later one."""
    seen: dict[Word, str] = {}
    problems = []
    for part, ir in irs:
        if ir.checkpoint_dir in seen:
            problems.append(part.sourced.diagnostic(("stages", part.name), (
                f"stages {seen[ir.checkpoint_dir]} and {part.name} would save checkpoints into one folder "
                f"({ir.checkpoint_dir.display}), and the later one would resume from the earlier one's: give "
                f"each its own experiment (or verl.trainer.default_local_dir)")))
        seen.setdefault(ir.checkpoint_dir, part.name)
    return problems
