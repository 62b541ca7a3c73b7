"""Installs and removes the wrappers around torch.distributed; restores torch exactly.

Wrapped:
- every collective / p2p function of torch.distributed (patched both in
  `torch.distributed` and in `distributed_c10d`, whose own helpers such as
  batch_isend_irecv and all_gather_object call the module globals);
- the functional collectives (DTensor's path) and their wait_tensor;
- DistributedDataParallel: its gradient all-reduce runs in the C++ reducer, so a
  comm hook routes it through the (wrapped) dist.all_reduce; a user's own
  register_comm_hook still works — our hook dispatches to it;
- init_process_group / destroy_process_group, to start the runtime once torch.distributed
  exists and to forget groups when they die.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from mycroft.instrumentation import ddp_wait, doors
from mycroft.instrumentation.compile_phase import WATCH as COMPILE_WATCH
from mycroft.instrumentation.flight_recorder import dump_functions
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.ops import (
    C10D_ONLY_IN_DIST,
    C10D_SPECS,
    COALESCED_OPS,
    FUNCOL_SPECS,
    NO_ARG,
    ArgRef,
    OpSpec,
)
from mycroft.instrumentation.recorder import Depth, OpRecord, Recorder, payload_info

from mycroft import schema

log = logging.getLogger("mycroft.instrumentation")

def _load_hot_path() -> ModuleType | None:
    """The compiled hot path (_hotpath.c), configured; None where it is not built (no C compiler at install)
    or does not know the record layout: the Python wrapper, its definition, then takes every call."""
    try:
        from mycroft.instrumentation import _hotpath as module

        module.configure(OpRecord, GroupInfo, Depth, payload_info, schema.STATE_COMPLETED, schema.STATE_IN_FLIGHT)
        return module
    except Exception as exc:
        log.debug("mycroft: compiled hot path not loaded (%r)", exc)
        return None


_hotpath = _load_hot_path()


def _never_compiling() -> bool:
    return False


def compiling_check() -> Callable[[], bool]:
    """torch.compiler.is_compiling (~0.1 us), or a stand-in on a torch without it.

    Every wrapper asks it first and, while Dynamo traces, is nothing but the original call:
    Dynamo then sees torch's own function (remapped to a functional collective, or traced
    into) instead of our bookkeeping, so no graph break is added and fullgraph=True works.
    The compiled graph's collectives run as torch.ops._c10d_functional.* at run time; the
    Flight Recorder's frontier sees them (runtime.py).
    """
    try:
        import torch

        return torch.compiler.is_compiling
    except Exception:
        return _never_compiling


_MARK = "__mycroft_wrapped__"


def installed_by_us(fn: Any) -> bool:
    """A wrapper of ours (marked), or a door (a builtin: it takes no mark)."""
    return bool(getattr(fn, _MARK, False)) or doors.door_of(fn) is not None


def original_of(fn: Any) -> Any:
    """torch's function behind what we installed (fn itself where it is torch's)."""
    found = doors.door_of(fn)
    if found is not None:
        return found.__self__.original
    return fn.__wrapped__ if getattr(fn, _MARK, False) else fn


def hot_path_of(fn: Any) -> Any:
    """The compiled hot path (a `_hotpath.Hot`) taking fn's calls, or None."""
    found = doors.door_of(fn)
    return found.__self__.hot if found is not None else None


def note_failure(recorder: Recorder, record: OpRecord, exc: BaseException) -> None:
    """The op raised: its record ends as failed, and nothing here can take the caller's exception's place.

    Every wrapper catches BaseException only to note the failure and re-raise the same object at once
    (a KeyboardInterrupt, SystemExit or GeneratorExit too: the rank left the op, the span says so).
    Noting it runs no blocking code; if it fails (an exception whose str() raises), that is counted as
    Mycroft's error and the caller's exception goes on: a `raise` inside the handler would have replaced
    it, with the user's exception only as its __context__ (a SystemExit(7) ended the process with 1).
    """
    try:
        recorder.failed(record, exc)
    except Exception as ours:
        try:
            recorder._note_error(record.api, ours)
            record.error = type(exc).__name__  # what can be said of it: the op still ends as failed
            recorder.complete(record, state=schema.STATE_ERROR)
        except Exception:
            pass


