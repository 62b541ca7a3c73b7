"""The directive board: what the service tells a job's ranks to do (abort), and who listens.

Ranks long-poll `GET /api/v1/directives?job=&after=&wait=` (api.py), one connection per host:
a request is answered at once when a directive newer than `after` is here for its job, else
held on the HTTP server's event loop (no thread) until one is published or `wait` runs out.
The board is in memory for those polls (a lookup, no database read per poll); the store holds
every directive (written with its action's result), and a restart loads the live ones back.
A directive is served until it expires (`ttl_s` of its action: a later launch of the same job
id must not be aborted by it) and only to polls of its run when both name one.

It also notes which hosts of which job poll, and which acknowledged a directive (the host's poller
polls again with `acked=<seq>` once it has handed the directive to its ranks): an abort is done
only when a rank acknowledged it, else undeliverable with why (actions.py).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from .action_policy import base_job

MAX_PER_JOB = 16  # directives kept per job (an abort is the last word; a few in a row at most)
MAX_JOBS = 4096
MAX_POLLERS_PER_JOB = 32_768  # hosts (or ranks polling directly) remembered per job
MAX_ACKED_PER_DIRECTIVE = 1024  # hosts named per acknowledged directive (the count goes on)


class DirectiveBoard:
    """Thread-safe: the action worker publishes, the HTTP loop and its workers read and subscribe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_job: dict[str, deque[dict[str, Any]]] = {}
        self._waiters: dict[str, set[Callable[[], None]]] = {}
        self._pollers: dict[str, dict[str, float]] = {}  # job -> host (or peer) -> last poll
        self._acked: dict[int, tuple[int, list[str]]] = {}  # directive seq -> (hosts that acked, the first few)
        self._handed: dict[int, int] = {}  # directive seq -> polls it was handed to
        self.polls = 0
        self.delivered = 0

    def load(self, directives: Iterable[dict[str, Any]]) -> None:
        for directive in directives:
            self._add(directive)

    def _add(self, directive: dict[str, Any]) -> None:
        job = str(directive["job"])
        with self._lock:
            if job not in self._by_job and len(self._by_job) >= MAX_JOBS:
                oldest = min(self._by_job, key=lambda j: self._by_job[j][-1]["seq"] if self._by_job[j] else 0)
                del self._by_job[oldest]
            self._by_job.setdefault(job, deque(maxlen=MAX_PER_JOB)).append(directive)

    def publish(self, directive: dict[str, Any]) -> int:
        """Add a directive (already in the store) and wake its job's held polls; how many were woken."""
        self._add(directive)
        with self._lock:
            waiters = list(self._waiters.get(str(directive["job"]), ()))
        for wake in waiters:
            wake()
        return len(waiters)

    def next(self, job: str, run: str | None, after: int, now: float) -> dict[str, Any] | None:
        """The first live directive of `job` (and `run`, when both it and the directive name one) after `after`."""
        with self._lock:
            found = self._by_job.get(base_job(job))
            if not found:
                return None
            for directive in found:
                if directive["seq"] > after and directive["expires_at_unix"] > now and \
                        (not run or not directive.get("run") or directive["run"] == run):
                    self.delivered += 1
                    seq = int(directive["seq"])
                    if seq in self._handed or len(self._handed) < MAX_JOBS * MAX_PER_JOB:
                        self._handed[seq] = self._handed.get(seq, 0) + 1
                    return directive
        return None

    def subscribe(self, job: str, wake: Callable[[], None]) -> Callable[[], None]:
        key = base_job(job)
        with self._lock:
            self._waiters.setdefault(key, set()).add(wake)

        def cancel() -> None:
            with self._lock:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(wake)
                    if not waiters:
                        del self._waiters[key]

        return cancel

    def note_poll(self, job: str, who: str, now: float) -> None:
        key = base_job(job)
        with self._lock:
            self.polls += 1
            pollers = self._pollers.get(key)
            if pollers is None:
                if len(self._pollers) >= MAX_JOBS:
                    stale = min(self._pollers, key=lambda j: max(self._pollers[j].values(), default=0.0))
                    del self._pollers[stale]
                pollers = self._pollers[key] = {}
            if who not in pollers and len(pollers) >= MAX_POLLERS_PER_JOB:
                return
            pollers[who] = now

    def note_ack(self, job: str, seq: int, who: str) -> bool:
        """A host's poller handed directive `seq` of `job` to its ranks; False for a seq the job never had."""
        key = base_job(job)
        with self._lock:
            if not any(d["seq"] == seq for d in self._by_job.get(key, ())):
                return False
            count, names = self._acked.get(seq, (0, []))
            if who in names:
                return True
            if len(names) < MAX_ACKED_PER_DIRECTIVE:
                names = [*names, who]
            self._acked[seq] = (count + 1, names)
            while len(self._acked) > MAX_JOBS * MAX_PER_JOB:
                del self._acked[min(self._acked)]  # the oldest directives' acknowledgments go first
            return True

    def acknowledged(self, seq: int) -> tuple[int, list[str]]:
        """(hosts that acknowledged directive `seq`, the first of them by name)."""
        with self._lock:
            count, names = self._acked.get(seq, (0, []))
            return count, list(names)

    def handed(self, seq: int) -> int:
        """How many polls directive `seq` was handed to (delivered, acknowledged or not)."""
        with self._lock:
            return self._handed.get(seq, 0)

    def pollers(self, job: str, now: float, within_s: float) -> tuple[int, float | None]:
        """(hosts of `job` that polled within `within_s`, when it was last polled at all)."""
        with self._lock:
            pollers = self._pollers.get(base_job(job)) or {}
            recent = sum(1 for at in pollers.values() if now - at <= within_s)
            last = max(pollers.values(), default=None)
        return recent, last

    def held(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiters.values())
