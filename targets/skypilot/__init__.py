"""The skypilot target: a SkyPilot task (a managed job that recovers from preemption) per run."""

from ..target import Section, Target
from .section import Skypilot

TARGET = Target("skypilot", __name__, Section(("skypilot",), "resources", Skypilot,
                                            "The skypilot target: resources, storage, recovery."))
