"""The spec's building blocks: strict field types with the messages users see, and the frozen base model.

Below compiler/spec.py and every target's section (targets/<name>/section.py), which both use them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, Strict, WithJsonSchema

Int = Annotated[int, Strict()]
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]
Number = Annotated[float, BeforeValidator(lambda v: v if isinstance(v, (int, float)) and not isinstance(v, bool)
                                          else _not_a_number(v))]


def _not_a_number(value: Any) -> Any:
    raise ValueError(f"{str(value)[:80]!r} is not a number")


def matching(pattern: str, what: str) -> AfterValidator:
    compiled = re.compile(pattern)

    def check(value: str) -> str:
        if not compiled.fullmatch(value):
            raise ValueError(f"{value[:80]!r} is not {what}")
        return value

    return AfterValidator(check)


def _no_control(value: str) -> str:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise ValueError("must not contain newlines or control characters")
    return value


# A single line of text: every string that ends up in a generated file is at least this.
Text = Annotated[str, Strict(), Field(min_length=1, max_length=4096), AfterValidator(_no_control)]

# Names a Slurm job, a container, a Ray submission id and the bundle folder: the charset all of them accept.
Name = Annotated[str, Strict(), matching(
    r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}",
    "a valid name: 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")]
EnvName = Annotated[str, Strict(), matching(
    r"[A-Za-z_][A-Za-z0-9_]{0,127}", "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")]


def _secret_name(value: str) -> str:
    name, eq, _ = value.partition("=")
    if eq:  # never echo what follows '=': it is the secret itself
        raise ValueError(f"a secret is listed by its name alone: write {name[:80]!r} here and export its value where "
                         f"you submit (the value given here is not shown)")
    return value


SecretName = Annotated[str, Strict(), AfterValidator(_secret_name), matching(
    r"[A-Za-z_][A-Za-z0-9_]{0,127}", "an environment variable name ([A-Za-z_][A-Za-z0-9_]*)")]
# Values that reach `#SBATCH` lines, which sbatch splits on white space.
Directive = Annotated[str, Strict(), matching(
    r"[A-Za-z0-9_.,:%@+=/\[\]{}~-]{1,255}", "a Slurm directive value (no spaces or quotes)")]
SlurmTime = Annotated[str, Strict(), matching(
    r"(\d+-)?\d+(:\d{1,2}){0,2}", "a Slurm time limit such as 30-00:00:00, 48:00:00 or 90")]
SlurmMem = Annotated[str, BeforeValidator(lambda v: int_as_str(v)), Strict(),
                     matching(r"\d+[KMGT]?", "a Slurm memory size such as 200G (0: all of the node's)"),
                     WithJsonSchema({"anyOf": [{"type": "string", "pattern": r"^\d+[KMGT]?$"}, {"type": "integer"}]})]
Package = Annotated[str, Strict(), matching(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", "a Python package name")]
Version = Annotated[str, Strict(), matching(r"[A-Za-z0-9][A-Za-z0-9.+!_-]{0,99}", "a version such as 2.6.0")]
Size = Annotated[str, Strict(), matching(r"\d+[bkmgBKMG]?", "a size such as 128G")]


def _seconds(value: Any) -> Any:
    """'90s', '10m', '1h' or a plain number of seconds."""
    if isinstance(value, str):
        match = re.fullmatch(r"(\d+)\s*([smh]?)", value.strip())
        if not match:
            raise ValueError(f"{value!r} is not a duration such as 90s, 10m or 1h")
        return int(match[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[match[2]]
    return value


Seconds = Annotated[int, BeforeValidator(_seconds), Field(ge=1, le=7 * 24 * 3600), WithJsonSchema(
    {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string", "pattern": r"^\d+\s*[smh]?$"}]})]


def int_as_str(value: Any) -> Any:
    # `NCCL_IB_GID_INDEX: 3` or `mem: 0` is natural YAML; booleans are not (`true`/`1`/`True` differ).
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


STR_OR_INT = WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}]})
EnvValue = Annotated[str, BeforeValidator(int_as_str), Strict(), Field(max_length=4096),
                     AfterValidator(_no_control), STR_OR_INT]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# Names and paths as Kubernetes and cloud schedulers take them (targets' sections use them).
K8sName = Annotated[str, Strict(), matching(
    r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", "a Kubernetes name: lowercase letters, digits and '-', at most 63")]
LabelKey = Annotated[str, Strict(), matching(
    r"([a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?",
    "a Kubernetes label key such as nvidia.com/gpu.product")]
LabelValue = Annotated[str, Strict(), matching(
    r"([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?", "a Kubernetes label value")]
Quantity = Annotated[str, BeforeValidator(lambda v: int_as_str(v)), Strict(), matching(
    r"[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?", "a Kubernetes quantity such as 32, 500m or 256Gi"),
    STR_OR_INT]
AbsPath = Annotated[str, Strict(), matching(r"/[A-Za-z0-9_.@+=,/-]{0,255}", "an absolute path such as /checkpoints")]
