"""`mycroft processor serve`: the processor as a standalone OTLP service.

For users of the OpenTelemetry Collector (otelcol-contrib), which cannot host Python
processors: the collector exports to this service and receives its output back (or
this service exports straight to the backends). OTLP gRPC + HTTP in, OTLP gRPC out to
every `--export` endpoint.

Threads: the receiver's workers run the sink (heartbeats forwarded before the core's
lock is taken), a ticker closes due windows at least every `tick_s`, and the fan-out
has its own sender threads. Memory is bounded by the core's caps, the request size
limit and the exporters' queues.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mycroft.otlp import SpanRecord
from mycroft.otlp_server import OtlpReceiver, split_host_port

from .config import ProcessorConfig
from .export import Fanout
from .pipeline import CollectorProcessor, split_urgent
from .stats import Counters, prometheus_text

log = logging.getLogger(__name__)


class ProcessorService:
    """Receiver -> CollectorProcessor -> Fanout, with a ticker for window deadlines."""

    def __init__(self, otlp_grpc: str | None, otlp_http: str | None, exports: Sequence[str],
                 config: ProcessorConfig | None = None, metrics: str | None = None,
                 tick_s: float = 0.05, max_queue_spans: int = 100_000) -> None:
        self.counters = Counters()
        self.processor = CollectorProcessor(config, self.counters)
        self.fanout = Fanout(exports, self.counters, max_queue_spans=max_queue_spans)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._tick_s = tick_s
        self.receiver = OtlpReceiver(self._sink, otlp_grpc, otlp_http)
        self._metrics_server: ThreadingHTTPServer | None = None
        self.metrics_port: int | None = None
        if metrics:
            host, port = split_host_port(metrics)
            self._metrics_server = ThreadingHTTPServer((host, port), _metrics_handler(self))
            self._metrics_server.daemon_threads = True
            self.metrics_port = self._metrics_server.server_address[1]
        self._ticker = threading.Thread(target=self._tick_loop, name="mycroft-processor-tick", daemon=True)

    @property
    def grpc_port(self) -> int | None:
        return self.receiver.grpc_port

    @property
    def http_port(self) -> int | None:
        return self.receiver.http_port

    def start(self) -> ProcessorService:
        self.receiver.start()
        self._ticker.start()
        if self._metrics_server is not None:
            threading.Thread(target=self._metrics_server.serve_forever, name="mycroft-processor-metrics",
                             daemon=True).start()
        return self

    def stop(self, drain_s: float = 5.0) -> None:
        """Stop receiving, close every open window, and send what is left."""
        self.receiver.stop()
        self._stop.set()
        self._ticker.join(2.0)
        with self._lock:
            out = self.processor.flush()
        self.fanout.submit(out.urgent, out.normal)
        self.fanout.close(drain_s)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        log.info("processor stopped: %s", self.counters.snapshot())

    def metrics_text(self) -> str:
        with self._lock:
            gauges = dict(self.processor.gauges())
        gauges["export_queue_spans"] = self.fanout.pending()
        return prometheus_text(self.counters.snapshot(), gauges)

    def _sink(self, records: list[SpanRecord]) -> None:
        urgent, rest = split_urgent(records)
        if urgent:  # before the lock: a flood being joined never delays a heartbeat
            self.fanout.submit(self.processor.pass_urgent(urgent), ())
        if rest:
            with self._lock:
                out = self.processor.process(rest, time.monotonic())
            self.fanout.submit(out.urgent, out.normal)

    def _tick_loop(self) -> None:
        while not self._stop.wait(self._tick_s):
            with self._lock:
                out = self.processor.tick(time.monotonic())
            if len(out):
                self.fanout.submit(out.urgent, out.normal)


def _metrics_handler(service: ProcessorService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            log.debug("metrics: " + format, *args)

        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] != "/metrics":
                self.send_error(404, "only /metrics is served here")
                return
            body = service.metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler
