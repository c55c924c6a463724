# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""A node's Ray session logs, bounded, as a tar stream (the Slurm script keeps each node's in the run folder)."""

from __future__ import annotations

import os
import sys


def ray_logs(temp_dir: str, limit_mib: int) -> int:
    """Write this node's Ray session logs as a tar stream to stdout, at most --limit-mib of them (each file
    over its share keeps its end; TRUNCATED.txt says what was cut), then remove Ray's temp dir."""
    import io
    import shutil
    import tarfile

    logs = os.path.join(temp_dir, "session_latest", "logs")
    files = sorted((os.path.join(d, f) for d, _, names in os.walk(logs) for f in names), key=os.path.getsize)
    budget, cut = limit_mib * 1024**2, []
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
        for n, path in enumerate(files):
            share = budget // (len(files) - n)  # small files first: what they leave goes to the large ones
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                if size > share:
                    fh.seek(size - share)
                    cut.append(f"{os.path.relpath(path, logs)}: kept the last {share} of {size} bytes")
                data = fh.read(share)
            info = tarfile.TarInfo(os.path.relpath(path, logs))
            info.size, info.mtime = len(data), int(os.path.getmtime(path))
            tar.addfile(info, io.BytesIO(data))
            budget -= len(data)
        note = ("\n".join(cut) or "nothing was cut") + "\n"
        info = tarfile.TarInfo("TRUNCATED.txt")
        info.size = len(note.encode())
        tar.addfile(info, io.BytesIO(note.encode()))
    shutil.rmtree(temp_dir, ignore_errors=True)
    return 0
