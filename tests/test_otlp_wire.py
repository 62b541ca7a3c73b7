"""mycroft/otlp_wire.py writes the very request the OTLP exporter's own encoder builds.

Parsed with the protobuf library and compared message to message with `encode_spans` of the
ReadableSpans export.to_readable_span makes: op spans, failed ones, children, heartbeats with
arrays, every AnyValue type, and the cache's corner (True == 1 == 1.0 under one key).
"""

from __future__ import annotations

import random

import pytest
from mycroft.instrumentation.export import _SCOPE, to_readable_span
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource

from mycroft import schema
from mycroft.faults.made_up_job import Group, InFlightOp, collective, heartbeat
from mycroft.otlp import SpanRecord
from mycroft.otlp_wire import WireEncoder

RESOURCE = Resource.create({schema.RES_JOB_ID: "wire", schema.RES_RANK: 3, schema.RES_WORLD_SIZE: 8,
                            "service.name": "wire-test", "x.float": 0.5, "x.list": ["a", "b"]})


def _encoder(resource: Resource = RESOURCE) -> WireEncoder:
    return WireEncoder(resource.attributes, _SCOPE.name, _SCOPE.version or "", resource.schema_url)


def _library(records: list[SpanRecord], resource: Resource = RESOURCE) -> ExportTraceServiceRequest:
    return encode_spans([to_readable_span(record, resource) for record in records])


def _ours(records: list[SpanRecord], encoder: WireEncoder | None = None) -> ExportTraceServiceRequest:
    return ExportTraceServiceRequest.FromString((encoder or _encoder()).request(records))


def _mixed(seed: int) -> list[SpanRecord]:
    rng = random.Random(seed)
    group = Group("7", tuple(range(8)))
    out: list[SpanRecord] = []
    for seq in range(1, 60):
        state = rng.choice([schema.STATE_COMPLETED, schema.STATE_COMPLETED, schema.STATE_ERROR, schema.STATE_TIMEOUT])
        record = collective("wire", 3, 8, group, seq, 100.0 + seq, 100.0 + seq + rng.random(), state=state)
        if rng.random() < 0.3:
            record.parent_span_id = rng.getrandbits(64) or 1
        out.append(record)
    out.append(heartbeat("wire", 3, 8, 160.0, 5, [group], [60], [59], [InFlightOp(group, 60, age_s=1.5)],
                         idle_s=0.25, stack="main\n  step()", final=True, exit_reason="SIGTERM"))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_request_is_the_libraries_for_op_spans_and_heartbeats(seed: int) -> None:
    records = _mixed(seed)
    assert _ours(records) == _library(records)


def test_every_value_type_and_status() -> None:
    odd = SpanRecord(
        trace_id=(1 << 128) - 1, span_id=(1 << 64) - 1, name="ödd ✓", start_ns=0, end_ns=2**63 + 5,
        attributes={"s": "", "u": "naïve", "t": True, "f": False, "zero": 0, "neg": -1, "big": 2**62,
                    "minus": -(2**63), "d": 1.25, "nan_free": -0.0, "empty": [], "ints": [1, -2, 300],
                    "strs": ["x", ""], "bools": [True, False], "floats": [0.5], "kv": {"a": 1, "b": "c"},
                    "raw": b"\x00\xff", "none": None},
        status_code=2, status_message="boom: ünïcode")
    unset = SpanRecord(trace_id=5, span_id=6, name="", start_ns=1, end_ns=1, status_code=0)
    ok_with_message = SpanRecord(trace_id=5, span_id=7, name="n", start_ns=1, end_ns=2, status_code=1,
                                 status_message="dropped: only errors carry one")
    assert _ours([odd, unset, ok_with_message]) == _library([odd, unset, ok_with_message])


def test_one_key_with_values_equal_across_types_is_never_confused() -> None:
    encoder = _encoder()
    spans = [SpanRecord(trace_id=9, span_id=i + 1, name="k", start_ns=1, end_ns=2, attributes={"k": value})
             for i, value in enumerate([True, 1, 1.0, 1, True, 0, False, 0.0])]
    for _ in range(2):  # the second pass reads every piece from the cache
        assert _ours(spans, encoder) == _library(spans)


def test_an_empty_batch_and_a_bare_resource() -> None:
    bare = Resource({})
    assert _ours([], _encoder(bare)) == ExportTraceServiceRequest.FromString(_encoder(bare).request([]))
    one = _mixed(4)[:1]
    assert _ours(one, _encoder(bare)) == _library(one, bare)


def test_the_compiled_attribute_loop_writes_the_python_loops_bytes() -> None:
    """WireEncoder.span's attribute loop in C (mycroft/_otlp_fast.c) against its Python definition, byte
    for byte and cache entry for cache entry: every value type, ints at each varint and int64 edge and
    past it, values equal across types under one key, unhashable lists, non-ASCII keys, cache hits
    (second pass) and a full cache."""
    import mycroft.otlp_wire as wire

    assert wire._compiled_attributes is not None  # the set-up builds it
    rng = random.Random(5)
    edges = [0, 1, 127, 128, 16383, 16384, wire._CACHED_INTS - 1, wire._CACHED_INTS, 2**31, 2**63 - 1, 2**63,
             2**64 - 1, 2**64, 2**70, -1, -2, -(2**63), -(2**63) - 1]
    values: list[object] = [*edges, True, False, 0.0, -0.0, 1.5, "", "x", "ünï", [1, 2], ["a"], [], b"\x00"]
    spans = []
    for i in range(400):
        attributes = {f"k{rng.randrange(6)}": rng.choice(values) for _ in range(rng.randrange(0, 12))}
        attributes["seq"] = rng.choice(edges) + i
        attributes["clé"] = rng.choice(values)
        spans.append(SpanRecord(trace_id=i + 1, span_id=i + 2, name="op", start_ns=i, end_ns=i + 5,
                                attributes=attributes))
    compiled, python = _encoder(), _encoder()
    python.compiled = None
    for _ in range(2):
        assert [compiled.span(s) for s in spans] == [python.span(s) for s in spans]
    assert compiled._pieces == python._pieces
    full_c, full_py = _encoder(), _encoder()
    full_py.compiled = None
    for encoder in (full_c, full_py):  # past the cache's size new pieces are encoded each time
        encoder._pieces.update({("filler", n): (int, b"") for n in range(wire._CACHE_MAX)})
    assert [full_c.span(s) for s in spans] == [full_py.span(s) for s in spans]
    assert len(full_c._pieces) == len(full_py._pieces) == wire._CACHE_MAX
