"""Completion from the device: ops of NCCL-like backends end when their Work says so, not at the call.

On ProcessGroupNCCL a call returns once the kernel is enqueued and `Work.get_future()` is
done at enqueue too, so neither the call nor the future tells when the op finished.
`Work.is_completed()` does: it queries the op's CUDA end event, without blocking. The
training thread hands each such op's Work here (one deque append); a poller thread checks
the oldest op of every *stream* (one queue per group for collectives, one per group and
peer for p2p: NCCL runs each in order on its own CUDA stream, so a later op cannot finish
before an earlier one of the same queue) every MYCROFT_COMPLETION_POLL_MS (1 ms) while
anything is pending, and sleeps on an event otherwise. An op's span then ends when the
poller saw its completion (`mycroft.timing = device_polled`: within the poll interval, plus
the wait for the GIL when the training thread holds it).

Holding a Work keeps its tensors alive. torch's own watchdog holds every NCCL Work until the
device finished it, so holding ours until then adds at most a poll interval. Only an op
that never finishes could pin memory: at most MYCROFT_MAX_PENDING_WORKS Works are held per
queue; beyond that the oldest are released and their ops complete when a later op of the
same queue does, or when the Flight Recorder's last completed seq passes them (timing
`polled` / `flight_recorder`).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Protocol

from mycroft.instrumentation.op_record import OpRecord
from mycroft.instrumentation.thread_names import name_this_thread

from mycroft import schema

log = logging.getLogger("mycroft.instrumentation")

QueueKey = tuple[str, int]  # (group id, peer): peer -1 is the group's collective stream


class Completer(Protocol):
    """What the tracker completes ops through: the Recorder (which owns the tracker, so the tracker
    names only what it calls)."""

    def complete(self, record: OpRecord, state: str = ..., timing: str = ...) -> None: ...

    def failed(self, record: OpRecord, exc: BaseException) -> None: ...

    def _note_error(self, where: str, exc: BaseException) -> None: ...


class CompletionTracker:
    """Works of device-async ops, polled in order per stream; completes their OpRecords."""

    def __init__(self, recorder: Completer, poll_s: float = 0.001, max_works: int = 1024) -> None:
        self.recorder = recorder
        self.poll_s = poll_s
        self.max_works = max_works  # per queue (stream)
        # deques: appends (training thread) and poplefts (poller) are thread-safe; no shared
        # counter decides anything (a += from two threads can lose updates)
        self._queues: dict[QueueKey, collections.deque[list[Any]]] = {}
        self.released = 0  # Works let go early to bound memory
        self.polls = 0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ training thread
    def add(self, record: OpRecord, work: Any) -> None:
        """Track `work` until the device completed it (any thread)."""
        key = (record.group.gid, record.peer if record.op in schema.P2P_OPS else -1)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues.setdefault(key, collections.deque())
        queue.append([record, work])
        if len(queue) > self.max_works:
            self._release_oldest(queue)
        if not self._wake.is_set():
            self._wake.set()

    def _release_oldest(self, queue: collections.deque[list[Any]]) -> None:
        """Let go of the oldest Work still held in `queue` (its op completes by stream order)."""
        for entry in list(queue):
            if entry[1] is not None:
                entry[1] = None
                self.released += 1
                return

    # ------------------------------------------------------------------ poller
    def pending(self) -> int:
        return sum(len(queue) for queue in list(self._queues.values()))

    def poll(self) -> int:
        """One pass over the queues' heads; returns how many ops completed."""
        self.polls += 1
        done = 0
        for queue in list(self._queues.values()):
            while queue:
                # the first entry still holding a Work decides for itself and everything before it
                probe = next((entry for entry in queue if entry[1] is not None), None)
                if probe is None:
                    break
                work = probe[1]
                try:
                    finished = bool(work.is_completed())
                except Exception as exc:  # a dead communicator: the op failed
                    finished = True
                    self._fail(probe[0], exc)
                if not finished:
                    break
                error = _work_error(work)
                while queue:
                    entry = queue.popleft()
                    record = entry[0]
                    if entry is probe:
                        if error is not None:
                            self._fail(record, error)
                        else:
                            self.recorder.complete(record, timing=schema.TIMING_DEVICE_POLLED)
                        done += 1
                        break
                    # released early: finished no later than the op behind it on the same stream
                    self.recorder.complete(record, timing=schema.TIMING_POLLED)
                    done += 1
        return done

    def complete_through(self, gid: str, seq: int, timing: str) -> int:
        """Complete the collectives of group `gid` up to `seq` (the Flight Recorder saw them finish)."""
        queue = self._queues.get((gid, -1))
        done = 0
        while queue and queue[0][0].seq <= seq:
            entry = queue.popleft()
            self.recorder.complete(entry[0], timing=timing)
            done += 1
        return done

    def workless_groups(self) -> set[str]:
        """Groups whose oldest pending collective has no Work left (released, or never had one)."""
        return {key[0] for key, queue in self._queues.items() if key[1] == -1 and queue and queue[0][1] is None}

    def _fail(self, record: OpRecord, exc: Any) -> None:
        if not record.end_ns:
            self.recorder.failed(record, exc if isinstance(exc, BaseException) else RuntimeError(str(exc)))

    # ------------------------------------------------------------------ thread
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mycroft-completion", daemon=True)
            self._thread.start()

    def _idle(self) -> bool:
        return not any(self._queues.values())

    def _run(self) -> None:
        name_this_thread("mycroft-complete")
        while not self._stop.is_set():
            if self._idle():
                self._wake.clear()
                if self._idle():  # an add() may have raced the clear
                    self._wake.wait(0.5)
                continue
            try:
                self.poll()
            except Exception as exc:  # never die: count and keep going
                self.recorder._note_error("completion", exc)
            time.sleep(self.poll_s)

    def stop(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout_s)  # a daemon: one that does not stop in time is left behind
        self._thread = None


def _work_error(work: Any) -> BaseException | None:
    """The failure a completed Work carries (NCCL: an async error or a watchdog timeout), else None."""
    try:
        exc = work.exception()
    except Exception:
        return None
    if exc is None:
        return None
    return exc if isinstance(exc, BaseException) else RuntimeError(str(exc))
