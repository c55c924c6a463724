"""`verlc import`: the trainer command a launch script runs, as a spec.

Input: the commands the script started, each recorded by a stand-in while its own shell code ran (verlc/
sandbox.py), and the script's text (for line numbers). The trainer is the first `python -m MODULE` with Hydra
arguments, started directly, through `ray job submit ... -- `, or through `uv run`. Its Hydra arguments are parsed
with Hydra's own parser; what verlc derives (cluster, names, model, data) goes to the spec's own fields, every
other override under `verl:` in verl's nesting with its Hydra prefix, and anything the spec cannot hold is
written into the spec's header as a comment with its line in the script, never dropped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from io import StringIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .derive import MODEL_KEYS
from .diagnostics import Diagnostic
from .verl.program import MAIN_PPO

if TYPE_CHECKING:
    from .verl.release import Release

# Python options that take a value (python -X opt -m ...); the trainer command is `python [opts] -m MODULE`.
_PY_VALUED = {"-X", "-W", "-c"}
_OVERRIDE = re.compile(r"[+~]{0,2}[A-Za-z_][\w.\-/@]*=")
_PYTHON = re.compile(r"python(3(\.\d+)?)?")
# Hydra's own command-line options the spec has a place for (or that change nothing for a spec)
_CONFIG_OPTS = {"--config-name": "name", "-cn": "name", "--config-path": "path", "-cp": "path",
                "--config-dir": "dir", "-cd": "dir"}
# Environment names whose values are credentials: recorded by name only, under `secrets:`.
SECRET = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY|PRIVATE_KEY|CREDENTIAL)", re.I)
# Set by the shell itself, not by the script's author.
_SHELL_ENV = {"PATH", "PWD", "OLDPWD", "SHLVL", "_", "HOME", "USER", "LANG", "TMPDIR", "LC_ALL"}
# what every bundle exports itself (compiler/derive.py): the same value in the script is not repeated in the spec
_VERLC_SETS = {("PYTHONUNBUFFERED", "1")}
# what verlc derives on Ascend NPUs (compiler/derive.py npu_environment): the spec field a script's export
# becomes, or None where verlc sets it itself
_NPU_ENV = {"HCCL_CONNECT_TIMEOUT": "connect_timeout", "HCCL_EXEC_TIMEOUT": "exec_timeout",
            "ASCEND_RT_VISIBLE_DEVICES": None, "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES": None,
            "HCCL_HOST_SOCKET_PORT_RANGE": None, "HCCL_NPU_SOCKET_PORT_RANGE": None}
DEFAULT_VERSION = "0.9.1"
HCCL_PORTS = ("HCCL_HOST_SOCKET_PORT_RANGE", "HCCL_NPU_SOCKET_PORT_RANGE")  # compiler/derive.py's port plan


@dataclass(frozen=True)
class Call:
    """One command the script started, as its stand-in recorded it."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    exit: int = 0  # what the stand-in answered (a probe of another accelerator's package: 1)

    @property
    def tool(self) -> str:
        return os.path.basename(self.argv[0])


