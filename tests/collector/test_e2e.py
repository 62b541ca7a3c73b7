"""End to end with real processes: instrumented gloo ranks -> processor -> RCA service.

    torchrun (4 instrumented gloo ranks) -> rotel + processor  -> `mycroft rca serve` (--forward -> sink)
                                         or processor service  -> a second receiver (Jaeger / Tempo stand-in)

Rank 2 sleeps before one all_reduce: the summary of that collective, as the RCA service
received it (its --forward tee), must name rank 2 last with the skew the rank spans show;
the RCA service must have folded the job's spans and heartbeats into its live state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from mycroft.collector_processor.collector import EmbeddedCollector
from mycroft.collector_processor.config import ProcessorConfig
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from mycroft import schema
from mycroft.faults import made_up_spans as syn
from mycroft.otlp import SpanRecord, request_from_records
from mycroft.otlp_server import OtlpReceiver
from tests.collector.procs import api_get, embedded_collector, processor_service, rca_service
from tests.conftest import SpanSink, free_port, instrumented_env, run_torchrun

pytestmark = pytest.mark.slow
JOB = Path(__file__).parent / "jobs" / "straggler.py"
DELAY = 0.6


@pytest.fixture
def rca_and_jaeger(tmp_path: Path) -> Iterator[tuple[dict[str, str], SpanSink, SpanSink, str]]:
    """(real RCA service, what the RCA service received, Jaeger stand-in sink, its endpoint)."""
    received, jaeger = SpanSink(), SpanSink()
    receivers = [OtlpReceiver(received, "127.0.0.1:0", None).start(), OtlpReceiver(jaeger, "127.0.0.1:0", None).start()]
    try:
        with rca_service(str(tmp_path), forward=f"127.0.0.1:{receivers[0].grpc_port}") as rca:
            yield rca, received, jaeger, f"http://127.0.0.1:{receivers[1].grpc_port}"
    finally:
        for receiver in receivers:
            receiver.stop(0)


def _run_job(otlp_grpc_port: int, job: str) -> None:
    env = instrumented_env(otlp_grpc_port, MYCROFT_JOB_ID=job, MYCROFT_HEARTBEAT_INTERVAL="0.5")
    result = run_torchrun(JOB, 4, env, "--steps", "6", "--slow-rank", "2", "--slow-step", "3",
                          "--delay", str(DELAY))
    assert result.returncode == 0, result.stderr[-3000:]


def _check_straggler_summary(spans: list[SpanRecord], job: str) -> None:
    summaries = [s for s in spans if s.name == schema.SPAN_COLLECTIVE_SUMMARY and s.job_id == job]
    rank_spans = [s for s in spans if s.kind == schema.KIND_COLLECTIVE and s.job_id == job]
    assert len(summaries) == len({s.trace_id for s in rank_spans}) == 7  # 6 all_reduce + barrier
    # steps 0..3 are all_reduce seq 1..4 of the default group: rank 2 slept before seq 4
    (slow,) = [s for s in summaries if s.attributes[schema.ATTR_OP] == schema.OP_ALL_REDUCE
               and s.attributes[schema.ATTR_SEQ] == 4]
    a = slow.attributes
    assert a[schema.ATTR_SUM_LAST_RANK] == 2
    members = [s for s in rank_spans if s.trace_id == slow.trace_id]
    assert sorted(s.rank for s in members) == a[schema.ATTR_SUM_RANKS] == [0, 1, 2, 3]
    first = min(members, key=lambda s: s.start_ns)
    last = max(members, key=lambda s: s.start_ns)
    assert a[schema.ATTR_SUM_FIRST_RANK] == first.rank and last.rank == 2
    assert a[schema.ATTR_SUM_ARRIVAL_SKEW_S] == pytest.approx((last.start_ns - first.start_ns) / 1e9, abs=1e-9)
    assert a[schema.ATTR_SUM_ARRIVAL_SKEW_S] >= DELAY - 0.05
    assert a[schema.ATTR_SUM_COMPLETE] is True and a[schema.ATTR_SUM_MISSING_RANKS] == []
    assert schema.ANOMALY_SKEWED in str(a[schema.ATTR_SUM_ANOMALY])
    assert a[schema.ATTR_BYTES] == 4096 * 4
    assert a[schema.ATTR_SUM_BUSBW_GBPS] == pytest.approx(a[schema.ATTR_SUM_ALGBW_GBPS] * 1.5)
    assert schema.RES_RANK not in slow.resource and schema.ATTR_RANK not in a
    # every summary agrees with the rank spans it joined
    for summary in summaries:
        joined = [s for s in rank_spans if s.trace_id == summary.trace_id]
        latest = max(joined, key=lambda s: s.start_ns)
        assert summary.attributes[schema.ATTR_SUM_LAST_RANK] == latest.rank
    # heartbeats made it through, untouched (parallel arrays intact)
    beats = [s for s in spans if s.kind == schema.KIND_HEARTBEAT and s.job_id == job]
    assert {b.rank for b in beats} == {0, 1, 2, 3}
    for beat in beats:
        ids = beat.attributes[schema.ATTR_HB_GROUP_IDS]
        assert isinstance(ids, list)
        assert len(ids) == len(beat.attributes[schema.ATTR_HB_GROUP_ISSUED])


def _done(job: str) -> object:
    return lambda spans: sum(1 for s in spans if s.name == schema.SPAN_COLLECTIVE_SUMMARY and s.job_id == job) >= 7


def _check_rca_state(api: str, job: str) -> None:
    (state,) = [j for j in api_get(f"{api}/api/v1/jobs") if j["job"] == job]
    assert state["ranks_seen"] == 4 and state["heartbeats"] > 0 and state["completions"] > 0, state


def test_ranks_through_rotel_with_the_processor_to_the_rca_service(
        rca_and_jaeger: tuple[dict[str, str], SpanSink, SpanSink, str]) -> None:
    rca, received, jaeger, jaeger_endpoint = rca_and_jaeger
    with embedded_collector(rca["otlp_grpc"], jaeger_endpoint, args=("--linger", "0.2")) as (_, ready):
        _run_job(ready["grpc_port"], "e2e-rotel")
        assert received.wait_for(_done("e2e-rotel"), 30), [s.name for s in received.snapshot()]
        assert jaeger.wait_for(_done("e2e-rotel"), 10)
    _check_straggler_summary(received.snapshot(), "e2e-rotel")
    _check_straggler_summary(jaeger.snapshot(), "e2e-rotel")
    _check_rca_state(rca["api"], "e2e-rotel")


def test_ranks_through_the_standalone_service_to_the_rca_service(
        rca_and_jaeger: tuple[dict[str, str], SpanSink, SpanSink, str]) -> None:
    rca, received, jaeger, jaeger_endpoint = rca_and_jaeger
    with processor_service(rca["otlp_grpc"], jaeger_endpoint, args=("--linger", "0.2")) as (_, ready):
        _run_job(ready["otlp_grpc"], "e2e-service")
        assert received.wait_for(_done("e2e-service"), 30), [s.name for s in received.snapshot()]
        assert jaeger.wait_for(_done("e2e-service"), 10)
    _check_straggler_summary(received.snapshot(), "e2e-service")
    _check_straggler_summary(jaeger.snapshot(), "e2e-service")
    _check_rca_state(rca["api"], "e2e-service")


@pytest.mark.parametrize("engine", ["rotel", "standalone"])
def test_stopping_the_embedded_collector_flushes_open_collectives(tmp_path: Path, engine: str) -> None:
    sink = SpanSink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", None).start()
    collector = EmbeddedCollector([f"http://127.0.0.1:{receiver.grpc_port}"], f"127.0.0.1:{free_port()}",
                                  f"127.0.0.1:{free_port()}", ProcessorConfig(window_s=60.0), workdir=tmp_path,
                                  engine=engine)
    try:
        collector.start()
        assert collector.engine_used == engine, collector.notice()
        t0 = 1_700_000_000_000_000_000
        spans = [syn.collective_span(rank, 9, t0 + rank * 1000, t0 + 10**7, job="flush") for rank in (0, 1, 2)]
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(collector.otlp_grpc))
        stub.Export(request_from_records(spans), timeout=10)
        assert sink.wait_for(lambda got: len(got) == 3, 10)  # rank spans pass at once; rank 3 never comes
        assert collector.stop() == 0
        summaries = [s for s in sink.snapshot() if s.name == schema.SPAN_COLLECTIVE_SUMMARY]
        assert len(summaries) == 1
        a = summaries[0].attributes
        assert a[schema.ATTR_SUM_CLOSED] == schema.CLOSED_SHUTDOWN and a[schema.ATTR_SUM_MISSING_RANKS] == [3]
    finally:
        collector.stop()
        receiver.stop(0)


def test_rotel_starts_under_an_activated_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`source .venv/bin/activate` puts the venv's python first on PATH: rotel's embedded CPython
    found its home through it and loaded this interpreter's standard library (ImportError: _ssl)."""
    import os
    import sys

    venv_bin = os.path.join(sys.prefix, "bin")
    monkeypatch.setenv("PATH", os.pathsep.join([venv_bin, os.environ.get("PATH", "")]))
    monkeypatch.setenv("VIRTUAL_ENV", sys.prefix)
    receiver = OtlpReceiver(SpanSink(), "127.0.0.1:0", None).start()
    collector = EmbeddedCollector([f"http://127.0.0.1:{receiver.grpc_port}"], f"127.0.0.1:{free_port()}",
                                  f"127.0.0.1:{free_port()}", ProcessorConfig(), workdir=tmp_path, engine="rotel")
    try:
        collector.start()
        assert collector.engine_used == "rotel", collector.notice()  # not the fallback
        assert "VIRTUAL_ENV" not in collector.environment()
        assert collector.stop() == 0
    finally:
        collector.stop()
        receiver.stop(0)
