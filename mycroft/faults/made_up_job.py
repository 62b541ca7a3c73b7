"""Span records of a made-up job, built only from schema constants.

Unit tests and the 16k-rank analysis benchmark use these to exercise the engine
without processes; they follow the contract the instrumentation emits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord


def resource(job: str, rank: int, world: int, pid: int | None = None) -> dict[str, AttrValue]:
    return {
        schema.RES_SERVICE_NAME: job, schema.RES_JOB_ID: job, schema.RES_RANK: rank,
        schema.RES_WORLD_SIZE: world, schema.RES_HOST_NAME: "host0", schema.RES_PROCESS_PID: pid or 1000 + rank,
    }


@dataclass(slots=True)
class Group:
    name: str
    ranks: tuple[int, ...]
    id: str = field(init=False)
    encoded: str = field(init=False)
    index: dict[int, int] = field(init=False)

    def __post_init__(self) -> None:  # computed once: a 16k-member group is hashed per span otherwise
        self.id = schema.group_id(self.name, self.ranks)
        self.encoded = schema.encode_ranks(self.ranks)
        self.index = {r: i for i, r in enumerate(self.ranks)}


def collective(job: str, rank: int, world: int, group: Group, seq: int, start: float, end: float,
               op: str = schema.OP_ALL_REDUCE, nbytes: int = 4096, dtype: str = "float32",
               state: str = schema.STATE_COMPLETED) -> SpanRecord:
    trace = schema.collective_trace_id(job, group.id, seq)
    return SpanRecord(
        trace_id=trace, span_id=schema.rank_span_id(trace, rank), name=op,
        start_ns=int(start * 1e9), end_ns=int(end * 1e9),
        attributes={
            schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE, schema.ATTR_OP: op,
            schema.ATTR_GROUP_ID: group.id, schema.ATTR_GROUP_NAME: group.name,
            schema.ATTR_GROUP_SIZE: len(group.ranks), schema.ATTR_GROUP_RANKS: group.encoded,
            schema.ATTR_GROUP_RANK: group.index[rank], schema.ATTR_SEQ: seq,
            schema.ATTR_BYTES: nbytes, schema.ATTR_DTYPE: dtype, schema.ATTR_STATE: state,
        },
        resource=resource(job, rank, world),
    )


def p2p(job: str, rank: int, world: int, group: Group, op: str, peer: int, seq: int, start: float,
        end: float, nbytes: int = 4096) -> SpanRecord:
    src, dst = (rank, peer) if op == schema.OP_SEND else (peer, rank)
    trace = schema.p2p_trace_id(job, group.id, src, dst, seq)
    return SpanRecord(
        trace_id=trace, span_id=schema.rank_span_id(trace, rank), name=op,
        start_ns=int(start * 1e9), end_ns=int(end * 1e9),
        attributes={
            schema.ATTR_SPAN_KIND: schema.KIND_P2P, schema.ATTR_OP: op, schema.ATTR_GROUP_ID: group.id,
            schema.ATTR_GROUP_NAME: group.name, schema.ATTR_GROUP_SIZE: len(group.ranks),
            schema.ATTR_GROUP_RANKS: group.encoded, schema.ATTR_SEQ: seq, schema.ATTR_PEER: peer,
            schema.ATTR_P2P_SRC: src, schema.ATTR_P2P_DST: dst, schema.ATTR_BYTES: nbytes,
            schema.ATTR_STATE: schema.STATE_COMPLETED,
        },
        resource=resource(job, rank, world),
    )


@dataclass(slots=True)
class InFlightOp:
    group: Group
    seq: int
    op: str = schema.OP_ALL_REDUCE
    age_s: float = 0.0
    peer: int = -1
    nbytes: int = 4096


def heartbeat(job: str, rank: int, world: int, at: float, counter: int, groups: Sequence[Group],
              issued: Sequence[int], completed: Sequence[int], inflight: Sequence[InFlightOp] = (),
              idle_s: float = 0.0, stack: str = "", interval: float = 0.5, final: bool = False,
              exit_reason: str = "") -> SpanRecord:
    attrs: dict[str, AttrValue] = {
        schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT, schema.ATTR_HB_COUNTER: counter,
        schema.ATTR_HB_INTERVAL_S: interval, schema.ATTR_HB_IDLE_S: idle_s, schema.ATTR_HB_DROPPED: 0,
        schema.ATTR_HB_GROUP_IDS: [g.id for g in groups], schema.ATTR_HB_GROUP_NAMES: [g.name for g in groups],
        schema.ATTR_HB_GROUP_SIZES: [len(g.ranks) for g in groups],
        schema.ATTR_HB_GROUP_RANKS: [g.encoded for g in groups],
        schema.ATTR_HB_GROUP_ISSUED: list(issued), schema.ATTR_HB_GROUP_COMPLETED: list(completed),
        schema.ATTR_HB_INFLIGHT_GROUP_IDS: [o.group.id for o in inflight],
        schema.ATTR_HB_INFLIGHT_SEQS: [o.seq for o in inflight],
        schema.ATTR_HB_INFLIGHT_OPS: [o.op for o in inflight],
        schema.ATTR_HB_INFLIGHT_AGES_S: [o.age_s for o in inflight],
        schema.ATTR_HB_INFLIGHT_PEERS: [o.peer for o in inflight],
        schema.ATTR_HB_INFLIGHT_BYTES: [o.nbytes for o in inflight],
    }
    if stack:
        attrs[schema.ATTR_HB_STACK] = stack
    if final:
        attrs[schema.ATTR_HB_FINAL] = True
        attrs[schema.ATTR_HB_EXIT_REASON] = exit_reason or "exit"
    ns = int(at * 1e9)
    return SpanRecord(trace_id=(rank + 1) << 64 | counter, span_id=counter + 1, name=schema.SPAN_HEARTBEAT,
                      start_ns=ns, end_ns=ns, attributes=attrs, resource=resource(job, rank, world))


@dataclass
class StepJob:
    """A data-parallel job that all-reduces once per step in one world group.

    `steps()` yields the completed spans of healthy steps; helpers produce the
    heartbeats of a moment in which chosen ranks are stuck.
    """

    job: str
    world: int
    step_s: float = 0.1
    t0: float = 1000.0
    group: Group = field(init=False)
    seq: int = 0
    now: float = 0.0
    counter: int = 0

    def __post_init__(self) -> None:
        self.group = Group("0", tuple(range(self.world)))
        self.now = self.t0

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
            self.now = end
        return out

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
                                     [self.seq], idle_s=at - self.now, stack=stack))
            else:
                age = (blocked or {}).get(r, at - self.now)
                out.append(heartbeat(self.job, r, self.world, at, self.counter, [self.group], [nxt], [self.seq],
                                     [InFlightOp(self.group, nxt, age_s=age)]))
        return out