class ImportFailed(Exception):
    """The script's trainer command cannot become a spec; every reason, positioned in the script."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        super().__init__("\n".join(map(str, diagnostics)))


@dataclass(frozen=True)
class Trainer:
    """The trainer command and how the script starts it."""

    call: Call
    argv: tuple[str, ...]        # python3 -m MODULE ARGS...
    module: str
    ray_submit: dict[str, str]   # `ray job submit` options, when it submits the trainer
    launcher: str                # "python", "ray job submit", "uv run", "torchrun"
    wrappers: tuple[tuple[str, ...], ...] = ()  # what the trainer ran under: `uv run ...`, `apptainer run ... IMAGE`
    gpus: int | None = None      # torchrun's --nproc_per_node: the processes (GPUs) of each node
    nodes: int = 1               # torchrun's --nnodes (verlc adds each node's rank and the rendezvous)


@dataclass
class Imported:
    """The spec as data (in the order it is written), plus what it leaves as comments."""

    script: str
    sha256: str
    spec: dict[str, Any]
    left: list[str] = field(default_factory=list)   # "line N: what: why", the spec's header keeps them
    notes: list[str] = field(default_factory=list)  # said on stderr (and in the header)
    lines: dict[str, int] = field(default_factory=dict)  # spec path -> the script line it came from

    def text(self) -> str:
        from ruamel.yaml import YAML

        yaml = YAML()
        yaml.default_flow_style = None
        yaml.width = 100
        out = StringIO()
        yaml.dump(self.spec, out)
        head = [f"# Imported by `verlc import` from {self.script} (sha256 {self.sha256}).",
                "# The script's own shell code computed every value; review before you run it."]
        for note in self.notes:
            head.append(f"# note: {note}")
        if self.left:
            head.append("# What the script does that this spec does not hold:")
            head += [f"#   {item}" for item in self.left]
        body = "".join(line.rstrip() + "\n" for line in out.getvalue().splitlines())  # no space where flow wraps
        return "\n".join(_comment_safe(h) for h in head) + "\n" + body


def pipeline_of(parts: list[Imported], name: str) -> Imported:
    """Several imported scripts (an SFT script, then an RL script, ...) as one spec whose stages they are
    (compiler/stages.py): what they agree on at the top, each stage's own settings in it, and each later stage's
    model the stage before it's last checkpoint, merged. ImportFailed where they differ in what stages share."""
    from .spec import Stage
    from .verl.program import TORCHRUN

    own = set(Stage.model_fields)
    names: list[str] = []
    for part in parts:
        kind = "sft" if part.spec.get("program") in TORCHRUN else "rl"
        names.append(kind if kind not in names else f"{kind}{sum(n.startswith(kind) for n in names) + 1}")
    keys = list(dict.fromkeys(k for part in parts for k in part.spec))
    top: dict[str, Any] = {}
    stages: dict[str, dict[str, Any]] = {n: {} for n in names}
    problems = []
    for key in keys:
        values = [part.spec.get(key) for part in parts]
        if key in ("name", "targets"):
            continue
        if all(v == values[0] for v in values) and key != "model":
            top[key] = values[0]
        elif key in own:
            for stage, value in zip(names, values):
                if value is not None:
                    stages[stage][key] = value
        else:
            shown = ", ".join(f"{part.script}: {value!r}" for part, value in zip(parts, values))
            problems.append(Diagnostic(parts[-1].script, 1, 1, key, f"the scripts differ in {key} ({shown}): a "
                                                                    f"pipeline's stages share it; make them agree "
                                                                    f"(--set), or import each as a spec of its own"))
    if problems:
        raise ImportFailed(problems)
    notes = []
    for earlier, later, part in zip(names, names[1:], parts[1:]):
        notes.append(f"stage {later}'s model was {part.spec.get('model')!r} in {part.script}: it is now stage "
                     f"{earlier}'s last checkpoint, merged (${{stages.{earlier}.model}})")
        stages[later]["model"] = f"${{stages.{earlier}.model}}"
    if "model" not in stages[names[0]] and parts[0].spec.get("model") is not None:
        stages[names[0]]["model"] = parts[0].spec["model"]
    spec = {"name": name, "targets": ["slurm"], **top, "stages": stages}
    scripts = " then ".join(part.script for part in parts)
    return Imported(scripts, ",".join(part.sha256 for part in parts), spec,
                    [f"{part.script}: {item}" for part in parts for item in part.left],
                    list(dict.fromkeys([*(n for part in parts for n in part.notes), *notes])))


def _comment_safe(text: str) -> str:
    return text.replace("\r", "\\r").replace("\n", "\\n")


def locate(text: str, *needles: str) -> tuple[int, int]:
    """(line, column) of the first needle found in the script text, 1-based; (1, 1) when none is."""
    for needle in needles:
        if not needle:
            continue
        at = text.find(needle)
        if at >= 0:
            line = text.count("\n", 0, at) + 1
            return line, at - (text.rfind("\n", 0, at) + 1) + 1
    return 1, 1


def find_trainer(calls: tuple[Call, ...], script: str, text: str) -> Trainer:
    """The first command that starts a Hydra program; ImportFailed naming what the script started instead, or
    (at its line) a trainer started in a way verlc does not support."""
    seen: list[str] = []
    for call in calls:
        try:
            found = _trainer_in(call, call.argv, "python", {})
        except _Unsupported as exc:
            line, col = locate(text, exc.args[1])
            raise ImportFailed([Diagnostic(script, line, col, "trainer command", exc.args[0])]) from None
        if found is not None:
            return found
        seen.append(shlex.join((call.tool, *call.argv[1:4])) + (" ..." if len(call.argv) > 4 else ""))
    started = "; ".join(seen[:5]) or "none of the commands verlc records (python, ray, torchrun, uv, srun, ...)"
    raise ImportFailed([Diagnostic(script, 1, 1, "script", f"the script starts no trainer (python -m MODULE with Hydra "
                                                       f"overrides); it started: {started}")])


# apptainer's (and singularity's) `run`/`exec` options that take a value; every other option is a flag
_APPTAINER_VALUED = {"--bind", "-B", "--pwd", "--env", "--env-file", "--home", "-H", "--overlay", "-o", "--workdir",
                     "-W", "--mount", "--network", "--network-args", "--security", "--scratch", "-S", "--app",
                     "--hostname", "--nvccli", "--add-caps", "--drop-caps", "--apply-cgroups", "--dns"}