class Patcher:
    """Remembers every attribute it replaced so uninstall() puts the originals back."""

    def __init__(self) -> None:
        self._saved: list[tuple[Any, str, Any]] = []
        self._wrapped: dict[int, Any] = {}  # id(original) -> its one wrapper

    def replace(self, owner: Any, name: str, make: Callable[[Any], Any]) -> None:
        """Wrap owner.name; a function exported by two modules gets the same wrapper in both

        (torch compares identities, e.g. P2POp checks `op in [isend, irecv]`).
        """
        original = getattr(owner, name, None)
        if original is None or installed_by_us(original):
            return
        wrapped = self._wrapped.get(id(original))
        if wrapped is None:
            wrapped = make(original)
            if doors.door_of(wrapped) is None:
                setattr(wrapped, _MARK, True)
            self._wrapped[id(original)] = wrapped
        self._saved.append((owner, name, original))
        setattr(owner, name, wrapped)

    def uninstall(self) -> None:
        for wrapped in self._wrapped.values():
            doors.detach(wrapped)  # a caller still holding a door reaches torch's function alone
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()
        self._wrapped.clear()


C10D_PREFIX = "torch.distributed."
FUNCOL_PREFIX = "torch.distributed._functional_collectives."


def _force_async(args: tuple[Any, ...], kwargs: dict[str, Any], ref: ArgRef) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The same call with async_op=True, wherever the caller put the flag."""
    position, keyword = ref
    if 0 <= position < len(args):
        return (*args[:position], True, *args[position + 1:]), kwargs
    return args, {**kwargs, keyword: True}


def _device_sync_call(recorder: Recorder, spec: OpSpec, original: Callable[..., Any], record: OpRecord,
                      args: tuple[Any, ...], kwargs: dict[str, Any], depth: Any) -> Any:
    """A sync op on a device-async group (NCCL): keep its Work, so completion comes from the device.

    torch's sync path is `work = <async op>; work.wait()` (NCCL: the current stream waits, the
    host goes on; barrier: the host waits), so issuing it with async_op=True and waiting here
    is the same call. send / recv have no async flag: torch issues isend / irecv inside them,
    whose Work the nested wrapper hands over through depth.capture.
    """
    depth.value += 1
    work = None
    try:
        if spec.async_op is not NO_ARG:
            args, kwargs = _force_async(args, kwargs, spec.async_op)
            work = original(*args, **kwargs)
            if work is not None:
                work.wait()
            result = None
        else:
            depth.capture = []
            result = original(*args, **kwargs)
            work = depth.capture[0] if depth.capture else None
    except BaseException as exc:
        note_failure(recorder, record, exc)
        raise
    finally:
        depth.value -= 1
        depth.capture = None
    recorder.issued(record, result, work=work)
    return result


def _collective_wrapper(recorder: Recorder, spec: OpSpec, original: Callable[..., Any],
                        hot_path: bool = False) -> Callable[..., Any]:
    """The wrapper of one torch.distributed function. The hot path: everything that does not change
    per call (the API name, bound methods, the spec's flags) is looked up here, once.

    hot_path: where the compiled hot path is built, the function torch.distributed gets is a door to it
    (`_compiled_door`); this Python wrapper then takes only what it delegates.
    """
    api = C10D_PREFIX + spec.api
    per_thread = recorder.per_thread
    compiling = compiling_check()
    begin = recorder.beginner(spec, api)
    complete = recorder.complete
    issued = recorder.issued
    sync_done = not spec.is_p2p  # a sync collective on a host-synchronous group is done at return
    issues_many = spec.issues_many

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            return original(*args, **kwargs)
        depth = per_thread.depth
        if depth.value:
            result = original(*args, **kwargs)
            if depth.capture is not None and result is not None:
                depth.capture.append(result)
            return result
        record = begin(args, kwargs)
        if record is None:
            return original(*args, **kwargs)
        if record.device and not record.async_op:
            return _device_sync_call(recorder, spec, original, record, args, kwargs, depth)
        depth.value += 1
        try:
            result = original(*args, **kwargs) if kwargs else original(*args)  # no empty dict copied
        except BaseException as exc:
            note_failure(recorder, record, exc)
            raise
        finally:
            depth.value -= 1
        if sync_done and not record.async_op:
            complete(record)
            if issues_many:
                recorder.complete_through_call(record)
        else:
            issued(record, result)
        return result

    if hot_path and _hotpath is not None and not spec.is_p2p and not spec.always_async:
        return _compiled_door(_hotpath, recorder, spec, original, wrapper, api)
    return wrapper


def _compiled_door(compiled: ModuleType, recorder: Recorder, spec: OpSpec, original: Callable[..., Any],
                   wrapper: Callable[..., Any], api: str) -> Callable[..., Any]:
    """torch's function's door (doors.py), now calling the compiled hot path, which records a collective
    on a host-synchronous group in about half the Python wrapper's time and hands anything else to
    `wrapper` whole; a Python shim in front of it where Dynamo could not trace the door. Falls back to
    `wrapper` if the compiled objects cannot be made."""
    root = None
    if spec.root[1]:
        def root(record: OpRecord, info: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> None:
            Recorder._root_field(record, spec, info, args, kwargs or {})
    # torch.compiler's `_is_compiling_flag` is read in C for what is_compiling() answers beyond Dynamo
    # (torch.export, AOT tracing): calling is_compiling was two frames, ~2 us after a collective (2-core VM)
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    try:
        fast = compiled.Hot(slow=wrapper, original=original, recorder=recorder, api=api, op=spec.op,
                            group=spec.group, payload=spec.payload, reduce_op=spec.reduce_op,
                            async_op=spec.async_op, root=root, issues_many=spec.issues_many, compiler=compiler)
        door = doors.door(compiled, original)
    except Exception as exc:
        log.info("mycroft: compiled hot path unavailable for %s (%r); Python wrapper", spec.api, exc)
        return wrapper
    door.__self__.hot = fast
    return door if doors.traceable(door) else doors.shim(door)


def _batch_wrapper(recorder: Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    """batch_isend_irecv: one p2p record per P2POp, completed by the works torch returns."""
    by_api = {spec.api: spec for spec in C10D_SPECS}

    per_thread = recorder.per_thread
    compiling = compiling_check()

    @functools.wraps(original)
    def wrapper(p2p_op_list: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling():
            return original(p2p_op_list, *args, **kwargs)
        depth = per_thread.depth
        if depth.value:
            return original(p2p_op_list, *args, **kwargs)
        records = []
        try:
            for p2p in p2p_op_list:
                name = getattr(p2p.op, "__name__", "")
                spec = by_api["isend" if "send" in name else "irecv"]
                record = recorder.begin(spec, (p2p.tensor, p2p.peer, p2p.group), {}, group=p2p.group,
                                        api=C10D_PREFIX + "batch_isend_irecv")
                records.append(record)
        except Exception:
            records = []
        depth.value += 1
        try:
            works = original(p2p_op_list, *args, **kwargs)
        except BaseException as exc:
            for record in records:
                if record is not None:
                    note_failure(recorder, record, exc)
            raise
        finally:
            depth.value -= 1
        work_list = list(works) if isinstance(works, list) else []
        counted: set[str] = set()
        for index, record in enumerate(records):
            if record is not None:
                work = work_list[index] if index < len(work_list) else (work_list[0] if work_list else None)
                # the first record of each group measured the counter before the whole batch
                first_of_group = record.group.gid not in counted
                counted.add(record.group.gid)
                recorder.issued(record, [work] if work is not None else None, count_p2p=first_of_group)
        return works

    return wrapper


def _funcol_wrapper(recorder: Recorder, spec: OpSpec, original: Callable[..., Any]) -> Callable[..., Any]:
    import torch.distributed._functional_collectives as funcol
    from torch.distributed.distributed_c10d import _resolve_process_group

    api = FUNCOL_PREFIX + spec.api
    per_thread = recorder.per_thread
    compiling = compiling_check()
    calls, warm, get_ident = recorder.funcol_calls, recorder.funcol_warm, threading.get_ident

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if compiling():
            return original(*args, **kwargs)
        depth = per_thread.depth
        if depth.value:
            return original(*args, **kwargs)
        record = None
        try:
            group_arg = args[spec.group[0]] if len(args) > spec.group[0] else kwargs.get("group")
            pg = _resolve_process_group(funcol._resolve_group_name(group_arg, str(kwargs.get("tag", ""))))
            # not in flight until funcol issued it: its first call spends seconds setting itself up
            # in Python (3-5 s here), which every rank would report as a transfer that never ends
            record = recorder.begin(spec, args, kwargs, group=pg, api=api, track=False)
        except Exception as exc:
            recorder._note_error("funcol." + spec.api, exc)
        if record is None:
            return original(*args, **kwargs)
        depth.value += 1
        me = get_ident()
        calls[me] = record  # a call that blocks inside is in flight from its begin (adopt_blocked_calls)
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            note_failure(recorder, record, exc)
            raise
        finally:
            depth.value -= 1
            calls.pop(me, None)
        warm.add(api)
        recorder.watch_tensor(record, result)
        return result

    return wrapper


def _wait_tensor_wrapper(recorder: Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    compiling = compiling_check()

    @functools.wraps(original)
    def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling():
            return original(tensor, *args, **kwargs)
        result = original(tensor, *args, **kwargs)
        if recorder.funcol_pending:
            recorder.tensor_waited(tensor)
        return result

    return wrapper


def _work_wait_wrapper(recorder: Recorder, original: Callable[..., Any], hot_path: bool = False) -> Callable[..., Any]:
    """Work.wait, unchanged; the recorder knows a thread is inside it (Recorder.posted_only).

    With the hot path, the compiled `Wait` does the same (every sync collective crosses Work.wait:
    ~0.5 us of a Python frame each). Dynamo cannot trace a Work (a graph break either way), so the
    wrapper's compiling() branch has nothing to keep there."""
    if hot_path and _hotpath is not None:
        try:
            return _hotpath.Wait(original, recorder.waiters)
        except Exception as exc:
            log.info("mycroft: compiled Work.wait unavailable (%r); Python wrapper", exc)
    compiling = compiling_check()
    enter, leave = recorder.waiters.append, recorder.waiters.pop  # every sync collective passes here

    @functools.wraps(original)
    def wrapper(work: Any, *args: Any, **kwargs: Any) -> Any:
        if compiling():
            return original(work, *args, **kwargs)
        enter(None)
        try:
            return original(work, *args, **kwargs) if args or kwargs else original(work)
        finally:
            leave()

    return wrapper


COALESCING_API = C10D_PREFIX + "_coalescing_manager"


def _coalescing_wrapper(recorder: Recorder, original: Callable[..., Any]) -> Callable[..., Any]:
    """`_coalescing_manager` (Megatron's grad reduce-scatter / param all-gather): one op per block.

    Inside the block torch only queues the ops (each returns an `_IllegalWork`); at the block's
    end it issues one coalesced C++ collective with one seq, and with async_ops=True hands its
    Work to `cm.wait()`. So the ops inside run unrecorded, and the block is recorded once, just
    before torch issues it: its own seq, the queued ops' bytes, and the block's real completion
    (its Work; on device-async groups the poller or the Flight Recorder's frontier).
    """
    compiling = compiling_check()
    per_thread = recorder.per_thread

    @functools.wraps(original)
    @contextlib.contextmanager
    def wrapper(group: Any = None, device: Any = None, async_ops: bool = False) -> Any:
        context = original(group, device, async_ops)
        if compiling() or per_thread.depth.value:
            with context as manager:
                yield manager
            return
        manager = context.__enter__()
        depth = per_thread.depth
        depth.value += 1
        try:
            yield manager
        except BaseException:
            depth.value -= 1
            if not context.__exit__(*sys.exc_info()):
                raise
            return
        depth.value -= 1
        record = _begin_block(recorder, group, async_ops)
        try:
            context.__exit__(None, None, None)
        except BaseException as exc:
            if record is not None:
                note_failure(recorder, record, exc)
            raise
        if record is not None:
            works = getattr(manager, "works", None) or []
            work = works[-1] if async_ops and works else None
            if record.device:
                recorder.completion.add(record, work)  # None: the frontier completes it
            else:
                recorder.issued(record, work)

    return wrapper


def _begin_block(recorder: Recorder, group: Any, async_ops: bool) -> OpRecord | None:
    """The record of a coalesced block, from the ops torch queued for it (before it issues them)."""
    try:
        import torch.distributed.distributed_c10d as c10d

        pg = group if group is not None else c10d._get_default_group()
        queued = c10d._world.pg_coalesce_state.get(pg) or []
        names = {getattr(item.op, "__name__", "") for item in queued}
        op = COALESCED_OPS.get(next(iter(names)), "") if len(names) == 1 else ""
        reduce_op = queued[0].redop if queued else None
        return recorder.begin_block(op or "coalesced", pg, [item.tensor for item in queued], reduce_op, async_ops,
                                    COALESCING_API)
    except Exception as exc:
        recorder._note_error("_coalescing_manager", exc)
        return None


# ------------------------------------------------------------------ DDP
DDP_API = "torch.nn.parallel.DistributedDataParallel"


class _DdpHookState:
    """State of our DDP comm hook; a small object so the C++ reducer holds no DDP cycle."""

    __slots__ = ("all_reduce", "begin", "dist", "process_group", "recorder", "size", "user_hook")

    def __init__(self, process_group: Any, recorder: Recorder) -> None:
        import torch.distributed as dist

        self.dist = dist  # not imported per bucket
        # torch's all_reduce, past our own wrapper (which would only pass the call through: depth > 0)
        all_reduce = dist.all_reduce
        self.all_reduce = original_of(all_reduce)
        self.process_group = process_group
        self.recorder = recorder
        self.begin = recorder.beginner(_ALL_REDUCE, DDP_API)
        self.size = 0  # the group's size, read at the first bucket (a group's size never changes)
        self.user_hook: tuple[Callable[..., Any], Any] | None = None


_ALL_REDUCE = next(spec for spec in C10D_SPECS if spec.api == "all_reduce")
# async: the reducer waits on the future; its completion is the op's (an empty kwargs read as sync, so
# every bucket all-reduce "completed" at issue and a rank that never joined it went unseen)
_ASYNC_KWARGS: dict[str, Any] = {"async_op": True}  # read by Recorder.begin only, never changed


def _first_tensor(fut: Any) -> Any:
    return fut.value()[0]


def _bucket_done(recorder: Recorder, record: OpRecord, fut: Any) -> Any:
    """The bucket's all-reduce finished: its op completes, and DDP gets the reduced tensor.

    One callback on the all-reduce's future does both (the record's completion and DDP's `then`),
    where a second callback per bucket would cross from C++ into Python once more. An error of the
    all-reduce reaches DDP as before; an error of ours never does.
    """
    try:
        value = fut.value()
    except BaseException as exc:
        note_failure(recorder, record, exc)
        raise
    try:
        recorder.complete(record)
    except Exception as ours:
        recorder._note_error("ddp bucket", ours)
    return value[0]


def _mycroft_ddp_hook(state: _DdpHookState, bucket: Any) -> Any:
    """DDP comm hook: the user's hook if one was registered, else DDP's default all-reduce.

    A user's hook issues its collectives through the wrapped API; the default path is
    recorded here so the span names DDP as its issuer.
    """
    if state.user_hook is not None:
        hook, user_state = state.user_hook
        return hook(user_state, bucket)
    recorder = state.recorder
    group = state.process_group
    if group is None:
        group = state.dist.group.WORLD
        size = group.size()
    else:
        size = state.size or group.size()
        state.size = size
    buffer = bucket.buffer()
    buffer.div_(size)
    record = state.begin((buffer,), _ASYNC_KWARGS, group)
    depth = recorder.per_thread.depth
    depth.value += 1
    try:
        work = state.all_reduce(buffer, group=group, async_op=True)
    except BaseException as exc:
        if record is not None:
            note_failure(recorder, record, exc)
        raise
    finally:
        depth.value -= 1
    if record is not None:
        if not record.device:  # host-side: done when the future is, in the callback DDP needs anyway
            record.call_end_ns = time.time_ns()
            return work.get_future().then(functools.partial(_bucket_done, recorder, record))
        recorder.issued(record, work)  # device-async: the poller completes it from the Work
    return work.get_future().then(_first_tensor)


class SideTable:
    """Mycroft's state for a user's object, kept beside it, never on it.

    An attribute on a DDP module went wherever the module went: `torch.save(ddp)` pickled it (a
    wait probe holding autograd's engine: PicklingError) and `copy.deepcopy(ddp)` copied it (the
    recorder's ring: TypeError), where DDP's own `__getstate__` drops only its process group,
    reducer and logger. Keyed by the object's identity (a user's subclass may define `__eq__`
    without `__hash__`), an entry goes when its object does; a copy or a loaded module is not in
    the table, and is then the plain torch object it was made from.
    """

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref[Any], Any]] = {}

    def put(self, obj: Any, value: Any) -> None:
        key = id(obj)
        entries = self._entries

        def gone(ref: weakref.ref[Any], key: int = key) -> None:
            entry = entries.get(key)
            if entry is not None and entry[0] is ref:
                del entries[key]

        entries[key] = (weakref.ref(obj, gone), value)

    def get(self, obj: Any) -> Any:
        entry = self._entries.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def __len__(self) -> int:
        return len(self._entries)


