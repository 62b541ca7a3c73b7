"""SpanRecords to OTLP protobuf bytes, written directly: the exporter's encoder costs ~80 us a span.

opentelemetry-exporter-otlp builds one protobuf message object per span, attribute and value
(`encode_spans`), about 80 us for one of our op spans on a 2-core VM: at the trace budget's
rate that was most of what tracing cost a rank, on threads that share the GIL with training.
Our spans are few shapes with many repeats (the same group, op, state, dtype on every op of a
stream), so each (key, value) pair of a string / bool attribute is encoded once and cached, and
a span is a join of cached pieces, its ids and times: ~10x less CPU. The attribute loop runs in C
where mycroft/_otlp_fast.c is built (9.2 -> 4.7 us an op span encoded; the same bytes and cache).

The bytes are the same message `encode_spans` builds for the ReadableSpan `export.to_readable_span`
makes of the record (fields in field-number order, no default values written, flags
CONTEXT_HAS_IS_REMOTE): a test parses both and compares them. Pure functions, no I/O.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from mycroft.otlp import SpanRecord

_Encode = Callable[[Any], bytes]
_compiled_attributes: Callable[[dict[str, Any], dict[Any, Any], _Encode, _Encode, int, int], bytes] | None
try:  # the attribute loop in C (mycroft/_otlp_fast.c): ~1.7 us an op span instead of ~6
    from mycroft._otlp_fast import attributes as _compiled_attributes
except ImportError:  # not built (no C compiler at install): the Python loop below, its definition
    _compiled_attributes = None

_FIXED64 = struct.Struct("<Q").pack
_DOUBLE = struct.Struct("<d").pack
_KIND_INTERNAL = b"\x30\x01"  # Span.kind (6) = SPAN_KIND_INTERNAL
# Span.flags (16, fixed32: tag 16 << 3 | 5 as a varint) = SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK (0x100),
# what the SDK's encoder writes for a span whose parent is local or absent
_FLAGS_HAS_IS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x100)
_CACHE_MAX = 16_384  # (key, value) pieces kept; past it new pieces are encoded each time
_CACHED_INTS = 4096  # ints below it are cached (ranks, sizes, early seqs); larger ones are mostly unique


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 negatives: ten bytes, two's complement
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (`tag` is the whole first byte: field number << 3 | 2)."""
    return bytes((tag,)) + _varint(len(payload)) + payload


def _any_value(value: Any) -> bytes:
    """An AnyValue message body (the SDK's `_encode_value` rules and order of type tests)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _len_field(0x0A, value.encode())
    if isinstance(value, int):
        return b"\x18" + _varint(value)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _len_field(0x3A, value)
    if isinstance(value, Sequence):
        return _len_field(0x2A, b"".join(_len_field(0x0A, _any_value(item)) for item in value))
    if isinstance(value, Mapping):
        return _len_field(0x32, b"".join(_len_field(0x0A, _key_value(str(k), v)) for k, v in value.items()))
    raise TypeError(f"invalid attribute value type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    return _len_field(0x0A, key.encode()) + _len_field(0x12, _any_value(value))


def _uncached_attribute(item: tuple[str, Any]) -> bytes:
    """Span.attributes (9) entry of one (key, value)."""
    return _len_field(0x4A, _key_value(*item))


class WireEncoder:
    """Encodes batches of SpanRecords of one resource and scope into ExportTraceServiceRequest bytes."""

    def __init__(self, resource_attributes: Mapping[str, Any], scope_name: str, scope_version: str,
                 resource_schema_url: str = "", scope_schema_url: str = "") -> None:
        resource = b"".join(_len_field(0x0A, _key_value(k, v)) for k, v in resource_attributes.items())
        self._resource_field = _len_field(0x0A, resource)  # ResourceSpans.resource (1)
        scope = _len_field(0x0A, scope_name.encode()) + (_len_field(0x12, scope_version.encode())
                                                          if scope_version else b"")
        self._scope_field = _len_field(0x0A, scope)  # ScopeSpans.scope (1)
        self._scope_schema = _len_field(0x1A, scope_schema_url.encode()) if scope_schema_url else b""
        self._resource_schema = _len_field(0x1A, resource_schema_url.encode()) if resource_schema_url else b""
        # (key, value) -> (type of value, Span.attributes entry); the type because True == 1 == 1.0
        self._pieces: dict[tuple[str, Any], tuple[type, bytes]] = {}
        self.compiled = _compiled_attributes  # None: the Python loop (tests compare the two)

    def _attribute(self, item: tuple[str, Any]) -> bytes:
        """Span.attributes (9) entry of one (key, value), cached for strings, bools and small ints."""
        key, value = item
        piece = _len_field(0x4A, _key_value(key, value))
        kind = type(value)
        if (kind is str or kind is bool or (kind is int and -1 <= value < _CACHED_INTS)) and \
                len(self._pieces) < _CACHE_MAX:
            self._pieces[item] = (kind, piece)
        return piece

    def _attribute_pieces(self, attributes: Mapping[str, Any]) -> list[bytes]:
        """Span.attributes (9) entries, cached pieces where the cache has them (the definition
        `_compiled_attributes` follows)."""
        pieces = self._pieces
        parts = []
        for item in attributes.items():
            try:
                kind, piece = pieces[item]
                if kind is not type(item[1]):
                    piece = _uncached_attribute(item)
            except KeyError:
                piece = self._attribute(item)
            except TypeError:  # a list: unhashable, encoded each time
                piece = _uncached_attribute(item)
            parts.append(piece)
        return parts

    def span(self, record: SpanRecord) -> bytes:
        """One Span message body."""
        pieces = self._pieces
        parts = [b"\x0A\x10", record.trace_id.to_bytes(16, "big"), b"\x12\x08", record.span_id.to_bytes(8, "big")]
        if record.parent_span_id:
            parts += (b"\x22\x08", record.parent_span_id.to_bytes(8, "big"))
        if record.name:
            parts.append(_len_field(0x2A, record.name.encode()))
        parts += (_KIND_INTERNAL, b"\x39", _FIXED64(record.start_ns), b"\x41", _FIXED64(record.end_ns))
        if self.compiled and type(record.attributes) is dict:
            parts.append(self.compiled(record.attributes, pieces, self._attribute, _uncached_attribute, _CACHED_INTS,
                                       _CACHE_MAX))
        else:
            parts += self._attribute_pieces(record.attributes)
        status = b""
        if record.status_code == 2 and record.status_message:
            status = _len_field(0x12, record.status_message.encode())
        if record.status_code:
            status += b"\x18" + _varint(record.status_code)
        parts.append(_len_field(0x7A, status))
        parts.append(_FLAGS_HAS_IS_REMOTE)
        return b"".join(parts)

    def request(self, records: Iterable[SpanRecord]) -> bytes:
        """An ExportTraceServiceRequest holding `records` under this encoder's resource and scope."""
        spans = b"".join(_len_field(0x12, self.span(record)) for record in records)
        scope_spans = self._scope_field + spans + self._scope_schema
        resource_spans = self._resource_field + _len_field(0x12, scope_spans) + self._resource_schema
        return _len_field(0x0A, resource_spans)
