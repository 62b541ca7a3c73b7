"""The processor core as a pure function: join, condensation, tail keeping, bounds."""

from __future__ import annotations

import pytest
from mycroft.collector_processor.config import ProcessorConfig
from mycroft.collector_processor.join import busbw_factor
from mycroft.collector_processor.pipeline import CollectorProcessor, Output

from mycroft import schema
from mycroft.faults import made_up_spans as syn
from mycroft.otlp import SpanRecord

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def summaries(out: Output) -> list[SpanRecord]:
    return [r for r in out.all() if r.name == schema.SPAN_COLLECTIVE_SUMMARY]


def kinds(out: Output, kind: str) -> list[SpanRecord]:
    return [r for r in out.all() if r.attributes.get(schema.ATTR_SPAN_KIND) == kind]


def test_summary_names_first_and_last_rank_and_skew() -> None:
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.5))
    arrivals = {0: 10 * MS, 1: 0, 2: 310 * MS, 3: 5 * MS}  # rank 1 first, rank 2 last by 310 ms
    spans = [syn.collective_span(r, 7, T0 + a, T0 + 320 * MS + r * MS) for r, a in arrivals.items()]
    out = proc.process(spans, now=100.0)
    assert [s.rank for s in out.normal] == [0, 1, 2, 3]  # rank spans pass through at once
    assert summaries(out) == []  # complete, but lingers for trailing native detail
    assert summaries(proc.tick(100.4)) == []
    (summary,) = summaries(proc.tick(100.5))
    a = summary.attributes
    assert a[schema.ATTR_SUM_FIRST_RANK] == 1
    assert a[schema.ATTR_SUM_LAST_RANK] == 2
    assert a[schema.ATTR_SUM_ARRIVAL_SKEW_S] == pytest.approx(0.310)
    assert a[schema.ATTR_SUM_RANKS] == [0, 1, 2, 3]
    assert a[schema.ATTR_SUM_MISSING_RANKS] == []
    assert a[schema.ATTR_SUM_COMPLETE] is True
    assert a[schema.ATTR_SUM_CLOSED] == schema.CLOSED_COMPLETE
    # rank 2 waited least (310 -> 322 ms), rank 1 most (0 -> 321 ms)
    assert a[schema.ATTR_SUM_DURATION_MIN_S] == pytest.approx(0.012)
    assert a[schema.ATTR_SUM_DURATION_SPREAD_S] == pytest.approx(0.309)
    assert a[schema.ATTR_SUM_DURATION_MAX_S] == pytest.approx(0.321)
    # effective time: last arrival (310 ms) -> last completion (323 ms)
    assert a[schema.ATTR_SUM_EFFECTIVE_S] == pytest.approx(0.013)
    algbw = (1 << 20) / 0.013 / 1e9
    assert a[schema.ATTR_SUM_ALGBW_GBPS] == pytest.approx(algbw)
    assert a[schema.ATTR_SUM_BUSBW_GBPS] == pytest.approx(algbw * 1.5)  # 2(n-1)/n, n=4
    assert a[schema.ATTR_SUM_ALGO] == "gloo"
    assert schema.ANOMALY_SKEWED in str(a[schema.ATTR_SUM_ANOMALY])
    # the summary belongs to the collective: no rank anywhere
    assert schema.ATTR_RANK not in a and schema.RES_RANK not in summary.resource
    assert summary.rank is None
    assert summary.trace_id == spans[0].trace_id
    assert summary.resource[schema.RES_JOB_ID] == syn.SERVICE


def test_missing_ranks_reported_when_window_closes() -> None:
    proc = CollectorProcessor(ProcessorConfig(window_s=5.0))
    spans = [syn.collective_span(r, 1, T0 + r * MS, T0 + 50 * MS) for r in (0, 1, 3)]
    assert summaries(proc.process(spans, now=0.0)) == []
    assert summaries(proc.tick(4.9)) == []
    (summary,) = summaries(proc.tick(5.0))
    a = summary.attributes
    assert a[schema.ATTR_SUM_MISSING_RANKS] == [2]
    assert a[schema.ATTR_SUM_COMPLETE] is False
    assert a[schema.ATTR_SUM_CLOSED] == schema.CLOSED_TIMEOUT
    assert schema.ANOMALY_INCOMPLETE in str(a[schema.ATTR_SUM_ANOMALY])
    assert summary.status_code == 2
    assert proc.counters.get("summaries_incomplete") == 1
    # the straggler's span after the window closed: passed through, counted, no second summary
    late = proc.process([syn.collective_span(2, 1, T0 + 9000 * MS, T0 + 9001 * MS)], now=6.0)
    assert [r.rank for r in late.normal] == [2] and summaries(late) == []
    assert proc.counters.get("late_spans") == 1


