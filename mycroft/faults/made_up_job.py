"""Span records of a made-up job, encoded by the instrumentation's own encoders.

Unit tests, the service-level tests and the 16k-rank analysis benchmark use these to exercise
the engine without processes. The op spans come from instrumentation.spans.op_span and the
heartbeats from spans.heartbeat_attributes / heartbeat_span, fed the same GroupInfo / OpRecord
objects a rank's recorder holds; what the runtime adds to a heartbeat beside them (dropped,
comm_s, ops_done, phase) and the resource it sends are added here as in runtime.Runtime, and
tests/faults/test_made_up_job.py pins both to a real rank's spans, key by key.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from mycroft import schema
from mycroft.instrumentation.config import DEFAULT_TRACE_BUDGET
from mycroft.instrumentation.digest import SignatureDigests
from mycroft.instrumentation.groups import DEVICE_ASYNC_BACKENDS, GroupInfo
from mycroft.instrumentation.op_record import OpRecord
from mycroft.instrumentation.spans import heartbeat_attributes, heartbeat_span, op_span
from mycroft.otlp import AttrValue, SpanRecord

C10D_API = "torch.distributed."  # instrumentation.patching.C10D_PREFIX (that module is the patching itself)
_ROOTED = frozenset({schema.OP_BROADCAST, schema.OP_REDUCE, schema.OP_GATHER, schema.OP_SCATTER})


def resource(job: str, rank: int, world: int, pid: int | None = None) -> dict[str, AttrValue]:
    """What Runtime._resource sends for a torchrun rank (startup.launch_resource plus the run id):
    one node, every rank on it."""
    return {
        schema.RES_SERVICE_NAME: job, schema.RES_JOB_ID: job, schema.RES_RUN_ID: f"{job}.0", schema.RES_RANK: rank,
        schema.RES_WORLD_SIZE: world, schema.RES_LOCAL_RANK: rank, schema.RES_HOST_NAME: "host0",
        schema.RES_OS_HOST_NAME: "host0",
        schema.RES_PROCESS_PID: pid or 1000 + rank, schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
        schema.RES_LAUNCHER: "torchrun", schema.RES_NODE_RANK: 0, schema.RES_LOCAL_WORLD_SIZE: world,
        schema.RES_TRACE_BUDGET: DEFAULT_TRACE_BUDGET,
    }


@dataclass(slots=True)
class Group:
    name: str
    ranks: tuple[int, ...]
    backend: str = "gloo"  # "nccl": a device-async group (its heartbeats carry returned / FR frontier)
    id: str = field(init=False)
    encoded: str = field(init=False)
    index: dict[int, int] = field(init=False)
    _members: dict[int, GroupInfo] = field(init=False)

    def __post_init__(self) -> None:  # computed once: a 16k-member group is hashed per span otherwise
        self.id = schema.group_id(self.name, self.ranks)
        self.encoded = schema.encode_ranks(self.ranks)
        self.index = {r: i for i, r in enumerate(self.ranks)}
        self._members = {}

    def member(self, rank: int) -> GroupInfo:
        """The GroupInfo a member's recorder holds for this group (one per rank, kept)."""
        info = self._members.get(rank)
        if info is None:
            info = self._members[rank] = GroupInfo(
                gid=self.id, name=self.name, desc="", ranks=self.ranks, ranks_text=self.encoded,
                group_rank=self.index.get(rank, -1), backend=self.backend, pg=None,
                device_async=self.backend in DEVICE_ASYNC_BACKENDS)
        return info


def _record(group: Group, rank: int, op: str, seq: int, start: float, end: float, nbytes: int, dtype: str,
            state: str) -> OpRecord:
    record = OpRecord(C10D_API + op, op, group.member(rank), seq, int(start * 1e9))
    record.end_ns = int(end * 1e9)
    record.call_end_ns = record.end_ns if record.device else 0
    record.bytes = nbytes
    record.dtype = dtype
    record.state = state  # no reduce_op: the recorder has one only where the call passed op=
    if op in _ROOTED:
        record.root = group.ranks[0]
    if state in (schema.STATE_ERROR, schema.STATE_TIMEOUT):
        record.error = f"{op} {state}"
    return record


def _with_resource(span: SpanRecord, job: str, rank: int, world: int) -> SpanRecord:
    span.resource = resource(job, rank, world)
    return span


