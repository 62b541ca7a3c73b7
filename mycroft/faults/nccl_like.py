"""A CPU process group with NCCL's completion semantics: the simulator Mycroft's NCCL path is tested on.

On a GPU, torch's ProcessGroupNCCL (torch 2.13) returns from a collective once its kernel is
enqueued: `Work.wait()` only makes the current CUDA stream wait (the CPU blocks only for
`barrier()` and under TORCH_NCCL_BLOCKING_WAIT=1), `Work.get_future()` is done at enqueue,
while `Work.is_completed()` (a CUDA event query) and `Work.get_future_result()` (marked by
the watchdog, every ~100 ms) tell when the device finished. gloo is synchronous, so tests on
gloo alone cannot tell the two apart. This module plays NCCL on CPUs:

- `NcclLikeProcessGroup` is a Python process group (torch supports them: the c10d ops reach
  Python methods through the PyProcessGroup trampoline) over an inner gloo backend. Each
  group has a *stream*: a thread that runs the group's collectives one at a time, in issue
  order, like kernels on the group's NCCL stream. p2p ops are launched at the call (NCCL
  runs them on per-peer streams) and completed in order per peer.
- `NcclLikeWork`: `wait()` returns at once (raises a failure already seen), `get_future()` is
  done at enqueue, `is_completed()` is the truth, `get_future_result()` is marked by a
  watchdog thread every TORCH_NCCL_WATCHDOG_MS-like interval (`MYCROFT_NCCL_LIKE_WATCHDOG_MS`,
  100 ms). `barrier()` blocks the host, as NCCL's does.
- `synchronize()` plays `torch.cuda.synchronize()`: the host waits until every stream of
  this process is drained. `sleep_on_stream()` plays `torch.cuda._sleep()`: a long "kernel"
  on a group's stream that collectives issued after it queue behind.
- The Flight Recorder: when torch has no `_dump_nccl_trace_json` (CPU builds), `register()`
  installs one that answers in NCCL's format for these groups (pg_status per group, keyed by the
  process's own pg id as NCCL's is, which the entries map to group names: last
  enqueued / started / completed collective; completed is advanced by the watchdog).
- The profiler plugin: with NCCL_PROFILER_PLUGIN set, each group loads it as NCCL does and
  drives its v6 ABI: init per communicator (at the first collective, as torch's lazy init;
  commId the same on every member, commName empty), a Coll event started and stopped
  (= enqueued) in the issuing call, and a KernelCh event on the stream around the op, so
  the collective's native end is the device's. Mycroft's native path (ring, reader,
  communicator-to-group mapping) then runs end to end on CPUs.

Use: `nccl_like.register()` then `dist.init_process_group(nccl_like.BACKEND)` (torchrun's
env:// rendezvous works). Results read before `synchronize()` are undefined, as they would be
on a GPU without stream ordering: CPU tensors have no stream to order the reads behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import hashlib
import itertools
import json
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (  # type: ignore[attr-defined]
    AllgatherOptions,
    AllreduceCoalescedOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    WorkResult,
)

BACKEND = "nccl_like"
ENV_WATCHDOG_MS = "MYCROFT_NCCL_LIKE_WATCHDOG_MS"
FR_VERSION = "2.10"

_groups: weakref.WeakSet[NcclLikeProcessGroup] = weakref.WeakSet()
_groups_lock = threading.Lock()
_fr_ids = itertools.count()  # NCCL's per-process pg id: its Flight Recorder keys pg_status by it, not by name


class _Stream:
    """A FIFO of device work run one item at a time on its own thread: plays a CUDA stream."""

    def __init__(self, name: str) -> None:
        self._items: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._pending = 0
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, item: Callable[[], None]) -> None:
        with self._cond:
            self._pending += 1
        self._items.put(item)

    def _run(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            try:
                item()
            except BaseException:  # an item records its own failure; the stream keeps going
                pass
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()

    def idle(self) -> bool:
        return self._pending == 0

    def synchronize(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        self._items.put(None)


_C10D_FILE = os.path.normcase(dist.distributed_c10d.__file__)


def _called_from_cpp() -> bool:
    """Whether the op was issued by C++ (DDP's reducer and init checks, functional collectives).

    Those callers read their results right after wait() / in the future's callback; on a GPU
    the stream orders those reads behind the kernel, on CPUs nothing does. So C++-issued ops
    get a host-blocking wait() and a future completed by the device (numerics stay right),
    while ops issued through torch.distributed's Python API keep NCCL's semantics. Frames:
    0 here, 1 _collective/_p2p, 2 the op method, 3 its Python caller (none from C++: the
    nearest Python frame is then whoever called into C++).
    """
    try:
        frame = sys._getframe(3)
    except ValueError:  # no Python caller at all: a C++ thread (autograd's, gloo's)
        return True
    return os.path.normcase(frame.f_code.co_filename) != _C10D_FILE


class NcclLikeWork(dist._Work):
    """A Work with NCCL's semantics: done-at-enqueue future, non-blocking wait, truthful is_completed()."""

    def __init__(self, op: str, seq: int, outputs: Any, host_blocking: bool = False,
                 future_at_completion: bool = False) -> None:
        super().__init__()
        self.op = op
        self.seq = seq  # the group's collective seq (0 for p2p)
        self.enqueued_ns = time.time_ns()
        self.completed_ns = 0
        self._host_blocking = host_blocking or os.environ.get("TORCH_NCCL_BLOCKING_WAIT", "0") == "1"
        self._done = threading.Event()
        self._exception: BaseException | None = None
        self._future: torch.futures.Future[Any] = torch.futures.Future()
        self._outputs = outputs if future_at_completion else None
        if not future_at_completion:
            self._future.set_result(outputs)  # NCCL: the future is completed at enqueue
        self._result: torch.futures.Future[Any] = torch.futures.Future()
        self._result_marked = False

    # -- what the device does
    def _finish(self, exc: BaseException | None) -> None:
        self._exception = exc
        self.completed_ns = time.time_ns()
        self._done.set()
        if self._outputs is not None:
            outputs, self._outputs = self._outputs, None
            if exc is None:
                self._future.set_result(outputs)
            else:
                self._future.set_exception(exc)

    def _mark_result(self, result: WorkResult) -> None:
        """The watchdog's verdict (get_future_result)."""
        if not self._result_marked:
            self._result_marked = True
            self._result.set_result(result)

    # -- the Work API
    def wait(self, timeout: Any = None) -> bool:
        """NCCL: the current stream waits, the host does not (unless barrier / blocking wait)."""
        if self._host_blocking:
            seconds = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else None
            if not self._done.wait(seconds if seconds else None):
                raise RuntimeError(f"nccl_like: {self.op} timed out in wait()")
        if self._exception is not None:
            raise self._exception
        return True

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._exception is None

    def exception(self) -> BaseException | None:
        return self._exception

    def get_future(self) -> torch.futures.Future[Any]:
        return self._future

    def get_future_result(self) -> torch.futures.Future[Any]:
        return self._result

    def synchronize(self) -> None:
        """NCCL: block the current stream on the op (the host goes on)."""
        return None


class _Watchdog:
    """Marks get_future_result() and the Flight Recorder's last completed seq, like NCCL's watchdog."""

    def __init__(self) -> None:
        self._works: list[tuple[NcclLikeWork, NcclLikeProcessGroup | None, float]] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        try:
            self.interval_s = max(0.001, float(os.environ.get(ENV_WATCHDOG_MS, "100")) / 1000)
        except ValueError:
            self.interval_s = 0.1

    def add(self, work: NcclLikeWork, pg: NcclLikeProcessGroup | None, timeout_s: float) -> None:
        with self._lock:
            self._works.append((work, pg, time.monotonic() + timeout_s))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nccl-like-watchdog", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.interval_s)
            self.sweep()

    def sweep(self) -> None:
        now = time.monotonic()
        with self._lock:
            works, self._works = self._works, []
        keep = []
        for work, pg, deadline in works:
            if work.is_completed():
                work._mark_result(WorkResult.SUCCESS if work._exception is None else WorkResult.COMM_ERROR)
                if pg is not None and work.seq and work._exception is None:
                    pg._fr_completed = max(pg._fr_completed, work.seq)
            elif now > deadline:
                work._mark_result(WorkResult.TIMEOUT)
            else:
                keep.append((work, pg, deadline))
        with self._lock:
            self._works = keep + self._works


_watchdog = _Watchdog()


# ---------------------------------------------------------------------------------- profiler
class _CollDescr(ctypes.Structure):
    _fields_ = [("seqNumber", ctypes.c_uint64), ("func", ctypes.c_char_p), ("sendBuff", ctypes.c_void_p),
                ("recvBuff", ctypes.c_void_p), ("count", ctypes.c_size_t), ("root", ctypes.c_int),
                ("datatype", ctypes.c_char_p), ("nChannels", ctypes.c_uint8), ("nWarps", ctypes.c_uint8),
                ("algo", ctypes.c_char_p), ("proto", ctypes.c_char_p), ("parentGroup", ctypes.c_void_p)]


class _KernelChDescr(ctypes.Structure):
    _fields_ = [("channelId", ctypes.c_uint8), ("pTimer", ctypes.c_uint64)]


class _ProxyOpDescr(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_int32), ("channelId", ctypes.c_uint8), ("peer", ctypes.c_int),
                ("nSteps", ctypes.c_int), ("chunkSize", ctypes.c_int), ("isSend", ctypes.c_int)]


