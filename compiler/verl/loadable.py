"""What verl imports by a name the spec gives, read from one release's (or commit's) own code with `ast`.

verl loads some classes and functions by a dotted name from its config or the tool config: a tool's `class_name`
(tool_registry.get_tool_class), `trainer.checkpoint_callback_class`, the agent loop manager, `pkg://` paths of
custom reward functions and managers. It does so when its workers start, after the queue, the bring-up and the
model load; a name the release does not ship fails there. Read (`read`), stored in the schema under "loadable":
- objects: every name a module of the verl package has at its top level (its classes and functions, and what it
  imports or assigns there: a package re-exports its modules' classes), dotted ("verl.tools.base_tool.BaseTool");
- tool_types: the values of the release's ToolType (a tool's `config.type`, which verl reads as ToolType(type));
- tool_schema: the pydantic models verl validates a tool's `tool_schema` with, from OpenAIFunctionToolSchema
  down: {class: {field: [annotation, required]}};
- registered: the names classes register with `@register("name")`, per registry ("reward_manager", "agent_loop");
- migrated_by: the modules that carry the old reward sections (custom_reward_function, reward_model,
  sandbox_fusion: null placeholders from 0.7.1 on) to their places under `reward` (a call of verl's
  migrate_legacy_reward_impl): verl.trainer.main_ppo in 0.7.1 and 0.8.0, only the fully async trainer from 0.9.0 on.

`tool_problems` and `name_problems` judge a spec's names against them: a name in verl must be one the release
ships; one outside verl must be in the run's own code (its module a file there), else verlc cannot know.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

TOOL_SCHEMA = "OpenAIFunctionToolSchema"
# verl config keys whose value is a class verl imports by its dotted name (verl/utils/import_utils.py
# load_class_from_fqn), in the releases that read them
CLASS_KEYS = ("trainer.checkpoint_callback_class", "actor_rollout_ref.rollout.agent.agent_loop_manager_class",
              "actor_rollout_ref.rollout.checkpoint_manager_class")
# verl config sections of {path, name}: `name` is an object of the module at `path` (load_extern_object), which may be
# `pkg://dotted.module`
PATH_NAME_KEYS = ("data.custom_cls", "custom_reward_function", "reward.custom_reward_function",
                  "reward.reward_manager.module")
_PKG = "pkg://"
MIGRATE = "migrate_legacy_reward_impl"
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")


def read(package: Path) -> dict[str, Any]:
    """The loadable facts of the verl package at `package` (the folder holding verl/__init__.py)."""
    root = package.parent
    objects: list[str] = []
    registered: dict[str, set[str]] = {}
    tool_types: list[str] = []
    migrated_by: list[str] = []
    schema_file = None
    for path in sorted(package.rglob("*.py")):
        module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        # `register` as the module names it (`from .registry import register as register_manager`)
        registers = {"register"} | {a.asname for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names
                                    if a.name == "register" and a.asname}
        # what `getattr(module, name)` finds: its own classes and functions, and the names it imports or assigns
        # (a package's __init__ re-exports its modules' classes)
        objects += [f"{module}.{name}" for name in _top_level(tree)]
        if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == MIGRATE
               for n in ast.walk(tree)):
            migrated_by.append(module)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for name in _registered(node, registers):
                    registry = "reward_manager" if "reward_manager" in module else \
                        "agent_loop" if "agent_loop" in module else None
                    if registry:
                        registered.setdefault(registry, set()).add(name)
                if node.name == "ToolType" and module.startswith("verl.tools"):
                    tool_types = [v.value.value for v in node.body if isinstance(v, ast.Assign)
                                  and isinstance(v.value, ast.Constant) and isinstance(v.value.value, str)]
                if node.name == TOOL_SCHEMA:
                    schema_file = tree
    return {"objects": sorted(set(objects)), "tool_types": tool_types,
            "tool_schema": _models(schema_file) if schema_file is not None else {},
            "registered": {k: sorted(v) for k, v in sorted(registered.items())}, "migrated_by": migrated_by}


def _registered(node: ast.ClassDef, registers: set[str]) -> Iterator[str]:
    for d in node.decorator_list:
        if isinstance(d, ast.Call) and isinstance(d.func, ast.Name) and d.func.id in registers \
                and len(d.args) == 1 and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str):
            yield d.args[0].value


def _models(tree: ast.Module) -> dict[str, dict[str, list[Any]]]:
    """The pydantic models of verl's tools/schemas.py: each field's annotation (as written) and whether it is
    required (no default)."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = {f.target.id: [ast.unparse(f.annotation), f.value is None] for f in node.body
                              if isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)}
    return out