def _trainer_in(call: Call, argv: tuple[str, ...], launcher: str, submit: dict[str, str],
                wrappers: tuple[tuple[str, ...], ...] = ()) -> Trainer | None:
    tool = os.path.basename(argv[0]) if argv else ""
    if tool == "ray" and argv[1:3] == ("job", "submit"):
        options, entry = _ray_submit(argv[3:])
        return _trainer_in(call, entry, "ray job submit", options, wrappers) if entry else None
    if tool == "uv" and argv[1:2] == ("run",):
        rest = list(argv[2:])
        while rest and rest[0].startswith("-"):
            option = rest.pop(0)
            if option in ("--with", "--python", "-p", "--project", "--directory", "--extra", "--group", "--env-file",
                          "--index", "--index-url") and "=" not in option and rest:
                rest.pop(0)
        wrapper = argv[:len(argv) - len(rest)]
        return _trainer_in(call, tuple(rest), "uv run", submit, (*wrappers, wrapper)) if rest else None
    if tool in ("apptainer", "singularity") and argv[1:2] in (("run",), ("exec",)):
        i = 2
        while i < len(argv) and argv[i].startswith("-"):
            i += 2 if argv[i] in _APPTAINER_VALUED and "=" not in argv[i] else 1
        if i + 1 >= len(argv):
            return None
        return _trainer_in(call, argv[i + 1:], launcher, submit, (*wrappers, argv[:i + 1]))
    if tool == "srun":  # `srun [options] python3 -m ...` on the head node: the slurm target's own job step
        at = next((i for i, a in enumerate(argv[1:], 1) if _PYTHON.fullmatch(os.path.basename(a))
                   or os.path.basename(a) in ("ray", "uv", "torchrun", "apptainer", "singularity")), None)
        return _trainer_in(call, argv[at:], "srun", submit, wrappers) if at else None
    if tool == "torchrun":
        return _torchrun(call, argv, submit, wrappers)
    if not _PYTHON.fullmatch(tool):
        return None
    i = 1
    while i < len(argv) and argv[i] != "-m":
        if argv[i] in _PY_VALUED:
            if argv[i] == "-c":
                return None
            i += 1
        elif not argv[i].startswith("-"):
            return None  # python SCRIPT.py: not a module
        i += 1
    if i + 1 >= len(argv):
        return None
    args = argv[i + 2:]
    if not any(_OVERRIDE.match(a) or a.split("=")[0] in _CONFIG_OPTS for a in args):
        return None
    return Trainer(call, ("python3", "-m", argv[i + 1], *args), argv[i + 1], submit, launcher, wrappers)


# torchrun's options that take a value (as `--name value` or `--name=value`); every other option is a flag
_TORCHRUN_VALUED = {"--nnodes", "--nproc_per_node", "--nproc-per-node", "--rdzv_backend", "--rdzv-backend",
                    "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_id", "--rdzv-id", "--rdzv_conf", "--rdzv-conf",
                    "--master_addr", "--master-addr", "--master_port", "--master-port", "--node_rank", "--node-rank",
                    "--max_restarts", "--max-restarts", "--monitor_interval", "--monitor-interval", "--log_dir",
                    "--log-dir", "--redirects", "-r", "--tee", "-t", "--local_addr", "--local-addr"}


def _torchrun(call: Call, argv: tuple[str, ...], submit: dict[str, str],
              wrappers: tuple[tuple[str, ...], ...]) -> Trainer | None:
    """`torchrun [options] -m MODULE overrides`: verl's SFT trainer, one process per GPU of each of --nnodes
    nodes (verlc starts it so; the script's rendezvous options are verlc's to set: the runtime's node hosts it);
    an elastic range of nodes is refused at torchrun's line."""
    options: dict[str, str] = {}
    i = 1
    while i < len(argv) and argv[i] != "-m" and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if name in _TORCHRUN_VALUED and not eq:
            value, i = (argv[i + 1] if i + 1 < len(argv) else ""), i + 1
        options[name.replace("-", "_").lstrip("_")] = value
        i += 1
    if i + 1 >= len(argv) or argv[i] != "-m":
        return None  # torchrun SCRIPT.py: not a module
    module, args = argv[i + 1], argv[i + 2:]
    if not any(_OVERRIDE.match(a) or a.split("=")[0] in _CONFIG_OPTS for a in args):
        return None
    nodes = options.get("nnodes", "1")
    low, _, high = nodes.partition(":")
    if not low.isdigit() or high not in ("", low):
        raise _Unsupported(f"torchrun --nnodes={nodes or '(empty)'}: verlc starts torchrun on a fixed number of "
                           f"nodes (cluster.nodes; an elastic range is not supported; where the script computes "
                           f"it from something it could not see here, set the variable: verlc import --set "
                           f"NAME=VALUE)", "torchrun")
    gpus = options.get("nproc_per_node", "")
    if not gpus.isdigit():
        raise _Unsupported(f"torchrun --nproc_per_node={gpus or '(not given)'}: verlc needs the number of GPUs "
                           f"(the script computes it from something it could not see here; set the variable: "
                           f"verlc import --set NAME=VALUE)", "torchrun")
    return Trainer(call, ("python3", "-m", module, *args), module, submit, "torchrun", wrappers, int(gpus), int(low))


class _Unsupported(Exception):
    """(message, the word to find its line by): a launcher verlc does not support."""


def _ray_submit(words: tuple[str, ...]) -> tuple[dict[str, str], tuple[str, ...]]:
    """`ray job submit` options (long names, values as given) and the entrypoint's words."""
    options: dict[str, str] = {}
    flags = {"--no-wait", "--verify", "-v", "--verbose"}
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return options, _entry(words[i + 1:])
        if not word.startswith("-"):
            return options, _entry(words[i:])
        if "=" in word:
            key, value = word.split("=", 1)
            options[key] = value
        elif word in flags or i + 1 == len(words):
            options[word] = ""
        else:
            options[word] = words[i + 1]
            i += 1
        i += 1
    return options, ()


