"""Offline analysis: replay recorded spans through the live engine on span time.

Records are fed in end-time order and the engine is stepped every `tick_s` of span
time, so an incident's detected_at is when the live service would have raised it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mycroft.otlp import SpanRecord

from ..config import AnalysisConfig
from ..incidents.engine import Engine
from ..incidents.tracker import Incident


@dataclass(slots=True)
class Replay:
    incidents: list[Incident]  # every incident, in detection order, final state
    engine: Engine
    start: float
    end: float


def replay(records: list[SpanRecord], cfg: AnalysisConfig | None = None, tick_s: float = 0.25,
           until: float | None = None) -> Replay:
    engine = Engine(cfg)
    ordered = sorted(records, key=lambda r: r.end_ns)
    if not ordered:
        return Replay([], engine, 0.0, 0.0)
    start = ordered[0].end_ns / 1e9
    end = until if until is not None else ordered[-1].end_ns / 1e9
    seen: dict[str, Incident] = {}
    i = 0
    t = start
    while True:
        batch = []
        while i < len(ordered) and ordered[i].end_ns / 1e9 <= t:
            batch.append(ordered[i])
            i += 1
        if batch:
            engine.ingest(batch, t, use_span_time=True)
        for event in engine.step(t):
            seen[event.incident.id] = event.incident
        if t >= end:
            break
        t = min(end, t + tick_s)
    incidents = sorted(seen.values(), key=lambda inc: inc.detected_at)
    return Replay(incidents, engine, start, end)