# each DDP module's comm-hook state (MYCROFT_DDP_HOOK=1), for its register_comm_hook wrappers
DDP_HOOKS = SideTable()


def _ddp_init_wrapper(recorder: Recorder, original: Callable[..., Any], mode: bool | None = True) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            import torch.distributed as dist

            builtin = mode is False  # MYCROFT_DDP_HOOK=0: DDP's own all-reduce
            if mode is None:  # auto: no Python hook where the Flight Recorder's frontier sees the all-reduce
                info = recorder.groups.resolve(self.process_group)
                if info is not None and (info.device_async or dump_functions()):
                    # the hook costs the training thread ~50 us per bucket (the reducer crossing into
                    # Python, a future callback); the frontier costs it nothing and puts the bucket in
                    # flight all the same, which is what a hang is read from
                    log.info("mycroft: DDP on %s keeps its built-in all-reduce; the Flight Recorder's "
                             "frontier covers it (MYCROFT_DDP_HOOK=1 routes it through the tracer, with a "
                             "span per bucket)", info.backend)
                    builtin = True
            if builtin:  # the reducer's end-of-backward wait is timed instead (stragglers); the probe
                ddp_wait.attach(recorder, self)  # lives in the parameter's hook (a copy drops it)
                return

            state = _DdpHookState(self.process_group, recorder)
            dist._register_comm_hook(self.reducer, state, _mycroft_ddp_hook)  # the reducer holds it
            DDP_HOOKS.put(self, state)
        except Exception as exc:
            log.warning("mycroft: could not route DDP's all-reduce through the tracer (%r); "
                        "DDP gradients will not be traced", exc)

    return wrapper