def _entry(words: tuple[str, ...]) -> tuple[str, ...]:
    # `ray job submit -- "python3 -m ..."`: one word that Ray hands to a shell
    return tuple(shlex.split(words[0])) if len(words) == 1 and " " in words[0] else words


# --- the spec ----------------------------------------------------------------------------------------

def to_spec(trainer: Trainer, base_env: dict[str, str], script: str, text: str, *, verl_version: str,
            version_note: str | None, verl_commit: str | None, code: str, name: str,
            accelerator: str = "cuda", checkout: Path | None = None, checkout_as: str = "") -> Imported:
    """The spec the trainer command means; `code`: the folder the script ran from, as the spec names it; `checkout`:
    the verl checkout that holds `verl_commit` (`checkout_as`: as the spec names it). ImportFailed
    when the arguments cannot be read (Hydra's parser refuses them, a sweep, a value the spec needs cannot be
    derived)."""
    from .verl.hydra import parse

    imported = Imported(script, hashlib.sha256(text.encode()).hexdigest(), {})
    problems: list[Diagnostic] = []

    def where(*needles: str) -> tuple[int, int]:
        return locate(text, *needles, f"-m {trainer.module}", trainer.module)

    def problem(message: str, *needles: str, path: str = "") -> None:
        line, col = where(*needles)
        problems.append(Diagnostic(script, line, col, path or "trainer command", message))

    def leave(what: str, why: str, *needles: str) -> None:
        imported.left.append(f"line {where(*needles)[0]}: {what}: {why}")

    config: dict[str, str] = {}
    overrides: list[str] = []
    args = list(trainer.argv[3:])
    while args:
        arg = args.pop(0)
        option, eq, value = arg.partition("=")
        if option in _CONFIG_OPTS:
            if not eq:
                value = args.pop(0) if args else ""
            config[_CONFIG_OPTS[option]] = value
        elif arg.startswith("-"):
            leave(json.dumps(arg), "a command-line option of Hydra's the spec has no place for", arg)
        else:
            overrides.append(arg)
    try:
        parsed = parse(overrides)
    except ValueError as exc:
        bad = str(exc).split("\n", 1)[0]
        problem(f"Hydra cannot parse the trainer's overrides: {bad}")
        raise ImportFailed(problems) from None

    spec: dict[str, Any] = {"name": name}
    submitted = trainer.launcher == "ray job submit"  # to a running Ray cluster; else the script starts Ray itself
    spec["targets"] = ["ray-job"] if submitted else ["slurm", "ray-job"]
    if verl_commit:
        spec["verl_commit"] = verl_commit
        if checkout is not None:
            spec["verl_checkout"] = checkout_as
    else:
        spec["verl_version"] = verl_version
    if version_note:
        imported.notes.append(version_note)
    if trainer.module != MAIN_PPO:
        spec["program"] = trainer.module
    hydra: dict[str, Any] = {}
    name_given = config.get("name", "")
    if name_given:
        hydra["config_name"] = name_given.removesuffix(".yaml")
    for option in ("path", "dir"):
        given = config.get(option)
        if not given or option == "path" and _default_config_path(trainer.module, given, trainer.call.cwd):
            continue
        # Hydra: --config-path is absolute or relative to the file that declares @hydra.main (the program's
        # module), --config-dir absolute or relative to the working folder
        base = Path(trainer.call.cwd) / (Path(trainer.module.replace(".", "/")).parent if option == "path" else "")
        folder = os.path.relpath(os.path.normpath(base / given), trainer.call.cwd)
        if folder.startswith(".."):
            problem(f"--config-{option} {given} is outside the folder the script runs from ({trainer.call.cwd}); "
                    f"the job runs in the run's code: run verlc import from a folder that holds the configs",
                    f"--config-{option}", path="hydra.config_dir")
        hydra["config_dir"] = folder  # searched after the program's own folder: the same config for any other name

    verl: dict[str, Any] = {}
    values: dict[str, Any] = {}
    groups = set(spec_release(verl_commit, verl_version, checkout).groups) - {"model_engine"}  # `NAME=OPTION` picks one
    under_code: list[str] = []  # keys whose value named a file under the folder the script ran from
    for o in parsed:
        needle = o.text.split("=", 1)[0] + "="
        relative = _under(o.value, trainer.call.cwd, base_env.get("HOME", ""))
        if relative != o.value and not o.key.startswith("hydra."):
            o = dataclasses.replace(o, value=relative)
            under_code.append(o.key)
        if o.sweep:
            problem(f"{o.text}: a Hydra sweep (multirun); a spec sweeps with `sweep:`", needle, path=o.key)
        elif o.delete:
            leave(json.dumps(o.text), "Hydra's `~` deletes a key; verlc refuses deletions (verl reads every key "
                                      "of its config)", needle)
        elif o.key.startswith("hydra."):
            if o.key == "hydra.searchpath" and isinstance(o.value, list):
                hydra["searchpath"] = [*hydra.get("searchpath", []), *o.value]
            else:
                leave(json.dumps(o.text), "Hydra's own setting (the run folder and logging of Hydra itself)", needle)
        elif o.package is not None or "/" in o.key or (o.key in groups and isinstance(o.value, str) and not o.prefix):
            # a config group's choice (`engine=fsdp` of verl's SFT trainer; model_engine is verl.model_engine)
            hydra.setdefault("groups", {})[o.key + (f"@{o.package}" if o.package else "")] = o.value
        elif o.prefix == "" and o.key in DERIVED:
            values[o.key] = o.value
            imported.lines.setdefault(DERIVED[o.key], where(needle)[0])
        elif _put(verl, o.key, o.prefix, o.value):
            imported.lines["verl." + o.key] = where(needle)[0]
        else:
            problem(f"{o.text}: a key below one the script sets to a value (Hydra refuses it too)", needle,
                    path=f"verl.{o.key}")
    if trainer.module.split(".")[0] != "verl" or "config_dir" in hydra or under_code:
        spec["code"] = code  # the folder the script ran from: the job's working dir
    if under_code:
        imported.notes.append(f"{', '.join(under_code)}: a path under the folder the script ran from "
                              f"({trainer.call.cwd}), written relative to it: the run's code (code: {code})")
    if hydra:
        spec["hydra"] = hydra
    defaults = config_defaults(trainer.module, hydra, verl_commit, verl_version, trainer.call.cwd, checkout)
    _derived_fields(spec, values, defaults, verl, base_env, imported, leave, problem)
    spec["verl"] = verl
    if trainer.gpus is not None:  # torchrun's own counts: nodes, a process per GPU of each
        values.update({"trainer.nnodes": trainer.nodes, "trainer.n_gpus_per_node": trainer.gpus})
    _cluster(spec, values, defaults, verl, problem, accelerator)
    if not submitted:  # the script's own #SBATCH lines
        _slurm(spec, text, imported, leave)
    _environment(spec, trainer, base_env, imported, leave)
    _wrappers(spec, trainer, code, imported, leave)
    if trainer.launcher == "ray job submit":
        address = trainer.ray_submit.get("--address") or trainer.call.env.get("RAY_ADDRESS")
        _ray(spec, {**trainer.ray_submit, **({"--address": address} if address else {})}, trainer.call.cwd, leave)
    if problems:
        raise ImportFailed(problems)
    imported.spec = spec
    return imported


