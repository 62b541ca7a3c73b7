"""Shared fixtures: an in-process OTLP receiver and a launcher for instrumented torchrun jobs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mycroft.faults.inject import kill_tree
from mycroft.otlp import SpanRecord
from mycroft.otlp_server import OtlpReceiver

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SpanSink:
    """Collects what an OTLP receiver gets; wait_for() polls with a deadline."""

    def __init__(self) -> None:
        self.records: list[SpanRecord] = []
        self._lock = threading.Lock()
        self.arrivals: list[tuple[float, SpanRecord]] = []

    def __call__(self, records: list[SpanRecord]) -> None:
        now = time.monotonic()
        with self._lock:
            self.records.extend(records)
            self.arrivals.extend((now, record) for record in records)

    def snapshot(self) -> list[SpanRecord]:
        with self._lock:
            return list(self.records)

    def wait_for(self, predicate: Callable[[list[SpanRecord]], bool], timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate(self.snapshot()):
                return True
            time.sleep(0.1)
        return predicate(self.snapshot())


@pytest.fixture
def otlp_sink() -> Iterator[tuple[SpanSink, int]]:
    """A real OTLP/gRPC receiver on a free port: (sink, port)."""
    sink = SpanSink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", None).start()
    assert receiver.grpc_port
    try:
        yield sink, receiver.grpc_port
    finally:
        receiver.stop(0)


def instrumented_env(grpc_port: int | None, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{grpc_port}" if grpc_port else "http://127.0.0.1:9",
        OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def torchrun_command(script: Path | str, nproc: int, *args: str, instrumented: bool = True) -> list[str]:
    command = [str(BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-port", str(free_port()),
               str(script), *args]
    return [str(BIN / "opentelemetry-instrument"), *command] if instrumented else command


def run_torchrun(script: Path | str, nproc: int, env: dict[str, str], *args: str, timeout: float = 240,
                 instrumented: bool = True) -> subprocess.CompletedProcess[str]:
    """The job's output; on a timeout every worker goes too (torchrun gives each its own session)."""
    command = torchrun_command(script, nproc, *args, instrumented=instrumented)
    with subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=str(REPO)) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(process)
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


MIN_FULL_SUITE = 100


def pytest_collection_finish(session: pytest.Session) -> None:
    """A full run that collects (almost) nothing is a broken suite, not a green one."""
    config = session.config
    full_run = not config.args or [str(a) for a in config.args] == [str(REPO / "tests")] or config.args == ["tests"]
    if full_run and not config.option.keyword and not config.option.markexpr and \
            len(session.items) < MIN_FULL_SUITE:
        raise pytest.UsageError(f"only {len(session.items)} tests collected; the suite has more than "
                                f"{MIN_FULL_SUITE}: a collection problem")
