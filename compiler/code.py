"""The run's own code: the folder the job runs in (a recipe, reward functions, tool and agent-loop configs).

Read at build time, like the spec: its git commit, whether the tree has uncommitted changes (and their
diff), and the files the spec's verl settings name, each hashed. The bundle carries all of it; the
preflight hashes the same files where the job runs and records both, so a run record says which code ran.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import Spec

# verl settings whose value is a file of the run's code (relative: to the job's working dir, the code folder).
FILE_KEYS = (
    "custom_reward_function.path", "reward.custom_reward_function.path", "reward.reward_manager.module.path",
    "reward_model.reward_loop_module_path", "actor_rollout_ref.rollout.multi_turn.tool_config_path",
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    "actor_rollout_ref.rollout.multi_turn.function_tool_path", "actor_rollout_ref.rollout.agent.agent_loop_config_path",
    "data.tool_config_path", "data.function_tool_path",
)


def has_code(spec: "Spec") -> bool:
    """Whether the job runs in the run's own code folder: named in `code:`, a program of its own, or configs of
    its own."""
    return spec.code is not None or spec.program.split(".")[0] != "verl" or spec.hydra.config_dir is not None


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=120)


def state(root: Path) -> tuple[str | None, bool, str]:
    """(commit, dirty, diff) of a folder: HEAD, uncommitted changes, and `git diff HEAD` plus each untracked
    file's sha256 (not its bytes). Not a git checkout: (None, False, "")."""
    status = _git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "--", ".")
    head = next((line.split()[2] for line in status.stdout.splitlines() if line.startswith("# branch.oid ")), None)
    if status.returncode != 0 or head is None or head == "(initial)":
        return None, False, ""
    if not any(not line.startswith("#") for line in status.stdout.splitlines()):
        return head, False, ""
    diff = _git(root, "diff", "HEAD", "--binary", "--", ".").stdout
    untracked = _git(root, "ls-files", "--others", "--exclude-standard", "--", ".").stdout.splitlines()
    diff += "".join(f"untracked {name} sha256 {sha256(root / name)}\n" for name in sorted(untracked))
    return head, True, diff


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def bundle_folder(spec_path: Path, root: Path) -> str:
    """The code folder as the bundle names it: relative to the git checkout holding the spec (its folder when
    there is none), where sbatch and submit.sh are run from, as the bundle names the spec itself. The same
    bytes from any working directory."""
    spec_dir = spec_path.resolve().parent
    base = next((p for p in (spec_dir, *spec_dir.parents) if (p / ".git").exists()), spec_dir)
    return os.path.relpath(root.resolve(), base)


def named_files(values: dict[str, object]) -> dict[str, str]:
    """{verl key: relative path} for the settings that name a file of the code."""
    return {k: v for k, v in values.items() if k in FILE_KEYS and isinstance(v, str) and v
            and not v.startswith(("/", "~", "$", "pkg://", "hf://", "s3://", "gs://", "hdfs://"))}


def absolute_files(values: dict[str, object]) -> dict[str, str]:
    """{verl key: absolute path} for the settings that name a file outside the code (on the nodes' storage): the
    preflight checks each on every node and hashes it into the run record, as it does the code's own."""
    return {k: v for k, v in values.items() if k in FILE_KEYS and isinstance(v, str) and v.startswith("/")}


def inside(root: Path, relative: str) -> bool:
    return (root / relative).resolve().is_relative_to(root.resolve())
