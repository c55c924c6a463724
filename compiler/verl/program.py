"""The program a job starts and the Hydra config it composes, as Hydra composes it for that module.

verl's main_ppo composes verl's own trainer configs, which the release's (or commit's) schema holds. Any
other Ray driver program (a recipe's `recipe.dapo.main_dapo`, verl's experimental programs) names its
config with `@hydra.main(config_path=..., config_name=...)` in its own source; that config usually lists
verl's `ppo_trainer` in its defaults list (found through its `hydra.searchpath`) and adds keys of its own.

This module reads the program's source with `ast` (never imports it) and composes its config the way
Hydra does for a primary config: the defaults list in order, `_self_` where it stands (last when absent),
mappings merged key by key, other values replaced. verl's own trainer config comes from the schema (one
tree per model_engine choice); `_target_` classes the program's config names are read from its code with
`ast`, their verl base classes from the schema. What the composition cannot decide (a config group choice
in the program's defaults list) is a note, and verlc leaves the keys below it to Hydra.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..diagnostics import did_you_mean
from .release import DEFAULT_CONFIG, ENGINE_KEY, DataClass, Release

MAIN_PPO = "verl.trainer.main_ppo"
# verl's own programs that set up torch.distributed themselves and never start Ray, so torchrun starts one
# process per GPU (read from each release's code: fsdp_sft_trainer to 0.7.0, sft_trainer from 0.6.0;
# tests/test_verl_releases.py checks the list against every release's own modules)
TORCHRUN = ("verl.trainer.fsdp_sft_trainer", "verl.trainer.sft_trainer")
# verl's own Ray programs with configs of their own (not main_ppo's) that verlc builds: generation (prompts in
# data.path, responses into data.output_path) and evaluation (the scores of such a file's responses)
RAY_PROGRAMS = ("verl.trainer.main_generation", "verl.trainer.main_eval")
# verl's generation: prompts in, the responses written to data.output_path. main_generation (to 0.6.1) has a config
# of its own; main_generation_server (0.6.0 on) composes main_ppo's ppo_trainer but trains nothing: it starts the
# rollout's servers, reads only the prompts (data.prompt_key) of data.train_files, and writes data.output_path,
# a key ppo_trainer lacks (tests/test_verl_releases.py reads these from each release's code)
GENERATION_SERVER = "verl.trainer.main_generation_server"
GENERATION = ("verl.trainer.main_generation", GENERATION_SERVER)


def saves_checkpoints(program: str) -> bool:
    """Whether the program saves checkpoints at all: verl's generation and evaluation train nothing."""
    return program not in (*GENERATION, *RAY_PROGRAMS)
VERL_CONFIG = ("verl", "trainer", "config")  # where verl's own trainer configs live in a checkout


def own_config(module: str, release: Release) -> str | None:
    """The config of one of verl's own programs whose config is not main_ppo's (SFT, evaluation, generation),
    where `module` is one of them in `release`."""
    name = release.programs.get(module)
    return name if name in release.program_configs else None


class ProgramError(Exception):
    """The program or its config cannot be found or read; `where` names the spec key to blame."""

    def __init__(self, message: str, where: tuple[str, ...] = ("program",)) -> None:
        super().__init__(message)
        self.where = where


@dataclass(frozen=True)
class Program:
    """One program's config, composed: the release with that config as its primary one."""

    module: str
    source: Path | None           # the module's file (None: verl's main_ppo, known from the schema)
    config_dir: Path | None       # its @hydra.main config folder
    config_name: str
    release: Release
    notes: tuple[str, ...] = ()   # what the composition could not decide
    unchecked: tuple[str, ...] = ()  # packages (dotted) whose keys only Hydra can judge


def module_file(module: str, roots: list[Path]) -> Path | None:
    """The file `python3 -m module` runs, in the first root that has it."""
    parts = module.split(".")
    for root in roots:
        for candidate in (root.joinpath(*parts).with_suffix(".py"), root.joinpath(*parts, "__main__.py")):
            if candidate.is_file():
                return candidate
    return None


def runs_validate_config(tree: ast.Module) -> bool:
    """Whether the program calls verl's validate_config (main_ppo's consistency checks) by that name."""
    return any(isinstance(node, ast.Call) and _dotted(node.func).split(".")[-1] == "validate_config"
               for node in ast.walk(tree))


def parsed(source: Path) -> ast.Module:
    try:
        return ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise ProgramError(f"cannot read {source}: {exc}") from None


