"""The ray-job bundle's upload check, run where `ray job submit` runs (submit.sh calls it): refuse a working_dir
the Ray dashboard would refuse, naming what makes it large. Standard library, and ray when it is there.

    python3 upload_size.py RUNTIME_ENV_JSON
"""

from __future__ import annotations

import json
import os
import sys

# Ray's `ray job submit` zips working_dir (uncompressed: ZipFile's default ZIP_STORED) and PUTs it to the
# dashboard, whose aiohttp server refuses bodies over client_max_size = ray_constants.DASHBOARD_CLIENT_MAX_SIZE
# (100 MiB; HTTPRequestEntityTooLarge, verl#696). Packages stored in the GCS are further bounded by the gRPC
# message size (512 MiB), which the dashboard's limit is far below.
UPLOAD_LIMIT = 100 * 1024**2
ZIP_ENTRY_OVERHEAD = 30 + 46  # a zip's local header and central-directory record, plus the name twice


def upload_limit() -> int:
    try:
        from ray._private.ray_constants import DASHBOARD_CLIENT_MAX_SIZE
        return int(DASHBOARD_CLIENT_MAX_SIZE)
    except Exception:  # another Ray layout: the documented default
        return UPLOAD_LIMIT


def upload_sizes(root: str, excludes: list[str]) -> dict[str, int]:
    """Bytes Ray would zip per top-level entry of `root`, with Ray's rules: `excludes` (gitwildmatch,
    relative to root), and .gitignore (unless RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1) and .rayignore of every
    folder, relative to that folder."""
    try:  # the gitwildmatch implementation Ray itself uses: vendored in recent Ray, a dependency before
        from ray._private.thirdparty.pathspec import PathSpec
    except ImportError:
        from pathspec import PathSpec

    use_gitignore = os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1"
    base = os.path.abspath(root)
    specs = [(base, PathSpec.from_lines("gitwildmatch", excludes))]
    sizes: dict[str, int] = {}

    def travel(path: str) -> None:
        added = 0
        if os.path.isdir(path) and not os.path.islink(path):
            for name in ((".gitignore",) if use_gitignore else ()) + (".rayignore",):
                ignore = os.path.join(path, name)
                if os.path.isfile(ignore):
                    with open(ignore, encoding="utf-8", errors="replace") as fh:
                        specs.append((path, PathSpec.from_lines("gitwildmatch", fh.readlines())))
                    added += 1
        if path != base and any(spec.match_file(os.path.relpath(path, folder)) for folder, spec in specs):
            del specs[len(specs) - added:]
            return
        rel = os.path.relpath(path, base)
        top = rel.split(os.sep)[0]
        is_dir = os.path.isdir(path) and not os.path.islink(path)
        entries = sorted(os.listdir(path)) if is_dir else []
        if path != base and (os.path.isfile(path) or is_dir and not entries):  # what Ray's zip holds
            size = os.path.getsize(path) if os.path.isfile(path) else 0
            sizes[top] = sizes.get(top, 0) + size + ZIP_ENTRY_OVERHEAD + 2 * len(rel.encode())
        for entry in entries:
            travel(os.path.join(path, entry))
        del specs[len(specs) - added:]

    travel(base)
    return sizes


def mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


def check(runtime_env: str) -> int:
    """Refuse a working_dir upload the Ray dashboard would refuse, naming what makes it large."""
    with open(runtime_env, encoding="utf-8") as fh:
        env = json.load(fh)
    root = env.get("working_dir")
    if not root or "://" in root or not os.path.isdir(root):
        return 0  # a remote URI or a zip: Ray does not upload it from here
    sizes = upload_sizes(root, env.get("excludes", []))
    total, limit = sum(sizes.values()) + 22, upload_limit()
    if total < limit:
        print(f"working_dir {root}: uploading {mib(total)} (Ray's limit: {mib(limit)})")
        return 0
    largest = [kv for kv in sorted(sizes.items(), key=lambda kv: -kv[1])[:5] if kv[1] >= total // 100]
    print(f"ERROR: working_dir {root} would upload {mib(total)}, over the {mib(limit)} the Ray dashboard accepts "
          f"(it would answer 413 Request Entity Too Large). Largest entries: "
          + ", ".join(f"{name} ({mib(size)})" for name, size in largest)
          + ". Exclude them (ray.working_dir, a .rayignore there) or keep them on shared storage.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(check(sys.argv[1]))
