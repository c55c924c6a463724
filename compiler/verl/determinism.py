"""verl's determinism settings, and which of them one release and engine have.

A seed only shuffles data; reproducible runs also need the engines' full determinism (verl
docs/advance/determinism.md; issues #3126, #997). Each is passed only where the release has it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .place import KNOWN

if TYPE_CHECKING:
    from .check import Selection

SETTINGS: dict[str, Any] = {
    "data.seed": 42,
    "actor_rollout_ref.rollout.seed": 42,
    "actor_rollout_ref.rollout.full_determinism": True,
    "actor_rollout_ref.actor.fsdp_config.full_determinism": True,
    "actor_rollout_ref.ref.fsdp_config.full_determinism": True,
    "critic.fsdp.full_determinism": True,
}


def available(chosen: Selection) -> dict[str, Any]:
    """The determinism settings the chosen release and engine have in their config, with verlc's values."""
    walker = chosen.walker
    return {k: v for k, v in SETTINGS.items() if (p := walker.place(k.split("."))).status == KNOWN and p.in_yaml}


def describe(chosen: Selection) -> str:
    """One line for people: what `reproducible: true` turns on in this release."""
    found = available(chosen)
    release = chosen.release.version
    if not found:
        return f"verl {release} has none of verl's determinism settings: reproducible: true cannot make its training deterministic"
    full = [k for k in found if k.endswith("full_determinism")]
    line = f"on verl {release}, reproducible: true sets {', '.join(found)}"
    return line if full else line + " (this release has no full_determinism setting: its engines stay non-deterministic)"
