"""Native per-step detail -> one summary span per flow.

The NCCL plugin reports a span per proxy step and periodic per-flow counter samples:
thousands of spans per collective on a large job, almost all of them saying "this flow
progressed normally". A flow summary keeps what root cause analysis reads from them
(the final GPU-ready / transmitted / done counters, the stall state, step timing and
throughput) in one span per (rank, channel, peer, direction). The accumulator is
incremental, so condensing costs O(flows) memory however many steps arrive.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord

DETAIL_KINDS = frozenset({schema.KIND_NATIVE_FLOW, schema.KIND_NATIVE_STEP, schema.KIND_NATIVE_KERNEL_CHANNEL})
DETAIL_NAMES = frozenset({schema.SPAN_NATIVE_FLOW, schema.SPAN_NATIVE_STEP, schema.SPAN_NATIVE_KERNEL_CHANNEL})

FlowKey = tuple[int, int, int, bool]  # (rank, channel, peer, is_send)


def _num(attributes: dict[str, AttrValue], key: str, default: int = -1) -> int:
    value = attributes.get(key, default)
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return default


def flow_key(record: SpanRecord) -> FlowKey:
    rank = record.rank
    attrs = record.attributes
    is_send = attrs.get(schema.ATTR_NCCL_IS_SEND, False)
    return (-1 if rank is None else rank, _num(attrs, schema.ATTR_NCCL_CHANNEL), _num(attrs, schema.ATTR_PEER),
            bool(is_send) if not isinstance(is_send, str) else is_send.lower() == "true")


@dataclass(slots=True)
class FlowAccumulator:
    """Running condensation of one flow's native detail."""

    trace_id: int
    key: FlowKey
    resource: dict[str, AttrValue]
    parent_span_id: int = 0
    raw_spans: int = 0
    steps_seen: int = 0
    step_time_s: float = 0.0
    step_max_s: float = 0.0
    steps_required: int = -1
    chunk_size: int = -1
    gpu_ready: int = 0
    transmitted: int = 0
    done: int = 0
    reported_state: str = ""
    reported_state_end_ns: int = -1
    start_ns: int = 0
    end_ns: int = 0
    carried: dict[str, AttrValue] = field(default_factory=dict)  # comm hash, algo, proto

    def add(self, record: SpanRecord) -> None:
        attrs = record.attributes
        if self.raw_spans == 0:
            self.start_ns, self.end_ns = record.start_ns, record.end_ns
            self.parent_span_id = record.parent_span_id
        else:
            self.start_ns = min(self.start_ns, record.start_ns)
            self.end_ns = max(self.end_ns, record.end_ns)
        self.raw_spans += 1
        if record.kind == schema.KIND_NATIVE_STEP or record.name == schema.SPAN_NATIVE_STEP:
            seconds = max(0, record.end_ns - record.start_ns) / 1e9
            self.steps_seen += 1
            self.step_time_s += seconds
            self.step_max_s = max(self.step_max_s, seconds)
        self.steps_required = max(self.steps_required, _num(attrs, schema.ATTR_NCCL_STEPS))
        self.chunk_size = max(self.chunk_size, _num(attrs, schema.ATTR_NCCL_CHUNK_SIZE))
        # the counters are cumulative: the largest sample is the latest
        self.gpu_ready = max(self.gpu_ready, _num(attrs, schema.ATTR_FLOW_GPU_READY, 0))
        self.transmitted = max(self.transmitted, _num(attrs, schema.ATTR_FLOW_TRANSMITTED, 0))
        self.done = max(self.done, _num(attrs, schema.ATTR_FLOW_DONE, 0))
        state = attrs.get(schema.ATTR_FLOW_STALL_STATE)
        if isinstance(state, str) and state and record.end_ns >= self.reported_state_end_ns:
            self.reported_state, self.reported_state_end_ns = state, record.end_ns
        for carried in (schema.ATTR_NCCL_COMM_HASH, schema.ATTR_NCCL_ALGO, schema.ATTR_NCCL_PROTO,
                        schema.ATTR_NCCL_FUNC):
            if carried in attrs and carried not in self.carried:
                self.carried[carried] = attrs[carried]

    def summary(self) -> SpanRecord:
        rank, channel, peer, is_send = self.key
        steps_done = max(self.done, self.steps_seen)
        total_bytes = steps_done * self.chunk_size if self.chunk_size > 0 else 0
        seconds = (self.end_ns - self.start_ns) / 1e9
        attributes: dict[str, AttrValue] = {
            schema.ATTR_SPAN_KIND: schema.KIND_FLOW_SUMMARY,
            schema.ATTR_RANK: rank,
            schema.ATTR_NCCL_CHANNEL: channel,
            schema.ATTR_PEER: peer,
            schema.ATTR_NCCL_IS_SEND: is_send,
            schema.ATTR_NCCL_STEPS: self.steps_required,
            schema.ATTR_NCCL_CHUNK_SIZE: self.chunk_size,
            schema.ATTR_FLOW_GPU_READY: self.gpu_ready,
            schema.ATTR_FLOW_TRANSMITTED: self.transmitted,
            schema.ATTR_FLOW_DONE: self.done,
            schema.ATTR_FLOW_STALL_STATE: self.reported_state or schema.flow_state(
                self.gpu_ready, self.transmitted, self.done, self.steps_required),
            schema.ATTR_FLOW_SUM_RAW_SPANS: self.raw_spans,
            schema.ATTR_FLOW_SUM_STEPS: self.steps_seen,
            schema.ATTR_FLOW_SUM_STEP_MEAN_S: self.step_time_s / self.steps_seen if self.steps_seen else 0.0,
            schema.ATTR_FLOW_SUM_STEP_MAX_S: self.step_max_s,
            schema.ATTR_FLOW_SUM_BYTES: total_bytes,
            schema.ATTR_FLOW_SUM_GBPS: total_bytes / seconds / 1e9 if seconds > 0 else 0.0,
            **self.carried,
        }
        return SpanRecord(
            trace_id=self.trace_id,
            span_id=schema.rank_span_id(self.trace_id, rank, f"flow:{channel}:{peer}:{int(is_send)}"),
            parent_span_id=self.parent_span_id,
            name=schema.SPAN_FLOW_SUMMARY,
            start_ns=self.start_ns,
            end_ns=self.end_ns,
            attributes=attributes,
            resource=self.resource,
            scope=schema.PROCESSOR_SCOPE,
        )


