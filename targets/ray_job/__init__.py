"""The ray-job target: `ray job submit` to an existing Ray cluster (scenario C)."""

from ...compiler.catalog import ONE_JOB
from ..target import Target

TARGET = Target("ray-job", __name__, resumable=True, pipelines=ONE_JOB)