class _ProxyStepDescr(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int)]


class _DescrUnion(ctypes.Union):
    _fields_ = [("coll", _CollDescr), ("kernelCh", _KernelChDescr), ("proxyOp", _ProxyOpDescr),
                ("proxyStep", _ProxyStepDescr), ("pad", ctypes.c_uint8 * 96)]


class _Descr(ctypes.Structure):
    """ncclProfilerEventDescr_v5/v6: 64-bit type, parentObj, rank, then the union (at 24)."""

    _fields_ = [("type", ctypes.c_uint64), ("parentObj", ctypes.c_void_p), ("rank", ctypes.c_int),
                ("u", _DescrUnion)]


_INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64,
                         ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                         ctypes.c_void_p)
_START = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(_Descr))
_STOP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
_RECORD = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p)
_FINALIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class _Table(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("init", _INIT), ("startEvent", _START), ("stopEvent", _STOP),
                ("recordEventState", _RECORD), ("finalize", _FINALIZE)]


EV_COLL, EV_PROXY_OP, EV_PROXY_STEP, EV_KERNEL_CH = 1 << 1, 1 << 3, 1 << 4, 1 << 6
ST_STEP_SEND_GPU_WAIT, ST_STEP_SEND_WAIT, ST_STEP_RECV_WAIT, ST_STEP_RECV_FLUSH_WAIT = 8, 9, 10, 11
ST_KERNEL_CH_STOP = 22
_NCCL_FUNCS = {"allreduce": b"AllReduce", "barrier": b"AllReduce", "broadcast": b"Broadcast", "reduce": b"Reduce",
               "allgather": b"AllGather", "_allgather_base": b"AllGather", "reduce_scatter": b"ReduceScatter",
               "_reduce_scatter_base": b"ReduceScatter"}
