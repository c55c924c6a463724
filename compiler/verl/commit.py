"""verl pinned to a git commit: that commit's schema, shipped, cached, or read once from a local checkout.

A commit's facts are read by the same code that wrote the release schemas (extract.py, which needs
Hydra), from the commit's own files: `git archive COMMIT verl` of the checkout, so neither its HEAD nor
uncommitted changes matter. The result is cached by commit under $XDG_CACHE_HOME/verlc/verl-commits/
(named with the extractor's digest: a newer verlc reads the commit again). verlc ships the schemas of
the commits its example specs pin (COMMITS, written by dev/verl_schema.py --commit).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import zlib
from functools import cache
from importlib import resources
from pathlib import Path

from .release import Release, from_data, pack, snapshot, unpack

# Shipped: commit -> the version it installs as (verl/version/version).
COMMITS = {
    "bcb638649a50e58494a8ddd92085ad1174f674b8": "0.8.0.dev0",  # verl-recipe's ROLLING_VERL_COMMIT (2026-04)
    "4f80e465c2ec79ab9c3c30ec74b9745de61d0490": "0.2.0.dev0",  # DAPO's reproduction commit (2025-05)
}
# The commit of each release's tag in verl's repository (`git rev-parse vX^{commit}`): a spec that pins one gets
# that release's shipped schema. v0.9.1 has no tag there (its wheel is PyPI's alone): its commit is not known.
RELEASE_TAGS = {
    "070ed6ac3f6aea13a916556794f34e8f2bde7dde": "0.3.0.post1",
    "0758489422e8d41a89e6c36d4c477714520f0dcc": "0.4.0",
    "8d9e350ea58c7ad4b50dd14d9dcb50577242c55f": "0.4.1",
    "8fdc4d3f202f41461f4de9f42a637228e342668b": "0.5.0",
    "ddd86f527a4af75095e4677b02b5aa272913a088": "0.6.0",
    "d62da4950573d7a4b7ef2362337952e7ab59e78d": "0.6.1",
    "f9c855f7cf04d603c9546bc01776c74806a879c1": "0.7.0",
    "bec9ef74768dd201881cd4e54cd0385e87caae27": "0.7.1",
    "7aed6b230776f963fa09509c10d9c3a767d1102c": "0.8.0",
    "483b8a009ba3a97563edee3a19887e4862b8094a": "0.9.0",
}


class CommitError(Exception):
    """The commit's schema cannot be had; the message says why and what to do."""


def cache_folder() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "verlc" / "verl-commits"


def _extractor_digest() -> str:
    here = Path(__file__).parent
    digest = hashlib.sha256()
    for name in ("extract.py", "release.py"):
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:12]


def cached_path(commit: str) -> Path:
    return cache_folder() / f"{commit}-{_extractor_digest()}.json.gz"


@cache
def commit_release(commit: str, checkout: Path | None) -> Release:
    """The facts of verl at `commit`: a release's tag (its shipped schema), shipped, else cached, else read from
    `checkout` (then cached)."""
    if commit in RELEASE_TAGS:
        return dataclasses.replace(snapshot(RELEASE_TAGS[commit]), commit=commit)
    if commit in COMMITS:
        blob = resources.files("verlc.compiler.verl").joinpath("schemas", f"{commit}.json.gz").read_bytes()
        return _release(commit, blob)
    cached = cached_path(commit)
    if cached.is_file():
        return _release(commit, cached.read_bytes())
    if checkout is None:
        raise CommitError(f"verlc has no schema of verl commit {commit[:12]} yet: name a local verl checkout "
                          f"that has it (verl_checkout, or code when the run's code is that checkout)")
    blob = extract_commit(checkout, commit)
    cached.parent.mkdir(parents=True, exist_ok=True)
    partial = cached.with_suffix(f".{os.getpid()}.tmp")
    partial.write_bytes(blob)
    partial.replace(cached)  # whole or not at all
    return _release(commit, blob)


def _release(commit: str, blob: bytes) -> Release:
    doc = json.loads(zlib.decompress(blob, wbits=31))
    return from_data(doc["verl_version"], unpack(doc), "commit", commit)


def git(checkout: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, timeout=120)


def has_commit(checkout: Path, commit: str) -> bool:
    return git(checkout, "cat-file", "-e", f"{commit}^{{commit}}").returncode == 0


def git_differs(checkout: Path, commit: str, path: str) -> bool:
    """Whether `path` in the checkout's working tree (uncommitted changes included) differs from `commit`."""
    return git(checkout, "diff", "--quiet", commit, "--", path).returncode != 0


def extract_commit(checkout: Path, commit: str) -> bytes:
    """Read verl's facts at `commit` from the checkout's git objects; the packed schema bytes."""
    if not (checkout / ".git").exists() and git(checkout, "rev-parse", "--git-dir").returncode != 0:
        raise CommitError(f"{checkout} is not a git checkout: verlc cannot tell which commit it holds")
    if not has_commit(checkout, commit):
        raise CommitError(f"the checkout {checkout} does not have commit {commit[:12]} (git fetch it, or pin "
                          f"the commit it has)")
    import tarfile
    import tempfile

    from .extract import extract

    try:
        import hydra  # noqa: F401  (extract composes with it)
    except ImportError:
        raise CommitError("reading verl's config at a commit needs Hydra, which verlc's install "
                          "brings and this environment lacks: pip install hydra-core, then build again; the schema is cached after that") from None
    print(f"verlc: reading verl {commit[:12]} from {checkout} (once; cached in {cache_folder()})",
          file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(prefix="verlc-commit-") as scratch:
        archive = git(checkout, "archive", "--format=tar", commit, "verl")
        if archive.returncode != 0:
            raise CommitError(f"commit {commit[:12]} of {checkout} has no verl/ package: "
                              f"{archive.stderr.decode(errors='replace').strip()}")
        tar_path = Path(scratch) / "verl.tar"
        tar_path.write_bytes(archive.stdout)
        with tarfile.open(tar_path) as tar:
            tar.extractall(scratch, filter="data")
        package = Path(scratch) / "verl"
        version_file = package / "version" / "version"
        version = version_file.read_text().strip() if version_file.is_file() else "0+unknown"
        version = re.sub(r"\.dev$", ".dev0", version)  # as pip reports it (PEP 440's normal form)
        started = time.monotonic()

        def progress(done: str) -> None:
            print(f"verlc: verl {commit[:12]}: {done} after {time.monotonic() - started:.0f} s", file=sys.stderr,
                  flush=True)

        try:
            data = extract(package, all_classes=True, progress=progress)
        except Exception as exc:
            raise CommitError(f"verl {commit[:12]}'s config does not compose: {' '.join(str(exc).split())}") from None
    return pack(version, data)
