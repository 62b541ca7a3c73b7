"""OTLP gRPC fan-out with an urgent lane, bounded queues and counted drops.

Each endpoint gets two queues and two sender threads: heartbeats go through the
urgent lane, which never waits behind a backlog of bulk spans (nor behind a slow
bulk RPC), so the RCA service keeps seeing every rank's pulse during a span flood.
One slow or dead backend (say Jaeger) fills only its own queues: the others keep
flowing. A full queue drops the newest bulk spans and counts them; nothing blocks
the receiver.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping, Sequence

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mycroft.otlp import SpanRecord, request_from_records

from .stats import Counters

log = logging.getLogger(__name__)

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
              grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED}


def grpc_target(endpoint: str) -> tuple[str, bool]:
    """"http://host:port" / "https://host:port" / "host:port" -> (target, use_tls)."""
    text = endpoint.strip()
    secure = text.startswith("https://")
    target = text.split("://", 1)[-1].rstrip("/")
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"export endpoint must be [http://]HOST:PORT (OTLP gRPC), got {endpoint!r}")
    return target, secure


def otlp_headers(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """gRPC metadata from OTEL_EXPORTER_OTLP_TRACES_HEADERS / OTEL_EXPORTER_OTLP_HEADERS ("k=v,k2=v2",
    values URL-encoded), the OTel way to hand exporters a bearer token (authorization=Bearer%20...)."""
    env = os.environ if environ is None else environ
    text = env.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or env.get("OTEL_EXPORTER_OTLP_HEADERS") or ""
    headers = []
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            headers.append((urllib.parse.unquote(key.strip()).lower(), urllib.parse.unquote(value.strip())))
    return tuple(headers)


def channel_credentials(environ: Mapping[str, str] | None = None) -> grpc.ChannelCredentials:
    """TLS to an https:// endpoint, trusting OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE when set."""
    env = os.environ if environ is None else environ
    path = env.get("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE") or env.get("OTEL_EXPORTER_OTLP_CERTIFICATE")
    if not path:
        return grpc.ssl_channel_credentials()
    with open(path, "rb") as f:
        return grpc.ssl_channel_credentials(root_certificates=f.read())


def span_count(request: ExportTraceServiceRequest) -> int:
    return sum(len(scope.spans) for rs in request.resource_spans for scope in rs.scope_spans)


class _Lane:
    """One bounded queue of OTLP requests (bounded in spans) and the thread that sends it."""

    def __init__(self, name: str, stub: trace_service_pb2_grpc.TraceServiceStub, counters: Counters,
                 max_spans: int, batch_max: int, timeout_s: float, attempts: int,
                 metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self.name = name
        self._metadata = metadata
        self._stub = stub
        self._counters = counters
        self._max_spans = max_spans
        self._batch_max = batch_max
        self._timeout_s = timeout_s
        self._attempts = attempts
        self._queue: deque[tuple[ExportTraceServiceRequest, int]] = deque()
        self._queued_spans = 0
        self._cond = threading.Condition()
        self._closing = False
        self._busy = False
        self.sent = 0
        self._thread = threading.Thread(target=self._run, name=f"mycroft-export-{name}", daemon=True)
        self._thread.start()

    def put(self, request: ExportTraceServiceRequest, spans: int) -> bool:
        """Queue a request; False (and counted) if it does not fit."""
        with self._cond:
            if self._queued_spans + spans > self._max_spans:
                self._counters.add("dropped_export_queue", spans)
                return False
            self._queue.append((request, spans))
            self._queued_spans += spans
            self._cond.notify()
            return True

    def pending(self) -> int:
        with self._cond:
            return self._queued_spans + (1 if self._busy else 0)

    def close(self, timeout: float) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)
        with self._cond:
            if self._queued_spans:
                self._counters.add("dropped_export_error", self._queued_spans)
                self._queue.clear()
                self._queued_spans = 0

    def _take(self) -> tuple[ExportTraceServiceRequest, int] | None:
        """Merge queued requests into one, up to batch_max spans (at least one request)."""
        with self._cond:
            while not self._queue and not self._closing:
                self._cond.wait()
            if not self._queue:
                return None
            request, spans = self._queue.popleft()
            if self._queue and spans + self._queue[0][1] <= self._batch_max:
                merged = ExportTraceServiceRequest()
                merged.resource_spans.extend(request.resource_spans)
                while self._queue and spans + self._queue[0][1] <= self._batch_max:
                    more, count = self._queue.popleft()
                    merged.resource_spans.extend(more.resource_spans)
                    spans += count
                request = merged
            self._queued_spans -= spans
            self._busy = True
            return request, spans

    def _run(self) -> None:
        while True:
            item = self._take()
            if item is None:
                return
            try:
                self._send(*item)
            finally:
                with self._cond:
                    self._busy = False

    def _send(self, request: ExportTraceServiceRequest, spans: int) -> None:
        delay = 0.05
        for attempt in range(1, self._attempts + 1):
            try:
                self._stub.Export(request, timeout=self._timeout_s, metadata=self._metadata or None)
                self.sent += spans
                return
            except grpc.RpcError as exc:
                code = exc.code() if hasattr(exc, "code") else None
                if code not in _RETRYABLE or attempt == self._attempts or self._closing:
                    log.warning("export to %s failed (%s); dropping %d spans", self.name, code, spans)
                    break
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
        self._counters.add("dropped_export_error", spans)


