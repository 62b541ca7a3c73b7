"""OTLP traces <-> SpanRecord: the one plain-data span model the services compute on.

The collector processor and the RCA service are pure functions over SpanRecords;
this module is the edge that turns OTLP protobuf / OTLP JSON into records and back.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from mycroft import schema

_otlp_fast: ModuleType | None
try:  # the compiled decoder (built by `pip install`, optional): see DecodeCache.decode_compiled
    from mycroft import _otlp_fast
except ImportError:  # pragma: no cover - a platform without a C compiler
    _otlp_fast = None

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


#: keys whose values change every heartbeat / op: memoizing them would only churn the table
VOLATILE_KEYS = frozenset({
    schema.ATTR_HB_COUNTER, schema.ATTR_HB_INFLIGHT_AGES_S, schema.ATTR_HB_COMM_S, schema.ATTR_HB_OPS_DONE,
    schema.ATTR_SEQ, schema.ATTR_CALL_S,
    # frontiers move with every op: in a real job each rank's arrays differ (only the simulator's
    # ranks march in step), and memoizing them would churn out the values that do repeat
    schema.ATTR_HB_GROUP_ISSUED, schema.ATTR_HB_GROUP_COMPLETED, schema.ATTR_HB_INFLIGHT_SEQS,
})


class DecodeCache:
    """Decoded key-values and resources by their wire bytes, for receivers whose input repeats.

    A rank's heartbeats repeat most of themselves every interval (its groups, members,
    names; often the in-flight arrays and frontiers) and every span of a process carries
    the same resource: looking a key-value's bytes up is far cheaper than walking it in
    Python. `decode()` gets those bytes straight from upb (a lean message schema whose
    attributes and resource are `bytes`, see _lean_types), so a cached key-value costs a
    dict lookup. Decoded values are shared between records, so whoever uses a cache must
    treat attribute values as read-only (the RCA fold copies what it keeps). Bounded:
    cleared when full.
    """

    def __init__(self, max_entries: int = 1 << 17) -> None:
        self.max_entries = max_entries
        self.values: dict[bytes, tuple[str, AttrValue]] = {}
        self.resources: dict[bytes, dict[str, AttrValue]] = {}
        self.misses = 0
        # the compiled decoder's own memo (same rule, same bound): looked up without a bytes object
        self.memo = _otlp_fast.Memo(max_entries) if _otlp_fast is not None else None
        # and its resources (dicts from resource_bytes, by the Resource's bytes): one Python call per process
        self.resource_memo = _otlp_fast.Memo(max_entries) if _otlp_fast is not None else None

    def kv_bytes(self, raws: Iterable[bytes]) -> dict[str, AttrValue]:
        """Serialized KeyValues -> attributes; bytes seen before cost a lookup. (A loop here
        measured faster than map / compress / dict(): the cost is upb making the bytes.)"""
        out: dict[str, AttrValue] = {}
        values = self.values
        for raw in raws:
            hit = values.get(raw)
            key, value = hit if hit is not None else self._miss(raw)
            out[key] = value
        return out

    def _miss(self, raw: bytes) -> tuple[str, AttrValue]:
        key, value = _kv_from_bytes(raw)
        self.misses += 1
        if key not in VOLATILE_KEYS and not isinstance(value, float) and not (
                isinstance(value, list) and value and isinstance(value[0], float)):
            if len(self.values) >= self.max_entries:
                self.values.clear()
            self.values[raw] = (key, value)
        return key, value

    def attrs(self, kvs: Sequence[KeyValue]) -> dict[str, AttrValue]:
        """Like _attrs, from parsed KeyValues (one serialization each, then kv_bytes)."""
        if len(kvs) > MAX_ATTRIBUTES:
            kvs = kvs[:MAX_ATTRIBUTES]
        return self.kv_bytes([kv.SerializeToString() for kv in kvs])

    def resource_bytes(self, raw: bytes) -> dict[str, AttrValue]:
        found = self.resources.get(raw)
        if found is None:
            try:
                attributes = Resource.FromString(raw).attributes
            except Exception as exc:  # protobuf's DecodeError and friends
                raise OtlpDecodeError(f"bad resource: {exc}") from exc
            if len(self.resources) >= self.max_entries:
                self.resources.clear()
            found = self.resources[raw] = _attrs(attributes)
        return found

    def resource(self, resource: Resource) -> dict[str, AttrValue]:
        return self.resource_bytes(resource.SerializeToString())

    def decode(self, payload: bytes) -> list[SpanRecord]:
        """An ExportTraceServiceRequest's bytes -> records: compiled where it is built, else the lean schema."""
        records = self.decode_compiled(payload)
        return records if records is not None else records_from_lean(parse_lean(payload), self)

    def decode_compiled(self, payload: bytes) -> list[SpanRecord] | None:
        """The compiled decoder's records (mycroft/_otlp_fast.c), exactly records_from_lean's;
        None where it is not built or leaves the input to the Python path (unusual or malformed:
        that path then gives the records or the error). Raises OtlpDecodeError like it."""
        if _otlp_fast is None:
            return None
        found = _otlp_fast.decode(payload, self.memo, VOLATILE_KEYS, self._miss, self.resource_bytes, SpanRecord,
                                  MAX_ATTRIBUTES, self.resource_memo, schema.SPAN_HEARTBEAT)
        if found is None:
            return None
        records, misses = found
        self.misses += misses
        return records


