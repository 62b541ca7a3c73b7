"""The service's fast path: split an OTLP request without decoding what merely passes.

Decoding every span into a SpanRecord and encoding it again costs ~60-180 us per span
in Python; most spans (heartbeats, rank spans, anything not Mycroft's) only need to be
forwarded. So the request is split on span names (the contract names spans by their
op / kind), copying protobuf messages at C speed:

    urgent       heartbeats                      -> forwarded at once, own lane
    passthrough  rank spans and everything else  -> forwarded at once, as received
    feed         rank spans + native detail      -> decoded for the core
                 (native detail is not forwarded: the core condenses or keeps it)

`budget` caps how many spans are decoded for the core: past it (the core is behind),
native detail is dropped undecoded and rank spans pass without being joined, both
counted, so a flood costs counters instead of memory or heartbeat latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from mycroft import schema
from mycroft.otlp import SpanRecord, records_from_request

from .condense import DETAIL_NAMES
from .pipeline import JOIN_NAMES


@dataclass(slots=True)
class Split:
    urgent: ExportTraceServiceRequest = field(default_factory=ExportTraceServiceRequest)
    passthrough: ExportTraceServiceRequest = field(default_factory=ExportTraceServiceRequest)
    feed: list[SpanRecord] = field(default_factory=list)
    urgent_spans: int = 0
    passthrough_spans: int = 0
    received: int = 0
    dropped_detail: int = 0  # native detail dropped undecoded (budget)
    unjoined: int = 0  # rank spans forwarded without joining (budget)


def _copy_scope(target: ResourceSpans, source: ScopeSpans, spans: list[Any]) -> None:
    scope_spans = target.scope_spans.add()
    scope_spans.scope.CopyFrom(source.scope)
    scope_spans.schema_url = source.schema_url
    scope_spans.spans.extend(spans)  # one C-level copy loop


def _new_resource(request: ExportTraceServiceRequest, source: ResourceSpans) -> ResourceSpans:
    rs = request.resource_spans.add()
    rs.resource.CopyFrom(source.resource)
    rs.schema_url = source.schema_url
    return rs


def split_request(request: ExportTraceServiceRequest, budget: int) -> Split:
    """Split `request` (see the module doc); at most `budget` spans are decoded for the core."""
    split = Split()
    feed_request = ExportTraceServiceRequest()
    room = budget
    heartbeat, join_names, detail_names = schema.SPAN_HEARTBEAT, JOIN_NAMES, DETAIL_NAMES
    for rs in request.resource_spans:
        # per scope: (scope spans, passing, urgent, feed); passing is None for our own output
        scopes: list[tuple[ScopeSpans, list[Any] | None, list[Any], list[Any]]] = []
        taken = 0  # spans that must not be forwarded as they are (heartbeats, native detail)
        for ss in rs.scope_spans:
            spans = ss.spans
            split.received += len(spans)
            if ss.scope.name == schema.PROCESSOR_SCOPE:
                scopes.append((ss, None, [], []))
                continue
            passing: list[Any] = []
            urgent: list[Any] = []
            feed: list[Any] = []
            for span in spans:
                name = span.name
                if name == heartbeat:
                    urgent.append(span)
                elif name in join_names:
                    passing.append(span)
                    feed.append(span)
                elif name in detail_names:
                    feed.append(span)
                else:
                    passing.append(span)
            taken += len(spans) - len(passing)
            if len(feed) > room:  # the core is behind: shed what does not fit, undecoded
                for span in feed[room:]:
                    if span.name in detail_names:
                        split.dropped_detail += 1
                    else:
                        split.unjoined += 1
                feed = feed[:room]
            room -= len(feed)
            scopes.append((ss, passing, urgent, feed))
        if not taken:  # everything passes: forward the ResourceSpans whole, in one copy
            split.passthrough.resource_spans.append(rs)
            split.passthrough_spans += sum(len(ss.spans) for ss in rs.scope_spans)
        else:
            out_pass = out_urgent = None
            for ss, maybe_passing, urgent, _ in scopes:
                forward = list(ss.spans) if maybe_passing is None else maybe_passing
                if forward:
                    out_pass = out_pass or _new_resource(split.passthrough, rs)
                    _copy_scope(out_pass, ss, forward)
                    split.passthrough_spans += len(forward)
                if urgent:
                    out_urgent = out_urgent or _new_resource(split.urgent, rs)
                    _copy_scope(out_urgent, ss, urgent)
                    split.urgent_spans += len(urgent)
        out_feed = None
        for ss, _, _, feed in scopes:
            if feed:
                out_feed = out_feed or _new_resource(feed_request, rs)
                _copy_scope(out_feed, ss, feed)
    if feed_request.resource_spans:
        split.feed = records_from_request(feed_request)
    return split


def forwarded_by_core(record: SpanRecord) -> bool:
    """Of the core's output for a fed batch, what the fast path has not forwarded already."""
    return record.scope == schema.PROCESSOR_SCOPE or record.name in DETAIL_NAMES
