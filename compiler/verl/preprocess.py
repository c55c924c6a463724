"""verl's data-preparation scripts (examples/data_preprocess/ in a verl checkout), per release.

Facts read from each release's own scripts (gsm8k.py and math_dataset.py take the same options):
- up to 0.5.x they take `--local_dir` (and `--hdfs_dir`), and always read the dataset from the hub;
- 0.6.0 added `--local_save_dir` (with `--local_dir` kept as a deprecated spelling that warns) and
  `--local_dataset_path` (read the raw dataset from a local folder).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SCRIPTS = {  # dataset -> the script, relative to a verl checkout
    "gsm8k": "examples/data_preprocess/gsm8k.py",
    "math": "examples/data_preprocess/math_dataset.py",
}


@dataclass(frozen=True)
class Options:
    """How one release's preprocessing scripts are called."""

    out_dir: str                    # the option naming the output folder
    local_dataset: str | None       # the option reading the raw dataset from a folder, if the release has one


LOCAL_DATASET = "--local_dataset_path"  # also what a spec's own `script:` is given, on every release
_SINCE_0_6 = Options("--local_save_dir", LOCAL_DATASET)
_BEFORE_0_6 = Options("--local_dir", None)


def options(version: str) -> Options:
    """The options of `version`'s scripts (a version verlc cannot read is taken as the newest)."""
    numbers = [int(n) for n in re.findall(r"\d+", version)[:2]]
    return _BEFORE_0_6 if len(numbers) == 2 and tuple(numbers) < (0, 6) else _SINCE_0_6