_KEYS: dict[bytes, str] = {}  # attribute keys by their UTF-8 bytes (few distinct ones)
_DOUBLE = struct.Struct("<d")


_U64 = (1 << 64) - 1


def _varint_at(raw: bytes, pos: int, end: int) -> tuple[int, int]:
    """(value, next position) of the varint at pos; (-1, -1) when it runs past `end` or 10 bytes.

    Protobuf's rule, as upb (the full decoder here) and mycroft/_otlp_fast.c apply it: at most
    10 bytes, the value taken mod 2^64 (bits past 63 in the 10th byte are dropped)."""
    value = shift = 0
    while pos < end:
        byte = raw[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if byte < 0x80:
            return value & _U64, pos
        shift += 7
        if shift > 63:
            break
    return -1, -1


def _scalar_at(raw: bytes, pos: int, end: int) -> tuple[AttrValue, int] | None:
    """One AnyValue holding a short string, an int, a double or a bool, exactly filling [pos, end)."""
    tag = raw[pos]
    if tag == 0x18:  # int_value (int64, two's complement)
        value, nxt = _varint_at(raw, pos + 1, end)
        if nxt != end:
            return None
        return (value - (1 << 64) if value >= 1 << 63 else value), end
    if tag == 0x21:  # double_value
        return (_DOUBLE.unpack_from(raw, pos + 1)[0], end) if end - pos == 9 else None
    if tag == 0x0A:  # string_value
        if end - pos < 2 or raw[pos + 1] != end - pos - 2:
            return None
        return raw[pos + 2:end].decode(), end
    if tag == 0x10 and end - pos == 2 and raw[pos + 1] < 2:  # bool_value
        return raw[pos + 1] == 1, end
    return None


def _fast_kv(raw: bytes) -> tuple[str, AttrValue] | None:
    """The common shapes of a serialized KeyValue, decoded without building protobuf objects.

    A key under 128 bytes and one value: a short string, an int, a double, a bool, or an
    array of those (what every heartbeat and op span holds). Anything else (long fields,
    repeated or unknown fields, nesting) returns None and takes the full decoder, so the
    result is always what _from_any(KeyValue.FromString(raw).value) gives.
    """
    n = len(raw)
    if n < 4 or raw[0] != 0x0A or raw[1] > 0x7F:
        return None
    p = 2 + raw[1]
    if p + 2 > n or raw[p] != 0x12 or raw[p + 1] != n - p - 2:
        return None
    key_bytes = raw[2:p]
    key = _KEYS.get(key_bytes)
    if key is None:
        if len(_KEYS) >= 4096:
            _KEYS.clear()
        key = _KEYS[key_bytes] = key_bytes.decode()
    pos = p + 2
    if pos == n:
        return key, ""  # an empty AnyValue
    if raw[pos] != 0x2A:
        found = _scalar_at(raw, pos, n)
        return None if found is None else (key, found[0])
    if raw[pos + 1] != n - pos - 2:  # array_value: one length byte, exactly the rest
        return None
    items: list[AttrValue] = []
    pos += 2
    while pos < n:
        if raw[pos] != 0x0A or pos + 1 >= n or raw[pos + 1] > 0x7F:
            return None
        end = pos + 2 + raw[pos + 1]
        if end > n:
            return None
        if end == pos + 2:
            items.append("")
        else:
            found = _scalar_at(raw, pos + 2, end)
            if found is None:
                return None
            items.append(found[0])
        pos = end
    return key, items


def _kv_from_bytes(raw: bytes) -> tuple[str, AttrValue]:
    try:
        fast = _fast_kv(raw)
    except (UnicodeDecodeError, IndexError):
        fast = None  # not UTF-8 / cut short: the full decoder says what is wrong
    if fast is not None:
        return fast
    try:
        kv = KeyValue.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise OtlpDecodeError(f"bad attribute: {exc}") from exc
    return kv.key, _from_any(kv.value)


# ------------------------------------------------------------------------------------
# the lean schema: OTLP traces as upb sees them, with attributes and resources left as bytes
# ------------------------------------------------------------------------------------
def _lean_types() -> tuple[Any, Any]:
    """(LeanRequest, LeanSpan) message classes, wire-compatible with ExportTraceServiceRequest / Span.

    Same field numbers and types as the OTLP protos, except Span.attributes (repeated bytes:
    each element is one serialized KeyValue) and ResourceSpans.resource (bytes). Parsing with
    it is upb's C parser; the parts a receiver memoizes come out as bytes without a Python
    serialization per key-value. Fields it does not name (events, links, ...) are skipped as
    unknown fields, as the full decoder ignores them.
    """
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="mycroft/otlp_lean.proto", package="mycroft.lean",
                                               syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, int, str]]) -> None:
        m = proto.message_type.add(name=name)
        for field_name, number, ftype, label, type_name in fields:
            m.field.add(name=field_name, number=number, type=ftype, label=label,
                        **({"type_name": type_name} if type_name else {}))

    one, many = f.LABEL_OPTIONAL, f.LABEL_REPEATED
    message("Status", [("message", 2, f.TYPE_STRING, one, ""), ("code", 3, f.TYPE_INT32, one, "")])
    message("Scope", [("name", 1, f.TYPE_STRING, one, "")])
    message("Span", [
        ("trace_id", 1, f.TYPE_BYTES, one, ""), ("span_id", 2, f.TYPE_BYTES, one, ""),
        ("parent_span_id", 4, f.TYPE_BYTES, one, ""), ("name", 5, f.TYPE_STRING, one, ""),
        ("start_time_unix_nano", 7, f.TYPE_FIXED64, one, ""), ("end_time_unix_nano", 8, f.TYPE_FIXED64, one, ""),
        ("attributes", 9, f.TYPE_BYTES, many, ""), ("status", 15, f.TYPE_MESSAGE, one, ".mycroft.lean.Status")])
    message("ScopeSpans", [("scope", 1, f.TYPE_MESSAGE, one, ".mycroft.lean.Scope"),
                           ("spans", 2, f.TYPE_MESSAGE, many, ".mycroft.lean.Span")])
    message("ResourceSpans", [("resource", 1, f.TYPE_BYTES, one, ""),
                              ("scope_spans", 2, f.TYPE_MESSAGE, many, ".mycroft.lean.ScopeSpans")])
    message("Request", [("resource_spans", 1, f.TYPE_MESSAGE, many, ".mycroft.lean.ResourceSpans")])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return (message_factory.GetMessageClass(pool.FindMessageTypeByName("mycroft.lean.Request")),
            message_factory.GetMessageClass(pool.FindMessageTypeByName("mycroft.lean.Span")))


