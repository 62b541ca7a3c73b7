"""Ingest edge: a bounded queue between the OTLP receiver and the engine, and the tee.

The receiver's threads only enqueue; one worker folds batches into the engine, so
analysis sees a consistent state. When the queue is full the sink raises
OverflowError, which the receiver turns into 429 / RESOURCE_EXHAUSTED (OTLP clients
retry): memory stays bounded under floods and nothing is silently lost.
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

from mycroft.otlp import SpanRecord, request_from_records
from mycroft.otlp_server import split_host_port

from .metrics import Metrics

log = logging.getLogger("mycroft.rca.ingest")


class IngestQueue:
    def __init__(self, apply: Callable[[list[SpanRecord], float], None], metrics: Metrics,
                 max_spans: int = 500_000, tee: Callable[[list[SpanRecord]], None] | None = None) -> None:
        self._apply = apply
        self._metrics = metrics
        self._max_spans = max_spans
        self._tee = tee
        self._queue: deque[tuple[list[SpanRecord], float]] = deque()
        self._queued = 0
        self._cond = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    @property
    def queued(self) -> int:
        return self._queued

    def sink(self, records: list[SpanRecord]) -> None:
        """Called by the OTLP receiver threads."""
        now = time.time()
        with self._cond:
            if self._queued + len(records) > self._max_spans:
                self._metrics.inc("mycroft_rca_spans_dropped_total", len(records), reason="queue_full")
                raise OverflowError(f"RCA ingest queue full ({self._queued} spans queued); retry later")
            self._queue.append((records, now))
            self._queued += len(records)
            self._cond.notify()
        self._metrics.inc("mycroft_rca_spans_received_total", len(records))
        self._metrics.inc("mycroft_rca_export_requests_total")
        self._metrics.note_ingest(now, len(records))
        if self._tee is not None:
            self._tee(records)

    def start(self) -> IngestQueue:
        self._thread = threading.Thread(target=self._run, name="mycroft-rca-ingest", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait(0.5)
                if self._stop and not self._queue:
                    return
                batch, received_at = self._queue.popleft()
                self._queued -= len(batch)
            try:
                self._apply(batch, received_at)
            except Exception:  # one bad batch must not stop ingest
                log.exception("failed to apply a batch of %d spans", len(batch))
                self._metrics.inc("mycroft_rca_spans_dropped_total", len(batch), reason="apply_error")

    def drain(self, timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while self._queued and time.monotonic() < deadline:
            time.sleep(0.01)
        return self._queued == 0

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
