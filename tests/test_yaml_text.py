"""The YAML writer: whatever it writes, a YAML 1.2 reader (ruamel) reads back exactly."""

from __future__ import annotations

import io
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from verlc.compiler.yaml_text import dump

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
                    st.sampled_from(["yes", "no", "on", "Off", "y", "N", "~", "null", "1e-6", "0x10", "010",
                                     ".inf", "-", "- a", "a: b", "#x", "@x", "`x", "key:", "'", '"', "", " ",
                                     "\t", "\n", "\u2028", "\ufeff", "x" * 300]))
data = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=20)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=500, deadline=None)
@given(st.dictionaries(st.text(max_size=8), data, max_size=5))
def test_ruamel_reads_back_what_was_written(value: dict) -> None:
    yaml = YAML(typ="safe", pure=True)
    text = dump(value)
    assert same(yaml.load(io.StringIO(text)) or {}, value), text