def _under(value: Any, cwd: str, home: str) -> Any:
    """`value` with each path to a file or folder of the folder the script ran from (a script's
    `$(pwd)/examples/...`) made relative to it, where the job runs it from the run's code. Left as it is: a path
    to nothing there yet (verl reads it only when it runs), one that leads out of the folder (a link), and one
    under a $HOME nearer than the folder (it stays `${env:HOME}/...`)."""
    if isinstance(value, list):
        return [_under(v, cwd, home) for v in value]
    root = cwd.rstrip("/")
    if not (isinstance(value, str) and root and value.startswith(root + "/") and os.path.exists(value)):
        return value
    if home and value.startswith(home.rstrip("/") + "/") and len(home.rstrip("/")) >= len(root):
        return value
    if not os.path.realpath(value).startswith(os.path.realpath(root) + "/"):
        return value
    return value[len(root) + 1:]


def _wrappers(spec: dict[str, Any], trainer: Trainer, code: str, imported: Imported, leave: Any) -> None:
    """What the trainer ran under: an apptainer image becomes the spec's container (its binds and working
    folder); the rest (uv's environment, apptainer's other options) is listed, since verlc starts python3 itself
    in the spec's container or venv."""
    for wrapper in trainer.wrappers:
        wrapper = (os.path.basename(wrapper[0]), *wrapper[1:])  # the tool's name, not its stand-in's path
        shown = shlex.join(wrapper)
        if wrapper[0] in ("apptainer", "singularity"):
            options, image = wrapper[2:-1], wrapper[-1]
            binds, pwd, other, i = [], None, [], 0
            while i < len(options):
                option, value = options[i].split("=", 1) if "=" in options[i] else (options[i], None)
                if option in _APPTAINER_VALUED and value is None and i + 1 < len(options):
                    i, value = i + 1, options[i + 1]
                if option in ("--bind", "-B"):
                    binds += [b if ":" in b else f"{b}:{b}" for b in (value or "").split(",") if b]
                elif option == "--pwd":
                    pwd = value
                elif option not in ("--nv", "--rocm"):  # the accelerator's flag: verlc adds it from the spec
                    other.append(option + (f" {value}" if value is not None else ""))
                i += 1
            container: dict[str, Any] = {"runtime": "apptainer", "image": image, "workdir": pwd or code}
            if binds:
                container["mounts"] = binds
            spec["container"] = container
            imported.notes.append(f"the trainer ran in an apptainer container ({shown}): container: is that "
                                  f"image{', its binds' if binds else ''} and "
                                  f"{'its --pwd' if pwd else 'the folder the script ran from'}, on every node")
            for option in other:
                leave(f"{wrapper[0]} {wrapper[1]} {option}", "an apptainer option verlc does not pass (it runs "
                      "`apptainer exec` with the container's binds, working folder and the accelerator's flag)",
                      wrapper[0])
        else:
            leave(shown, "the trainer ran under uv; verlc starts python3 itself, from the container's or "
                  "container.venv's environment: make uv's environment that one (e.g. uv sync, then "
                  "container: {runtime: none, venv: .venv})", wrapper[0])


