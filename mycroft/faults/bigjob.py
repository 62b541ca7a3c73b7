"""A big simulated job on the real path: N ranks' heartbeats (and op spans) over OTLP/gRPC.

The RCA service cannot be tested at 16,384 ranks with real processes on one machine, so
this module simulates the ranks, not the wire: every span is built by the
instrumentation's own encoders (`instrumentation.spans.heartbeat_attributes`,
`heartbeat_span`, `op_span`, from the same GroupInfo / OpRecord objects a rank holds)
and serialized with the project's OTLP encoder. To send 16k heartbeats a second from
Python, a rank's heartbeat is spliced from parts: the attributes that never change for
a rank (its groups) are serialized once, the ones that change are serialized once per
tick per *situation* (healthy, waiting, holding) and appended — protobuf merges
concatenated messages (repeated fields append, last scalar wins), so the bytes decode to
exactly what the encoders built for that rank (tests/rca/test_bigjob.py checks it).

Layout: TP x PP x DP with groups tp<i>, dp<i> and the world group. Each rank completes
`ops_per_s` collectives a second (TP most, a DP and a world all-reduce per step).
Faults (simfaults.py): from `fault_at` on, every rank plays a role (holder, waiter in TP /
DP / world, silent, mismatched, crossed, a member of a stalled or slow DP ring, the slow
rank); a role's heartbeat body is shared, what differs per rank (its groups, the group of
its in-flight op, ages, comm time, native flows) is appended. Hangs freeze the frontier;
slowdowns stretch the step (Clock.advance) and the faulty rank's compute share.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from mycroft import __version__, schema
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.op_record import OpRecord
from mycroft.instrumentation.spans import heartbeat_attributes, heartbeat_span, op_span
from mycroft.otlp import AttrValue, SpanRecord, _kvs, _span_to_proto

from .simfaults import (
    COMPUTE,
    CROSSED,
    DP_MISMATCHED,
    DP_WAITER,
    FLOW_ROLES,
    GPU_SLOW,
    HANGS,
    HEALTHY,
    HOLDER,
    INFLIGHT_GROUP,
    MISMATCHED,
    RING,
    RING_STUCK,
    SILENT,
    SLOW,
    SLOW_RING,
    STALLED,
    TP_WAITER,
    WORLD_WAITER,
    FaultPlan,
    flow_attributes,
    ring_flows,
    step_time,
)

STACK = 'File "train.py", line 88, in train_step\n  File "model.py", line 212, in fused_attention'
#: attributes that never change for a rank: serialized once per rank
STATIC_KEYS = (schema.ATTR_RANK, schema.ATTR_HB_GROUP_IDS, schema.ATTR_HB_GROUP_NAMES, schema.ATTR_HB_GROUP_SIZES,
               schema.ATTR_HB_GROUP_RANKS, schema.ATTR_HB_GROUP_DESCS)
#: per rank and situation (which group the op in flight is in)
RANK_KEYS = (schema.ATTR_HB_INFLIGHT_GROUP_IDS,)
#: per rank and beat: real ranks never report the same ages / comm time to the microsecond
JITTER_KEYS = (schema.ATTR_HB_INFLIGHT_AGES_S, schema.ATTR_HB_COMM_S)
#: native flow counters: per rank (peers, counters), appended after the shared body
FLOW_PREFIX = "mycroft.hb.flow."


NOISE = 0.02  # share of an interval


def jitter_ns(rank: int) -> int:
    """A rank's own offset (under 1 ms) in when it issued its op and how long it communicated."""
    return (rank * 7919 % 997) * 1000


@dataclass(frozen=True, slots=True)
class Layout:
    world: int
    tp: int = 8
    pp: int = 1

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp)

    def tp_ranks(self, rank: int) -> tuple[int, ...]:
        base = rank - rank % self.tp
        return tuple(range(base, base + self.tp))

    def dp_ranks(self, rank: int) -> tuple[int, ...]:
        stride = self.tp * self.pp
        return tuple(range(rank % stride, self.world, stride))


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _attrs_bytes(attrs: dict[str, AttrValue]) -> bytes:
    """Span attributes (field 9) serialized on their own: appendable to any Span's bytes."""
    return Span(attributes=_kvs(attrs)).SerializeToString()


