"""A few Prometheus metrics rendered in the text exposition format (no client library)."""

from __future__ import annotations

import threading
from collections import deque


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.help: dict[str, tuple[str, str]] = {}
        self._rate: deque[tuple[float, int]] = deque(maxlen=120)
        self._analysis: deque[float] = deque(maxlen=512)

    def describe(self, name: str, kind: str, text: str) -> None:
        self.help[name] = (kind, text)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = _key(name, labels)
        with self._lock:
            self.counters[key] = self.counters.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self.gauges[_key(name, labels)] = value

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
                self.gauges["mycroft_rca_analysis_seconds_p50"] = samples[len(samples) // 2]
                self.gauges["mycroft_rca_analysis_seconds_max"] = samples[-1]
            lines: list[str] = []
            seen: set[str] = set()
            for store, kind in ((self.counters, "counter"), (self.gauges, "gauge")):
                for key in sorted(store):
                    name = key.split("{", 1)[0]
                    if name not in seen:
                        seen.add(name)
                        declared_kind, text = self.help.get(name, (kind, name))
                        lines.append(f"# HELP {name} {text}")
                        lines.append(f"# TYPE {name} {declared_kind}")
                    lines.append(f"{key} {store[key]:g}")
        return "\n".join(lines) + "\n"


def _key(name: str, labels: dict[str, str]) -> str:
    if not labels:
        return name
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
