"""Contract-conformant synthetic spans: the workload of the processor's tests and benchmarks.

Built only from mycroft.schema names and helpers (trace ids via collective_trace_id,
span ids via rank_span_id), so they look exactly like what instrumented ranks and the
NCCL plugin send. Used where a real job would be too slow or too small: floods,
throughput runs, native step detail on a CPU-only machine.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord

SERVICE = "synthetic-job"


def resource(rank: int, job: str = SERVICE, world_size: int = 4) -> dict[str, AttrValue]:
    return {
        schema.RES_SERVICE_NAME: job,
        schema.RES_JOB_ID: job,
        schema.RES_RANK: rank,
        schema.RES_WORLD_SIZE: world_size,
        schema.RES_LOCAL_RANK: rank,
        schema.RES_HOST_NAME: "localhost",
    }


def collective_span(rank: int, seq: int, start_ns: int, end_ns: int, *, ranks: Sequence[int] = (0, 1, 2, 3),
                    op: str = schema.OP_ALL_REDUCE, group: str = "g0", nbytes: int = 1 << 20,
                    job: str = SERVICE, state: str = schema.STATE_COMPLETED) -> SpanRecord:
    trace = schema.collective_trace_id(job, group, seq)
    return SpanRecord(
        trace_id=trace,
        span_id=schema.rank_span_id(trace, rank),
        name=op,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes={
            schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE,
            schema.ATTR_OP: op,
            schema.ATTR_GROUP_ID: group,
            schema.ATTR_GROUP_SIZE: len(ranks),
            schema.ATTR_GROUP_RANKS: schema.encode_ranks(ranks),
            schema.ATTR_GROUP_RANK: list(ranks).index(rank) if rank in ranks else -1,
            schema.ATTR_SEQ: seq,
            schema.ATTR_BYTES: nbytes,
            schema.ATTR_DTYPE: "float32",
            schema.ATTR_BACKEND: "gloo",
            schema.ATTR_STATE: state,
            schema.ATTR_RANK: rank,
        },
        resource=resource(rank, job, len(ranks)),
    )


def heartbeat_span(rank: int, counter: int, t_ns: int, job: str = SERVICE) -> SpanRecord:
    trace = schema.collective_trace_id(job, "heartbeat", rank * 1_000_000 + counter)
    return SpanRecord(
        trace_id=trace,
        span_id=schema.rank_span_id(trace, rank, "hb"),
        name=schema.SPAN_HEARTBEAT,
        start_ns=t_ns,
        end_ns=t_ns,
        attributes={
            schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT,
            schema.ATTR_RANK: rank,
            schema.ATTR_HB_COUNTER: counter,
            schema.ATTR_HB_INTERVAL_S: 1.0,
            schema.ATTR_HB_GROUP_IDS: ["g0", "g1"],
            schema.ATTR_HB_GROUP_ISSUED: [counter, counter + 1],
            schema.ATTR_HB_GROUP_COMPLETED: [counter - 1, counter],
        },
        resource=resource(rank, job),
    )


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