@dataclass
class Clock:
    """The job's pace: training steps completed (a healthy step takes one interval) and the
    cumulative communication seconds of a healthy rank and of the faulty one."""

    ops_per_s: int
    steps: float = 0.0
    comm_s: float = 0.0  # what every rank that only waits reports
    slow_comm_s: float = 0.0  # the rank whose compute grew (GPU faults)

    @property
    def tp(self) -> int:
        return int(self.steps * max(1, self.ops_per_s - 2) + 1e-9)

    @property
    def dp(self) -> int:
        return int(self.steps + 1e-9) if self.ops_per_s >= 2 else 0

    @property
    def world(self) -> int:
        return int(self.steps + 1e-9) if self.ops_per_s >= 3 else 0

    @property
    def ops_done(self) -> int:
        return self.tp + self.dp + self.world

    def advance(self, interval_s: float, step: float = 1.0, own_compute: float = COMPUTE) -> None:
        """One interval at `step` intervals per training step; the slow rank computes `own_compute`."""
        self.steps += 1.0 / step
        self.comm_s += interval_s * (step - COMPUTE) / step
        self.slow_comm_s += interval_s * (step - own_compute) / step

    def copy(self) -> Clock:
        return Clock(self.ops_per_s, self.steps, self.comm_s, self.slow_comm_s)