# --- judging a spec's names ------------------------------------------------------------------------

def shipped(facts: Mapping[str, Any], dotted: str) -> bool:
    """Whether the release ships `dotted` (its `objects`: a set once loaded, Release.loadable)."""
    return dotted in facts.get("objects", ())


def in_code(dotted: str, code: Path | None) -> bool | None:
    """Whether the run's own code defines `dotted` (module.name) at its module's top level: True, False, or
    None where verlc cannot read it (no code folder, or no such module there: an installed package may have it)."""
    module, _, name = dotted.rpartition(".")
    if code is None or not module:
        return None
    base = code / module.replace(".", "/")
    source = next((f for f in (base.with_suffix(".py"), base / "__init__.py") if f.is_file()), None)
    if source is None:
        return None
    return name in top_level_names(source)


def top_level_names(source: Path) -> set[str]:
    """The names a Python file defines or imports at its top level."""
    try:
        return _top_level(ast.parse(source.read_text(encoding="utf-8", errors="replace")))
    except SyntaxError:
        return set()


def _top_level(tree: ast.Module) -> set[str]:
    """Names bound at a module's top level, also in its top-level `if`, `try` and `with` blocks (an import that
    may fail is a name that may be there: verl's verdict then depends on the node, and verlc's leans to taking it)."""
    names = set()
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop(0)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            nodes += [*node.body, *getattr(node, "orelse", ()), *getattr(node, "finalbody", ()),
                      *(n for h in getattr(node, "handlers", ()) for n in h.body)]
        elif isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def name_problem(dotted: str, what: str, facts: Mapping[str, Any], code: Path | None, label: str,
                 others: Callable[[str], str]) -> tuple[str, bool] | None:
    """What is wrong with `dotted`, a class or function verl imports by name (`what` says whose): (message,
    refusal), or None. `others(dotted)` names the releases that ship it (for a name of verl's)."""
    if not _DOTTED.fullmatch(dotted):
        return f"{what} {dotted!r} is not a dotted Python name (module.Class): verl imports it by one", True
    if dotted.split(".")[0] == "verl":
        if not facts.get("objects") or shipped(facts, dotted):
            return None
        elsewhere = others(dotted)
        return (f"{label} ships no {dotted} ({what}, which verl imports by name once its trainer runs, after the "
                f"queue, the bring-up and the model load)"
                + (f"; {elsewhere} ship it: pin one with verl_version, or ship the class in the run's code"
                   if elsewhere else "; no release verlc knows ships it"), True)
    found = in_code(dotted, code)
    if found is False:
        module, _, name = dotted.rpartition(".")
        return f"the run's code has module {module} but no {name} in it ({what})", True
    if found is None:
        return (f"{what} {dotted} is neither verl's nor in the run's code (`code:`), so verlc cannot know whether "
                f"the image has it"), False
    return None


def tool_problems(tool: Mapping[str, Any], facts: Mapping[str, Any], label: str
                  ) -> Iterator[tuple[tuple[Any, ...], str, bool]]:
    """What verl's tool registry would refuse in one tool of a tool config, besides its class: (path below the
    tool, message, refusal)."""
    types = facts.get("tool_types") or ()
    config = tool.get("config")
    kind = config.get("type") if isinstance(config, Mapping) else None
    if types and kind not in types:
        where = ("config", "type") if isinstance(config, Mapping) and "type" in config else \
            ("config",) if isinstance(config, Mapping) else ()
        yield (where, f"{label} reads a tool's config.type as its ToolType, one of "
                      f"{', '.join(map(repr, types))}; "
                      + (f"{kind!r} is not one" if kind is not None else "it is missing"),
               True)
    models = facts.get("tool_schema") or {}
    if "tool_schema" not in tool or tool["tool_schema"] is None:
        yield ((), f"no tool_schema: {label} then asks the class for one (get_openai_tool_schema); verl's BaseTool "
                   f"has none and asserts 'Tool schema is not set!'", False)
    elif models:
        for path, message in model_problems(tool["tool_schema"], TOOL_SCHEMA, models):
            yield (("tool_schema", *path), f"{label} validates tool_schema as its {TOOL_SCHEMA}: {message}", True)


def model_problems(value: Any, model: str, models: Mapping[str, Mapping[str, list[Any]]]
                   ) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Where `value` does not fit pydantic model `model` as verl's source declares it (required fields, the
    kinds of their values; unknown keys are ignored, as pydantic's default does)."""
    if not isinstance(value, Mapping):
        yield (), f"{model} is a mapping, not {type(value).__name__}"
        return
    for field, (annotation, required) in models[model].items():
        if field not in value:
            if required:
                yield (), f"{field!r} is required ({model}.{field}: {annotation})"
            continue
        yield from (((field, *p), m) for p, m in _fits(value[field], annotation, models))


