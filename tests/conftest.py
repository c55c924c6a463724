"""Shared fixtures: the repository's paths, running the real CLI, and tools that must exist in CI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import pytest

REPO = Path(__file__).resolve().parent.parent
SPECS = sorted((REPO / "specs").glob("*.yaml"))
# the examples of verl's main_ppo (the others run verl's SFT trainer: their own config, no migrate)
MAIN_PPO_SPECS = [p for p in SPECS if "\nprogram: " not in p.read_text()]
# Paper runs: their code is a checkout dev/checkouts.py makes from ../shared/verl-recipe (the `recipes` fixture)
RECIPES = sorted((REPO / "specs" / "recipes").glob("*.yaml"))
# Pipelines: specs of several stages (compiler/stages.py), each stage a bundle, and the pipeline's own
PIPELINES = sorted((REPO / "specs" / "pipelines").glob("*.yaml"))


def spec_targets(spec: Path) -> tuple[str, ...]:
    """The targets an example spec is meant for (`targets:`, its bases' where it extends one, default every one):
    what `--target all` builds."""
    from verlc.compiler.load import load
    from verlc.targets import NAMES

    return tuple(load(spec).data.get("targets") or NAMES)


# (example spec, target) for every bundle the examples make
EXAMPLE_BUNDLES = [(spec, target) for spec in SPECS for target in spec_targets(spec)]
IN_CI = os.environ.get("CI") == "true"


def rollout_engine_site() -> Path:
    """A folder with the metadata of an installed vllm (no code): the rollout engine the e2e specs name, as
    the preflight finds it on a node. Put on a node's PYTHONPATH (or into a container's site-packages);
    a node without it is a node without vllm."""
    site = REPO / ".cache" / "rollout-engine-site"
    info = site / "vllm-0.0.0+verlc.test.dist-info"
    if not (info / "METADATA").exists():
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.0+verlc.test\n")
    return site


def run_verlc(*args: str | Path, cwd: Path = REPO, env: dict[str, str] | None = None, timeout: float = 600,
              ) -> subprocess.CompletedProcess[str]:
    """The installed CLI in a new process, exactly as a user runs it. The timeout only catches a hang: beside the
    machine tests (dev/test.sh runs these at nice 10) a call gets a tenth of a core at times; `validate
    --verl-config live` of every example, 11 s of CPU, took 122 s here beside three busy processes."""
    return subprocess.run([sys.executable, "-m", "verlc", *map(str, args)], cwd=cwd, text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=timeout)


def slurm_job(script: str) -> dict:
    """The job an sbatch script hands verlc's runtime (its here-document; the other bundles' job.json).
    A sweep's script holds one per array task: the first."""
    return json.loads(script.split("<<'VERLC_JOB'\n", 1)[1].split("\nVERLC_JOB\n", 1)[0])


def require_tool(name: str) -> str:
    """Path of an external tool. Missing: a failure under CI=true, a skip on a developer machine."""
    found = shutil.which(name) or (str(Path(sys.executable).parent / name)
                                   if (Path(sys.executable).parent / name).exists() else None)
    if found:
        return found
    message = f"{name} is not installed (the README's test command installs it)"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def recipes() -> list[Path]:
    """The recipe example specs, with the checkouts their `code:` names made (repository's checkouts/, ignored
    by git; made once from ../shared/verl-recipe)."""
    sys.path.insert(0, str(REPO / "dev"))
    from checkouts import CHECKOUTS, SHARED, make

    if not SHARED.is_dir():
        if IN_CI:
            pytest.fail(f"{SHARED} is missing: CI runs every test")
        pytest.skip(f"{SHARED} is missing")
    for name in CHECKOUTS:
        make(name, REPO / "checkouts")
    return RECIPES


@pytest.fixture(params=SPECS, ids=[p.stem for p in SPECS])
def example_spec(request: pytest.FixtureRequest) -> Path:
    return request.param



