"""The compose target: a Ray head, workers and the trainer on one Docker host (scenario B)."""

from .render import render

__all__ = ["render"]
