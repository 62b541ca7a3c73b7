"""The cross-rank join: every rank's span of one collective -> one summary span.

All ranks' spans of a collective share a trace id (schema.collective_trace_id), so the
join key is the trace id. What a summary answers at a glance, without opening N rank
spans: who arrived first and last, by how much (arrival skew), how uneven the ranks'
durations were, what bandwidth the collective achieved (nccl-tests algbw / busbw) and
which members never reported.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord


class MalformedSpan(ValueError):
    """A Mycroft span whose join attributes are missing or unusable; the message says which."""


# nccl-tests (doc/PERFORMANCE.md) bus bandwidth factors, as a function of the group size n
def busbw_factor(op: str, n: int) -> float:
    """busbw = algbw * factor: the per-link load that makes ops comparable to peak bandwidth."""
    if n <= 1:
        return 1.0 if op in schema.P2P_OPS else 0.0
    if op == schema.OP_ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if op in (schema.OP_ALL_GATHER, schema.OP_REDUCE_SCATTER, schema.OP_ALL_TO_ALL,
              schema.OP_GATHER, schema.OP_SCATTER):
        return (n - 1) / n
    if op in (schema.OP_BROADCAST, schema.OP_REDUCE, schema.OP_SEND, schema.OP_RECV):
        return 1.0
    return 0.0  # barrier and unknown ops move no payload


def nccl_tests_size(op: str, rank_bytes: int, n: int) -> int:
    """The "size" nccl-tests divides by time. mycroft.bytes is the rank's input payload, which
    equals nccl-tests' size for every op except all_gather, whose size is the gathered output."""
    return rank_bytes * n if op == schema.OP_ALL_GATHER else rank_bytes


def _int(record: SpanRecord, key: str, default: int | None = None) -> int:
    value = record.attributes.get(key, default)
    if isinstance(value, bool) or value is None:
        raise MalformedSpan(f"{record.name}: attribute {key} missing or not an integer ({value!r})")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    raise MalformedSpan(f"{record.name}: attribute {key} is not an integer ({value!r})")


@dataclass(frozen=True, slots=True)
class CollectiveKey:
    """What every rank's span of one collective agrees on (read from the first span seen)."""

    job_id: str
    service: str
    op: str
    group_id: str
    seq: int
    rank_bytes: int
    dtype: str
    backend: str
    group_size: int
    members: frozenset[int] | None  # global ranks expected; None when only the size is known
    p2p_src: int | None = None
    p2p_dst: int | None = None

    @staticmethod
    def from_span(record: SpanRecord) -> CollectiveKey:
        """Parse a collective / p2p rank span; raises MalformedSpan on anything unusable."""
        op = record.attributes.get(schema.ATTR_OP)
        if not isinstance(op, str) or not op:
            raise MalformedSpan(f"{record.name}: attribute {schema.ATTR_OP} missing")
        if record.rank is None:
            raise MalformedSpan(f"{record.name}: no {schema.RES_RANK} on the span or its resource")
        if record.trace_id == 0:
            raise MalformedSpan(f"{record.name}: empty trace id")
        group_id = str(record.attributes.get(schema.ATTR_GROUP_ID, ""))
        seq = _int(record, schema.ATTR_SEQ)
        rank_bytes = _int(record, schema.ATTR_BYTES, 0)
        members: frozenset[int] | None = None
        src = dst = None
        if record.kind == schema.KIND_P2P or op in schema.P2P_OPS:
            if schema.ATTR_P2P_SRC in record.attributes and schema.ATTR_P2P_DST in record.attributes:
                src, dst = _int(record, schema.ATTR_P2P_SRC), _int(record, schema.ATTR_P2P_DST)
                members = frozenset((src, dst))
            size = 2
        else:
            ranks_text = record.attributes.get(schema.ATTR_GROUP_RANKS)
            if isinstance(ranks_text, str) and ranks_text:
                try:
                    members = frozenset(schema.decode_ranks(ranks_text))
                except ValueError as exc:
                    raise MalformedSpan(f"{record.name}: bad {schema.ATTR_GROUP_RANKS}: {exc}") from exc
            size = _int(record, schema.ATTR_GROUP_SIZE, len(members) if members else None)
            if size < 1:
                raise MalformedSpan(f"{record.name}: {schema.ATTR_GROUP_SIZE} must be >= 1, got {size}")
            if members is not None and len(members) != size:
                raise MalformedSpan(f"{record.name}: {schema.ATTR_GROUP_RANKS} lists {len(members)} ranks "
                                    f"but {schema.ATTR_GROUP_SIZE} is {size}")
        return CollectiveKey(
            job_id=record.job_id,
            service=str(record.resource.get(schema.RES_SERVICE_NAME, record.job_id)),
            op=op, group_id=group_id, seq=seq, rank_bytes=rank_bytes,
            dtype=str(record.attributes.get(schema.ATTR_DTYPE, "")),
            backend=str(record.attributes.get(schema.ATTR_BACKEND, "")),
            group_size=size, members=members, p2p_src=src, p2p_dst=dst,
        )