LeanRequest, LeanSpan = _lean_types()


def parse_lean(payload: bytes) -> Any:
    """Request bytes -> a LeanRequest (raises OtlpDecodeError on malformed input)."""
    request = LeanRequest()
    try:
        request.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError and friends
        raise OtlpDecodeError(f"not an OTLP ExportTraceServiceRequest protobuf: {exc}") from exc
    return request


def records_from_lean(request: Any, cache: DecodeCache) -> list[SpanRecord]:
    """Flatten a LeanRequest; key-values and resources memoized in `cache` by their bytes."""
    records: list[SpanRecord] = []
    append = records.append
    kv_bytes = cache.kv_bytes
    from_bytes = int.from_bytes
    for resource_spans in request.resource_spans:
        resource = cache.resource_bytes(resource_spans.resource)
        for scope_spans in resource_spans.scope_spans:
            scope = scope_spans.scope.name
            for span in scope_spans.spans:
                trace_id, span_id, parent, status = span.trace_id, span.span_id, span.parent_span_id, span.status
                attributes = span.attributes
                if len(attributes) > MAX_ATTRIBUTES:
                    attributes = attributes[:MAX_ATTRIBUTES]
                append(SpanRecord(
                    from_bytes(trace_id, "big") if trace_id else 0,
                    from_bytes(span_id, "big") if span_id else 0,
                    span.name, span.start_time_unix_nano, span.end_time_unix_nano,
                    kv_bytes(attributes), resource,
                    from_bytes(parent, "big") if parent else 0,
                    status.code, status.message, scope))
    return records


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


def keep_only_named(request: Any, name: str) -> int:
    """Drop, in place and before any decoding, every span not named `name`; returns how many went.

    Costs a name comparison per span (upb), against microseconds to decode one in Python: a
    receiver under load sheds this way to keep its CPU for the spans that matter. Works on a
    full ExportTraceServiceRequest and on a LeanRequest alike.
    """
    dropped = 0
    for resource_spans in request.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            spans = scope_spans.spans
            keep = [span for span in spans if span.name == name]
            if len(keep) != len(spans):
                dropped += len(spans) - len(keep)
                kept = [type(span).FromString(span.SerializeToString()) for span in keep]
                del scope_spans.spans[:]
                scope_spans.spans.extend(kept)
    return dropped


def keep_only_named_records(records: list[SpanRecord], name: str) -> int:
    """keep_only_named for decoded records (the compiled decoder's): in place, returns how many went."""
    kept = [record for record in records if record.name == name]
    dropped = len(records) - len(kept)
    if dropped:
        records[:] = kept
    return dropped


def decode_protobuf(payload: bytes, cache: DecodeCache | None = None) -> list[SpanRecord]:
    if cache is not None:
        return cache.decode(payload)
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
