"""Property-based fuzzing of the OTLP decoders (hypothesis), and a short seeded run of
mutated requests against live receivers (the long run: benchmarks/edge_fuzz.py).

A decoder may return records or raise OtlpDecodeError, nothing else; a receiver answers
every request with a status from its documented set and keeps serving."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from mycroft.otlp import (
    DecodeCache,
    OtlpDecodeError,
    SpanRecord,
    _fast_kv,
    _from_any,
    _to_any,
    decode_json,
    decode_protobuf,
    encode_json,
    request_from_records,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from edge_fuzz import RCA_HTTP_CODES, fuzz_grpc, fuzz_http, mutate, seed_records

from .conftest import SpanSink

FUZZ = settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
VALID: bytes = request_from_records(seed_records()).SerializeToString()
VALID_JSON: dict = encode_json(seed_records())

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=12), children, max_size=5),
    max_leaves=30)


def _decodes_or_refuses(fn, payload) -> list[SpanRecord] | None:  # type: ignore[no-untyped-def]
    try:
        return list(fn(payload))
    except OtlpDecodeError:
        return None


@FUZZ
@given(st.binary(max_size=2048))
def test_protobuf_decoder_on_random_bytes(data: bytes) -> None:
    _decodes_or_refuses(decode_protobuf, data)


@FUZZ
@given(st.randoms(use_true_random=False))
def test_protobuf_decoder_on_mutated_requests(rng: random.Random) -> None:
    records = _decodes_or_refuses(decode_protobuf, mutate(VALID, rng))
    for record in records or []:
        assert isinstance(record.attributes, dict) and isinstance(record.job_id, str)
        _ = record.rank, record.kind  # the properties the services read must not raise


@FUZZ
@given(st.randoms(use_true_random=False))
def test_lean_cached_decoder_matches_the_full_one(rng: random.Random) -> None:
    """The receivers' fast path (lean upb schema + memo by bytes) gives exactly the full decoder's
    records wherever the full decoder accepts the input, cold and with a warm cache."""
    payload = mutate(VALID, rng)
    full = _decodes_or_refuses(decode_protobuf, payload)
    warm = DecodeCache()
    _decodes_or_refuses(warm.decode, VALID)
    for cache in (DecodeCache(), warm, warm):
        lean = _decodes_or_refuses(cache.decode, payload)
        if full is not None:  # the lean schema skips fields it does not read (events, links): it may accept more
            assert lean == full


scalars = st.none() | st.booleans() | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1) | \
    st.floats(allow_nan=False) | st.text(max_size=200)


@FUZZ
@given(st.text(max_size=140), st.recursive(scalars, lambda children: st.lists(children, max_size=40), max_leaves=60))
def test_fast_key_value_decoding_equals_protobuf(key: str, value: object) -> None:
    kv = KeyValue(key=key) if value is None else KeyValue(key=key, value=_to_any(value))
    raw = kv.SerializeToString()
    fast = _fast_kv(raw)
    if fast is not None:
        assert fast == (key, _from_any(KeyValue.FromString(raw).value))


@FUZZ
@given(json_values)
def test_json_decoder_on_arbitrary_json(value: object) -> None:
    _decodes_or_refuses(decode_json, json.dumps(value).encode())


@FUZZ
@given(st.randoms(use_true_random=False), json_values)
def test_json_decoder_on_valid_documents_with_a_field_replaced(rng: random.Random, value: object) -> None:
    document = json.loads(json.dumps(VALID_JSON))
    node = document
    path = []
    while isinstance(node, dict | list) and node:  # walk to a random place and put junk there
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append(key)
        if rng.random() < 0.3 or not isinstance(node[key], dict | list):
            node[key] = value
            break
        node = node[key]
    _decodes_or_refuses(decode_json, json.dumps(document).encode())


@pytest.mark.parametrize("seed", [1, 2])
def test_seeded_requests_against_live_receivers(seed: int) -> None:
    """150 HTTP and 75 gRPC cases per seed against a real OtlpReceiver: never a crash, never a 5xx."""
    from mycroft.http_server import HttpLimits
    from mycroft.otlp_server import OtlpReceiver

    sink = SpanSink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", "127.0.0.1:0",
                            limits=HttpLimits(idle_timeout_s=2.0, body_timeout_s=0.5)).start()
    try:
        http_codes = fuzz_http(receiver.http_port or 0, 150, random.Random(seed))
        grpc_codes = fuzz_grpc(receiver.grpc_port or 0, 75, random.Random(seed))
    finally:
        receiver.stop(0)
    assert set(http_codes) <= RCA_HTTP_CODES, http_codes
    assert 200 in http_codes and 400 in http_codes
    assert set(grpc_codes) <= {"OK", "INVALID_ARGUMENT"}, grpc_codes