# The fixtures that start the machine's daemons: local Slurm (dev/slurm.sh), a Ray cluster, podman's state
# (dev/containers.sh). Their tests share the machine's ports, processes and network namespaces, and some check
# that nothing of theirs is left: they are marked `machine`, and dev/test.sh runs them one at a time in one
# pytest process, beside a second that runs all the rest (`-m "not machine"`).
MACHINE_FIXTURES = frozenset({"slurm", "ray_head", "npu_cluster", "engine"})


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        callspec = getattr(item, "callspec", None)  # a parametrize argument of the same name is not the fixture
        if MACHINE_FIXTURES & (set(getattr(item, "fixturenames", ())) - set(callspec.params if callspec else ())):
            item.add_marker(pytest.mark.machine)
    # A module's side-by-side tests (tests/test_slurm_e2e.py) go first in it: their jobs, submitted together,
    # then have the cluster to themselves, and are all over before the module's other tests begin; except one
    # marked `last`, whose long job runs beside the module's other tests, checked after them.
    first: dict[object, int] = {}
    for index, item in enumerate(items):
        first.setdefault(getattr(item, "module", None), index)

    def place(item: pytest.Item) -> int:
        mark = item.get_closest_marker("side_by_side")
        return 1 if mark is None else 2 if mark.kwargs.get("last") else 0

    items.sort(key=lambda item: (first[getattr(item, "module", None)], place(item)))


# Every process a test starts carries this session's mark in its environment (one a test gives an environment of
# its own does not); any still running when the session ends is named, stopped, and fails the session: tests leave
# the machine as they found it (a Ray client server outlived its head's fixture so, unseen until found by hand).
SESSION_MARK = "VERLC_TEST_SESSION"
LEFT_WAIT = 15  # seconds a process that is ending (a daemon's last child) gets before it counts as left


def pytest_configure(config: pytest.Config) -> None:
    os.environ[SESSION_MARK] = str(os.getpid())


class Process(NamedTuple):
    parent: int
    started: str  # clock ticks from boot to its start: with its pid, this one process and no later one
    cmdline: bytes


def processes() -> dict[int, Process]:
    """Every running process, read from /proc, but pytest itself and zombies."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z":
                found[int(entry.name)] = Process(int(fields[1]), fields[19], (entry / "cmdline").read_bytes())
        except (OSError, ValueError, IndexError):  # a process that has just gone
            continue
    return found


def stop_processes(find: Callable[[], Iterable[int]], grace: float) -> None:
    """TERM to what `find` finds, KILL to what it still finds after `grace` s; then up to 10 s for that to go."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        for pid in find():
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while find() and time.monotonic() < deadline:
            time.sleep(0.2)


def carries(pid: int, variable: str, value: str) -> bool:
    """Whether the process has variable=value in the environment it started with (not when gone, or not ours)."""
    try:
        return f"{variable}={value}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def left_running() -> dict[int, str]:
    """This session's processes still running (pid -> command line)."""
    return {pid: p.cmdline.replace(b"\0", b" ").decode(errors="replace") for pid, p in processes().items()
            if carries(pid, SESSION_MARK, str(os.getpid()))}


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    deadline = time.monotonic() + LEFT_WAIT
    while (left := left_running()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if not left:
        return
    report = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) the tests started still ran after the session; stopped now:"]
    lines += [f"  {pid}: {cmdline[:300]}" for pid, cmdline in sorted(left.items())]
    if report is not None:
        report.write_sep("=", "left running", red=True)
        report.write_line("\n".join(lines), red=True)
    else:
        print("\n".join(lines), file=sys.stderr)
    stop_processes(left_running, 2)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def failing_first(logs: str) -> str:
    """An assertion's message: the job's failure lines first (CI shows a message's head), then its whole log."""
    failing = [line for line in logs.splitlines() if "FAILED" in line or "ERROR" in line]
    return "\n".join(failing + ["-" * 40, logs])
