"""Ingest edge: a bounded queue between the OTLP receiver and the engine, and the tee.

The receiver's threads only enqueue; one worker folds batches into the engine, so
analysis sees a consistent state. Heartbeats have their own queue and the worker always
folds them first: the live verdicts run on them, so a flood of op spans can delay or
shed op spans, never heartbeats. When the span queue is full, the op spans of a request
are shed (counted, reason "shed_for_heartbeats") and its heartbeats still go in; only
when the heartbeat queue is full too does the sink raise OverflowError, which the
receiver turns into 429 / RESOURCE_EXHAUSTED (OTLP clients retry). Memory stays bounded.

`horizon()` is the receive time of the oldest heartbeat not folded yet: the analysis runs
as of then, so a backlog delays verdicts instead of making ranks look silent. Refused
heartbeats are records not received yet (their exporters retry): from the first refusal
until REFUSAL_MEMORY_S after the last one, the horizon stays at the first, so a rank whose
heartbeat the service itself turned away is not convicted as lost.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from mycroft import schema
from mycroft.otlp import SpanRecord, request_from_records
from mycroft.otlp_server import split_host_port

from ..metrics import Metrics

log = logging.getLogger("mycroft.rca.ingest")


REFUSAL_MEMORY_S = 3.0  # an OTLP exporter's retry of a refused request comes within ~1-2 s


def _is_heartbeat(record: SpanRecord) -> bool:
    return record.attributes.get(schema.ATTR_SPAN_KIND) == schema.KIND_HEARTBEAT


class IngestQueue:
    def __init__(self, apply: Callable[[list[SpanRecord], float], None], metrics: Metrics,
                 max_spans: int = 500_000, tee: Callable[[list[SpanRecord]], None] | None = None,
                 max_heartbeats: int | None = None) -> None:
        self._apply = apply
        self._metrics = metrics
        self._max_spans = max_spans
        self._max_heartbeats = max_heartbeats if max_heartbeats is not None else max_spans
        self._tee = tee
        self._beats: deque[tuple[list[SpanRecord], float]] = deque()  # folded first
        self._queue: deque[tuple[list[SpanRecord], float]] = deque()
        self._queued_beats = 0
        self._queued_spans = 0
        self._cond = threading.Condition()
        self._refusing_since = 0.0  # first heartbeat refusal of the current episode
        self._refused_last = 0.0
        self._stop = False
        self._thread: threading.Thread | None = None

    @property
    def queued(self) -> int:
        return self._queued_beats + self._queued_spans

    @property
    def queued_heartbeats(self) -> int:
        return self._queued_beats

    def congested(self) -> bool:
        """The op-span queue is over half full: receivers shed op spans before decoding them."""
        return self._queued_spans > self._max_spans // 2

    def horizon(self) -> float | None:
        """Receive time of the oldest heartbeat still queued (None: every heartbeat received is folded).

        Only heartbeats: silence is judged from them, and op spans wait behind them by design;
        an op-span backlog holding the horizon back ran every pass seconds in the past (a
        16k-rank job with 1% op spans: verdicts dated before the fault that caused them).
        """
        with self._cond:
            heads = [self._beats[0][1]] if self._beats else []
            if self._refused_last and time.time() - self._refused_last <= REFUSAL_MEMORY_S:
                heads.append(self._refusing_since)  # heartbeats we turned away are still coming
        return min(heads) if heads else None

    def sink(self, records: list[SpanRecord]) -> int:
        """Called by the OTLP receiver threads; returns how many spans were shed (heartbeats: never)."""
        now = time.time()
        beats = [r for r in records if _is_heartbeat(r)]
        spans = [r for r in records if not _is_heartbeat(r)] if len(beats) != len(records) else []
        shed = 0
        with self._cond:
            if self._queued_beats + len(beats) > self._max_heartbeats:
                if now - self._refused_last > REFUSAL_MEMORY_S:
                    self._refusing_since = now
                self._refused_last = now
                self._metrics.inc("mycroft_rca_spans_dropped_total", len(records), reason="queue_full")
                raise OverflowError(f"RCA ingest queue full ({self.queued} spans queued); retry later")
            if spans and self._queued_spans + len(spans) > self._max_spans:
                if not beats:
                    self._metrics.inc("mycroft_rca_spans_dropped_total", len(spans), reason="queue_full")
                    raise OverflowError(f"RCA ingest queue full ({self.queued} spans queued); retry later")
                shed, spans = len(spans), []  # the heartbeats of this request still go in
            if beats:
                self._beats.append((beats, now))
                self._queued_beats += len(beats)
            if spans:
                self._queue.append((spans, now))
                self._queued_spans += len(spans)
            self._cond.notify()
        if shed:
            self._metrics.inc("mycroft_rca_spans_dropped_total", shed, reason="shed_for_heartbeats")
        self._metrics.inc("mycroft_rca_spans_received_total", len(records) - shed)
        self._metrics.inc("mycroft_rca_export_requests_total")
        self._metrics.note_ingest(now, len(records) - shed)
        if self._tee is not None:
            self._tee(records)
        return shed

    def start(self) -> IngestQueue:
        self._thread = threading.Thread(target=self._run, name="mycroft-rca-ingest", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._beats and not self._queue and not self._stop:
                    self._cond.wait(0.5)
                if self._stop and not self._beats and not self._queue:
                    return
                if self._beats:
                    batch, received_at = self._beats.popleft()
                    self._queued_beats -= len(batch)
                else:
                    batch, received_at = self._queue.popleft()
                    self._queued_spans -= len(batch)
            try:
                self._apply(batch, received_at)
            except Exception:  # one bad batch must not stop ingest
                log.exception("failed to apply a batch of %d spans", len(batch))
                self._metrics.inc("mycroft_rca_spans_dropped_total", len(batch), reason="apply_error")

    def drain(self, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.queued and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.queued == 0

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)


class Forwarder:
    """Tees received spans to a downstream OTLP endpoint (Jaeger / Tempo / a collector).

    "http(s)://host:port[/path]" -> OTLP/HTTP protobuf (path defaults to /v1/traces);
    "host:port" or "grpc://host:port" -> OTLP/gRPC. Bounded: when the downstream is slow
    the oldest batches are dropped and counted; the RCA path is never held up.
    """

    def __init__(self, endpoint: str, metrics: Metrics, max_batches: int = 1024, timeout_s: float = 5.0) -> None:
        self.endpoint = endpoint
        self._metrics = metrics
        self._timeout = timeout_s
        self._queue: deque[list[SpanRecord]] = deque(maxlen=max_batches)
        self._cond = threading.Condition()
        self._stop = False
        self._channel: grpc.Channel | None = None
        self._stub: trace_service_pb2_grpc.TraceServiceStub | None = None
        if endpoint.startswith(("http://", "https://")):
            base = endpoint.rstrip("/")
            self._url: str | None = base if base.endswith("/v1/traces") else base + "/v1/traces"
        else:
            self._url = None
            host, port = split_host_port(endpoint)
            self._channel = grpc.insecure_channel(f"{host}:{port}")
            self._stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)
        self._thread = threading.Thread(target=self._run, name="mycroft-rca-forward", daemon=True)

    def start(self) -> Forwarder:
        self._thread.start()
        return self

    def __call__(self, records: list[SpanRecord]) -> None:
        with self._cond:
            if len(self._queue) == self._queue.maxlen:
                self._metrics.inc("mycroft_rca_forward_dropped_total", len(self._queue[0]))
            self._queue.append(records)
            self._cond.notify()

    def _send(self, records: list[SpanRecord]) -> None:
        request = request_from_records(records)
        if self._url is not None:
            http = urllib.request.Request(self._url, data=request.SerializeToString(), method="POST",
                                          headers={"Content-Type": "application/x-protobuf"})
            with urllib.request.urlopen(http, timeout=self._timeout) as response:
                response.read()
        else:
            assert self._stub is not None
            self._stub.Export(request, timeout=self._timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait(0.5)
                if self._stop:
                    return
                batch = self._queue.popleft()
            try:
                self._send(batch)
                self._metrics.inc("mycroft_rca_forwarded_spans_total", len(batch))
            except Exception as exc:
                log.warning("forwarding %d spans to %s failed: %s", len(batch), self.endpoint, exc)
                self._metrics.inc("mycroft_rca_forward_dropped_total", len(batch))

    def flush(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self._queue and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)
        if self._channel is not None:
            self._channel.close()
