"""OTLP traces <-> SpanRecord: the one plain-data span model the services compute on.

The collector processor and the RCA service are pure functions over SpanRecords;
this module is the edge that turns OTLP protobuf / OTLP JSON into records and back.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from mycroft import schema

AttrValue = str | bool | int | float | list[Any]

# Bounds applied while decoding, so no attribute grows past them downstream.
MAX_ARRAY_ITEMS = 65_536  # a 16k-rank summary lists every rank once
MAX_STRING_CHARS = 1 << 20
MAX_ATTRIBUTES = 1024  # per span / resource
MAX_VALUE_DEPTH = 8  # arrays of arrays (and kvlists) deeper than this decode as ""
JSON_MAX_DEPTH = 64  # OTLP JSON needs about 12 levels


class OtlpDecodeError(ValueError):
    """Input that is not a valid OTLP traces payload; the message says why."""


@dataclass(slots=True)
class SpanRecord:
    """One span, flattened: ids as ints, attributes and resource as plain dicts."""

    trace_id: int
    span_id: int
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, AttrValue] = field(default_factory=dict)
    resource: dict[str, AttrValue] = field(default_factory=dict)
    parent_span_id: int = 0
    status_code: int = 0  # 0 unset, 1 ok, 2 error
    status_message: str = ""
    scope: str = schema.INSTRUMENTATION_SCOPE

    def get(self, key: str, default: Any = None) -> Any:
        """Attribute lookup that falls back to the resource (rank, job live there)."""
        if key in self.attributes:
            return self.attributes[key]
        return self.resource.get(key, default)

    @property
    def kind(self) -> str:
        return str(self.attributes.get(schema.ATTR_SPAN_KIND, ""))

    @property
    def job_id(self) -> str:
        job = self.get(schema.RES_JOB_ID)
        if job is None:
            job = self.resource.get(schema.RES_SERVICE_NAME, "unknown")
        return str(job)

    @property
    def rank(self) -> int | None:
        value = self.get(schema.RES_RANK)
        return int(value) if isinstance(value, int | float | str) and str(value).lstrip("-").isdigit() else None


# ------------------------------------------------------------------------------------
# values
# ------------------------------------------------------------------------------------
def _from_any(value: AnyValue, depth: int = 0) -> AttrValue:
    which = value.WhichOneof("value")
    if which == "string_value":
        text = value.string_value
        return text if len(text) <= MAX_STRING_CHARS else text[:MAX_STRING_CHARS]
    if which == "bool_value":
        return value.bool_value
    if which == "int_value":
        return value.int_value
    if which == "double_value":
        return value.double_value
    if depth >= MAX_VALUE_DEPTH:
        return ""
    if which == "array_value":
        return [_from_any(item, depth + 1) for item in value.array_value.values[:MAX_ARRAY_ITEMS]]
    if which == "bytes_value":
        return value.bytes_value[: MAX_STRING_CHARS // 2].hex()
    if which == "kvlist_value":
        items = value.kvlist_value.values[:MAX_ATTRIBUTES]
        return json.dumps({kv.key: _from_any(kv.value, depth + 1) for kv in items})[:MAX_STRING_CHARS]
    return ""


def _to_any(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[_to_any(item) for item in value]))
    return AnyValue(string_value=str(value))


def _attrs(kvs: Sequence[KeyValue]) -> dict[str, AttrValue]:
    if len(kvs) > MAX_ATTRIBUTES:
        kvs = kvs[:MAX_ATTRIBUTES]
    return {kv.key: _from_any(kv.value) for kv in kvs}


class DecodeCache:
    """Decoded attribute arrays and resources by their wire bytes, for receivers whose input repeats.

    A rank's heartbeats repeat most of themselves every interval (its groups, members,
    names; often the in-flight arrays) and every span of a process carries the same
    resource: serializing a sub-message in upb and looking it up is several times cheaper
    than walking it in Python. Decoded values are shared between records, so whoever
    uses a cache must treat attribute values as read-only (the RCA fold copies what it
    keeps). Bounded: cleared when full.
    """

    def __init__(self, max_entries: int = 1 << 17) -> None:
        self.max_entries = max_entries
        self.values: dict[bytes, tuple[str, AttrValue]] = {}
        self.resources: dict[bytes, dict[str, AttrValue]] = {}
        self.misses = 0

    def attrs(self, kvs: Sequence[KeyValue]) -> dict[str, AttrValue]:
        """Like _attrs; a key-value pair seen before (same bytes) costs one serialization and a lookup."""
        if len(kvs) > MAX_ATTRIBUTES:
            kvs = kvs[:MAX_ATTRIBUTES]
        out: dict[str, AttrValue] = {}
        values = self.values
        for kv in kvs:
            raw = kv.SerializeToString()
            hit = values.get(raw)
            if hit is not None:
                out[hit[0]] = hit[1]
                continue
            self.misses += 1
            key, value = kv.key, _from_any(kv.value)
            out[key] = value
            # floats (ages, durations) rarely repeat: caching them would only churn the table
            if not isinstance(value, float) and not (isinstance(value, list) and value
                                                     and isinstance(value[0], float)):
                if len(values) >= self.max_entries:
                    values.clear()
                values[raw] = (key, value)
        return out

    def resource(self, resource: Resource) -> dict[str, AttrValue]:
        raw = resource.SerializeToString()
        found = self.resources.get(raw)
        if found is None:
            if len(self.resources) >= self.max_entries:
                self.resources.clear()
            found = self.resources[raw] = _attrs(resource.attributes)
        return found


def _kvs(attrs: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=key, value=_to_any(value)) for key, value in attrs.items()]


# ------------------------------------------------------------------------------------
# protobuf
# ------------------------------------------------------------------------------------
def records_from_request(request: ExportTraceServiceRequest, cache: DecodeCache | None = None) -> list[SpanRecord]:
    """Flatten a request; with a cache, repeated arrays and resources are decoded once (see DecodeCache)."""
    records: list[SpanRecord] = []
    attrs = cache.attrs if cache is not None else _attrs
    for resource_spans in request.resource_spans:
        resource = cache.resource(resource_spans.resource) if cache is not None else \
            _attrs(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                records.append(
                    SpanRecord(
                        trace_id=int.from_bytes(span.trace_id, "big") if span.trace_id else 0,
                        span_id=int.from_bytes(span.span_id, "big") if span.span_id else 0,
                        parent_span_id=int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else 0,
                        name=span.name,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes=attrs(span.attributes),
                        resource=resource,
                        status_code=span.status.code,
                        status_message=span.status.message,
                        scope=scope,
                    )
                )
    return records


def _string_attr(kvs: Iterable[KeyValue], key: str) -> str | None:
    for kv in kvs:
        if kv.key == key:
            return str(_from_any(kv.value))
    return None


def filter_request_jobs(request: ExportTraceServiceRequest, allow: Callable[[str], bool]) -> int:
    """Drop, in place, the spans of jobs `allow` refuses; returns how many were dropped.

    A span's job is what SpanRecord.job_id would say: its own mycroft.job.id attribute,
    else the resource's mycroft.job.id, else service.name.
    """
    refused = 0
    for resource_spans in request.resource_spans:
        attrs = resource_spans.resource.attributes
        resource_job = _string_attr(attrs, schema.RES_JOB_ID)
        if resource_job is None:
            resource_job = _string_attr(attrs, schema.RES_SERVICE_NAME) or "unknown"
        for scope_spans in resource_spans.scope_spans:
            keep = []
            for span in scope_spans.spans:
                job = _string_attr(span.attributes, schema.ATTR_JOB_ID)
                if allow(resource_job if job is None else job):
                    keep.append(span)
            if len(keep) != len(scope_spans.spans):
                refused += len(scope_spans.spans) - len(keep)
                kept = [Span.FromString(span.SerializeToString()) for span in keep]
                del scope_spans.spans[:]
                scope_spans.spans.extend(kept)
    return refused


def keep_only_named(request: ExportTraceServiceRequest, name: str) -> int:
    """Drop, in place and before any decoding, every span not named `name`; returns how many went.

    Costs a name comparison per span (upb), against tens of microseconds to decode one in
    Python: a receiver under load sheds this way to keep its CPU for the spans that matter.
    """
    dropped = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            spans = scope_spans.spans
            keep = [span for span in spans if span.name == name]
            if len(keep) != len(spans):
                dropped += len(spans) - len(keep)
                kept = [Span.FromString(span.SerializeToString()) for span in keep]
                del scope_spans.spans[:]
                scope_spans.spans.extend(kept)
    return dropped


def decode_protobuf(payload: bytes, cache: DecodeCache | None = None) -> list[SpanRecord]:
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise OtlpDecodeError(f"not an OTLP ExportTraceServiceRequest protobuf: {exc}") from exc
    return records_from_request(request, cache)


def _span_to_proto(record: SpanRecord) -> Span:
    return Span(
        trace_id=record.trace_id.to_bytes(16, "big"),
        span_id=record.span_id.to_bytes(8, "big"),
        parent_span_id=record.parent_span_id.to_bytes(8, "big") if record.parent_span_id else b"",
        name=record.name,
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=record.start_ns,
        end_time_unix_nano=record.end_ns,
        attributes=_kvs(record.attributes),
        status=Status(code=record.status_code, message=record.status_message),  # type: ignore[arg-type]
    )


def request_from_records(records: Sequence[SpanRecord]) -> ExportTraceServiceRequest:
    """Group records by (resource, scope) back into one OTLP request."""
    grouped: dict[tuple[str, str], tuple[dict[str, AttrValue], list[Span]]] = {}
    for record in records:
        key = (json.dumps(record.resource, sort_keys=True, default=str), record.scope)
        if key not in grouped:
            grouped[key] = (record.resource, [])
        grouped[key][1].append(_span_to_proto(record))
    by_resource: dict[str, ResourceSpans] = {}
    for (resource_key, scope), (resource, spans) in grouped.items():
        if resource_key not in by_resource:
            by_resource[resource_key] = ResourceSpans(resource=Resource(attributes=_kvs(resource)))
        by_resource[resource_key].scope_spans.append(
            ScopeSpans(scope=InstrumentationScope(name=scope), spans=spans)
        )
    return ExportTraceServiceRequest(resource_spans=list(by_resource.values()))


# ------------------------------------------------------------------------------------
# OTLP JSON (ids are hex strings, enums may be names, int64 may be strings)
# ------------------------------------------------------------------------------------
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids_to_base64(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str) and value:
                try:
                    node[key] = base64.b64encode(bytes.fromhex(value)).decode()
                except ValueError as exc:
                    raise OtlpDecodeError(f"{key} is not hex: {value!r}") from exc
            else:
                _hex_ids_to_base64(value)
    elif isinstance(node, list):
        for item in node:
            _hex_ids_to_base64(item)


def json_depth(document: Any, limit: int) -> int:
    """Nesting depth of a decoded JSON value, counted without recursion; stops past `limit`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest = depth
            if deepest > limit:
                return deepest
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values() if isinstance(child, dict | list))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node if isinstance(child, dict | list))
    return deepest


