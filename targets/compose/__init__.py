"""The compose target: a Ray head, workers and the trainer on one Docker host (scenario B)."""

from ..target import Section, Target

TARGET = Target("compose", __name__, Section(("compose",), "container", "Compose",
                                           "The compose target's image when `container` has none."),
                runs_container=True, resumable=True)
