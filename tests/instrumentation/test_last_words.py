"""final() (a signal handler, atexit, uninstrument) waits for the runtime thread's step under way.

Both drained the same queues at once: the signature digests and the trace budget are one-thread
state (a KeyError in the digests was seen when uninstrument() met a step), and both threads read
the Flight Recorder together. In a real process group of one, with the runtime thread's step held
open, the last words must come after that step, and never wait on a stuck one for ever.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch.distributed as dist
from mycroft.instrumentation.config import MycroftConfig
from mycroft.instrumentation.recorder import Recorder
from mycroft.instrumentation.runtime import Runtime
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class _Null(SpanExporter):
    def export(self, spans: Any) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        runtime = Runtime(MycroftConfig(job_id="last-words"), Recorder(1024), exporter=_Null())
        try:
            yield runtime
        finally:
            runtime.shutdown()
            dist.destroy_process_group()


def _hold_steps(runtime: Runtime, seconds: float) -> tuple[threading.Event, list[tuple[str, float]]]:
    """Make the runtime thread's next step last `seconds`; log when steps and drains begin and end."""
    inside = threading.Event()
    log: list[tuple[str, float]] = []
    drain = runtime._drain_ops

    def step() -> None:
        log.append(("step", time.monotonic()))
        inside.set()
        time.sleep(seconds)
        log.append(("step done", time.monotonic()))

    def logged_drain() -> None:
        log.append((threading.current_thread().name, time.monotonic()))
        drain()

    runtime._step = step  # type: ignore[method-assign]
    runtime._drain_ops = logged_drain  # type: ignore[method-assign]
    return inside, log


def test_last_words_come_after_the_step_under_way(runtime: Runtime) -> None:
    inside, log = _hold_steps(runtime, 0.4)
    assert inside.wait(5.0)
    runtime.final("exit", timeout_s=0.5)
    events = [name for name, _ in log]
    assert "step done" in events and events.index("step done") < events.index("MainThread"), log


def test_a_stuck_step_holds_the_last_words_back_one_second_at_most(runtime: Runtime) -> None:
    inside, log = _hold_steps(runtime, 3.0)
    assert inside.wait(5.0)
    began = time.monotonic()
    runtime.final("exit", timeout_s=0.5)
    assert time.monotonic() - began < 2.5
    assert [name for name, _ in log].count("step done") == 0  # said while the step still ran
