"""The compiled OTLP decoder (mycroft/_otlp_fast.c) against its definition, records_from_lean.

The compiled path may leave any input to the Python one (decode_compiled returns None), but
where it answers, it must give exactly the lean decoder's records, and where the lean decoder
refuses an input the compiled path must refuse it too or step aside.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mycroft import otlp, schema
from mycroft.faults.bigjob import BigJob, Layout
from mycroft.otlp import DecodeCache, OtlpDecodeError, SpanRecord, parse_lean, records_from_lean, request_from_records

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from edge_fuzz import mutate, seed_records

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
VALID: bytes = request_from_records(seed_records()).SerializeToString()
# caches for single requests: a default DecodeCache allocates two 10 MB memo tables (2^17 entries), which
# was most of each fuzz example's time (and far more under ASan); 4096 entries hold any request here
SMALL = 4096


def _lean(payload: bytes, cache: DecodeCache) -> list[SpanRecord] | None:
    try:
        return records_from_lean(parse_lean(payload), cache)
    except OtlpDecodeError:
        return None


def _compiled(payload: bytes, cache: DecodeCache) -> tuple[str, list[SpanRecord] | None]:
    try:
        found = cache.decode_compiled(payload)
    except OtlpDecodeError:
        return "refused", None
    return ("stepped aside", None) if found is None else ("decoded", found)


def _agrees(payload: bytes, warm: bool = False) -> str:
    lean_cache, compiled_cache = DecodeCache(SMALL), DecodeCache(SMALL)
    if warm:
        _lean(VALID, lean_cache)
        _compiled(VALID, compiled_cache)
    expected = _lean(payload, lean_cache)
    outcome, records = _compiled(payload, compiled_cache)
    if outcome == "decoded":
        assert records == expected
    elif outcome == "refused":
        assert expected is None, "the compiled decoder refused what the lean one accepts"
    return outcome


def test_the_compiled_decoder_is_built() -> None:
    """The set-up builds it (pip install -e .): the suite must exercise it, not its absence."""
    assert otlp._otlp_fast is not None
    assert DecodeCache().decode_compiled(VALID) is not None


def test_simulated_heartbeats_and_op_spans_decode_alike() -> None:
    """The instrumentation's own encoders (the simulator's wire bytes): heartbeats with flows and
    digests, op spans, a hung tick; cold and warm caches, the memo's counters alike."""
    job = BigJob("fast", Layout(256, 8), 10, fault_rank=77, fault_at=1_004.0)
    lean_cache, compiled_cache = DecodeCache(), DecodeCache()
    ranks = list(range(256))
    for k in range(8):
        now = 1_000.0 + k
        job.tick(now)
        payloads = [job.heartbeat_bytes(ranks, now), job.op_span_bytes(ranks, now)[0]]
        for payload in payloads:
            expected = records_from_lean(parse_lean(payload), lean_cache)
            found = compiled_cache.decode_compiled(payload)
            assert found is not None and found == expected
    # a heartbeat's KeyValues that repeat its process's last one come from that one (Template), not the memo
    assert 0 < compiled_cache.misses < lean_cache.misses
    assert compiled_cache.memo is not None and 0 < len(compiled_cache.memo) <= len(lean_cache.values)


def test_the_memo_is_bounded() -> None:
    """Full, it starts over (as DecodeCache's dict): decoding goes on, right, with a tiny memo."""
    job = BigJob("bounded", Layout(64, 8), 10, fault_rank=5, fault_at=1_003.0)
    lean_cache, compiled_cache = DecodeCache(), DecodeCache(max_entries=7)
    for k in range(5):
        job.tick(1_000.0 + k)
        payload = job.heartbeat_bytes(list(range(64)), 1_000.0 + k)
        assert compiled_cache.decode_compiled(payload) == records_from_lean(parse_lean(payload), lean_cache)
        assert compiled_cache.memo is not None and len(compiled_cache.memo) <= 7


def test_values_of_every_shape() -> None:
    """Each attribute shape the Python path knows, including those the C code leaves to it."""
    values = [0, -1, 1 << 62, -(1 << 63), 1.5, float("inf"), True, False, "", "x" * 300, "é✓",
              [1, 2, 3], [0.5, 1.5], ["a", ""], [True, False], [], [[1, 2], [3]], [1, "a", 2.5],
              list(range(2000))]
    attrs = {f"k{i}": v for i, v in enumerate(values)} | {schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT}
    record = SpanRecord(trace_id=(1 << 127) + 5, span_id=(1 << 63) + 1, name="n", start_ns=1, end_ns=(1 << 64) - 1,
                        attributes=attrs, resource={schema.RES_JOB_ID: "j"}, parent_span_id=9, status_code=2,
                        status_message="boom", scope="s")
    payload = request_from_records([record, record]).SerializeToString()
    assert _agrees(payload) == "decoded"
    assert DecodeCache().decode_compiled(payload) == [record, record]


@FUZZ
@given(st.randoms(use_true_random=False))
def test_mutated_requests(rng: random.Random) -> None:
    _agrees(mutate(VALID, rng), warm=rng.random() < 0.5)


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes(data: bytes) -> None:
    _agrees(data)


