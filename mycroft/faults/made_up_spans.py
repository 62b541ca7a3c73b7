"""Contract-conformant synthetic spans: the workload of the processor's tests and benchmarks.

Op spans and heartbeats come from the instrumentation's own encoders (spans.op_span,
heartbeat_attributes, fed GroupInfo / OpRecord objects as a rank's recorder holds them, plus what
the runtime adds: see made_up_job, pinned to a real rank by tests/faults/test_made_up_job.py);
the native detail from mycroft.schema names and helpers (trace ids via collective_trace_id, span
ids via rank_span_id), as the NCCL plugin's reader builds it. Used where a real job would be too
slow or too small: floods, throughput runs, native step detail on a CPU-only machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mycroft import schema
from mycroft.faults import made_up_job
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.op_record import OpRecord
from mycroft.instrumentation.spans import op_span
from mycroft.otlp import AttrValue, SpanRecord

C10D_API = "torch.distributed."


def _group(gid: str, ranks: Sequence[int], rank: int) -> GroupInfo:
    """A rank's GroupInfo of a group whose id is `gid` (the tests here name groups "g0", "g1")."""
    members = tuple(ranks)
    return GroupInfo(gid=gid, name=gid, desc="", ranks=members, ranks_text=schema.encode_ranks(members),
                     group_rank=members.index(rank) if rank in members else -1, backend="gloo", pg=None)

SERVICE = "synthetic-job"


def resource(rank: int, job: str = SERVICE, world_size: int = 4) -> dict[str, AttrValue]:
    """A torchrun rank's resource (made_up_job.resource), on host "localhost"."""
    return {**made_up_job.resource(job, rank, world_size), schema.RES_HOST_NAME: "localhost"}


def collective_span(rank: int, seq: int, start_ns: int, end_ns: int, *, ranks: Sequence[int] = (0, 1, 2, 3),
                    op: str = schema.OP_ALL_REDUCE, group: str = "g0", nbytes: int = 1 << 20,
                    job: str = SERVICE, state: str = schema.STATE_COMPLETED) -> SpanRecord:
    record = OpRecord(C10D_API + op, op, _group(group, ranks, rank), seq, start_ns)
    record.end_ns, record.bytes, record.dtype, record.state = end_ns, nbytes, "float32", state
    span = op_span(record, job, rank)
    span.resource = resource(rank, job, len(ranks))
    return span


def heartbeat_span(rank: int, counter: int, t_ns: int, job: str = SERVICE) -> SpanRecord:
    """Rank `rank` of groups g0 and g1 (4 ranks each), its next op of g1 in flight."""
    trace = schema.collective_trace_id(job, "heartbeat", rank * 1_000_000 + counter)
    groups = [_group("g0", range(4), rank), _group("g1", range(4), rank)]
    groups[0].issued, groups[0].completed = counter, counter - 1
    groups[1].issued, groups[1].completed = counter + 1, counter
    inflight = OpRecord(C10D_API + schema.OP_ALL_REDUCE, schema.OP_ALL_REDUCE, groups[1], counter + 1,
                        t_ns - 1_000_000)
    inflight.bytes, inflight.dtype = 1 << 20, "float32"
    span = made_up_job.rank_heartbeat(rank, counter, 1.0, t_ns, groups, [inflight], 0.0, comm_s=counter * 0.01,
                                      ops_done=2 * counter - 1)
    span.trace_id, span.span_id = trace, schema.rank_span_id(trace, rank, "hb")  # deterministic ids
    span.resource = resource(rank, job)
    return span


def native_collective_span(rank: int, seq: int, start_ns: int, end_ns: int, *, algo: str = "Ring",
                           proto: str = "Simple", group: str = "g0", job: str = SERVICE) -> SpanRecord:
    trace = schema.collective_trace_id(job, group, seq)
    return SpanRecord(
        trace_id=trace, span_id=schema.rank_span_id(trace, rank, "nccl"), name=schema.SPAN_NATIVE_COLL,
        start_ns=start_ns, end_ns=end_ns,
        attributes={schema.ATTR_SPAN_KIND: schema.KIND_NATIVE_COLL, schema.ATTR_NCCL_ALGO: algo,
                    schema.ATTR_NCCL_PROTO: proto, schema.ATTR_NCCL_FUNC: "AllReduce",
                    schema.ATTR_NCCL_COMM_HASH: "c0ffee", schema.ATTR_RANK: rank},
        resource=resource(rank, job),
    )


