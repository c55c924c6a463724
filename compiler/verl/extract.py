"""Read one verl release's config facts from its own files, without importing verl (or torch).

- the trainer configs (`ppo_trainer`, `ppo_megatron_trainer`), composed by Hydra for every
  `model_engine` choice, unresolved: keys, defaults, `???` for mandatory values, `_target_` names;
- for each config and engine, each other option of every group its defaults list chooses (`optim`,
  `actor@actor_rollout_ref.actor`, ...): what Hydra composes at the group's package with that choice;
- the dataclasses the `_target_` names point at, read with `ast`: each field's type, so that types
  and openness come from what verl builds, not from what a YAML default happens to look like;
- closed value sets, where the source states them (enums, `Literal` fields, `__post_init__` checks);
- each key's description: the comment verl's YAML writes above it (or after it), else the dataclass
  field's own documentation (a comment above it, a docstring after it, or the class's `Args:` entry).

Used by `dev/verl_schema.py` (one release at a time, from a scratch install) and by
`--verl-config live` (the installed verl). Needs hydra-core; the shipped schemas need nothing.
"""

from __future__ import annotations

import ast
import copy
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import loadable, workers
from .release import put

TRAINER_CONFIGS = ("ppo_trainer", "ppo_megatron_trainer")
SCALARS = {"int": "int", "float": "float", "bool": "bool", "str": "str"}
LISTS = {"list", "List", "tuple", "Tuple", "Sequence", "ListConfig", "set", "Set"}
DICTS = {"dict", "Dict", "Mapping", "MutableMapping", "DictConfig"}
ANY = {"Any", "object"}