def test_heartbeats_pass_untouched_in_the_urgent_lane() -> None:
    proc = CollectorProcessor()
    hb = syn.heartbeat_span(3, 17, T0)
    before = dict(hb.attributes)
    out = proc.process([syn.collective_span(0, 1, T0, T0 + MS), hb], now=0.0)
    assert out.urgent == [hb]
    assert hb.attributes == before and hb.scope == schema.INSTRUMENTATION_SCOPE
    assert proc.counters.get("heartbeats") == 1


def test_native_detail_condensed_into_flow_summaries() -> None:
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.0))
    shape = syn.StepDetail(channels=2, steps=8, counter_samples=2)
    batch = next(syn.training_run(1, step_detail=shape, heartbeat_every=0, skew_ns=10_000))
    n_detail = sum(1 for r in batch if r.name in (schema.SPAN_NATIVE_STEP, schema.SPAN_NATIVE_FLOW))
    assert n_detail == 4 * 2 * 2 * (8 + 2)
    out = proc.process(batch, now=0.0)
    out.extend(proc.tick(0.0))
    flows = kinds(out, schema.KIND_FLOW_SUMMARY)
    assert len(flows) == 4 * 2 * 2  # rank x channel x direction
    assert not [r for r in out.all() if r.name == schema.SPAN_NATIVE_STEP]  # raw detail condensed away
    (summary,) = summaries(out)
    assert summary.attributes[schema.ATTR_SUM_ANOMALY] == ""
    assert summary.attributes[schema.ATTR_SUM_FLOWS] == 16
    assert summary.attributes[schema.ATTR_SUM_DETAIL_SPANS] == n_detail
    assert summary.attributes[schema.ATTR_SUM_ALGO] == "Ring"
    assert summary.attributes[schema.ATTR_SUM_PROTO] == "Simple"
    send = next(f for f in flows if f.attributes[schema.ATTR_NCCL_IS_SEND] and f.rank == 1)
    a = send.attributes
    assert a[schema.ATTR_PEER] == 2 and a[schema.ATTR_FLOW_SUM_STEPS] == 8
    assert a[schema.ATTR_FLOW_DONE] == 8 and a[schema.ATTR_FLOW_STALL_STATE] == schema.FLOW_STATE_COMPLETE
    assert a[schema.ATTR_FLOW_SUM_BYTES] == 8 * shape.chunk_size
    assert a[schema.ATTR_FLOW_SUM_RAW_SPANS] == 10
    assert send.resource[schema.RES_RANK] == 1  # a flow belongs to its rank
    assert proc.counters.get("detail_condensed") == n_detail
    assert proc.counters.get("detail_kept") == 0


def test_anomalous_collective_keeps_raw_detail_with_reason() -> None:
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.0, skew_threshold_s=0.05))
    shape = syn.StepDetail(channels=1, steps=4, counter_samples=1)
    spans: list[SpanRecord] = []
    for rank in range(4):
        arrival = T0 + (200 * MS if rank == 3 else 0)
        spans.append(syn.collective_span(rank, 5, arrival, T0 + 210 * MS))
        spans += syn.native_detail(rank, 5, arrival, T0 + 210 * MS, shape, stall_at=2 if rank == 3 else None)
    out = proc.process(spans, now=0.0)
    out.extend(proc.tick(0.0))
    kept = [r for r in out.all() if r.attributes.get(schema.ATTR_SUM_KEPT_REASON)]
    assert len(kept) == sum(1 for s in spans if s.name in (schema.SPAN_NATIVE_STEP, schema.SPAN_NATIVE_FLOW))
    assert {r.attributes[schema.ATTR_SUM_KEPT_REASON] for r in kept} == {schema.ANOMALY_SKEWED}
    assert all(r.scope == schema.PROCESSOR_SCOPE for r in kept)
    stalled = next(f for f in kinds(out, schema.KIND_FLOW_SUMMARY)
                   if f.rank == 3 and f.attributes[schema.ATTR_NCCL_IS_SEND])
    assert stalled.attributes[schema.ATTR_FLOW_STALL_STATE] == schema.FLOW_STATE_NOT_TRANSMITTED
    assert summaries(out)[0].attributes[schema.ATTR_SUM_LAST_RANK] == 3


