"""The rank's span shipper (instrumentation/export.py) in this process, against a real OTLP receiver.

What the multi-process tests show from outside (training never waits on export), here from
inside: spans arrive with their ids, status and resource; a full queue drops and counts; an
unreachable collector and an exporter that raises count as failed exports; the standard OTEL_*
variables choose the exporter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence

import pytest
from mycroft.instrumentation import export
from mycroft.instrumentation.export import Shipper, exporter_from_env, to_readable_span
from mycroft.instrumentation.wire_exporters import WireGrpcExporter, WireHttpExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SpanExporter, SpanExportResult
from opentelemetry.trace import StatusCode

from mycroft import schema
from mycroft.faults.made_up_job import Group, collective
from mycroft.otlp import SpanRecord
from mycroft.otlp_server import OtlpReceiver
from tests.conftest import SpanSink, free_port

RESOURCE = Resource.create({schema.RES_JOB_ID: "ship", schema.RES_RANK: 0, "service.name": "ship"})


def _spans(n: int, state: str = schema.STATE_COMPLETED) -> list[SpanRecord]:
    group = Group("0", (0, 1))
    return [collective("ship", 0, 2, group, seq, 10.0 + seq, 10.5 + seq, state=state) for seq in range(1, n + 1)]


def test_readable_span_keeps_ids_parent_and_error_status() -> None:
    failed = _spans(1, state=schema.STATE_ERROR)[0]
    failed.parent_span_id = 77
    span = to_readable_span(failed, RESOURCE)
    assert span.context is not None and span.parent is not None
    assert (span.context.trace_id, span.context.span_id, span.parent.span_id) == \
        (failed.trace_id, failed.span_id, 77)
    assert span.status.status_code is StatusCode.ERROR and span.status.description == failed.status_message
    ok = to_readable_span(_spans(1)[0], RESOURCE)
    assert ok.parent is None and ok.status.status_code is StatusCode.OK and ok.status.description is None
    assert ok.attributes == _spans(1)[0].attributes and ok.resource is RESOURCE


@pytest.fixture
def receiver() -> Iterator[tuple[SpanSink, int, int]]:
    """A real OTLP receiver on gRPC and HTTP: (sink, grpc port, http port)."""
    sink = SpanSink()
    server = OtlpReceiver(sink, "127.0.0.1:0", f"127.0.0.1:{free_port()}").start()
    assert server.grpc_port and server.http_port
    try:
        yield sink, server.grpc_port, server.http_port
    finally:
        server.stop(0)


@pytest.mark.parametrize("kind", ["library-grpc", "wire-grpc", "wire-http"])
def test_spans_reach_a_real_receiver_with_their_resource(receiver: tuple[SpanSink, int, int], kind: str) -> None:
    """The library's exporter (ReadableSpans, its encoder) and ours (pre-encoded requests, its transport)
    deliver the same spans."""
    sink, grpc_port, http_port = receiver
    exporter: SpanExporter = {
        "library-grpc": lambda: GrpcExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True),
        "wire-grpc": lambda: WireGrpcExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True),
        "wire-http": lambda: WireHttpExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces"),
    }[kind]()
    shipper = Shipper(exporter, RESOURCE, max_queue=100, batch_size=8, delay_s=0.05)
    assert (shipper._wire is not None) == kind.startswith("wire")
    sent = _spans(20) + _spans(1, state=schema.STATE_ERROR)
    sent[-1].span_id += 1  # its own span in the first op's trace
    try:
        shipper.submit(sent)
        assert shipper.flush(10.0)
        assert sink.wait_for(lambda got: len(got) >= len(sent), timeout=10)
    finally:
        shipper.shutdown()
    got = {(r.trace_id, r.span_id): r for r in sink.snapshot()}
    assert got.keys() == {(r.trace_id, r.span_id) for r in sent}
    for record in sent:
        arrived = got[(record.trace_id, record.span_id)]
        assert (arrived.attributes, arrived.status_code, arrived.status_message, arrived.start_ns,
                arrived.end_ns) == (record.attributes, record.status_code, record.status_message,
                                    record.start_ns, record.end_ns)
        assert arrived.resource[schema.RES_JOB_ID] == "ship"
    assert shipper.exported == len(sent) and shipper.dropped == 0


@pytest.mark.parametrize("kind", ["library-grpc", "wire-grpc"])
def test_a_resource_handed_over_goes_with_the_next_spans(receiver: tuple[SpanSink, int, int], kind: str) -> None:
    """The start-up reporter's shipper goes on under the runtime with the full resource (runtime.py):
    the spans after the hand-over carry it, pre-encoded or not."""
    sink, grpc_port, _ = receiver
    exporter = (GrpcExporter if kind == "library-grpc" else WireGrpcExporter)(endpoint=f"127.0.0.1:{grpc_port}",
                                                                              insecure=True)
    shipper = Shipper(exporter, Resource.create({schema.RES_JOB_ID: "early"}), max_queue=100, batch_size=8,
                      delay_s=0.05)
    first, second = _spans(3), _spans(6)[3:]
    try:
        shipper.submit(first)
        assert shipper.flush(10.0)
        shipper.resource = RESOURCE
        shipper.submit(second)
        assert shipper.flush(10.0)
        assert sink.wait_for(lambda got: len(got) >= 6, timeout=10)
    finally:
        shipper.shutdown()
    jobs = {r.attributes[schema.ATTR_SEQ]: (r.resource.get(schema.RES_JOB_ID), r.resource.get(schema.RES_RANK))
            for r in sink.snapshot()}
    assert jobs == {1: ("early", None), 2: ("early", None), 3: ("early", None), 4: ("ship", 0), 5: ("ship", 0),
                    6: ("ship", 0)}


def test_the_wire_exporters_count_a_dead_collector_as_failed() -> None:
    closed = free_port()
    for exporter in (WireGrpcExporter(endpoint=f"127.0.0.1:{closed}", insecure=True, timeout=1),
                     WireHttpExporter(endpoint=f"http://127.0.0.1:{closed}/v1/traces", timeout=1)):
        shipper = Shipper(exporter, RESOURCE, max_queue=100, batch_size=5, delay_s=0.01)
        try:
            shipper.submit(_spans(5))
            assert shipper.flush(10.0)
        finally:
            shipper.shutdown()
        assert shipper.exported == 0 and shipper.dropped_export_failed == 5, type(exporter).__name__


class _Gate(SpanExporter):
    """An exporter that holds the export thread until released, then answers `result` (or raises)."""

    def __init__(self, result: SpanExportResult | None) -> None:
        self.result = result
        self.released = False
        self.batches: list[int] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        while not self.released:
            time.sleep(0.005)
        self.batches.append(len(spans))
        if self.result is None:
            raise RuntimeError("exporter bug")
        return self.result

    def shutdown(self) -> None:
        self.released = True


def test_a_full_queue_drops_and_counts_never_blocks(caplog: pytest.LogCaptureFixture) -> None:
    gate = _Gate(SpanExportResult.SUCCESS)
    shipper = Shipper(gate, RESOURCE, max_queue=10, batch_size=5, delay_s=0.01)
    try:
        shipper.submit(_spans(5))  # the export thread takes these and waits at the gate
        deadline = time.monotonic() + 5
        while not shipper._in_flight and time.monotonic() < deadline:
            time.sleep(0.005)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="mycroft.instrumentation"):
            for _ in range(4):
                shipper.submit(_spans(5))
        assert time.monotonic() - started < 0.5  # submit never waits on the exporter
        assert shipper.dropped_queue_full == 10  # room for 10 of the 20
        assert sum("queue full" in r.getMessage() for r in caplog.records) == 1  # logged once
        gate.released = True
        assert shipper.flush(5.0)
    finally:
        gate.released = True
        shipper.shutdown()
    assert shipper.exported == 15 and sum(gate.batches) == 15


@pytest.mark.parametrize("result", [SpanExportResult.FAILURE, None], ids=["failure", "raises"])
def test_failed_exports_are_counted_and_logged_once(result: SpanExportResult | None,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    gate = _Gate(result)
    gate.released = True
    shipper = Shipper(gate, RESOURCE, max_queue=100, batch_size=4, delay_s=0.01)
    with caplog.at_level(logging.WARNING, logger="mycroft.instrumentation"):
        for _ in range(3):
            shipper.submit(_spans(4), urgent=True)
            assert shipper.flush(5.0)
        shipper.shutdown()
    assert shipper.dropped_export_failed == 12 and shipper.exported == 0 and shipper.dropped == 12
    logged = [r.getMessage() for r in caplog.records if r.name == "mycroft.instrumentation"]
    # each kind once: "failed" for every failure, "raised" too where the exporter raised
    assert len(logged) == (1 if result is not None else 2), logged
    assert sum("export failed" in line for line in logged) == 1


def test_an_unreachable_collector_costs_the_export_thread_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    closed = free_port()  # nothing listens there
    shipper = Shipper(GrpcExporter(endpoint=f"127.0.0.1:{closed}", insecure=True), RESOURCE, max_queue=100,
                      batch_size=4, delay_s=0.01)
    try:
        started = time.monotonic()
        shipper.submit(_spans(4), urgent=True)
        assert time.monotonic() - started < 0.1
        deadline = time.monotonic() + 20
        while shipper.dropped_export_failed < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        shipper.shutdown(timeout_s=5.0)
    assert shipper.dropped_export_failed == 4 and shipper.exported == 0


def test_a_tracer_providers_span_processor_gets_the_spans() -> None:
    seen: list[ReadableSpan] = []

    class Processor:
        def on_end(self, span: ReadableSpan) -> None:
            seen.append(span)

    shipper = Shipper(None, RESOURCE, max_queue=100, batch_size=50, delay_s=0.01, deliver=Processor())
    shipper.submit(_spans(3), urgent=True)
    assert shipper.flush(5.0)
    shipper.shutdown()
    assert [s.attributes[schema.ATTR_SEQ] for s in seen if s.attributes] == [1, 2, 3] and shipper.exported == 3


@pytest.mark.parametrize(("env", "kind"), [
    ({}, GrpcExporter),
    ({"OTEL_TRACES_EXPORTER": "none"}, None),
    ({"OTEL_TRACES_EXPORTER": "console"}, ConsoleSpanExporter),
    ({"OTEL_TRACES_EXPORTER": "none,otlp"}, GrpcExporter),  # the first that is not "none"
    ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, HttpExporter),
    ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"}, HttpExporter),  # json: not in Python, protobuf instead
    ({"OTEL_TRACES_EXPORTER": "otlp_proto_http"}, HttpExporter),
    ({"OTEL_TRACES_EXPORTER": "zipkin"}, GrpcExporter),  # unknown: otlp, with a warning
])
def test_the_standard_variables_choose_the_exporter(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                                    kind: type | None) -> None:
    for name in ("OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    exporter = exporter_from_env()
    try:
        if kind is None:
            assert exporter is None
        else:  # the OTLP ones: the library's, taking Mycroft's pre-encoded requests (wire_exporters.py)
            assert isinstance(exporter, kind)
            assert callable(getattr(exporter, "export_wire", None)) == (kind is not ConsoleSpanExporter)
    finally:
        if exporter is not None:
            exporter.shutdown()


def test_log_once_is_per_kind() -> None:
    shipper = Shipper(None, RESOURCE, max_queue=1, batch_size=1, delay_s=0.01)
    try:
        shipper._log_once("a", "one %s", "x")
        shipper._log_once("a", "one %s", "y")
        shipper._log_once("b", "two")
        assert shipper._logged == {"a", "b"}
    finally:
        shipper.shutdown()
    assert export.log.name == "mycroft.instrumentation"
