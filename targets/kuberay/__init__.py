"""The kuberay target: a KubeRay RayJob (ray.io/v1) per run, and a ConfigMap with the job package."""

from .render import render

__all__ = ["render"]