def decode_json(payload: bytes | str | Mapping[str, Any], max_depth: int = JSON_MAX_DEPTH) -> list[SpanRecord]:
    try:
        document = json.loads(payload) if isinstance(payload, bytes | str) else json.loads(json.dumps(payload))
    except RecursionError as exc:
        raise OtlpDecodeError(f"JSON nested deeper than {max_depth} levels") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise OtlpDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(document, dict):
        raise OtlpDecodeError("OTLP JSON must be an object with resourceSpans")
    if json_depth(document, max_depth) > max_depth:
        raise OtlpDecodeError(f"JSON nested deeper than {max_depth} levels")
    _hex_ids_to_base64(document)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(document, request, ignore_unknown_fields=True)
    except (json_format.ParseError, binascii.Error, TypeError, ValueError, RecursionError) as exc:
        raise OtlpDecodeError(f"not OTLP JSON traces: {exc}") from exc
    return records_from_request(request)


def encode_json(records: Sequence[SpanRecord]) -> dict[str, Any]:
    """OTLP JSON (the file format `mycroft rca analyze --otlp-json` reads)."""
    document = json_format.MessageToDict(request_from_records(records))
    _base64_ids_to_hex(document)
    return document


def _base64_ids_to_hex(node: Any) -> None:
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                _base64_ids_to_hex(value)
    elif isinstance(node, list):
        for item in node:
            _base64_ids_to_hex(item)


def decode_json_lines(text: str) -> list[SpanRecord]:
    """A file of OTLP JSON documents, one per line (the collector file exporter's format)."""
    records: list[SpanRecord] = []
    stripped = text.strip()
    if stripped.startswith("{") and "\n{" not in stripped:
        return decode_json(stripped)
    for line in stripped.splitlines():
        if line.strip():
            records.extend(decode_json(line))
    return records