def collective(job: str, rank: int, world: int, group: Group, seq: int, start: float, end: float,
               op: str = schema.OP_ALL_REDUCE, nbytes: int = 4096, dtype: str = "float32",
               state: str = schema.STATE_COMPLETED) -> SpanRecord:
    record = _record(group, rank, op, seq, start, end, nbytes, dtype, state)
    return _with_resource(op_span(record, job, rank), job, rank, world)


def p2p(job: str, rank: int, world: int, group: Group, op: str, peer: int, seq: int, start: float,
        end: float, nbytes: int = 4096) -> SpanRecord:
    record = _record(group, rank, op, seq, start, end, nbytes, "float32", schema.STATE_COMPLETED)
    record.peer = peer
    record.src, record.dst = (rank, peer) if op == schema.OP_SEND else (peer, rank)
    return _with_resource(op_span(record, job, rank), job, rank, world)


@dataclass(slots=True)
class InFlightOp:
    group: Group
    seq: int
    op: str = schema.OP_ALL_REDUCE
    age_s: float = 0.0
    peer: int = -1
    nbytes: int = 4096
    dtype: str = "float32"
    returned: bool = False  # device-async groups: the call returned (enqueued), the device has not finished


def heartbeat(job: str, rank: int, world: int, at: float, counter: int, groups: Sequence[Group],
              issued: Sequence[int], completed: Sequence[int], inflight: Sequence[InFlightOp] = (),
              idle_s: float = 0.0, stack: str = "", interval: float = 0.5, final: bool = False,
              exit_reason: str = "", *, comm_s: float | None = 0.0, ops_done: int | None = None,
              fr_completed: Sequence[int] | None = None, digests: SignatureDigests | None = None) -> SpanRecord:
    """One rank's heartbeat at `at`: `issued` / `completed` per group of `groups`, in that order.

    ops_done defaults to the sum of the completed frontiers; fr_completed (the Flight Recorder's
    frontier, sent for device-async groups) to `completed`. comm_s=None leaves out the work
    counters (comm_s, ops_done): a heartbeat without them, to test the span-only rules. digests: the
    rank's signature digests (instrumentation.digest), whose closed blocks go out as a rank's do.
    """
    now_ns = int(at * 1e9)
    infos = []
    for i, group in enumerate(groups):
        info = group.member(rank)
        info.issued, info.completed = issued[i], completed[i]
        info.fr_completed = (fr_completed if fr_completed is not None else completed)[i]
        infos.append(info)
    records = []
    for op in inflight:
        age_ns = round(op.age_s * 1e9) if math.isfinite(op.age_s) else 0
        record = OpRecord(C10D_API + op.op, op.op, op.group.member(rank), op.seq, now_ns - age_ns)
        record.peer, record.bytes, record.dtype = op.peer, op.nbytes, op.dtype
        record.call_end_ns = record.start_ns if op.returned else 0
        records.append(record)
    span = rank_heartbeat(rank, counter, interval, now_ns, infos, records, idle_s,
                          comm_s=comm_s, ops_done=sum(completed) if ops_done is None else ops_done,
                          digests=digests, stack=stack, final=final, exit_reason=exit_reason)
    if not all(math.isfinite(op.age_s) for op in inflight):  # a test's junk age (nan, inf): no rank computes one
        order = sorted(range(len(records)), key=lambda i: records[i].start_ns)  # the encoder's order
        span.attributes[schema.ATTR_HB_INFLIGHT_AGES_S] = [inflight[i].age_s for i in order]
    return _with_resource(span, job, rank, world)


def rank_heartbeat(rank: int, counter: int, interval: float, now_ns: int, groups: Sequence[GroupInfo],
                   inflight: Sequence[OpRecord], idle_s: float, *, comm_s: float | None, ops_done: int,
                   digests: SignatureDigests | None = None, stack: str = "", final: bool = False,
                   exit_reason: str = "", spans: tuple[int, int, int] | None = None) -> SpanRecord:
    """A heartbeat as Runtime._heartbeat builds it from a recorder's groups and in-flight ops: the
    encoder's arrays, then what the runtime adds beside them, in its order (no resource).
    spans: the trace budget's (kept, anomalies, sampled out) op spans so far; by default every
    completed op's span kept, as under a budget the job does not reach."""
    attrs = heartbeat_attributes(groups, inflight, now_ns, idle_s)
    attrs[schema.ATTR_HB_DROPPED] = 0
    kept, anomalies, sampled_out = spans if spans is not None else (ops_done, 0, 0)
    attrs[schema.ATTR_HB_SPANS_KEPT] = kept
    attrs[schema.ATTR_HB_SPANS_ANOMALIES] = anomalies
    attrs[schema.ATTR_HB_SPANS_SAMPLED_OUT] = sampled_out
    if comm_s is not None:
        attrs[schema.ATTR_HB_COMM_S] = round(comm_s, 6)
        attrs[schema.ATTR_HB_OPS_DONE] = ops_done
    attrs[schema.ATTR_HB_PHASE] = schema.PHASE_TRAINING
    if digests is not None:
        attrs.update(digests.heartbeat_attributes())
    if stack:
        attrs[schema.ATTR_HB_STACK] = stack
    if final:
        attrs[schema.ATTR_HB_FINAL] = True
        attrs[schema.ATTR_HB_EXIT_REASON] = exit_reason or "exit"
    # ids: random in a real rank; seeded by (rank, counter) here, so that a made-up run repeats
    rng = random.Random(rank << 32 | counter)
    return heartbeat_span(rank, counter, interval, now_ns - round(interval * 1e9), now_ns, attrs, rng)


