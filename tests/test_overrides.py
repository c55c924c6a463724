"""verl overrides: the values verlc writes parse back, through Hydra's own parser, to the spec's values;
and every example spec's overrides compose against the installed verl's ppo_trainer config."""

from __future__ import annotations

import importlib.util
import math
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SPECS
from verlc.compiler.verl.hydra import hydra_value
from verlc.compiler.pipeline import compile_spec
from verlc.targets import CATALOG

hydra = pytest.importorskip("hydra", reason="hydra-core comes with verl; the test command installs it")
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402

PARSER = OverridesParser.create()

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10**12, 10**12),
    st.floats(allow_nan=False, allow_infinity=True),
    # `${...}` is Hydra interpolation, which verl users write on purpose: not a plain string.
    st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40).filter(lambda s: "${" not in s),
)
values = st.one_of(scalars, st.lists(scalars, max_size=4))


def parsed(text: str) -> Any:
    return PARSER.parse_override(f"key={text}").value()


def same(a: Any, b: Any) -> bool:
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float):
        return isinstance(b, float) and (a == b or (math.isinf(a) and a == b))
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(values)
def test_hydra_parses_back_the_spec_value(value: Any) -> None:
    assert same(parsed(hydra_value(value)), value), hydra_value(value)


@pytest.mark.parametrize("text", ["true", "null", "1.5", "1e-6", "inf", "a b", "it's", "x,y", "[a]",
                                  "back\\slash'", "trailing\\", "=", "~/models/x", "../data/train.parquet"])
def test_strings_that_look_like_other_things_stay_strings(text: str) -> None:
    assert parsed(hydra_value(text)) == text


def verl_config_dir() -> str:
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("verl is not installed (the README's test command installs it)")
    return str(Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config")


def release_config_dir(version: str) -> str:
    """The trainer configs of the spec's release: the installed verl's, else that release's own files."""
    import sys
    from importlib.metadata import version as installed

    if version == installed("verl"):
        return verl_config_dir()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "dev"))
    from verl_schema import release_package

    return str(release_package(version) / "trainer" / "config")


@pytest.mark.parametrize("spec", SPECS, ids=[p.stem for p in SPECS])
def test_example_overrides_compose_in_installed_verl(spec: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each example's overrides compose in its release's Hydra config (the installed verl's, where it is that
    release), and the values verlc derives land where verl reads them."""
    monkeypatch.setenv("GPU_REHEARSAL", "/gpu-rehearsal")  # the GPU rehearsal's paths (its folder on that machine)
    ir = compile_spec(spec, CATALOG, display=str(spec), source=spec.name)
    with initialize_config_dir(config_dir=release_config_dir(ir.verl_version), version_base=None):
        cfg = compose(ir.config_name, overrides=[o.arg for o in ir.overrides if not o.key.startswith("--")])
    if ir.config_name != "sft_trainer_engine" or "nnodes" in cfg.trainer:  # 0.6.1's SFT config has no node counts
        assert cfg.trainer.nnodes == ir.nodes - ir.service_nodes  # the allocation less the services' own
        assert cfg.trainer.n_gpus_per_node == ir.gpus_per_node
    on_node = os.path.expandvars  # a path naming ${NAME} is expanded where the job runs, as Hydra's oc.env does
    model = cfg.actor_rollout_ref.model.path if "actor_rollout_ref" in cfg else cfg.model.path
    assert model == on_node(ir.model.display)
    assert list(cfg.data.train_files) == [on_node(f.display) for f in ir.data_files[:1]]


def test_a_typo_does_not_compose() -> None:
    """The composition above really checks keys: a misspelt one is refused by verl's config."""
    with initialize_config_dir(config_dir=verl_config_dir(), version_base=None):
        with pytest.raises(Exception, match="gpu_memory_utilisation"):
            compose("ppo_trainer", overrides=["actor_rollout_ref.rollout.gpu_memory_utilisation=0.9"])
