"""Counters of everything the processor sees, emits and drops.

A processor that sheds load silently is worse than none: every span that does not
come out the other side is counted under a reason, and the counters are exported
as Prometheus text by the service and logged by the rotel adapter.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# name -> help; the order is the order of the Prometheus output
COUNTERS: Final[dict[str, str]] = {
    "spans_in": "spans received",
    "spans_out": "spans emitted downstream (pass-through, summaries, kept detail)",
    "heartbeats": "heartbeat spans passed through immediately",
    "collective_spans": "collective / p2p rank spans joined",
    "summaries": "collective summary spans emitted",
    "summaries_incomplete": "collective summaries emitted with members missing",
    "flow_summaries": "flow summary spans emitted",
    "detail_in": "native detail spans (flow / step / kernel channel) received",
    "detail_condensed": "native detail spans condensed into flow summaries",
    "detail_kept": "native detail spans kept raw because their collective looked anomalous",
    "dropped_detail_cap": "native detail spans dropped raw because a buffer cap was reached",
    "dropped_flow_cap": "native detail spans dropped because the per-collective flow cap was reached",
    "windows_evicted": "collectives closed early to stay under max_open",
    "late_spans": "rank spans that arrived after their collective's window closed",
    "duplicate_spans": "rank spans repeated for a rank already joined",
    "malformed_spans": "spans with unusable Mycroft attributes (passed through, not joined)",
    "unjoined_overload": "rank spans forwarded without joining because the core was behind",
    "dropped_overload": "native detail spans dropped undecoded because the core was behind",
    "dropped_export_queue": "spans dropped because an exporter queue was full",
    "dropped_export_error": "spans dropped because an export failed after retries",
    "dropped_forbidden_job": "spans refused because the sender's token may not write their job",
    "requests_unauthenticated": "OTLP requests refused: no valid ingest token",
    "requests_undecodable": "OTLP requests refused: not a decodable OTLP payload",
    "requests_too_large": "OTLP requests refused: body or decoded body over the size limit",
}


class Counters:
    """Thread-safe monotonic counters with a fixed set of names."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = dict.fromkeys(COUNTERS, 0)

    def add(self, name: str, amount: int = 1) -> None:
        if name not in self._values:
            raise KeyError(f"unknown counter {name!r}")
        if amount:
            with self._lock:
                self._values[name] += amount

    def get(self, name: str) -> int:
        return self._values[name]

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)

    @property
    def dropped(self) -> int:
        """All spans that did not make it downstream, whatever the reason."""
        snap = self.snapshot()
        return sum(value for name, value in snap.items() if name.startswith("dropped_"))


def write_stats_file(path: str, counters: Counters, gauges: Mapping[str, float], flushed: bool,
                     **extra: object) -> None:
    """The counters document both hosts of the processor (rotel, the standalone service) write for
    `mycroft collector run` / EmbeddedCollector.stats(); replaced atomically, so a reader never sees half."""
    document = {"counters": counters.snapshot(), "gauges": dict(gauges), "flushed": flushed, "time": time.time(),
                **extra}
    tmp = f"{path}.tmp"
    with open(tmp, "w") as handle:
        json.dump(document, handle)
    os.replace(tmp, path)


def prometheus_text(values: Mapping[str, int], gauges: Mapping[str, float] | None = None,
                    prefix: str = "mycroft_processor_") -> str:
    """Prometheus exposition text for a counters snapshot plus optional gauges (prometheus_client)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(values, gauges or {}, prefix))
    return generate_latest(registry).decode()


class _Snapshot(Collector):
    """One scrape's worth of counters and gauges, handed to the client library as metric families."""

    def __init__(self, values: Mapping[str, int], gauges: Mapping[str, float], prefix: str) -> None:
        self._values, self._gauges, self._prefix = values, gauges, prefix

    def collect(self) -> Iterator[Metric]:
        for name, value in self._values.items():
            yield CounterMetricFamily(f"{self._prefix}{name}", COUNTERS.get(name, name), value=value)
        for name, gauge in self._gauges.items():
            yield GaugeMetricFamily(f"{self._prefix}{name}", name.replace("_", " "), value=gauge)