def _ddp_register_hook_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, state: object, hook: Callable[..., Any]) -> None:
        ours: _DdpHookState | None = DDP_HOOKS.get(self)
        if ours is None:
            return original(self, state, hook)
        self._check_comm_hook(hook)
        if ours.user_hook is not None:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self.logger._set_comm_hook_name(hook.__qualname__)
        self._comm_hooks.append((hook, state))
        ours.user_hook = (hook, state)
        return None

    return wrapper


def _ddp_builtin_hook_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, comm_hook_type: Any) -> None:
        ours: _DdpHookState | None = DDP_HOOKS.get(self)
        if ours is None:
            return original(self, comm_hook_type)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        name = str(comm_hook_type).rsplit(".", 1)[-1].upper()
        if name == "FP16_COMPRESS":
            ours.user_hook = (default_hooks.fp16_compress_hook, self.process_group)
        elif name != "ALLREDUCE":
            raise RuntimeError(f"mycroft: unsupported builtin comm hook {comm_hook_type}")
        return None

    return wrapper


def _init_arguments(original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """init_process_group's arguments by name (positional ones included)."""
    try:
        return dict(inspect.signature(original).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return dict(kwargs)


def _compile_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    """torch.compile, unchanged; on the way out Dynamo is imported, and the heartbeat's compile phase
    (compile_phase.py) registers before the first compilation runs (compilations start at the first
    call of what torch.compile returned)."""
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        COMPILE_WATCH.poll()
        return result

    return wrapper


def install(patcher: Patcher, recorder: Recorder, ddp_hook: bool | None,
            on_init: Callable[[], None], on_destroy: Callable[[], None],
            on_init_start: Callable[[Mapping[str, Any]], None] | None = None, hot_path: bool = True) -> None:
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    try:  # before any c10d function is replaced: funcol's table of what Dynamo rewrites keeps torch's functions
        import torch.distributed._functional_collectives as funcol
    except Exception as exc:  # older torch without functional collectives
        funcol = None
        log.info("mycroft: functional collectives not traced (%r)", exc)
    for spec in C10D_SPECS:
        for owner in (c10d, dist):
            patcher.replace(owner, spec.api, functools.partial(_collective_wrapper, recorder, spec, hot_path=hot_path))
    for spec in C10D_ONLY_IN_DIST:
        patcher.replace(dist, spec.api, functools.partial(_collective_wrapper, recorder, spec, hot_path=hot_path))
    for owner in (c10d, dist):
        patcher.replace(owner, "batch_isend_irecv", lambda original: _batch_wrapper(recorder, original))
        patcher.replace(owner, "_coalescing_manager", lambda original: _coalescing_wrapper(recorder, original))

    def init_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if on_init_start is not None:
                try:
                    on_init_start(_init_arguments(original, args, kwargs))
                except Exception as exc:
                    recorder._note_error("init_process_group", exc)
            result = original(*args, **kwargs)
            try:
                on_init()
            except Exception as exc:
                recorder._note_error("init_process_group", exc)
            return result

        return wrapper

    def destroy_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not args and kwargs.get("group") is None:
                try:
                    on_destroy()
                except Exception as exc:
                    recorder._note_error("destroy_process_group", exc)
            return original(*args, **kwargs)

        return wrapper

    for owner in (c10d, dist):
        patcher.replace(owner, "init_process_group", init_wrapper)
        patcher.replace(owner, "destroy_process_group", destroy_wrapper)

    patcher.replace(sys.modules["torch"], "compile", _compile_wrapper)
    work_type = getattr(getattr(sys.modules["torch"]._C, "_distributed_c10d", None), "Work", None)
    if work_type is not None:
        patcher.replace(work_type, "wait", lambda original: _work_wait_wrapper(recorder, original, hot_path))

    if funcol is not None:
        for spec in FUNCOL_SPECS:
            patcher.replace(funcol, spec.api, functools.partial(_funcol_wrapper, recorder, spec))
        patcher.replace(funcol, "wait_tensor", lambda original: _wait_tensor_wrapper(recorder, original))

    from torch.nn.parallel import DistributedDataParallel as DDP

    patcher.replace(DDP, "__init__", functools.partial(_ddp_init_wrapper, recorder, mode=ddp_hook))
    if ddp_hook is not False:
        patcher.replace(DDP, "register_comm_hook", _ddp_register_hook_wrapper)
        patcher.replace(DDP, "_register_builtin_comm_hook", _ddp_builtin_hook_wrapper)
