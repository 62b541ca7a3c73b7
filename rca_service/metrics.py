"""The RCA service's Prometheus metrics, through the standard client library (prometheus_client).

Each service owns its registry (two services in one process, as in the tests, never mix
their series). Metrics are declared on first use with the label names of that use;
`describe()` gives them their help text and kind beforehand.
"""

from __future__ import annotations

import threading
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest() writes; every Prometheus reads it


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, Counter | Gauge] = {}
        self._help: dict[str, tuple[str, str]] = {}
        self.counters: dict[str, float] = {}  # unlabelled and labelled totals, "name{k=v}" -> value (benchmarks)
        self._rate: deque[tuple[float, int]] = deque(maxlen=120)
        self._analysis: deque[float] = deque(maxlen=512)

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def _metric(self, name: str, kind: str, labels: tuple[str, ...]) -> Counter | Gauge:
        metric = self._metrics.get(name)
        if metric is None:
            declared, text = self._help.get(name, (kind, name.replace("_", " ")))
            cls = Counter if declared == "counter" else Gauge
            metric = self._metrics[name] = cls(name, text, labelnames=labels, registry=self.registry)
        return metric

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        if value <= 0:
            return
        with self._lock:
            metric = self._metric(name, "counter", tuple(sorted(labels)))
            (metric.labels(**labels) if labels else metric).inc(value)
            key = _key(name, labels)
            self.counters[key] = self.counters.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            metric = self._metric(name, "gauge", tuple(sorted(labels)))
            target = metric.labels(**labels) if labels else metric
            assert isinstance(target, Gauge)
            target.set(value)

    def replace_series(self, name: str, label: str, values: dict[str, float]) -> None:
        """A gauge whose label values come and go (per host): exactly these series, the old ones removed."""
        with self._lock:
            metric = self._metric(name, "gauge", (label,))
            assert isinstance(metric, Gauge)
            metric.clear()
            for key, value in values.items():
                metric.labels(**{label: key}).set(value)

    def note_ingest(self, now: float, spans: int) -> None:
        with self._lock:
            self._rate.append((now, spans))

    def ingest_rate(self, now: float, window_s: float = 10.0) -> float:
        with self._lock:
            total = sum(n for t, n in self._rate if now - t <= window_s)
        return total / window_s

    def note_analysis(self, seconds: float) -> None:
        with self._lock:
            self._analysis.append(seconds)

    def render(self, now: float) -> str:
        self.set("mycroft_rca_ingest_spans_per_second", self.ingest_rate(now))
        with self._lock:
            samples = sorted(self._analysis)
        if samples:
            self.set("mycroft_rca_analysis_seconds_p50", samples[len(samples) // 2])
            self.set("mycroft_rca_analysis_seconds_max", samples[-1])
        return generate_latest(self.registry).decode()


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
