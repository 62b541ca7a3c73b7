"""The processor core: SpanRecords in, SpanRecords out, state in bounded windows.

    heartbeats          -> out at once, in the urgent lane (never held)
    collective/p2p      -> out at once, and joined per trace id
    native collective   -> out at once, its algo/proto feed the join
    native detail       -> held per trace id; condensed to flow summaries, or kept raw
                           (annotated with the reason) when the collective looked anomalous
    processor output    -> out untouched (scope mycroft.collector_processor), so processors
                           can be chained or looped back without joining twice
    anything else       -> out untouched

A collective's window opens on its first span and closes `linger_s` after every member
reported, or `window_s` after it opened (members missing), or early when `max_open`
windows are open. Closing emits the summary span, the flow summaries and any kept raw
detail. The caller supplies `now` (seconds, monotonic); `tick(now)` closes due windows.
Not thread-safe: the service and the rotel adapter serialise calls.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from mycroft import schema
from mycroft.otlp import SpanRecord

from .condense import DETAIL_KINDS, DETAIL_NAMES, FlowCondenser, kept_detail
from .config import ProcessorConfig
from .join import CollectiveJoin, CollectiveKey, MalformedSpan, summary_span
from .stats import Counters
from .tail import TailPolicy
from .window import BoundedLru, Windows


@dataclass(slots=True)
class Output:
    """What to send downstream: `urgent` (heartbeats) goes before anything in `normal`."""

    urgent: list[SpanRecord] = field(default_factory=list)
    normal: list[SpanRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.urgent) + len(self.normal)

    def extend(self, other: Output) -> None:
        self.urgent.extend(other.urgent)
        self.normal.extend(other.normal)

    def all(self) -> list[SpanRecord]:
        return self.urgent + self.normal


@dataclass(slots=True)
class _Open:
    """State of one trace (collective) while its window is open."""

    join: CollectiveJoin
    condenser: FlowCondenser
    raw: list[SpanRecord] = field(default_factory=list)
    raw_overflow: int = 0  # detail spans not buffered raw (caps); condensed all the same
    detail_spans: int = 0
    decided: str | None = None  # set when reopened for late detail of an already closed collective


# span name -> kind, for spans that arrive without mycroft.span.kind
_KIND_BY_NAME = {
    schema.SPAN_HEARTBEAT: schema.KIND_HEARTBEAT,
    schema.SPAN_COLLECTIVE_SUMMARY: schema.KIND_COLLECTIVE_SUMMARY,
    schema.SPAN_FLOW_SUMMARY: schema.KIND_FLOW_SUMMARY,
    schema.SPAN_NATIVE_COLL: schema.KIND_NATIVE_COLL,
    schema.SPAN_NATIVE_FLOW: schema.KIND_NATIVE_FLOW,
    schema.SPAN_NATIVE_STEP: schema.KIND_NATIVE_STEP,
    schema.SPAN_NATIVE_KERNEL_CHANNEL: schema.KIND_NATIVE_KERNEL_CHANNEL,
}


# names of the spans the core reads while they pass (the contract names rank spans by their op);
# edges that forward spans undecoded classify on these names
JOIN_NAMES = frozenset((*schema.COLLECTIVE_OPS, *schema.P2P_OPS, schema.SPAN_NATIVE_COLL))


def span_kind(record: SpanRecord) -> str:
    kind = record.attributes.get(schema.ATTR_SPAN_KIND)
    if isinstance(kind, str) and kind:
        return kind
    return _KIND_BY_NAME.get(record.name, "")


def split_urgent(records: Iterable[SpanRecord]) -> tuple[list[SpanRecord], list[SpanRecord]]:
    """(heartbeats, the rest): lets a server forward heartbeats before taking any lock."""
    urgent: list[SpanRecord] = []
    rest: list[SpanRecord] = []
    for record in records:
        if record.scope != schema.PROCESSOR_SCOPE and span_kind(record) == schema.KIND_HEARTBEAT:
            urgent.append(record)
        else:
            rest.append(record)
    return urgent, rest


class CollectorProcessor:
    """Joins collectives across ranks and condenses native detail, within fixed memory."""

    def __init__(self, config: ProcessorConfig | None = None, counters: Counters | None = None,
                 count_io: bool = True) -> None:
        """`count_io=False`: the caller's edge counts spans_in / spans_out itself (it forwards
        some spans without handing them to the core)."""
        self.config = config or ProcessorConfig()
        self.counters = counters or Counters()
        self.count_io = count_io
        self._open: Windows[int, _Open] = Windows(self.config.max_open)
        self._decisions: BoundedLru[int, str] = BoundedLru(self.config.max_decisions)
        self._tail = TailPolicy(self.config)
        self._buffered_raw = 0

    # ------------------------------------------------------------------ inputs
    def process(self, records: Iterable[SpanRecord], now: float) -> Output:
        """Route one batch; returns what can go downstream now (incl. windows closed by it)."""
        out = Output()
        received = 0
        for record in records:
            received += 1
            if record.scope == schema.PROCESSOR_SCOPE:
                out.normal.append(record)
                continue
            kind = span_kind(record)
            if kind == schema.KIND_HEARTBEAT:
                self.counters.add("heartbeats")
                out.urgent.append(record)
            elif kind in (schema.KIND_COLLECTIVE, schema.KIND_P2P):
                out.normal.append(record)
                self._join_rank_span(record, now, out)
            elif kind == schema.KIND_NATIVE_COLL:
                out.normal.append(record)
                entry = self._entry(record.trace_id, now, out, for_detail=False)
                if entry is not None:
                    entry.join.add_native_collective(record)
            elif kind in DETAIL_KINDS or (not kind and record.name in DETAIL_NAMES):
                self._hold_detail(record, now, out)
            else:
                out.normal.append(record)
        out.extend(self.tick(now, count=False))
        if self.count_io:
            self.counters.add("spans_in", received)
            self.counters.add("spans_out", len(out))
        return out

    def pass_urgent(self, heartbeats: list[SpanRecord]) -> list[SpanRecord]:
        """Account for heartbeats a server forwarded itself (see split_urgent); touches no
        window state, so it is safe without the lock that serialises process()."""
        self.counters.add("heartbeats", len(heartbeats))
        if self.count_io:
            self.counters.add("spans_in", len(heartbeats))
            self.counters.add("spans_out", len(heartbeats))
        return heartbeats

    def tick(self, now: float, count: bool = True) -> Output:
        """Close every window whose deadline passed."""
        out = Output()
        for trace_id, entry in self._open.due(now):
            self._close(trace_id, entry, self._closed_reason(entry), out)
        if count and self.count_io:
            self.counters.add("spans_out", len(out))
        return out

    def flush(self) -> Output:
        """Close every open window now (shutdown)."""
        out = Output()
        for trace_id, entry in self._open.drain():
            self._close(trace_id, entry, schema.CLOSED_SHUTDOWN, out)
        if self.count_io:
            self.counters.add("spans_out", len(out))
        return out

    def next_deadline(self) -> float | None:
        return self._open.next_deadline()

    def gauges(self) -> dict[str, float]:
        return {"open_collectives": len(self._open), "buffered_detail_spans": self._buffered_raw,
                "remembered_decisions": len(self._decisions)}

    # ------------------------------------------------------------------ internals
    def _entry(self, trace_id: int, now: float, out: Output, for_detail: bool) -> _Open | None:
        entry = self._open.get(trace_id)
        if entry is not None:
            return entry
        decided = self._decisions.get(trace_id)
        if decided is not None and not for_detail:
            return None  # the collective already closed
        deadline = now + (self.config.linger_s if decided is not None else self.config.window_s)
        entry, evicted = self._open.open(
            trace_id, deadline,
            lambda: _Open(CollectiveJoin(trace_id), FlowCondenser(trace_id, self.config.max_flows_per_collective),
                          decided=decided))
        for old_trace, old_entry in evicted:
            self.counters.add("windows_evicted")
            self._close(old_trace, old_entry, schema.CLOSED_EVICTED, out)
        return entry

    def _join_rank_span(self, record: SpanRecord, now: float, out: Output) -> None:
        try:  # parse before opening a window, so malformed spans cost no state
            key = CollectiveKey.from_span(record)
        except MalformedSpan:
            self.counters.add("malformed_spans")
            return
        entry = self._entry(record.trace_id, now, out, for_detail=False)
        if entry is None or entry.decided is not None:
            self.counters.add("late_spans")
            return
        if not entry.join.add_rank_span(record, key):
            self.counters.add("duplicate_spans")
            return
        self.counters.add("collective_spans")
        if entry.join.complete:
            self._open.set_deadline(record.trace_id, min(now + self.config.linger_s,
                                                         self._open.deadline(record.trace_id) or now))

    def _hold_detail(self, record: SpanRecord, now: float, out: Output) -> None:
        self.counters.add("detail_in")
        decided = self._decisions.get(record.trace_id) if record.trace_id not in self._open else None
        if decided:  # late detail of a collective already judged anomalous: keep it, at once
            self.counters.add("detail_kept")
            out.normal.append(kept_detail(record, decided))
            return
        entry = self._entry(record.trace_id, now, out, for_detail=True)
        assert entry is not None
        if not entry.condenser.add(record):
            self.counters.add("dropped_flow_cap")
            return
        entry.detail_spans += 1
        if (len(entry.raw) < self.config.max_detail_per_collective
                and self._buffered_raw < self.config.max_detail_total):
            entry.raw.append(record)
            self._buffered_raw += 1
        else:
            entry.raw_overflow += 1

    def _closed_reason(self, entry: _Open) -> str:
        return schema.CLOSED_COMPLETE if entry.join.complete else schema.CLOSED_TIMEOUT

    def _close(self, trace_id: int, entry: _Open, closed: str, out: Output) -> None:
        self._buffered_raw -= len(entry.raw)
        join = entry.join
        if join.arrivals:
            stats = join.stats()
            assert join.key is not None
            anomaly = self._tail.judge(join.key, stats)
            flows = entry.condenser.summaries()
            out.normal.append(summary_span(join, stats, closed=closed, anomaly=anomaly, flows=len(flows),
                                           detail_spans=entry.detail_spans))
            self.counters.add("summaries")
            if not stats.complete:
                self.counters.add("summaries_incomplete")
        else:
            # detail without any rank span: either late detail of a closed collective, or the
            # collective never completed anywhere (a hang shows up exactly like this)
            anomaly = entry.decided if entry.decided is not None else schema.ANOMALY_INCOMPLETE
            flows = entry.condenser.summaries()
        out.normal.extend(flows)
        self.counters.add("flow_summaries", len(flows))
        if anomaly:
            out.normal.extend(kept_detail(record, anomaly) for record in entry.raw)
            self.counters.add("detail_kept", len(entry.raw))
            self.counters.add("dropped_detail_cap", entry.raw_overflow)
        else:
            self.counters.add("detail_condensed", entry.detail_spans)
        if entry.decided is None:
            self._decisions.put(trace_id, anomaly)
