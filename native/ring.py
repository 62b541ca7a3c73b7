"""The plugin's shared-memory ring, read from Python (layout: native/src/mycroft_ring.h).

One ring per process at ``$MYCROFT_NATIVE_RING_DIR/mycroft-nccl-<pid>`` (default /dev/shm).
The plugin is the only writer of records; a reader advances ``tail`` so the plugin can
reuse the space. ``dump`` reads without consuming, so it works on a live process and on
the ring a crashed process left behind.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_RING_DIR = "MYCROFT_NATIVE_RING_DIR"
DEFAULT_RING_DIR = "/dev/shm"
ENV_FALLBACK_DIR = "MYCROFT_NATIVE_RING_FALLBACK_DIR"  # where the plugin goes when the ring dir fails
DEFAULT_FALLBACK_DIR = "/tmp"
FILE_PREFIX = "mycroft-nccl-"
MAGIC = b"MYCRNCCL"
VERSION = 1
HEADER_SIZE = 4096
RECORD_SIZE = 128

# header field offsets (static-asserted in mycroft_ring.h)
_OFF_HEAD = 64
_OFF_TAIL = 128
_HEADER_FMT = "<8sIIIIiIQ"  # magic, version, header_size, record_size, capacity, pid, snapshot_ms, created_ns
# dropped_records, dropped_events, published_ns, live_comms, finalized, total_records, foreign_events,
# chain_dropped
_COUNTERS_FMT = "<QQQIIQQQ"
_OFF_COUNTERS = 192

# record kinds (MC_REC_*) and their names in dumps
REC_COMM, REC_COLL, REC_COLL_DONE, REC_P2P, REC_P2P_DONE = 1, 2, 3, 4, 5
REC_FLOW, REC_FLOW_DONE, REC_KCH_DONE, REC_COMM_END = 6, 7, 8, 9
REC_COLL_INFO, REC_KCH = 10, 11
KIND_NAMES = {
    REC_COMM: "comm",
    REC_COLL: "coll",
    REC_COLL_DONE: "coll_done",
    REC_P2P: "p2p",
    REC_P2P_DONE: "p2p_done",
    REC_FLOW: "flow",
    REC_FLOW_DONE: "flow_done",
    REC_KCH_DONE: "kernel_channel",
    REC_COMM_END: "comm_end",
    REC_COLL_INFO: "coll_info",
    REC_KCH: "kernel_channel_in_flight",
}
FLAG_ABORTED, FLAG_PXN, FLAG_ORPHAN, FLAG_ENQUEUED, FLAG_UNFINISHED = 1, 2, 4, 8, 16
FLAG_SYM, FLAG_CE, FLAG_STALE = 32, 64, 128
_FLAG_NAMES = ((FLAG_ABORTED, "aborted"), (FLAG_PXN, "pxn"), (FLAG_ORPHAN, "orphan"), (FLAG_ENQUEUED, "enqueued"),
               (FLAG_UNFINISHED, "unfinished"), (FLAG_SYM, "symmetric"), (FLAG_CE, "copy_engine"),
               (FLAG_STALE, "stale"))
KERNEL_PHASES = ("initial_sync", "compute", "final_sync")  # v7 phaseId 0, 1, 2
SEQ_UNKNOWN = 2**64 - 1

# ProxyStep states (recordEventState), for readable evidence
PROXY_STATE_NAMES = {
    0: "",
    8: "SendGPUWait",
    9: "SendWait",
    10: "RecvWait",
    11: "RecvFlushWait",
    12: "RecvGPUWait",
    20: "SendPeerWait",
}

_COMMON = struct.Struct("<QHHiQQQQQ")  # index kind flags rank comm seq start end time
_COLL = struct.Struct("<QQiBBH14s14s14s6s")
_FLOW = struct.Struct("<iiiiIIIIQQiIBBHI8x")
_KCH = struct.Struct("<iIQQHBx4x4Q8x")
_COMM = struct.Struct("<iiII56s")
_INFO = struct.Struct("<QHBx4x56s")
assert _COMMON.size == 56 and _COLL.size == _FLOW.size == _KCH.size == _COMM.size == _INFO.size == 72


def ring_dir(override: str | os.PathLike[str] | None = None) -> Path:
    return Path(override or os.environ.get(ENV_RING_DIR) or DEFAULT_RING_DIR)


def ring_path(pid: int, directory: str | os.PathLike[str] | None = None) -> Path:
    """Where process `pid`'s plugin keeps its ring (deterministic, so any reader can find it)."""
    return ring_dir(directory) / f"{FILE_PREFIX}{pid}"


