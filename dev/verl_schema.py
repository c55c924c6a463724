"""Write compiler/verl/schemas/<version>.json.gz (and .docs.json.gz) for every verl release verlc supports.

    .venv/bin/python dev/verl_schema.py                 # every release in compiler/verl/release.py
    .venv/bin/python dev/verl_schema.py 0.4.1 0.9.1     # some of them
    .venv/bin/python dev/verl_schema.py --check         # exit 1 if a shipped schema differs
    .venv/bin/python dev/verl_schema.py --commit SHA SOURCE.tar.gz   # a commit's schema, from its verl source

A commit's schema (compiler/verl/commit.py COMMITS) is read from a tarball of that commit's source (the
ones in ../shared/verl-recipe/), with every dataclass kept, as verlc reads a checkout for a spec's
verl_commit.

Each release comes from PyPI as `pip install --no-deps --target .cache/verl-releases/<version>`
(seconds; cached), and is read from its own files: Hydra composes its trainer configs, `ast` reads its
dataclasses. verl and torch are never imported. tests/test_verl_schema.py runs the check.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from verlc.compiler.verl.extract import extract
from verlc.compiler.verl.commit import COMMITS
from verlc.compiler.verl.release import RELEASES, pack, pack_docs

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("VERLC_RELEASE_CACHE", REPO / ".cache" / "verl-releases"))


def release_package(version: str) -> Path:
    """The verl package folder of one release, installed without dependencies into the cache."""
    target = CACHE / version
    package = target / "verl"
    if (package / "trainer" / "config").is_dir():
        return package
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{version}.lock", "w") as lock:  # one install at a time (the test suite's two workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (package / "trainer" / "config").is_dir():
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--no-compile", "--target", str(target), f"verl=={version}"], check=True)
    return package


SHARED = Path(os.environ.get("VERLC_SHARED", REPO.parent / "shared")) / "verl-recipe"


def commit_tarball(commit: str) -> Path | None:
    """The shared source tarball of a shipped commit (verl-<short sha>.tar.gz)."""
    return next((t for t in sorted(SHARED.glob("verl-*.tar.gz"))
                 if commit.startswith(t.name.removeprefix("verl-").removesuffix(".tar.gz"))), None)


def commit_blob(commit: str, tarball: Path) -> tuple[str, bytes]:
    import re
    import tarfile
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        with tarfile.open(tarball) as tar:
            tar.extractall(scratch, filter="data")
        package = next(Path(scratch).glob("**/verl/version/version")).parent.parent
        version = re.sub(r"\.dev$", ".dev0", (package / "version" / "version").read_text().strip())
        return version, pack(version, extract(package, all_classes=True))


def write_commit(commit: str, tarball: Path) -> None:
    version, blob = commit_blob(commit, tarball)
    path = REPO / "compiler" / "verl" / "schemas" / f"{commit}.json.gz"
    path.write_bytes(blob)
    print(f"wrote {path.relative_to(REPO)} (verl {version}, {len(blob) / 1024:.0f} KiB)")


def release_blobs(version: str) -> tuple[bytes, bytes]:
    """A release's schema and descriptions, as shipped (run in a worker process: Hydra is per process)."""
    data = extract(release_package(version))
    return pack(version, data), pack_docs(data)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--commit"] and len(argv) == 3:
        write_commit(argv[1], Path(argv[2]))
        return 0
    check = "--check" in argv
    named = [a for a in argv if not a.startswith("--")]
    versions = named or list(RELEASES)
    commits = {c: commit_tarball(c) for c in COMMITS} if check and not named else {}
    folder = REPO / "compiler" / "verl" / "schemas"
    stale = []
    started = time.perf_counter()
    # every release (and shipped commit) read in parallel, one process each at a time; reported in order
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        releases = {v: pool.submit(release_blobs, v) for v in versions}
        sources = {c: pool.submit(commit_blob, c, t) for c, t in commits.items() if t is not None}
        for version in versions:
            blob, docs = releases[version].result()
            for path, data in ((folder / f"{version}.json.gz", blob), (folder / f"{version}.docs.json.gz", docs)):
                name = path.relative_to(REPO)
                if check:
                    same = path.exists() and path.read_bytes() == data
                    if not same and version not in stale:
                        stale.append(version)
                    print(f"{name}: {'matches' if same else 'DIFFERS FROM'} verl {version}'s own files", flush=True)
                else:
                    path.write_bytes(data)
                    print(f"wrote {name} ({len(data) / 1024:.0f} KiB, {time.perf_counter() - started:.1f} s)",
                          flush=True)
        for commit, tarball in commits.items():
            path = folder / f"{commit}.json.gz"
            if tarball is None:
                print(f"{path.relative_to(REPO)}: no source in {SHARED}", flush=True)
                stale.append(f"--commit {commit} <its source tarball>")
                continue
            same = path.exists() and path.read_bytes() == sources[commit].result()[1]
            print(f"{path.relative_to(REPO)}: {'matches' if same else 'DIFFERS FROM'} verl {commit[:12]}'s own files",
                  flush=True)
            if not same:
                stale.append(f"--commit {commit} {tarball}")
    if stale:
        commands = [" ".join(v for v in stale if not v.startswith("--commit")),
                    *(v for v in stale if v.startswith("--commit"))]
        for args in filter(None, commands):
            print(f"regenerate with: .venv/bin/python dev/verl_schema.py {args}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
