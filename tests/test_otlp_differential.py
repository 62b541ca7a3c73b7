"""Differential fuzzing of the two OTLP decoders on the varint encodings protobuf allows and refuses.

Both decoders follow one rule, protobuf's as upb applies it (upb is what the Python path parses
with): a varint is at most 10 bytes and its value is taken mod 2^64 (bits past 63 in the 10th
byte are dropped); a tag or a length is at most 5 bytes, however small its value (6-10 bytes:
malformed). The compiled decoder (mycroft/_otlp_fast.c) may step aside on any input (the Python
path then answers), but where it answers it must give the Python path's records, and it must not
accept what the Python path refuses. The Python path itself has two readers of a KeyValue (the
fast one, mycroft.otlp._fast_kv, and upb): they must agree too.

Issue 43: Python's fast reader did not mask a 10-byte int to 64 bits (an int_value written
ff ff ff ff ff ff ff ff ff 7f read as 2^70 - 1, upb reads -1), and the compiled decoder took tags
and lengths written in 6-10 bytes that upb refuses.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from mycroft import otlp
from mycroft.otlp import (
    DecodeCache,
    OtlpDecodeError,
    SpanRecord,
    _from_any,
    _kv_from_bytes,
    _to_any,
    parse_lean,
    records_from_lean,
    request_from_records,
)

sys.path.insert(0, str(Path(__file__).resolve().parent / ".." / "benchmarks"))
from edge_fuzz import seed_records

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
VALID: bytes = request_from_records(seed_records()).SerializeToString()
U64 = (1 << 64) - 1
SMALL = 256  # cache entries: a default DecodeCache allocates two 10 MB memo tables, most of each example's time

pytestmark = pytest.mark.skipif(otlp._otlp_fast is None, reason="the compiled decoder is not built "
                                "(test_otlp_fast.test_the_compiled_decoder_is_built fails for that)")


# ---------------------------------------------------------------------------------------------
# wire helpers: any encoding, canonical or not
# ---------------------------------------------------------------------------------------------
def varint(value: int, width: int | None = None) -> bytes:
    """value (>= 0, < 2^(7 * width)) in exactly `width` bytes (default: the fewest)."""
    n = width or max(1, (value.bit_length() + 6) // 7)
    assert 0 <= value < 1 << (7 * n), (value, n)
    return bytes(((value >> (7 * i)) & 0x7F) | (0x80 if i < n - 1 else 0) for i in range(n))


def minimal(value: int) -> int:
    return len(varint(value))


def field(number: int, wire: int, payload: bytes | int, tag_width: int | None = None,
          len_width: int | None = None) -> bytes:
    head = varint(number << 3 | wire, tag_width)
    if wire == 2:
        assert isinstance(payload, bytes)
        return head + varint(len(payload), len_width) + payload
    if wire == 0:
        assert isinstance(payload, int)
        return head + varint(payload)
    assert isinstance(payload, bytes)
    return head + payload


def parse(buf: bytes) -> list[tuple[int, int, bytes | int]] | None:
    """A message's fields (number, wire, payload: bytes, or the varint's value); None when the bytes
    are not a message (any varint width accepted: this only builds inputs)."""
    out: list[tuple[int, int, bytes | int]] = []
    pos, n = 0, len(buf)

    def read() -> int | None:
        nonlocal pos
        value = shift = 0
        while pos < n and shift < 77:
            byte = buf[pos]
            pos += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value
            shift += 7
        return None

    while pos < n:
        tag = read()
        if tag is None or tag >> 3 == 0:
            return None
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            value = read()
            if value is None:
                return None
            out.append((number, 0, value))
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > n:
                return None
            out.append((number, wire, buf[pos:pos + size]))
            pos += size
        elif wire == 2:
            length = read()
            if length is None or pos + length > n:
                return None
            out.append((number, 2, buf[pos:pos + length]))
            pos += length
        else:
            return None
    return out


class Rewriter:
    """Re-encodes a message with chosen varints (tags, lengths, values, counted in the order they are
    written, nested messages included) given other widths; everything else canonical."""

    def __init__(self, changes: dict[int, tuple[str, int]]) -> None:
        self.changes = changes  # index -> ("width", n) or ("junk", bits above 63 for a 10-byte value)
        self.count = 0

    def _varint(self, value: int) -> bytes:
        index = self.count
        self.count += 1
        change = self.changes.get(index)
        if change is None:
            return varint(value)
        kind, arg = change
        if kind == "junk":
            return varint((value & U64) | (arg << 64), 10)
        return varint(value, max(arg, minimal(value)))

    def message(self, buf: bytes, depth: int = 0) -> bytes:
        fields = parse(buf) if depth < 8 else None
        if fields is None:
            return buf
        out = bytearray()
        for number, wire, payload in fields:
            out += self._varint(number << 3 | wire)
            if wire == 0:
                assert isinstance(payload, int)
                out += self._varint(payload)
            elif wire == 2:
                assert isinstance(payload, bytes)
                inner = self.message(payload, depth + 1)
                out += self._varint(len(inner)) + inner
            else:
                assert isinstance(payload, bytes)
                out += payload
        return bytes(out)


def rewrite(buf: bytes, rng: random.Random) -> bytes:
    """1-3 of the message's varints re-encoded: padded to 2-11 bytes, or (values) 10 bytes with junk
    above bit 63."""
    counter = Rewriter({})
    counter.message(buf)
    changes: dict[int, tuple[str, int]] = {}
    for _ in range(rng.randint(1, 3)):
        index = rng.randrange(counter.count)
        changes[index] = ("junk", rng.randrange(1, 64)) if rng.random() < 0.25 else ("width", rng.randint(2, 11))
    return Rewriter(changes).message(buf)


# ---------------------------------------------------------------------------------------------
# the two decoders
# ---------------------------------------------------------------------------------------------
def python_path(payload: bytes) -> list[SpanRecord] | None:
    """The definition: upb's lean parse, then the Python KeyValue readers (fast, else upb)."""
    try:
        return records_from_lean(parse_lean(payload), DecodeCache(SMALL))
    except OtlpDecodeError:
        return None


