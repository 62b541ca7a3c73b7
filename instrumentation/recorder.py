"""The hot path: what the training thread does per collective — record, nothing more.

The training thread appends plain OpRecords to a bounded queue and keeps a dict of
what is in flight; the background runtime turns them into spans and heartbeats.
Every entry point is wrapped so that no error of ours can reach the training code:
on any failure the op runs unrecorded and the failure is counted.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import operator
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from mycroft.instrumentation.completion import CompletionTracker
from mycroft.instrumentation.groups import GroupInfo, GroupRegistry
from mycroft.instrumentation.op_record import OpRecord
from mycroft.instrumentation.ops import OpSpec, arg

from mycroft import schema

log = logging.getLogger("mycroft.instrumentation")


_now_ns = time.time_ns
_P2P_OPS = schema.P2P_OPS
_COMPLETED = schema.STATE_COMPLETED
_EXACT = schema.TIMING_EXACT


class Depth:
    """Per-thread nesting depth of wrapped calls (a wrapped API calling another records once).

    capture: while a sync send/recv on a device-async group runs, the Work of the isend /
    irecv torch issues inside it is collected here (its completion is the op's).
    A plain object, reached through one threading.local read per call (`PerThread.depth`):
    every attribute access on a threading.local costs as much as a dict lookup plus a call.
    The compiled hot path keeps each thread's one and reads and writes `value` in its slot.
    """

    __slots__ = ("capture", "value")

    def __init__(self) -> None:
        self.value = 0
        self.capture: list[Any] | None = None


class PyCounters:
    """A recorder's per-op counters where the compiled hot path is not built (its `Counters` keeps them as
    C integers: the hot path bumps them in place, with no dict lookup and no new int per op)."""

    __slots__ = ("comm_ns", "comm_since_ns", "last_activity_ns", "ops_done")

    def __init__(self) -> None:
        self.last_activity_ns = 0  # when an op last began or ended
        # time with at least one op in flight (cumulative): the rest is compute. Heartbeats carry
        # it, so the RCA sees per rank and per interval how much it computed vs waited (skew-free)
        self.comm_ns = 0
        self.comm_since_ns = 0  # when the in-flight set last became non-empty
        self.ops_done = 0


def _counters_type() -> type:
    try:
        from mycroft.instrumentation._hotpath import Counters

        return Counters
    except ImportError:
        return PyCounters


Counters = _counters_type()


class PyRing:
    """The hot path's ring of sync ops (`_hotpath.Ring`) where the extension is not built: always empty,
    every op is an OpRecord."""

    in_flight = 0
    taken = 0
    full = 0
    lost = 0

    def __len__(self) -> int:
        return 0

    def drain(self) -> list[OpRecord]:
        return []

    def inflight(self) -> list[OpRecord]:
        return []

    def done(self) -> list[OpRecord]:
        return []


def new_ring(capacity: int) -> Any:
    """Where the compiled hot path writes sync ops (_hotpath.c, "Ring"): the runtime makes their OpRecords."""
    try:
        from mycroft.instrumentation._hotpath import Ring

        return Ring(capacity)
    except ImportError:
        return PyRing()


ISSUERS_KEPT = 16  # threads remembered as issuers, the latest to start issuing last


class PerThread(threading.local):
    """This thread's `Depth` (threading.local runs __init__ once in each thread that reads it, with the
    arguments the recorder made it with). Its first read in a thread is that thread's first op: the
    thread is noted in `issuers` then, once, so the runtime knows which thread issues the collectives
    (stacks.issuing_thread) at no cost per op."""

    def __init__(self, issuers: dict[int, None] | None = None) -> None:
        self.depth = Depth()
        if issuers is not None:
            ident = threading.get_ident()
            issuers.pop(ident, None)
            issuers[ident] = None
            while len(issuers) > ISSUERS_KEPT:
                issuers.pop(next(iter(issuers)), None)


_NO_WORK: Any = object()
Beginner = Callable[[tuple[Any, ...], dict[str, Any], Any], OpRecord | None]


_KEYWORD_ONLY = sys.maxsize
_end_ns = operator.attrgetter("end_ns")
# slots of the hot path's ring: more than the sync ops of one runtime tick in a tight loop of small
# collectives (~8,000 in 0.25 s); when full, ops are OpRecords in the queue as before (80 bytes a slot)
RING_SLOTS = 8192


def _position(ref: tuple[int, str]) -> tuple[int, str]:
    """An ArgRef whose keyword-only position (-1) no call reaches, so `len(args) > position` says
    whether the argument came by position."""
    position, keyword = ref
    return (position if position >= 0 else _KEYWORD_ONLY), keyword


def payload_info(value: Any) -> tuple[int, Any]:
    """(bytes, dtype object) of a tensor or a list of tensors; (0, None) for anything odd.

    The dtype stays an object here: naming it is the background thread's job.
    """
    try:
        if value is None:
            return 0, None
        if isinstance(value, (list, tuple)):  # a tuple, not `list | tuple`: no Union object per call
            total = 0
            dtype = None
            for item in value:
                nbytes, item_dtype = payload_info(item)
                total += nbytes
                dtype = dtype or item_dtype
            return total, dtype
        return int(value.numel() * value.element_size()), value.dtype
    except Exception:
        return 0, None


_RECORDERS: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for recorder in list(_RECORDERS):
        try:
            recorder.forget_parent()
        except Exception as exc:  # never into the child's own code
            log.debug("mycroft: recorder state not reset after fork (%r)", exc)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Recorder:
    """Per-process recording state shared by every wrapper."""

    def __init__(self, queue_size: int, completion_poll_s: float = 0.001, max_pending_works: int = 1024,
                 ring_slots: int = RING_SLOTS) -> None:
        self.groups = GroupRegistry()
        self.queue: collections.deque[OpRecord] = collections.deque()
        self.queue_size = queue_size
        # keyed by the record itself (identity hash): no id() call per op on the training thread
        self.inflight: dict[OpRecord, OpRecord] = {}
        # the compiled hot path's sync ops, in flight and done, in fixed slots: what `inflight` and `queue`
        # hold for every other op (snapshot_inflight and take_done read both)
        self.ring = new_ring(min(ring_slots, queue_size))
        self.dropped = 0
        self.errors = 0
        self.counters = Counters()
        self.counters.last_activity_ns = _now_ns()
        self.world_rank = -1
        self._keys = itertools.count(1)
        self.issuers: dict[int, None] = {}  # thread idents that issued an op, in the order they first did
        self.per_thread = PerThread(self.issuers)
        self._beginners: dict[tuple[OpSpec, str, bool], Beginner] = {}
        self._error_logged = False
        self._drop_logged = False
        self.pending_works: collections.deque[tuple[OpRecord, Any]] = collections.deque()
        self.funcol_pending: dict[int, OpRecord] = {}
        # functional collectives whose call has not returned, by thread: one that blocks inside its call
        # (TORCH_DISTRIBUTED_DEBUG=DETAIL's checks wait for the peers there) is in flight from its begin
        self.funcol_calls: dict[int, OpRecord] = {}
        self.funcol_warm: set[str] = set()  # funcol APIs whose first call (seconds of set-up) has returned
        self.funcol_device: list[OpRecord] = []  # waited funcol ops of device-async groups
        self.failures_pending = False  # a failed op is queued: the runtime ships it at once
        # one entry per thread inside Work.wait() (patching's wrapper): append / pop are atomic C calls,
        # where a counter needs a lock (`+=` from two threads can lose an update)
        self.waiters: collections.deque[None] = collections.deque()
        self.completion = CompletionTracker(self, completion_poll_s, max_pending_works)
        _RECORDERS.add(self)

    def forget_parent(self) -> None:
        """In a forked child (a DataLoader worker forked mid-op): the parent's ops are the parent's. The child's
        copies of its records in flight and done are dropped, its counters start again, and the compiled ring
        forgets the parent's slots (it does so at its first use in the child anyway: `_hotpath.c`, fork)."""
        for held in (self.inflight, self.queue, self.pending_works, self.funcol_pending, self.funcol_calls,
                     self.funcol_device, self.waiters):
            held.clear()
        self.failures_pending = False
        counters = self.counters
        counters.comm_ns = counters.comm_since_ns = counters.ops_done = 0
        counters.last_activity_ns = _now_ns()
        len(self.ring)

    # ------------------------------------------------------------------ helpers
    def _note_error(self, where: str, exc: BaseException) -> None:
        self.errors += 1
        if not self._error_logged:
            self._error_logged = True
            log.warning("mycroft: instrumentation error in %s (%r); the op ran unrecorded. "
                        "Further errors are counted, not logged.", where, exc)

    def _push(self, record: OpRecord) -> None:
        if len(self.queue) >= self.queue_size:
            self.dropped += 1
            if not self._drop_logged:
                self._drop_logged = True
                log.warning("mycroft: telemetry queue full (%d records); dropping and counting. "
                            "Training is not slowed.", self.queue_size)
            return
        self.queue.append(record)

    # ------------------------------------------------------------------ hot path
    def begin(self, spec: OpSpec, args: tuple[Any, ...], kwargs: dict[str, Any],
              group: Any = None, api: str = "", track: bool = True) -> OpRecord | None:
        """Record the issue of an op; None means "run it unrecorded" (see `beginner`)."""
        key = (spec, api, track)
        begin = self._beginners.get(key)
        if begin is None:
            begin = self._beginners[key] = self.beginner(spec, api, track)
        return begin(args, kwargs, group)

    def beginner(self, spec: OpSpec, api: str = "", track: bool = True) -> Beginner:
        """`begin` for one op kind, as a function of (args, kwargs, group): the wrappers call it per op.

        The hot path (once per op on the training thread, so written for CPython's cost model):
        what the spec says (argument positions, flags, names) is read here, once, into closure
        constants; per call, arguments are read by position inline (`arg` is a call each), the
        group's info from the registry's dict without a call, the payload by `Tensor.nbytes` (one
        C call; odd payloads go through payload_info), the seq from torch's counter
        (`GroupInfo.next_collective_seq`), the record built in one constructor call.
        """
        # a keyword-only argument gets a position no call reaches: `n_args > pos` is then the one test
        g_pos, g_key = _position(spec.group)
        p_pos, p_key = _position(spec.payload)
        has_payload = bool(p_key) or p_pos != _KEYWORD_ONLY
        r_pos, r_key = _position(spec.reduce_op)
        a_pos, a_key = _position(spec.async_op)
        always_async = spec.always_async
        name = api or spec.api
        op = spec.op
        is_p2p = spec.is_p2p
        has_root = bool(spec.root[1])
        groups = self.groups
        inflight = self.inflight
        ring = self.ring
        counters = self.counters

        def begin(args: tuple[Any, ...], kwargs: dict[str, Any], group: Any = None) -> OpRecord | None:
            try:
                n_args = len(args)
                if group is None:
                    group = args[g_pos] if n_args > g_pos else kwargs.get(g_key)
                if group is None:
                    info = groups._default or groups.resolve(None)
                else:
                    info = groups._by_pg.get(id(group))
                    if info is None or info.deref() is not group:
                        info = groups.resolve(group)
                if info is None:
                    return None
                if has_payload:
                    payload: Any = args[p_pos] if n_args > p_pos else kwargs.get(p_key)
                    try:
                        nbytes, dtype = payload.nbytes, payload.dtype  # a tensor
                    except AttributeError:
                        nbytes, dtype = payload_info(payload)
                else:
                    nbytes, dtype = 0, None
                reduce_op = (args[r_pos] if n_args > r_pos else kwargs.get(r_key)) if r_key else None
                if always_async:
                    async_op = True
                elif a_key:
                    async_op = bool(args[a_pos] if n_args > a_pos else kwargs.get(a_key, False))
                else:
                    async_op = False
                start = _now_ns()
                if is_p2p:
                    record = OpRecord(name, op, info, 0, start, nbytes, dtype, reduce_op, async_op)
                    self._p2p_fields(record, spec, info, args, kwargs)
                else:
                    record = OpRecord(name, op, info, info.next_collective_seq(), start, nbytes, dtype, reduce_op,
                                      async_op)
                    if has_root:
                        self._root_field(record, spec, info, args, kwargs)
                if track:
                    if not inflight and not ring.in_flight:
                        counters.comm_since_ns = start
                    inflight[record] = record
                    counters.last_activity_ns = start
                return record
            except Exception as exc:
                self._note_error(spec.api, exc)
                return None

        return begin

    def _p2p_fields(self, record: OpRecord, spec: OpSpec, info: GroupInfo, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> None:
        peer = arg(args, kwargs, spec.peer)
        if peer is None:
            group_peer = arg(args, kwargs, spec.group_peer)
            peer = info.ranks[group_peer] if isinstance(group_peer, int) else None
        me = self.world_rank
        record.peer = peer if isinstance(peer, int) else -1
        record.src, record.dst = (me, record.peer) if spec.is_send else (record.peer, me)
        if record.peer >= 0:
            record.seq = info.next_pair_seq(record.src, record.dst)
        record.key = info.counter()  # to measure how far this p2p op moves torch's counter

    @staticmethod
    def _root_field(record: OpRecord, spec: OpSpec, info: GroupInfo, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> None:
        root = arg(args, kwargs, spec.root)
        if root is None and spec.group_root[1]:
            group_root = arg(args, kwargs, spec.group_root)
            root = info.ranks[group_root] if isinstance(group_root, int) else None
        record.root = root if isinstance(root, int) else -1

    def track_issued(self, record: OpRecord) -> None:
        """An op begun with track=False is issued now: in flight from this instant (unless
        adopt_blocked_calls took it in flight while its call blocked)."""
        if record in self.inflight:
            return
        record.start_ns = _now_ns()
        self._track(record, record.start_ns)

    def adopt_blocked_calls(self, now_ns: int, after_ns: int) -> None:
        """Runtime thread: a functional collective whose call has lasted `after_ns` (past the first call
        of its API, which spends seconds setting funcol up) waits inside it for its peers: in flight
        from its begin. Its return finds it there (track_issued)."""
        for record in list(self.funcol_calls.values()):
            if record not in self.inflight and now_ns - record.start_ns >= after_ns and \
                    record.api in self.funcol_warm:
                self._track(record, record.start_ns)

    def _track(self, record: OpRecord, start: int) -> None:
        if self.idle():
            self.counters.comm_since_ns = start
        self.inflight[record] = record
        self.counters.last_activity_ns = start

    def begin_block(self, op: str, group: Any, tensors: list[Any], reduce_op: Any, async_op: bool,
                    api: str) -> OpRecord | None:
        """A coalesced block (`_coalescing_manager`): one collective, one seq, issued at the block's end."""
        try:
            info = self.groups.resolve(group)
            if info is None:
                return None
            start = _now_ns()
            record = OpRecord(api, op, info, info.next_collective_seq(), start)
            record.bytes, record.dtype = payload_info(tensors)
            record.reduce_op = reduce_op
            record.async_op = async_op
            self._track(record, start)
            return record
        except Exception as exc:
            self._note_error("coalescing block", exc)
            return None

    def issued(self, record: OpRecord, result: Any, count_p2p: bool = True, work: Any = _NO_WORK) -> None:
        """The call returned: a sync op is complete; an async one completes later.

        On a device-async group (NCCL) every op completes later, when its Work says so: `work`
        is the Work of a sync op (the wrapper issued it async), else the async call's result.
        count_p2p=False for the later ops of a batch whose first op measured the batch.
        """
        try:
            record.call_end_ns = _now_ns()
            info = record.group
            if record.op in schema.P2P_OPS and count_p2p:
                info.note_p2p(record.key, info.counter())
                if record.peer < 0 and isinstance(result, int):  # recv from any source
                    record.peer = record.src = result
                    record.seq = info.next_pair_seq(record.src, record.dst)
            if record.device:
                if work is _NO_WORK:
                    work = result[0] if isinstance(result, list) and result else result
                if work is not None and not hasattr(work, "is_completed"):
                    # a Future (all_reduce_coalesced): done at enqueue on NCCL; the frontier decides
                    self.completion.add(record, None)
                elif work is None or isinstance(work, (list, int)):  # nothing to poll: as before
                    self.complete(record, timing=schema.TIMING_POLLED)
                else:
                    self.completion.add(record, work)
                return
            if not record.async_op:
                self.complete(record)
                return
            work = result[0] if isinstance(result, list) and result else result
            if work is None:  # coalesced (NCCL batch) or torch returned nothing to wait on
                self.complete(record, timing=schema.TIMING_POLLED)
                return
            self._watch(record, work)
        except Exception as exc:
            self._note_error("issued", exc)
            self.inflight.pop(record, None)

    def adopt(self, record: OpRecord) -> None:
        """An op seen only by the Flight Recorder (issued in C++): in flight until it completes."""
        if self.idle():
            self.counters.comm_since_ns = _now_ns()
        self.inflight[record] = record
        if record.seq > record.group.issued:
            record.group.issued = record.seq

    def complete_through_call(self, record: OpRecord) -> None:
        """A sync call that issued several collectives from C++ returned: every seq it took is done
        (the Flight Recorder's completion of gloo's last one can lag for seconds, and the seq would
        read as a C++ op in flight on a rank that moved on)."""
        try:
            info = record.group
            last = info.counter() - info.p2p_counter_delta
            if last > info.completed:
                info.completed = last
            if last > info.issued:
                info.issued = last
        except Exception as exc:
            self._note_error(record.api, exc)

    def failed(self, record: OpRecord, exc: BaseException) -> None:
        record.error = f"{type(exc).__name__}: {exc}"[:512]
        timeout = "timeout" in record.error.lower() or "timed out" in record.error.lower()
        self.complete(record, state=schema.STATE_TIMEOUT if timeout else schema.STATE_ERROR)
        self.failures_pending = True

    def complete(self, record: OpRecord, state: str = _COMPLETED, timing: str = _EXACT) -> None:
        """Mark done (safe from any thread: dict/deque ops are atomic under the GIL)."""
        if record.end_ns:
            return
        end = record.end_ns = _now_ns()
        record.state = state
        if timing is not record.timing:  # most ops keep the class default: no per-record value made
            record.timing = timing
        group = record.group
        if record.seq > group.completed and state == _COMPLETED and record.op not in _P2P_OPS:
            group.completed = record.seq
        inflight = self.inflight
        counters = self.counters
        if inflight.pop(record, None) is not None:
            counters.ops_done += 1
            if self.idle():
                busy = end - counters.comm_since_ns
                if busy > 0:
                    counters.comm_ns += busy
        counters.last_activity_ns = end
        queue = self.queue
        if len(queue) < self.queue_size:  # _push, inline: every op passes here
            queue.append(record)
        else:
            self._push(record)

    def _watch(self, record: OpRecord, work: Any) -> None:
        """Completion callback on the op's future; pollers fall back to is_completed()."""
        try:
            future = work.get_future() if hasattr(work, "get_future") else work  # a Future already
            if not hasattr(future, "add_done_callback"):
                future = None
        except Exception:
            future = None
        if future is not None:
            future.add_done_callback(lambda fut, rec=record: self._future_done(rec, fut))
        else:
            self.pending_works.append((record, work))

    def _future_done(self, record: OpRecord, future: Any) -> None:
        try:
            future.value()
            self.complete(record)
        except Exception as exc:
            self.failed(record, exc)

    def watch_tensor(self, record: OpRecord, result: Any) -> None:
        """Functional collectives complete when their tensor is waited on (funcol.wait_tensor)."""
        self.track_issued(record)
        record.call_end_ns = record.start_ns
        key = id(getattr(result, "elem", result))
        earlier = self.funcol_pending.get(key)
        if earlier is not None:
            self._tensor_gone(earlier)
        self.funcol_pending[key] = record

    def _tensor_gone(self, record: OpRecord) -> None:
        """A new op's tensor took the id of this op's tensor, so that tensor is gone: it was waited where
        we do not see it (DTensor waits on the AsyncCollectiveTensor's inner tensor through torch.ops;
        compiled code) and the op is done on a host-synchronous group. Keyed by id, it would be lost
        from funcol_pending yet stay in flight for ever: the rank never reads as idle again, which
        hid a hung rank's pause (8-rank tp_eager), and its comm time never stops."""
        if record.device:
            self.funcol_device.append(record)  # NCCL: the device says when (poll_pending)
        else:
            self.complete(record, timing=schema.TIMING_INFERRED)

    def tensor_waited(self, tensor: Any) -> None:
        record = self.funcol_pending.pop(id(tensor), None)
        if record is None:  # waited on the AsyncCollectiveTensor funcol returned, not on its tensor
            record = self.funcol_pending.pop(id(getattr(tensor, "elem", tensor)), None)
        if record is not None:
            if record.device:  # NCCL: wait_tensor only makes the stream wait; see poll_pending
                self.funcol_device.append(record)
            else:
                self.complete(record)

    def poll_pending(self) -> None:
        """Background thread: completions nobody reports directly.

        Works without a future (gloo p2p) are polled with is_completed(); functional
        collectives never waited through funcol.wait_tensor (compiled code waits on the
        op directly) complete once a later op of their group has: groups run in order.
        """
        for key, record in list(self.funcol_pending.items()):
            if record.group.completed > record.seq:
                self.funcol_pending.pop(key, None)
                self.complete(record, timing=schema.TIMING_INFERRED)
            elif not record.device and 0 < record.seq <= record.group.fr_completed:
                # waited where we do not see it (compiled code, a tensor's first use): the Flight
                # Recorder saw it finish; left in flight it would read as a transfer that never ends
                self.funcol_pending.pop(key, None)
                self.complete(record, timing=schema.TIMING_FLIGHT_RECORDER)
        if self.funcol_device:
            # functional collectives of NCCL-like groups run in C++ (no Work for us): done once a
            # later op of the group completed on the device, or the Flight Recorder saw them finish
            keep = []
            for record in self.funcol_device:
                if record.group.fr_completed >= record.seq:
                    self.complete(record, timing=schema.TIMING_FLIGHT_RECORDER)
                elif record.group.completed > record.seq:
                    self.complete(record, timing=schema.TIMING_INFERRED)
                else:
                    keep.append(record)
            self.funcol_device = keep
        for _ in range(len(self.pending_works)):
            record, work = self.pending_works.popleft()
            try:
                done = work.is_completed()
            except Exception:
                done = True
            if done:
                self.complete(record, timing=schema.TIMING_POLLED)
            elif record.op not in schema.P2P_OPS and 0 < record.seq <= record.group.fr_completed:
                # gloo's coalesced Works (allreduce_coalesced, `_coalescing_manager`) never report
                # completion and have no future: the Flight Recorder's frontier says when they finished
                self.complete(record, timing=schema.TIMING_FLIGHT_RECORDER)
            else:
                self.pending_works.append((record, work))

    def idle(self) -> bool:
        """No op in flight (as an OpRecord or in the ring)."""
        return not self.inflight and not self.ring.in_flight

    def snapshot_inflight(self) -> list[OpRecord]:
        """The ops in flight; those of the ring as copies (read them, do not complete them)."""
        return [*self.inflight.values(), *self.ring.inflight()]

    def take_done(self) -> list[OpRecord]:
        """The done ops waiting for the runtime, in the order they completed (the ring's and the queue's
        merged: the trace budget decides a stream's ops in seq order, as the queue alone gave them)."""
        ringed = self.ring.drain()
        queue = self.queue
        queued = []
        for _ in range(len(queue)):
            try:
                queued.append(queue.popleft())
            except IndexError:  # drained on another thread meanwhile (final() at exit)
                break
        if not ringed or not queued:
            return ringed or queued
        ringed.sort(key=_end_ns)  # in the order they began: a thread's op can outlast another's
        return list(heapq.merge(ringed, queued, key=_end_ns))

    def done_not_taken(self) -> list[OpRecord]:
        """Copies of the done ops take_done has not taken yet."""
        return [*self.ring.done(), *list(self.queue)]

    @property
    def waiting(self) -> int:
        """Threads inside Work.wait() now."""
        return len(self.waiters)

    def posted_only(self, inflight: list[OpRecord]) -> bool:
        """Every op in flight is a host-side async p2p op whose call returned, and no thread waits on a
        Work: the rank posted them and went on. gloo's p2p Works complete only inside wait(), so a rank
        blocked in its own code after batch_isend_irecv would otherwise read as in a transfer. Only p2p:
        collectives are waited where Python does not see it too (DDP's reducer, funcol's wait_tensor,
        compiled code), and a rank waiting there must keep its edges."""
        return bool(inflight) and not self.waiting and all(
            record.async_op and record.call_end_ns and not record.device and record.op in schema.P2P_OPS
            for record in inflight)

    def waited_untraced(self, start_ns: int, end_ns: int) -> None:
        """A wait on collectives the recorder did not see issued (DDP's reducer: ddp_wait.py) counts
        as communication time and one op done; not while traced ops are in flight (they count it)."""
        if self.idle() and end_ns > start_ns:
            self.counters.comm_ns += end_ns - start_ns
            self.counters.ops_done += 1

    def comm_seconds(self, now_ns: int) -> float:
        """Cumulative seconds this process had an op in flight, up to now."""
        counters = self.counters
        busy = counters.comm_ns + (max(0, now_ns - counters.comm_since_ns) if not self.idle() else 0)
        return busy / 1e9
