"""verlc's in-cluster helper: runs on the head node, inside the job's container, next to verl.

Generated bundles embed this file verbatim and run it as `python3 - COMMAND ...`. It needs only the
standard library and ray; pyarrow and transformers are used when the image has them (verl's do).

  wait       block until the Ray cluster has the expected nodes and GPUs, or fail at a deadline
  prepare    run one data preprocessing command unless its outputs already exist
  preflight  check the cluster, data files, model and checkpoint folder before training starts
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

VERL_COLUMNS = ("prompt", "data_source", "reward_model")


def stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def say(message: str) -> None:
    print(f"[{stamp()}] verlc: {message}", flush=True)


def connect(address: str):  # noqa: ANN201 - ray is imported lazily: `prepare` must work without it
    import ray

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    return ray


def alive_nodes(ray) -> list[dict]:  # noqa: ANN001
    return [n for n in ray.nodes() if n.get("Alive")]


def cmd_wait(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    ray = None
    while ray is None:
        try:
            ray = connect(args.address)
        except Exception as exc:  # the head may still be starting
            if time.monotonic() > deadline:
                say(f"ERROR: no Ray head at {args.address} after {args.timeout}s: {exc}")
                return 1
            time.sleep(1)
    seen: set[str] = set()
    while True:
        nodes = alive_nodes(ray)
        for n in nodes:
            if n["NodeID"] not in seen:
                seen.add(n["NodeID"])
                gpus = n.get("Resources", {}).get("GPU", 0)
                say(f"node registered: {n.get('NodeManagerHostname')} {n.get('NodeManagerAddress')} "
                    f"GPUs={gpus:g} ({len(seen)}/{args.nodes})")
        gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in nodes)
        if len(nodes) >= args.nodes and gpus >= args.gpus:
            say(f"cluster ready: {len(nodes)} nodes, {gpus:g} GPUs")
            return 0
        if time.monotonic() > deadline:
            say(f"ERROR: after {args.timeout}s the cluster has {len(nodes)} of {args.nodes} nodes and "
                f"{gpus:g} of {args.gpus} GPUs")
            return 1
        time.sleep(0.5)


def cmd_prepare(args: argparse.Namespace) -> int:
    outputs = [os.path.join(args.out_dir, name) for name in ("train.parquet", "test.parquet")]
    if all(os.path.isfile(p) for p in outputs):
        say(f"data in {args.out_dir} already prepared; skipping")
        return 0
    say(f"preparing data into {args.out_dir}: {' '.join(args.cmd)}")
    rc = subprocess.call(args.cmd)
    if rc != 0:
        say(f"ERROR: data preparation exited with {rc}")
        return rc
    missing = [p for p in outputs if not os.path.isfile(p)]
    if missing:
        say(f"ERROR: data preparation finished but did not write {', '.join(missing)}")
        return 1
    return 0


def parquet_columns(path: str) -> list[str] | None:
    """Top-level column names of a parquet file, or None when pyarrow is not installed."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    return list(pq.read_schema(path).names)


def check_model(model: str) -> str | None:
    """Problem with the model, or None. A local folder needs a readable config.json; a hub id is
    resolved through transformers (config only, no weights) when it is installed."""
    if os.path.isdir(os.path.expanduser(model)):
        config = os.path.join(os.path.expanduser(model), "config.json")
        try:
            with open(config, encoding="utf-8") as fh:
                json.load(fh)
        except (OSError, ValueError) as exc:
            return f"model folder {model}: cannot read config.json ({exc})"
        return None
    if model.startswith(("/", "./", "../", "~")):
        return f"model path {model} does not exist"
    try:
        from transformers import AutoConfig
    except ImportError:
        return None
    try:
        AutoConfig.from_pretrained(model)
    except Exception as exc:
        return f"model {model}: config does not load ({type(exc).__name__}: {exc})"
    return None


def cmd_preflight(args: argparse.Namespace) -> int:
    problems: list[str] = []
    ray = connect(args.address)
    nodes = alive_nodes(ray)
    gpus = sum(n.get("Resources", {}).get("GPU", 0) for n in nodes)
    if len(nodes) != args.nodes:
        problems.append(f"Ray has {len(nodes)} nodes, the spec asks for {args.nodes}")
    if gpus != args.gpus:
        problems.append(f"Ray has {gpus:g} GPUs, the spec asks for {args.gpus}")
    for path in args.data:
        if not os.path.isfile(path):
            problems.append(f"data file {path} does not exist (cwd {os.getcwd()})")
            continue
        columns = parquet_columns(path)
        if columns is not None:
            missing = [c for c in VERL_COLUMNS if c not in columns]
            if missing:
                problems.append(f"data file {path} lacks verl's columns {', '.join(missing)}")
    problem = check_model(args.model)
    if problem:
        problems.append(problem)
    try:
        os.makedirs(args.checkpoint_dir, exist_ok=True)
        probe = os.path.join(args.checkpoint_dir, f".verlc-write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        problems.append(f"checkpoint folder {args.checkpoint_dir} is not writable ({exc.strerror})")
    for p in problems:
        say(f"PREFLIGHT FAILED: {p}")
    if problems:
        return 1
    say(f"preflight passed: {len(nodes)} nodes, {gpus:g} GPUs, {len(args.data)} data files, "
        f"model {args.model}")
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verlc-helper")
    sub = parser.add_subparsers(dest="command", required=True)
    wait = sub.add_parser("wait")
    wait.add_argument("--address", required=True)
    wait.add_argument("--nodes", type=int, required=True)
    wait.add_argument("--gpus", type=int, required=True)
    wait.add_argument("--timeout", type=int, required=True)
    prepare = sub.add_parser("prepare")
    prepare.add_argument("--out-dir", required=True)
    prepare.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the preprocessing command")
    pre = sub.add_parser("preflight")
    pre.add_argument("--address", required=True)
    pre.add_argument("--nodes", type=int, required=True)
    pre.add_argument("--gpus", type=int, required=True)
    pre.add_argument("--model", required=True)
    pre.add_argument("--checkpoint-dir", required=True)
    pre.add_argument("--data", action="append", default=[])
    args = parser.parse_args(argv)
    if args.command == "prepare":
        args.cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
        return cmd_prepare(args)
    return {"wait": cmd_wait, "preflight": cmd_preflight}[args.command](args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