_FR_DTYPES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
              torch.int64: "Long", torch.int32: "Int", torch.int8: "Char", torch.uint8: "Byte"}
_NCCL_TYPES = {torch.float32: b"ncclFloat32", torch.float64: b"ncclFloat64", torch.float16: b"ncclFloat16",
               torch.bfloat16: b"ncclBfloat16", torch.int64: b"ncclInt64", torch.int32: b"ncclInt32",
               torch.int8: b"ncclInt8", torch.uint8: b"ncclUint8"}


class _Profiler:
    """An NCCL profiler plugin driven the way NCCL drives it (v6 table), one context per communicator."""

    def __init__(self, path: str) -> None:
        self._lib = ctypes.CDLL(path)
        self.table = _Table.in_dll(self._lib, "ncclProfiler_v6")
        self.mask = ctypes.c_int(0)
        self._steps: dict[int, tuple[int, bool, int]] = {}

    def init(self, comm_id: int, nranks: int, rank: int) -> ctypes.c_void_p | None:
        ctx = ctypes.c_void_p()
        if self.table.init(ctypes.byref(ctx), comm_id, ctypes.byref(self.mask), b"", 1, nranks, rank, None) != 0:
            return None
        return ctx

    def start_coll(self, ctx: ctypes.c_void_p, rank: int, seq: int, func: bytes, count: int, dtype: bytes) -> int:
        d = _Descr(type=EV_COLL, parentObj=None, rank=rank)
        d.u.coll = _CollDescr(seqNumber=seq, func=func, count=count, root=0, datatype=dtype, nChannels=1,
                              nWarps=8, algo=b"RING", proto=b"SIMPLE")
        handle = ctypes.c_void_p()
        self.table.startEvent(ctx, ctypes.byref(handle), ctypes.byref(d))
        return handle.value or 0

    def start_kernel_channel(self, ctx: ctypes.c_void_p, rank: int, parent: int) -> int:
        d = _Descr(type=EV_KERNEL_CH, parentObj=parent or None, rank=rank)
        d.u.kernelCh = _KernelChDescr(channelId=0, pTimer=time.time_ns())
        handle = ctypes.c_void_p()
        self.table.startEvent(ctx, ctypes.byref(handle), ctypes.byref(d))
        return handle.value or 0

    def start_flow(self, ctx: ctypes.c_void_p, rank: int, parent: int, peer: int, is_send: bool, nbytes: int) -> int:
        """A NET-transport ProxyOp on channel 0 with one step (posted; GPU-ready for a send)."""
        d = _Descr(type=EV_PROXY_OP, parentObj=parent or None, rank=rank)
        d.u.proxyOp = _ProxyOpDescr(pid=os.getpid(), channelId=0, peer=peer, nSteps=1, chunkSize=max(1, nbytes),
                                    isSend=int(is_send))
        handle = ctypes.c_void_p()
        self.table.startEvent(ctx, ctypes.byref(handle), ctypes.byref(d))
        if not handle.value:
            return 0
        step = _Descr(type=EV_PROXY_STEP, parentObj=handle.value, rank=rank)
        step.u.proxyStep = _ProxyStepDescr(step=0)
        step_handle = ctypes.c_void_p()
        self.table.startEvent(ctx, ctypes.byref(step_handle), ctypes.byref(step))
        self.table.recordEventState(step_handle.value, ST_STEP_SEND_GPU_WAIT if is_send else ST_STEP_RECV_WAIT, None)
        self._steps[handle.value] = (step_handle.value or 0, is_send, nbytes)
        return handle.value

    def stop_flow(self, handle: int) -> None:
        """The step transmits / arrives, then completes; then the ProxyOp stops."""
        step, is_send, nbytes = self._steps.pop(handle, (0, True, 0))
        size = ctypes.c_size_t(nbytes)
        if step:
            self.table.recordEventState(step, ST_STEP_SEND_WAIT if is_send else ST_STEP_RECV_FLUSH_WAIT,
                                        ctypes.byref(size))
            self.table.stopEvent(step)
        self.table.stopEvent(handle or None)

    def stop_kernel_channel(self, handle: int) -> None:
        timer = ctypes.c_uint64(time.time_ns())
        self.table.recordEventState(handle or None, ST_KERNEL_CH_STOP, ctypes.byref(timer))
        self.table.stopEvent(handle or None)

    def stop(self, handle: int) -> None:
        self.table.stopEvent(handle or None)


