"""The thin edges, in process: request splitting, fan-out lanes, the tee, the service's error
handling, the rotel budget and the embedded collector's command line."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from mycroft.collector_processor.budget import BusyBudget
from mycroft.collector_processor.collector import EmbeddedCollector, rotel_binary
from mycroft.collector_processor.config import ProcessorConfig
from mycroft.collector_processor.export import Fanout, grpc_target
from mycroft.collector_processor.proto_edge import split_request
from mycroft.collector_processor.service import ProcessorService
from mycroft.collector_processor.stats import Counters
from mycroft.collector_processor.tee import ExportTee
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mycroft import schema
from mycroft.faults import made_up_spans as syn
from mycroft.otlp import SpanRecord, encode_json, request_from_records
from mycroft.otlp_server import OtlpReceiver
from tests.conftest import SpanSink

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def _mixed_batch() -> list[SpanRecord]:
    batch = next(syn.training_run(1, world=2, step_detail=syn.StepDetail(channels=1, steps=2, counter_samples=1),
                                  heartbeat_every=1))
    other = SpanRecord(trace_id=99, span_id=98, name="GET /healthz", start_ns=1, end_ns=2, scope="http")
    return [*batch, other]


def test_split_forwards_what_passes_and_decodes_only_what_the_core_needs() -> None:
    batch = _mixed_batch()
    split = split_request(request_from_records(batch), budget=10_000)
    names = [r.name for r in batch]
    detail = sum(1 for n in names if n in (schema.SPAN_NATIVE_STEP, schema.SPAN_NATIVE_FLOW))
    joinable = sum(1 for n in names if n in (schema.OP_ALL_REDUCE, schema.SPAN_NATIVE_COLL))
    assert split.received == len(batch)
    assert split.urgent_spans == names.count(schema.SPAN_HEARTBEAT) == 2
    assert split.passthrough_spans == joinable + 1  # rank spans + the foreign span, not the detail
    assert len(split.feed) == joinable + detail
    passed = [s.name for rs in split.passthrough.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert "GET /healthz" in passed and schema.SPAN_NATIVE_STEP not in passed
    # a budget of 3: the rest of the detail is dropped undecoded, the rest of the rank spans pass unjoined
    small = split_request(request_from_records(batch), budget=3)
    assert len(small.feed) == 3
    assert small.dropped_detail + small.unjoined == joinable + detail - 3
    assert small.passthrough_spans == split.passthrough_spans


@pytest.fixture
def sinks() -> Iterator[list[tuple[SpanSink, str]]]:
    pairs = []
    for _ in range(2):
        sink = SpanSink()
        pairs.append((sink, OtlpReceiver(sink, "127.0.0.1:0", None).start()))
    try:
        yield [(sink, f"http://127.0.0.1:{receiver.grpc_port}") for sink, receiver in pairs]
    finally:
        for _, receiver in pairs:
            receiver.stop(0)


def test_fanout_reaches_every_endpoint_and_counts_a_dead_one(sinks: list[tuple[SpanSink, str]]) -> None:
    counters = Counters()
    (a, a_url), (b, b_url) = sinks
    fanout = Fanout([a_url, b_url, "http://127.0.0.1:9"], counters, attempts=2, timeout_s=1.0)
    hb = syn.heartbeat_span(0, 1, T0)
    spans = [syn.collective_span(r, 1, T0, T0 + MS) for r in range(4)]
    fanout.submit([hb], spans)
    assert a.wait_for(lambda got: len(got) == 5, 10) and b.wait_for(lambda got: len(got) == 5, 10)
    fanout.close(5.0)
    assert counters.get("dropped_export_error") == 5  # the dead endpoint's, counted, nobody else's


def test_full_bulk_lane_drops_and_counts_but_the_urgent_lane_flows() -> None:
    counters = Counters()
    gate = threading.Event()

    class Slow(trace_service_pb2_grpc.TraceServiceServicer):
        def __init__(self) -> None:
            self.names: list[str] = []

        def Export(self, request, context):
            names = [s.name for rs in request.resource_spans for ss in rs.scope_spans for s in ss.spans]
            self.names += names
            if schema.SPAN_HEARTBEAT not in names:
                gate.wait(10)  # bulk is stuck behind a slow backend
            return trace_service_pb2.ExportTraceServiceResponse()

    slow = Slow()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(slow, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        fanout = Fanout([f"http://127.0.0.1:{port}"], counters, max_queue_spans=10, batch_max=4)
        fanout.submit((), [syn.collective_span(0, s, T0, T0 + MS) for s in range(4)])  # in flight, stuck
        time.sleep(0.2)
        fanout.submit((), [syn.collective_span(0, s, T0, T0 + MS) for s in range(4, 24)])  # 20 > room of 10
        fanout.submit([syn.heartbeat_span(0, 7, T0)], ())
        deadline = time.monotonic() + 5
        while schema.SPAN_HEARTBEAT not in slow.names and time.monotonic() < deadline:
            time.sleep(0.02)
        assert schema.SPAN_HEARTBEAT in slow.names  # not behind the stuck bulk export
        assert counters.get("dropped_export_queue") > 0
        gate.set()
        fanout.close(5.0)
    finally:
        gate.set()
        server.stop(0)


def test_tee_copies_each_request_to_every_endpoint(sinks: list[tuple[SpanSink, str]]) -> None:
    (a, a_url), (b, b_url) = sinks
    tee = ExportTee([a_url, b_url]).start()
    try:
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(tee.endpoint.split("://")[1]))
        stub.Export(request_from_records(_mixed_batch()), timeout=5)
        for sink in (a, b):
            assert sink.wait_for(lambda got: len(got) == len(_mixed_batch()), 10)
    finally:
        tee.stop()


def test_service_answers_bad_input_clearly_and_keeps_serving(sinks: list[tuple[SpanSink, str]]) -> None:
    (sink, url), _ = sinks
    service = ProcessorService("127.0.0.1:0", "127.0.0.1:0", [url], ProcessorConfig(linger_s=0.0)).start()
    try:
        base = f"http://127.0.0.1:{service.http_port}/v1/traces"
        bad = urllib.request.Request(base, data=b"\x00garbage", headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(bad, timeout=5)
        assert err.value.code == 400 and b"bad OTLP request" in err.value.read()
        # then a good OTLP/JSON request through the decoded path, and a gRPC one through the fast path
        spans = [syn.collective_span(r, 3, T0 + r * 100 * MS, T0 + 400 * MS) for r in range(4)]
        good = urllib.request.Request(base, data=json.dumps(encode_json(spans[:2])).encode(),
                                      headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(good, timeout=5).status == 200
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(f"127.0.0.1:{service.grpc_port}"))
        stub.Export(request_from_records(spans[2:]), timeout=5)
        assert sink.wait_for(lambda got: any(s.name == schema.SPAN_COLLECTIVE_SUMMARY for s in got), 10)
        (summary,) = [s for s in sink.snapshot() if s.name == schema.SPAN_COLLECTIVE_SUMMARY]
        assert summary.attributes[schema.ATTR_SUM_LAST_RANK] == 3
        assert len([s for s in sink.snapshot() if s.kind == schema.KIND_COLLECTIVE]) == 4  # each once
    finally:
        service.stop()
    assert service.counters.get("spans_in") == 4
    assert service.counters.get("spans_out") == 5


def test_busy_budget_refills_at_its_rate() -> None:
    now = [0.0]
    budget = BusyBudget(busy_fraction=0.5, window_s=0.2, clock=lambda: now[0])
    assert budget.available() and budget.remaining() == pytest.approx(0.1)
    budget.spend(0.3)  # one expensive batch: now in debt
    assert not budget.available()
    now[0] += 0.3  # 0.15 s refilled: still 0.05 s short
    assert not budget.available()
    now[0] += 0.2
    assert budget.available()
    now[0] += 100  # never more than the bucket
    assert budget.remaining() == pytest.approx(0.1)


def test_embedded_collector_command_and_environment() -> None:
    collector = EmbeddedCollector(["http://rca:4317", "jaeger:4317"], "127.0.0.1:5317", "127.0.0.1:5318",
                                  ProcessorConfig(window_s=3.0))
    assert rotel_binary().name == "rotel-agent"
    env = collector.environment()
    assert json.loads(env["MYCROFT_PROCESSOR_CONFIG"])["window_s"] == 3.0
    assert env["MYCROFT_LOOPBACK"] == "http://127.0.0.1:5318"
    assert not [key for key in env if key.startswith("ROTEL_")]  # a user's ROTEL_* cannot leak in
    with pytest.raises(ValueError, match="HOST:PORT"):
        EmbeddedCollector(["http://no-port"])
    assert grpc_target("https://tempo:4317") == ("tempo:4317", True)
