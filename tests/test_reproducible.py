"""reproducible: true: what the spec must pin, and verl's determinism settings turned on."""

from __future__ import annotations

import copy
from pathlib import Path

from test_hostile import BASE, build

DIGEST = "img@sha256:" + "ab" * 32


def spec(**changes: object) -> dict:
    s = copy.deepcopy(BASE)
    s.update({"reproducible": True, "verl_version": "0.9.1"})
    s["container"] = {**s["container"], "image": DIGEST}
    s.update(changes)
    return s


def test_a_pinned_spec_turns_on_verls_determinism(tmp_path: Path) -> None:
    ir, _ = build(tmp_path, spec(), ("slurm", "ray-job"))
    args = set(ir.trainer_argv)
    for expected in ("data.seed=42", "actor_rollout_ref.rollout.seed=42", "actor_rollout_ref.rollout.full_determinism=true",
                     "actor_rollout_ref.actor.fsdp_config.full_determinism=true",
                     "actor_rollout_ref.ref.fsdp_config.full_determinism=true", "critic.fsdp.full_determinism=true"):
        assert expected in args
    assert "full_determinism: true" in ir.verl_config


def test_a_tag_is_not_a_pin(tmp_path: Path) -> None:
    problems = build(tmp_path, spec(container={**BASE["container"], "image": "img:latest"}))
    assert any("container.image: reproducible: true needs the image pinned by digest" in p for p in problems)


def test_verl_version_must_be_written(tmp_path: Path) -> None:
    s = spec()
    del s["verl_version"]
    problems = build(tmp_path, s)
    assert any("reproducible: true needs verl_version written in the spec" in p for p in problems)


def test_determinism_cannot_be_turned_off(tmp_path: Path) -> None:
    s = spec()
    s["verl"] = copy.deepcopy(s["verl"])
    s["verl"]["actor_rollout_ref"]["rollout"]["full_determinism"] = False
    problems = build(tmp_path, s)
    assert any("rollout.full_determinism: set to false here, but reproducible: true needs it on" in p for p in problems)
