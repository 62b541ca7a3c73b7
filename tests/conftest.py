"""Shared fixtures: an in-process OTLP receiver and a launcher for instrumented torchrun jobs."""

from __future__ import annotations

import os
import random
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
from tests import components

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
    _must_be_slow("launches a torchrun job")
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


# The collection guard: a full run that collects fewer items than this is broken (an import error
# turned into a silently missing module, a conftest that hides a directory). Just under the real count
# (1007 on 2026-12-07): raise it as the suite grows, lower it only with the tests that went.
MIN_FULL_SUITE = 995
# ... and the same for the in-process run (`-m "not slow"`: 687 on 2026-12-07)
MIN_FAST_SUITE = 680
# ... and `./dev.sh quick` (in-process, no fuzzers)
QUICK_MARKS = "not slow and not fuzz"
MIN_QUICK_SUITE = 655  # 662 on 2026-12-07
SEED_ENV = "MYCROFT_TEST_SEED"

_current: pytest.Item | None = None  # the test being set up / run / torn down (for _must_be_slow)


def _must_be_slow(what: str) -> None:
    """A test that starts multi-process jobs carries @pytest.mark.slow, so `-m "not slow"` stays in-process."""
    item = _current
    if item is not None and item.get_closest_marker("slow") is None:
        pytest.fail(f"{item.nodeid} {what} but is not marked slow (@pytest.mark.slow)", pytrace=False)


# Audit events that start a process: whatever starts one (subprocess, os.fork, os.posix_spawn,
# os.exec*) in a test not marked slow fails it, so `-m "not slow"` is in-process by construction.
_PROCESS_EVENTS = frozenset({"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                             "os.exec"})


def _process_audit(event: str, args: tuple[object, ...]) -> None:
    if event in _PROCESS_EVENTS and _current is not None and _current.get_closest_marker("slow") is None:
        _must_be_slow(f"starts a process ({event}: {str(args[:2])[:120]})")


sys.addaudithook(_process_audit)


def _spawn_is_audited() -> None:
    """multiprocessing's spawn and forkserver start children through _posixsubprocess, which raises no
    audit event: route it through one so those starts are caught too."""
    import multiprocessing.util as mp_util

    spawnv_passfds = mp_util.spawnv_passfds

    def audited(path: bytes, args: object, passfds: object) -> int:
        sys.audit("os.posix_spawn", path, args)
        return spawnv_passfds(path, args, passfds)

    mp_util.spawnv_passfds = audited  # type: ignore[assignment]


_spawn_is_audited()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    global _current
    _current = item
    try:
        return (yield)
    finally:
        _current = None


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Which real components this run lacks, up front (and whether that fails or skips)."""
    gone = [why for name in components.COMPONENTS if (why := components.missing(name))]
    mode = "fail" if components.strict() else "skip"
    return [f"mycroft: missing components ({mode}): {why}" for why in gone] or ["mycroft: every real component found"]


def pytest_runtest_setup(item: pytest.Item) -> None:
    for marker in item.iter_markers("requires"):
        for name in marker.args:
            components.require(name)


@pytest.fixture
def fault_rng(request: pytest.FixtureRequest) -> random.Random:
    """The random source of a fault's rank / step / time: seeded, the seed printed with a failure,
    replayable with MYCROFT_TEST_SEED=<seed>."""
    given = os.environ.get(SEED_ENV, "")
    seed = int(given) if given.strip() else random.SystemRandom().randrange(2**32)
    request.node.user_properties.append(("seed", seed))
    return random.Random(seed)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    report: pytest.TestReport = yield
    seeds = [value for key, value in item.user_properties if key == "seed"]
    if seeds and report.failed:
        report.sections.append(("fault seed", f"seed {seeds[0]}: replay with {SEED_ENV}={seeds[0]} "
                                              f"pytest '{item.nodeid}'"))
    return report


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every hypothesis test is a fuzz test (`./dev.sh quick` leaves them out: they run in the full suite)."""
    fuzz = pytest.mark.fuzz
    for item in items:
        if getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(fuzz)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A full run that collects (almost) nothing is a broken suite, not a green one."""
    config = session.config
    full_run = not config.args or [str(a) for a in config.args] == [str(REPO / "tests")] or config.args == ["tests"]
    if not full_run or config.option.keyword:
        return
    markexpr = (config.option.markexpr or "").strip()
    minimum = {"": MIN_FULL_SUITE, "not slow": MIN_FAST_SUITE, QUICK_MARKS: MIN_QUICK_SUITE}.get(markexpr, 0)
    if len(session.items) < minimum:
        raise pytest.UsageError(f"only {len(session.items)} tests collected; the suite has more than "
                                f"{minimum}: a collection problem")
