"""Block-style YAML for JSON-like data: the one writer of every generated YAML file.

ruamel's pure-Python emitter costs ~60 ms for verl's 1,100-key config; this writer does the same
job in a few ms. Strings stay plain only when no YAML 1.1 or 1.2 reader could take them for
anything else; all others are JSON strings, which YAML 1.2 reads as double-quoted scalars.
tests/test_yaml_text.py checks that ruamel reads back exactly what was written.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_PLAIN = re.compile(r"(?!\.[0-9])[A-Za-z_/.][A-Za-z0-9_./@+=,-]*")  # `.5` would read as a number
# Plain words a YAML reader (1.1 or 1.2) resolves to something other than a string.
_SPECIAL = re.compile(r"(?i)(y|n|yes|no|on|off|true|false|null|~|[-+]?\.?(inf|nan))")
# Characters JSON leaves alone that YAML readers refuse or read as line breaks (DEL, C1, NEL, LS, BOM).
_UNPRINTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")


def scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        text = repr(value)
        return text if ("." in text or "e" in text) else text + ".0"
    if isinstance(value, str):
        if _PLAIN.fullmatch(value) and not _SPECIAL.fullmatch(value) and not value.endswith(":"):
            return value
        quoted = json.dumps(value, ensure_ascii=False)
        return _UNPRINTABLE.sub(lambda m: f"\\u{ord(m[0]):04x}", quoted)
    raise TypeError(f"no YAML for {type(value).__name__}")


def dump(data: Any) -> str:
    """`data` (dicts with string keys, lists, scalars) as block YAML, in the data's own order."""
    lines: list[str] = []
    _node(data, 0, lines)
    return "\n".join(lines) + "\n"


def _node(value: Any, indent: int, lines: list[str]) -> None:
    pad = " " * indent
    if isinstance(value, dict):
        if not value:
            lines.append(pad + "{}")
        for key, item in value.items():
            head = f"{pad}{scalar(str(key))}:"
            if isinstance(item, (dict, list)) and item:
                lines.append(head)
                _node(item, indent + (2 if isinstance(item, dict) else 0), lines)
            elif isinstance(item, str) and _is_block(item):
                lines.append(f"{head} |")  # a script: a literal block, read back byte for byte
                lines.extend(f"{pad}  {line}" if line else "" for line in item[:-1].split("\n"))
            else:
                lines.append(f"{head} {_inline(item)}")
    elif isinstance(value, list):
        if not value:
            lines.append(pad + "[]")
        for item in value:
            if isinstance(item, (dict, list)) and item:
                sub: list[str] = []
                _node(item, indent + 2, sub)
                lines.append(f"{pad}- {sub[0][indent + 2:]}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_inline(item)}")
    else:
        lines.append(pad + scalar(value))


def _is_block(text: str) -> bool:
    """Text a literal block scalar (`|`) holds exactly: several lines and one final newline, no tab, CR or
    unprintable character, and a first line that does not start with a space (that needs an indicator)."""
    return ("\n" in text[:-1] and text.endswith("\n") and not text.endswith("\n\n") and text[0] not in " \n"
            and not re.search(r"[\t\r]", text) and not _UNPRINTABLE.search(text))


def _inline(value: Any) -> str:
    if isinstance(value, dict):
        return "{}"
    if isinstance(value, list):
        return "[]"
    return scalar(value)
