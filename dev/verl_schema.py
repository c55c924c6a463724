"""Write compiler/verl/schemas/<version>.json.gz (and .docs.json.gz) for every verl release verlc supports.

    .venv/bin/python dev/verl_schema.py                 # every release in compiler/verl/release.py
    .venv/bin/python dev/verl_schema.py 0.4.1 0.9.1     # some of them
    .venv/bin/python dev/verl_schema.py --check         # exit 1 if a shipped schema differs
    .venv/bin/python dev/verl_schema.py --check --record   # and record what each matching one was read from
    .venv/bin/python dev/verl_schema.py --commit SHA SOURCE.tar.gz   # a commit's schema, from its verl source

A commit's schema (compiler/verl/commit.py COMMITS) is read from a tarball of that commit's source (the
ones in ../shared/verl-recipe/), with every dataclass kept, as verlc reads a checkout for a spec's
verl_commit.

Each release comes from PyPI as `pip install --no-deps --target .cache/verl-releases/<version>`
(seconds; cached), and is read from its own files: Hydra composes its trainer configs, `ast` reads its
dataclasses. verl and torch are never imported. tests/test_verl_rules.py runs the check.

Reading every release takes minutes of CPU. compiler/verl/schemas/inputs.json records, for each shipped file,
the sha256 of what it was read from (the release's package files, or the commit's source tarball, and the
reader: compiler/verl/, this script and the pinned Python packages) and of the file itself, as written or as
found equal by --check --record. --check reads a release again only where either digest differs: the reader is
deterministic, so the same inputs read again give the same file.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
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
    recorded = json.loads(INPUTS.read_text()) if INPUTS.exists() else {}
    recorded[path.name] = {"inputs": inputs_digest(tarball), "sha256": hashlib.sha256(blob).hexdigest()}
    INPUTS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
    print(f"wrote {path.relative_to(REPO)} (verl {version}, {len(blob) / 1024:.0f} KiB)")


INPUTS = REPO / "compiler" / "verl" / "schemas" / "inputs.json"


def _tree_digest(paths: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def reader_digest() -> str:
    """What reads a release: compiler/verl/, this script, the pinned packages, Python's minor version."""
    files = [*(REPO / "compiler" / "verl").glob("*.py"), Path(__file__).resolve(), REPO / "dev" / "constraints.txt"]
    return _tree_digest(files, REPO) + f"-py{sys.version_info[0]}.{sys.version_info[1]}"


def inputs_digest(source: Path) -> str:
    """A release's package files (or a commit's source tarball), with the reader."""
    if source.is_file():
        files, root = [source], source.parent
    else:
        files, root = [f for f in source.rglob("*") if f.is_file() and "__pycache__" not in f.parts], source
    return hashlib.sha256(f"{_tree_digest(files, root)} {reader_digest()}".encode()).hexdigest()


def unchanged(name: str, path: Path, source: Path, recorded: dict[str, dict[str, str]]) -> bool:
    """Whether the shipped file is the one recorded, read from the same inputs (so reading again gives it)."""
    entry = recorded.get(name)
    return bool(entry and path.exists() and entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
                and entry["inputs"] == inputs_digest(source))


def release_blobs(version: str) -> tuple[bytes, bytes]:
    """A release's schema and descriptions, as shipped (run in a worker process: Hydra is per process)."""
    data = extract(release_package(version))
    return pack(version, data), pack_docs(data)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--commit"] and len(argv) == 3:
        write_commit(argv[1], Path(argv[2]))
        return 0
    check, record = "--check" in argv, "--record" in argv
    named = [a for a in argv if not a.startswith("--")]
    versions = named or list(RELEASES)
    commits = {c: commit_tarball(c) for c in COMMITS} if check and not named else {}
    folder = REPO / "compiler" / "verl" / "schemas"
    recorded = json.loads(INPUTS.read_text()) if INPUTS.exists() else {}
    sources = {**{v: release_package(v) for v in versions}, **{c: t for c, t in commits.items() if t is not None}}
    names = {v: (f"{v}.json.gz", f"{v}.docs.json.gz") for v in versions} | {c: (f"{c}.json.gz",) for c in commits}
    # with --check, what was read from these very inputs before is not read again
    fresh = {k for k in sources if check and all(unchanged(n, folder / n, sources[k], recorded) for n in names[k])}
    stale, found = [], {}
    started = time.perf_counter()
    # every release (and shipped commit) read in parallel, one process each at a time; reported in order
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1)) as pool:
        releases = {v: pool.submit(release_blobs, v) for v in versions if v not in fresh}
        blobs = {c: pool.submit(commit_blob, c, t) for c, t in commits.items() if t is not None and c not in fresh}
        for version in versions:
            data = (None, None) if version in fresh else releases[version].result()
            for path, blob in zip((folder / n for n in names[version]), data):
                name = path.relative_to(REPO)
                if version in fresh:
                    print(f"{name}: matches verl {version}'s own files (read from the same inputs before)", flush=True)
                elif check:
                    same = path.exists() and path.read_bytes() == blob
                    if not same and version not in stale:
                        stale.append(version)
                    print(f"{name}: {'matches' if same else 'DIFFERS FROM'} verl {version}'s own files", flush=True)
                    found[path.name] = (blob, version) if same else found.get(path.name)
                else:
                    path.write_bytes(blob)
                    found[path.name] = (blob, version)
                    print(f"wrote {name} ({len(blob) / 1024:.0f} KiB, {time.perf_counter() - started:.1f} s)",
                          flush=True)
        for commit, tarball in commits.items():
            path = folder / f"{commit}.json.gz"
            if tarball is None:
                print(f"{path.relative_to(REPO)}: no source in {SHARED}", flush=True)
                stale.append(f"--commit {commit} <its source tarball>")
                continue
            if commit in fresh:
                print(f"{path.relative_to(REPO)}: matches verl {commit[:12]}'s own files (read from the same inputs "
                      f"before)", flush=True)
                continue
            blob = blobs[commit].result()[1]
            same = path.exists() and path.read_bytes() == blob
            print(f"{path.relative_to(REPO)}: {'matches' if same else 'DIFFERS FROM'} verl {commit[:12]}'s own files",
                  flush=True)
            if same:
                found[path.name] = (blob, commit)
            else:
                stale.append(f"--commit {commit} {tarball}")
    if record or not check:  # what was written, or found equal, and the inputs it was read from
        for name, entry in found.items():
            if entry is not None:
                recorded[name] = {"inputs": inputs_digest(sources[entry[1]]),
                                  "sha256": hashlib.sha256(entry[0]).hexdigest()}
        INPUTS.write_text(json.dumps(dict(sorted(recorded.items())), indent=1) + "\n")
    if stale:
        commands = [" ".join(v for v in stale if not v.startswith("--commit")),
                    *(v for v in stale if v.startswith("--commit"))]
        for args in filter(None, commands):
            print(f"regenerate with: .venv/bin/python dev/verl_schema.py {args}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