@pytest.mark.fuzz
def test_mutations_mostly_decode_in_c() -> None:
    """The compiled path must not quietly step aside from what the lean one accepts (that would hide a bug)."""
    rng = random.Random(7)
    accepted = decoded = 0
    for _ in range(1500):
        payload = mutate(VALID, rng)
        outcome = _agrees(payload)
        if _lean(payload, DecodeCache(SMALL)) is not None:
            accepted += 1
            decoded += outcome == "decoded"
    assert accepted >= 20 and decoded >= 0.8 * accepted, (accepted, decoded)


@pytest.mark.parametrize("cut", [1, 7, 100])
def test_truncated_requests_step_aside_or_refuse(cut: int) -> None:
    assert _agrees(VALID[:-cut]) in ("stepped aside", "refused")


def test_records_are_filled_in_directly_or_by_calling_another_record_type() -> None:
    """SpanRecord's slots are set in C; a record type of another layout (no slots, a __post_init__)
    is called instead, with the same values. Decoded records are atoms in lists and dicts, left
    out of the cyclic GC; the resource a process repeats is one dict."""
    import dataclasses
    import gc

    cache = DecodeCache()
    records = cache.decode_compiled(VALID)
    assert records is not None and records == _lean(VALID, DecodeCache())
    assert not gc.is_tracked(records[0]) and not gc.is_tracked(records[0].attributes)
    again = cache.decode_compiled(VALID)
    assert again is not None and again[0].resource is records[0].resource

    seen: list[str] = []

    @dataclasses.dataclass
    class Checked(SpanRecord):
        def __post_init__(self) -> None:
            seen.append(self.name)

    assert otlp._otlp_fast is not None
    fields = [f.name for f in dataclasses.fields(SpanRecord)]
    other = otlp._otlp_fast.decode(VALID, otlp._otlp_fast.Memo(64), otlp.VOLATILE_KEYS, cache._miss,
                                   cache.resource_bytes, Checked, otlp.MAX_ATTRIBUTES, otlp._otlp_fast.Memo(64))
    assert other is not None
    assert [type(r) for r in other[0]] == [Checked] * len(records) and seen == [r.name for r in records]
    assert [[getattr(r, f) for f in fields] for r in other[0]] == [[getattr(r, f) for f in fields] for r in records]


def _beat(rank: int, attrs: dict[str, object], name: str = schema.SPAN_HEARTBEAT) -> SpanRecord:
    return SpanRecord(trace_id=rank + 1, span_id=rank + 7, name=name, start_ns=1, end_ns=2, attributes=attrs,
                      resource={schema.RES_JOB_ID: "tmpl", schema.RES_RANK: rank}, scope="s")


def test_a_heartbeat_decodes_against_its_process_last_one() -> None:
    """Heartbeats of the same processes, request after request, each changing a few attributes at
    random (values, shapes, how many, their order) with op spans of the same processes in
    between: every request decodes exactly as the lean decoder does with no history; a value a
    process repeats is its last heartbeat's very object (floats too, which the memo never holds);
    a tiny resource memo (cleared all the time) changes nothing but speed."""
    rng = random.Random(11)
    pool: list[object] = [0, 1, -5, 2.5, 0.0, "a", "", "x" * 40, [1, 2], [0.25], ["p", "q"], [], True, [[1], [2]]]
    for resources in (1 << 17, 2):
        cache = DecodeCache()
        assert cache.resource_memo is not None
        cache.resource_memo = otlp._otlp_fast.Memo(resources) if otlp._otlp_fast is not None else None
        beats = {rank: {f"k{i}": rng.choice(pool) for i in range(12)} for rank in range(3)}
        last: dict[int, dict[str, object]] = {}
        for _ in range(60):
            records = []
            for rank, attrs in beats.items():
                for _ in range(rng.randrange(3)):
                    key = f"k{rng.randrange(14)}"
                    if rng.random() < 0.15:
                        attrs.pop(key, None)
                    else:
                        attrs[key] = rng.choice(pool)
                if rng.random() < 0.1:
                    items = list(attrs.items())
                    rng.shuffle(items)
                    beats[rank] = attrs = dict(items)
                records.append(_beat(rank, dict(attrs)))
                if rng.random() < 0.3:
                    records.append(_beat(rank, {"k0": rng.choice(pool)}, name="all_reduce"))
            payload = request_from_records(records).SerializeToString()
            found = cache.decode_compiled(payload)
            assert found is not None and found == records_from_lean(parse_lean(payload), DecodeCache())
            for record in found:
                if record.name != schema.SPAN_HEARTBEAT:
                    continue
                rank = int(record.resource[schema.RES_RANK])
                before = last.get(rank)
                if before is not None and resources > 2 and list(before) == list(record.attributes):
                    for key, value in record.attributes.items():
                        same = before[key] == value and type(before[key]) is type(value)
                        if same and isinstance(value, float | list):
                            assert before[key] is value, key
                last[rank] = record.attributes