def compiled(payload: bytes) -> tuple[str, list[SpanRecord] | None]:
    try:
        found = DecodeCache(SMALL).decode_compiled(payload)
    except OtlpDecodeError:
        return "refused", None
    return ("stepped aside", None) if found is None else ("decoded", found)


def agree(payload: bytes) -> str:
    """Identical records or identical refusal; returns the compiled decoder's outcome."""
    expected = python_path(payload)
    outcome, records = compiled(payload)
    if outcome == "decoded":
        assert expected is not None, "the compiled decoder accepted what the Python path refuses"
        assert records == expected
    elif outcome == "refused":
        assert expected is None, "the compiled decoder refused what the Python path accepts"
    # and what the receivers call (compiled, else Python) is the Python path's answer
    try:
        through = DecodeCache(SMALL).decode(payload)
    except OtlpDecodeError:
        through = None
    assert through == expected
    return outcome


def request_with(kvs: list[bytes], tag_width: int | None = None, len_width: int | None = None,
                 name: str = "op") -> bytes:
    """One span carrying these serialized KeyValues; the span's, scope's and request's own tags
    and lengths written in tag_width / len_width bytes."""
    resource = Resource(attributes=[KeyValue(key="mycroft.job.id", value=_to_any("j"))]).SerializeToString()
    span = (field(1, 2, bytes(range(1, 17)), tag_width, len_width) + field(2, 2, bytes(range(1, 9)), tag_width,
                                                                           len_width)
            + field(5, 2, name.encode(), tag_width, len_width) + field(7, 1, (5).to_bytes(8, "little"), tag_width)
            + field(8, 1, (9).to_bytes(8, "little"), tag_width)
            + b"".join(field(9, 2, kv, tag_width, len_width) for kv in kvs))
    scope_spans = field(2, 2, span, tag_width, len_width)
    resource_spans = field(1, 2, resource, tag_width, len_width) + field(2, 2, scope_spans, tag_width, len_width)
    return field(1, 2, resource_spans, tag_width, len_width)


def int_kv(key: str, raw_varint: bytes, key_tag_width: int | None = None, key_len_width: int | None = None) -> bytes:
    """KeyValue{key, AnyValue{int_value: the varint as written}}."""
    any_value = b"\x18" + raw_varint
    return field(1, 2, key.encode(), key_tag_width, key_len_width) + field(2, 2, any_value)


