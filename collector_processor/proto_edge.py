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

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans

from mycroft import schema
from mycroft.otlp import SpanRecord, records_from_request

from .condense import DETAIL_NAMES

JOIN_NAMES = frozenset((*schema.COLLECTIVE_OPS, *schema.P2P_OPS, schema.SPAN_NATIVE_COLL))

_PASS, _URGENT, _JOIN, _DETAIL = 0, 1, 2, 3


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


def _classify(name: str) -> int:
    if name == schema.SPAN_HEARTBEAT:
        return _URGENT
    if name in JOIN_NAMES:
        return _JOIN
    if name in DETAIL_NAMES:
        return _DETAIL
    return _PASS


class _Target:
    """Lazily created ResourceSpans / ScopeSpans of one output request, mirroring the input."""

    __slots__ = ("_request", "_resource_spans", "_rs", "_scope_spans")

    def __init__(self, request: ExportTraceServiceRequest) -> None:
        self._request = request
        self._rs: ResourceSpans | None = None
        self._scope_spans: ScopeSpans | None = None
        self._resource_spans: ResourceSpans | None = None

    def start_resource(self, rs: ResourceSpans) -> None:
        self._resource_spans, self._rs, self._scope_spans = rs, None, None

    def start_scope(self) -> None:
        self._scope_spans = None

    def add(self, scope_spans: ScopeSpans, span: object) -> None:
        if self._rs is None:
            assert self._resource_spans is not None
            self._rs = self._request.resource_spans.add()
            self._rs.resource.CopyFrom(self._resource_spans.resource)
            self._rs.schema_url = self._resource_spans.schema_url
        if self._scope_spans is None:
            self._scope_spans = self._rs.scope_spans.add()
            self._scope_spans.scope.CopyFrom(scope_spans.scope)
            self._scope_spans.schema_url = scope_spans.schema_url
        self._scope_spans.spans.append(span)


def split_request(request: ExportTraceServiceRequest, budget: int) -> Split:
    """Split `request` (see the module doc); at most `budget` spans are decoded for the core."""
    split = Split()
    feed_request = ExportTraceServiceRequest()
    targets = (_Target(split.passthrough), _Target(split.urgent), _Target(feed_request))
    fed = 0
    for rs in request.resource_spans:
        classes = [[_PASS if ss.scope.name == schema.PROCESSOR_SCOPE else _classify(span.name) for span in ss.spans]
                   for ss in rs.scope_spans]
        count = sum(len(c) for c in classes)
        split.received += count
        if not any(any(c) for c in classes):  # nothing to take out: forward the ResourceSpans whole
            split.passthrough.resource_spans.append(rs)
            split.passthrough_spans += count
            continue
        for target in targets:
            target.start_resource(rs)
        for ss, scope_classes in zip(rs.scope_spans, classes, strict=True):
            for target in targets:
                target.start_scope()
            for span, kind in zip(ss.spans, scope_classes, strict=True):
                if kind == _URGENT:
                    targets[1].add(ss, span)
                    split.urgent_spans += 1
                    continue
                if kind in (_JOIN, _PASS):
                    targets[0].add(ss, span)
                    split.passthrough_spans += 1
                if kind in (_JOIN, _DETAIL):
                    if fed < budget:
                        targets[2].add(ss, span)
                        fed += 1
                    elif kind == _DETAIL:
                        split.dropped_detail += 1
                    else:
                        split.unjoined += 1
    if fed:
        split.feed = records_from_request(feed_request)
    return split


def forwarded_by_core(record: SpanRecord) -> bool:
    """Of the core's output for a fed batch, what the fast path has not forwarded already."""
    return record.scope == schema.PROCESSOR_SCOPE or record.name in DETAIL_NAMES