def hydra_main(source: Path, tree: ast.Module) -> tuple[str | None, str | None]:
    """(config_path, config_name) of the module's `@hydra.main(...)`; ProgramError when it has none."""
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if isinstance(deco, ast.Call) and _dotted(deco.func) in ("hydra.main", "main"):
                args = {k.arg: k.value for k in deco.keywords if k.arg}
                positional = dict(zip(("config_path", "config_name"), deco.args))
                found = {**positional, **args}
                return _constant(found.get("config_path")), _constant(found.get("config_name"))
    raise ProgramError(f"{source} has no @hydra.main(...): verlc starts Ray driver programs that compose a "
                       f"Hydra config, like verl's main_ppo")


def resolve(module: str, config_name: str | None, release: Release, *, code: Path | None,
            verl_source: Path | None, config_dir: str | None = None) -> Program:
    """The program's composed config over `release`. `code`: the run's code folder (the job's working
    directory); `verl_source`: a folder holding verl's package source at the spec's commit, if any;
    `config_dir`: Hydra's --config-dir, a folder of configs (relative to `code`) searched after the program's."""
    extra = (code or Path.cwd()) / config_dir if config_dir is not None else None
    if extra is not None and not extra.is_dir():
        raise ProgramError(f"no folder {extra}", ("hydra", "config_dir"))
    if module == MAIN_PPO:
        name = config_name or DEFAULT_CONFIG
        if extra is None or name in release.configs:  # Hydra looks in the program's own folder first
            return Program(module, None, None, name, release)
        return _compose_program(module, None, extra, name, release, code, [], validated=True, verl_main=True)
    if module in release.programs and verl_source is None and config_name in (None, release.programs[module]):
        # one of verl's own programs (SFT, evaluation, generation): its config as the release composes it
        name = release.programs[module]
        own = {name: release.program_configs[name]} if name in release.program_configs else {name: release.configs[name]}
        return Program(module, None, None, name, replace(release, configs=own, primary=name, validated=False))
    roots = [r for r in (code,) if r is not None]
    if module.split(".")[0] == "verl" and verl_source is not None:
        roots.append(verl_source)
    source = module_file(module, roots)
    if source is None:
        where = "the run's code" if code else "no code folder"
        looked = ", ".join(str(r) for r in roots) or "nowhere"
        ours = module.startswith("verl.") and verl_source is None
        if ours and release.commit is not None:  # the spec pins a commit already: it lacks the program
            hint = (f"; verl at {release.commit[:12]} has no such program (its programs: "
                    f"{', '.join(sorted(release.programs)) or 'none'})")
        else:
            hint = ("; verl's own programs are read from its source: pin verl_commit" if ours
                    else "; name the folder of the run's code in `code:`" if code is None else "")
        raise ProgramError(f"cannot find {module} ({where}; looked in {looked}){hint}")
    tree = parsed(source)
    path, name = hydra_main(source, tree)
    validated = runs_validate_config(tree)
    config_dir = (source.parent / (path or ".")).resolve()
    name = config_name or name
    if name is None:
        raise ProgramError(f"{module}'s @hydra.main names no config_name: set hydra.config_name",
                           ("hydra", "config_name"))
    if extra is not None and not (config_dir / f"{name}.yaml").is_file():
        config_dir = extra
    if any(config_dir == (root / "verl" / "trainer" / "config").resolve() for root in roots) \
            and name in release.configs:
        # verl's own trainer configs, in the run's verl checkout (a recipe's `--config-path=../../verl/trainer/
        # config`): the release's own composition of that config, as main_ppo's
        return Program(module, source, config_dir, name, replace(release, primary=name, validated=validated))
    return _compose_program(module, source, config_dir, name, release, code, roots, validated=validated,
                            named=config_name is not None)


def _compose_program(module: str, source: Path | None, config_dir: Path, name: str, release: Release,
                     code: Path | None, roots: list[Path], *, validated: bool, named: bool = True,
                     verl_main: bool = False) -> Program:
    """Compose `config_dir/name.yaml` over the release (verl_main: the program's own config folder is verl's
    trainer config, which Hydra searches first)."""
    file = config_dir / f"{name}.yaml"
    if not file.is_file():
        have = sorted(p.stem for p in config_dir.glob("*.yaml")) if config_dir.is_dir() else []
        raise ProgramError(f"{module} has no config '{name}' in {config_dir} (it has {', '.join(have) or 'none'})"
                           + did_you_mean(name, have), ("hydra", "config_name") if named else ("program",))
    composer = _Composer(release, code, verl_main)
    trees = composer.compose(file, [])
    classes, targets, class_notes = _program_classes(composer.targets, release, roots)
    default_engine = composer.default_engine() if composer.used_verl else ""
    if not composer.used_verl:
        trees = {"": trees[""]}
    program_release = replace(release, configs={name: (default_engine, trees)}, primary=name,
                              classes={**release.classes, **classes}, targets={**release.targets, **targets},
                              unchecked=tuple(composer.unchecked), validated=validated)
    notes = [*composer.notes, *class_notes]
    if not validated:
        notes.append(f"note: {module} does not run verl's validate_config: verlc checks its keys, types and "
                     f"mandatory values, and leaves the consistency rules main_ppo applies to the program")
    return Program(module, source, config_dir, name, program_release, tuple(notes), tuple(composer.unchecked))