@dataclass
class BigJob:
    """N simulated ranks of one job; builds OTLP request bytes for any slice of them."""

    job_id: str
    layout: Layout
    ops_per_s: int = 10
    interval_s: float = 1.0
    fault_rank: int = -1
    fault_at: float = 0.0  # unix time; 0: no fault
    run_id: str = "bigjob.0"
    fault: FaultPlan | None = None  # default: block at fault_rank
    clock: Clock = field(init=False)
    groups: dict[int, list[GroupInfo]] = field(init=False, default_factory=dict)
    world_group: GroupInfo = field(init=False)
    _rank_bytes: dict[int, tuple[bytes, bytes, bytes]] = field(init=False, default_factory=dict)
    _op_base: dict[tuple[int, int], bytes] = field(init=False, default_factory=dict)
    _frozen: Clock | None = field(init=False, default=None)
    _prev: Clock | None = field(init=False, default=None)
    counter: int = 0

    def __post_init__(self) -> None:
        self.clock = Clock(self.ops_per_s)
        self._ids: dict[str, tuple[str, str]] = {}
        self._dp: dict[int, tuple[int, ...]] = {}
        world = tuple(range(self.layout.world))
        self.world_group = self._info("world", world, 0)  # group_rank per rank: rank_groups()
        if self.fault is None:
            self.fault = FaultPlan("block", self.fault_rank)
        self.fault_rank = self.fault.rank
        self._roles = self._role_table(self.fault)

    # ------------------------------------------------------------------ groups, as a rank holds them
    def _info(self, name: str, ranks: tuple[int, ...], group_rank: int) -> GroupInfo:
        known = self._ids.get(name)
        if known is None:
            known = self._ids[name] = (schema.group_id(name, ranks), schema.encode_ranks(ranks))
        return GroupInfo(gid=known[0], name=name, desc=name, ranks=ranks, ranks_text=known[1],
                         group_rank=group_rank, backend="nccl", pg=None, has_counter=False)

    def rank_groups(self, rank: int) -> list[GroupInfo]:
        found = self.groups.get(rank)
        if found is None:
            stride = self.layout.tp * self.layout.pp
            dp_index = rank % stride
            dp = self._dp.get(dp_index)
            if dp is None:
                dp = self._dp[dp_index] = self.layout.dp_ranks(rank)
            world = self.world_group
            found = self.groups[rank] = [
                self._info(f"tp{rank // self.layout.tp}", self.layout.tp_ranks(rank), rank % self.layout.tp),
                self._info(f"dp{dp_index}", dp, rank // stride),
                self._info(world.name, world.ranks, rank),
            ]
        return found

    # ------------------------------------------------------------------ roles (simfaults.py)
    def _role_table(self, p: FaultPlan) -> tuple[dict[int, str], str]:
        """Ranks with a role of their own after the onset, and the role of everyone else."""
        f, lay = p.rank, self.layout
        if f < 0 or p.kind == "none":
            return {}, HEALTHY
        tp_peers = [r for r in lay.tp_ranks(f) if r != f]
        ring = lay.dp_ranks(f)
        if p.kind == "block":
            return {f: HOLDER, **{r: TP_WAITER for r in tp_peers}}, WORLD_WAITER
        if p.kind == "chain":
            # the data-parallel rings of the stuck TP group wait in their all-reduce on a stuck member;
            # every other ring completes its all-reduce (all its members entered) and then waits in the
            # world collective: world -> DP ring -> TP group -> the holder
            rings = {r: DP_WAITER for member in (f, *tp_peers) for r in lay.dp_ranks(member)}
            return {**rings, f: HOLDER, **{r: TP_WAITER for r in tp_peers}}, WORLD_WAITER
        if p.kind in ("crash", "freeze"):
            return {f: SILENT, **{r: TP_WAITER for r in tp_peers}}, WORLD_WAITER
        if p.kind == "mismatch":
            if lay.tp < 2:  # no TP group: the DP all-reduce is where f's signature differs
                return {f: DP_MISMATCHED, **{r: DP_WAITER for r in ring if r != f}}, WORLD_WAITER
            return {f: MISMATCHED, **{r: TP_WAITER for r in tp_peers}}, WORLD_WAITER
        if p.kind == "deadlock":
            if lay.tp < 2:  # the partner crossed into the world collective before its DP all-reduce
                return {**{r: DP_WAITER for r in ring}, p.partner: CROSSED}, WORLD_WAITER
            return {**{r: TP_WAITER for r in lay.tp_ranks(f)}, p.partner: CROSSED}, WORLD_WAITER
        if p.kind == "nic_down":
            return {r: RING_STUCK for r in ring}, WORLD_WAITER
        if p.kind == "straggler":
            return {f: SLOW}, HEALTHY
        if p.kind in GPU_SLOW:
            return {**{r: RING for r in ring}, f: SLOW_RING}, HEALTHY
        return {r: RING for r in ring}, HEALTHY  # NET_SLOW

    def situation(self, rank: int, now: float) -> str:
        if not self.fault_at or now < self.fault_at or self.fault_rank < 0:
            return HEALTHY
        own, rest = self._roles
        return own.get(rank, rest)

    def sends(self, rank: int, now: float) -> bool:
        """A crashed or frozen rank sends nothing from the onset on (no final heartbeat)."""
        return self.situation(rank, now) != SILENT

    def tick(self, now: float) -> None:
        """One heartbeat interval passed: the job moves at its pace (or stops, when it hangs)."""
        assert self.fault is not None
        self.counter += 1
        self._prev = self.clock.copy()
        if self.fault_at and now >= self.fault_at:
            if self.fault.kind in HANGS:
                if self._frozen is None:  # the ops in flight at the last healthy beat completed; then it stops
                    self.clock.advance(self.interval_s)
                    self._frozen = self.clock.copy()
                return
            step, own = step_time(self.fault, self.counter)
            self.clock.advance(self.interval_s, step, own)
            return
        self.clock.advance(self.interval_s)

    def record(self, rank: int, now: float) -> SpanRecord:
        """The rank's heartbeat as the instrumentation builds it (spans.py + runtime.py's extras)."""
        assert self.fault is not None
        clock = self._frozen or self.clock
        groups = self.rank_groups(rank)
        tp, dp, world = groups
        kind = self.situation(rank, now)
        tp.issued, tp.completed = clock.tp, clock.tp
        dp.issued, dp.completed = clock.dp, clock.dp
        world.issued, world.completed = clock.world, clock.world
        now_ns = int(now * 1e9)
        inflight: list[OpRecord] = []
        g = INFLIGHT_GROUP.get(kind)
        if g is not None:
            info = groups[g]
            op = OpRecord("all_reduce", schema.OP_ALL_REDUCE, info, info.completed + 1,
                          self._op_start(rank, kind, now))
            info.issued = op.seq
            op.bytes, op.dtype = 1 << 20, "float32"
            if kind in (MISMATCHED, DP_MISMATCHED):
                if self.fault.mismatch_field == "dtype":
                    op.dtype = "float64"
                else:
                    op.bytes = 2 << 20
            inflight.append(op)
        idle_s = now - self.fault_at if kind == HOLDER else 0.0
        attributes = heartbeat_attributes(groups, inflight, now_ns, idle_s)
        attributes[schema.ATTR_HB_DROPPED] = 0
        attributes[schema.ATTR_HB_COMM_S] = self._comm_s(rank, kind, now)
        attributes[schema.ATTR_HB_OPS_DONE] = clock.ops_done
        if kind == HOLDER and idle_s >= 0.5:
            attributes[schema.ATTR_HB_STACK] = STACK
        if kind in FLOW_ROLES:
            attributes.update(self._flows(rank, kind, now))
        start_ns = now_ns - int(self.interval_s * 1e9)
        return heartbeat_span(rank, self.counter, self.interval_s, start_ns, now_ns, attributes, _RNG)

    def _flows(self, rank: int, kind: str, now: float) -> dict[str, AttrValue]:
        """The native flow counters of the rank's in-flight DP all-reduce (simfaults.ring_flows)."""
        assert self.fault is not None
        dp = self.rank_groups(rank)[1]
        comm = dp.gid[:16]  # a stable per-group NCCL commHash stand-in (hex)
        flows = ring_flows(self.fault, dp.ranks, rank, self._stalled(RING_STUCK, now), self.counter)
        return dict(flow_attributes(flows, comm, (self._frozen or self.clock).dp + 1, rank))

    def _stalled(self, kind: str, now: float) -> float:
        return now - self.fault_at if kind in STALLED else 0.0

    def _op_start(self, rank: int, kind: str, now: float) -> int:
        return int(now * 1e9) - int((self._stalled(kind, now) or 0.004) * 1e9) - jitter_ns(rank)

    def _comm_s(self, rank: int, kind: str, now: float) -> float:
        clock = self._frozen or self.clock
        comm = clock.slow_comm_s if kind in (SLOW, SLOW_RING) else clock.comm_s
        return round(comm + self._stalled(kind, now) + jitter_ns(rank) / 1e9 + self._noise(rank), 6)

    def _noise(self, rank: int) -> float:
        """Real ranks do not wait the same to the millisecond: +-NOISE of an interval per beat
        (deterministic in rank and beat, so spliced and built heartbeats agree)."""
        h = (rank * 2654435761 + self.counter * 40503 + 12345) % 100_003
        return NOISE * self.interval_s * (2 * h / 100_003 - 1)

    def _jitter_bytes(self, rank: int, kind: str, now: float) -> bytes:
        """The rank's own ages and comm time, computed as heartbeat_attributes() computes them."""
        ages = ([round(max(0, int(now * 1e9) - self._op_start(rank, kind, now)) / 1e9, 4)]
                if INFLIGHT_GROUP.get(kind) is not None else [])
        return _attrs_bytes({schema.ATTR_HB_INFLIGHT_AGES_S: ages,
                             schema.ATTR_HB_COMM_S: self._comm_s(rank, kind, now)})

    # ------------------------------------------------------------------ wire
    def resource(self, rank: int) -> dict[str, AttrValue]:
        return {
            schema.RES_SERVICE_NAME: self.job_id, schema.RES_JOB_ID: self.job_id, schema.RES_RUN_ID: self.run_id,
            schema.RES_RANK: rank, schema.RES_WORLD_SIZE: self.layout.world, schema.RES_LOCAL_RANK: rank % 8,
            schema.RES_HOST_NAME: f"node{rank // 8:05d}", schema.RES_PROCESS_PID: 10_000 + rank % 50_000,
            schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
        }

    def prepare(self, rank: int) -> tuple[bytes, bytes, bytes]:
        """(ResourceSpans' resource field + scope, the heartbeat's per-rank static span bytes)."""
        found = self._rank_bytes.get(rank)
        if found is None:
            resource = _field(1, Resource(attributes=_kvs(self.resource(rank))).SerializeToString())
            scope = _field(1, InstrumentationScope(name=schema.INSTRUMENTATION_SCOPE,
                                                   version=__version__).SerializeToString())
            full = self.record(rank, 0.0).attributes
            static = _attrs_bytes({k: full[k] for k in STATIC_KEYS})
            found = self._rank_bytes[rank] = (resource + b"\x12", scope, static)
        return found

    def heartbeat_bytes(self, ranks: Sequence[int], now: float) -> bytes:
        """One ExportTraceServiceRequest holding one heartbeat of each rank (that still sends)."""
        return self.heartbeat_request(ranks, now)[0]

    def heartbeat_request(self, ranks: Sequence[int], now: float) -> tuple[bytes, int]:
        """One ExportTraceServiceRequest holding one heartbeat of each rank that still sends
        (spliced, see module doc), and how many heartbeats it holds."""
        shared: dict[str, bytes] = {}
        per_rank: dict[tuple[str, str], bytes] = {}
        out = []
        for rank in ranks:
            kind = self.situation(rank, now)
            if kind == SILENT:
                continue
            resource_tag, scope, static = self.prepare(rank)
            body = shared.get(kind)
            if body is None:
                record = self.record(rank, now)
                span = _span_to_proto(SpanRecord(record.trace_id, record.span_id, record.name, record.start_ns,
                                                 record.end_ns, {k: v for k, v in record.attributes.items()
                                                                 if k not in STATIC_KEYS and k not in RANK_KEYS
                                                                 and k not in JITTER_KEYS
                                                                 and not k.startswith(FLOW_PREFIX)},
                                                 status_code=record.status_code))
                body = shared[kind] = span.SerializeToString()
            gid = self._inflight_gid(rank, kind)
            key = (kind, gid)
            own = per_rank.get(key)
            if own is None:
                own = per_rank[key] = _attrs_bytes({schema.ATTR_HB_INFLIGHT_GROUP_IDS: [gid] if gid else []})
            flows = _attrs_bytes(self._flows(rank, kind, now)) if kind in FLOW_ROLES else b""
            ids = b"\x0a\x10" + os.urandom(16) + b"\x12\x08" + os.urandom(8)
            span_bytes = body + static + own + self._jitter_bytes(rank, kind, now) + flows + ids
            scope_spans = scope + _field(2, span_bytes)
            rs = resource_tag + _varint(len(scope_spans)) + scope_spans
            out.append(_field(1, rs))
        return b"".join(out), len(out)

    def _inflight_gid(self, rank: int, kind: str) -> str:
        g = INFLIGHT_GROUP.get(kind)
        return self.rank_groups(rank)[g].gid if g is not None else ""

    def op_span_bytes(self, ranks: Sequence[int], now: float, keep: float = 1.0) -> tuple[bytes, int]:
        """The op spans the ranks finished in the last interval (none while hung), head-sampled
        by trace id at rate `keep` (schema.keep_trace: every rank keeps the same collectives).
        Returns (request bytes, spans in it)."""
        assert self.fault is not None
        if self.fault_at and now >= self.fault_at and self.fault.kind in HANGS:
            return b"", 0
        clock, prev = self.clock, self._prev or Clock(self.ops_per_s)
        start = int(now * 1e9) - int(self.interval_s * 1e9)
        plan: list[tuple[int, int]] = []  # (group index, seq) of the interval's ops, in order
        plan += [(0, seq) for seq in range(prev.tp + 1, clock.tp + 1)]
        plan += [(1, seq) for seq in range(prev.dp + 1, clock.dp + 1)]
        plan += [(2, seq) for seq in range(prev.world + 1, clock.world + 1)]
        step_ns = int(self.interval_s * 1e9 / max(1, len(plan)))
        out = []
        count = 0
        traces: dict[tuple[str, int], int] = {}
        seqs: dict[int, bytes] = {}
        for rank in ranks:
            groups = self.rank_groups(rank)
            resource_tag, scope, _ = self.prepare(rank)
            spans = []
            for i, (g, seq) in enumerate(plan):
                info = groups[g]
                trace = traces.get((info.gid, seq))
                if trace is None:
                    trace = traces[(info.gid, seq)] = schema.collective_trace_id(self.job_id, info.gid, seq)
                if keep < 1.0 and not schema.keep_trace(trace, keep):
                    continue
                begin = start + i * step_ns
                ids = (b"\x0a\x10" + trace.to_bytes(16, "big") + b"\x12\x08"
                       + schema.rank_span_id(trace, rank).to_bytes(8, "big")
                       + b"\x39" + struct.pack("<Q", begin) + b"\x41" + struct.pack("<Q", begin + step_ns // 2))
                seq_kv = seqs.get(seq)
                if seq_kv is None:
                    seq_kv = seqs[seq] = _attrs_bytes({schema.ATTR_SEQ: seq})
                spans.append(_field(2, self._op_base_bytes(rank, g) + ids + seq_kv))
            if spans:
                count += len(spans)
                scope_spans = scope + b"".join(spans)
                out.append(_field(1, resource_tag + _varint(len(scope_spans)) + scope_spans))
        return b"".join(out), count

    def op_record(self, rank: int, g: int, seq: int, start_ns: int, end_ns: int) -> SpanRecord:
        """One op span exactly as the instrumentation builds it (op_span of a completed OpRecord)."""
        op = OpRecord("all_reduce", schema.OP_ALL_REDUCE, self.rank_groups(rank)[g], seq, start_ns)
        op.end_ns = end_ns
        op.bytes, op.dtype, op.state = 1 << 20, "float32", schema.STATE_COMPLETED
        return op_span(op, self.job_id, rank)

    def _op_base_bytes(self, rank: int, g: int) -> bytes:
        """An op span of (rank, group) without its seq; ids, times and seq are appended per op."""
        found = self._op_base.get((rank, g))
        if found is None:
            record = self.op_record(rank, g, 1, 0, 0)
            record.attributes.pop(schema.ATTR_SEQ)
            found = self._op_base[(rank, g)] = _span_to_proto(record).SerializeToString()
        return found


_RNG = random.Random(11)
