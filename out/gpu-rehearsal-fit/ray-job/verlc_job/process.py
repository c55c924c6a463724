# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""A service's process on its node (runtime/services.py starts and watches it): a process group of its own, ended
with its parent, its output in a log file."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import time

from .job import Service, expand

SERVICE_TAIL = 20  # of a service's output, shown when it fails
SERVICE_STOP_GRACE = 10  # seconds between TERM and KILL when a service is stopped
NOT_STARTED = 127  # a service whose command could not be started "exits" with the shell's code for it


class Process:
    """One service's process on this node: a process group of its own, ended with its parent (the runtime or the
    node's actor), its output in a log file."""

    def __init__(self, service: Service, log: str) -> None:
        import ctypes

        self.service, self.log = service, log
        os.makedirs(os.path.dirname(log), exist_ok=True)
        # where this process's output starts in the log (a restarted service appends to its predecessor's): its
        # last lines are its own
        self.offset = os.path.getsize(log) if os.path.exists(log) else 0
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
        argv = [expand(w) for w in service.argv]
        self.proc: subprocess.Popen | None = None
        try:
            with open(log, "ab") as out:
                self.proc = subprocess.Popen(argv, env={**os.environ, **{k: expand(w) for k, w in service.env.items()}},
                                             stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                             start_new_session=True, preexec_fn=lambda: prctl(1, signal.SIGTERM))
        except OSError as exc:  # not in this image, or not executable: an exit like the shell's (127), its log says why
            with open(log, "a", encoding="utf-8") as out:
                out.write(f"verlc: cannot start {argv[0]!r} here: {exc.strerror or exc}\n")
        self.started = time.monotonic()

    def poll(self) -> int | None:
        return self.proc.poll() if self.proc else NOT_STARTED

    def tail(self) -> list[str]:
        return tail_of(self.log, self.offset)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(SERVICE_STOP_GRACE)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass


def tail_of(log: str, offset: int = 0) -> list[str]:
    """The last lines of a log file from byte `offset` on; none where it is not (yet) there."""
    try:
        with open(log, encoding="utf-8", errors="replace") as fh:
            fh.seek(offset)
            return list(collections.deque(fh, maxlen=SERVICE_TAIL))
    except OSError:
        return []