def extract(package: Path, *, lazy: bool = False, all_classes: bool = False,
            progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The schema data of the verl package at `package` (the folder holding verl/__init__.py).

    `lazy`: compose each model_engine's config only when it is first asked for (`--verl-config live`
    needs one; the shipped schemas hold them all). `all_classes`: keep every dataclass, not only those
    verl's own configs reach (a commit's schema: a recipe's config may name any of them). `progress` is told
    each config once it is composed (with every engine and group option, a minute's work on 2 cores)."""
    config_dir = package / "trainer" / "config"
    classes, source = read_dataclasses(package)
    configs: dict[str, Any] = {}
    for name in TRAINER_CONFIGS:
        if (config_dir / f"{name}.yaml").exists():
            configs[name] = _compose_variants(config_dir, name, lazy, progress)
    written = sorted({m[1] for path in config_dir.rglob("*.yaml")
                      for m in _TARGET.finditer(path.read_text(encoding="utf-8", errors="replace"))})
    targets = {t: q for t in written if (q := source.target(t)) in classes}
    used = {q: info for q, info in sorted(classes.items())
            if all_classes or _used(q, set(targets.values()), classes)}
    programs = verl_programs(package)
    program_configs = {name: _compose_variants(config_dir, name, lazy, progress)
                       for name in sorted(set(programs.values())) if name not in configs}
    return {
        "configs": configs,
        "programs": programs,
        "program_configs": program_configs,
        "groups": _groups(config_dir),
        "targets": targets,
        "classes": {q: {k: v for k, v in info.items() if k != "docs"} for q, info in used.items()},
        "allowed": _allowed(package, classes),
        "worker_allowed": _worker_allowed(package, _allowed(package, classes)),
        "startup": workers.read(package),
        "loadable": loadable.read(package),
        "docs": {"keys": {} if lazy else yaml_docs(config_dir, {n: c["engines"]
                                                             for n, c in {**configs, **program_configs}.items()}),
                 "fields": {q: info["docs"] for q, info in used.items() if info["docs"]}},
    }


# --- verl's own programs ---------------------------------------------------------------------

def verl_programs(package: Path) -> dict[str, str]:
    """verl's own Hydra programs whose config is one of its trainer configs: module -> the config_name of
    its @hydra.main (verl.trainer.fsdp_sft_trainer -> sft_trainer, verl.trainer.main_eval -> evaluation)."""
    from .program import ProgramError, hydra_main, parsed

    config_dir = (package / "trainer" / "config").resolve()
    found = {}
    for file in sorted((package / "trainer").glob("*.py")):
        try:
            tree = parsed(file)
            path, name = hydra_main(file, tree)
        except ProgramError:
            continue
        if name and (file.parent / (path or ".")).resolve() == config_dir and (config_dir / f"{name}.yaml").is_file():
            found[f"verl.trainer.{file.stem}"] = name
    return found


# --- Hydra ------------------------------------------------------------------------------------

def compose(config_dir: Path, name: str, overrides: list[str]) -> dict[str, Any]:
    """Hydra's composition (unresolved), exactly as `main_ppo --config-name NAME --cfg job` prints it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    with _parsed_once(config_dir), initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = hydra_compose(name, overrides=overrides)
    return OmegaConf.to_container(cfg, resolve=False)  # type: ignore[return-value]


_PARSED: dict[tuple[str, int, int], Any] = {}  # (file, mtime, size) -> what YAML parsed there


@contextmanager
def _parsed_once(config_dir: Path) -> Iterator[None]:
    """Within the block, each YAML file under `config_dir` is parsed once per process. Hydra reads every file of
    a composition again for each one (a release's schema: some 3,400 reads of 48 files, a quarter of its time);
    each read still gets a config of its own, built from that parse as OmegaConf.load builds it, with
    OmegaConf's own YAML loader."""
    import yaml
    from omegaconf import OmegaConf
    from omegaconf._utils import get_yaml_loader

    shipped = vars(OmegaConf)["load"]
    under = str(config_dir.resolve()) + os.sep

    def load(file_: Any) -> Any:
        name = getattr(file_, "name", None)
        if not (isinstance(name, str) and name.startswith(under) and hasattr(file_, "read")):
            return shipped.__func__(file_)
        stat = os.stat(name)
        key = (name, stat.st_mtime_ns, stat.st_size)
        if key not in _PARSED:
            parsed = yaml.load(file_, Loader=get_yaml_loader())
            if parsed is not None and not isinstance(parsed, (list, dict, str)):
                raise OSError(f"Invalid loaded object type: {type(parsed).__name__}")  # as OmegaConf.load says
            _PARSED[key] = parsed
        parsed = _PARSED[key]
        return OmegaConf.create() if parsed is None else OmegaConf.create(copy.deepcopy(parsed))

    OmegaConf.load = staticmethod(load)  # type: ignore[method-assign]
    try:
        yield
    finally:
        OmegaConf.load = shipped  # type: ignore[method-assign]


_TARGET = re.compile(r"^\s*_target_:\s*([A-Za-z_][\w.]*)\s*$", re.M)


class _Composed(Mapping[str, dict[str, Any]]):
    """model_engine choice -> that config, composed by Hydra the first time it is asked for."""

    def __init__(self, config_dir: Path, name: str, choices: list[str], default: tuple[str, dict[str, Any]]) -> None:
        self._where, self._choices = (config_dir, name), choices
        self._trees = dict([default])

    def __getitem__(self, choice: str) -> dict[str, Any]:
        if choice not in self._choices:
            raise KeyError(choice)
        if choice not in self._trees:
            self._trees[choice] = compose(*self._where, [f"model_engine={choice}"])
        return self._trees[choice]

    def __iter__(self) -> Iterator[str]:
        return iter(self._choices)

    def __len__(self) -> int:
        return len(self._choices)


def _compose_variants(config_dir: Path, name: str, lazy: bool,
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """{"default_engine": choice or "", "engines": {choice: composed tree}} ("" when there is no group), and
    (not `lazy`) "groups": {choice: the config's other group choices, see _group_choices}."""
    default = compose(config_dir, name, [])
    engine = default.get("model_engine")
    choices = sorted(p.stem for p in (config_dir / "model_engine").glob("*.yaml"))
    if not choices or not isinstance(engine, str):
        variants = {"default_engine": "", "engines": {"": default}}
    else:
        engines = _Composed(config_dir, name, choices, (engine, default))
        variants = {"default_engine": engine, "engines": engines if lazy else dict(engines)}
    if not lazy:
        variants["groups"] = {e: _group_choices(config_dir, name, e, tree) for e, tree in variants["engines"].items()}
    if progress:
        options = sum(len(group["options"]) for groups in variants.get("groups", {}).values()
                      for group in groups.values())
        engines = [f"{len(variants['engines'])} model_engine choices"] if variants["default_engine"] else []
        progress(f"{name} composed ({', '.join([*engines, f'{options} other group options'])})")
    return variants


def _group_choices(config_dir: Path, name: str, engine: str, tree: dict[str, Any]) -> dict[str, Any]:
    """The config groups the defaults list of `name` (with that model_engine) chooses, model_engine aside:
    override key (`group@package`, as `--cfg job` shows them in hydra.runtime.choices) -> {"chosen": its
    option, "package": the dotted key the option lands at, "options": {each other option: the subtree Hydra
    composes there with `key=option`, or None where choosing it also changes keys elsewhere}}."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    base = [f"model_engine={engine}"] if engine else []
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        picked = hydra_compose(name, overrides=base, return_hydra_config=True).hydra.runtime.choices
    out: dict[str, Any] = {}
    for key, chosen in sorted(picked.items()):
        if key.startswith("hydra/") or key == "model_engine" or not isinstance(chosen, str):
            continue
        group, _, package = key.partition("@")
        package = package or group.replace("/", ".")
        folder = (config_dir / group).resolve()
        options: dict[str, Any] = {}
        for option in sorted(p.stem for p in folder.glob("*.yaml") if p.stem != chosen):
            try:
                swapped = compose(config_dir, name, [*base, f"{key}={option}"])
            except Exception:  # noqa: BLE001 - Hydra refuses this option here (its errors have no common base)
                options[option] = None
                continue
            options[option] = _only_at(tree, swapped, package.split("."))
        out[key] = {"chosen": chosen, "package": package, "options": options}
    return out


def _only_at(base: dict[str, Any], swapped: dict[str, Any], path: list[str]) -> Any:
    """swapped's subtree at `path` where it differs from `base` nowhere else; None otherwise."""
    node: Any = swapped
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node if put(base, path, node) == swapped else None


def yaml_docs(config_dir: Path, variants: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """Dotted key -> the comment verl's YAML files write for it, over every trainer config and engine.

    Hydra's own defaults list says which file lands at which package, in merge order; a later file's
    comment replaces an earlier one's (as its value does), and the first variant to describe a key wins."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    docs: dict[str, str] = {}
    with initialize_config_dir(config_dir=str(config_dir.resolve()), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        for name, engines in variants.items():
            for engine in engines:
                found: dict[str, str] = {}
                chosen = loader.compute_defaults_list(name, [f"model_engine={engine}"] if engine else [], RunMode.RUN)
                for item in chosen.defaults:
                    path = os.path.normpath(item.config_path or "")
                    if not item.config_path or path.startswith("hydra"):
                        continue
                    prefix = [p for p in (item.package or "").split(".") if p]
                    found.update(_file_docs(config_dir / f"{path}.yaml", prefix))
                for key, text in found.items():
                    docs.setdefault(key, text)
    return dict(sorted(docs.items()))


def _file_docs(path: Path, prefix: list[str]) -> dict[str, str]:
    """Each key of one YAML file with the comment lines right above it, or its end-of-line comment."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = YAML(typ="rt").load(text)
    out: dict[str, str] = {}

    def walk(node: Any, parts: list[str]) -> None:
        if not isinstance(node, CommentedMap):
            return
        for key in node:
            if not isinstance(key, str) or (not parts and key == "defaults"):
                continue
            line = node.lc.key(key)[0]
            described = _comment(_above(lines, line)) or _comment([_end_comment(lines[line])])
            if described:
                out[".".join([*parts, key])] = described
            walk(node[key], [*parts, key])

    walk(tree, prefix)
    return out


def _end_comment(line: str) -> str:
    """The `# ...` after a value on its line (not a '#' inside quotes)."""
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and i and line[i - 1] in " \t":
            return line[i:]
    return ""


_RULE = re.compile(r"^[#\s=*-]*$")


def _comment(lines: Any) -> str:
    """Comment lines as one sentence-ish text: '#' marks, rulers and formatting notes dropped."""
    words = [ln.strip().lstrip("#").strip() for ln in lines if ln and not _RULE.fullmatch(ln.strip())]
    return " ".join(w for w in words if w)


def _groups(config_dir: Path) -> dict[str, list[str]]:
    """Every config group (a folder of YAML files) and its options: what `group@package=option` may name."""
    out: dict[str, list[str]] = {}
    for folder in sorted(p for p in config_dir.rglob("*") if p.is_dir() and p.name != "__pycache__"):
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        if options:
            out[folder.relative_to(config_dir).as_posix()] = options
    return out


# --- dataclasses, read with ast --------------------------------------------------------------

class _Source:
    """A package's modules read with ast: the classes each defines and the names each imports."""

    def __init__(self, package: Path) -> None:
        self.classes: dict[str, tuple[str, ast.ClassDef]] = {}  # qualified name -> (module, node)
        self.imports: dict[str, dict[str, str]] = {}            # module -> local name -> "module.name"
        self.stars: dict[str, list[str]] = {}                   # module -> modules it `import *`s
        self.lines: dict[str, list[str]] = {}                   # module -> its source lines
        for path in sorted(package.rglob("*.py")):
            try:
                text = path.read_text(encoding="utf-8")
                tree = ast.parse(text)
            except (SyntaxError, UnicodeDecodeError):
                continue
            parts = ("verl", *path.relative_to(package).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            module = ".".join(parts[:-1] if is_package else parts)
            self.lines[module] = text.splitlines()
            names: dict[str, str] = {}
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    self.classes[f"{module}.{node.name}"] = (module, node)
                elif isinstance(node, ast.ImportFrom):
                    here = module.split(".") if is_package else module.split(".")[:-1]
                    base = here[:len(here) - node.level + 1] if node.level else []
                    source = ".".join([*base, *([node.module] if node.module else [])])
                    for alias in node.names:
                        if alias.name == "*":
                            self.stars.setdefault(module, []).append(source)
                        else:
                            names[alias.asname or alias.name] = f"{source}.{alias.name}"
            self.imports[module] = names

    def resolve(self, module: str, name: str, depth: int = 0) -> str | None:
        """The qualified name of the class `name` means in `module`, following imports and re-exports."""
        if f"{module}.{name}" in self.classes:
            return f"{module}.{name}"
        if depth > 10:
            return None
        target = self.imports.get(module, {}).get(name)
        if target is not None:
            source, _, attr = target.rpartition(".")
            return self.resolve(source, attr, depth + 1)
        for source in self.stars.get(module, ()):
            found = self.resolve(source, name, depth + 1)
            if found:
                return found
        return None

    def target(self, dotted: str) -> str | None:
        """A `_target_` string's class."""
        module, _, name = dotted.rpartition(".")
        return self.resolve(module, name)


def read_dataclasses(package: Path) -> tuple[dict[str, dict[str, Any]], _Source]:
    """Every dataclass in the package, by qualified name: {"name", "fields": {field: type}, "literals"}.

    A type is a `|`-joined set of: int, float, bool, str, none, any, list, dict (any keys),
    C:<class> (a nested config), M:<class> (a map of named configs), L (a Literal: see "literals").
    Inherited fields are included; a subclass's definition of a field replaces its base's."""
    source = _Source(package)
    out: dict[str, dict[str, Any]] = {}

    def resolve(qual: str, seen: frozenset[str] = frozenset()) -> dict[str, Any]:
        if qual in out:
            return out[qual]
        module, node = source.classes[qual]
        fields: dict[str, str] = {}
        literals: dict[str, list[Any]] = {}
        docs: dict[str, str] = {}
        is_dataclass = _is_dataclass(node)
        for base in node.bases:
            base_qual = source.resolve(module, _name(base)) if _name(base) else None
            if base_qual and base_qual not in seen:
                parent = resolve(base_qual, seen | {qual})
                fields.update(parent["fields"])
                literals.update(parent["literals"])
                docs.update(parent["docs"])
                is_dataclass = is_dataclass or parent["dataclass"]
        documented = _args_section(ast.get_docstring(node) or "")
        for i, stmt in enumerate(node.body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                if _name(stmt.annotation) == "ClassVar" or stmt.target.id.startswith("__"):
                    continue
                kinds, values = _type(stmt.annotation, lambda n: source.resolve(module, n))
                fields[stmt.target.id] = "|".join(kinds)
                after = node.body[i + 1] if i + 1 < len(node.body) else None
                text = (after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                        and isinstance(after.value.value, str) else "")
                described = (_comment(_above(source.lines[module], stmt.lineno - 1)) or " ".join(text.split())
                             or documented.get(stmt.target.id, ""))
                if described:
                    docs[stmt.target.id] = described
                if values:
                    literals[stmt.target.id] = values
                else:
                    literals.pop(stmt.target.id, None)
        literals.update(_post_init_choices(node))
        out[qual] = {"name": node.name, "fields": fields, "literals": literals, "docs": docs,
                     "dataclass": is_dataclass}
        return out[qual]

    for qual in sorted(source.classes):
        resolve(qual)
    return {q: {k: v for k, v in c.items() if k != "dataclass"} for q, c in out.items() if c["dataclass"]}, source


def _above(lines: list[str], index: int) -> list[str]:
    """The comment lines right above line `index` (0-based), top to bottom."""
    found = []
    for before in reversed(lines[:index]):
        if not before.strip().startswith("#"):
            break
        found.append(before)
    return found[::-1]


_ARG = re.compile(r"(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")


def _args_section(docstring: str) -> dict[str, str]:
    """`name (type): text` entries of a Google-style `Args:`/`Attributes:` section, continuations joined."""
    out: dict[str, str] = {}
    inside, base, current = False, 0, ""
    for line in docstring.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if stripped in ("Args:", "Arguments:", "Attributes:", "Parameters:"):
            inside, base, current = True, -1, ""
            continue
        if not inside:
            continue
        if not stripped:
            continue
        if base < 0:
            base = indent
        if indent < base or (indent == base and stripped.endswith(":") and " " not in stripped):
            inside = False
            continue
        match = _ARG.fullmatch(stripped) if indent == base else None
        if match:
            current = match[1]
            out[current] = match[2].strip()
        elif current:
            out[current] = f"{out[current]} {stripped}".strip()
    return out


def _is_dataclass(node: ast.ClassDef) -> bool:
    for deco in node.decorator_list:
        target = deco.func if isinstance(deco, ast.Call) else deco
        if _name(target) == "dataclass":
            return True
    return False


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    return ""


def _type(node: ast.expr | None, classes: Any) -> tuple[list[str], list[Any]]:
    """(kinds, literal values) of an annotation; `classes(name)` is the qualified class a name means."""
    if node is None:
        return ["any"], []
    if isinstance(node, ast.Constant):
        if node.value is None:
            return ["none"], []
        if isinstance(node.value, str):  # a forward reference
            try:
                return _type(ast.parse(node.value, mode="eval").body, classes)
            except SyntaxError:
                return ["any"], []
        return ["any"], []
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        left, lv = _type(node.left, classes)
        right, rv = _type(node.right, classes)
        return _union(left + right), lv + rv
    name = _name(node)
    args: list[ast.expr] = []
    if isinstance(node, ast.Subscript):
        inner = node.slice
        args = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
    if name in ("Optional", "Union"):
        kinds: list[str] = ["none"] if name == "Optional" else []
        values: list[Any] = []
        for arg in args:
            k, v = _type(arg, classes)
            kinds += k
            values += v
        return _union(kinds), values
    if name == "Literal":
        values = [a.value for a in args if isinstance(a, ast.Constant)]
        return _union(["L"] + (["none"] if None in values else [])), [v for v in values if v is not None]
    if name in ("Annotated", "Final", "InitVar"):
        return _type(args[0] if args else None, classes)
    if name in SCALARS:
        return [SCALARS[name]], []
    if name in LISTS:
        return ["list"], []
    if name in DICTS:
        entry = classes(_name(args[1])) if len(args) == 2 and _name(args[1]) else None
        return ([f"M:{entry}"] if entry else ["dict"]), []
    if name in ANY or not name:
        return ["any"], []
    qual = classes(name)
    return ([f"C:{qual}"] if qual else ["any"]), []


def _union(kinds: list[str]) -> list[str]:
    return ["any"] if "any" in kinds else sorted(set(kinds))


def _post_init_choices(node: ast.ClassDef) -> dict[str, list[Any]]:
    """Fields whose `__post_init__` raises unless the value is in a literal set (e.g. loss_agg_mode),
    and, as `!field`, values it raises on (e.g. rollout mode "sync" in 0.9)."""
    out: dict[str, list[Any]] = {}
    for fn in node.body:
        if not (isinstance(fn, ast.FunctionDef) and fn.name == "__post_init__"):
            continue
        lists = {t.id: _strings(stmt.value) for stmt in ast.walk(fn) if isinstance(stmt, ast.Assign)
                 for t in stmt.targets if isinstance(t, ast.Name) and _strings(stmt.value)}
        for stmt in ast.walk(fn):
            if not (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.Compare)
                    and any(isinstance(s, ast.Raise) for s in ast.walk(ast.Module(body=stmt.body, type_ignores=[])))):
                continue
            test = stmt.test
            left = test.left
            if not (isinstance(left, ast.Attribute) and isinstance(left.value, ast.Name) and left.value.id == "self"
                    and len(test.ops) == 1):
                continue
            right = test.comparators[0]
            if isinstance(test.ops[0], ast.NotEq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
                out[left.attr] = [right.value]
            elif isinstance(test.ops[0], ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
                out[f"!{left.attr}"] = [*out.get(f"!{left.attr}", []), right.value]  # a value it refuses
            elif isinstance(test.ops[0], ast.NotIn):
                values = lists.get(right.id) if isinstance(right, ast.Name) else _strings(right)
                if values:
                    out[left.attr] = values
    return out


def _strings(node: ast.expr) -> list[str]:
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
        return [e.value for e in node.elts]  # type: ignore[attr-defined]
    return []


def _used(name: str, roots: set[str], classes: dict[str, dict[str, Any]]) -> bool:
    """Whether a config tree names the class, directly or through another used class's field types."""
    seen: set[str] = set()
    todo = [r for r in roots if r in classes]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for kind in (k for t in classes[current]["fields"].values() for k in t.split("|")):
            if kind[:2] in ("C:", "M:") and kind[2:] in classes:
                todo.append(kind[2:])
    return name in seen


# --- closed value sets --------------------------------------------------------------------------

def _by_name(classes: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """The one class of this name that verl's configs use (RolloutConfig, ActorConfig), or {}."""
    found = [c for c in classes.values() if c["name"] == name]
    return found[0] if len(found) == 1 else {}


def _allowed(package: Path, classes: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """Settings verl restricts outside any dataclass, each read from where this release states it."""
    out: dict[str, list[str]] = {}
    estimators = _enum_values(package, "AdvantageEstimator")
    if estimators:  # verl looks the estimator up by this enum's values
        out["algorithm.adv_estimator"] = estimators
    registry = _rollout_registry(package)
    if registry and "sync" in _by_name(classes, "RolloutConfig").get("literals", {}).get("!mode", []):
        # Once sync mode is refused, every rollout is built from this registry of (name, mode) pairs;
        # before that, sync rollouts were built elsewhere and the registry did not list them all.
        out["actor_rollout_ref.rollout.name"] = sorted({n for n, _ in registry})
        out["actor_rollout_ref.rollout.mode"] = sorted({m for _, m in registry})
    loss_modes = _loss_agg_modes(package)
    if loss_modes and "loss_agg_mode" not in _by_name(classes, "ActorConfig").get("literals", {}):
        out["actor_rollout_ref.actor.loss_agg_mode"] = loss_modes
    return out


def _worker_allowed(package: Path, allowed: dict[str, list[str]]) -> dict[str, list[str]]:
    """Values only the workers check, once they start (verlc notes them; Hydra and the dataclasses take
    anything): the rollout names `_build_rollout` handles, and the registered policy losses."""
    out: dict[str, list[str]] = {}
    names = _rollout_names(package)
    if names and "actor_rollout_ref.rollout.name" not in allowed:
        out["actor_rollout_ref.rollout.name"] = names
    core = package / "trainer" / "ppo" / "core_algos.py"
    if core.exists():
        registered = {d.args[0].value for node in ast.walk(ast.parse(core.read_text(encoding="utf-8")))
                      if isinstance(node, ast.FunctionDef) for d in node.decorator_list
                      if isinstance(d, ast.Call) and ast.unparse(d.func) == "register_policy_loss" and d.args
                      and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)}
        if registered:  # the actor takes "vanilla" itself where it is not registered
            out["actor_rollout_ref.actor.policy_loss.loss_mode"] = sorted(registered | {"vanilla"})
    return out


def _rollout_names(package: Path) -> list[str]:
    """The rollout names the FSDP workers' `_build_rollout` builds: the names an if-chain that ends in a
    `raise` compares with, or those it compares with plus the rollout registry it looks the rest up in; none
    where every name is looked up in the registry (0.6 on: the start-up rules judge each (name, mode))."""
    path = package / "workers" / "fsdp_workers.py"
    if not path.exists():
        return []
    function = next((n for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                     if isinstance(n, ast.FunctionDef) and n.name == "_build_rollout"), None)
    if function is None:
        return []
    for chain in (n for n in ast.walk(function) if isinstance(n, ast.If)):
        names, node = _compared(chain.test), chain
        while len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If):
            node = node.orelse[0]
            names |= _compared(node.test)
        if names and node.orelse and isinstance(node.orelse[-1], ast.Raise):
            return sorted(names)  # a closed chain: every other name raises
    if any(isinstance(n, ast.Call) and ast.unparse(n.func) == "get_rollout_class"
           for s in function.body for n in ast.walk(s) if not isinstance(s, ast.If)):
        return []  # every name goes through the registry: the start-up rules judge (name, mode) (workers.py)
    if any(isinstance(n, ast.Call) and ast.unparse(n.func) == "get_rollout_class" for n in ast.walk(function)):
        registry = {name for name, _ in _rollout_registry(package)}
        compared = {v for n in ast.walk(function) if isinstance(n, ast.Compare) for v in _compared(n)}
        return sorted(registry | compared) if registry else []
    return []


def _compared(test: ast.expr) -> set[str]:
    """The strings a test compares the rollout name with (`name == "a"`, `name in ["b", "c"]`)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and ast.unparse(test.left).endswith(("rollout_name", "rollout.name"))):
        return set()
    right = test.comparators[0]
    if isinstance(test.ops[0], ast.Eq) and isinstance(right, ast.Constant) and isinstance(right.value, str):
        return {right.value}
    return set(_strings(right)) if isinstance(test.ops[0], ast.In) else set()


def _enum_values(package: Path, enum: str) -> list[str]:
    for path in sorted(package.rglob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if f"class {enum}" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.name == enum:
                return sorted(s.value.value for s in node.body if isinstance(s, ast.Assign)
                              and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str))
    return []


def _rollout_registry(package: Path) -> list[tuple[str, str]]:
    """The (name, mode) pairs of the release's rollout registry (workers.py reads it, with each class's module)."""
    return [tuple(key.split("/", 1)) for key in workers.read_rollouts(package)]  # type: ignore[misc]


def _loss_agg_modes(package: Path) -> list[str]:
    """0.4-0.5 check loss_agg_mode against a literal list in ray_trainer.py (`assert ... in [...]`)."""
    path = package / "trainer" / "ppo" / "ray_trainer.py"
    if not path.exists():
        return []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)
                and ast.unparse(node.left).endswith("loss_agg_mode") and _strings(node.comparators[0])):
            return _strings(node.comparators[0])
    return []
