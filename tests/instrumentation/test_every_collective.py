"""Every collective in the trace (issue 46): DDP's bucket all-reduces, issued from C++, get their spans from
the Flight Recorder's entries on the runtime thread, beside the Python calls' spans, one trace per
collective with every rank's span in it; on gloo and on the NCCL-like backend."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from mycroft.instrumentation.flight_recorder import UNMATCHED_DUMPS, FrCoverage, FrEntry
from mycroft.instrumentation.runtime import FULL_DUMP_GAP_S, FULL_DUMP_SHARE, next_full_dump
from mycroft.instrumentation.sampling import EPOCH

from mycroft import schema
from mycroft.otlp import SpanRecord
from tests.conftest import SpanSink, instrumented_env, run_torchrun

JOB = Path(__file__).parent / "jobs" / "every_collective.py"
RANKS = 3
STEPS = 4
BUCKET_BYTES = (256 * 256 + 256 + 4 * 256 + 4) * 4  # one bucket: every parameter, float32


def issued(stdout: str) -> dict[int, int]:
    return {int(rank): int(n) for rank, n in re.findall(r"ISSUED (\d+) (\d+)", stdout)}


def world_spans(spans: list[SpanRecord]) -> list[SpanRecord]:
    return [s for s in spans if s.kind == schema.KIND_COLLECTIVE and s.attributes[schema.ATTR_GROUP_NAME] == "0"]


def run_job(sink: SpanSink, port: int, job_id: str, *args: str) -> tuple[int, list[SpanRecord]]:
    result = run_torchrun(JOB, RANKS, instrumented_env(port, MYCROFT_JOB_ID=job_id,
                                                      MYCROFT_HEARTBEAT_INTERVAL="0.5"), *args)
    assert result.returncode == 0, result.stderr[-3000:]
    counts = issued(result.stdout)
    assert sorted(counts) == list(range(RANKS)) and len(set(counts.values())) == 1, result.stdout[-2000:]
    assert sink.wait_for(lambda spans: len({s.rank for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)})
                         == RANKS, 20)
    return counts[0], sink.snapshot()


def assert_every_collective(n: int, spans: list[SpanRecord], job_id: str) -> list[SpanRecord]:
    """Every world seq 1..n has exactly one span per rank, all of a seq's spans in one trace (its id)."""
    ops = world_spans(spans)
    by_rank: dict[int, list[int]] = defaultdict(list)
    traces: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for span in ops:
        seq = span.attributes[schema.ATTR_SEQ]
        assert isinstance(seq, int)
        by_rank[span.rank].append(seq)
        traces[seq].add((span.trace_id, span.rank))
    for rank in range(RANKS):
        seqs = by_rank[rank]
        missing = sorted(set(range(1, n + 1)) - set(seqs))
        assert not missing, f"rank {rank}: {n - len(missing)} of {n} world collectives in the backend, " \
                            f"missing seqs {missing}"
        assert len(seqs) == len(set(seqs)) == n, f"rank {rank}: a seq spanned twice {sorted(seqs)}"
    group = ops[0].attributes[schema.ATTR_GROUP_ID]
    for seq, members in traces.items():  # one trace per collective, every rank's span in it: hash(job, group, seq)
        assert {trace for trace, _ in members} == {schema.collective_trace_id(job_id, str(group), seq)}, (seq, members)
        assert {rank for _, rank in members} == set(range(RANKS)), (seq, members)
    return ops


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["gloo", "nccl_like"])
def test_every_world_collective_reaches_the_backend_ddp_buckets_included(otlp_sink: tuple[SpanSink, int],
                                                                          backend: str) -> None:
    sink, port = otlp_sink
    n, spans = run_job(sink, port, f"every-{backend}", "--backend", backend, "--steps", str(STEPS))
    ops = assert_every_collective(n, spans, f"every-{backend}")
    # torch 2.13: DDP's construction (shape check, C++ metadata broadcast, parameter broadcast), per step
    # one bucket all-reduce (C++) + all_gather + funcol all_reduce, and the bucket rebuild's 2 broadcasts (C++)
    assert n == 3 + 3 * STEPS + 2
    fr = [s for s in ops if s.attributes[schema.ATTR_SOURCE] == schema.SOURCE_FLIGHT_RECORDER]
    for rank in range(RANKS):  # the bucket (every parameter, float32), from C++: built from the FR's entries
        buckets = [s for s in fr if s.rank == rank and s.name == schema.OP_ALL_REDUCE]
        assert len(buckets) == STEPS and all(s.attributes[schema.ATTR_BYTES] == BUCKET_BYTES for s in buckets), \
            [(s.attributes[schema.ATTR_SEQ], s.attributes[schema.ATTR_BYTES]) for s in buckets]
        assert len([s for s in fr if s.rank == rank and s.name == schema.OP_BROADCAST]) == 3
    for span in fr:
        assert span.attributes[schema.ATTR_TIMING] == schema.TIMING_FLIGHT_RECORDER
        assert span.end_ns >= span.start_ns
        window = span.attributes.get(schema.ATTR_END_WINDOW_S)
        if backend == "gloo":  # gloo's entries never say when: between two frontier reads
            assert isinstance(window, float) and 0.0 <= window < 5.0, span.attributes
    beats = [s for s in spans if s.kind == schema.KIND_HEARTBEAT and s.attributes.get(schema.ATTR_HB_FINAL)]
    assert len(beats) == RANKS
    for beat in beats:  # the spans built from entries, in the heartbeats too; nothing lost to the ring
        assert beat.attributes.get(schema.ATTR_HB_FR_BUILT, 0) >= STEPS, beat.attributes
        assert beat.attributes.get(schema.ATTR_HB_FR_LOST) == 0


