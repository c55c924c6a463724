"""The skypilot target: a SkyPilot task (a managed job that recovers from preemption) per run."""

from .render import render

__all__ = ["render"]
