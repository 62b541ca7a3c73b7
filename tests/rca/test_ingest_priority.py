"""Heartbeats first: a span flood sheds op spans, never heartbeats, and a backlog defers verdicts
instead of making ranks look silent (the real service over real OTLP/gRPC)."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import grpc
import pytest
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.service import RcaService, ServiceOptions
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import SpanRecord, request_from_records

from .helpers import wait_until


def _service(db: Path, **kw: object) -> RcaService:
    cfg = dataclasses.replace(AnalysisConfig(), resolve_after_s=0.5)
    return RcaService(ServiceOptions(otlp_grpc="127.0.0.1:0", otlp_http=None, http="127.0.0.1:0", db=str(db),
                                     tick_s=3600.0, analysis=cfg, **kw))  # type: ignore[arg-type]


def _export(stub: trace_service_pb2_grpc.TraceServiceStub,
            records: list[SpanRecord]) -> trace_service_pb2.ExportTraceServiceResponse:
    return stub.Export(request_from_records(records), timeout=10)


def _gauge(service: RcaService, name: str) -> float:
    for line in service.metrics.render(time.time()).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def _hold(service: RcaService) -> threading.Event:
    """Hold the ingest worker (a slow fold) until the returned event is set."""
    release = threading.Event()
    apply = service._apply

    def slow(records: list[SpanRecord], at: float) -> None:
        release.wait(30)
        apply(records, at)

    service.ingest._apply = slow  # type: ignore[method-assign]
    return release


def test_a_span_flood_sheds_op_spans_and_keeps_every_heartbeat(tmp_path: Path) -> None:
    service = _service(tmp_path / "rca.db", max_queued_spans=100).start()
    release = _hold(service)
    try:
        job = StepJob("flood", 8, t0=time.time() - 60)
        with grpc.insecure_channel(f"127.0.0.1:{service.receiver.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            shed = []
            for _ in range(12):  # 12 x (48 op spans + 8 heartbeats); room for 100 op spans
                answer = _export(stub, job.steps(6) + job.heartbeats(time.time(), not_entered=range(8), stack=""))
                shed.append(answer.partial_success.rejected_spans)
        assert shed[0] == 0 and shed[-1] == 48  # later requests: their op spans shed, not the request
        assert "heartbeats were accepted" in answer.partial_success.error_message
        assert service.ingest.queued_heartbeats in (11 * 8, 12 * 8)  # (one batch may be in the held fold)
        release.set()
        assert service.ingest.drain(20)
        state = service.engine.jobs["flood"]
        assert state.heartbeats == 12 * 8  # every heartbeat folded
        counters = service.metrics.counters
        before_decode = counters.get('mycroft_rca_spans_dropped_total{reason="shed_before_decode"}', 0)
        after_decode = counters.get('mycroft_rca_spans_dropped_total{reason="shed_for_heartbeats"}', 0)
        assert before_decode + after_decode == sum(shed) > 0
        assert before_decode > 0  # once the span queue is half full, op spans are not even decoded
    finally:
        release.set()
        service.stop()


def test_a_backlog_defers_the_analysis_instead_of_convicting_silent_ranks(tmp_path: Path) -> None:
    service = _service(tmp_path / "rca.db").start()
    try:
        job = StepJob("backlog", 8, t0=time.time() - 30)
        with grpc.insecure_channel(f"127.0.0.1:{service.receiver.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            _export(stub, job.steps(20) + job.heartbeats(time.time(), not_entered=range(8), stack=""))
            wait_until(lambda: service.ingest.queued == 0 and "backlog" in service.engine.jobs)
            release = _hold(service)
            try:
                for _ in range(3):  # the ranks keep beating; the service is behind
                    _export(stub, job.heartbeats(time.time(), not_entered=range(8), stack=""))
                # ten seconds later by the clock: with the newer heartbeats still queued, nobody is "lost"
                horizon = service.ingest.horizon()
                assert horizon is not None and horizon <= time.time()
                service.analyze_now(time.time() + 10.0)
                assert not service.engine.tracker.active
                assert _gauge(service, "mycroft_rca_ingest_lag_seconds") >= 9.0
            finally:
                release.set()
            assert service.ingest.drain(10)
            service.analyze_now()
            assert not service.engine.tracker.active
            # the control: the same silence with nothing queued is a crash
            service.analyze_now(time.time() + 10.0)
            assert any(i.kind == "crash" for i in service.engine.tracker.active.values())
    finally:
        service.stop()


def test_heartbeats_the_service_refused_hold_the_horizon_until_their_retries_can_come(tmp_path: Path) -> None:
    """A full heartbeat queue refuses a request (RESOURCE_EXHAUSTED: the exporter retries): the
    ranks in it are not lost meanwhile, the analysis runs as of the first refusal."""
    from mycroft.rca_service.ingest import queue as ingest

    service = _service(tmp_path / "rca.db").start()
    try:
        job = StepJob("refused", 8, t0=time.time() - 30)
        with grpc.insecure_channel(f"127.0.0.1:{service.receiver.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            _export(stub, job.steps(20) + job.heartbeats(time.time(), not_entered=range(8), stack=""))
            wait_until(lambda: service.ingest.queued == 0 and "refused" in service.engine.jobs)
            service.ingest._max_heartbeats = 0  # full: every heartbeat request is refused
            refused_at = time.time()
            with pytest.raises(grpc.RpcError) as refused:
                _export(stub, job.heartbeats(time.time(), not_entered=range(8), stack=""))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            horizon = service.ingest.horizon()
            assert horizon is not None and refused_at <= horizon <= time.time()
            service.analyze_now(time.time() + 10.0)  # the clock runs on; the service is blind since then
            assert not service.engine.tracker.active
            # once the exporters' retries could have come, the silence is real again
            service.ingest._refused_last -= ingest.REFUSAL_MEMORY_S + 0.1
            assert service.ingest.horizon() is None
            service.analyze_now(time.time() + 10.0)
            assert any(i.kind == "crash" for i in service.engine.tracker.active.values())
    finally:
        service.stop()


def test_an_op_span_backlog_does_not_hold_the_analysis_in_the_past() -> None:
    """Op spans wait behind heartbeats by design; only queued heartbeats say the service is behind."""
    from mycroft.rca_service.ingest.queue import IngestQueue
    from mycroft.rca_service.metrics import Metrics

    queue = IngestQueue(lambda records, at: None, Metrics())  # not started: everything stays queued
    job = StepJob("lagging", 2)
    queue.sink(job.steps(3))
    assert queue.queued == 6 and queue.horizon() is None
    before = time.time()
    queue.sink(job.heartbeats(time.time(), not_entered=range(2), stack=""))
    horizon = queue.horizon()
    assert horizon is not None and before <= horizon <= time.time()
