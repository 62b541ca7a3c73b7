"""rotel trace processor: the Mycroft processor inside a real OTel collector.

rotel (pinned 0.0.1a15, agent 0.0.1-alpha10) loads this file with
`--otlp-with-trace-processor <this file>` into its embedded CPython and calls
`process_spans(resource_spans)` once per ResourceSpans, in place. That shapes the edge:

- Spans that pass (heartbeats, rank spans, anything unknown) stay in rotel's batch,
  untouched, so they leave with rotel's own batching and retries and are never held.
- Native detail spans are taken out of the batch and handed to the core.
- What the core emits later (collective summaries, flow summaries, kept raw detail)
  cannot be added to a rank's ResourceSpans (a summary belongs to no rank), so a
  sender thread posts it back into rotel's own OTLP/HTTP receiver (the loopback).
  Those spans carry the instrumentation scope mycroft.collector_processor, which this
  adapter passes through untouched, so nothing is processed twice.
- A ticker thread closes due windows, so summaries leave within the linger / window
  even when no new batch arrives.

Environment (set by `mycroft collector run` / EmbeddedCollector):
  MYCROFT_PYTHONPATH        site directories to add (rotel's interpreter is not the venv's)
  MYCROFT_LOOPBACK          rotel's own OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318
  MYCROFT_PROCESSOR_CONFIG  JSON of ProcessorConfig fields
  MYCROFT_PROCESSOR_STATS   file where counters are written as JSON every second
  MYCROFT_PROCESSOR_BUSY    share of rotel's pipeline time the adapter may use (default 0.5)
  MYCROFT_PROCESSOR_FLUSH   file whose appearance asks for a flush of every open window (graceful stop)

rotel 0.0.1-alpha10 quirk handled here: once Python reads a span's attributes, rotel
writes array values back in reverse order; `_restore_arrays` pre-reverses them.
"""

from __future__ import annotations

import os
import site
import sys


def _bootstrap() -> None:
    """Add the venv's site directories (with their .pth files: the editable install's hook), ahead of
    the embedded interpreter's own site-packages, which a venv without system site packages never sees."""
    before = list(sys.path)
    for path in filter(None, os.environ.get("MYCROFT_PYTHONPATH", "").split(os.pathsep)):
        site.addsitedir(path)
    added = [path for path in sys.path if path not in before]
    first_site = next((i for i, path in enumerate(before)
                       if path.rstrip("/").endswith(("site-packages", "dist-packages"))), len(before))
    sys.path[:] = before[:first_site] + added + before[first_site:]


_bootstrap()

import http.client  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import resource  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
from collections import deque  # noqa: E402
from typing import Any  # noqa: E402

from mycroft.collector_processor.budget import BusyBudget  # noqa: E402
from mycroft.collector_processor.condense import DETAIL_NAMES  # noqa: E402
from mycroft.collector_processor.config import ProcessorConfig  # noqa: E402
from mycroft.collector_processor.pipeline import JOIN_NAMES, CollectorProcessor  # noqa: E402
from mycroft.collector_processor.stats import Counters, write_stats_file  # noqa: E402

from mycroft import schema  # noqa: E402
from mycroft.otlp import AttrValue, SpanRecord, request_from_records  # noqa: E402

log = logging.getLogger("mycroft.collector_processor.rotel")

def _value(any_value: Any) -> AttrValue:
    """rotel AnyValue -> plain Python (the SpanRecord attribute model)."""
    if any_value is None:
        return ""
    value = any_value.value
    if isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, bytes):
        return value.hex()
    kind = type(value).__name__
    if kind == "ArrayValue":
        return [_value(item) for item in value]
    if kind == "KeyValueList":
        return json.dumps({kv.key: _value(kv.value) for kv in value})
    return "" if value is None else str(value)


def _restore_arrays(any_value: Any) -> None:
    """Reverse an ArrayValue (recursively) in place, so rotel's reversing write-back restores it."""
    if any_value is None or type(any_value.value).__name__ != "ArrayValue":
        return
    array = any_value.value
    items = list(array)
    for item in items:
        _restore_arrays(item)
    for index, item in enumerate(reversed(items)):
        array[index] = item


def _attributes(kvs: Any, restore: bool) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {}
    for kv in kvs:
        out[kv.key] = _value(kv.value)
        if restore and isinstance(out[kv.key], list):
            _restore_arrays(kv.value)
    return out


