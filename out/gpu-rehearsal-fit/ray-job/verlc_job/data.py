# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The data stage: the data preparation, a pinned hub model's revision, and the models of a pipeline's earlier
stages, each put in place by one writer at a time and renamed into place once whole."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import subprocess
from collections.abc import Iterator

from .job import StageInput, expand
from .protocol import say


@contextlib.contextmanager
def one_writer(path: str) -> Iterator[None]:
    """Hold the lock PATH.lock for the block: runs that share a folder (a sweep's array tasks start together)
    fill it one at a time, and a later one finds it filled. A POSIX record lock (fcntl), which NFS and Lustre
    (mounted with flock) hold across nodes; the kernel drops it with a process that dies, so none is stale."""
    import fcntl

    lock = f"{os.path.normpath(path)}.lock"
    os.makedirs(os.path.dirname(os.path.abspath(lock)), exist_ok=True)
    with open(lock, "a", encoding="utf-8") as fh:
        try:
            fcntl.lockf(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            say(f"waiting for another run that is filling {path} ({lock})")
            fcntl.lockf(fh, fcntl.LOCK_EX)
        yield


def prepare(out_dir: str, cmd: list[str]) -> int:
    """Run one data preparation command unless its outputs exist already. The command writes into a folder of
    its own, whose files then replace out_dir's one by one (each a rename): nothing reads a half-written file."""
    outputs = [os.path.join(out_dir, name) for name in ("train.parquet", "test.parquet")]
    with one_writer(out_dir):
        if all(os.path.isfile(p) for p in outputs):
            say(f"data in {out_dir} already prepared; skipping")
            return 0
        partial = f"{os.path.normpath(out_dir)}.partial-{platform.node()}-{os.getpid()}"
        shutil.rmtree(partial, ignore_errors=True)
        os.makedirs(partial)  # as out_dir may be: a script that writes its files without making the folder works
        say(f"preparing data into {out_dir}: {' '.join(cmd)}")
        try:
            rc = subprocess.call([partial if arg == out_dir else arg for arg in cmd])
            written = [os.path.join(partial, p) for p in ("train.parquet", "test.parquet")]
            if rc != 0:
                say(f"ERROR: data preparation exited with {rc}")
                return rc
            missing = [o for o, w in zip(outputs, written) if not os.path.isfile(w)]
            if missing:
                say(f"ERROR: data preparation finished but did not write {', '.join(missing)}")
                return 1
            os.makedirs(out_dir, exist_ok=True)
            for parent, _, names in os.walk(partial):
                for name in names:
                    rel = os.path.relpath(os.path.join(parent, name), partial)
                    os.makedirs(os.path.dirname(os.path.join(out_dir, rel)), exist_ok=True)
                    os.replace(os.path.join(parent, name), os.path.join(out_dir, rel))
            return 0
        finally:
            shutil.rmtree(partial, ignore_errors=True)


REVISION_FILE = ".verlc-revision.json"  # written by `materialize` into the folder it fills


def revision_manifest(folder: str) -> dict:
    """What `materialize` wrote into `folder` ({} for a folder it did not fill)."""
    try:
        with open(os.path.join(folder, REVISION_FILE), encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def revision_held(folder: str, revision: str) -> dict | None:
    """The manifest `materialize` wrote into `folder`, when the folder still holds every file of `revision`."""
    held = revision_manifest(folder)
    if revision not in (held.get("revision"), held.get("requested")):
        return None
    for rel, size in held.get("files", {}).items():
        path = os.path.join(folder, rel)
        if not os.path.isfile(path) or os.path.getsize(path) != size:
            return None
    return held


def materialize(repo: str, revision: str, folder: str) -> int:
    """Put a hub model's revision into a folder verl can read: from the hub, or with HF_HUB_OFFLINE=1 from
    the local Hugging Face cache; skipped when the folder holds every file of it already."""
    with one_writer(folder):
        return _materialize(repo, revision, folder)


def _materialize(repo: str, revision: str, folder: str) -> int:
    held = revision_held(folder, revision)
    if held:
        say(f"model {repo} at {revision} already in {folder} ({len(held['files'])} files); skipping")
        return 0
    if os.path.exists(folder) and not os.path.isfile(os.path.join(folder, REVISION_FILE)):
        say(f"ERROR: {folder} exists and verlc did not fill it: move it away, or choose another model.local_dir")
        return 1
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        say("ERROR: a pinned model needs huggingface_hub on the head node (transformers, which verl needs, has it)")
        return 1
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    say(f"fetching model {repo} at {revision} into {folder}"
        + (" from the local Hugging Face cache (HF_HUB_OFFLINE)" if offline else ""))
    try:
        source = snapshot_download(repo_id=repo, revision=revision, local_files_only=offline)
    except Exception as exc:
        lines = str(exc).strip().splitlines()
        say(f"ERROR: cannot fetch {repo} at {revision}: {type(exc).__name__}: {lines[0] if lines else ''}")
        return 1
    partial = f"{folder}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    files = {}
    for parent, _, names in os.walk(source):
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(parent, name), source)
            real, into = os.path.realpath(os.path.join(parent, name)), os.path.join(partial, rel)
            os.makedirs(os.path.dirname(into), exist_ok=True)
            try:  # the cache's own file, without a second copy, where both are on one file system
                os.link(real, into)
            except OSError:
                shutil.copyfile(real, into)
            files[rel] = os.path.getsize(into)
    commit = os.path.basename(os.path.normpath(source))  # the cache names a snapshot by its commit
    with open(os.path.join(partial, REVISION_FILE), "w", encoding="utf-8") as fh:
        json.dump({"repo": repo, "requested": revision, "revision": commit, "files": files}, fh,
                  indent=1, sort_keys=True)
    shutil.rmtree(folder, ignore_errors=True)  # verlc's own folder of another revision, or a partial one
    os.replace(partial, folder)
    say(f"model {repo} at {commit}: {len(files)} files, {mib(sum(files.values()))} in {folder}")
    return 0


def mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


MERGED_MARK = "config.json"  # a merged model's folder is complete once the merger wrote it (its last step)


def saved_step(checkpoint_dir: str) -> int | None:
    """The step of verl's latest checkpoint in the folder (its latest_checkpointed_iteration.txt), or None."""
    try:
        with open(os.path.join(checkpoint_dir, "latest_checkpointed_iteration.txt"), encoding="utf-8") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def stage_input(entry: StageInput) -> tuple[dict | None, str | None]:
    """An earlier stage's last checkpoint (verl's latest_checkpointed_iteration.txt in its folder) and where its
    merged model goes; or why there is none."""
    folder = expand(entry.checkpoint_dir)
    step = saved_step(folder)
    if step is None:
        return None, (f"stage {entry.stage} left no checkpoint in {folder} (no latest_checkpointed_iteration.txt, "
                      f"cwd {os.getcwd()}): it saves one every trainer.save_freq steps and at its last step")
    checkpoint = os.path.join(folder, f"global_step_{step}", *([entry.layout] if entry.layout else []))
    merged = expand(entry.merged)
    return {"stage": entry.stage, "step": step, "checkpoint": checkpoint,
            "model": os.path.join(merged, f"global_step_{step}"), "latest": expand(entry.latest)}, None


def merge_inputs(inputs: list[StageInput]) -> int:
    """Each earlier stage's last checkpoint merged into a Hugging Face folder with verl's own merger (unless
    that step is merged already), into a temporary folder first, so that a merge that fails leaves nothing a
    later run would take for a model; then `latest` points at it."""
    for entry in inputs:
        found, problem = stage_input(entry)
        if found is None:
            say(f"ERROR: {problem}")
            return 1
        stage, model = found["stage"], found["model"]
        if os.path.isfile(os.path.join(model, MERGED_MARK)):
            say(f"stage {stage}'s step {found['step']} is merged already: {model}")
        elif not os.path.isdir(found["checkpoint"]):
            say(f"ERROR: stage {stage}'s checkpoint {found['checkpoint']} does not exist (its tracker names step "
                f"{found['step']})")
            return 1
        else:
            partial = f"{model}.partial-{os.getpid()}"
            cmd = [*entry.merger, "--local_dir", found["checkpoint"], "--target_dir", partial]
            say(f"merging stage {stage}'s checkpoint (step {found['step']}) into a Hugging Face folder: "
                + " ".join(cmd))
            rc = subprocess.call(cmd)
            if rc != 0 or not os.path.isfile(os.path.join(partial, MERGED_MARK)):
                shutil.rmtree(partial, ignore_errors=True)
                say(f"ERROR: verl's model merger exited with {rc}" + ("" if rc else f" without writing {MERGED_MARK}"))
                return rc or 1
            shutil.rmtree(model, ignore_errors=True)  # an earlier merge that did not finish
            os.replace(partial, model)
        link = f"{found['latest']}.{os.getpid()}"
        os.symlink(os.path.basename(model), link)
        os.replace(link, found["latest"])
        say(f"stage {stage}'s model: {found['latest']} -> {os.path.basename(model)}")
    return 0
