"""Sourced YAML -> Spec: pydantic validation with every error mapped back to its line and column."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Tag, ValidationError

from .diagnostics import Diagnostic, SpecError, did_you_mean
from .load import Sourced
from .spec import Spec


def validate(sourced: Sourced, model: type[Spec]) -> Spec:
    """Validate a loaded spec against `model` (the catalog's Spec, with the targets' sections); raise SpecError
    with one diagnostic per problem."""
    try:
        return model.model_validate(sourced.data)
    except ValidationError as exc:
        raise SpecError(_diagnostic(sourced, err, model) for err in exc.errors(include_url=False)) from None


def _diagnostic(sourced: Sourced, err: Any, root: type[Spec]) -> Diagnostic:
    kind = err["type"]
    loc = _without_tags(tuple(err["loc"]), root)
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        key = str(loc[-1])
        kinds = sorted({t for m in _members(_model_at(loc[:-1], root)) if key in m.model_fields and "runtime" in
                        m.model_fields for t in typing.get_args(m.model_fields["runtime"].annotation)})
        if kinds:  # a key of another kind of this section (container: image under runtime none)
            return sourced.diagnostic(loc, f"'{key}' does not go with this runtime; it is a key of runtime "
                                           f"{', '.join(kinds)}", at_key=True)
        return sourced.diagnostic(loc, f"unknown key '{key}'" + did_you_mean(key, _keys_at(loc[:-1], root)),
                                  at_key=True)
    if kind == "missing":
        return sourced.diagnostic(loc[:-1], f"missing required key '{loc[-1]}'")
    if kind == "union_tag_invalid":
        tags = [t.strip(" '") for t in str(ctx.get("expected_tags", "")).split(",")]
        tag, key = str(ctx.get("tag")), str(ctx.get("discriminator", "kind")).strip("'")
        message = f"unknown {key} '{tag}'; expected one of {', '.join(tags)}" + did_you_mean(tag, tags)
        return sourced.diagnostic((*loc, key), message)
    if kind == "union_tag_not_found":
        key = str(ctx.get("discriminator", "kind")).strip("'")
        kinds = list(dict.fromkeys(t for m in _members(_model_at(loc, root)) if key in m.model_fields
                                   for t in typing.get_args(m.model_fields[key].annotation)))
        choices = f" ({', '.join(kinds[:-1])} or {kinds[-1]})" if kinds else ""
        return sourced.diagnostic(loc, f"missing required key '{key}'{choices}")
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        value = err.get("input")
        hint = did_you_mean(value, expected) if isinstance(value, str) else ""
        return sourced.diagnostic(loc, _sentence(err["msg"]) + f", got {value!r}" + hint)
    message = err["msg"].removeprefix("Value error, ")
    if loc and loc[-1] == "[key]":  # pydantic's mark of a mapping's key (not its value) that is wrong
        return sourced.diagnostic(loc[:-1], _sentence(message), at_key=True)
    if kind in ("tuple_type", "list_type") and isinstance(err.get("input"), str):
        words = err["input"].split()
        return sourced.diagnostic(loc, "should be a list of words (argv), got one string" + (
            f": write it as {words!r}, each word one item (no shell splits it)" if len(words) > 1 else ""))
    if kind.endswith("_type") and "input" in err:
        message += f", got {type(err['input']).__name__ if err['input'] is not None else 'null'}"
        value = err["input"]
        if kind == "string_type" and isinstance(value, (int, float)) and not isinstance(value, bool):
            # YAML reads an unquoted 0.9 (or 1e-6, 10) as a number, and 0.10 as 0.1
            message += f"; quote it ({loc[-1]}: \"{value}\"): YAML reads an unquoted {value} as a number"
    return sourced.diagnostic(loc, _sentence(message))


def _sentence(message: str) -> str:
    return message.replace("Input should be", "should be").replace("String should", "should")


def _without_tags(loc: tuple[str | int, ...], root: type[Spec]) -> tuple[str | int, ...]:
    """pydantic puts the chosen union member's tag into locations (container.docker.image)."""
    out: list[str | int] = []
    for part in loc:
        if isinstance(part, str) and out and _keys_at(out, root) and part not in _keys_at(out, root) \
                and any(_tag_matches(m, part) for m in _members(_model_at(out, root))):
            continue
        if isinstance(part, str) and out and part in _union_tags(_model_at(out, root)):
            continue
        out.append(part)
    return tuple(out)


def _union_tags(tp: Any) -> set[str]:
    """The tags of a union that a callable Discriminator chooses between (model: text or a mapping)."""
    tp = _unwrap(tp)
    if typing.get_origin(tp) not in (typing.Union, types.UnionType):
        return set()
    return {m.tag for arg in typing.get_args(tp) if typing.get_origin(arg) is typing.Annotated
            for m in typing.get_args(arg)[1:] if isinstance(m, Tag)}


def _model_at(loc: Sequence[str | int], root: type[Spec]) -> Any:
    model: Any = root
    for part in loc:
        model = _unwrap(model)
        if isinstance(part, int):
            args = typing.get_args(model)
            model = args[0] if args else model
            continue
        if typing.get_origin(model) is dict:  # a mapping's key (a service's name): its value's model
            model = typing.get_args(model)[1]
            continue
        chosen = next((m for m in _members(model) if part in m.model_fields), None)
        if chosen is None:
            return None
        model = chosen.model_fields[part].annotation
    return model


def _keys_at(loc: Sequence[str | int], root: type[Spec]) -> list[str]:
    """The keys the model at `loc` accepts, for 'did you mean'."""
    return [k for m in _members(_model_at(loc, root)) for k in m.model_fields]


def _unwrap(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _members(tp: Any) -> list[type[BaseModel]]:
    tp = _unwrap(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(tp) for m in _members(arg)]
    return []


def _tag_matches(model: type[BaseModel], tag: str) -> bool:
    """Whether `tag` is the model's kind in its union (its `runtime`, a container; its `kind`, a probe)."""
    fields = (model.model_fields.get(k) for k in ("runtime", "kind"))
    return any(f is not None and tag in typing.get_args(f.annotation) for f in fields)
