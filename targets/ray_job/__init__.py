"""The ray-job target: `ray job submit` to an existing Ray cluster (scenario C)."""

from .render import render

__all__ = ["render"]