@dataclass
class StepJob:
    """A data-parallel job that all-reduces once per step in one world group.

    `steps()` yields the completed spans of healthy steps; helpers produce the
    heartbeats of a moment in which chosen ranks are stuck. Each rank's time in
    communication (comm_s) adds up as a real rank's recorder counts it.
    """

    job: str
    world: int
    step_s: float = 0.1
    t0: float = 1000.0
    group: Group = field(init=False)
    seq: int = 0
    now: float = 0.0
    counter: int = 0
    reports_work: bool = True  # False: heartbeats without comm_s / ops_done (the span-only rules)
    trace_budget: float | None = DEFAULT_TRACE_BUDGET  # in the resource; None: a job run without one (inf)
    comm: list[float] = field(init=False)
    digests: list[SignatureDigests] = field(init=False)

    def __post_init__(self) -> None:
        self.group = Group("0", tuple(range(self.world)))
        self.now = self.t0
        self.comm = [0.0] * self.world
        self.digests = [SignatureDigests() for _ in range(self.world)]

    def steps(self, n: int, slow_rank: int | None = None, slow_extra_s: float = 0.0) -> list[SpanRecord]:
        out: list[SpanRecord] = []
        for _ in range(n):
            self.seq += 1
            compute_end = self.now + self.step_s * 0.8
            last_arrival = compute_end + (slow_extra_s if slow_rank is not None else 0.0)
            end = last_arrival + self.step_s * 0.2
            for r in range(self.world):
                arrive = compute_end + (slow_extra_s if r == slow_rank else 0.001 * ((r * 7 + self.seq) % 5))
                out.append(collective(self.job, r, self.world, self.group, self.seq, arrive, end))
                self.comm[r] += end - arrive
                self.digests[r].add(self.group.id, self.seq, schema.OP_ALL_REDUCE, 4096, "float32")
            self.now = end
        return self._budgeted(out)

    def _budgeted(self, spans: list[SpanRecord]) -> list[SpanRecord]:
        """The spans with this job's trace budget in their resource (absent: no budget)."""
        if self.trace_budget == DEFAULT_TRACE_BUDGET:
            return spans
        for span in spans:
            span.resource.pop(schema.RES_TRACE_BUDGET, None)
            if self.trace_budget is not None:
                span.resource[schema.RES_TRACE_BUDGET] = self.trace_budget
        return spans

    def heartbeats(self, at: float, blocked: dict[int, float] | None = None,
                   not_entered: Sequence[int] = (), silent: Sequence[int] = (),
                   stack: str = "  File \"train.py\", line 10, in step\n    time.sleep(3600)") -> list[SpanRecord]:
        """Heartbeats at `at`: ranks in `not_entered` sit outside seq+1, the others wait in it."""
        self.counter += 1
        out = []
        nxt = self.seq + 1
        for r in range(self.world):
            if r in silent:
                continue
            if r in not_entered:
                out.append(heartbeat(self.job, r, self.world, at, self.counter, [self.group], [self.seq],
                                     [self.seq], idle_s=at - self.now, stack=stack,
                                     comm_s=self.comm[r] if self.reports_work else None, ops_done=self.seq,
                                     digests=self.digests[r]))
            else:
                age = (blocked or {}).get(r, at - self.now)
                out.append(heartbeat(self.job, r, self.world, at, self.counter, [self.group], [nxt], [self.seq],
                                     [InFlightOp(self.group, nxt, age_s=age)],
                                     comm_s=self.comm[r] + age if self.reports_work else None, ops_done=self.seq,
                                     digests=self.digests[r]))
        return self._budgeted(out)
