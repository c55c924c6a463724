"""verl's own verdict on many override sets for one release, in one process (run by test_verl_releases.py).

    python tests/verl_oracle.py PACKAGE_DIR [--import] < cases.json > verdicts.json

A case is {"config", "engine", "overrides": [Hydra override strings], "keys": [dotted keys it sets],
"values": {key: python value}, optionally "groups": [config group choices, e.g. optim=megatron, composed as
Hydra composes them], "verlc": [the overrides verlc passes for it] and "config_dir" (a
program's own config folder; default: verl's trainer configs; run from the folder its search path is
relative to, e.g. a recipe checkout's root). Classes are looked up in verl's package and, for other
modules (a recipe's), in the folder holding it. A case is rejected
when:
1. Hydra refuses the overrides on the composed config (the same code path main_ppo's @hydra.main uses);
2. OmegaConf cannot resolve a set key's value (an interpolation of a key verl does not have, ...);
3. a dataclass verl builds from a `_target_` node gets a keyword it does not take (an unknown key there
   fails once the workers build their configs). With --import the classes are verl's own, imported
   (their dataclass fields, and, for each set field, the type hint checked against the value);
   without it they are read from the release's source with a small ast reader written for this oracle;
4. verlc's overrides for it (when given) fail, or make a config other than the case's own overrides.
Nothing here imports verlc: the oracle must not share verlc's code.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import json
import sys
import typing
from functools import cache
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

PACKAGE = Path(sys.argv[1])
IMPORT = "--import" in sys.argv
PARSER = OverridesParser.create()


@cache
def composed(config: str, engine: str, config_dir: str | None = None, groups: tuple[str, ...] = ()) -> DictConfig:
    """The config as Hydra composes it: with the model_engine choice and the case's other group choices."""
    with initialize_config_dir(config_dir=config_dir or str(PACKAGE / "trainer" / "config"), version_base=None):
        return compose(config, overrides=[*([f"model_engine={engine}"] if engine else []), *groups])


class Named:
    """A class an annotation names (verl's own configs, enums): judged as Any, kept by name for maps."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self) -> None:  # typing accepts callables as type arguments
        return None


class _Unknown(dict):
    def __missing__(self, name: str) -> Any:
        return Named(name)


_TYPING = {**{n: getattr(typing, n) for n in ("Optional", "Union", "Any", "Literal", "List", "Dict", "Tuple",
                                              "Sequence", "Mapping")},
           "int": int, "float": float, "str": str, "bool": bool, "list": list, "dict": dict, "tuple": tuple,
           "None": None}


def _hint(annotation: ast.expr) -> Any:
    text = annotation.value if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str) \
        else ast.unparse(annotation)
    try:
        return eval(text, {"__builtins__": {}}, _Unknown(_TYPING))  # noqa: S307 - verl's own annotations
    except Exception:
        return Any


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    root, rel = (PACKAGE, Path(*parts[1:])) if parts[0] == "verl" else (PACKAGE.parent, Path(*parts))
    for candidate in (root / rel / "__init__.py", (root / rel).with_suffix(".py")):
        if candidate.exists():
            return candidate
    return None


@cache
def _parsed(module: str) -> ast.Module | None:
    path = _module_file(module)
    return ast.parse(path.read_text(encoding="utf-8", errors="replace")) if path else None


def find_class(module: str, name: str, depth: int = 0) -> tuple[str, ast.ClassDef] | None:
    """(module, class node) of `name` as `module` sees it, following `from X import` (and `*`)."""
    tree = _parsed(module)
    if tree is None or depth > 10:
        return None
    package = module if _module_file(module) and _module_file(module).name == "__init__.py" else module.rpartition(".")[0]
    stars = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            for alias in node.names:
                if alias.name == "*":
                    stars.append(source)
                elif (alias.asname or alias.name) == name:
                    return find_class(source, alias.name, depth + 1)
    for source in stars:
        found = find_class(source, name, depth + 1)
        if found:
            return found
    return None


@cache
def source_fields(module: str, name: str) -> tuple[frozenset[str], dict[str, Any]] | None:
    """Field names and type hints of a class in the release's source, bases included, read with ast."""
    found = find_class(module, name)
    if found is None:
        return None
    where, node = found
    names: set[str] = set()
    hints: dict[str, Any] = {}
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", "")
        inherited = source_fields(where, base_name) if base_name else None
        if inherited:
            names |= inherited[0]
            hints.update(inherited[1])
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if "ClassVar" in ast.unparse(stmt.annotation):
                continue
            names.add(stmt.target.id)
            hints[stmt.target.id] = _hint(stmt.annotation)
    return frozenset(names), hints


@cache
def imported(target: str) -> Any:
    from hydra.utils import get_class

    return get_class(target)


def fields_of(target: str) -> tuple[frozenset[str] | None, dict[str, Any]]:
    if IMPORT:
        cls = imported(target)
        return frozenset(f.name for f in dataclasses.fields(cls) if f.init), typing.get_type_hints(cls)
    module, _, name = target.rpartition(".")
    found = source_fields(module, name)
    return (found[0], found[1]) if found else (None, {})