@dataclass(frozen=True, slots=True)
class Arrival:
    rank: int
    start_ns: int
    end_ns: int
    state: str


@dataclass(frozen=True, slots=True)
class CollectiveStats:
    """The numbers a summary span carries (times in seconds, bandwidth in GB/s)."""

    ranks: tuple[int, ...]
    missing: tuple[int, ...]
    complete: bool
    first_rank: int
    last_rank: int
    arrival_skew_s: float
    duration_min_s: float
    duration_max_s: float
    effective_s: float
    algbw_gbps: float
    busbw_gbps: float
    busbw_factor: float
    error_ranks: tuple[int, ...]
    start_ns: int
    end_ns: int


@dataclass(slots=True)
class CollectiveJoin:
    """The rank spans of one collective seen so far, plus its native algorithm hints."""

    trace_id: int
    key: CollectiveKey | None = None
    arrivals: dict[int, Arrival] = field(default_factory=dict)
    algos: Counter[str] = field(default_factory=Counter)
    protos: Counter[str] = field(default_factory=Counter)

    def add_rank_span(self, record: SpanRecord, key: CollectiveKey | None = None) -> bool:
        """Join one rank span (`key`: its parsed CollectiveKey, if the caller has it);
        False if that rank already reported (a retry / duplicate)."""
        if key is None:
            key = CollectiveKey.from_span(record)
        if self.key is None:
            self.key = key
        rank = record.rank
        assert rank is not None  # from_span checked it
        if rank in self.arrivals:
            return False
        state = str(record.attributes.get(schema.ATTR_STATE, schema.STATE_COMPLETED))
        self.arrivals[rank] = Arrival(rank, record.start_ns, max(record.end_ns, record.start_ns), state)
        return True

    def add_native_collective(self, record: SpanRecord) -> None:
        algo = record.attributes.get(schema.ATTR_NCCL_ALGO)
        proto = record.attributes.get(schema.ATTR_NCCL_PROTO)
        if isinstance(algo, str) and algo:
            self.algos[algo] += 1
        if isinstance(proto, str) and proto:
            self.protos[proto] += 1

    @property
    def expected_count(self) -> int:
        if self.key is None:
            return 0
        return len(self.key.members) if self.key.members is not None else self.key.group_size

    @property
    def complete(self) -> bool:
        if self.key is None:
            return False
        if self.key.members is not None:
            return self.key.members.issubset(self.arrivals)
        return len(self.arrivals) >= self.key.group_size

    def stats(self) -> CollectiveStats:
        if self.key is None or not self.arrivals:
            raise ValueError("no rank span joined yet")
        arrivals = sorted(self.arrivals.values(), key=lambda a: (a.start_ns, a.rank))
        first, last = arrivals[0], arrivals[-1]
        durations = [(a.end_ns - a.start_ns) / 1e9 for a in arrivals]
        max_end = max(a.end_ns for a in arrivals)
        # nccl-tests times the op on synchronised ranks; with skewed arrivals the op can only
        # run once the last member is in, so its effective time is last arrival -> last completion.
        effective_s = (max_end - last.start_ns) / 1e9
        if effective_s <= 0:
            effective_s = min(durations)
        n = self.key.group_size
        size = nccl_tests_size(self.key.op, self.key.rank_bytes, n)
        algbw = size / effective_s / 1e9 if effective_s > 0 else 0.0
        factor = busbw_factor(self.key.op, n)
        missing = tuple(sorted(self.key.members.difference(self.arrivals))) if self.key.members else ()
        errors = tuple(sorted(a.rank for a in arrivals if a.state != schema.STATE_COMPLETED))
        return CollectiveStats(
            ranks=tuple(sorted(self.arrivals)), missing=missing, complete=self.complete,
            first_rank=first.rank, last_rank=last.rank,
            arrival_skew_s=(last.start_ns - first.start_ns) / 1e9,
            duration_min_s=min(durations), duration_max_s=max(durations),
            effective_s=effective_s, algbw_gbps=algbw, busbw_gbps=algbw * factor, busbw_factor=factor,
            error_ranks=errors, start_ns=first.start_ns, end_ns=max_end,
        )

    def algorithm(self) -> tuple[str, str]:
        """(algo, proto): what most ranks' native spans said, else the torch backend."""
        algo = self.algos.most_common(1)[0][0] if self.algos else (self.key.backend if self.key else "")
        proto = self.protos.most_common(1)[0][0] if self.protos else ""
        return algo, proto