@dataclass(frozen=True, slots=True)
class StepDetail:
    """Shape of the native detail per rank per collective (NCCL proxy-style)."""

    channels: int = 2
    steps: int = 8
    chunk_size: int = 131072
    counter_samples: int = 2  # nccl.flow counter samples per flow (plus steps)


def native_detail(rank: int, seq: int, start_ns: int, end_ns: int, shape: StepDetail, *, world: int = 4,
                  group: str = "g0", job: str = SERVICE, stall_at: int | None = None) -> list[SpanRecord]:
    """Ring-style detail of one rank: per channel a send flow to rank+1 and a recv flow from
    rank-1, each with `steps` proxy-step spans and `counter_samples` flow counter samples.
    `stall_at`: the send flows stop transmitting after that many steps (a stuck NIC)."""
    trace = schema.collective_trace_id(job, group, seq)
    parent = schema.rank_span_id(trace, rank, "nccl")
    spans: list[SpanRecord] = []
    res = resource(rank, job, world)
    duration = max(1, end_ns - start_ns)
    for channel in range(shape.channels):
        for is_send, peer in ((True, (rank + 1) % world), (False, (rank - 1) % world)):
            done_steps = shape.steps if stall_at is None or not is_send else min(stall_at, shape.steps)
            base: dict[str, AttrValue] = {
                schema.ATTR_RANK: rank, schema.ATTR_NCCL_CHANNEL: channel, schema.ATTR_PEER: peer,
                schema.ATTR_NCCL_IS_SEND: is_send, schema.ATTR_NCCL_STEPS: shape.steps,
                schema.ATTR_NCCL_CHUNK_SIZE: shape.chunk_size, schema.ATTR_NCCL_COMM_HASH: "c0ffee",
            }
            for step in range(done_steps):
                t0 = start_ns + duration * step // shape.steps
                t1 = start_ns + duration * (step + 1) // shape.steps
                spans.append(SpanRecord(
                    trace_id=trace, span_id=schema.rank_span_id(trace, rank, f"s{channel}{is_send}{step}"),
                    parent_span_id=parent, name=schema.SPAN_NATIVE_STEP, start_ns=t0, end_ns=t1,
                    attributes={**base, schema.ATTR_SPAN_KIND: schema.KIND_NATIVE_STEP, schema.ATTR_NCCL_STEP: step},
                    resource=res))
            for sample in range(1, shape.counter_samples + 1):
                progress = done_steps * sample // shape.counter_samples
                spans.append(SpanRecord(
                    trace_id=trace, span_id=schema.rank_span_id(trace, rank, f"f{channel}{is_send}{sample}"),
                    parent_span_id=parent, name=schema.SPAN_NATIVE_FLOW,
                    start_ns=start_ns, end_ns=start_ns + duration * sample // shape.counter_samples,
                    attributes={**base, schema.ATTR_SPAN_KIND: schema.KIND_NATIVE_FLOW,
                                schema.ATTR_FLOW_GPU_READY: shape.steps if is_send else progress,
                                schema.ATTR_FLOW_TRANSMITTED: progress, schema.ATTR_FLOW_DONE: progress},
                    resource=res))
    return spans


def training_run(collectives: int, *, world: int = 4, step_detail: StepDetail | None = None,
                 heartbeat_every: int = 10, start_ns: int = 1_700_000_000_000_000_000,
                 period_ns: int = 2_000_000, skew_ns: int = 20_000) -> Iterator[list[SpanRecord]]:
    """One batch of spans per collective of a `world`-rank all_reduce loop (plus heartbeats):
    small natural skew, rank (seq % world) arriving last, optional native step detail."""
    ranks = list(range(world))
    for seq in range(collectives):
        t0 = start_ns + seq * period_ns
        batch: list[SpanRecord] = []
        end = t0 + period_ns // 2 + world * skew_ns
        for rank in ranks:
            arrival = t0 + ((rank - seq - 1) % world) * skew_ns
            batch.append(collective_span(rank, seq, arrival, end, ranks=ranks))
            if step_detail is not None:
                batch.append(native_collective_span(rank, seq, arrival, end))
                batch.extend(native_detail(rank, seq, arrival, end, step_detail, world=world))
        if heartbeat_every and seq % heartbeat_every == 0:
            batch.extend(heartbeat_span(rank, seq // heartbeat_every + 1, t0) for rank in ranks)
        yield batch
