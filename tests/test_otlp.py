"""OTLP <-> SpanRecord codec and the shared receiver: real gRPC and HTTP, malformed input."""

from __future__ import annotations

import gzip
import json
import urllib.error
import urllib.request

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from mycroft import schema
from mycroft.otlp import OtlpDecodeError, SpanRecord, decode_json, decode_protobuf, encode_json, request_from_records
from mycroft.otlp_server import OtlpReceiver
from tests.conftest import SpanSink


def _record(rank: int = 1) -> SpanRecord:
    return SpanRecord(
        trace_id=schema.collective_trace_id("j", "g", 1), span_id=schema.rank_span_id(1, rank), name="all_reduce",
        start_ns=10, end_ns=20,
        attributes={schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE, schema.ATTR_SEQ: 1, schema.ATTR_ASYNC: False,
                    schema.ATTR_HB_INFLIGHT_AGES_S: [0.5, 1.5], schema.ATTR_GROUP_RANKS: "0-3"},
        resource={schema.RES_RANK: rank, schema.RES_JOB_ID: "j"},
    )


def test_protobuf_and_json_round_trip() -> None:
    records = [_record(0), _record(1)]
    again = decode_protobuf(request_from_records(records).SerializeToString())
    assert again == records
    assert decode_json(json.dumps(encode_json(records))) == records
    assert again[1].rank == 1 and again[1].job_id == "j"


@pytest.mark.parametrize("payload", [b"\xff\x00garbage", b"{", b"[1,2]", b'{"resourceSpans": [{"scopeSpans": '
                                     b'[{"spans": [{"traceId": "zz"}]}]}]}'])
def test_malformed_payloads_raise_a_clear_error(payload: bytes) -> None:
    with pytest.raises(OtlpDecodeError):
        if payload.startswith((b"{", b"[")):
            decode_json(payload)
        else:
            decode_protobuf(payload)


def test_receiver_serves_grpc_http_protobuf_json_and_survives_garbage() -> None:
    sink = SpanSink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", "127.0.0.1:0").start()
    try:
        url = f"http://127.0.0.1:{receiver.http_port}/v1/traces"
        body = request_from_records([_record(0)]).SerializeToString()
        bad = urllib.request.Request(url, data=b"\x00\xffnot-protobuf",
                                     headers={"Content-Type": "application/x-protobuf"})
        with pytest.raises(urllib.error.HTTPError) as error:
            urllib.request.urlopen(bad, timeout=5)
        assert error.value.code == 400 and b"bad OTLP request" in error.value.read()
        good = urllib.request.Request(url, data=gzip.compress(body), headers={
            "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
        assert urllib.request.urlopen(good, timeout=5).status == 200
        as_json = urllib.request.Request(url, data=json.dumps(encode_json([_record(2)])).encode(),
                                         headers={"Content-Type": "application/json"})
        assert urllib.request.urlopen(as_json, timeout=5).status == 200
        with grpc.insecure_channel(f"127.0.0.1:{receiver.grpc_port}") as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)
            stub.Export(request_from_records([_record(3)]), timeout=5)
        assert sorted(record.rank for record in sink.snapshot() if record.rank is not None) == [0, 2, 3]
    finally:
        receiver.stop(0)