def test_slow_rule_learns_a_baseline() -> None:
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.0, slow_factor=3.0, slow_min_samples=3))
    verdicts = []
    for seq in range(6):
        duration = 50 * MS if seq == 5 else 10 * MS
        start = T0 + seq * 100 * MS
        out = proc.process([syn.collective_span(r, seq, start, start + duration) for r in range(4)], now=seq)
        out.extend(proc.tick(seq))
        verdicts.append(summaries(out)[0].attributes[schema.ATTR_SUM_ANOMALY])
    assert verdicts == ["", "", "", "", "", schema.ANOMALY_SLOW]


def test_late_detail_follows_the_collectives_decision() -> None:
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.1, window_s=1.0))
    shape = syn.StepDetail(channels=1, steps=2, counter_samples=1)
    normal = [syn.collective_span(r, 1, T0, T0 + MS) for r in range(4)]
    skewed = [syn.collective_span(r, 2, T0 + (r == 2) * 500 * MS, T0 + 501 * MS) for r in range(4)]
    proc.process(normal + skewed, now=0.0)
    assert len(summaries(proc.tick(0.1))) == 2
    late_normal = syn.native_detail(0, 1, T0, T0 + MS, shape)
    late_skewed = syn.native_detail(0, 2, T0, T0 + MS, shape)
    out = proc.process(late_normal + late_skewed, now=0.5)
    assert len(out.normal) == len(late_skewed)  # kept at once: the collective was anomalous
    assert all(r.attributes[schema.ATTR_SUM_KEPT_REASON] == schema.ANOMALY_SKEWED for r in out.normal)
    out = proc.tick(0.6)  # the normal one's late detail: condensed, no second summary
    assert summaries(out) == []
    assert len(kinds(out, schema.KIND_FLOW_SUMMARY)) == 2


def test_duplicates_and_malformed_spans_are_counted_and_passed() -> None:
    proc = CollectorProcessor()
    good = syn.collective_span(0, 1, T0, T0 + MS)
    bad_ranks = syn.collective_span(1, 1, T0, T0 + MS)
    bad_ranks.attributes[schema.ATTR_GROUP_RANKS] = "0-x"
    no_seq = syn.collective_span(2, 1, T0, T0 + MS)
    del no_seq.attributes[schema.ATTR_SEQ]
    wrong_size = syn.collective_span(3, 1, T0, T0 + MS)
    wrong_size.attributes[schema.ATTR_GROUP_SIZE] = 9
    out = proc.process([good, good, bad_ranks, no_seq, wrong_size], now=0.0)
    assert len(out.normal) == 5
    assert proc.counters.get("duplicate_spans") == 1
    assert proc.counters.get("malformed_spans") == 3
    assert proc.counters.get("collective_spans") == 1


def test_p2p_pair_joins_send_and_recv() -> None:
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.0))
    trace = schema.p2p_trace_id(syn.SERVICE, "g0", 0, 1, 4)
    spans = []
    for rank, op, start in ((0, schema.OP_SEND, T0), (1, schema.OP_RECV, T0 + 30 * MS)):
        span = syn.collective_span(rank, 4, start, T0 + 40 * MS, op=op, ranks=(0, 1))
        span.trace_id = trace
        span.attributes.update({schema.ATTR_SPAN_KIND: schema.KIND_P2P, schema.ATTR_P2P_SRC: 0,
                                schema.ATTR_P2P_DST: 1})
        del span.attributes[schema.ATTR_GROUP_RANKS]
        spans.append(span)
    out = proc.process(spans, now=0.0)
    out.extend(proc.tick(0.0))
    (summary,) = summaries(out)
    assert summary.attributes[schema.ATTR_SUM_LAST_RANK] == 1
    assert summary.attributes[schema.ATTR_P2P_SRC] == 0 and summary.attributes[schema.ATTR_SUM_COMPLETE]
    assert summary.attributes[schema.ATTR_SUM_BUSBW_FACTOR] == 1.0


