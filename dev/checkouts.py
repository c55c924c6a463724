"""Make the local checkouts the recipe example specs name, from the sources in ../shared/verl-recipe/.

    .venv/bin/python dev/checkouts.py [FOLDER]      # default: checkouts/ in the repository (git-ignored)

A paper's run starts from a verl checkout with verl-recipe as its `recipe/` folder (as verl's own
layout has it); here each one is unpacked from the shared tarballs and committed once, with a fixed
author and date, so its commit (which the run record names) is the same on every machine. These are
not clones of verl's repository: their history does not hold verl's own commits, which verlc then says.
Idempotent: a checkout that exists is left as it is.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("VERLC_SHARED", REPO.parent / "shared")) / "verl-recipe"
# checkout folder -> the tarballs unpacked into it, and where (relative to the checkout)
CHECKOUTS = {
    "verl-bcb6386-recipe": (("verl-bcb6386.tar.gz", "."), ("verl-recipe-48ea0a7-dapo-sppo-gkd.tar.gz", "recipe")),
    "verl-4f80e465": (("verl-4f80e465.tar.gz", "."),),
}
FIXED = {"GIT_AUTHOR_NAME": "verlc", "GIT_AUTHOR_EMAIL": "verlc@example.invalid", "GIT_COMMITTER_NAME": "verlc",
         "GIT_COMMITTER_EMAIL": "verlc@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
         "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def make(name: str, into: Path) -> Path:
    """One checkout, made whole in a scratch folder beside it and then moved into place."""
    final = into / name
    if (final / ".git").is_dir():
        return final
    missing = [t for t, _ in CHECKOUTS[name] if not (SHARED / t).is_file()]
    if missing:
        raise SystemExit(f"dev/checkouts.py: {', '.join(missing)} not in {SHARED}")
    into.mkdir(parents=True, exist_ok=True)
    with open(into / f".{name}.lock", "w") as lock:  # one maker at a time (the test suite's two workers)
        fcntl.flock(lock, fcntl.LOCK_EX)
        return final if (final / ".git").is_dir() else _unpack(name, final)


def _unpack(name: str, final: Path) -> Path:
    into = final.parent
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=into))
    try:
        for tarball, where in CHECKOUTS[name]:
            with tarfile.open(SHARED / tarball) as tar:
                tar.extractall(scratch / where, filter="data")
        env = {**os.environ, **FIXED}
        for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-q", "-m", f"{name} from ../shared"]):
            subprocess.run(["git", "-C", str(scratch), *args], env=env, check=True)
        shutil.rmtree(final, ignore_errors=True)
        scratch.rename(final)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def main(argv: list[str]) -> int:
    into = Path(argv[0]) if argv else REPO / "checkouts"
    for name in CHECKOUTS:
        path = make(name, into)
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
        print(f"{path}: {head.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
