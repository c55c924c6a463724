"""The skypilot target: a SkyPilot task (a managed job that recovers from preemption) per run."""

from ..target import Section, Target

TARGET = Target("skypilot", __name__, Section(("skypilot",), "resources", "Skypilot",
                                            "The skypilot target: resources, storage, recovery."))