def as_int64(value: int) -> int:
    value &= U64
    return value - (1 << 64) if value >= 1 << 63 else value


# ---------------------------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------------------------
@FUZZ
@given(st.integers(min_value=0, max_value=(1 << 70) - 1), st.integers(min_value=1, max_value=11))
def test_int_values_in_any_width_read_alike(value: int, width: int) -> None:
    """An int_value written in `width` bytes (10: any junk above bit 63; 11: over-long): Python's fast
    reader, upb and the compiled decoder read the same int64, or all refuse."""
    width = max(width, minimal(value))  # values of 64-70 bits: 10 bytes, junk above bit 63
    kv = int_kv("k", varint(value, width))
    try:
        upb: object = _from_any(KeyValue.FromString(kv).value)
    except Exception:  # protobuf's DecodeError
        upb = None
    try:
        ours: object = _kv_from_bytes(kv)[1]
    except OtlpDecodeError:
        ours = None
    assert ours == upb
    if width <= 10:
        assert upb == as_int64(value)
    else:
        assert upb is None
    payload = request_with([kv])
    outcome = agree(payload)
    # over-long: the compiled decoder hands the KeyValue to Python's reader, which refuses it
    assert outcome == "decoded" if width <= 10 else outcome != "decoded"
    if width <= 10:
        assert python_path(payload)[0].attributes["k"] == as_int64(value)  # type: ignore[index]


@pytest.mark.parametrize("where", ["key_tag", "key_len", "span_tags", "span_lens"])
@pytest.mark.parametrize("width", range(1, 11))
def test_tags_and_lengths_at_most_five_bytes(where: str, width: int) -> None:
    """A tag or a length padded to 1-10 bytes: up to 5 both decoders read it (the compiled one
    decodes, not steps aside), from 6 both refuse (the compiled one never decodes it)."""
    kv = int_kv("key", varint(7), key_tag_width=width if where == "key_tag" else None,
                key_len_width=width if where == "key_len" else None)
    payload = request_with([kv, int_kv("other", varint(1))], tag_width=width if where == "span_tags" else None,
                           len_width=width if where == "span_lens" else None)
    expected = python_path(payload)
    outcome = agree(payload)
    if width <= 5:
        assert expected is not None and expected[0].attributes == {"key": 7, "other": 1}
        assert outcome == "decoded"
    else:
        assert expected is None and outcome != "decoded"


@FUZZ
@given(st.randoms(use_true_random=False))
def test_requests_with_varints_rewidened(rng: random.Random) -> None:
    """The seed request (heartbeats and op spans) with 1-3 of its varints - tags, lengths, values, at
    any depth - written in 2-11 bytes or with junk above bit 63."""
    agree(rewrite(VALID, rng))


def test_rewritten_requests_are_not_all_refused() -> None:
    """The rewriter's inputs exercise both sides of the rule: some decode (compiled), some are refused."""
    rng = random.Random(43)
    outcomes = [agree(rewrite(VALID, rng)) for _ in range(150)]
    assert outcomes.count("decoded") >= 20 and outcomes.count("stepped aside") >= 20, outcomes


@FUZZ
@given(st.text(max_size=30), st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
       st.integers(min_value=1, max_value=7), st.integers(min_value=1, max_value=7))
def test_key_values_with_padded_tags_and_lengths(key: str, value: int, tag_width: int, len_width: int) -> None:
    """A KeyValue's own tag and key length padded: Python's readers and the compiled decoder agree."""
    kv = int_kv(key, varint(value & U64), key_tag_width=tag_width,
                key_len_width=max(len_width, minimal(len(key.encode()))))
    try:
        upb: object = (KeyValue.FromString(kv).key, _from_any(KeyValue.FromString(kv).value))
    except Exception:  # protobuf's DecodeError
        upb = None
    try:
        ours: object = _kv_from_bytes(kv)
    except OtlpDecodeError:
        ours = None
    assert ours == upb
    assert (upb is None) == (tag_width > 5 or max(len_width, minimal(len(key.encode()))) > 5)
    agree(request_with([kv]))