def test_output_of_a_processor_passes_a_second_processor_untouched() -> None:
    first, second = CollectorProcessor(ProcessorConfig(linger_s=0.0)), CollectorProcessor()
    batch = next(syn.training_run(1, step_detail=syn.StepDetail(channels=1, steps=2), heartbeat_every=1))
    out = first.process(batch, now=0.0)
    out.extend(first.tick(0.0))
    emitted = [r for r in out.all() if r.scope == schema.PROCESSOR_SCOPE]
    again = second.process(emitted, now=0.0)
    assert again.normal == emitted
    assert second.counters.get("collective_spans") == 0 and len(second.flush()) == 0


def test_memory_stays_bounded_under_a_flood_of_incomplete_collectives() -> None:
    config = ProcessorConfig(max_open=50, max_detail_total=300, max_detail_per_collective=40,
                             max_decisions=100, window_s=60.0)
    proc = CollectorProcessor(config)
    shape = syn.StepDetail(channels=2, steps=10, counter_samples=0)
    for seq in range(1000):  # rank 0 only: every collective stays open until evicted
        batch = [syn.collective_span(0, seq, T0, T0 + MS), *syn.native_detail(0, seq, T0, T0 + MS, shape)]
        proc.process(batch, now=seq * 0.001)
        gauges = proc.gauges()
        assert gauges["open_collectives"] <= 50
        assert gauges["buffered_detail_spans"] <= 300
        assert gauges["remembered_decisions"] <= 100
    assert proc.counters.get("windows_evicted") == 950
    # evicted collectives were incomplete -> their raw detail was due, but caps dropped most of it
    assert proc.counters.get("dropped_detail_cap") > 0
    assert (proc.counters.get("detail_kept") + proc.counters.get("dropped_detail_cap")
            + proc.counters.get("detail_condensed")) <= proc.counters.get("detail_in")
    out = proc.flush()
    assert len(summaries(out)) == 50 and proc.gauges()["buffered_detail_spans"] == 0


def test_detail_without_any_rank_span_is_kept_as_incomplete() -> None:
    proc = CollectorProcessor(ProcessorConfig(window_s=2.0))
    detail = syn.native_detail(1, 9, T0, T0 + MS, syn.StepDetail(channels=1, steps=3, counter_samples=1))
    assert len(proc.process(detail, now=0.0)) == 0
    out = proc.tick(2.0)
    kept = [r for r in out.all() if r.attributes.get(schema.ATTR_SUM_KEPT_REASON) == schema.ANOMALY_INCOMPLETE]
    assert len(kept) == len(detail) and summaries(out) == []


@pytest.mark.parametrize(("op", "n", "factor"), [
    (schema.OP_ALL_REDUCE, 8, 1.75), (schema.OP_ALL_GATHER, 8, 0.875), (schema.OP_REDUCE_SCATTER, 4, 0.75),
    (schema.OP_BROADCAST, 8, 1.0), (schema.OP_ALL_TO_ALL, 2, 0.5), (schema.OP_SEND, 2, 1.0),
    (schema.OP_BARRIER, 8, 0.0),
])
def test_busbw_factors_match_nccl_tests(op: str, n: int, factor: float) -> None:
    assert busbw_factor(op, n) == pytest.approx(factor)


def test_all_gather_bandwidth_uses_the_gathered_size() -> None:
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.0))
    spans = [syn.collective_span(r, 1, T0, T0 + 10 * MS, op=schema.OP_ALL_GATHER, nbytes=1000) for r in range(4)]
    out = proc.process(spans, now=0.0)
    out.extend(proc.tick(0.0))
    assert summaries(out)[0].attributes[schema.ATTR_SUM_ALGBW_GBPS] == pytest.approx(4000 / 0.010 / 1e9)