_profiler: _Profiler | None = None
_profiler_tried = False


def _plugin() -> _Profiler | None:
    """NCCL_PROFILER_PLUGIN, loaded once per process as NCCL does (None: unset or unloadable)."""
    global _profiler, _profiler_tried
    if not _profiler_tried:
        _profiler_tried = True
        path = os.environ.get("NCCL_PROFILER_PLUGIN", "")
        if path and path != "none":
            try:
                _profiler = _Profiler(path)
            except (OSError, ValueError):
                _profiler = None
    return _profiler


class _Sequence:
    """gloo Works issued back to back on the stream thread: waited in order, as one."""

    def __init__(self, works: list[Any]) -> None:
        self._works = works

    def wait(self) -> bool:
        for work in self._works:
            work.wait()
        return True


class NcclLikeProcessGroup(dist.ProcessGroup):
    """A process group whose ops return at enqueue and complete on a stream thread (see the module doc)."""

    _mycroft_device_async = True  # Mycroft: completion comes from the Work, not from the call

    def __init__(self, store: Any, rank: int, size: int, timeout: datetime.timedelta) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        self._timeout_s = timeout.total_seconds() if isinstance(timeout, datetime.timedelta) else 1800.0
        self._seq = 0  # collectives enqueued (NCCL's seq: p2p ops do not count)
        self._fr_completed = 0  # what the watchdog saw completed (the Flight Recorder's view)
        self._entries: list[dict[str, Any]] = []
        self._stream = _Stream(f"nccl-like-stream-{id(self) & 0xffff:04x}")
        self._p2p_streams: dict[int, _Stream] = {}
        self._nccl_seq = 0  # NCCL's own per-communicator count of collectives (from 0)
        self._prof_ctx: Any = None
        self._prof_ready = False
        self._coll_bytes = 0
        with _groups_lock:
            _groups.add(self)
            self.fr_id = next(_fr_ids)

    # ------------------------------------------------------------------ identity
    def getBackendName(self) -> str:
        return BACKEND

    # a Python group has no C++ backend to keep its name: keep it here
    def setGroupName(self, name: str) -> None:
        self._name = name

    def getGroupName(self) -> str:
        return getattr(self, "_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_desc", "")

    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    # ------------------------------------------------------------------ machinery
    def _profiler_context(self) -> Any:
        """The plugin's context for this communicator, created at its first collective."""
        if not self._prof_ready:
            self._prof_ready = True
            prof = _plugin()
            if prof is not None:
                ranks = dist.get_process_group_ranks(self) if dist.is_initialized() else list(range(self.size()))
                digest = hashlib.blake2b(f"{self.group_name}:{ranks}".encode(), digest_size=8).digest()
                self._prof_ctx = prof.init(int.from_bytes(digest, "big"), self.size(), self.rank())
        return self._prof_ctx

    def _native_start(self, op: str, outputs: Any) -> int:
        """NCCL's Coll event: started and stopped (enqueued) inside the issuing call."""
        func = _NCCL_FUNCS.get(op)
        ctx = self._profiler_context() if func else None
        if ctx is None or _profiler is None:
            return 0
        first = outputs[0] if isinstance(outputs, list) and outputs else None
        while isinstance(first, list) and first:
            first = first[0]
        count = int(first.numel()) if isinstance(first, torch.Tensor) else 1
        dtype = _NCCL_TYPES.get(first.dtype, b"ncclFloat32") if isinstance(first, torch.Tensor) else b"ncclFloat32"
        assert func is not None
        self._coll_bytes = count * (first.element_size() if isinstance(first, torch.Tensor) else 4)
        handle = _profiler.start_coll(ctx, self.rank(), self._nccl_seq, func, count, dtype)
        self._nccl_seq += 1
        _profiler.stop(handle)
        return handle

    def _collective(self, op: str, outputs: Any, launch: Callable[[], Any], host_blocking: bool = False,
                    sizes: Any = None, dtypes: Any = None) -> NcclLikeWork:
        self._seq += 1
        from_cpp = _called_from_cpp()
        work = NcclLikeWork(op, self._seq, outputs, host_blocking or from_cpp, future_at_completion=from_cpp)
        self._entries.append({"work": work, "sizes": sizes, "dtypes": dtypes})
        if len(self._entries) > 2000:  # the Flight Recorder's ring (TORCH_FR_BUFFER_SIZE default)
            del self._entries[:1000]
        coll = self._native_start(op, outputs)
        ctx, rank = self._prof_ctx, self.rank()

        size = self.size()

        def run() -> None:
            prof = _profiler if coll else None
            kch = flows = None
            if prof is not None:  # a ring step to each neighbour: a send and a receive flow (NET transport)
                kch = prof.start_kernel_channel(ctx, rank, coll)
                if size > 1:
                    nbytes = self._coll_bytes
                    flows = (prof.start_flow(ctx, rank, coll, (rank + 1) % size, True, nbytes),
                             prof.start_flow(ctx, rank, coll, (rank - 1) % size, False, nbytes))
            failure: BaseException | None = None
            try:
                launch().wait()
            except BaseException as exc:
                failure = exc
            if prof is not None:  # the flows finish, the kernel ends, then its end event completes
                for flow in flows or ():
                    if flow:
                        prof.stop_flow(flow)
                if kch:
                    prof.stop_kernel_channel(kch)
            work._finish(failure)

        self._stream.submit(run)
        _watchdog.add(work, self, self._timeout_s)
        return work

    def _p2p(self, op: str, peer: int, tensors: Any, launch: Callable[[], Any]) -> NcclLikeWork:
        from_cpp = _called_from_cpp()
        work = NcclLikeWork(op, 0, tensors, from_cpp, future_at_completion=from_cpp)
        try:
            inner = launch()  # posted now: NCCL runs p2p on per-peer streams, so both sides post at once
        except BaseException as exc:
            work._finish(exc)
            return work
        stream = self._p2p_streams.get(peer)
        if stream is None:
            stream = self._p2p_streams[peer] = _Stream(f"nccl-like-p2p-{peer}")

        def run() -> None:
            try:
                inner.wait()
                work._finish(None)
            except BaseException as exc:
                work._finish(exc)

        stream.submit(run)
        _watchdog.add(work, None, self._timeout_s)
        return work

    def streams(self) -> list[_Stream]:
        return [self._stream, *self._p2p_streams.values()]

    # ------------------------------------------------------------------ collectives
    def allreduce(self, tensors: Any, opts: Any = None) -> NcclLikeWork:
        if not isinstance(opts, AllreduceOptions):
            reduce_op, opts = opts, AllreduceOptions()
            if reduce_op is not None:
                opts.reduceOp = reduce_op
        return self._collective("allreduce", tensors, lambda: self._gloo.allreduce(tensors, opts),
                                sizes=[list(t.shape) for t in tensors],
                                dtypes=[_FR_DTYPES.get(t.dtype, str(t.dtype)) for t in tensors])

    def allreduce_coalesced(self, tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else AllreduceCoalescedOptions()
        return self._collective("allreduce_coalesced", tensors, lambda: self._gloo.allreduce_coalesced(tensors, opts))

    def allgather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else AllgatherOptions()
        return self._collective("allgather", output_tensors,
                                lambda: self._gloo.allgather(output_tensors, input_tensors, opts))

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else AllgatherOptions()
        return self._collective("_allgather_base", [output], lambda: self._gloo._allgather_base(output, input, opts))

    _allgather_base = all_gather_single

    def reduce_scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else ReduceScatterOptions()
        return self._collective("reduce_scatter", output_tensors,
                                lambda: self._gloo.reduce_scatter(output_tensors, input_tensors, opts))

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else ReduceScatterOptions()
        return self._collective("_reduce_scatter_base", [output],
                                lambda: self._gloo._reduce_scatter_base(output, input, opts))

    _reduce_scatter_base = reduce_scatter_single

    # `_coalescing_manager`'s fast path (Megatron's grad reduce-scatter / param all-gather): one
    # NCCL collective (one seq, one Work) for the whole block, as ProcessGroupNCCL issues it
    def reduce_scatter_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else ReduceScatterOptions()
        return self._collective("reduce_scatter_tensor_coalesced", list(outputs),
                                lambda: _Sequence([self._gloo._reduce_scatter_base(o, i, opts)
                                                   for o, i in zip(outputs, inputs, strict=True)]))

    def all_gather_single_coalesced(self, outputs: Any, inputs: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else AllgatherOptions()
        return self._collective("allgather_into_tensor_coalesced", list(outputs),
                                lambda: _Sequence([self._gloo._allgather_base(o, i, opts)
                                                   for o, i in zip(outputs, inputs, strict=True)]))

    def broadcast(self, tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else BroadcastOptions()
        return self._collective("broadcast", tensors, lambda: self._gloo.broadcast(tensors, opts))

    def reduce(self, tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else ReduceOptions()
        return self._collective("reduce", tensors, lambda: self._gloo.reduce(tensors, opts))

    def gather(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else GatherOptions()
        return self._collective("gather", output_tensors,
                                lambda: self._gloo.gather(output_tensors, input_tensors, opts))

    def scatter(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else ScatterOptions()
        return self._collective("scatter", output_tensors,
                                lambda: self._gloo.scatter(output_tensors, input_tensors, opts))

    def alltoall(self, output_tensors: Any, input_tensors: Any, opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else AllToAllOptions()
        return self._collective("alltoall", output_tensors,
                                lambda: self._gloo.alltoall(output_tensors, input_tensors, opts))

    def all_to_all_single(self, output: Any, input: Any, output_split_sizes: Any, input_split_sizes: Any,
                          opts: Any = None) -> NcclLikeWork:
        opts = opts if opts is not None else AllToAllOptions()
        return self._collective("alltoall_base", [output], lambda: self._gloo.alltoall_base(
            output, input, output_split_sizes, input_split_sizes, opts))

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> NcclLikeWork:
        """NCCL's barrier is an all-reduce whose wait() blocks the host."""
        opts = opts if opts is not None else BarrierOptions()
        return self._collective("barrier", [], lambda: self._gloo.barrier(opts), host_blocking=True)

    # ------------------------------------------------------------------ p2p
    def send(self, tensors: Any, dst: int, tag: int = 0) -> NcclLikeWork:
        return self._p2p("send", dst, tensors, lambda: self._gloo.send(tensors, dst, tag))

    def recv(self, tensors: Any, src: int, tag: int = 0) -> NcclLikeWork:
        return self._p2p("recv", src, tensors, lambda: self._gloo.recv(tensors, src, tag))

    def recv_anysource(self, tensors: Any, tag: int = 0) -> NcclLikeWork:
        raise RuntimeError("nccl_like: receive from any source is not supported (NCCL has none)")

    # ------------------------------------------------------------------ the Flight Recorder's view
    def fr_status(self) -> dict[str, str]:
        return {
            "last_enqueued_collective": str(self._seq),
            "last_started_collective": "-1",  # needs TORCH_NCCL_ENABLE_TIMING on NCCL
            "last_completed_collective": str(self._fr_completed),
        }

    def fr_entries(self, only_active: bool) -> list[dict[str, Any]]:
        out = []
        name, desc = self.group_name, self.group_desc
        for entry in list(self._entries):
            work: NcclLikeWork = entry["work"]
            completed = work.is_completed() and work._result_marked
            if only_active and completed:
                continue
            out.append({
                "collective_seq_id": work.seq,
                "p2p_seq_id": 0,
                "pg_id": self.fr_id,
                "profiling_name": f"nccl:{work.op}",
                "process_group": [name, desc],
                "state": "completed" if completed else "scheduled",
                "time_created_ns": work.enqueued_ns,
                "time_discovered_completed_ns": work.completed_ns if completed else 0,
                "input_sizes": entry["sizes"] or [],
                "input_dtypes": entry["dtypes"] or [],
                "is_p2p": False,
                "retired": completed,
            })
        return out


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> NcclLikeProcessGroup:
    return NcclLikeProcessGroup(store, rank, size, timeout)


def dump_nccl_trace_json(includeCollectives: bool = True, onlyActive: bool = False,  # torch's names
                         **_: Any) -> str:
    """NCCL's Flight Recorder dump (`_dump_nccl_trace_json`) for this process's nccl_like groups."""
    with _groups_lock:
        groups = list(_groups)
    _watchdog.sweep()
    doc: dict[str, Any] = {
        "version": FR_VERSION,
        "comm_lib_version": "nccl_like",
        "pg_config": {},
        "pg_status": {},
    }
    entries: list[dict[str, Any]] = []
    for pg in groups:
        try:
            name = pg.group_name
            ranks = dist.get_process_group_ranks(pg)
        except Exception:
            continue
        doc["pg_config"][name] = {"name": name, "desc": pg.group_desc, "ranks": json.dumps(ranks)}
        doc["pg_status"][str(pg.fr_id)] = pg.fr_status()
        if includeCollectives:
            entries.extend(pg.fr_entries(onlyActive))
    if includeCollectives:
        doc["entries"] = sorted(entries, key=lambda e: e["time_created_ns"])
    return json.dumps(doc)


def register() -> None:
    """Make `nccl_like` a torch.distributed backend in this process (idempotent)."""
    if BACKEND not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
    c10d = torch._C._distributed_c10d
    if not hasattr(c10d, "_dump_nccl_trace_json"):  # CPU builds: play NCCL's Flight Recorder too
        c10d._dump_nccl_trace_json = dump_nccl_trace_json


def synchronize(timeout: float | None = None) -> None:
    """Plays torch.cuda.synchronize(): the host waits until every stream of this process is drained."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _groups_lock:
            streams = [stream for pg in _groups for stream in pg.streams()]
        if all(stream.idle() for stream in streams):
            return
        for stream in streams:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not stream.synchronize(left):
                raise TimeoutError("nccl_like.synchronize timed out")


def sleep_on_stream(seconds: float, group: Any = None) -> None:
    """Plays torch.cuda._sleep(): a kernel that keeps the group's stream busy for `seconds`."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, NcclLikeProcessGroup):
        raise TypeError("sleep_on_stream needs an nccl_like process group")
    pg._stream.submit(lambda: time.sleep(seconds))


def shutdown() -> None:
    """Stop the stream threads (tests; the process exit does it too)."""
    with _groups_lock:
        groups = list(_groups)
    for pg in groups:
        for stream in pg.streams():
            with contextlib.suppress(Exception):
                stream.close()