# the overrides verlc derives from the spec's own fields -> those fields
DERIVED = {"trainer.nnodes": "cluster.nodes", "trainer.n_gpus_per_node": "cluster.gpus_per_node",
           "trainer.project_name": "project", "trainer.experiment_name": "experiment",
           "actor_rollout_ref.model.path": "model", "critic.model.path": "model",
           "model.path": "model", "model.partial_pretrain": "model",  # verl's SFT trainers
           "data.train_files": "data.train_files", "data.val_files": "data.val_files"}


def _default_config_path(module: str, path: str, cwd: str) -> bool:
    """Whether --config-path names the program's own config folder (`config` beside verl's trainer)."""
    folder = Path(module.replace(".", "/")).parent
    given = Path(path)
    return given.parts == ("config",) or \
        os.path.normpath(given if given.is_absolute() else Path(cwd) / given) == os.path.normpath(
            Path(cwd) / folder / "config")


def _put(tree: dict[str, Any], key: str, prefix: str, value: Any) -> bool:
    """Set key (dotted) in the nested tree, its last part with Hydra's prefix; False when a key above it holds a
    value, not a mapping (the script set both)."""
    *parents, last = key.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return False
    node[prefix + last] = value
    return True


def _home(text: str, home: str) -> str:
    """A path under the sandbox's HOME as ${env:HOME}/..., the rest with `$` escaped for verlc's words."""
    escaped = text.replace("$", "$$")
    if home and (text == home or text.startswith(home.rstrip("/") + "/")):
        return "${env:HOME}" + escaped[len(home.rstrip("/").replace("$", "$$")):]
    return escaped


def spec_release(commit: str | None, version: str, checkout: Path | None = None) -> Release:
    """The release (or commit, read from `checkout` if verlc has no schema of it yet) the imported spec names;
    verlc's default release where verlc cannot read it (the compile then says why)."""
    from .verl.commit import CommitError, commit_release
    from .verl.release import RELEASES, snapshot

    try:
        return commit_release(commit, checkout) if commit else snapshot(version if version in RELEASES
                                                                    else DEFAULT_VERSION)
    except CommitError:
        return snapshot(DEFAULT_VERSION)


def config_defaults(module: str, hydra: dict[str, Any], commit: str | None, version: str, cwd: str,
                    checkout: Path | None = None) -> dict[str, Any]:
    """What the config the trainer composes says for the keys verlc derives from a spec's own fields (DERIVED):
    verl's ppo_trainer.yaml, or a program's own config (DAPO's names its W&B project). A key that config leaves
    empty, or a config that cannot be composed here (the compile then says why), gets ppo_trainer's value."""
    from .verl.program import ProgramError, resolve
    from .verl.release import DEFAULT_CONFIG

    def lookup(tree: Any, key: str) -> Any:
        for part in key.split("."):
            tree = tree.get(part) if isinstance(tree, dict) else None
        return None if tree == "???" else tree

    release = spec_release(commit, version, checkout)
    base = release.tree(DEFAULT_CONFIG, release.default_engine(DEFAULT_CONFIG)) \
        if DEFAULT_CONFIG in release.configs else {}
    try:
        program = resolve(module, hydra.get("config_name"), release, code=Path(cwd), verl_source=None,
                          config_dir=hydra.get("config_dir"))
        own = program.release.tree(program.config_name, program.release.default_engine(program.config_name))
    except (ProgramError, KeyError):
        own = base
    return {key: value if (value := lookup(own, key)) is not None else lookup(base, key) for key in DERIVED}


def _derived_fields(spec: dict[str, Any], values: dict[str, Any], defaults: dict[str, Any], verl: dict[str, Any],
                    base_env: dict[str, str], imported: Imported, leave: Any, problem: Any) -> None:
    home = base_env.get("HOME", "")
    model_key = next((k for k in MODEL_KEYS if k in values), MODEL_KEYS[0])  # PPO's actor, or an SFT program's
    for key in ("trainer.project_name", "trainer.experiment_name", model_key, "data.train_files", "data.val_files"):
        if key not in values:
            values[key] = defaults[key]
            imported.notes.append(f"the script leaves {key} to its config's default ({defaults[key]}); the spec "
                                  f"says it")
    spec["project"] = str(values["trainer.project_name"])
    spec["experiment"] = str(values["trainer.experiment_name"])
    model = str(values[model_key])
    spec["model"] = _home(model, home)
    critic = values.get("critic.model.path")
    if critic is not None and str(critic) != model:
        leave(f"critic.model.path={critic}", "a critic model other than the actor's: verlc starts both from "
                                             "`model`", "critic.model.path=")
    data: dict[str, Any] = {}
    for part in ("train_files", "val_files"):
        files = values[f"data.{part}"]
        files = files if isinstance(files, list) else [files]
        if not files or not all(isinstance(f, str) and f for f in files):
            problem(f"data.{part} is {files!r} in the command the script runs: verlc needs the parquet files",
                    f"data.{part}=", path=f"data.{part}")
        data[part] = [_home(f, home) for f in files if isinstance(f, str)]
    spec["data"] = data
    checkpoint = verl.get("trainer", {}).get("default_local_dir")
    if isinstance(checkpoint, str):
        verl["trainer"]["default_local_dir"] = _home(checkpoint, home).replace("$$", "$")  # verl's own value


