"""The spec's reference, generated from the models: JSON Schema for editors, Markdown for people."""

from __future__ import annotations

import json
import typing
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .spec import Seconds, Spec
from .verl.editor import verl_schema
from .verl.release import snapshot

if TYPE_CHECKING:
    from .catalog import Catalog
    from .verl.program import Program


SCHEMA_DIR = "schema"  # schema/verl-<release>.json, committed: what a spec's modeline points at


def json_schema(catalog: Catalog, version: str | None = None, program: Program | None = None) -> str:
    """JSON Schema of a spec file for one verl release (yaml-language-server's `$schema=` modeline):
    the spec's own sections, and `verl:` with every key of that release (compiler/verl/editor.py); with
    `program`, its keys: a recipe's own config (its own keys too) composed over its release or commit.
    One file per release, not one schema switching on verl_version: editors complete and hover from a
    plain schema, while conditional (if/then) branches are where their completion gives out."""
    default = Spec.model_fields["verl_version"].default
    release = program.release if program is not None else snapshot(version or default)
    version = release.version
    schema = catalog.spec.model_json_schema()
    props = schema["properties"]
    props["verl"] = {**verl_schema(release), "description": props["verl"]["description"]}
    if program is not None:
        schema["title"] = f"verlc spec for {program.module} ({program.config_name}) at {release.label}"
        props["program"] = {**props["program"], "enum": [program.module]}
        if release.commit is not None:
            props["verl_commit"] = {**props["verl_commit"], "enum": [release.commit]}
            schema["required"] = sorted({*schema.get("required", []), "verl_commit"})
        return json.dumps(schema, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    schema["title"] = f"verlc spec for verl {version}"
    props["verl_version"] = {**props["verl_version"], "enum": [version]}
    if version != default:  # a spec for another release must say so
        props["verl_version"].pop("default", None)
        schema["required"] = sorted({*schema.get("required", []), "verl_version"})
    return json.dumps(schema, indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def markdown(catalog: Catalog) -> str:
    """docs/spec.md: every section and key, its type, default and meaning."""
    lines = ["# The verlc spec", "",
             "Generated from `compiler/spec.py` by `verlc schema --format markdown`; do not edit.", ""]
    seen: list[type[BaseModel]] = []
    _collect(catalog.spec, seen)
    for model in seen:
        lines += [f"## {model.__name__}", ""]
        if model.__doc__:
            lines += [" ".join(model.__doc__.split()), ""]
        lines += ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for name, field in model.model_fields.items():
            default = "required" if field.is_required() else (
                "" if field.default is PydanticUndefined else f"`{json.dumps(_plain(field.default))}`")
            if field.default_factory is not None:
                default = f"`{json.dumps(_plain(field.default_factory()))}`"
            shown = _type(Seconds) if typing.get_args(Seconds)[1] in field.metadata else _type(field.annotation)
            lines.append(f"| `{name}` | {shown} | {default} | {field.description or ''} |")
        lines.append("")
    return "\n".join(lines + PREFIXES)


# How main_ppo's Hydra overrides are written as `verl:` keys: the same meaning, one example each.
PREFIXES = """## Hydra's prefixes in `verl:`

A key of `verl:` means what the same override on verl's command line means; verlc passes the override Hydra
needs for it and judges it as that release's Hydra (and the dataclasses verl builds) would.

| Hydra override | in `verl:` | accepted when |
| --- | --- | --- |
| `trainer.total_epochs=2` | `trainer: {total_epochs: 2}` | verl's composed config has the key |
| `+trainer.my_flag=true` | `trainer: {+my_flag: true}` | the key is new, or null, or the value is a mapping or list (merged); below a dataclass verl builds, only its fields |
| `+reward.reward_kwargs.max_resp_len=8192` | `reward: {reward_kwargs: {+max_resp_len: 8192}}` (or `+reward_kwargs: {max_resp_len: 8192}`) | a `+` on any key of a new path: its first new key, its leaf or between |
| `++trainer.total_epochs=2` | `trainer: {++total_epochs: 2}` | always (add or set); dataclass fields as for `+` |
| `~trainer.total_epochs` | not supported | refused: verl reads every key of its config; set it to null or leave it out |

A key verl's YAML leaves out is written with `+` even where verl takes it (a field its dataclass declares, a new
entry of a keyed map such as `distillation.teacher_models.<name>`, a key of a free-form mapping such as
`override_config`): Hydra refuses it without, and so does verlc. `+key` over a mapping verl has merges into it.
Inside a mapping that verl's YAML holds as one value (a null `dict` field), a `+` on a key changes nothing.
`verlc migrate --to <the spec's own release>` writes the `+` a spec written for earlier verlc versions needs.
""".splitlines()


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json") if isinstance(value, BaseModel) else value


def _collect(tp: Any, seen: list[type[BaseModel]]) -> None:
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if tp in seen:
            return
        seen.append(tp)
        for field in tp.model_fields.values():
            _collect(field.annotation, seen)
        return
    for arg in typing.get_args(tp):
        _collect(arg, seen)


def _type(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is Seconds:
        return "seconds (int) or a duration (90s, 10m, 1h)"
    if origin is typing.Annotated:
        return _type(typing.get_args(tp)[0])
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin in (typing.Union, __import__("types").UnionType):
        return " \\| ".join(_type(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return f"list of {_type(typing.get_args(tp)[0])}"
    if origin is dict:
        key, value = typing.get_args(tp)
        return f"mapping {_type(key)} -> {_type(value)}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))
