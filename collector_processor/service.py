"""`mycroft processor serve`: the processor as a standalone OTLP service.

For users of the OpenTelemetry Collector (otelcol-contrib), which cannot host Python
processors: the collector exports to this service and receives its output back (or
this service exports straight to the backends). OTLP gRPC + HTTP in, OTLP gRPC out to
every `--export` endpoint.

    gRPC request --split (proto_edge)--> heartbeats   -> urgent lane of every endpoint, at once
                                     --> pass-through -> bulk lane, at once, bytes as received
                                     --> rank spans + native detail -> core worker (bounded backlog)
    HTTP request --decode--> heartbeats -> urgent lane; the rest -> core worker
    core worker: CollectorProcessor on one thread; its output -> bulk lane; ticks every tick_s

Nothing waits on the core: when its backlog is full, native detail is dropped undecoded
and rank spans pass unjoined, both counted. Memory is bounded by the core's caps, the
backlog, gRPC's concurrent-RPC limit and the exporters' queues.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from collections import deque
from collections.abc import Sequence

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from mycroft.auth import ANONYMOUS_ADMIN, Authenticator, Principal
from mycroft.http_server import HttpError, HttpLimits, HttpServer, Request, Response, TlsFiles
from mycroft.otlp import SpanRecord, filter_request_jobs
from mycroft.otlp_server import (
    REJECT_FORBIDDEN_JOB,
    OtlpReceiver,
    bind_grpc,
    grpc_principal,
    grpc_server,
    parse_grpc_request,
    split_host_port,
    trace_service_handler,
)
from mycroft.ratelog import RateLimitedLog

from .condense import DETAIL_NAMES
from .config import ProcessorConfig
from .export import Fanout
from .pipeline import CollectorProcessor, split_urgent
from .proto_edge import forwarded_by_core, split_request
from .stats import Counters, prometheus_text, write_stats_file

log = logging.getLogger(__name__)
_bad_input = RateLimitedLog(log, every_s=10.0)


class CoreWorker:
    """Runs the CollectorProcessor on one thread, fed through a backlog bounded in spans."""

    def __init__(self, processor: CollectorProcessor, fanout: Fanout, max_backlog_spans: int,
                 tick_s: float) -> None:
        self.processor = processor
        self._fanout = fanout
        self._max_backlog = max_backlog_spans
        self._tick_s = tick_s
        self._queue: deque[tuple[list[SpanRecord], bool]] = deque()
        self._backlog = 0
        self._cond = threading.Condition()
        self._lock = threading.Lock()  # guards the processor (worker thread vs gauges / flush)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mycroft-processor-core", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def room(self) -> int:
        with self._cond:
            return max(0, self._max_backlog - self._backlog)

    def put(self, records: list[SpanRecord], fast_path: bool) -> None:
        """Queue a batch; `fast_path`: its pass-through spans were forwarded already."""
        if not records:
            return
        with self._cond:
            self._queue.append((records, fast_path))
            self._backlog += len(records)
            self._cond.notify()

    def gauges(self) -> dict[str, float]:
        with self._lock:
            gauges = dict(self.processor.gauges())
        with self._cond:
            gauges["core_backlog_spans"] = self._backlog
        return gauges

    def stop(self) -> None:
        """Process what is queued, close every window and hand the output to the fan-out."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(30)
        with self._lock:
            out = self.processor.flush()
        self._emit(out.all(), fast_path=False)

    def flush(self) -> None:
        """Close every open window now (the embedded collector's flush request) and hand the output
        to the fan-out; the worker keeps running."""
        with self._lock:
            out = self.processor.flush()
        self._emit(out.all(), fast_path=False)

    def _run(self) -> None:
        next_tick = time.monotonic() + self._tick_s
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    timeout = next_tick - time.monotonic()
                    if timeout <= 0:
                        break
                    self._cond.wait(timeout)
                item = self._queue.popleft() if self._queue else None
                if item is None and self._stopping:
                    return
                if item is not None:
                    self._backlog -= len(item[0])
            try:
                now = time.monotonic()
                if item is not None:
                    with self._lock:
                        out = self.processor.process(item[0], now)
                    self._emit(out.urgent, fast_path=item[1], urgent=True)
                    self._emit(out.normal, fast_path=item[1])
                if now >= next_tick:
                    next_tick = now + self._tick_s
                    with self._lock:
                        out = self.processor.tick(now)
                    self._emit(out.all(), fast_path=False)
            except Exception:  # the worker must outlive any batch
                log.exception("processor core failed on a batch")

    def _emit(self, records: list[SpanRecord], fast_path: bool, urgent: bool = False) -> None:
        if fast_path:
            records = [r for r in records if forwarded_by_core(r)]
        if not records:
            return
        self.processor.counters.add("spans_out", len(records))
        if urgent:
            self._fanout.submit(records, ())
        else:
            self._fanout.submit((), records)