def _cluster(spec: dict[str, Any], values: dict[str, Any], defaults: dict[str, Any], verl: dict[str, Any],
             problem: Any, accelerator: str = "cuda") -> None:
    counts = {}
    for key, field_ in (("trainer.nnodes", "nodes"), ("trainer.n_gpus_per_node", "gpus_per_node")):
        value = values.get(key, defaults[key])
        if isinstance(value, bool) or not isinstance(value, int):
            problem(f"{key} is {value!r} in the command the script runs: verlc needs a number (the script "
                    f"computes it from something it could not see here; set the variable: verlc import "
                    f"--set NAME=VALUE)", key + "=", path=f"cluster.{field_}")
            value = 1
        counts[field_] = value
    pool = verl.get("rollout")
    if isinstance(pool, dict) and isinstance(pool.get("n_gpus_per_node"), int):
        counts["gpus_per_node"] += pool["n_gpus_per_node"]  # verlc gives the trainer the rest of each node
    trainer = verl.get("trainer")
    if isinstance(trainer, dict) and trainer.get("device") == "npu":  # an Ascend script: verlc sets the device
        counts["accelerator"] = trainer.pop("device")
    elif accelerator != "cuda":  # the host the import answered the script's probes as
        counts["accelerator"] = accelerator
    spec["cluster"] = counts


# #SBATCH options -> cluster.slurm fields (long and short spellings)
_SBATCH = {"--cpus-per-task": "cpus_per_task", "-c": "cpus_per_task", "--mem": "mem", "--time": "time",
           "-t": "time", "--partition": "partition", "-p": "partition", "--account": "account", "-A": "account",
           "--qos": "qos", "-q": "qos", "--output": "output", "-o": "output", "--error": "error", "-e": "error",
           "--exclude": "exclude", "-x": "exclude", "--nodelist": "nodelist", "-w": "nodelist"}
# what verlc derives for sbatch itself (from cluster.nodes and gpus_per_node, the spec's name)
_SBATCH_DERIVED = {"--nodes", "-N", "--ntasks-per-node", "--gpus-per-node", "--gres", "--job-name", "-J",
                   "--ntasks", "-n", "--exclusive"}
CPUS_PER_GPU = 8  # cluster.slurm.cpus_per_task when the script has no #SBATCH --cpus-per-task


def _slurm(spec: dict[str, Any], text: str, imported: Imported, leave: Any) -> None:
    """cluster.slurm from the script's own #SBATCH lines."""
    slurm: dict[str, Any] = {}
    for number, option, value in _sbatch_options(text):
        if option in _SBATCH:
            imported.lines[f"cluster.slurm.{_SBATCH[option]}"] = number
            slurm[_SBATCH[option]] = int(value) if option in ("-c", "--cpus-per-task") and value.isdigit() else value
        elif option not in _SBATCH_DERIVED:
            imported.left.append(f"line {number}: #SBATCH {option}{'=' + value if value else ''}: a directive "
                                 f"cluster.slurm has no field for")
    if "cpus_per_task" not in slurm:
        slurm["cpus_per_task"] = CPUS_PER_GPU * spec["cluster"]["gpus_per_node"]
        imported.notes.append(f"cluster.slurm.cpus_per_task {slurm['cpus_per_task']} ({CPUS_PER_GPU} per GPU) is a "
                              f"guess: the script has no #SBATCH --cpus-per-task; set your nodes' CPUs")
    spec["cluster"]["slurm"] = {k: slurm[k] for k in sorted(slurm)}


# What a launch script exports for its own Ray bring-up (the head's address, the rendezvous): verlc's bundles bring
# up Ray themselves, so these describe the script's cluster, not the run.
_BRING_UP = {"ip_head", "head_node", "head_node_ip", "head_ip", "RAY_HEAD_IP", "RAY_HEAD_ADDRESS", "MASTER_ADDR",
             "MASTER_PORT"}

# #SBATCH options -> the variables Slurm sets in the job from them (what `verlc import` gives a Slurm script)
_SBATCH_ENV = {"--nodes": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"), "-N": ("SLURM_NNODES", "SLURM_JOB_NUM_NODES"),
               "--gpus-per-node": ("SLURM_GPUS_PER_NODE",), "--cpus-per-task": ("SLURM_CPUS_PER_TASK",),
               "-c": ("SLURM_CPUS_PER_TASK",), "--ntasks-per-node": ("SLURM_NTASKS_PER_NODE",),
               "--job-name": ("SLURM_JOB_NAME",), "-J": ("SLURM_JOB_NAME",)}


def sbatch_environment(text: str) -> dict[str, str]:
    """The Slurm variables a script's own #SBATCH lines make Slurm set in its job (SLURM_NNODES from --nodes=2,
    SLURM_GPUS_PER_NODE from --gpus-per-node=a100:4 as 4, ...); a range of nodes (2-4) gives its first number."""
    out: dict[str, str] = {}
    for _, option, value in _sbatch_options(text):
        for name in _SBATCH_ENV.get(option, ()):
            if option in ("--nodes", "-N"):
                value = value.split("-")[0]
            if option == "--gpus-per-node":
                value = value.rsplit(":", 1)[-1]
            out[name] = value
    return out


