"""PyTorch Flight Recorder dumps (one per rank) -> SpanRecords for the same engine.

Each dump becomes the rank's collective spans plus one synthetic heartbeat taken at
the dump time: per group the last enqueued / completed seq (pg_status) and the ops
still in flight with their age. A rank whose dump is missing is simply never seen,
which the analysis reports as lost.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord

from .loaders import LoadError

_OPS = {
    "allreduce": schema.OP_ALL_REDUCE, "all_reduce": schema.OP_ALL_REDUCE,
    "allreduce_coalesced": schema.OP_ALL_REDUCE, "all_reduce_coalesced": schema.OP_ALL_REDUCE,
    "allgather": schema.OP_ALL_GATHER, "all_gather": schema.OP_ALL_GATHER,
    "_allgather_base": schema.OP_ALL_GATHER, "all_gather_into_tensor": schema.OP_ALL_GATHER,
    "allgather_into_tensor_coalesced": schema.OP_ALL_GATHER,
    "reduce_scatter": schema.OP_REDUCE_SCATTER, "_reduce_scatter_base": schema.OP_REDUCE_SCATTER,
    "reduce_scatter_tensor": schema.OP_REDUCE_SCATTER, "reduce_scatter_tensor_coalesced": schema.OP_REDUCE_SCATTER,
    "broadcast": schema.OP_BROADCAST, "reduce": schema.OP_REDUCE, "gather": schema.OP_GATHER,
    "scatter": schema.OP_SCATTER, "alltoall": schema.OP_ALL_TO_ALL, "alltoall_base": schema.OP_ALL_TO_ALL,
    "all_to_all": schema.OP_ALL_TO_ALL, "barrier": schema.OP_BARRIER, "send": schema.OP_SEND,
    "recv": schema.OP_RECV, "recv_anysource": schema.OP_RECV,
}
_DTYPE_BYTES = {"Float": 4, "Double": 8, "Half": 2, "BFloat16": 2, "Int": 4, "Long": 8, "Short": 2,
                "Char": 1, "Byte": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1}
_DTYPE_NAMES = {"Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
                "Int": "int32", "Long": "int64", "Short": "int16", "Char": "int8", "Byte": "uint8", "Bool": "bool"}


def read_dump(path: str | Path, allow_pickle: bool = False) -> dict[str, Any]:
    """JSON (`_dump_*_trace_json`) or, when allowed, the pickle torch writes on timeout."""
    raw = Path(path).read_bytes()
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        if not allow_pickle:
            raise LoadError(f"{path}: not JSON; pass --allow-pickle to read torch's pickled dumps "
                            "(only for files you trust)") from None
        try:
            doc = pickle.loads(raw)
        except Exception as exc:
            raise LoadError(f"{path}: neither JSON nor a Flight Recorder pickle: {exc}") from exc
    if not isinstance(doc, dict) or "entries" not in doc:
        raise LoadError(f"{path}: not a Flight Recorder dump (no 'entries')")
    return doc


def rank_from_name(path: str | Path) -> int | None:
    match = re.search(r"(\d+)(?:\.\w+)?$", Path(path).name)
    return int(match.group(1)) if match else None


def _op(profiling_name: str) -> str:
    name = profiling_name.split(":", 1)[-1].strip().split(" ", 1)[0].lower()
    return _OPS.get(name, name)


def _nbytes(sizes: Any, dtypes: Any) -> int:
    total = 0
    for i, shape in enumerate(sizes or []):
        numel = 1
        for dim in shape or []:
            numel *= int(dim)
        dtype = dtypes[i] if isinstance(dtypes, list) and i < len(dtypes) else "Float"
        total += numel * _DTYPE_BYTES.get(str(dtype), 4)
    return total


def _groups(doc: dict[str, Any]) -> dict[str, tuple[str, list[int]]]:
    """pg name -> (group id, member ranks)."""
    out = {}
    for name, cfg in (doc.get("pg_config") or {}).items():
        ranks_field = cfg.get("ranks", "[]") if isinstance(cfg, dict) else "[]"
        try:
            ranks = [int(r) for r in (json.loads(ranks_field) if isinstance(ranks_field, str) else ranks_field)]
        except (ValueError, TypeError):
            ranks = []
        out[str(name)] = (schema.group_id(str(name), ranks), ranks)
    return out


def _complete_groups(doc: dict[str, Any], groups: dict[str, tuple[str, list[int]]]) -> None:
    """Entries may name a group pg_config does not (gloo's default group is keyed ''): match by desc,
    or take the only config there is."""
    configs = doc.get("pg_config") or {}
    for entry in doc.get("entries", []):
        pg = entry.get("process_group") or ["", ""]
        name, desc = str(pg[0]), str(pg[1]) if len(pg) > 1 else ""
        if name in groups:
            continue
        match = [k for k, c in configs.items() if isinstance(c, dict) and desc and c.get("desc") == desc]
        if not match and len(configs) == 1:
            match = list(configs)
        ranks = groups[match[0]][1] if match and match[0] in groups else []
        groups[name] = (schema.group_id(name, ranks), ranks)


def dump_to_records(doc: dict[str, Any], rank: int, job: str, dumped_at_ns: int) -> list[SpanRecord]:
    groups = _groups(doc)
    _complete_groups(doc, groups)
    world = max((max(r) + 1 for _, r in groups.values() if r), default=rank + 1)
    resource: dict[str, AttrValue] = {schema.RES_JOB_ID: job, schema.RES_SERVICE_NAME: job, schema.RES_RANK: rank,
                                      schema.RES_WORLD_SIZE: world, schema.RES_PROCESS_PID: 0}
    status = doc.get("pg_status") or {}
    by_pg_id = {}
    for entry in doc.get("entries", []):
        pg = entry.get("process_group") or ["", ""]
        by_pg_id[str(entry.get("pg_id"))] = str(pg[0])
    records: list[SpanRecord] = []
    completed: dict[str, int] = {}
    issued: dict[str, int] = {}
    for pg_id, st in status.items():
        name = by_pg_id.get(str(pg_id), str(pg_id))
        gid = groups.get(name, (schema.group_id(name, []), []))[0]
        completed[gid] = max(0, int(st.get("last_completed_collective", 0) or 0))
        issued[gid] = max(0, int(st.get("last_enqueued_collective", 0) or 0))
    inflight: list[tuple[str, int, str, float, int, int]] = []
    for entry in doc.get("entries", []):
        name = str((entry.get("process_group") or [""])[0])
        gid, members = groups.get(name, (schema.group_id(name, []), []))
        op = _op(str(entry.get("profiling_name", "")))
        is_p2p = bool(entry.get("is_p2p")) or op in schema.P2P_OPS
        seq = int(entry.get("p2p_seq_id" if is_p2p else "collective_seq_id", 0) or 0)
        start = int(entry.get("time_created_ns", 0) or 0)
        nbytes = _nbytes(entry.get("input_sizes"), entry.get("input_dtypes"))
        dtypes = entry.get("input_dtypes") or [""]
        dtype = _DTYPE_NAMES.get(str(dtypes[0]), str(dtypes[0]).lower()) if dtypes else ""
        done_ns = int(entry.get("time_discovered_completed_ns", 0) or 0)
        is_done = entry.get("state") == "completed" or (not is_p2p and seq <= completed.get(gid, 0))
        if is_p2p:
            peer = -1
            match = re.search(r"(\d+)\s*->\s*(\d+)", str(entry.get("profiling_name", "")))
            if match:
                src, dst = int(match.group(1)), int(match.group(2))
                peer = dst if op == schema.OP_SEND else src
            if not is_done and peer >= 0:
                inflight.append((gid, seq, op, (dumped_at_ns - start) / 1e9, peer, nbytes))
            continue
        if not is_done:
            inflight.append((gid, seq, op, (dumped_at_ns - start) / 1e9, -1, nbytes))
        duration_ms = entry.get("duration_ms")
        end = done_ns or (start + int(float(duration_ms) * 1e6) if duration_ms else start)
        trace = schema.collective_trace_id(job, gid, seq)
        records.append(SpanRecord(
            trace_id=trace, span_id=schema.rank_span_id(trace, rank), name=op, start_ns=start,
            end_ns=end if is_done else dumped_at_ns, resource=resource,
            attributes={
                schema.ATTR_SPAN_KIND: schema.KIND_COLLECTIVE, schema.ATTR_OP: op, schema.ATTR_GROUP_ID: gid,
                schema.ATTR_GROUP_NAME: name, schema.ATTR_GROUP_SIZE: len(members),
                schema.ATTR_GROUP_RANKS: schema.encode_ranks(members), schema.ATTR_SEQ: seq,
                schema.ATTR_BYTES: nbytes, schema.ATTR_DTYPE: dtype,
                schema.ATTR_SOURCE: schema.SOURCE_FLIGHT_RECORDER,
                schema.ATTR_STATE: schema.STATE_COMPLETED if is_done else schema.STATE_IN_FLIGHT,
            }))
    gids = sorted({g for g, _ in groups.values()})
    members_of = {g: m for g, m in groups.values()}
    names_of = {g: n for n, (g, _) in groups.items()}
    hb: dict[str, AttrValue] = {
        schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT, schema.ATTR_HB_COUNTER: 1,
        schema.ATTR_HB_INTERVAL_S: 1.0, schema.ATTR_HB_IDLE_S: 0.0,
        schema.ATTR_HB_GROUP_IDS: gids, schema.ATTR_HB_GROUP_NAMES: [names_of[g] for g in gids],
        schema.ATTR_HB_GROUP_SIZES: [len(members_of[g]) for g in gids],
        schema.ATTR_HB_GROUP_RANKS: [schema.encode_ranks(members_of[g]) for g in gids],
        schema.ATTR_HB_GROUP_ISSUED: [issued.get(g, 0) for g in gids],
        schema.ATTR_HB_GROUP_COMPLETED: [completed.get(g, 0) for g in gids],
        schema.ATTR_HB_INFLIGHT_GROUP_IDS: [i[0] for i in inflight],
        schema.ATTR_HB_INFLIGHT_SEQS: [i[1] for i in inflight],
        schema.ATTR_HB_INFLIGHT_OPS: [i[2] for i in inflight],
        schema.ATTR_HB_INFLIGHT_AGES_S: [i[3] for i in inflight],
        schema.ATTR_HB_INFLIGHT_PEERS: [i[4] for i in inflight],
        schema.ATTR_HB_INFLIGHT_BYTES: [i[5] for i in inflight],
    }
    records.append(SpanRecord(trace_id=rank + 1, span_id=1, name=schema.SPAN_HEARTBEAT, start_ns=dumped_at_ns,
                              end_ns=dumped_at_ns, attributes=hb, resource=resource))
    return records


def load_dumps(paths: list[str], job: str = "flight-recorder", dumped_at_ns: int | None = None,
               allow_pickle: bool = False) -> list[SpanRecord]:
    """All ranks' dumps; the dump time defaults to each file's mtime."""
    records: list[SpanRecord] = []
    for path in paths:
        rank = rank_from_name(path)
        if rank is None:
            raise LoadError(f"{path}: cannot tell the rank from the file name (expected a trailing number)")
        doc = read_dump(path, allow_pickle)
        at = dumped_at_ns if dumped_at_ns is not None else Path(path).stat().st_mtime_ns
        records.extend(dump_to_records(doc, rank, job, at))
    return records
