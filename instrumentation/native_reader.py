"""Reads the NCCL profiler plugin's shared-memory ring and turns it into spans and heartbeat data.

Runs on the instrumentation's background thread (never the training thread). The plugin
(native/) publishes completion records and, about every 100 ms, snapshots of what is in
flight; this reader keeps the latest snapshot of each in-flight flow so every heartbeat
can carry the per-flow counters the RCA service's state table needs.

Trace ids. The Python-level span of a collective lives in trace
collective_trace_id(job, group id, seq) and has span id rank_span_id(trace, rank). The
plugin only knows NCCL's commHash and seqNumber, so a native span joins that trace when
the caller told us which group a commHash belongs to (map_comm) and NCCL's seqNumber
matches the group's collective seq (seq_offset corrects a constant difference);
otherwise it falls back to collective_trace_id(job, "nccl:<commHash hex>", seq), a trace
of its own that is the same on every rank of the communicator. P2p records use
p2p_trace_id with NCCL-side (src, dst) and the plugin's per-peer, per-direction count.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mycroft.instrumentation.comm_map import CommInfo, NativeColl
from mycroft.native import ring as ringmod
from mycroft.native.ring import Record, Ring, RingError

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord

STATUS_OK = 1
STATUS_ERROR = 2
NATIVE_SALT = "nccl"

# NCCL func names -> the contract's op families
_OPS = {
    "AllReduce": schema.OP_ALL_REDUCE, "AllGather": schema.OP_ALL_GATHER,
    "ReduceScatter": schema.OP_REDUCE_SCATTER, "Broadcast": schema.OP_BROADCAST, "Reduce": schema.OP_REDUCE,
    "Gather": schema.OP_GATHER, "Scatter": schema.OP_SCATTER, "AllToAll": schema.OP_ALL_TO_ALL,
    "Send": schema.OP_SEND, "Recv": schema.OP_RECV,
}


@dataclass(slots=True)
class _CommMap:
    group_id: str
    ranks: list[int] | None
    seq_offset: int


class NativeReader:
    """One process's ring -> finished native spans (drain) and in-flight flow counters (heartbeat)."""

    def __init__(self, ring: Ring, job_id: str, rank: int, hold_s: float = 0.0) -> None:
        self._ring = ring
        self.job_id = job_id
        self.rank = rank
        # hold_s > 0: finished records of a communicator nobody mapped yet wait up to hold_s
        # (from the communicator's first record) for map_comm(), so they join the group's traces
        self.hold_s = hold_s
        self._held: dict[int, list[Record]] = {}
        self._first_seen: dict[int, float] = {}
        self._comm_info: dict[int, CommInfo] = {}
        self._maps: dict[int, _CommMap] = {}
        self._comm_ranks: dict[int, int] = {}  # commHash -> this process's rank in it (COMM records)
        self._flows: dict[tuple[int, int, int], Record] = {}  # (comm, comm rank, uid) -> latest snapshot
        self._colls: dict[tuple[int, int, int, int], Record] = {}  # (comm, rank, kind, seq) -> snapshot
        self._kchs: dict[tuple[int, int, int], Record] = {}  # (comm, rank, uid) -> in-flight kernel channel
        self._info: dict[tuple[int, int, int, int], Record] = {}  # (comm, rank, done kind, seq) -> v7 facts
        self._done_seq: dict[int, int] = {}  # commHash -> highest collective seq finished (kernel evidence)
        self.records_read = 0
        self._ids: dict[tuple[object, ...], int] = {}  # memoised trace / span ids (hashing dominates)

    @classmethod
    def open_for_pid(cls, pid: int, job_id: str, rank: int,
                     ring_dir: str | os.PathLike[str] | None = None) -> NativeReader | None:
        """The reader of process `pid`'s ring; None when that process has no ring (yet)."""
        path = ringmod.find_ring(pid, ring_dir)
        try:
            ring = Ring(path)
        except (FileNotFoundError, RingError):
            return None
        return cls(ring, job_id, rank)

    @property
    def path(self) -> Path:
        return self._ring.path

    def map_comm(self, comm_hash: int, group_id: str, ranks: Sequence[int] | None = None,
                 seq_offset: int = 0) -> None:
        """Put this communicator's native spans into group `group_id`'s traces.

        ranks: global rank of each communicator rank (peers are reported as global ranks);
        seq_offset: added to NCCL's seqNumber to get the group's collective seq.
        """
        self._maps[comm_hash] = _CommMap(group_id, list(ranks) if ranks is not None else None, seq_offset)

    # ------------------------------------------------------------------ identities
    def _group(self, comm: int) -> str:
        m = self._maps.get(comm)
        return m.group_id if m else f"nccl:{comm:016x}"

    def _global(self, comm: int, comm_rank: int) -> int:
        m = self._maps.get(comm)
        if m and m.ranks is not None and 0 <= comm_rank < len(m.ranks):
            return m.ranks[comm_rank]
        return comm_rank

    def _my_rank(self, rec: Record) -> int:
        """Global rank owning a record: ours, unless it came from another rank (PXN) or a map says."""
        m = self._maps.get(rec.comm_hash)
        if m and m.ranks is not None and 0 <= rec.rank < len(m.ranks):
            return m.ranks[rec.rank]
        return self.rank if rec.rank == self._comm_ranks.get(rec.comm_hash, rec.rank) else rec.rank

    def _seq(self, comm: int, seq: int) -> int:
        m = self._maps.get(comm)
        return seq + (m.seq_offset if m else 0)

    def _span_id(self, trace: int, rank: int, salt: str = "") -> int:
        key = ("s", trace, rank, salt)
        value = self._ids.get(key)
        if value is None:
            value = self._ids[key] = schema.rank_span_id(trace, rank, salt)
        return value

    def _trace(self, rec: Record, parent_kind: int, is_send: bool | None = None, peer: int = -1) -> int:
        """Trace id of the collective / p2p a record belongs to (see the module docstring)."""
        p2p = parent_kind in (ringmod.REC_P2P, ringmod.REC_P2P_DONE)
        key = ("t", rec.comm_hash, rec.rank, rec.seq, p2p, is_send if p2p else None, peer if p2p else None,
               rec.fields.get("uid") if rec.seq == ringmod.SEQ_UNKNOWN else None, rec.flags & ringmod.FLAG_CE)
        value = self._ids.get(key)
        if value is None:
            if len(self._ids) > 8192:
                self._ids.clear()
            value = self._ids[key] = self._trace_uncached(rec, parent_kind, is_send, peer)
        return value

    def _trace_uncached(self, rec: Record, parent_kind: int, is_send: bool | None, peer: int) -> int:
        comm = rec.comm_hash
        if rec.seq == ringmod.SEQ_UNKNOWN:
            pid = rec.fields.get("pid", 0)
            return schema.collective_trace_id(self.job_id, f"nccl-orphan:{comm:016x}:{pid}", rec.fields.get("uid", 0))
        if parent_kind in (ringmod.REC_P2P, ringmod.REC_P2P_DONE):
            me = self._my_rank(rec)
            other = self._global(comm, peer)
            src, dst = (me, other) if is_send else (other, me)
            return schema.p2p_trace_id(self.job_id, self._group(comm), src, dst, self._seq(comm, rec.seq))
        if rec.flags & ringmod.FLAG_CE:  # NCCL numbers copy-engine collectives apart (its CE sync count)
            return schema.collective_trace_id(self.job_id, f"{self._group(comm)}:ce", rec.seq)
        return schema.collective_trace_id(self.job_id, self._group(comm), self._seq(comm, rec.seq))

    # ------------------------------------------------------------------ spans
    def _base_attrs(self, rec: Record, kind: str) -> dict[str, AttrValue]:
        attrs: dict[str, AttrValue] = {
            schema.ATTR_SPAN_KIND: kind,
            schema.ATTR_SOURCE: schema.SOURCE_NATIVE,
            schema.ATTR_RANK: self._my_rank(rec),
            schema.ATTR_JOB_ID: self.job_id,
            schema.ATTR_NCCL_COMM_HASH: f"{rec.comm_hash:016x}",
            schema.ATTR_GROUP_ID: self._group(rec.comm_hash),
            schema.ATTR_STATE: schema.STATE_IN_FLIGHT if rec.aborted or rec.flags & ringmod.FLAG_UNFINISHED
            else schema.STATE_COMPLETED,
            schema.ATTR_TIMING: schema.TIMING_EXACT,
        }
        if rec.seq != ringmod.SEQ_UNKNOWN and not rec.flags & ringmod.FLAG_CE:
            attrs[schema.ATTR_SEQ] = self._seq(rec.comm_hash, rec.seq)
        return attrs

    @staticmethod
    def _status(rec: Record) -> tuple[int, str]:
        if rec.aborted:
            return STATUS_ERROR, "communicator finalized while the operation was in flight"
        if rec.flags & ringmod.FLAG_UNFINISHED:
            return STATUS_ERROR, "no kernel completion seen (MYCROFT_NATIVE_CHILD_WAIT_MS passed): end unknown"
        return STATUS_OK, ""

    def _parent_span(self, rec: Record) -> SpanRecord:
        f = rec.fields
        is_p2p = rec.kind == ringmod.REC_P2P_DONE
        func = str(f["func"])
        peer = int(f.get("peer", -1))
        trace = self._trace(rec, rec.kind, is_send=func.startswith("S"), peer=peer)
        me = self._my_rank(rec)
        attrs = self._base_attrs(rec, schema.KIND_NATIVE_COLL)
        attrs.update({
            schema.ATTR_OP: _OPS.get(func, func.lower()),
            schema.ATTR_NCCL_FUNC: func,
            schema.ATTR_NCCL_CHANNELS: int(f["channels"]),
            schema.ATTR_BYTES: int(f["bytes"]),
            schema.ATTR_DTYPE: str(f["dtype"]),
        })
        if is_p2p:
            attrs[schema.ATTR_PEER] = self._global(rec.comm_hash, peer)
        else:
            attrs[schema.ATTR_NCCL_ALGO] = str(f["algo"])
            attrs[schema.ATTR_NCCL_PROTO] = str(f["proto"])
            if func in ("Broadcast", "Reduce"):
                attrs[schema.ATTR_ROOT] = self._global(rec.comm_hash, int(f.get("root", 0)))
        if rec.flags & ringmod.FLAG_SYM:
            attrs[schema.ATTR_NCCL_SYMMETRIC] = True
        if rec.flags & ringmod.FLAG_CE:
            attrs[schema.ATTR_NCCL_COPY_ENGINE] = True
        if f.get("user_tag"):
            attrs[schema.ATTR_NCCL_USER_TAG] = int(f["user_tag"])
        if f.get("kernel_variant"):
            attrs[schema.ATTR_NCCL_KERNEL_VARIANT] = str(f["kernel_variant"])
        code, message = self._status(rec)
        return SpanRecord(
            trace_id=trace,
            span_id=self._span_id(trace, me, NATIVE_SALT),
            parent_span_id=self._span_id(trace, me),  # the Python-level span of this op
            name=schema.SPAN_NATIVE_COLL,
            start_ns=rec.start_ns,
            end_ns=max(rec.end_ns, rec.start_ns),
            attributes=attrs,
            status_code=code,
            status_message=message,
        )

    def _child_ids(self, rec: Record, salt: str) -> tuple[int, int, int]:
        f = rec.fields
        parent_kind = int(f.get("parent_kind", 0))
        trace = self._trace(rec, parent_kind, is_send=bool(f.get("is_send")), peer=int(f.get("peer", -1)))
        me = self._my_rank(rec)
        parent = 0 if rec.seq == ringmod.SEQ_UNKNOWN else self._span_id(trace, me, NATIVE_SALT)
        return trace, schema.rank_span_id(trace, me, f"{NATIVE_SALT}:{salt}:{f.get('uid', 0)}"), parent

    def flow_attributes(self, rec: Record) -> dict[str, AttrValue]:
        """Per-flow attributes (counters included): the flow span's, also used for snapshots."""
        f = rec.fields
        steps, g, t, d = int(f["steps"]), int(f["gpu_ready"]), int(f["transmitted"]), int(f["done"])
        return {
            schema.ATTR_NCCL_CHANNEL: int(f["channel"]),
            schema.ATTR_PEER: self._global(rec.comm_hash, int(f["peer"])),
            schema.ATTR_NCCL_IS_SEND: bool(f["is_send"]),
            schema.ATTR_NCCL_STEPS: steps,
            schema.ATTR_NCCL_CHUNK_SIZE: int(f["chunk"]),
            schema.ATTR_NCCL_PID: int(f["pid"]),
            schema.ATTR_NCCL_PXN: bool(rec.flags & ringmod.FLAG_PXN),
            schema.ATTR_NCCL_PROXY_STATE: str(f["proxy_state"]),
            schema.ATTR_FLOW_POSTED: int(f["posted"]),
            schema.ATTR_FLOW_GPU_READY: g,
            schema.ATTR_FLOW_TRANSMITTED: t,
            schema.ATTR_FLOW_DONE: d,
            schema.ATTR_FLOW_STALL_STATE: schema.flow_state(g, t, d, steps),
            schema.ATTR_BYTES: int(f["bytes"]),
        }

    def _flow_span(self, rec: Record) -> SpanRecord:
        trace, span_id, parent = self._child_ids(rec, "flow")
        attrs = self._base_attrs(rec, schema.KIND_NATIVE_FLOW)
        attrs.update(self.flow_attributes(rec))
        code, message = self._status(rec)
        return SpanRecord(trace_id=trace, span_id=span_id, parent_span_id=parent, name=schema.SPAN_NATIVE_FLOW,
                          start_ns=rec.start_ns, end_ns=max(rec.end_ns, rec.start_ns), attributes=attrs,
                          status_code=code, status_message=message)

    def _kch_spans(self, rec: Record) -> list[SpanRecord]:
        """The kernel channel's span, then one per v7 kernel phase under it."""
        trace, span_id, parent = self._child_ids(rec, "kch")
        attrs = self._base_attrs(rec, schema.KIND_NATIVE_KERNEL_CHANNEL)
        attrs[schema.ATTR_NCCL_CHANNEL] = int(rec.fields["channel"])
        attrs[schema.ATTR_NCCL_GPU_START_NS] = int(rec.fields["gpu_start"])
        attrs[schema.ATTR_NCCL_GPU_STOP_NS] = int(rec.fields["gpu_stop"])
        code, message = self._status(rec)
        if rec.flags & ringmod.FLAG_STALE:
            attrs[schema.ATTR_NCCL_STALE] = True
            attrs[schema.ATTR_STATE] = schema.STATE_IN_FLIGHT
            code, message = STATUS_ERROR, "the channel's stop never came; a later kernel on it finished (end unknown)"
        spans = [SpanRecord(trace_id=trace, span_id=span_id, parent_span_id=parent,
                            name=schema.SPAN_NATIVE_KERNEL_CHANNEL, start_ns=rec.start_ns,
                            end_ns=max(rec.end_ns, rec.start_ns), attributes=attrs, status_code=code,
                            status_message=message)]
        gpu0 = int(rec.fields["gpu_start"])
        for name, (begin, end) in rec.fields.get("phases", {}).items():
            # GPU globaltimer deltas placed on the host timeline from the channel's start
            start = rec.start_ns + max(0, begin - gpu0) if gpu0 else rec.start_ns
            pattrs = self._base_attrs(rec, schema.KIND_NATIVE_KERNEL_PHASE)
            pattrs.update({schema.ATTR_NCCL_CHANNEL: int(rec.fields["channel"]), schema.ATTR_NCCL_KERNEL_PHASE: name,
                           schema.ATTR_NCCL_GPU_START_NS: int(begin), schema.ATTR_NCCL_GPU_STOP_NS: int(end)})
            spans.append(SpanRecord(trace_id=trace, span_id=schema.rank_span_id(trace, self._my_rank(rec),
                                                                              f"{NATIVE_SALT}:phase:{rec.fields['uid']}:{name}"),
                                    parent_span_id=span_id, name=schema.SPAN_NATIVE_KERNEL_PHASE, start_ns=start,
                                    end_ns=start + max(0, end - begin), attributes=pattrs))
        return spans

    # ------------------------------------------------------------------ the interface
    def comms(self) -> list[CommInfo]:
        """Communicators this process initialised (name, size, this process's rank in it)."""
        return list(self._comm_info.values())

    def unmapped(self) -> list[int]:
        return [comm for comm in self._comm_info if comm not in self._maps]

    def held_collectives(self) -> list[NativeColl]:
        """Finished collectives waiting for their communicator's mapping (the mapper's evidence)."""
        return [NativeColl(rec.comm_hash, rec.seq, str(rec.fields.get("func", "")), rec.start_ns)
                for held in self._held.values() for rec in held if rec.kind == ringmod.REC_COLL_DONE]

    def _hold(self, rec: Record) -> bool:
        """Keep a finished record of an unmapped communicator for a while; False: convert it now."""
        if self.hold_s <= 0 or rec.comm_hash in self._maps or rec.seq == ringmod.SEQ_UNKNOWN:
            return False
        first = self._first_seen.setdefault(rec.comm_hash, time.monotonic())
        if time.monotonic() - first > self.hold_s:
            return False
        self._held.setdefault(rec.comm_hash, []).append(rec)
        return True

    def _spans(self, rec: Record) -> list[SpanRecord]:
        kind = rec.kind
        if kind == ringmod.REC_FLOW_DONE:
            return [self._flow_span(rec)]
        if kind == ringmod.REC_KCH_DONE:
            return self._kch_spans(rec)
        if kind in (ringmod.REC_COLL_DONE, ringmod.REC_P2P_DONE):
            return [self._parent_span(rec)]
        return []

    def release(self, force: bool = False) -> list[SpanRecord]:
        """Spans of held records whose communicator is now mapped or has waited hold_s (all: force)."""
        spans: list[SpanRecord] = []
        now = time.monotonic()
        for comm in list(self._held):
            if force or comm in self._maps or now - self._first_seen.get(comm, now) > self.hold_s:
                for rec in self._held.pop(comm):
                    spans.extend(self._spans(rec))
        return spans

    def drain(self) -> list[SpanRecord]:
        """Finished native spans since the last call (resource left empty: the caller fills it)."""
        spans: list[SpanRecord] = []
        for rec in self._ring.consume():
            self.records_read += 1
            kind = rec.kind
            if kind == ringmod.REC_COLL_INFO:  # the v7 facts of the collective record that follows
                if len(self._info) > 4096:
                    self._info.clear()
                self._info[(rec.comm_hash, rec.rank, int(rec.fields["parent_kind"]), rec.seq)] = rec
                continue
            if kind in (ringmod.REC_COLL_DONE, ringmod.REC_P2P_DONE):
                info = self._info.pop((rec.comm_hash, rec.rank, kind, rec.seq), None)
                if info is not None:
                    rec.fields.update(user_tag=info.fields["user_tag"], kernel_variant=info.fields["kernel_variant"])
            if kind == ringmod.REC_KCH_DONE:
                self._kchs.pop((rec.comm_hash, rec.rank, rec.fields["uid"]), None)
            elif kind == ringmod.REC_COLL_DONE and not rec.flags & (ringmod.FLAG_CE | ringmod.FLAG_ABORTED) \
                    and rec.seq != ringmod.SEQ_UNKNOWN:
                self._done_seq[rec.comm_hash] = max(self._done_seq.get(rec.comm_hash, -1), rec.seq)
            if kind in (ringmod.REC_FLOW_DONE, ringmod.REC_KCH_DONE, ringmod.REC_COLL_DONE,
                        ringmod.REC_P2P_DONE) and self._hold(rec):
                if kind == ringmod.REC_FLOW_DONE:
                    self._flows.pop((rec.comm_hash, rec.rank, rec.fields["uid"]), None)
                elif kind != ringmod.REC_KCH_DONE:
                    self._colls.pop((rec.comm_hash, rec.rank, kind - 1, rec.seq), None)
                continue
            if kind == ringmod.REC_FLOW:
                self._flows[(rec.comm_hash, rec.rank, rec.fields["uid"])] = rec
            elif kind == ringmod.REC_FLOW_DONE:
                self._flows.pop((rec.comm_hash, rec.rank, rec.fields["uid"]), None)
                spans.append(self._flow_span(rec))
            elif kind == ringmod.REC_KCH_DONE:
                spans.extend(self._kch_spans(rec))
            elif kind == ringmod.REC_KCH:
                self._kchs[(rec.comm_hash, rec.rank, rec.fields["uid"])] = rec
            elif kind in (ringmod.REC_COLL, ringmod.REC_P2P):
                self._colls[(rec.comm_hash, rec.rank, kind, rec.seq)] = rec
            elif kind in (ringmod.REC_COLL_DONE, ringmod.REC_P2P_DONE):
                self._colls.pop((rec.comm_hash, rec.rank, kind - 1, rec.seq), None)
                spans.append(self._parent_span(rec))
            elif kind == ringmod.REC_COMM:
                self._comm_ranks[rec.comm_hash] = rec.rank
                self._comm_info[rec.comm_hash] = CommInfo(rec.comm_hash, str(rec.fields.get("name", "")),
                                                          int(rec.fields.get("nranks", 0)), rec.rank)
            elif kind == ringmod.REC_COMM_END:
                mine = (rec.comm_hash, rec.rank)
                self._flows = {k: v for k, v in self._flows.items() if k[:2] != mine}
                self._kchs = {k: v for k, v in self._kchs.items() if k[:2] != mine}
                self._colls = {k: v for k, v in self._colls.items() if k[:2] != mine}
        return spans

    def in_flight_flows(self) -> list[Record]:
        """Latest snapshot of every flow still in flight, in a stable order."""
        return sorted(self._flows.values(),
                      key=lambda r: (r.comm_hash, r.seq, r.fields["channel"], not r.fields["is_send"]))

    def in_flight_kernel_channels(self) -> list[Record]:
        """Latest snapshot of every kernel channel still running (started on the GPU, not stopped)."""
        return sorted(self._kchs.values(), key=lambda r: (r.comm_hash, r.seq, r.fields["channel"]))

    def in_flight_collectives(self) -> list[Record]:
        """Latest snapshot of every collective enqueued (NCCL's Coll event) and not finished yet."""
        return sorted((r for r in self._colls.values() if r.kind == ringmod.REC_COLL),
                      key=lambda r: (r.comm_hash, r.seq))

    def heartbeat_attributes(self) -> dict[str, object]:
        """ATTR_HB_FLOW_* arrays of the flows in flight; ATTR_HB_KCH_* / ATTR_HB_NCOLL_* of the kernel
        channels and collectives in flight (the evidence left where no proxy events exist)."""
        flows = self.in_flight_flows()
        dropped = self.dropped()
        out: dict[str, object] = {schema.ATTR_HB_NATIVE_DROPPED: dropped} if dropped else {}
        now = time.time_ns()
        kchs = self.in_flight_kernel_channels()
        if kchs:
            out.update({
                schema.ATTR_HB_FLOW_KCH_COMMS: [f"{r.comm_hash:016x}" for r in kchs],
                schema.ATTR_HB_FLOW_KCH_SEQS: [self._seq(r.comm_hash, r.seq) if r.seq != ringmod.SEQ_UNKNOWN else -1
                                          for r in kchs],
                schema.ATTR_HB_FLOW_KCH_CHANNELS: [int(r.fields["channel"]) for r in kchs],
                schema.ATTR_HB_FLOW_KCH_AGES_S: [round(max(0, now - r.start_ns) / 1e9, 3) for r in kchs],
            })
        if self._comm_info:
            comms = sorted(self._comm_info)
            out[schema.ATTR_HB_FLOW_NCOMM_COMMS] = [f"{c:016x}" for c in comms]
            out[schema.ATTR_HB_FLOW_NCOMM_DONE_SEQS] = [self._seq(c, self._done_seq[c]) if c in self._done_seq else -1
                                                        for c in comms]
        colls = self.in_flight_collectives()
        if colls:
            out.update({
                schema.ATTR_HB_FLOW_NCOLL_COMMS: [f"{r.comm_hash:016x}" for r in colls],
                schema.ATTR_HB_FLOW_NCOLL_SEQS: [self._seq(r.comm_hash, r.seq) for r in colls],
                schema.ATTR_HB_FLOW_NCOLL_FUNCS: [str(r.fields["func"]) for r in colls],
                schema.ATTR_HB_FLOW_NCOLL_KERNELS: [int(r.fields["children"]) for r in colls],
            })
        if not flows:
            return out
        out.update({
            schema.ATTR_HB_FLOW_COMMS: [f"{r.comm_hash:016x}" for r in flows],
            schema.ATTR_HB_FLOW_SEQS: [self._seq(r.comm_hash, r.seq) if r.seq != ringmod.SEQ_UNKNOWN else -1
                                       for r in flows],
            schema.ATTR_HB_FLOW_CHANNELS: [int(r.fields["channel"]) for r in flows],
            schema.ATTR_HB_FLOW_PEERS: [self._global(r.comm_hash, int(r.fields["peer"])) for r in flows],
            schema.ATTR_HB_FLOW_SENDS: [bool(r.fields["is_send"]) for r in flows],
            schema.ATTR_HB_FLOW_STEPS: [int(r.fields["steps"]) for r in flows],
            schema.ATTR_HB_FLOW_POSTED: [int(r.fields["posted"]) for r in flows],
            schema.ATTR_HB_FLOW_GPU_READY: [int(r.fields["gpu_ready"]) for r in flows],
            schema.ATTR_HB_FLOW_TRANSMITTED: [int(r.fields["transmitted"]) for r in flows],
            schema.ATTR_HB_FLOW_DONE: [int(r.fields["done"]) for r in flows],
            schema.ATTR_HB_FLOW_AGES_S: [round(max(0, now - int(r.fields["progress_ns"] or r.start_ns)) / 1e9, 3)
                                         for r in flows],
            schema.ATTR_HB_FLOW_RANKS: [self._my_rank(r) for r in flows],
            schema.ATTR_HB_FLOW_PROXY_STATES: [str(r.fields["proxy_state"]) for r in flows],
        })
        return out

    def dropped(self) -> int:
        """Records the ring had no room for plus events the plugin's pools had no room for."""
        counters = self._ring.counters()
        return int(counters["dropped_records"]) + int(counters["dropped_events"])

    def close(self) -> None:
        """Unmap; remove the ring file once drained and its owner is dead or is us (exiting).

        A ring that still holds unread records stays for `mycroft native dump`; so does the
        ring of a process that crashed (it never gets here).
        """
        ring = self._ring
        try:
            counters = ring.counters()
            drained = counters["head"] == counters["tail"]
            finished = drained and (ring.pid == os.getpid() or not ringmod.pid_alive(ring.pid))
            ring.close()
            if finished:
                ring.path.unlink(missing_ok=True)
        except (OSError, ValueError):
            ring.close()