class Exporter:
    """One OTLP gRPC endpoint: an urgent lane and a bulk lane over one channel."""

    def __init__(self, endpoint: str, counters: Counters, *, max_queue_spans: int = 100_000,
                 batch_max: int = 2048, timeout_s: float = 5.0, attempts: int = 3) -> None:
        target, secure = grpc_target(endpoint)
        self.endpoint = endpoint
        options = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
        self._channel = (grpc.secure_channel(target, channel_credentials(), options=options)
                         if secure else grpc.insecure_channel(target, options=options))
        stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)
        metadata = otlp_headers()
        self.urgent = _Lane(f"{endpoint}/urgent", stub, counters, max_queue_spans, batch_max, timeout_s, attempts,
                            metadata)
        self.bulk = _Lane(f"{endpoint}/bulk", stub, counters, max_queue_spans, batch_max, timeout_s, attempts,
                          metadata)

    def close(self, timeout: float) -> None:
        self.urgent.close(timeout)
        self.bulk.close(timeout)
        self._channel.close()


class Fanout:
    """Every span to every endpoint; `urgent` spans on their own lane."""

    def __init__(self, endpoints: Sequence[str], counters: Counters, *, max_queue_spans: int = 100_000,
                 batch_max: int = 2048, timeout_s: float = 5.0, attempts: int = 3) -> None:
        if not endpoints:
            raise ValueError("at least one export endpoint is required")
        self.counters = counters
        self.batch_max = batch_max
        self.exporters = [Exporter(endpoint, counters, max_queue_spans=max_queue_spans, batch_max=batch_max,
                                   timeout_s=timeout_s, attempts=attempts) for endpoint in endpoints]

    def submit(self, urgent: Sequence[SpanRecord], normal: Sequence[SpanRecord]) -> None:
        """Queue records on every endpoint (encoded once, shared by all endpoints)."""
        if urgent:
            request = request_from_records(urgent)
            for exporter in self.exporters:
                exporter.urgent.put(request, len(urgent))
        for start in range(0, len(normal), self.batch_max):
            chunk = normal[start:start + self.batch_max]
            request = request_from_records(chunk)
            for exporter in self.exporters:
                exporter.bulk.put(request, len(chunk))

    def submit_request(self, request: ExportTraceServiceRequest, spans: int | None = None) -> None:
        """Queue an OTLP request as it came (the tee: no decode, no re-encode)."""
        count = span_count(request) if spans is None else spans
        for exporter in self.exporters:
            exporter.bulk.put(request, count)

    def pending(self) -> int:
        return sum(e.urgent.pending() + e.bulk.pending() for e in self.exporters)

    def drain(self, timeout: float) -> bool:
        """Wait until every queue is empty (True) or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while self.pending():
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self, timeout: float = 5.0) -> None:
        self.drain(timeout)
        for exporter in self.exporters:
            exporter.close(1.0)