class _Composer:
    """Hydra's defaults-list composition of a primary config file, per model_engine choice of verl's tree."""

    def __init__(self, release: Release, code: Path | None, verl_main: bool = False) -> None:
        self.release, self.code, self.verl_main = release, code, verl_main
        self.engines = release.engines(DEFAULT_CONFIG) if DEFAULT_CONFIG in release.configs else ("",)
        self.used_verl = False
        self.included_engine: str | None = None  # the model_engine of the verl config it includes
        self.chosen_engine: str | None = None  # the model_engine its own defaults list chooses
        self.targets: set[str] = set()  # the `_target_`s the program's own files name
        self.notes: list[str] = []
        self.unchecked: list[str] = []

    def compose(self, file: Path, stack: list[Path]) -> dict[str, Any]:
        if file in stack:
            raise ProgramError(f"{file}'s defaults list includes itself")
        data = _load_yaml(file)
        self.targets |= _targets(data)
        defaults = data.pop("defaults", None) or []
        hydra = data.pop("hydra", None) or {}
        searchpath = hydra.get("searchpath", []) if isinstance(hydra, dict) else []
        if not isinstance(defaults, list):
            raise ProgramError(f"{file}: 'defaults' must be a list")
        if "_self_" not in defaults:
            defaults = [*defaults, "_self_"]
        trees: dict[str, Any] = {e: {} for e in self.engines}
        for item in defaults:
            if item == "_self_":
                trees = {e: _merge(t, data) for e, t in trees.items()}
            elif isinstance(item, str):
                layer = self._find(item.lstrip("/"), file.parent, searchpath, file)
                trees = {e: _merge(t, layer[e]) for e, t in trees.items()}
            elif isinstance(item, dict):
                for key, option in item.items():
                    group = str(key).removeprefix("override ").removeprefix("optional ").strip()
                    if group == ENGINE_KEY and option in self.engines and option:
                        self.chosen_engine = str(option)  # verl's own group: its trees are composed per engine
                        continue
                    package = group.partition("@")[2] or group.partition("@")[0].replace("/", ".")
                    self.unchecked.append(package)
                    self.notes.append(f"note: {file.name}'s defaults list chooses '{group}: {option}'; verlc does "
                                      f"not compose config groups of a program's own config: keys under "
                                      f"{package} are left to Hydra")
        return trees

    def _find(self, name: str, here: Path, searchpath: list[Any], file: Path) -> dict[str, Any]:
        """The config `name` of a defaults list, per engine: verl's trainer config from the schema, or a
        file in the config's own folder or its search path, composed in turn."""
        if self.verl_main and name in self.release.configs:  # the program's own folder, searched first
            return self._verl(name)
        places: list[Path | str] = [here]
        for entry in searchpath:
            entry = str(entry)
            if entry.startswith("file://"):
                folder = Path(entry.removeprefix("file://"))
                places.append(folder if folder.is_absolute() else (self.code or Path.cwd()) / folder)
            elif entry.startswith("pkg://"):
                places.append(entry.removeprefix("pkg://"))
        for place in places:
            if isinstance(place, str):  # a package: verl's own configs are the schema's
                if place == ".".join(VERL_CONFIG) and name in self.release.configs:
                    return self._verl(name)
                continue
            candidate = place / f"{name}.yaml"
            if not candidate.is_file():
                continue
            if place.resolve().parts[-3:] == VERL_CONFIG and name in self.release.configs:
                return self._verl(name)
            return self.compose(candidate.resolve(), [file])
        shown = ", ".join(str(p) for p in places)
        raise ProgramError(f"{file.name}'s defaults list names '{name}', which Hydra would not find "
                           f"(looked in {shown})")

    def default_engine(self) -> str:
        """The model_engine Hydra picks when the command line names none: the program's own choice, else that
        of the verl config it includes (ppo_megatron_trainer chooses megatron from 0.8 on), else verl's."""
        return self.chosen_engine or self.included_engine or self.release.default_engine(DEFAULT_CONFIG)

    def _verl(self, name: str) -> dict[str, Any]:
        self.used_verl = True
        own = self.release.default_engine(name)
        if own and own in self.engines:
            self.included_engine = own
        return {e: self.release.tree(name, e if e in self.release.engines(name) else own) for e in self.engines}


