"""A hub model's config.json at the revision a spec pins, for the build (the memory figures need the model's shape).

Where it comes from, first found: the local Hugging Face cache (what the data stage or any earlier download put
there), verlc's own cache of one fetched before (a commit's config never changes, so it is fetched once), else the
hub itself in one request (HF_ENDPOINT, and HF_TOKEN or the saved token for a gated model). HF_HUB_OFFLINE=1
fetches nothing. The build never waits long on a hub it cannot reach: one request, TIMEOUT seconds, no retries.
"""

from __future__ import annotations

import json
import os
import re
import urllib.error
import urllib.request
from functools import cache
from pathlib import Path
from urllib.parse import quote

from .verl.commit import cache_folder

TIMEOUT = 5  # seconds for the one request
COMMIT = re.compile(r"[0-9a-f]{40}")


def _hf_home() -> Path:
    return Path(os.environ.get("HF_HOME") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
                / "huggingface")


def _hf_cached(repo: str, revision: str) -> Path | None:
    """The Hugging Face cache's config.json of `repo` at `revision` (a commit, or a branch or tag it recorded)."""
    root = Path(os.environ.get("HF_HUB_CACHE") or _hf_home() / "hub") / f"models--{repo.replace('/', '--')}"
    commit = revision
    if not COMMIT.fullmatch(revision):
        ref = root / "refs" / revision
        commit = ref.read_text(encoding="utf-8").strip() if ref.is_file() else ""
    found = root / "snapshots" / commit / "config.json"
    return found if commit and found.is_file() else None


def _own_cached(repo: str, commit: str) -> Path:
    """verlc's cache of a commit's config.json (beside its cache of verl commits' facts)."""
    return cache_folder().parent / "hub" / repo.replace("/", "--") / commit / "config.json"


def _token() -> str | None:
    if os.environ.get("HF_TOKEN"):
        return os.environ["HF_TOKEN"]
    saved = _hf_home() / "token"  # where `huggingface-cli login` keeps it
    if not saved.is_file():
        return None
    return saved.read_text(encoding="utf-8").strip() or None


def config(repo: str, revision: str) -> tuple[dict, str]:
    """The config.json's keys and where they came from; OSError saying why where they cannot be had. Asked once
    per build, whatever the answer: a build asks for the same model's more than once."""
    found = _config(repo, revision)
    if isinstance(found, OSError):
        raise OSError(*found.args)
    return found


@cache
def _config(repo: str, revision: str) -> tuple[dict, str] | OSError:
    try:
        return _read(repo, revision)
    except OSError as exc:
        return exc


def _read(repo: str, revision: str) -> tuple[dict, str]:
    own = _own_cached(repo, revision) if COMMIT.fullmatch(revision) else None  # a branch moves: never cached
    for path, where in ((_hf_cached(repo, revision), "the Hugging Face cache"), (own, "verlc's cache")):
        if path is not None and path.is_file():
            return _keys(path.read_bytes(), path), where
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise OSError("HF_HUB_OFFLINE is set and neither the Hugging Face cache nor verlc's holds it")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    url = f"{endpoint}/{quote(repo)}/resolve/{quote(revision, safe='')}/config.json"
    request = urllib.request.Request(url, headers={"User-Agent": "verlc"})
    token = _token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as answer:
            body = answer.read(1 << 20)
    except urllib.error.HTTPError as exc:
        gated = " (a gated model: set HF_TOKEN)" if exc.code in (401, 403) and not token else ""
        raise OSError(f"{url} answered {exc.code} {exc.reason}{gated}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise OSError(f"{url} could not be reached: {getattr(exc, 'reason', exc)}") from None
    keys = _keys(body, url)
    if own is not None:  # a branch or tag is fetched again by each build
        own.parent.mkdir(parents=True, exist_ok=True)
        partial = own.with_name(f".config.json.{os.getpid()}")
        partial.write_bytes(body)
        partial.replace(own)
    return keys, "the hub"


def _keys(body: bytes, where: Path | str) -> dict:
    try:
        keys = json.loads(body)
    except ValueError as exc:
        raise OSError(f"{where} is not JSON ({exc})") from None
    if not isinstance(keys, dict):
        raise OSError(f"{where} is not a JSON object")
    return keys