_REJECT_COUNTERS = {"unauthenticated": "requests_unauthenticated", "undecodable": "requests_undecodable",
                    "too_large": "requests_too_large"}


class ProcessorService:
    """OTLP in (fast gRPC path, decoded HTTP path) -> core worker -> Fanout."""

    def __init__(self, otlp_grpc: str | None, otlp_http: str | None, exports: Sequence[str],
                 config: ProcessorConfig | None = None, metrics: str | None = None,
                 tick_s: float = 0.05, max_queue_spans: int = 50_000, max_backlog_spans: int = 50_000,
                 max_concurrent_rpcs: int = 64, auth: Authenticator | None = None,
                 tls: TlsFiles | None = None, limits: HttpLimits | None = None) -> None:
        self.counters = Counters()
        self.auth = auth
        self.limits = limits or HttpLimits()
        if tls is not None:
            tls.server_context()  # unreadable or mismatched cert / key fail before anything binds
        self.fanout = Fanout(exports, self.counters, max_queue_spans=max_queue_spans)
        self.core = CoreWorker(CollectorProcessor(config, self.counters, count_io=False), self.fanout,
                               max_backlog_spans, tick_s)
        self._grpc_server: grpc.Server | None = None
        self.grpc_port: int | None = None
        for address in (otlp_grpc, otlp_http, metrics):
            if address:
                split_host_port(address)  # a malformed address fails before anything binds
        if otlp_grpc:
            self._grpc_server = grpc_server(self.limits, max_concurrent_rpcs=max_concurrent_rpcs)
            self._grpc_server.add_generic_rpc_handlers((trace_service_handler(self._export_grpc),))
            self.grpc_port = bind_grpc(self._grpc_server, otlp_grpc, tls)
        self._http: OtlpReceiver | None = None
        if otlp_http:
            self._http = OtlpReceiver(self.accept_records, None, otlp_http, auth=auth, tls=tls, limits=self.limits,
                                      on_reject=self._rejected)
        self._metrics_server: HttpServer | None = None
        self.metrics_port: int | None = None
        if metrics:
            host, port = split_host_port(metrics)
            self._metrics_server = HttpServer(self._metrics, host, port, HttpLimits(max_body_bytes=0, workers=2),
                                              tls, "mycroft-processor-metrics", head_check=self._metrics_head)
            self.metrics_port = self._metrics_server.port

    @property
    def http_port(self) -> int | None:
        return self._http.http_port if self._http else None

    def start(self) -> ProcessorService:
        self.core.start()
        if self._grpc_server is not None:
            self._grpc_server.start()
        if self._http is not None:
            self._http.start()
        if self._metrics_server is not None:
            self._metrics_server.start()
        return self

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop receiving, close every open window, and send what is left."""
        if self._grpc_server is not None:
            self._grpc_server.stop(1.0).wait()
        if self._http is not None:
            self._http.stop()
        self.core.stop()
        self.fanout.close(drain_s)
        if self._metrics_server is not None:
            self._metrics_server.stop()
        log.info("processor stopped: %s", self.counters.snapshot())

    def flush(self, timeout: float = 5.0) -> bool:
        """Close every open window and wait (bounded) until the exporters' queues are empty."""
        self.core.flush()
        return self.fanout.drain(timeout)

    def write_stats(self, path: str, flushed: bool = False) -> None:
        """The counters document `mycroft collector run` reads (the same one rotel's adapter writes)."""
        gauges = self.core.gauges()
        gauges["export_queue_spans"] = self.fanout.pending()
        gauges["max_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        write_stats_file(path, self.counters, gauges, flushed)

    # ------------------------------------------------------------------ edges
    def _rejected(self, reason: str, spans: int) -> None:
        counter = _REJECT_COUNTERS.get(reason)
        if counter and not spans:
            self.counters.add(counter)
        if reason == REJECT_FORBIDDEN_JOB:
            self.counters.add("dropped_forbidden_job", spans)

    def _export_grpc(self, payload: bytes, context: grpc.ServicerContext) -> None:
        principal = grpc_principal(context, self.auth, self._rejected)
        request = parse_grpc_request(payload, context, self._rejected)
        refused = 0
        refused_jobs: set[str] = set()
        if not principal.all_jobs:
            def allow(job: str) -> bool:
                ok = principal.allows_job(job)
                if not ok:
                    refused_jobs.add(job)
                return ok

            refused = filter_request_jobs(request, allow)
        try:
            self.accept_request(request)
        except Exception as exc:  # a request the fast path cannot split: refused, logged rate-limited
            self._rejected("undecodable", 0)
            _bad_input.exception("grpc-split", "OTLP/gRPC: unusable request from %s", context.peer())
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad OTLP request: {exc}")
        if refused:
            self._rejected(REJECT_FORBIDDEN_JOB, refused)
            shown = ", ".join(sorted(repr(j[:64]) for j in refused_jobs)[:5])
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"{refused} spans refused: this token may not write job(s) {shown}")

    def accept_request(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        """gRPC fast path: forward what passes as received, decode only what the core needs."""
        split = split_request(request, budget=self.core.room())
        counters = self.counters
        counters.add("spans_in", split.received)
        if split.urgent_spans:  # heartbeats first, before anything else is touched
            counters.add("heartbeats", split.urgent_spans)
            counters.add("spans_out", split.urgent_spans)
            for exporter in self.fanout.exporters:
                exporter.urgent.put(split.urgent, split.urgent_spans)
        if split.passthrough_spans:
            counters.add("spans_out", split.passthrough_spans)
            self.fanout.submit_request(split.passthrough, split.passthrough_spans)
        counters.add("dropped_overload", split.dropped_detail)
        counters.add("unjoined_overload", split.unjoined)
        self.core.put(split.feed, fast_path=True)

    def accept_records(self, records: list[SpanRecord]) -> None:
        """Decoded path (OTLP/HTTP): heartbeats forwarded at once, the rest through the core."""
        self.counters.add("spans_in", len(records))
        urgent, rest = split_urgent(records)
        if urgent:
            self.counters.add("spans_out", len(urgent))
            self.fanout.submit(self.core.processor.pass_urgent(urgent), ())
        room = self.core.room()
        if len(rest) > room:  # the core is behind: forward the rest undigested, drop native detail
            over = rest[room:]
            rest = rest[:room]
            dropped = [r for r in over if r.name in DETAIL_NAMES]
            passed = [r for r in over if r.name not in DETAIL_NAMES]
            self.counters.add("dropped_overload", len(dropped))
            self.counters.add("unjoined_overload", len(passed))
            self.counters.add("spans_out", len(passed))
            self.fanout.submit((), passed)
        self.core.put(rest, fast_path=False)

    def metrics_text(self) -> str:
        gauges = self.core.gauges()
        gauges["export_queue_spans"] = self.fanout.pending()
        return prometheus_text(self.counters.snapshot(), gauges)

    def _metrics_head(self, request: Request) -> Principal:
        if request.path.rstrip("/") not in ("/metrics", "/healthz"):
            raise HttpError(404, "only /metrics and /healthz are served here")
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, "GET /metrics", {"Allow": "GET, HEAD"})
        if self.auth is None or request.path.rstrip("/") == "/healthz":
            return ANONYMOUS_ADMIN
        principal = self.auth.header(request.header("Authorization") or None)
        if principal is None:
            raise HttpError(401, "missing or invalid bearer token", {"WWW-Authenticate": 'Bearer realm="mycroft"'})
        if not principal.can_read:
            raise HttpError(403, f"a {principal.role} token may not read metrics")
        return principal

    def _metrics(self, request: Request) -> Response:
        if request.path.rstrip("/") == "/healthz":
            return Response(200, b'{"status": "ok"}')
        return Response(200, self.metrics_text().encode(), CONTENT_TYPE_PLAIN_0_0_4)