def summary_span(join: CollectiveJoin, stats: CollectiveStats, *, closed: str, anomaly: str,
                 flows: int, detail_spans: int) -> SpanRecord:
    """The collective's summary span. It belongs to the collective, not to a rank: its resource
    names only the job, and it carries no mycroft.rank."""
    key = join.key
    if key is None:
        raise ValueError("summary of a join without rank spans")
    algo, proto = join.algorithm()
    attributes: dict[str, AttrValue] = {
        schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE_SUMMARY,
        schema.ATTR_JOB_ID: key.job_id,
        schema.ATTR_OP: key.op,
        schema.ATTR_GROUP_ID: key.group_id,
        schema.ATTR_GROUP_SIZE: key.group_size,
        schema.ATTR_SEQ: key.seq,
        schema.ATTR_BYTES: key.rank_bytes,
        schema.ATTR_DTYPE: key.dtype,
        schema.ATTR_BACKEND: key.backend,
        schema.ATTR_SUM_RANKS: list(stats.ranks),
        schema.ATTR_SUM_MISSING_RANKS: list(stats.missing),
        schema.ATTR_SUM_EXPECTED: join.expected_count,
        schema.ATTR_SUM_COMPLETE: stats.complete,
        schema.ATTR_SUM_FIRST_RANK: stats.first_rank,
        schema.ATTR_SUM_LAST_RANK: stats.last_rank,
        schema.ATTR_SUM_ARRIVAL_SKEW_S: stats.arrival_skew_s,
        schema.ATTR_SUM_DURATION_MIN_S: stats.duration_min_s,
        schema.ATTR_SUM_DURATION_MAX_S: stats.duration_max_s,
        schema.ATTR_SUM_DURATION_SPREAD_S: stats.duration_max_s - stats.duration_min_s,
        schema.ATTR_SUM_EFFECTIVE_S: stats.effective_s,
        schema.ATTR_SUM_ALGBW_GBPS: stats.algbw_gbps,
        schema.ATTR_SUM_BUSBW_GBPS: stats.busbw_gbps,
        schema.ATTR_SUM_BUSBW_FACTOR: stats.busbw_factor,
        schema.ATTR_SUM_ALGO: algo,
        schema.ATTR_SUM_PROTO: proto,
        schema.ATTR_SUM_CLOSED: closed,
        schema.ATTR_SUM_ERROR_RANKS: list(stats.error_ranks),
        schema.ATTR_SUM_ANOMALY: anomaly,
        schema.ATTR_SUM_FLOWS: flows,
        schema.ATTR_SUM_DETAIL_SPANS: detail_spans,
    }
    if key.p2p_src is not None and key.p2p_dst is not None:
        attributes[schema.ATTR_P2P_SRC] = key.p2p_src
        attributes[schema.ATTR_P2P_DST] = key.p2p_dst
    failed = bool(stats.missing) or not stats.complete or bool(stats.error_ranks)
    return SpanRecord(
        trace_id=join.trace_id,
        span_id=schema.rank_span_id(join.trace_id, -1, "summary"),
        name=schema.SPAN_COLLECTIVE_SUMMARY,
        start_ns=stats.start_ns,
        end_ns=stats.end_ns,
        attributes=attributes,
        resource={
            schema.RES_SERVICE_NAME: key.service,
            schema.RES_JOB_ID: key.job_id,
            schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
        },
        status_code=2 if failed else 0,
        status_message=anomaly if failed else "",
        scope=schema.PROCESSOR_SCOPE,
    )
