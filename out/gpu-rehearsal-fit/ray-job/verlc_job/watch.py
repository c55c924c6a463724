# verlc 0.1.0's runtime (runtime/ in verlc's source), shipped as it is in every bundle.
# Do not edit: it is the same in every bundle; this bundle's job is its job JSON.
"""When each service was first seen ready, polled from its start on a thread of its own.

The preflight asks the services only after the bring-up, the data stage and the all-reduce; a sandbox that was
ready a second after its start would otherwise count the whole wait as its own time to ready. The watch asks each
service (its readiness check alone, never its probe) every POLL seconds from the moment it was started until it first
answers, and keeps that moment, which the preflight reports (services.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

POLL = 0.25  # seconds between two asks of a service not yet ready


class Watch:
    """Services' first-ready moments (time.monotonic()), by name."""

    def __init__(self, ready_problem: Callable[[str], str | None]) -> None:
        self._problem = ready_problem  # a service's name -> why it is not ready yet (one ask), or None
        self._waiting: set[str] = set()
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, name: str) -> None:
        """Ask `name` from now on until it answers (again, for one started anew)."""
        with self._lock:
            self._waiting.add(name)
            self._seen.pop(name, None)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="verlc-service-watch", daemon=True)
                self._thread.start()

    def seen(self, name: str) -> float | None:
        """When `name` first answered since it was added, or None."""
        with self._lock:
            return self._seen.get(name)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stopped.is_set():
            with self._lock:
                names = sorted(self._waiting)
            for name in names:
                try:
                    answered = self._problem(name) is None
                except Exception:  # noqa: BLE001  (a node's actor gone: the preflight's own ask says why)
                    answered = False
                if answered:
                    with self._lock:
                        if name in self._waiting:
                            self._waiting.discard(name)
                            self._seen[name] = time.monotonic()
            self._stopped.wait(POLL)
