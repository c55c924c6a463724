"""The compose target: a Ray head, workers and the trainer on one Docker host (scenario B)."""

from ..target import Section, Target

TARGET = Target("compose", __name__, Section(("compose",), "container"), runs_container=True, resumable=True)
