"""Pure functions: OpRecords and rank state in, SpanRecords out (the span contract).

Runs on the background thread, never on the training thread.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.op_record import OpRecord

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord

STATUS_OK = 1
STATUS_ERROR = 2

_NAMES: dict[Any, str] = {}


def readable(value: Any) -> str:
    """torch.float32 -> "float32", ReduceOp.SUM / RedOpType.SUM -> "sum" (cached: few distinct values)."""
    if value is None:
        return ""
    try:
        return _NAMES[value]
    except (KeyError, TypeError):
        pass
    name = str(value).rsplit(".", 1)[-1]
    try:
        _NAMES[value] = name
    except TypeError:
        pass
    return name


def group_attributes(info: GroupInfo) -> dict[str, AttrValue]:
    return {
        schema.ATTR_GROUP_ID: info.gid,
        schema.ATTR_GROUP_NAME: info.name,
        schema.ATTR_GROUP_DESC: info.desc,
        schema.ATTR_GROUP_SIZE: info.size,
        schema.ATTR_GROUP_RANKS: info.ranks_text,
        schema.ATTR_GROUP_RANK: info.group_rank,
        schema.ATTR_BACKEND: info.backend,
    }


def op_trace_id(record: OpRecord, job_id: str) -> int:
    """The op's deterministic trace id: every member computes the same one."""
    if record.op in schema.P2P_OPS:
        return schema.p2p_trace_id(job_id, record.group.gid, record.src, record.dst, record.seq)
    return schema.collective_trace_id(job_id, record.group.gid, record.seq)


def op_span(record: OpRecord, job_id: str, rank: int, end_ns: int | None = None,
            trace_id: int | None = None) -> SpanRecord:
    """One rank's span of one collective / p2p op, in the collective's deterministic trace
    (`trace_id`: op_trace_id's answer, where the caller has it already)."""
    info = record.group
    is_p2p = record.op in schema.P2P_OPS
    if trace_id is None:
        trace_id = op_trace_id(record, job_id)
    attributes: dict[str, AttrValue] = {
        schema.ATTR_SPAN_KIND: schema.KIND_P2P if is_p2p else schema.KIND_COLLECTIVE,
        schema.ATTR_RANK: rank,
        schema.ATTR_OP: record.op,
        schema.ATTR_API: record.api,
        schema.ATTR_SOURCE: record.source,
        schema.ATTR_SEQ: record.seq,
        schema.ATTR_BYTES: record.bytes,
        schema.ATTR_STATE: record.state,
        schema.ATTR_ASYNC: record.async_op,
        schema.ATTR_TIMING: record.timing,
        **group_attributes(info),
    }
    if record.dtype is not None:
        attributes[schema.ATTR_DTYPE] = readable(record.dtype)
    if record.reduce_op is not None:
        attributes[schema.ATTR_REDUCE_OP] = readable(record.reduce_op).lower()
    if is_p2p:
        attributes[schema.ATTR_PEER] = record.peer
        attributes[schema.ATTR_P2P_SRC] = record.src
        attributes[schema.ATTR_P2P_DST] = record.dst
    elif record.root >= 0:
        attributes[schema.ATTR_ROOT] = record.root
    if record.error:
        attributes[schema.ATTR_ERROR] = record.error
    if record.device and record.call_end_ns:  # the call returned at enqueue; the span ends at completion
        attributes[schema.ATTR_CALL_S] = round(max(0, record.call_end_ns - record.start_ns) / 1e9, 6)
    failed = record.state in (schema.STATE_ERROR, schema.STATE_TIMEOUT)
    return SpanRecord(
        trace_id=trace_id,
        span_id=schema.rank_span_id(trace_id, rank),
        name=record.op,
        start_ns=record.start_ns,
        end_ns=end_ns if end_ns is not None else (record.end_ns or record.start_ns),
        attributes=attributes,
        status_code=STATUS_ERROR if failed else STATUS_OK,
        status_message=record.error if failed else "",
    )


def heartbeat_attributes(
    groups: Iterable[GroupInfo],
    inflight: Iterable[OpRecord],
    now_ns: int,
    idle_s: float,
) -> dict[str, AttrValue]:
    """Per-group frontier and in-flight ops as the contract's parallel arrays."""
    group_list = sorted(groups, key=lambda info: info.name)
    ops = sorted(inflight, key=lambda record: record.start_ns)
    out: dict[str, AttrValue] = {
        schema.ATTR_HB_GROUP_IDS: [info.gid for info in group_list],
        schema.ATTR_HB_GROUP_NAMES: [info.name for info in group_list],
        schema.ATTR_HB_GROUP_DESCS: [info.desc for info in group_list],
        schema.ATTR_HB_GROUP_SIZES: [info.size for info in group_list],
        schema.ATTR_HB_GROUP_RANKS: [info.ranks_text for info in group_list],
        schema.ATTR_HB_GROUP_ISSUED: [info.issued for info in group_list],
        schema.ATTR_HB_GROUP_COMPLETED: [info.completed for info in group_list],
        schema.ATTR_HB_INFLIGHT_GROUP_IDS: [record.group.gid for record in ops],
        schema.ATTR_HB_INFLIGHT_SEQS: [record.seq for record in ops],
        schema.ATTR_HB_INFLIGHT_OPS: [record.op for record in ops],
        schema.ATTR_HB_INFLIGHT_AGES_S: [round(max(0, now_ns - record.start_ns) / 1e9, 4) for record in ops],
        schema.ATTR_HB_INFLIGHT_PEERS: [record.peer if record.op in schema.P2P_OPS else -1 for record in ops],
        schema.ATTR_HB_INFLIGHT_BYTES: [record.bytes for record in ops],
        schema.ATTR_HB_INFLIGHT_DTYPES: [readable(record.dtype) for record in ops],
        schema.ATTR_HB_IDLE_S: round(idle_s, 4),
    }
    if any(record.call_end_ns for record in ops):
        # an op in flight after its call returned (async; device-async backends; issued from C++, seen by
        # the Flight Recorder): the rank is not inside that call, whose completion may come late or unseen
        out[schema.ATTR_HB_INFLIGHT_RETURNED] = [record.call_end_ns > 0 for record in ops]
    if any(info.device_async for info in group_list):
        # device-async backends: the Flight Recorder's own frontier is there to cross-check ours
        out[schema.ATTR_HB_GROUP_FR_COMPLETED] = [info.fr_completed for info in group_list]
    return out


def heartbeat_span(
    rank: int,
    counter: int,
    interval_s: float,
    start_ns: int,
    end_ns: int,
    attributes: dict[str, AttrValue],
    rng: random.Random,
) -> SpanRecord:
    attrs: dict[str, AttrValue] = {
        schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT,
        schema.ATTR_RANK: rank,
        schema.ATTR_HB_COUNTER: counter,
        schema.ATTR_HB_INTERVAL_S: interval_s,
        **attributes,
    }
    return SpanRecord(
        trace_id=rng.getrandbits(128) or 1,
        span_id=rng.getrandbits(64) or 1,
        name=schema.SPAN_HEARTBEAT,
        start_ns=start_ns,
        end_ns=end_ns,
        attributes=attrs,
        status_code=STATUS_OK,
    )