def _record(span: Any, resource_attrs: dict[str, AttrValue], scope: str, restore: bool) -> SpanRecord:
    status = span.status
    return SpanRecord(
        trace_id=int.from_bytes(bytes(span.trace_id), "big") if span.trace_id else 0,
        span_id=int.from_bytes(bytes(span.span_id), "big") if span.span_id else 0,
        parent_span_id=int.from_bytes(bytes(span.parent_span_id), "big") if span.parent_span_id else 0,
        name=span.name,
        start_ns=int(span.start_time_unix_nano),
        end_ns=int(span.end_time_unix_nano),
        attributes=_attributes(span.attributes, restore),
        resource=resource_attrs,
        status_code=int(status.code) if status is not None else 0,
        status_message=str(status.message) if status is not None else "",
        scope=scope,
    )


class Loopback:
    """Posts emitted spans to rotel's own OTLP/HTTP receiver from a bounded queue."""

    def __init__(self, endpoint: str, counters: Counters, max_spans: int = 100_000, batch_max: int = 2048) -> None:
        parsed = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"http://{endpoint}")
        self._host = parsed.hostname or "127.0.0.1"
        if self._host in ("0.0.0.0", "::"):
            self._host = "127.0.0.1"
        self._port = parsed.port or 4318
        self._path = parsed.path.rstrip("/") or "/v1/traces"
        if not self._path.endswith("/v1/traces"):
            self._path += "/v1/traces"
        self._counters = counters
        self._max_spans = max_spans
        self._batch_max = batch_max
        self._queue: deque[SpanRecord] = deque()
        self._cond = threading.Condition()
        self._conn: http.client.HTTPConnection | None = None
        self.sent = 0
        threading.Thread(target=self._run, name="mycroft-rotel-loopback", daemon=True).start()

    def put(self, records: list[SpanRecord]) -> None:
        if not records:
            return
        with self._cond:
            room = max(0, self._max_spans - len(self._queue))
            if room < len(records):
                self._counters.add("dropped_export_queue", len(records) - room)
                records = records[:room]
            self._queue.extend(records)
            self._cond.notify()

    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                batch = [self._queue.popleft() for _ in range(min(self._batch_max, len(self._queue)))]
            body = request_from_records(batch).SerializeToString()
            for attempt in range(3):
                try:
                    if self._conn is None:
                        self._conn = http.client.HTTPConnection(self._host, self._port, timeout=5)
                    self._conn.request("POST", self._path, body, {"Content-Type": "application/x-protobuf"})
                    response = self._conn.getresponse()
                    response.read()
                    if response.status < 300:
                        self.sent += len(batch)
                        break
                    log.warning("loopback POST answered %s", response.status)
                except (OSError, http.client.HTTPException) as exc:
                    log.warning("loopback POST failed: %s", exc)
                    if self._conn is not None:
                        self._conn.close()
                    self._conn = None
                time.sleep(0.05 * (attempt + 1))
            else:
                self._counters.add("dropped_export_error", len(batch))


