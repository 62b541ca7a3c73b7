"""The big-job simulator: its spliced wire bytes decode to what the instrumentation's encoders build."""

from __future__ import annotations

from mycroft import schema
from mycroft.faults.bigjob import HEALTHY, HOLDER, TP_WAITER, WORLD_WAITER, BigJob, Layout
from mycroft.otlp import decode_protobuf


def _same(spliced: object, built: object) -> None:
    a, b = spliced, built
    assert a.name == b.name and a.start_ns == b.start_ns and a.end_ns == b.end_ns  # type: ignore[attr-defined]
    assert a.attributes == b.attributes  # type: ignore[attr-defined]
    assert a.status_code == b.status_code  # type: ignore[attr-defined]


def test_heartbeats_decode_to_the_encoders_output_in_every_situation() -> None:
    job = BigJob("j", Layout(64, tp=8), ops_per_s=10, fault_rank=35, fault_at=1000.0)
    for t in (990.0, 991.0):
        job.tick(t)
    ranks = list(range(64))
    assert {job.situation(r, 995.0) for r in ranks} == {HEALTHY}
    for now in (995.0, 1003.0):
        if now > 1000:
            job.tick(now)
        decoded = decode_protobuf(job.heartbeat_bytes(ranks, now))
        assert [r.rank for r in decoded] == ranks
        for record in decoded:
            _same(record, job.record(record.rank or 0, now))  # type: ignore[arg-type]
            assert record.resource[schema.RES_RANK] == record.rank
            assert record.kind == schema.KIND_HEARTBEAT
    kinds = {job.situation(r, 1003.0) for r in ranks}
    assert kinds == {HOLDER, TP_WAITER, WORLD_WAITER}
    holder = job.record(35, 1003.0).attributes
    assert holder[schema.ATTR_HB_INFLIGHT_SEQS] == [] and schema.ATTR_HB_STACK in holder
    waiter = job.record(36, 1003.0).attributes
    assert 3.0 <= waiter[schema.ATTR_HB_INFLIGHT_AGES_S][0] < 3.001  # type: ignore[index]


def test_op_spans_decode_to_op_span_and_sampling_keeps_whole_collectives() -> None:
    job = BigJob("j", Layout(16, tp=4), ops_per_s=10)
    job.tick(100.0)
    payload, count = job.op_span_bytes(list(range(16)), 100.0)
    decoded = decode_protobuf(payload)
    assert count == len(decoded) == 16 * 10
    for record in decoded[:20]:
        g = {info.gid: i for i, info in enumerate(job.rank_groups(record.rank or 0))}[
            str(record.attributes[schema.ATTR_GROUP_ID])]
        built = job.op_record(record.rank or 0, g, int(record.attributes[schema.ATTR_SEQ]),  # type: ignore[arg-type]
                              record.start_ns, record.end_ns)
        _same(record, built)
        assert record.trace_id == built.trace_id and record.span_id == built.span_id
    payload, count = job.op_span_bytes(list(range(16)), 100.0, keep=0.3)
    kept = decode_protobuf(payload)
    assert 0 < count < 160
    by_trace: dict[int, int] = {}
    for record in kept:
        by_trace[record.trace_id] = by_trace.get(record.trace_id, 0) + 1
    sizes = {int(r.attributes[schema.ATTR_GROUP_SIZE]) for r in kept}  # type: ignore[arg-type]
    for record in kept:  # every member of a kept collective kept it
        assert by_trace[record.trace_id] == int(record.attributes[schema.ATTR_GROUP_SIZE])  # type: ignore[arg-type]
    assert sizes
