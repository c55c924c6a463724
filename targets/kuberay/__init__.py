"""The kuberay target: a KubeRay RayJob (ray.io/v1) per run, and a ConfigMap with the job package."""

from ..target import Section, Target

TARGET = Target("kuberay", __name__, Section(("kubernetes",), "resources", "Kubernetes",
                                           "The kuberay target: namespace, pods, volumes, retries."))