def fallback_dir() -> Path:
    """Where the plugin puts its ring when the ring dir cannot hold it."""
    return Path(os.environ.get(ENV_FALLBACK_DIR) or DEFAULT_FALLBACK_DIR)


def find_ring(pid: int, directory: str | os.PathLike[str] | None = None) -> Path:
    """The ring of `pid`: in the ring dir, else in the fallback dir the plugin uses when the ring
    dir cannot hold it (full or missing /dev/shm); the ring dir's path when neither exists."""
    first = ring_path(pid, directory)
    if first.exists():
        return first
    fallback = fallback_dir() / f"{FILE_PREFIX}{pid}"
    return fallback if fallback.exists() else first


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


@dataclass(slots=True)
class Record:
    """One decoded ring record; `fields` holds the kind-specific payload."""

    position: int
    kind: int
    flags: int
    rank: int
    comm_hash: int
    seq: int
    start_ns: int
    end_ns: int
    time_ns: int
    fields: dict[str, Any] = field(default_factory=dict)

    @property
    def kind_name(self) -> str:
        return KIND_NAMES.get(self.kind, f"unknown_{self.kind}")

    @property
    def aborted(self) -> bool:
        return bool(self.flags & FLAG_ABORTED)

    def to_json(self) -> dict[str, Any]:
        """The `mycroft native dump` shape: kind, comm, seq, channel, peer, counters, the rest."""
        out: dict[str, Any] = {
            "kind": self.kind_name,
            "comm": f"{self.comm_hash:016x}",
            "seq": None if self.seq == SEQ_UNKNOWN else self.seq,
            "channel": self.fields.get("channel"),
            "peer": self.fields.get("peer"),
            "rank": self.rank,
        }
        if self.kind in (REC_FLOW, REC_FLOW_DONE):
            out.update(
                posted=self.fields["posted"],
                gpu_ready=self.fields["gpu_ready"],
                transmitted=self.fields["transmitted"],
                done=self.fields["done"],
            )
        out["start_ns"] = self.start_ns
        out["end_ns"] = self.end_ns
        out["flags"] = [name for bit, name in _FLAG_NAMES if self.flags & bit]
        for key, value in self.fields.items():
            out.setdefault(key, value)
        return out


def decode(buf: bytes | memoryview | mmap.mmap, offset: int, position: int) -> Record | None:
    """Decode the record at `offset`; None when its index says it is not record `position`."""
    index, kind, flags, rank, comm, seq, start, end, when = _COMMON.unpack_from(buf, offset)
    if index != position + 1:
        return None
    rec = Record(position, kind, flags, rank, comm, seq, start, end, when)
    body = offset + _COMMON.size
    if kind in (REC_COLL, REC_COLL_DONE, REC_P2P, REC_P2P_DONE):
        count, nbytes, root_or_peer, nch, nwarps, nchildren, func, algo, dtype, proto = _COLL.unpack_from(buf, body)
        rec.fields = {
            "count": count, "bytes": nbytes, "func": _text(func), "algo": _text(algo), "dtype": _text(dtype),
            "proto": _text(proto), "channels": nch, "nwarps": nwarps, "children": nchildren,
        }
        rec.fields["peer" if kind in (REC_P2P, REC_P2P_DONE) else "root"] = root_or_peer
    elif kind in (REC_FLOW, REC_FLOW_DONE):
        (channel, peer, nsteps, chunk, posted, gready, trans, done, nbytes, progress_ns, pid, uid, is_send,
         last_state, parent_kind, cur_step) = _FLOW.unpack_from(buf, body)
        rec.fields = {
            "channel": channel, "peer": peer, "steps": nsteps, "chunk": chunk, "posted": posted,
            "gpu_ready": gready, "transmitted": trans, "done": done, "bytes": nbytes, "progress_ns": progress_ns,
            "pid": pid, "uid": uid, "is_send": bool(is_send),
            "proxy_state": PROXY_STATE_NAMES.get(last_state, str(last_state)), "parent_kind": parent_kind,
            "cur_step": cur_step,
        }
    elif kind in (REC_KCH_DONE, REC_KCH):
        channel, uid, gpu_start, gpu_stop, parent_kind, phase_mask, *bounds = _KCH.unpack_from(buf, body)
        rec.fields = {"channel": channel, "uid": uid, "gpu_start": gpu_start, "gpu_stop": gpu_stop,
                      "parent_kind": parent_kind}
        if phase_mask:  # phase i ran from bounds[i] to bounds[i + 1] (GPU globaltimer)
            rec.fields["phases"] = {KERNEL_PHASES[i]: (bounds[i], bounds[i + 1]) for i in range(3)
                                    if phase_mask & (1 << i)}
    elif kind == REC_COLL_INFO:
        user_tag, parent_kind, is_sym, variant = _INFO.unpack_from(buf, body)
        rec.fields = {"user_tag": user_tag, "parent_kind": parent_kind, "symmetric": bool(is_sym),
                      "kernel_variant": _text(variant)}
    elif kind in (REC_COMM, REC_COMM_END):
        nranks, nnodes, api_version, _pad, name = _COMM.unpack_from(buf, body)
        rec.fields = {"nranks": nranks, "nnodes": nnodes, "api_version": api_version, "name": _text(name)}
    return rec