def _merge(base: Any, over: Any) -> Any:
    """OmegaConf's merge: mappings key by key, anything else replaced (lists too). Only the mappings on a
    merged path are new; the rest is shared, as every release tree is (nothing changes one in place)."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base[key], value) if key in base else value
        return out
    return over


def _load_yaml(file: Path) -> dict[str, Any]:
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="safe").load(file.read_text(encoding="utf-8"))
    except (OSError, YAMLError, UnicodeDecodeError) as exc:
        raise ProgramError(f"cannot read {file}: {' '.join(str(exc).split())}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ProgramError(f"{file} is not a mapping")
    return data


def _targets(tree: Any) -> set[str]:
    if isinstance(tree, dict):
        found = {tree["_target_"]} if isinstance(tree.get("_target_"), str) else set()
        for value in tree.values():
            found |= _targets(value)
        return found
    if isinstance(tree, list):
        return set().union(*map(_targets, tree)) if tree else set()
    return set()


def _program_classes(named: set[str], release: Release, roots: list[Path]
                     ) -> tuple[dict[str, DataClass], dict[str, str], list[str]]:
    """The dataclasses the program's config names by `_target_` that the schema does not map yet: verl's
    (found by name in the schema) or the program's own (read with ast, verl bases from the schema)."""
    classes: dict[str, DataClass] = {}
    targets: dict[str, str] = {}
    notes: list[str] = []
    wanted = sorted(named - set(release.targets))
    for dotted in wanted:
        found = _in_schema(dotted, release)
        if found is None:
            found = _read_class(dotted, release, roots)
            if found is not None:
                classes[found.qualname] = found
        if found is None:
            if dotted.startswith("verl."):
                continue  # not a dataclass verl describes (e.g. a function target): the YAML says it all
            notes.append(f"note: cannot read the class {dotted} the program's config names: the keys of its "
                         f"section are checked against the YAML only")
            continue
        targets[dotted] = found.qualname
    return classes, targets, notes


def _in_schema(dotted: str, release: Release) -> DataClass | None:
    if dotted in release.classes:
        return release.classes[dotted]
    module, _, name = dotted.rpartition(".")
    near = [c for q, c in release.classes.items() if c.name == name and q.startswith(module + ".")]
    return near[0] if len(near) == 1 else None


def _read_class(dotted: str, release: Release, roots: list[Path]) -> DataClass | None:
    """A class of the program's own code: its annotated fields, after those of its bases (the program's
    own, or verl's from the schema)."""
    from .extract import _type

    module, _, name = dotted.rpartition(".")
    file = module_file(module, roots) or next(
        (p for r in roots if (p := r.joinpath(*module.split("."), "__init__.py")).is_file()), None)
    if file is None:
        return None
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    imports: dict[str, str] = {}
    local: dict[str, ast.ClassDef] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            imports.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.ClassDef):
            local[node.name] = node

    def fields_of(cls_name: str, seen: frozenset[str]) -> tuple[dict[str, str], dict[str, tuple[Any, ...]]] | None:
        node = local.get(cls_name)
        if node is None or cls_name in seen:
            return None
        fields: dict[str, str] = {}
        literals: dict[str, tuple[Any, ...]] = {}
        for base in node.bases:
            base_name = _dotted(base)
            inherited = fields_of(base_name, seen | {cls_name}) if base_name in local else None
            if inherited is None and base_name in imports:
                known = _in_schema(imports[base_name], release)
                inherited = (dict(known.fields), dict(known.literals)) if known else None
            if inherited:
                fields.update(inherited[0])
                literals.update(inherited[1])
        for stmt in node.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) \
                    and not stmt.target.id.startswith("__") and _dotted(stmt.annotation) != "ClassVar":
                kinds, values = _type(stmt.annotation, lambda n: _resolve_name(n, imports, local, module, release))
                fields[stmt.target.id] = "|".join(kinds)
                if values:
                    literals[stmt.target.id] = tuple(values)
        return fields, literals

    found = fields_of(name, frozenset())
    if found is None:
        return None
    return DataClass(name, dotted, found[0], found[1])


def _resolve_name(name: str, imports: dict[str, str], local: dict[str, ast.ClassDef], module: str,
                  release: Release) -> str | None:
    if name in local:
        return f"{module}.{name}"
    if name in imports:
        known = _in_schema(imports[name], release)
        return known.qualname if known else None
    return None


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
    return ""


def _constant(node: ast.expr | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None