def _sbatch_options(text: str) -> Iterator[tuple[int, str, str]]:
    """(line, option, value) of each `#SBATCH` line's options, in either spelling (--nodes=2, --nodes 2, -N 2)."""
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("#SBATCH"):
            continue
        words = shlex.split(line[len("#SBATCH"):], comments=True) if line[7:8].isspace() else []
        i = 0
        while i < len(words):
            option, eq, value = words[i].partition("=")
            if not eq and option.startswith("-") and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value, i = words[i + 1], i + 1
            i += 1
            yield number, option, value


def _environment(spec: dict[str, Any], trainer: Trainer, base_env: dict[str, str], imported: Imported,
                 leave: Any) -> None:
    env: dict[str, str] = {}
    secrets: list[str] = []
    for name, value in sorted(trainer.call.env.items()):
        if name == "PATH" and value != base_env.get("PATH"):
            leave("export PATH", "the nodes' PATH is their own (the container's, or container.venv)",
                  "PATH=")
        if name in _SHELL_ENV or base_env.get(name) == value or (name, value) in _VERLC_SETS or \
                name == "RAY_ADDRESS" and trainer.launcher == "ray job submit":  # ray.address
            continue
        if name in _BRING_UP:
            leave(f"export {name}", "the script's own Ray bring-up: verlc's bundle brings up Ray itself", f"{name}=")
            continue
        if name in HCCL_PORTS and value == "auto":  # HCCL picks them: verlc's port plan leaves them out
            env[name] = value
        elif spec["cluster"].get("accelerator") == "npu" and name in _NPU_ENV:
            field = _NPU_ENV[name]
            if field and value.isdigit() and int(value) > 0:
                spec.setdefault("network", {}).setdefault("hccl", {})[field] = int(value)
            else:
                leave(f"export {name}", "verlc sets it on Ascend NPUs (every NPU of the node visible, HCCL's ports "
                                        "from the job's own block)" if not field else
                      f"network.hccl.{field} takes whole seconds", f"{name}=")
        elif SECRET.search(name):
            secrets.append(name)
        elif "\n" in value or len(value) > 4096:
            leave(f"export {name}", "a value the spec cannot hold (a newline, or over 4096 characters)",
                  f"{name}=")
        else:
            env[name] = value.replace("$", "$$") if "${" in value else value
    if env:
        spec["env"] = env
    if secrets:
        spec["secrets"] = secrets


def _ray(spec: dict[str, Any], options: dict[str, str], cwd: str, leave: Any) -> None:
    """ray.address and the working dir from `ray job submit`'s options; its runtime env's variables."""
    ray: dict[str, Any] = {}
    for option, value in options.items():
        if option == "--address":
            ray["address"] = value
        elif option == "--working-dir":
            ray["working_dir"] = value
        elif option in ("--runtime-env-json", "--runtime-env"):
            runtime = _runtime_env(option, value, cwd)
            if not isinstance(runtime, dict):
                leave(f"ray job submit {option} {value}", runtime or "not a mapping", option)
                continue
            for name, env_value in sorted((runtime.get("env_vars") or {}).items()):
                if SECRET.search(name):
                    spec.setdefault("secrets", []).append(name)
                else:
                    spec.setdefault("env", {})[name] = str(env_value)
            if "working_dir" in runtime:
                ray["working_dir"] = runtime["working_dir"]
            for key in sorted(set(runtime) - {"env_vars", "working_dir"}):
                leave(f"runtime_env {key}: {json.dumps(runtime[key])}", "verlc's ray-job bundle writes its own "
                      "runtime env (the working dir and env); what else the job needs belongs in the cluster's "
                      "image", option)
        elif option not in ("--no-wait", "--submission-id", "--job-id", "-v", "--verbose"):
            leave(f"ray job submit {option} {value}".rstrip(), "an option the ray-job bundle sets itself or "
                                                                  "does not take", option)
    working = ray.pop("working_dir", None)
    if working is not None:
        if "code" in spec and os.path.normpath(Path(cwd) / working) == os.path.normpath(cwd):
            pass  # the folder the script runs from: the spec's code, which is the job's working dir
        elif "code" in spec:
            leave(f"ray job submit --working-dir {working}", "the job's working dir is the run's code (code:), "
                                                             "the folder the script runs from", "--working-dir")
        else:
            ray["working_dir"] = working
    if ray:
        spec["ray"] = ray


def _runtime_env(option: str, value: str, cwd: str) -> dict[str, Any] | str:
    """`ray job submit`'s runtime env: inline JSON, or a YAML file (relative to the script's folder); else why
    it cannot be read."""
    if option == "--runtime-env-json":
        try:
            return json.loads(value)
        except ValueError:
            return "not JSON"
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        return YAML(typ="safe").load((Path(cwd) / value).read_text())
    except (OSError, YAMLError, UnicodeDecodeError) as exc:
        return f"cannot read it: {' '.join(str(exc).split())[:200]}"
