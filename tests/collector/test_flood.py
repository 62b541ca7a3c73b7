"""Under a span flood: the processor's memory stays bounded and heartbeats keep flowing.

A client floods the processor with never-completing collectives (rank 0 only, each
with native detail: the worst case, since every one stays open until evicted and
then keeps its raw detail) while another client sends one heartbeat every 0.2 s.
Downstream, a light receiver times each heartbeat's arrival. Both deployments.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mycroft import schema
from mycroft.faults import made_up_spans as syn
from mycroft.otlp import request_from_records
from tests.collector.procs import embedded_collector, processor_service, rss_kib

pytestmark = pytest.mark.slow
CALM_S = 1.5
FLOOD_S = 6.0
HB_EVERY_S = 0.2
# small caps, so that a flood a Python client can produce on 2 cores overruns them
MAX_OPEN, MAX_DETAIL = 50, 2000
CAPS = ("--max-open", str(MAX_OPEN), "--max-detail", str(MAX_DETAIL), "--window", "30")


class LightSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Counts spans and timestamps heartbeats without decoding the flood."""

    def __init__(self) -> None:
        self.spans = 0
        self.heartbeats: dict[int, float] = {}
        self.lock = threading.Lock()

    def Export(self, request, context):
        now = time.monotonic()
        count = 0
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                count += len(ss.spans)
                for span in ss.spans:
                    if span.name == schema.SPAN_HEARTBEAT:
                        for kv in span.attributes:
                            if kv.key == schema.ATTR_HB_COUNTER:
                                with self.lock:
                                    self.heartbeats.setdefault(kv.value.int_value, now)
        with self.lock:
            self.spans += count
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def light_sink() -> Iterator[tuple[LightSink, str]]:
    sink = LightSink()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield sink, f"http://127.0.0.1:{port}"
    finally:
        server.stop(0)


def _flood_template() -> ExportTraceServiceRequest:
    shape = syn.StepDetail(channels=4, steps=20, counter_samples=4)  # 8 flows x 24 = 192 detail spans
    records = []
    for seq in range(5):
        records.append(syn.collective_span(0, seq, 0, 1000, job="flood"))
        records += syn.native_detail(0, seq, 0, 1000, shape, job="flood")
    return request_from_records(records)


def _flood(port: int, stop: threading.Event, sent: list[int]) -> None:
    """Send copies of the template with fresh trace ids until `stop` (each request: 5 collectives)."""
    stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    request = _flood_template()
    spans = [span for rs in request.resource_spans for ss in rs.scope_spans for span in ss.spans]
    by_trace: dict[bytes, list[Any]] = {}
    for span in spans:
        by_trace.setdefault(span.trace_id, []).append(span)
    counter = 0
    while not stop.is_set():
        for group in by_trace.values():
            counter += 1
            trace_id = os.urandom(8) + counter.to_bytes(8, "big")
            for span in group:
                span.trace_id = trace_id
        try:
            stub.Export(request, timeout=10)
            sent[0] += len(spans)
        except grpc.RpcError:
            time.sleep(0.01)  # shed by the server (RESOURCE_EXHAUSTED): a real exporter retries later


def _heartbeats(port: int, stop: threading.Event, sent_at: dict[int, float]) -> None:
    stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
    counter = 0
    while not stop.is_set():
        counter += 1
        request = request_from_records([syn.heartbeat_span(1, counter, time.time_ns(), job="flood")])
        sent_at[counter] = time.monotonic()
        stub.Export(request, timeout=10)
        time.sleep(HB_EVERY_S)


def _run_flood(port: int, pid: int, sink: LightSink) -> dict[str, Any]:
    """Heartbeats alone for CALM_S (the machine's baseline latency), then with the flood."""
    stop, stop_beats = threading.Event(), threading.Event()
    sent = [0]
    sent_at: dict[int, float] = {}
    flooders = [threading.Thread(target=_flood, args=(port, stop, sent)) for _ in range(2)]
    beater = threading.Thread(target=_heartbeats, args=(port, stop_beats, sent_at))
    beater.start()
    time.sleep(CALM_S)
    calm = set(sent_at)
    for thread in flooders:
        thread.start()
    rss: list[tuple[float, int]] = []
    t0 = time.monotonic()
    while time.monotonic() - t0 < FLOOD_S:
        rss.append((time.monotonic() - t0, rss_kib(pid)))
        time.sleep(0.25)
    stop.set()
    stop_beats.set()
    for thread in (*flooders, beater):
        thread.join(15)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(sink.heartbeats) < len(sent_at):
        time.sleep(0.05)
    late = {c: sink.heartbeats[c] - sent_at[c] for c in sent_at if c in sink.heartbeats}
    return {"sent_spans": sent[0], "rss": rss, "heartbeats_sent": len(sent_at), "heartbeats_received": len(late),
            "calm": sorted(v for c, v in late.items() if c in calm),
            "flood": sorted(v for c, v in late.items() if c not in calm)}


def _median(values: list[float]) -> float:
    return values[len(values) // 2]


def _check(result: dict[str, Any]) -> None:
    assert result["heartbeats_received"] == result["heartbeats_sent"], result  # none lost
    calm, flood = result["calm"], result["flood"]
    assert len(calm) >= 3 and len(flood) >= 10, result
    # no delay from the flood: compared with this machine's own calm latency (it is shared)
    assert _median(flood) < _median(calm) + 0.3, result
    assert flood[-1] < max(calm) + 1.5, result
    peak_mib = max(kib for _, kib in result["rss"]) / 1024
    second_half = [kib for t, kib in result["rss"] if t >= FLOOD_S / 2]
    first_half = [kib for t, kib in result["rss"] if t < FLOOD_S / 2]
    assert peak_mib < 600, result["rss"]
    # a plateau, not a leak: the second half grows by less than a third of the first
    assert max(second_half) - max(first_half) < max(first_half) / 3, result["rss"]


def test_service_under_flood(light_sink: tuple[LightSink, str]) -> None:
    sink, endpoint = light_sink
    with processor_service(endpoint, args=(*CAPS, "--max-backlog", "5000", "--max-export-queue", "10000")) as (
            proc, ready):
        result = _run_flood(ready["otlp_grpc"], proc.pid, sink)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{ready['metrics']}/metrics", timeout=5).read().decode()
    _check(result)
    values = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if not line.startswith("#")}
    assert values["mycroft_processor_open_collectives"] <= MAX_OPEN
    assert values["mycroft_processor_buffered_detail_spans"] <= MAX_DETAIL
    shed = sum(v for k, v in values.items() if k.startswith("mycroft_processor_dropped_")) + values[
        "mycroft_processor_windows_evicted_total"]
    assert shed > 0  # the caps were reached, and it shows in the counters
    assert values["mycroft_processor_heartbeats_total"] == result["heartbeats_sent"]


def test_rotel_under_flood(light_sink: tuple[LightSink, str], tmp_path: Any) -> None:
    sink, endpoint = light_sink
    with embedded_collector(endpoint, args=CAPS, workdir=str(tmp_path)) as (proc, ready):
        result = _run_flood(ready["grpc_port"], proc.pid, sink)
        time.sleep(1.2)  # one more stats write
        stats = json.loads((tmp_path / "processor-stats.json").read_text())
    _check(result)
    assert stats["gauges"]["open_collectives"] <= MAX_OPEN
    assert stats["gauges"]["buffered_detail_spans"] <= MAX_DETAIL
    counters = stats["counters"]
    assert counters["heartbeats"] == result["heartbeats_sent"]
    assert counters["windows_evicted"] + counters["dropped_overload"] + counters["dropped_detail_cap"] > 0