def _alternatives(annotation: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(annotation):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    parts.append(annotation[start:].strip())
    if len(parts) == 1 and parts[0].startswith("Optional[") and parts[0].endswith("]"):
        return [parts[0][9:-1], "None"]
    return parts


_SCALARS = {"str": str, "int": int, "float": (int, float), "bool": bool}


def _fits(value: Any, annotation: str, models: Mapping[str, Mapping[str, list[Any]]]
          ) -> Iterator[tuple[tuple[Any, ...], str]]:
    alternatives = _alternatives(annotation)
    found: list[tuple[tuple[Any, ...], str]] = []
    for alt in alternatives:
        base, _, inner = alt.partition("[")
        inner = inner[:-1]
        if alt in ("Any", "object") or (alt == "None" and value is None):
            return
        if alt in _SCALARS:
            if isinstance(value, _SCALARS[alt]) and not (alt != "bool" and isinstance(value, bool)):
                return
        elif base in ("list", "List") and isinstance(value, list):
            found = [((i, *p), m) for i, v in enumerate(value) for p, m in _fits(v, inner or "Any", models)]
            if not found:
                return
        elif base in ("dict", "Dict") and isinstance(value, Mapping):
            item = inner.split(",", 1)[1].strip() if "," in inner else "Any"
            found = [((k, *p), m) for k, v in value.items() for p, m in _fits(v, item, models)]
            if not found:
                return
        elif base == "Literal":
            if value in ast.literal_eval(f"[{inner}]"):
                return
        elif alt in models and isinstance(value, Mapping):
            found = list(model_problems(value, alt, models))
            if not found:
                return
        elif alt not in models and base not in ("list", "List", "dict", "Dict") and alt not in _SCALARS \
                and alt != "None":
            return  # a type verlc does not model: pydantic judges it
    yield from found or [((), f"{value!r} is not {annotation}")]


def releases_shipping(dotted: str) -> str:
    """The releases verlc knows that ship `dotted` ('verl 0.4.0-0.8.0'), or ''."""
    from .release import RELEASES, ranges, snapshot

    having = [v for v in RELEASES if shipped(snapshot(v).loadable, dotted)]
    return f"verl {ranges(having)}" if having else ""


def spec_names(get: Any) -> Iterator[tuple[str, str, str]]:
    """The names verl will import from a config (`get`: dotted key -> value): (the key that gives it, the dotted
    name, what it is)."""
    for key in CLASS_KEYS:
        value = get(key)
        if isinstance(value, str) and value:
            yield key, value, key
    for section in PATH_NAME_KEYS:
        path, name = get(f"{section}.path"), get(f"{section}.name")
        if isinstance(path, str) and path.startswith(_PKG) and isinstance(name, str) and name:
            yield f"{section}.path", f"{path.removeprefix(_PKG)}.{name}", f"{section}.{{path, name}}"


def registered_names(get: Any) -> Iterator[tuple[str, str, str]]:
    """The names verl looks up in one of its registries (`@register("name")`): (the key that gives it, the name,
    the registry). None where code the run loads may register more (a custom reward function's file, or an agent
    loop config of its own)."""
    if any(isinstance(get(k), str) and get(k) for k in ("custom_reward_function.path",
                                                        "reward.custom_reward_function.path")):
        return
    new = get("reward.reward_manager.name")
    if isinstance(new, str) and get("reward.reward_manager.source") in ("register", None):
        yield "reward.reward_manager.name", new, "reward_manager"
    elif isinstance(get("reward_model.reward_manager"), str):
        yield "reward_model.reward_manager", get("reward_model.reward_manager"), "reward_manager"
    loop = get("actor_rollout_ref.rollout.agent.default_agent_loop")
    if isinstance(loop, str) and not get("actor_rollout_ref.rollout.agent.agent_loop_config_path"):
        yield "actor_rollout_ref.rollout.agent.default_agent_loop", loop, "agent_loop"


def registry_problem(name: str, registry: str, facts: Mapping[str, Any], label: str) -> str | None:
    """Why `name` is not in the release's `registry`, or None (also where the schema does not know it)."""
    known = facts.get("registered", {}).get(registry)
    if not known or name in known:
        return None
    return (f"{label} registers these {registry.replace('_', ' ')}s: {', '.join(known)}; {name!r} is not one "
            f"(verl looks it up once its trainer runs, after the queue and the model load)")
