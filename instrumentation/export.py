"""Ships spans off the process: bounded queue, own thread, drops counted, never blocks.

An unreachable collector makes the OTLP exporter retry for up to its timeout; that
happens on this thread only. When the queue is full, new spans are dropped and
counted, and the drop is logged once. At teardown (`close`) the queue gets a bounded
time to go out, whatever the collector does (down, slow, black-holing): then the
exporter is stopped, its retries and any request in flight abandoned to the daemon
thread, and what stayed unsent is counted and said in one line.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from mycroft.instrumentation.thread_names import name_this_thread
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.trace.status import Status, StatusCode

from mycroft import __version__, schema
from mycroft.otlp import SpanRecord
from mycroft.otlp_wire import WireEncoder

log = logging.getLogger("mycroft.instrumentation")

# of close()'s time, kept for shutting the exporter down once the queue had its chance
CLOSE_RESERVE_S = 0.05
_SCOPE = InstrumentationScope(schema.INSTRUMENTATION_SCOPE, __version__)
_STATUS = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}


def to_readable_span(record: SpanRecord, resource: Resource) -> ReadableSpan:
    context = SpanContext(record.trace_id, record.span_id, is_remote=False,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
    parent = (
        SpanContext(record.trace_id, record.parent_span_id, is_remote=False,
                    trace_flags=TraceFlags(TraceFlags.SAMPLED))
        if record.parent_span_id else None
    )
    code = _STATUS.get(record.status_code, StatusCode.UNSET)
    return ReadableSpan(
        name=record.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=record.attributes,
        start_time=record.start_ns,
        end_time=record.end_ns,
        status=Status(code, record.status_message or None) if code is StatusCode.ERROR else Status(code),
        instrumentation_scope=_SCOPE,
    )


def traces_exporter_name(env: Mapping[str, str]) -> str:
    """The first exporter OTEL_TRACES_EXPORTER names ("none" when it names none; default "otlp")."""
    names = [name.strip() for name in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    return next((n for n in names if n and n != "none"), "none")


def otlp_protocol(env: Mapping[str, str]) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, else OTEL_EXPORTER_OTLP_PROTOCOL, else grpc."""
    return (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc").strip()


def otlp_over_http(name: str, protocol: str) -> bool:
    """Whether the OTLP exporter chosen sends over HTTP (else gRPC)."""
    return name == "otlp_proto_http" or protocol.startswith("http")


def exporter_from_env() -> SpanExporter | None:
    """The exporter the standard OTEL_* variables ask for (None: tracing export off).

    OTLP exporters are the library's, subclassed to also take pre-encoded requests
    (`export_wire`): the library's per-span encoder is most of what a span costs (otlp_wire.py).
    """
    name = traces_exporter_name(os.environ)
    if name == "none":
        return None
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name not in ("otlp", "otlp_proto_grpc", "otlp_proto_http"):
        log.warning("mycroft: unknown OTEL_TRACES_EXPORTER %r; using otlp", name)
    protocol = otlp_protocol(os.environ)
    if otlp_over_http(name, protocol):
        if protocol == "http/json":
            log.warning("mycroft: OTLP http/json export is not available in Python; using http/protobuf")
        from mycroft.instrumentation.wire_exporters import http_exporter

        return http_exporter()
    from mycroft.instrumentation.wire_exporters import grpc_exporter

    return grpc_exporter()


class Shipper:
    """Bounded queue of spans drained in batches by one exporter thread."""

    def __init__(self, exporter: SpanExporter | None, resource: Resource, max_queue: int,
                 batch_size: int, delay_s: float, deliver: Any = None) -> None:
        self._exporter = exporter
        self._deliver = deliver  # alternative sink: a TracerProvider's span processor
        self._resource = resource
        self._queue: collections.deque[SpanRecord] = collections.deque()
        self._max_queue = max_queue
        self._batch_size = batch_size
        self._delay_s = delay_s
        self._wake = threading.Condition()
        self._closed = False  # torn down: the export thread takes no further batch
        self._in_flight = 0  # spans in the export call under way
        self.exported = 0
        self.dropped_queue_full = 0
        self.dropped_export_failed = 0
        self.unsent_at_close = 0  # still queued or in flight when close() gave up on the collector
        self._logged: set[str] = set()
        # pre-encoded requests for exporters that take them (wire_exporters.py); the rest get ReadableSpans
        self._wire_capable = callable(getattr(exporter, "export_wire", None))
        self._wire = self._encoder(resource)
        self._thread = threading.Thread(target=self._run, name="mycroft-export", daemon=True)
        self._thread.start()

    @property
    def resource(self) -> Resource:
        return self._resource

    @resource.setter
    def resource(self, resource: Resource) -> None:
        """The start-up reporter's shipper goes on under the runtime with the full resource: the
        encoder, which holds the resource's bytes, is made again (one assignment: the export thread
        reads either the old encoder or the new one)."""
        self._wire = self._encoder(resource)
        self._resource = resource

    def _encoder(self, resource: Resource) -> WireEncoder | None:
        if not self._wire_capable:
            return None
        return WireEncoder(resource.attributes, _SCOPE.name, _SCOPE.version or "", resource.schema_url)

    @property
    def dropped(self) -> int:
        return self.dropped_queue_full + self.dropped_export_failed + self.unsent_at_close

    def _log_once(self, key: str, message: str, *args: object) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message, *args)

    def submit(self, records: Sequence[SpanRecord], urgent: bool = False, first: bool = False) -> None:
        """Queue records for export; `urgent` wakes the export thread now, `first` puts them before
        what is queued (last words: the next request carries them, whatever waits behind)."""
        room = self._max_queue - len(self._queue)
        if room < len(records):
            self.dropped_queue_full += len(records) - max(room, 0)
            self._log_once("queue", "mycroft: export queue full (%d spans); dropping and counting. "
                           "Is the collector reachable?", self._max_queue)
            records = records[: max(room, 0)]
        if first:
            self._queue.extendleft(reversed(records))
        else:
            self._queue.extend(records)
        if urgent or len(self._queue) >= self._batch_size:
            with self._wake:
                self._wake.notify()

    def _take_batch(self) -> list[SpanRecord]:
        batch: list[SpanRecord] = []
        while self._queue and len(batch) < self._batch_size:
            batch.append(self._queue.popleft())
        return batch

    def _export(self, batch: list[SpanRecord]) -> None:
        if self._deliver is not None:
            for span in (to_readable_span(record, self.resource) for record in batch):
                self._deliver.on_end(span)
            self.exported += len(batch)
            return
        if self._exporter is None:
            return
        wire = self._wire  # once: the runtime may hand over a new resource meanwhile
        try:
            if wire is not None:
                result = self._exporter.export_wire(wire.request(batch), len(batch))  # type: ignore[attr-defined]
            else:
                result = self._exporter.export([to_readable_span(record, self.resource) for record in batch])
        except Exception as exc:
            result = SpanExportResult.FAILURE
            self._log_once("exception", "mycroft: span export raised %r; dropping and counting", exc)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            self.dropped_export_failed += len(batch)
            self._log_once("failed", "mycroft: span export failed (collector unreachable?); "
                           "dropping and counting. Training is not affected.")

    def _run(self) -> None:
        name_this_thread("mycroft-export")
        while True:
            with self._wake:
                if not self._queue and not self._closed:
                    self._wake.wait(self._delay_s)
                if self._closed:
                    return
                batch = self._take_batch()  # under the lock: close() counts either the queue or the batch
                self._in_flight = len(batch)
            if batch:
                try:
                    self._export(batch)
                finally:
                    self._in_flight = 0

    def flush(self, timeout_s: float) -> bool:
        """Wait until the queue is empty and no export is running, or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            self._wake.notify()
        while (self._queue or self._in_flight) and time.monotonic() < deadline:
            time.sleep(0.005)
        return not self._queue and not self._in_flight

    def close(self, timeout_s: float) -> int:
        """Teardown, bounded by timeout_s whatever the collector does: what is queued goes out until then;
        then the exporter is shut down (the library's gRPC exporter cancels its request in flight and
        stops retrying; a request of the HTTP one runs on in the daemon thread, unwaited) and what
        stayed is counted, said in one line. Returns the spans left unsent."""
        timeout_s = max(0.0, timeout_s)
        deadline = time.monotonic() + timeout_s
        self.flush(timeout_s - min(CLOSE_RESERVE_S, timeout_s / 4))  # the rest: stopping the exporter
        with self._wake:
            self._closed = True
            unsent = len(self._queue) + self._in_flight
            self._queue.clear()
            self._wake.notify()
        self.unsent_at_close += unsent
        if unsent:
            log.warning("mycroft: %d spans left unsent at teardown: the collector did not take them in time "
                        "(down, slow or unreachable?); %d dropped before. The exit did not wait for it.",
                        unsent, self.dropped - unsent)
        exporter = self._exporter
        if exporter is not None:  # its own thread: a user's exporter may block in shutdown()
            closer = threading.Thread(target=_shut_down, args=(exporter,), name="mycroft-export-close", daemon=True)
            closer.start()
            closer.join(max(0.0, deadline - time.monotonic()))
        if threading.current_thread() is not self._thread:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        return unsent

    def shutdown(self, timeout_s: float = 2.0) -> None:
        """Send what is queued (timeout_s at most), then close."""
        self.close(timeout_s)


def _shut_down(exporter: Any) -> None:
    try:
        exporter.shutdown()
    except Exception as exc:
        log.debug("mycroft: exporter shutdown raised %r", exc)