@pytest.mark.slow
def test_the_unused_parameter_all_reduce_too(otlp_sink: tuple[SpanSink, int]) -> None:
    """find_unused_parameters: the reducer's bitmap all-reduce (C++) is a collective of its own."""
    sink, port = otlp_sink
    n, spans = run_job(sink, port, "every-unused", "--backend", "gloo", "--steps", "3", "--unused")
    assert_every_collective(n, spans, "every-unused")


# ---------------------------------------------------------------------------- FrCoverage, pure


def _entry(seq: int, group: str = "0", created_ns: int = 0, completed_ns: int = 0) -> FrEntry:
    return FrEntry(group, seq, schema.OP_ALL_REDUCE, 64, "float", created_ns or seq * 10, "0", completed_ns)


def test_completed_seqs_nothing_recorded_are_spanned_ended_between_the_two_reads_around_them() -> None:
    cov = FrCoverage()
    cov.observe("g", 0, 1_000)
    for seq in (1, 3):  # Python calls recorded 1 and 3; 2 and 4 came from C++
        cov.note("g", seq)
    cov.observe("g", 2, 2_000)  # 1 and 2 completed between the reads at 1,000 and 2,000
    cov.observe("g", 4, 3_000)
    assert cov.unexplained() == {"g": [2, 4]}
    done = cov.resolve({"0": "g"}, [_entry(s, created_ns=1_500 if s == 2 else 2_500) for s in (1, 2, 3, 4)])
    assert [(d.entry.seq, d.end_ns, d.window_ns) for d in done] == [(2, 2_000, 500), (4, 3_000, 500)]
    assert cov.unexplained() == {} and cov.built == 2 and cov.lost == 0
    cov.observe("g", 5, 4_000)
    assert cov.unexplained({("g", 5)}) == {}  # a Python op in flight or not drained yet: explained


def test_an_end_the_entry_gives_is_taken_as_it_is() -> None:
    cov = FrCoverage()
    cov.observe("g", 1, 9_000)
    [done] = cov.resolve({"0": "g"}, [_entry(1, created_ns=100, completed_ns=700)])
    assert (done.end_ns, done.window_ns) == (700, 0)


def test_seqs_the_ring_overwrote_before_a_dump_are_counted_lost_not_guessed() -> None:
    cov = FrCoverage()
    cov.observe("g", 10, 1_000)
    done = cov.resolve({"0": "g"}, [_entry(s) for s in (7, 8, 9, 10)])  # the ring kept only 7..10
    assert [d.entry.seq for d in done] == [7, 8, 9, 10] and cov.lost == 6 and cov.pending() == 0


def test_a_seq_no_dump_names_is_given_up_after_a_few_dumps() -> None:
    cov = FrCoverage()
    cov.observe("g", 1, 1_000)
    for _ in range(UNMATCHED_DUMPS - 1):
        assert cov.resolve({"0": "g"}, []) == [] and cov.lost == 0 and cov.unexplained() == {"g": [1]}
    cov.resolve({"0": "g"}, [])
    assert cov.lost == 1 and cov.unexplained() == {}


