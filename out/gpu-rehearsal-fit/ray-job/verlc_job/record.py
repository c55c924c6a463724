# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""What a run used, for its run record: its inputs hashed, the config verl resolves, and how two records differ
(a reproducible job's re-run against its first run)."""

from __future__ import annotations

import json
import os

from .data import MERGED_MARK, revision_manifest, stage_input
from .job import Code, StageInput
from .protocol import say


# ---- what a run used: its inputs, hashed, and the config verl resolves --------------------------------
# The files that decide what a model folder is, besides its weights (hashed too large to hash every run).
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "tokenizer.model", "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json",
               "chat_template.jinja")


def sha256_file(path: str) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(8 * 1024**2), b""):
            digest.update(block)
    return digest.hexdigest()


def parquet_rows(path: str) -> int | None:
    """Rows of a parquet file; None without pyarrow or for a file pyarrow cannot read (the columns check
    names that)."""
    try:
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return None


def data_inputs(paths: list[str]) -> list[dict]:
    """Every data file as it is now: size, sha256 (every run: no cache to miss a same-size edit), rows."""
    return [{"path": p, "bytes": os.path.getsize(p), "sha256": sha256_file(p), "rows": parquet_rows(p)}
            for p in paths if os.path.isfile(p)]


def model_input(model: str) -> dict:
    """The model verl gets: a folder's config and tokenizer files hashed, and the hub revision it holds when
    `materialize` filled it; a hub id as it is (resolved by the hub when training starts)."""
    folder = os.path.expanduser(model)
    if not os.path.isdir(folder):
        return {"path": model, "revision": None, "files": {}}
    return {"path": model, "revision": revision_manifest(folder).get("revision"),
            "files": {name: sha256_file(os.path.join(folder, name)) for name in MODEL_FILES
                      if os.path.isfile(os.path.join(folder, name))}}


def code_inputs(code: Code) -> tuple[dict, list[str]]:
    """The run's code where the job runs (its working dir): each file the bundle was built with, hashed
    here; problems for one that is missing or not the same bytes."""
    files, problems = {}, []
    for name, built in sorted(code.files.items()):
        if not os.path.isfile(name):
            files[name] = None
            problems.append(f"the run's code lacks {name} here ({os.getcwd()}): the job runs in {code.folder}")
            continue
        files[name] = sha256_file(name)
        if files[name] != built:
            problems.append(f"{name} here is not the file the bundle was built with (sha256 {files[name][:12]}, "
                            f"built {built[:12]}): rebuild, or ship the code that was built")
    return {"commit": code.commit, "dirty": code.dirty, "diff_sha256": code.diff_sha256,
            "files": files}, problems


def stage_records(inputs: list[StageInput]) -> tuple[list[dict], list[str]]:
    """What the run record keeps of each earlier stage's model: its step, and every file's sha256 (so a
    re-run shows it started from the same model); and the problems of a model that is not there."""
    records, problems = [], []
    for entry in inputs:
        found, problem = stage_input(entry)
        if found is None:
            problems.append(problem)
            continue
        model = found["model"]
        files = {os.path.relpath(os.path.join(root, name), model): sha256_file(os.path.join(root, name))
                 for root, _, names in os.walk(model) for name in names} if os.path.isdir(model) else {}
        if MERGED_MARK not in files:
            problems.append(f"stage {found['stage']}'s merged model {model} is missing (the data stage merges it)")
        records.append({**found, "files": dict(sorted(files.items()))})
    return records, problems