def fits(hint: Any, value: Any) -> bool:
    """Whether a value fits a type hint: Python's numeric tower (int for float), no other conversion."""
    if hint is type(None):
        return value is None
    if isinstance(hint, Named):
        return value is not None  # a config class or an enum: not Optional unless the annotation says so
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        return any(fits(a, value) for a in args)
    if origin is typing.Literal:
        return value in args
    if origin in (list, tuple, typing.Sequence) or hint in (list, tuple):
        return isinstance(value, list)
    if origin in (dict, typing.Mapping) or hint is dict:
        return isinstance(value, dict)
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if dataclasses.is_dataclass(hint):
        return isinstance(value, dict)
    return True  # a type this oracle does not judge


def innermost_target(cfg: DictConfig, key: str) -> tuple[str, str, str] | None:
    """(path of the innermost `_target_` node holding `key`, its target, the key's name below it)."""
    parts = key.split(".")
    found = None
    node: Any = cfg
    for depth, part in enumerate(parts[:-1]):
        node = node.get(part) if isinstance(node, DictConfig) else None
        if not isinstance(node, DictConfig):
            break
        target = node.get("_target_")
        if isinstance(target, str):
            found = (".".join(parts[:depth + 1]), target, parts[depth + 1])
    return found


def entry_class(owner_target: str, field: str, hints: dict[str, Any]) -> tuple[frozenset[str], dict[str, Any]] | None:
    """Fields and hints of X when `field` is a `dict[str, X]` of configs (verl builds each entry as X)."""
    args = typing.get_args(hints.get(field))
    if len(args) != 2:
        return None
    entry = args[1]
    if IMPORT and dataclasses.is_dataclass(entry):
        return frozenset(f.name for f in dataclasses.fields(entry) if f.init), typing.get_type_hints(entry)
    if isinstance(entry, Named):
        module = owner_target.rpartition(".")[0]
        found = find_class(module, owner_target.rpartition(".")[2])
        return source_fields(found[0], entry.name) if found else None
    return None


def applied(case: dict[str, Any], overrides: list[str]) -> DictConfig:
    cfg = copy.deepcopy(composed(case["config"], case["engine"], case.get("config_dir"),
                                 tuple(case.get("groups", ()))))
    OmegaConf.set_struct(cfg, True)
    ConfigLoaderImpl._apply_overrides_to_config(PARSER.parse_overrides(overrides), cfg)
    return cfg


def judge(case: dict[str, Any]) -> str:
    """verl's verdict on the case's overrides; when the case also carries the overrides verlc passes for it
    ("verlc"), they must make the very same config."""
    try:
        cfg = applied(case, case["overrides"])
    except Exception as exc:
        return f"hydra: {' '.join(str(exc).split())}"
    verdict = _verl_builds(case, cfg)
    if verdict or case.get("verlc") is None:
        return verdict
    try:
        theirs = applied(case, case["verlc"])
    except Exception as exc:
        return f"verlc's own overrides fail in Hydra: {' '.join(str(exc).split())}"
    if OmegaConf.to_container(theirs) != OmegaConf.to_container(cfg):
        return "verlc's own overrides make another config than the case's"
    return ""


def _verl_builds(case: dict[str, Any], cfg: DictConfig) -> str:
    resolved: dict[str, Any] = {}
    for key in case["keys"]:
        try:
            value = OmegaConf.select(cfg, key)
            resolved[key] = OmegaConf.to_container(value, resolve=True) if isinstance(value, (DictConfig, ListConfig)) else value
        except Exception as exc:
            return f"omegaconf: {key}: {' '.join(str(exc).split())}"
    for key in case["keys"]:
        where = innermost_target(cfg, key)
        if where is None:
            continue
        path, target, name = where
        names, hints = fields_of(target)
        default = OmegaConf.select(composed(case["config"], case["engine"], case.get("config_dir"),
                                            tuple(case.get("groups", ()))), path)
        if names is None or not isinstance(default, DictConfig) or set(default.keys()) - names - {"_target_"}:
            continue  # verl cannot be building this node: its own defaults would not fit the class
        node = OmegaConf.select(cfg, path)
        unknown = sorted(set(node.keys()) - names - {"_target_"})
        if unknown:
            return f"dataclass: {target} got an unexpected keyword argument {unknown[0]!r} (at {path})"
        below = key.split(".")[path.count(".") + 1:]
        if len(below) == 3 and (entry := entry_class(target, below[0], hints)) is not None:
            entry_names, entry_hints = entry
            if below[2] not in entry_names:
                return f"dataclass: {below[0]} entries are built as a class without a field {below[2]!r}"
            if key in resolved and not fits(entry_hints.get(below[2], Any), resolved[key]):
                return f"dataclass: {below[0]} entry field {below[2]} is {entry_hints[below[2]]}"
        if name in hints and key.count(".") == path.count(".") + 1 and key in resolved:
            if not fits(hints[name], resolved[key]):
                return f"dataclass: {target}.{name} is {hints[name]}, got {resolved[key]!r}"
    return ""


def main() -> None:
    cases = json.load(sys.stdin)
    json.dump([judge(c) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