def test_full_dumps_take_at_most_half_a_percent_of_the_time() -> None:
    assert next_full_dump(10.0, 0.001) == 10.0 + FULL_DUMP_GAP_S
    assert next_full_dump(10.0, 0.016) == pytest.approx(10.0 + 0.016 / FULL_DUMP_SHARE)  # 16 ms: 3.2 s apart
    assert FULL_DUMP_SHARE <= 0.005


def test_a_seq_is_looked_at_once_a_read_some_time_ago_found_it_completed() -> None:
    """Python ops' records are noted at the drain after their completion: until then they are not asked about."""
    cov = FrCoverage()
    cov.observe("g", 2, 1_000)
    cov.observe("g", 4, 2_000)
    assert cov.unexplained(settled_before_ns=500) == {}
    assert cov.unexplained(settled_before_ns=1_500) == {"g": [1, 2]}  # 3 and 4: not yet
    cov.note("g", 3)
    cov.note("g", 4)
    assert cov.unexplained(settled_before_ns=2_500) == {"g": [1, 2]}


def test_collectives_from_before_the_runtime_started_are_passed_over_not_built_nor_lost() -> None:
    """Instrumented again (or started after init): the ring's history is not this runtime's to span."""
    cov = FrCoverage(since_ns=1_000)
    cov.observe("g", 6, 2_000)
    done = cov.resolve({"0": "g"}, [_entry(s, created_ns=500 if s < 5 else 1_500) for s in (3, 4, 5, 6)])
    assert [d.entry.seq for d in done] == [5, 6] and cov.lost == 0 and cov.unexplained() == {}


@pytest.mark.slow
def test_spans_built_from_the_flight_recorder_are_under_the_budget_whole_collectives(
        otlp_sink: tuple[SpanSink, int]) -> None:
    """A budget the job exceeds: the buckets' spans are sampled like any op's (fewer than the buckets), and a
    bucket kept on one rank is kept on all three, unless the members kept that epoch with different
    probabilities (a rate change within their measuring skew: the budget's one allowed disagreement)."""
    sink, port = otlp_sink
    steps = 120
    result = run_torchrun(JOB, RANKS, instrumented_env(port, MYCROFT_JOB_ID="every-budget",
                                                      MYCROFT_HEARTBEAT_INTERVAL="0.5", MYCROFT_TRACE_BUDGET="6"),
                          "--steps", str(steps))
    assert result.returncode == 0, result.stderr[-3000:]
    assert sink.wait_for(lambda spans: len({s.rank for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)})
                         == RANKS, 20)
    spans = sink.snapshot()
    built = [s for s in world_spans(spans) if schema.ATTR_END_WINDOW_S in s.attributes]
    beats = {s.rank: s for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)}
    for rank in range(RANKS):
        mine = [s for s in built if s.rank == rank]
        made = beats[rank].attributes[schema.ATTR_HB_FR_BUILT]
        assert isinstance(made, int) and made >= steps - 2  # built: the buckets (a few went in flight instead)
        assert 0 < len(mine) < made / 2, (len(mine), made)  # sent: the first epochs whole, then sampled
        assert beats[rank].attributes[schema.ATTR_HB_FR_LOST] == 0
    ranks_of: dict[int, set[int]] = defaultdict(set)
    seen: dict[int, dict[int, set[float]]] = defaultdict(lambda: defaultdict(set))  # epoch -> rank -> probabilities
    for span in built:
        seq = span.attributes[schema.ATTR_SEQ]
        probability = span.attributes.get(schema.ATTR_SAMPLE_PROBABILITY, 1.0)
        assert isinstance(seq, int) and isinstance(probability, float | int)
        ranks_of[seq].add(span.rank)
        seen[seq // EPOCH][span.rank].add(float(probability))

    def disagreed(epoch: int) -> bool:  # as test_diet: a member that kept none of the epoch shows nothing
        return len(seen[epoch]) < RANKS or len(set().union(*seen[epoch].values())) > 1

    partial = [seq for seq, ranks in ranks_of.items() if ranks != set(range(RANKS))]
    assert all(disagreed(seq // EPOCH) for seq in partial), [(seq, dict(seen[seq // EPOCH])) for seq in partial]
    print(f"built {[beats[r].attributes[schema.ATTR_HB_FR_BUILT] for r in range(RANKS)]}, sent "
          f"{[len([s for s in built if s.rank == r]) for r in range(RANKS)]}, collectives kept {len(ranks_of)}, "
          f"part-kept {len(partial)}")