def resolved_verl_config(train: list[str]) -> dict:
    """verl's config as its trainer composes it from `train` (Hydra, with this node's verl), resolved;
    {"unresolved": why} when this node cannot compose it."""
    try:
        module = train[train.index("-m") + 1]
    except (ValueError, IndexError):
        return {"unresolved": "no `python3 -m MODULE` in the trainer argv"}
    rest = train[train.index("-m") + 2:]
    name = next((a.split("=", 1)[1] for a in rest if a.startswith("--config-name=")), "ppo_trainer")
    overrides = [a for a in rest if not a.startswith("-")]
    try:
        from hydra import compose, initialize_config_dir
        from omegaconf import OmegaConf

        folder = config_folder(module)
        with initialize_config_dir(config_dir=folder, version_base=None):
            config = compose(config_name=name, overrides=overrides)
        return OmegaConf.to_container(config, resolve=True)
    except Exception as exc:  # no hydra here, an older layout, a value that only resolves at training
        return {"unresolved": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"}


def config_folder(module: str) -> str:
    """The config/ folder of `module`'s package, found without importing it: importing verl (torch, Ray,
    transformers) took most of the 10 s this check took on a GPU node, and Hydra reads only the folder (no
    release of verl registers OmegaConf resolvers of its own)."""
    import importlib.util

    top, *middle = module.split(".")[:-1] or [""]
    spec = importlib.util.find_spec(top) if top else None  # a top-level name's spec: found, nothing imported
    if spec is None:
        raise ModuleNotFoundError(f"No module named {top or module!r}")
    for location in spec.submodule_search_locations or []:
        folder = os.path.join(location, *middle, "config")
        if os.path.isdir(folder):
            return folder
    raise ModuleNotFoundError(f"no config folder beside {module}")


def flat(tree: object, prefix: str = "") -> dict[str, object]:
    if isinstance(tree, dict):
        out: dict[str, object] = {}
        for key, value in tree.items():
            out.update(flat(value, f"{prefix}.{key}" if prefix else str(key)))
        return out or {prefix: {}}
    return {prefix: tree}


# What two run records are compared by: group -> item -> value. A reproducible re-run must match its first
# run in every group but resources (the nodes a scheduler gives may change).
GROUPS = ("inputs", "versions", "verl config", "resources")


def record_items(record: dict) -> dict[str, dict[str, object]]:
    inputs: dict[str, object] = {}
    code = record.get("inputs", {}).get("code") or {}
    if code:
        inputs.update({"code commit": code.get("commit"), "code uncommitted diff sha256": code.get("diff_sha256")})
        inputs.update({f"code {name} sha256": h for name, h in sorted(code.files.items())})
    for f in record.get("inputs", {}).get("data", []):
        inputs.update({f"data {f['path']} sha256": f["sha256"], f"data {f['path']} rows": f["rows"],
                       f"data {f['path']} bytes": f["bytes"]})
    model = record.get("inputs", {}).get("model") or {}
    if model:
        inputs.update({"model path": model.get("path"), "model revision": model.get("revision")})
        inputs.update({f"model {name} sha256": h for name, h in sorted(model.get("files", {}).items())})
    for stage in record.get("inputs", {}).get("stages", []):  # an earlier stage's model: its step and every file
        inputs.update({f"stage {stage['stage']} step": stage.get("step")})
        inputs.update({f"stage {stage['stage']} model {name} sha256": h for name, h in
                       sorted(stage.get("files", {}).items())})
    nodes = record.get("nodes", [])
    versions = {"image": record.get("image"), "python": nodes[0].get("python") if nodes else None,
                **record.get("versions", {})}
    argv = record.get("trainer_argv") or []
    # from the program's launcher on (older records had `env RAY_ADDRESS=<this job's port>` before it)
    start = next((i for i, a in enumerate(argv) if a in ("python3", "torchrun")), 0)
    verl = {"trainer argv": " ".join(argv[start:]),
            **{f"verl {k}": v for k, v in flat(record.get("verl_config") or {}).items()}}
    resources = {"nodes": len(nodes), "GPUs": record.get("gpus"),
                 **{f"node {i} host": n.get("host") for i, n in enumerate(nodes)},
                 **{f"node {i} CPUs": n.get("cpus") for i, n in enumerate(nodes)}}
    return dict(zip(GROUPS, (inputs, versions, verl, resources)))


def record_differences(old: dict, new: dict, groups: tuple[str, ...] = GROUPS) -> dict[str, list[tuple]]:
    """group -> [(item, old value, new value)] for every item that differs (missing on one side: None)."""
    a, b = record_items(old), record_items(new)
    out = {}
    for group in groups:
        keys = sorted(set(a[group]) | set(b[group]))
        changed = [(k, a[group].get(k), b[group].get(k)) for k in keys if a[group].get(k) != b[group].get(k)]
        if changed:
            out[group] = changed
    return out


def reference_problems(record: dict, path: str) -> list[str]:
    """A reproducible job's re-run must see the inputs, versions and verl config its first run saw."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        first = json.load(fh)
    # A first run recorded by an older verlc lacks what it did not record yet: not comparable, said so.
    unknown = [group for group, keys in (("inputs", ("inputs",)), ("verl config", ("verl_config", "trainer_argv")))
               if not all(k in first for k in keys)]
    for group in unknown:
        say(f"the first run's record ({path}) has no {group} (an older verlc wrote it): {group} not compared")
    return [f"{group}: {item}: {new if new is not None else 'none'}, but the first run ({path}) had "
            f"{old if old is not None else 'none'}"
            for group, changes in record_differences(first, record, tuple(g for g in GROUPS[:3] if g not in unknown)
                                                     ).items()
            for item, old, new in changes]