class RotelAdapter:
    """The edge between rotel's in-place ResourceSpans and the pure core."""

    def __init__(self, config: ProcessorConfig, loopback: str, stats_file: str = "", tick_s: float = 0.05,
                 busy_fraction: float = 0.5, flush_file: str = "") -> None:
        self.counters = Counters()
        self.core = CollectorProcessor(config, self.counters, count_io=False)
        self.budget = BusyBudget(busy_fraction)
        self.loopback = Loopback(loopback, self.counters)
        self._lock = threading.Lock()
        self._stats_file = stats_file
        self._flush_file = flush_file
        self._flushed = False
        self._tick_s = tick_s
        threading.Thread(target=self._tick_loop, name="mycroft-rotel-tick", daemon=True).start()

    def process(self, resource_spans: Any) -> None:
        started = time.perf_counter()
        try:
            self._process(resource_spans, started + self.budget.remaining())
        finally:
            self.budget.spend(time.perf_counter() - started)

    def _process(self, resource_spans: Any, budget_deadline: float) -> None:
        """`budget_deadline`: perf_counter() past which spans are shed instead of decoded."""
        resource_attrs: dict[str, AttrValue] | None = None
        feed: list[SpanRecord] = []
        removed: set[int] = set()
        heartbeats = seen = kept = shed_detail = unjoined = 0
        affordable = time.perf_counter() < budget_deadline
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope
            scope_name = str(scope.name) if scope is not None else ""
            if scope_name == schema.PROCESSOR_SCOPE:
                continue  # our own output coming back through the loopback
            keep: list[Any] = []
            taken = False
            for span in scope_spans.spans:
                seen += 1
                name = span.name
                if name == schema.SPAN_HEARTBEAT:
                    heartbeats += 1
                elif (name in JOIN_NAMES or name in DETAIL_NAMES) and not affordable:
                    # over budget: shed without decoding (detail dropped, rank spans pass unjoined)
                    if name in DETAIL_NAMES:
                        shed_detail += 1
                        taken = True
                        continue
                    unjoined += 1
                elif name in JOIN_NAMES or name in DETAIL_NAMES:
                    affordable = time.perf_counter() < budget_deadline
                    if resource_attrs is None:
                        res = resource_spans.resource
                        resource_attrs = _attributes(res.attributes, restore=True) if res is not None else {}
                    detail = name in DETAIL_NAMES
                    record = _record(span, resource_attrs, scope_name, restore=not detail)
                    feed.append(record)
                    if detail:
                        removed.add(id(record))
                        taken = True
                        continue
                keep.append(span)
            kept += len(keep)
            if taken:
                scope_spans.spans = keep
        counters = self.counters
        counters.add("spans_in", seen)
        counters.add("spans_out", kept)  # what stays in rotel's batch
        counters.add("heartbeats", heartbeats)  # untouched, only counted
        counters.add("dropped_overload", shed_detail)
        counters.add("unjoined_overload", unjoined)
        if not feed:
            return
        with self._lock:
            out = self.core.process(feed, time.monotonic())
        # rank spans stay in rotel's batch; only new spans and taken spans that the core
        # decided to pass after all go round the loopback
        self._emit([r for r in out.all() if r.scope == schema.PROCESSOR_SCOPE or id(r) in removed])

    def _emit(self, records: list[SpanRecord]) -> None:
        if records:
            self.counters.add("spans_out", len(records))
            self.loopback.put(records)

    def _tick_loop(self) -> None:
        last_stats = 0.0
        while True:
            time.sleep(self._tick_s)
            try:
                with self._lock:
                    out = self.core.tick(time.monotonic())
                self._emit(out.all())
                now = time.monotonic()
                if self._flush_file and not self._flushed and os.path.exists(self._flush_file):
                    self._flush()
                    last_stats = 0.0
                if self._stats_file and now - last_stats >= 1.0:
                    last_stats = now
                    self._write_stats()
            except Exception:  # the ticker must survive anything a batch could provoke
                log.exception("mycroft rotel processor tick failed")

    def _flush(self) -> None:
        """Close every open window and wait (bounded) until the loopback has sent it all."""
        with self._lock:
            out = self.core.flush()
        self._emit(out.all())
        deadline = time.monotonic() + 5.0
        while self.loopback.pending() and time.monotonic() < deadline:
            time.sleep(0.01)
        self._flushed = True

    def _write_stats(self) -> None:
        with self._lock:
            gauges = dict(self.core.gauges())
        gauges["loopback_queue_spans"] = self.loopback.pending()
        gauges["max_rss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        write_stats_file(self._stats_file, self.counters, gauges, self._flushed, loopback_sent=self.loopback.sent)


def _adapter_from_env() -> RotelAdapter:
    raw = os.environ.get("MYCROFT_PROCESSOR_CONFIG", "")
    config = ProcessorConfig(**json.loads(raw)) if raw else ProcessorConfig()
    loopback = os.environ.get("MYCROFT_LOOPBACK") or os.environ.get("ROTEL_OTLP_HTTP_ENDPOINT") or "127.0.0.1:4318"
    return RotelAdapter(config, loopback, os.environ.get("MYCROFT_PROCESSOR_STATS", ""),
                        busy_fraction=float(os.environ.get("MYCROFT_PROCESSOR_BUSY", "0.5")),
                        flush_file=os.environ.get("MYCROFT_PROCESSOR_FLUSH", ""))


# Inside rotel (MYCROFT_LOOPBACK set by EmbeddedCollector) start at load, so the ticker
# runs before the first batch; elsewhere (a user's own rotel) on the first batch.
_ADAPTER: RotelAdapter | None = _adapter_from_env() if os.environ.get("MYCROFT_LOOPBACK") else None


def process_spans(resource_spans: Any) -> None:
    """rotel's entry point (0.0.1-alpha10 calls `process_spans`; newer ones call `process`)."""
    global _ADAPTER
    if _ADAPTER is None:
        _ADAPTER = _adapter_from_env()
    try:
        _ADAPTER.process(resource_spans)
    except Exception:  # a bad batch must not take rotel's pipeline down; the spans pass as they are
        _ADAPTER.counters.add("malformed_spans")
        log.exception("mycroft rotel processor failed on a batch")


process = process_spans