class RingError(RuntimeError):
    """A file that is not (or no longer) a Mycroft ring."""


class Ring:
    """A mapped ring. consume() advances the shared tail; records() only looks."""

    def __init__(self, path: str | os.PathLike[str], writable: bool = True) -> None:
        self.path = Path(path)
        flags = os.O_RDWR if writable else os.O_RDONLY
        try:
            fd = os.open(self.path, flags)
        except PermissionError:
            if not writable:
                raise
            fd = os.open(self.path, os.O_RDONLY)
            writable = False
        try:
            size = os.fstat(fd).st_size
            if size < HEADER_SIZE:
                raise RingError(f"{self.path}: too short for a ring ({size} bytes)")
            access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
            self._mm = mmap.mmap(fd, size, access=access)
        finally:
            os.close(fd)
        self.writable = writable
        magic, version, header_size, record_size, capacity, pid, snapshot_ms, created_ns = struct.unpack_from(
            _HEADER_FMT, self._mm, 0)
        if magic != MAGIC or version != VERSION or record_size != RECORD_SIZE or header_size != HEADER_SIZE:
            self._mm.close()
            raise RingError(f"{self.path}: not a Mycroft ring v{VERSION} (magic {magic!r}, version {version})")
        if capacity <= 0 or capacity & (capacity - 1) or size < header_size + capacity * record_size:
            self._mm.close()
            raise RingError(f"{self.path}: bad capacity {capacity}")
        self.capacity = capacity
        self.pid = pid
        self.snapshot_ms = snapshot_ms
        self.created_ns = created_ns
        self._local_tail = self._load(_OFF_TAIL)

    # 8-byte aligned loads / stores are single instructions on the platforms we support
    def _load(self, offset: int) -> int:
        return int(struct.unpack_from("<Q", self._mm, offset)[0])

    def _store_tail(self, value: int) -> None:
        if self.writable:
            ctypes.c_uint64.from_buffer(self._mm, _OFF_TAIL).value = value

    @property
    def head(self) -> int:
        return self._load(_OFF_HEAD)

    @property
    def tail(self) -> int:
        return self._load(_OFF_TAIL)

    def counters(self) -> dict[str, int]:
        dropped, dropped_events, published_ns, live, finalized, total, foreign, chain_dropped = struct.unpack_from(
            _COUNTERS_FMT, self._mm, _OFF_COUNTERS)
        return {"dropped_records": dropped, "dropped_events": dropped_events, "published_ns": published_ns,
                "live_comms": live, "finalized": finalized, "total_records": total, "foreign_events": foreign,
                "chain_dropped": chain_dropped, "head": self.head, "tail": self.tail, "capacity": self.capacity}

    def _at(self, position: int) -> Record | None:
        return decode(self._mm, HEADER_SIZE + (position & (self.capacity - 1)) * RECORD_SIZE, position)

    def consume(self, limit: int = 1 << 20) -> list[Record]:
        """New records since the last call; advances the shared tail so the plugin can reuse the space."""
        head = self.head
        tail = max(self._local_tail, self.tail) if self.writable else self._local_tail
        out: list[Record] = []
        if head - tail > self.capacity:  # a read-only reader fell behind: skip what was overwritten
            tail = head - self.capacity
        while tail < head and len(out) < limit:
            rec = self._at(tail)
            if rec is None:  # written but not yet complete: try again next time
                break
            out.append(rec)
            tail += 1
        self._local_tail = tail
        self._store_tail(tail)
        return out

    def records(self) -> Iterator[Record]:
        """Every record still physically in the ring (consumed or not), oldest first."""
        head = self.head
        for position in range(max(0, head - self.capacity), head):
            rec = self._at(position)
            if rec is not None:
                yield rec

    def close(self) -> None:
        if not self._mm.closed:
            self._mm.close()

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