@dataclass(slots=True)
class FlowCondenser:
    """All flows of one collective, capped at `max_flows`."""

    trace_id: int
    max_flows: int
    flows: dict[FlowKey, FlowAccumulator] = field(default_factory=dict)

    def add(self, record: SpanRecord) -> bool:
        """Fold one detail span in; False if it opens a flow beyond the cap (the caller counts it)."""
        key = flow_key(record)
        acc = self.flows.get(key)
        if acc is None:
            if len(self.flows) >= self.max_flows:
                return False
            acc = self.flows[key] = FlowAccumulator(self.trace_id, key, record.resource)
        acc.add(record)
        return True

    def summaries(self) -> list[SpanRecord]:
        return [self.flows[key].summary() for key in sorted(self.flows)]


def kept_detail(record: SpanRecord, reason: str) -> SpanRecord:
    """A raw detail span re-emitted because its collective looked anomalous, saying why."""
    return SpanRecord(
        trace_id=record.trace_id, span_id=record.span_id, parent_span_id=record.parent_span_id,
        name=record.name, start_ns=record.start_ns, end_ns=record.end_ns,
        attributes={**record.attributes, schema.ATTR_SUM_KEPT_REASON: reason},
        resource=record.resource, status_code=record.status_code, status_message=record.status_message,
        scope=schema.PROCESSOR_SCOPE,
    )
