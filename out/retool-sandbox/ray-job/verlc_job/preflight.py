# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""The preflight stage: the cluster, every node's packages (and NPUs), what verl's workers import at start-up,
an all-reduce over every GPU (NPU), the data files, the model and the checkpoint folder on every node; then the run
record (and a reproducible job's first-run record)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from typing import TypeVar

from .cluster import NODE_TIMES, alive_nodes, clock_offsets, connect, node_label, on_each_node
from .collective import COLLECTIVE_TIMEOUT, collective_problems
from .job import Job, expand
from .nodes import (check_model, checkpoint_problem, missing_env_per_node, npu_problems, parquet_columns,
                    paths_on_node, verl_commit_problems, version_problems, versions_per_node)
from .protocol import check_message, clocks_message, record_messages, say, stamp
from .services import Services
from .record import (code_inputs, data_inputs, flat, model_input, reference_problems, resolved_verl_config,
                     sha256_file, stage_records)
from .startup import (STARTUP_TIMEOUT, memory_found, memory_problems, startup_found, startup_problems,
                      startup_record)

T = TypeVar("T")


def preflight(job: Job, address: str, services: Services | None = None) -> int:
    """The preflight stage: the cluster, every node (while the head hashes the inputs and reads the data), the
    paths on every node, the collective and the services (ready, and a real request each); then the run record,
    written whatever was found. 0: passed. Each check's time is said (the run's timeline)."""
    started = stamp()
    ray = connect(address)
    nodes, gpus, problems = timed("cluster", cluster_problems, ray, job)
    data = [expand(f) for f in job.data_files]
    files = [expand(f) for f in job.files]
    trainer = services.trainer_nodes(nodes) if services else nodes  # a service's own node holds its GPUs
    seen, found, inputs, verl_config, summary, more = at_once(ray, nodes, trainer, job, data, files, not problems)
    problems += more
    clocks = timed("clocks", node_clocks, ray, nodes)
    problems += timed("paths", path_problems, ray, nodes, job, files)
    if services and not problems:  # they came up beside the bring-up and the data stage
        problems += timed("services", services.ready)
    memory, more = memory_check(ray, trainer, found, job) if not problems else ({}, [])
    problems += more
    run_record = {
        "started": started,
        "image": job.image,
        "inputs": inputs,
        "trainer_argv": job.train,
        "verl_config": verl_config,
        "nodes": [{"host": n.get("NodeManagerHostname"), "address": n.get("NodeManagerAddress"),
                   "gpus": n.get("Resources", {}).get(job.device, 0), "cpus": n.get("Resources", {}).get("CPU", 0),
                   **seen.get(n["NodeID"], {})} for n in nodes],
        "gpus": gpus,
        "clocks": clocks,
        "versions": next(iter(seen.values()), {}).get("packages", {}),
        "pins": dict(p.split("=", 1) for p in job.pins),
        "startup": startup_record(found, job.startup),
        **({"gpu_memory": {info["host"]: info.get("gpus") for info in memory.values()}} if memory else {}),
        "problems": problems,
        **({"services": services.record} if services else {}),
    }
    reference = expand(job.reference) if job.reference else None
    problems += compared(run_record, reference)
    text = json.dumps(run_record, indent=1, sort_keys=True) + "\n"
    show(run_record)
    if job.record:
        write(expand(job.record), text)
    for p in problems:
        say(f"PREFLIGHT FAILED: {p}")
    if problems:
        return 1
    if reference and (not os.path.exists(reference) or run_record.get("accepted_changes")):
        first = not os.path.exists(reference)
        write(reference, text)
        say(f"first run of a reproducible job: its record is now {reference}" if first
            else f"the accepted changes are in this run's record; later re-runs compare with it ({reference})")
    say(f"preflight passed: {len(nodes)} nodes, {gpus:g} {job.device}s, {len(data)} data files, "
        f"model {expand(job.model)}, {summary}")
    return 0


def memory_check(ray, trainer: list[dict], found: dict, job: Job) -> tuple[dict, list[str]]:  # noqa: ANN001
    """Each GPU's free memory against vLLM's ask (where the rollout is vLLM) and the plan's predicted peak: with
    the services up, each holding what it holds; on the trainer's nodes whose start-up check saw a CUDA device
    (all where it did not run)."""
    measured = [n for n in trainer if "cuda" in found.get(n["NodeID"], {}).get("devices", ["cuda"])]
    if not job.rollout_memory or not measured:
        return {}, []
    memory, unanswered = timed("gpu memory", lambda: on_each_node(
        ray, measured, memory_found, what="GPU memory", timeout=STARTUP_TIMEOUT + 30, see=True))
    return memory, unanswered + memory_problems(memory, job.rollout_memory)


def at_once(ray, nodes: list[dict], trainer: list[dict], job: Job, data: list[str], files: list[str],  # noqa: ANN001
            collective: bool) -> tuple[dict, dict, dict, dict, str, list[str]]:
    """The checks that run at once: the head's own work (hashes, columns, verl's config), each node's packages,
    verl's start-up needs and the all-reduce on the trainer's nodes (where the cluster is the job's:
    `collective`; the all-reduce holds every GPU of a node, the needs see them beside it). What each node has,
    what each showed of the needs, the inputs' record, verl's config, the all-reduce's summary, and the
    problems."""
    with ThreadPoolExecutor(4) as beside:
        local = beside.submit(lambda: (timed("inputs", inputs_record, job, data, files),
                                       timed("data", data_problems, job, data)))
        config = beside.submit(timed, "verl config", resolved_verl_config, job.train)
        needs = beside.submit(timed, "start-up needs", startup_check, ray, trainer, job) if job.startup else None
        reduce = beside.submit(timed, "all-reduce", collective_problems, ray, trainer, COLLECTIVE_TIMEOUT,
                               job.device) if collective else None
        seen, problems = timed("nodes", node_problems, ray, nodes, job)
        (inputs, more_inputs), more_data = local.result()
        found, more_needs = needs.result() if needs else ({}, [])
        more_reduce, summary = reduce.result() if reduce else ([], "")
        return seen, found, inputs, config.result(), summary, problems + more_inputs + more_data + more_needs + \
            more_reduce


def node_clocks(ray, nodes: list[dict]) -> dict:  # noqa: ANN001
    """Each node's clock against the head's, said (the timeline's times are each node's own clock), as the run
    record keeps it: node -> its offset and the bound on it, in seconds."""
    clocks = clock_offsets(ray, nodes)
    if clocks:
        say(clocks_message(clocks))
    return {node: {"offset": round(offset, 6), "within": round(within, 6)} for node, (offset, within) in clocks.items()}


def timed(name: str, check: Callable[..., T], *args: object) -> T:
    """One check of the preflight, its time said as an event line (the run's timeline), with its slowest node
    where it ran a task on several (their own times, summed per node: cluster.NODE_TIMES)."""
    began, times = time.monotonic(), []
    token = NODE_TIMES.set(times)
    try:
        return check(*args)
    finally:
        NODE_TIMES.reset(token)
        per_node: dict[str, float] = {}
        for node, seconds in times:
            per_node[node] = per_node.get(node, 0.0) + seconds
        slowest = max(per_node.items(), key=lambda item: item[1]) if len(per_node) > 1 else None
        say(check_message(name, time.monotonic() - began, slowest))


def cluster_problems(ray, job: Job) -> tuple[list[dict], float, list[str]]:  # noqa: ANN001
    """The cluster's live nodes and accelerators, and how they differ from the job's."""
    nodes = alive_nodes(ray)
    gpus = sum(n.get("Resources", {}).get(job.device, 0) for n in nodes)
    problems = []
    if len(nodes) != job.nodes:
        problems.append(f"Ray has {len(nodes)} nodes, the spec asks for {job.nodes}")
    if gpus != job.total_gpus:
        problems.append(f"Ray has {gpus:g} {job.device}s, the spec asks for {job.total_gpus}")
    return nodes, gpus, problems


def node_problems(ray, nodes: list[dict], job: Job) -> tuple[dict, list[str]]:  # noqa: ANN001
    """What each node has (by NodeID), and its problems: package versions and pins, NPUs, verl's commit, the
    environment the spec reads."""
    seen, problems = versions_per_node(ray, nodes, job.device)
    problems += version_problems(seen, dict(p.split("=", 1) for p in job.pins), job.rollout_package)
    if job.device == "NPU":
        problems += npu_problems(seen, [n for n in nodes if n["NodeID"] in seen])
    if job.verl_commit:
        problems += verl_commit_problems(seen, job.verl_commit)
    if job.require_env:
        problems += missing_env_per_node(ray, nodes, job.require_env)
    return seen, problems


def startup_check(ray, nodes: list[dict], job: Job) -> tuple[dict, list[str]]:  # noqa: ANN001
    """verl's start-up needs on every node, in a fresh Python that sees the node's GPUs as verl's workers will
    (without holding them: the all-reduce holds them meanwhile): what each node showed, and the problems (a node
    that did not answer, a need it lacks)."""
    model = expand(job.model)  # the folder whose tokenizer a chat_tokens need reads
    asked = [{**asdict(n), **({"model": model} if n.check == "chat_tokens" else {})} for n in job.startup]
    found, unanswered = on_each_node(ray, nodes, startup_found, asked,
                                     what="start-up needs", timeout=STARTUP_TIMEOUT + 30, see=True)
    return found, unanswered + startup_problems(found, job.startup)


def data_problems(job: Job, data: list[str]) -> list[str]:
    """Each data file, with verl's columns."""
    problems = []
    if not job.data_columns:
        say("data columns: not checked (the program reads the columns its own config names)")
    for path in data:
        if not os.path.isfile(path):
            problems.append(f"data file {path} does not exist (cwd {os.getcwd()})")
            continue
        found = parquet_columns(path) if job.data_columns else None
        missing = [c for c in job.data_columns if c not in found] if found is not None else []
        if missing:
            problems.append(f"data file {path} lacks verl's columns {', '.join(missing)}")
    return problems


def path_problems(ray, nodes: list[dict], job: Job, files: list[str]) -> list[str]:  # noqa: ANN001
    """The model, the checkpoint folder and the files verl's settings name, here and on every other node (a folder
    only the head sees fails verl's workers elsewhere)."""
    model = expand(job.model)
    problems = [p for p in [check_model(model) if model else None,  # verl's evaluation takes no model
                            checkpoint_problem(expand(job.checkpoint_dir))] if p]
    problems += [f"file {f} (named by a verl setting) does not exist" for f in files if not os.path.isfile(f)]
    here = ray.get_runtime_context().get_node_id()
    others = [n for n in nodes if n["NodeID"] != here]
    if not others:
        return problems
    found, unanswered = on_each_node(ray, others, paths_on_node, job.model, job.checkpoint_dir, job.data_files,
                                     job.files, what="paths")
    return problems + unanswered + [f"node {node_label(n)}: {p}" for n in others for p in found.get(n["NodeID"], [])]


def inputs_record(job: Job, data: list[str], files: list[str]) -> tuple[dict, list[str]]:
    """What the run record keeps of the run's inputs, each hashed as it is now; and the problems of the run's code
    (not as built) and of earlier stages' models (missing)."""
    model = expand(job.model)
    record: dict = {"data": data_inputs(data)}
    problems: list[str] = []
    if model:
        record["model"] = model_input(model)
    if files:
        record["files"] = {f: sha256_file(f) for f in files if os.path.isfile(f)}
    if job.code:
        record["code"], more = code_inputs(job.code)
        problems += more
    if job.inputs:
        record["stages"], more = stage_records(job.inputs)
        problems += more
    return record, problems


def compared(run_record: dict, reference: str | None) -> list[str]:
    """A reproducible job's re-run against its first run: the differences, as problems; or, accepted
    (VERLC_ACCEPT_CHANGES=1), kept in the record instead."""
    changes = reference_problems(run_record, reference) if reference else []
    if changes and os.environ.get("VERLC_ACCEPT_CHANGES") == "1":
        run_record["accepted_changes"] = changes
        for change in changes:
            say(f"accepted change (VERLC_ACCEPT_CHANGES=1): {change}")
        return []
    return changes


def show(run_record: dict) -> None:
    """The record in the job's log, but verl's whole config (the record file has it)."""
    for message in record_messages({k: v for k, v in run_record.items() if k != "verl_config"}):
        say(message)
    unresolved = run_record["verl_config"].get("unresolved")
    say(f"verl config: not resolved here ({unresolved})" if unresolved
        else f"verl config: {len(flat(run_record['verl_config']))} settings, as verl resolves them (in the record)")


def write(path: str, text: str) -> None:
    """A record file, whole or not at all."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)
