"""The background side of one rank: spans, heartbeats, signals, native ring, shutdown.

Started once torch.distributed is initialised (a script that never initialises it
gets no thread at all). Everything here runs on the `mycroft-runtime` thread, except
the signal handler and the atexit hook, which do only bounded work.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import os
import random
import select
import signal
import sys
import threading
import time
import uuid
from typing import Any

from mycroft.instrumentation import nccl_plugin
from mycroft.instrumentation.comm_map import GroupShape, PyOp, match_comms
from mycroft.instrumentation.compile_phase import WATCH as COMPILE_WATCH
from mycroft.instrumentation.config import MycroftConfig
from mycroft.instrumentation.digest import SignatureDigests
from mycroft.instrumentation.directives import (
    DEFAULT_EXIT_CODE,
    HOST_GATHER_S,
    DirectiveWatcher,
    abort_line,
    abort_process_groups,
    control_from_env,
    reap_stopped_siblings,
)
from mycroft.instrumentation.export import Shipper, exporter_from_env
from mycroft.instrumentation.flight_recorder import FrCoverage, FrDone, FrontierReader, torch_dtype_name
from mycroft.instrumentation.recorder import OpRecord, Recorder
from mycroft.instrumentation.sampling import EPOCH, LAG, MAX_LEVEL, Stream, TraceBudget
from mycroft.instrumentation.spans import heartbeat_attributes, heartbeat_span, op_span, op_trace_id, readable
from mycroft.instrumentation.stacks import issuing_thread, other_thread_stacks, thread_stack
from mycroft.instrumentation.startup import host_attributes, launch_facts, launch_resource, named_resource
from mycroft.instrumentation.thread_names import name_this_thread
from opentelemetry.sdk.resources import Resource

from mycroft import schema
from mycroft.otlp import AttrValue, SpanRecord

log = logging.getLogger("mycroft.instrumentation")

JOB_ID_STORE_KEY = "mycroft/job_id"
RUN_ID_STORE_KEY = "mycroft/run_id"
NATIVE_HOLD_S = 3.0  # native records of a communicator wait this long for its group mapping
FRONTIER_PERIOD_S = 0.25  # Flight Recorder pg_status reads (~0.01 ms each) and new-group scans
# An entries dump holds the GIL (~16 ms at torch's 2,000 entries, several times that on a loaded
# machine): at most one per ENTRY_DUMP_GAP_S, and no more than ENTRY_DUMP_SHARE of the time (up to
# ENTRY_DUMP_GAP_MAX_S apart, so that a hang after a dump is still named in time)
ENTRY_DUMP_GAP_S = 1.0
ENTRY_DUMP_SHARE = 0.02
ENTRY_DUMP_GAP_MAX_S = 4.0
# Completed collectives no Python call recorded (DDP's buckets, ...) are named by full entries dumps, taken
# only while such seqs wait, at most FULL_DUMP_SHARE of the wall time (spaced by the last dump's own cost)
# and at least FULL_DUMP_GAP_S apart: the training thread waits for the GIL while torch dumps
FULL_DUMP_SHARE = 0.005
FULL_DUMP_GAP_S = 1.0
# a completed seq is looked at once a read this long ago found it completed: the drains between noted the
# Python ops' records (a tick is IDLE_TICK_S at most)
SETTLE_NS = 400_000_000
# epoch marks a group's Python collectives leave for its stream of Flight Recorder spans, at most (those spans
# come a dump later: at 600 collectives/s and a dump per 3.2 s, ~120 epochs; 256 leave room)
FR_MARKS_KEPT = 256
# a host-synchronous op (gloo) no Python call of ours issued is looked up once it stayed open this long:
# a healthy C++ op (a DDP bucket) ends before; a stuck one is named well before the RCA's 1 s hang minimum
HOST_SYNC_OPEN_S = 0.5
# a functional collective whose call lasts this long waits inside it for its peers (DETAIL's checks)
BLOCKED_CALL_NS = 200_000_000
# Teardown (destroy_process_group, interpreter exit, a caught signal, uninstrument) waits this long at most
# for the last words to go out, whatever the collector does; a healthy one takes them in milliseconds. Then
# the exporter is stopped within TEARDOWN_CLOSE_S and what stayed unsent is counted (export.Shipper.close).
# Together under the 0.5 s that teardown may add to the job's (docs/instrumentation.md, "Never harm").
TEARDOWN_S = 0.3
TEARDOWN_CLOSE_S = 0.05
LAST_WORDS_FLUSH_S = 0.05  # the final heartbeat's own chance, however long the step under way held teardown
# The runtime thread wakes every BUSY_TICK_S while an op's completion is being polled (its span's end
# time is the poll's), else once per frontier read: each wake costs ~100 us cold, and spans drained in
# fewer, fuller batches cost half as much per op (docs/instrumentation.md, "Fewer, fuller ticks")
BUSY_TICK_S = 0.05
IDLE_TICK_S = FRONTIER_PERIOD_S


def entry_dump_due(unknown_open: list[tuple[bool, float]], now_s: float, not_before_s: float) -> bool:
    """Whether to read the Flight Recorder's entries for collectives no Python call of ours issued,
    given each one's (device_async, first seen open at): on a device-async group at once (NCCL's
    active entries are few), on a host-synchronous one once it stayed open HOST_SYNC_OPEN_S."""
    if now_s < not_before_s:
        return False
    return any(device_async or now_s - seen_s >= HOST_SYNC_OPEN_S for device_async, seen_s in unknown_open)


def runtime_tick_s(polling: bool, heartbeat_interval_s: float, until_heartbeat_s: float) -> float:
    """How long the runtime thread sleeps: BUSY_TICK_S while it polls completions, IDLE_TICK_S otherwise,
    a quarter of the heartbeat interval at most, and never past the next heartbeat."""
    tick = min(BUSY_TICK_S if polling else IDLE_TICK_S, heartbeat_interval_s / 4)
    return max(0.001, min(tick, until_heartbeat_s))


def next_entry_dump(now_s: float, last_cost_s: float) -> float:
    """When the next entries read may come: ENTRY_DUMP_GAP_S after this one, longer where a read costs
    more than ENTRY_DUMP_SHARE of that (it holds the GIL), never over ENTRY_DUMP_GAP_MAX_S."""
    return now_s + min(ENTRY_DUMP_GAP_MAX_S, max(ENTRY_DUMP_GAP_S, last_cost_s / ENTRY_DUMP_SHARE))


def next_full_dump(now_s: float, last_cost_s: float) -> float:
    """When the next full entries dump may come: its cost spaced to FULL_DUMP_SHARE of the time."""
    return now_s + max(FULL_DUMP_GAP_S, last_cost_s / FULL_DUMP_SHARE)


# the process's next full dump (monotonic s): the GIL is the process's, whichever runtime dumps (instrumented
# again after uninstrument(), a runtime takes up the spacing where the last one left it)
_NEXT_FULL_DUMP = [0.0]


def negotiate_job_id(configured: str | None) -> str:
    """The job id every rank agrees on: configured, else set once in the c10d store."""
    if configured:
        return configured
    try:
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        proposal = uuid.uuid4().hex[:16]
        agreed = store.compare_set(JOB_ID_STORE_KEY, "", proposal)
        text = agreed.decode() if isinstance(agreed, bytes) else str(agreed)
        if text:
            return text
    except Exception as exc:
        log.debug("mycroft: job id negotiation failed: %r", exc)
    return "job-{}-{}".format(os.environ.get("MASTER_ADDR", "local"), os.environ.get("MASTER_PORT", "0"))


def negotiate_run_id() -> str:
    """This launch's id, the same on every rank: "<base>.<restart>".

    The base is set once in the c10d store (which torchelastic keeps across restarts, so a
    relaunch keeps its base) and the restart count comes from TORCHELASTIC_RESTART_COUNT:
    the RCA keeps two launches under one job id apart, and knows a restart from a clash.
    """
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    restart = restart if restart.isdigit() else "0"
    try:
        import torch.distributed as dist

        store = dist.distributed_c10d._get_default_store()
        agreed = store.compare_set(RUN_ID_STORE_KEY, "", uuid.uuid4().hex[:12])
        base = agreed.decode() if isinstance(agreed, bytes) else str(agreed)
        if base:
            return f"{base}.{restart}"
    except Exception as exc:
        log.debug("mycroft: run id negotiation failed: %r", exc)
    return "{}-{}.{}".format(os.environ.get("MASTER_ADDR", "local"), os.environ.get("MASTER_PORT", "0"), restart)


def native_flush(linger_s: float) -> None:
    """Have the NCCL plugin loaded in this process publish what finished (last words at exit).

    Its publisher retires a collective only after a quiet linger; waiting that out once and
    flushing puts the last collectives in the ring before the final drain. Nothing happens
    when the plugin is not loaded (RTLD_NOLOAD never loads it).
    """
    import ctypes

    path = os.environ.get("NCCL_PROFILER_PLUGIN", "")
    if not path or path == "none":
        return
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return
    flush = getattr(lib, "mycroft_native_flush", None)
    if flush is None:
        return
    time.sleep(linger_s)
    flush()


class Runtime:
    """Owns the background thread of one process."""

    def __init__(self, config: MycroftConfig, recorder: Recorder, exporter: Any = None,
                 deliver: Any = None, base_resource: Resource | None = None, startup: Any = None) -> None:
        import torch.distributed as dist

        self.config = config
        self.recorder = recorder
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        recorder.world_rank = self.rank
        facts = startup.facts if startup is not None else launch_facts(os.environ)
        if facts is not None and (facts.rank != self.rank or facts.world_size != self.world_size):
            facts = None  # the script set its own ranks: the launcher's facts are not this process's
        self.job_id = negotiate_job_id(config.job_id or (facts.job_id if facts is not None else None))
        self.run_id = negotiate_run_id()
        self.launch = facts
        self.resource = self._resource(base_resource)
        if startup is not None:  # the start-up reporter's Shipper goes on, now with the full resource
            self._hb_counter, self.shipper = startup.hand_over()
            self.shipper.resource = self.resource
        else:
            if exporter is None and deliver is None:
                exporter = exporter_from_env()
            self.shipper = Shipper(exporter, self.resource, config.queue_size, config.export_batch,
                                   config.export_delay_s, deliver=deliver)
        self._rng = random.Random()
        self._hb_counter = self._hb_counter if startup is not None else 0  # one process, one sequence
        self._beat_since_init = False
        # which op spans are sent (MYCROFT_TRACE_BUDGET, MYCROFT_OP_SPAN_SAMPLE); its counts go in heartbeats
        self.budget = TraceBudget(config.trace_budget, self.world_size, config.op_span_sample, config.keep_slow_s)
        self._digests = SignatureDigests()  # what the RCA compares when op spans are sampled
        self._last_hb_ns = time.time_ns()
        self._stop = threading.Event()
        # held by the runtime thread for each step: final() (a signal handler, atexit, uninstrument) waits
        # for the step under way before draining; two drains at once raced in the digests and the budget
        self._stepping = threading.RLock()
        self._final_sent = threading.Lock()
        self._final_done = False
        self._signal_after_final = 0  # a signal that arrived while a final flush was running
        self._aborting_with = 0  # the exit code of an abort under way (0: none)
        self._native: Any = None
        self._native_next_try = 0.0
        self._frontier = FrontierReader()  # every issuer's per-group frontier (flight_recorder.py)
        self._next_frontier = 0.0
        self._pg_count = -1  # torch's group count at the last scan: new groups register when created
        # (gid, seq) open in the Flight Recorder that Python did not issue -> when first seen
        self._unknown_open: dict[tuple[str, int], float] = {}
        self._next_entry_dump = 0.0
        # recent collectives of device-async groups: the evidence that maps NCCL communicators to groups
        self._py_ops: collections.deque[PyOp] = collections.deque(maxlen=512)
        self._fr_ops: dict[tuple[str, int], OpRecord] = {}  # collectives only the Flight Recorder saw
        # completed collectives no Python call recorded, spanned from full entries dumps (flight_recorder.py)
        self._coverage = FrCoverage(since_ns=time.time_ns())
        self._fr_windows: dict[OpRecord, int] = {}  # their records -> the window their end lies in (ns)
        self._directives: DirectiveWatcher | None = None
        control = control_from_env(os.environ)
        if control is not None:
            self._directives = DirectiveWatcher(control, self.job_id, self.run_id)
        self._wakeup_r: int | None = None
        self._saved_handlers: dict[int, Any] = {}
        self._install_signal_handlers()
        self._thread = threading.Thread(target=self._run, name="mycroft-runtime", daemon=True)
        self._thread.start()
        recorder.completion.start()
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ setup
    def _resource(self, base: Resource | None) -> Resource:
        attributes: dict[str, AttrValue] = launch_resource(self.launch) if self.launch is not None else {}
        attributes.update({
            schema.RES_JOB_ID: self.job_id,
            schema.RES_RUN_ID: self.run_id,
            schema.RES_RANK: self.rank,
            schema.RES_WORLD_SIZE: self.world_size,
            schema.RES_LOCAL_RANK: int(os.environ.get("LOCAL_RANK", self.launch.local_rank if self.launch
                                                      else self.rank)),
            **host_attributes(os.environ),  # the SLURM / Kubernetes node name where there is one
            schema.RES_PROCESS_PID: os.getpid(),
            schema.RES_SCHEMA_VERSION: schema.SCHEMA_VERSION,
        })
        if os.environ.get("SLURM_JOB_ID"):
            attributes[schema.RES_SLURM_JOB_ID] = os.environ["SLURM_JOB_ID"]
        if math.isfinite(self.config.trace_budget):
            attributes[schema.RES_TRACE_BUDGET] = float(self.config.trace_budget)
        return named_resource(base, attributes, self.job_id)

    def _install_signal_handlers(self) -> None:
        """Catchable termination signals get a final heartbeat before the process dies."""
        if threading.current_thread() is not threading.main_thread():
            return
        for name in self.config.catch_signals:
            signum = getattr(signal, name, None)
            if not isinstance(signum, int):
                continue
            try:
                if signal.getsignal(signum) is not signal.SIG_DFL:
                    continue  # the application handles it; do not interfere
                self._saved_handlers[signum] = signal.signal(signum, self._on_signal)
            except (ValueError, OSError):
                continue
        if not self._saved_handlers:
            return
        # The Python-level handler only runs once the main thread is back in the
        # interpreter; a rank blocked inside a C++ collective is woken through this fd.
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:
            os.close(read_fd)
            os.close(write_fd)
            return
        if previous != -1:  # someone (asyncio) owns it: give it back
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return
        self._wakeup_r = read_fd

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._aborting_with:
            # This rank is leaving on the RCA's abort (the runtime thread exits with its code once
            # its host has read it); the launcher's SIGTERM, sent when a sibling left first, must
            # not turn that exit into a kill: its summary would show -15, not the abort's code.
            time.sleep(HOST_GATHER_S + 2.0)
            os._exit(self._aborting_with)
        if self._final_sent.locked():
            # A final flush is running — often the atexit one this very signal interrupted
            # (a peer died, torchrun sends SIGTERM while we exit). Let it finish; it re-raises.
            self._signal_after_final = signum
            return
        self.final(exit_reason=signal.Signals(signum).name)
        self._reraise(signum)

    def _reraise(self, signum: int) -> None:
        previous = self._saved_handlers.get(signum, signal.SIG_DFL)
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    # ------------------------------------------------------------------ loop
    def _run(self) -> None:
        name_this_thread("mycroft-runtime")
        while not self._stop.is_set():
            try:
                with self._stepping:
                    if not self._stop.is_set():
                        self._step()
            except Exception as exc:  # never die: count and keep going
                self.recorder._note_error("runtime", exc)
            until_heartbeat_s = self.config.heartbeat_interval_s - (time.time_ns() - self._last_hb_ns) / 1e9
            tick = runtime_tick_s(self._polling(), self.config.heartbeat_interval_s, until_heartbeat_s)
            if self._wakeup_r is not None:
                self._wait_signal(tick)
            else:
                self._stop.wait(tick)

    def _wait_signal(self, timeout: float) -> None:
        assert self._wakeup_r is not None
        ready, _, _ = select.select([self._wakeup_r], [], [], timeout)
        if not ready:
            return
        data = os.read(self._wakeup_r, 64)
        caught = [signum for signum in data if signum in self._saved_handlers]
        if not caught:
            return
        # Give the main thread's handler a moment; if it is stuck in C++, report from here.
        time.sleep(0.5)
        if not self._final_done:
            name = signal.Signals(caught[0]).name
            self.final(exit_reason=name)
            os._exit(128 + caught[0])

    def _polling(self) -> bool:
        """Whether an op waits on this thread's next look to end with its time (`polled`: a gloo Work
        without a future, its span ends when it is seen), or a failure to ship at once. Ends noticed
        after the fact (`inferred`, `flight_recorder`: functional collectives, C++ ops, released Works)
        are late by nature and the RCA reads them so: the frontier's period is theirs."""
        return bool(self.recorder.pending_works or self.recorder.failures_pending)

    def _step(self) -> None:
        if self._directives is not None:
            directive = self._directives.check()
            if directive is not None:
                self._abort(directive)
        now_s = time.monotonic()
        if now_s >= self._next_frontier:
            self._next_frontier = now_s + FRONTIER_PERIOD_S
            self._register_groups()
            self._read_frontier()
        elif self.recorder.funcol_device or self._fr_ops or self.recorder.completion.workless_groups():
            self._read_frontier()
        self.recorder.poll_pending()
        self._drain_ops()
        self._drain_native()
        now = time.time_ns()
        # the first heartbeat goes out at once (init): a rank that dies before its first
        # interval is over must still be known to the RCA as a heartbeating rank
        if not self._beat_since_init or now - self._last_hb_ns >= self.config.heartbeat_interval_s * 1e9:
            self._beat_since_init = True
            self.shipper.submit([self._heartbeat(now)], urgent=True)

    def _drain_ops(self) -> None:
        records = self.recorder.take_done()
        if not records:
            return
        spans: list[SpanRecord] = []
        # per record, on this thread, holding the GIL the training thread waits for: what is looked up
        # per op (the budget, the digests, the groups' trace-id functions) is looked up once here
        budget = self.budget
        keep, add_digest, job_id = budget.keep, self._digests.add, self.job_id
        p2p_ops, trace_ids = schema.P2P_OPS, schema.collective_trace_ids
        # collectives recorded here are explained to the Flight Recorder's coverage; the ones it built itself
        # (windows) come seconds late, so the budget decides them as a stream of their own, in seq order
        note = self._coverage.note if self._frontier.available else None
        windows, keep_slow_ns = self._fr_windows, budget.keep_slow_ns
        for record in records:
            gid = record.group.gid
            window = windows.pop(record, None) if windows else None
            if record.op in p2p_ops:
                trace_id = op_trace_id(record, job_id)
                stream = (gid, record.src, record.dst)
            elif window is not None:
                trace_id, stream = trace_ids(job_id, gid)(record.seq), (gid, -2, -2)
            else:
                dtype = record.dtype
                add_digest(gid, record.seq, record.op, record.bytes, readable(dtype) if dtype is not None else "")
                if note is not None:
                    note(gid, record.seq)
                    if not record.seq % EPOCH:  # its end also marks the group's epoch for the Flight Recorder's
                        self._mark_fr_epoch(gid, record)
                if record.device:
                    self._py_ops.append(PyOp(gid, record.seq, record.op, record.start_ns, record.call_end_ns))
                trace_id, stream = trace_ids(job_id, gid)(record.seq), (gid, -1, -1)
            # the Flight Recorder's own: measured by its enqueue times, which members share as they share ends
            end_ns = record.end_ns if window is None or record.end_ns - record.start_ns >= keep_slow_ns \
                else record.start_ns
            if keep(trace_id, stream, record.seq, record.state, record.start_ns, end_ns):
                span = op_span(record, job_id, self.rank, trace_id=trace_id)
                if budget.kept_probability < 1.0:
                    span.attributes[schema.ATTR_SAMPLE_PROBABILITY] = budget.kept_probability
                if window is not None:
                    span.attributes[schema.ATTR_END_WINDOW_S] = round(window / 1e9, 6)
                spans.append(span)
        # a failed op is the evidence of a mismatch or an abort: ship it before the process dies
        urgent, self.recorder.failures_pending = self.recorder.failures_pending, False
        self.shipper.submit(spans, urgent=urgent)

    def _mark_fr_epoch(self, gid: str, record: OpRecord) -> None:
        """A Python collective at an epoch boundary (seq % EPOCH == 0) marks that epoch's start for the group's
        stream of Flight Recorder spans too: in a group where C++ and Python issue in turn (DDP's buckets
        between all_gathers), that stream alone would seldom hold both ends of an epoch and never measure
        its rate. It arrives before the Flight Recorder's spans of the epochs it rates, on every member."""
        budget = self.budget
        if record.state != schema.STATE_COMPLETED or budget.allowance == math.inf:
            return
        fr_stream = budget.streams.get((gid, -2, -2))
        if fr_stream is None:  # as the budget makes it at its first op (a group of Python ops only: marks alone)
            fr_stream = budget.streams[(gid, -2, -2)] = Stream(level=MAX_LEVEL if budget.allowance <= 0.0 else 0)
        epoch = record.seq // EPOCH
        marks = fr_stream.marks
        if epoch >= fr_stream.epoch - LAG:
            marks.setdefault(epoch, record.end_ns)
            if len(marks) > FR_MARKS_KEPT:  # no Flight Recorder span takes them (a group of Python ops only)
                del marks[min(marks)]

    def _drain_native(self) -> None:
        if not self.config.native:
            return
        if self._native is None:
            if time.monotonic() < self._native_next_try:
                return
            self._native_next_try = time.monotonic() + 0.25  # NCCL creates the ring at its first communicator
            if not self._nccl_possible():
                return
            try:
                from mycroft.instrumentation.native_reader import NativeReader

                self._native = NativeReader.open_for_pid(os.getpid(), self.job_id, self.rank)
                if self._native is not None:
                    self._native.hold_s = NATIVE_HOLD_S
            except Exception:
                self._native = None
            if self._native is None:
                return
        spans = self._native.drain()
        if self._native.unmapped():
            self._map_comms()
        spans.extend(self._native.release())
        if spans:
            self.shipper.submit(spans)

    def _nccl_possible(self) -> bool:
        """Whether NCCL can have loaded the profiler plugin here: a device-async group exists (NCCL,
        or a backend that says it completes on the device), or the plugin is named. A gloo-only rank
        then never looks for a ring (a path lookup and a failed open, ~0.2 ms cold, 4 times a second)."""
        if nccl_plugin.named_by_user():
            return True
        return any(info.device_async for info in self.recorder.groups.all())

    def _map_comms(self) -> None:
        """Put NCCL communicators into their groups' traces (instrumentation/comm_map.py)."""
        reader = self._native
        groups = [GroupShape(info.gid, info.name, info.desc, info.ranks, info.group_rank)
                  for info in self.recorder.groups.all() if info.device_async]
        if not groups:
            return
        ops = list(self._py_ops) + [PyOp(r.group.gid, r.seq, r.op, r.start_ns, r.call_end_ns)
                                    for r in self.recorder.snapshot_inflight()
                                    if r.device and r.op not in schema.P2P_OPS]
        unmapped = set(reader.unmapped())
        comms = [comm for comm in reader.comms() if comm.comm_hash in unmapped]
        for comm_hash, mapping in match_comms(comms, reader.held_collectives(), groups, ops).items():
            reader.map_comm(comm_hash, mapping.gid, mapping.ranks, mapping.seq_offset)

    def _register_groups(self) -> None:
        """Groups register when torch creates them (new_group, split_group, DeviceMesh), not at their
        first Python call: a group only compiled code or C++ uses is still in the heartbeats."""
        try:
            import torch.distributed.distributed_c10d as c10d

            names = c10d._world.pg_names
            if len(names) == self._pg_count:
                return
            self._pg_count = len(names)
            for pg in list(names):
                self.recorder.groups.resolve(pg)
        except Exception as exc:
            self.recorder._note_error("group scan", exc)

    def _read_frontier(self) -> None:
        """Every group's Flight Recorder frontier, and what it completes or reveals."""
        groups = self.recorder.groups.all()
        if not groups or not self._frontier.available:
            return
        status = self._frontier.read(lambda: {info.name: info.counter() for info in groups},
                                     learn_now=self._final_done)
        if not status:
            return
        read_ns = time.time_ns()
        tracker = self.recorder.completion
        workless = tracker.workless_groups()
        for info in groups:
            frontier = status.get(info.name)
            if frontier is None:
                continue
            info.fr_enqueued, info.fr_completed = info.collective_frontier(*frontier)
            self._coverage.observe(info.gid, info.fr_completed, read_ns)
            if info.gid in workless:
                tracker.complete_through(info.gid, info.fr_completed, schema.TIMING_FLIGHT_RECORDER)
        self._cover_cpp_ops(groups)

    def _cover_cpp_ops(self, groups: list[Any]) -> None:
        """Collectives no Python call of ours issued (C++, compiled code, torch.ops, coalesced blocks):
        in flight from the FR's entries, done by its frontier.

        A seq the Flight Recorder has enqueued but not completed, which no Python call of ours
        issued, came from elsewhere. Its entry gives op, size and enqueue time; it is then in
        flight in the heartbeats like any op, and its span (mycroft.source = flight_recorder)
        ends when the frontier passes it. On device-async groups (NCCL) the entries are read at
        once (onlyActive is small there); on host-synchronous ones (gloo, whose entries never
        retire) only once such a seq stayed open HOST_SYNC_OPEN_S: a healthy job's C++ ops finish
        long before. Dumps are spaced by their own cost (ENTRY_DUMP_SHARE).

        Every such collective gets a span, the ones that completed between two reads too (FrCoverage:
        a DDP bucket nearly always does): once seqs the frontier passed wait unexplained, a full
        entries dump (at most FULL_DUMP_SHARE of the time, and one in the last words) names them; each
        becomes a done record, started at its enqueue, ended as its entry says (NCCL) or at the first
        read that found it completed (gloo: `mycroft.end_window_s` says since when).
        """
        recorder = self.recorder
        for key, record in list(self._fr_ops.items()):
            if record.group.fr_completed >= record.seq:
                del self._fr_ops[key]
                recorder.complete(record, timing=schema.TIMING_FLIGHT_RECORDER)
        for info in groups:  # the frontier is the truth for what it saw, whoever issued it
            if not info.device_async and info.fr_completed > info.completed and \
                    not any(r.group is info and r.seq <= info.fr_completed for r in recorder.snapshot_inflight()):
                info.completed = info.fr_completed
                info.issued = max(info.issued, info.fr_completed)
        coverage = self._coverage
        known: set[tuple[str, int]] | None = None
        # completed seqs nothing recorded, found completed a drain ago (last words: all of them); a first
        # look with only what was drained, nearly always enough
        settled = None if self._final_done else time.time_ns() - SETTLE_NS
        now_s = time.monotonic()
        waiting = coverage.unexplained(settled_before_ns=settled)
        # last words take one whatever the spacing: the last steps' buckets completed since the last dump
        full_due = bool(waiting) and (now_s >= _NEXT_FULL_DUMP[0] or self._final_done)
        if full_due:  # the records not drained yet are looked at only when a dump may follow
            known = self._known_ops()
            full_due = bool(coverage.unexplained(known, settled))
        open_groups = [info for info in groups if info.fr_enqueued > info.fr_completed]
        unknown: list[tuple[Any, int]] = []
        if open_groups:
            if known is None:
                known = self._known_ops()
            unknown = [(info, seq) for info in open_groups
                       for seq in range(max(info.fr_completed, info.completed) + 1, info.fr_enqueued + 1)
                       if (info.gid, seq) not in known]
        seen = {(info.gid, seq): self._unknown_open.get((info.gid, seq), now_s) for info, seq in unknown}
        self._unknown_open = seen
        open_due = bool(unknown) and entry_dump_due(
            [(info.device_async, seen[(info.gid, seq)]) for info, seq in unknown], now_s, self._next_entry_dump)
        if not open_due and not full_due:
            return
        entries = self._frontier.read_entries(active_only=not full_due)  # NCCL's onlyActive is small
        cost = self._frontier.entry_read_s
        self._next_entry_dump = next_entry_dump(time.monotonic(), cost)
        if full_due:
            _NEXT_FULL_DUMP[0] = next_full_dump(time.monotonic(), cost)
        if unknown:
            self._adopt_open(unknown, entries)
        if full_due:
            infos = {info.gid: info for info in groups}
            for done in coverage.resolve({info.name: info.gid for info in groups}, entries, known or set(), settled):
                self._queue_fr_done(infos[done.gid], done)
            if self._final_done:  # last words: the heartbeat that called this is the last drain's
                self._drain_ops()

    def _known_ops(self) -> set[tuple[str, int]]:
        """(gid, seq) of the collectives recorded but not drained yet (in flight, done, adopted)."""
        recorder = self.recorder
        known = {(op.gid, op.seq) for op in self._py_ops}
        known.update((r.group.gid, r.seq) for r in recorder.snapshot_inflight() if r.op not in schema.P2P_OPS)
        known.update((r.group.gid, r.seq) for r in recorder.done_not_taken() if r.op not in schema.P2P_OPS)
        known.update((r.group.gid, r.seq) for r in list(recorder.funcol_calls.values()))
        known.update(self._fr_ops)
        return known

    def _adopt_open(self, unknown: list[tuple[Any, int]], entries: list[Any]) -> None:
        """Collectives open in the Flight Recorder that no Python call issued: in flight from their entries."""
        recorder = self.recorder
        by_name = {info.name: info for info, _ in unknown}
        wanted = {(info.gid, seq) for info, seq in unknown}
        for entry in entries:
            info = by_name.get(entry.group)
            if info is None or (info.gid, entry.seq) not in wanted or entry.completed_ns:
                continue
            record = OpRecord(f"{schema.SOURCE_FLIGHT_RECORDER}:{entry.op}", entry.op, info, entry.seq,
                              entry.created_ns or time.time_ns())
            record.source = schema.SOURCE_FLIGHT_RECORDER
            record.bytes, record.dtype = entry.bytes, entry.dtype or None
            record.call_end_ns = record.start_ns  # issued from C++: enqueued at once
            self._fr_ops[(info.gid, entry.seq)] = record
            self._coverage.note(info.gid, entry.seq)
            recorder.adopt(record)

    def _queue_fr_done(self, info: Any, done: FrDone) -> None:
        """A completed collective only the Flight Recorder recorded: a done record for the drain (its span
        in the collective's trace, under the budget), ended as FrCoverage bounds it."""
        entry = done.entry
        record = OpRecord(f"{schema.SOURCE_FLIGHT_RECORDER}:{entry.op}", entry.op, info, entry.seq,
                          min(entry.created_ns or done.end_ns, done.end_ns), entry.bytes,
                          torch_dtype_name(entry.dtype) if entry.dtype else None)
        record.source = schema.SOURCE_FLIGHT_RECORDER
        record.call_end_ns = record.start_ns  # issued from C++: enqueued at once
        record.end_ns = done.end_ns
        record.state = schema.STATE_COMPLETED
        record.timing = schema.TIMING_FLIGHT_RECORDER
        recorder = self.recorder
        if len(recorder.queue) >= recorder.queue_size:
            recorder._push(record)  # dropped and counted
            return
        self._fr_windows[record] = done.window_ns
        recorder.queue.append(record)

    def _waiting_elsewhere(self, inflight: list[Any], now: int) -> bool:
        """A device-async op's call returned long ago and it is still in flight: the main thread
        waits in a later sync point (.item(), cuda.synchronize()), whose stack the RCA wants."""
        after = self.config.stack_after_s * 1e9
        return any(record.device and record.call_end_ns and now - record.call_end_ns >= after
                   for record in inflight)

    # ------------------------------------------------------------------ heartbeats
    def _heartbeat(self, now: int, final_reason: str = "") -> SpanRecord:
        recorder = self.recorder
        self._read_frontier()  # pg_status only: fresh for the heartbeat
        recorder.adopt_blocked_calls(now, BLOCKED_CALL_NS)
        inflight = recorder.snapshot_inflight()
        posted = recorder.posted_only(inflight)
        last_activity = recorder.counters.last_activity_ns
        since = max([last_activity, *(record.call_end_ns for record in inflight)]) if posted else last_activity
        idle_s = 0.0 if inflight and not posted else max(0.0, (now - since) / 1e9)
        attributes = heartbeat_attributes(recorder.groups.all(), inflight, now, idle_s)
        attributes[schema.ATTR_HB_DROPPED] = recorder.dropped + recorder.ring.lost + self.shipper.dropped + \
            recorder.errors
        counts = self.budget.counts
        attributes[schema.ATTR_HB_SPANS_KEPT] = counts.kept
        attributes[schema.ATTR_HB_SPANS_ANOMALIES] = counts.anomalies
        attributes[schema.ATTR_HB_SPANS_SAMPLED_OUT] = counts.sampled_out
        attributes[schema.ATTR_HB_COMM_S] = round(recorder.comm_seconds(now), 6)
        attributes[schema.ATTR_HB_OPS_DONE] = recorder.counters.ops_done
        coverage = self._coverage
        if coverage.built or coverage.lost:  # C++-issued collectives spanned from the Flight Recorder's entries
            attributes[schema.ATTR_HB_FR_BUILT] = coverage.built
            attributes[schema.ATTR_HB_FR_LOST] = coverage.lost
            attributes[schema.ATTR_HB_FR_DUMP_S] = round(self._frontier.entry_read_total_s, 4)
        COMPILE_WATCH.poll()
        attributes[schema.ATTR_HB_PHASE] = schema.PHASE_COMPILING if COMPILE_WATCH.compiling else schema.PHASE_TRAINING
        attributes.update(self._digests.heartbeat_attributes())
        if posted:
            attributes[schema.ATTR_HB_POSTED_ONLY] = True
        # the stack once the main thread has made no call for stack_after_s, ops in flight or not: a rank whose
        # heartbeat still lists ops its peers finished (waited in C++, unseen) is in its own code, and the RCA,
        # which finds it not entered, needs the stack to tell a pause from a hang
        if final_reason or (now - since) / 1e9 >= self.config.stack_after_s or self._waiting_elsewhere(inflight, now):
            issuer = issuing_thread(recorder.issuers)
            stack = thread_stack(issuer, self.config.stack_depth)
            if stack:
                attributes[schema.ATTR_HB_STACK] = stack
            others = other_thread_stacks(issuer)
            if others:
                attributes[schema.ATTR_HB_THREAD_STACKS] = others
        if self._native is not None:
            try:
                attributes.update(self._native.heartbeat_attributes())
            except Exception as exc:
                recorder._note_error("native heartbeat", exc)
        if final_reason:
            attributes[schema.ATTR_HB_FINAL] = True
            attributes[schema.ATTR_HB_EXIT_REASON] = final_reason
        self._hb_counter += 1
        span = heartbeat_span(self.rank, self._hb_counter, self.config.heartbeat_interval_s,
                              self._last_hb_ns, now, attributes, self._rng)
        self._last_hb_ns = now
        return span

    # ------------------------------------------------------------------ shutdown
    def final(self, exit_reason: str, timeout_s: float = TEARDOWN_S) -> None:
        """Last words: pending spans, in-flight ops as in_flight spans, a final heartbeat; timeout_s bounds
        it all (the wait for the step under way and the collector's)."""
        deadline = time.monotonic() + timeout_s
        if not self._final_sent.acquire(blocking=False):
            return
        try:
            if self._final_done:
                return
            self._final_done = True
            self._stop.set()
            # the runtime thread's step under way ends first (not for ever: a thread stuck in a dump must
            # not hold the last words back)
            stepping = self._stepping.acquire(timeout=max(0.0, deadline - time.monotonic()))
            try:
                self._last_words(exit_reason, deadline)
            finally:
                if stepping:
                    self._stepping.release()
        finally:
            self._final_sent.release()
        pending = self._signal_after_final
        if pending and threading.current_thread() is threading.main_thread():
            self._reraise(pending)

    def _last_words(self, exit_reason: str, deadline: float) -> None:
        with contextlib.suppress(Exception):  # what the device finished since the last poll
            self.recorder.completion.poll()
            if self._fr_ops or self.recorder.funcol_device:
                self._read_frontier()
        with contextlib.suppress(Exception):
            self._drain_ops()
        with contextlib.suppress(Exception):  # and what NCCL finished (held records go as they are)
            self._native_next_try = 0.0
            if self.config.native:  # also when the reader is not open yet: it opens in the drain
                native_flush(self.config.native_linger_s)
            self._drain_native()
            if self._native is not None:
                self.shipper.submit(self._native.release(force=True))
        now = time.time_ns()
        leftovers = [op_span(record, self.job_id, self.rank, end_ns=now)
                     for record in self.recorder.snapshot_inflight()]
        # before whatever is queued: the next request carries them (a slow collector may take only one)
        self.shipper.submit([*leftovers, self._heartbeat(now, final_reason=exit_reason)], urgent=True, first=True)
        self.shipper.flush(max(LAST_WORDS_FLUSH_S, deadline - time.monotonic()))

    def _abort(self, directive: dict[str, Any]) -> None:
        """The RCA service's abort_job: one line naming the root cause, last words, groups aborted, exit."""
        code = directive.get("exit_code")
        code = code if isinstance(code, int) and 0 < code < 256 else DEFAULT_EXIT_CODE
        self._aborting_with = code
        with contextlib.suppress(Exception):
            sys.stderr.write(abort_line(directive) + "\n")
            sys.stderr.flush()
        watcher = self._directives
        if watcher is not None:
            watcher.acknowledge(directive)
        with contextlib.suppress(Exception):
            self.final(exit_reason=schema.EXIT_REASON_ABORTED, timeout_s=1.0)
        if watcher is not None:
            with contextlib.suppress(Exception):
                facts = launch_facts(os.environ)
                watcher.wait_for_host(directive, facts.local_world_size if facts else 0)
        abort_process_groups(1.0)
        if reap_stopped_siblings() and watcher is not None:
            with contextlib.suppress(Exception):
                watcher.sweep_after_kills()  # the killed ones cannot leave: the host's files go with us
        os._exit(code)

    def _atexit(self) -> None:
        if self._aborting_with:
            # The runtime thread is leaving on the RCA's abort and the main thread got here first: a peer that
            # left before it reset the connection its collective waited on, so the training raised and the
            # interpreter exits (with 1) before the runtime thread's os._exit. The abort's code is the exit
            # code: wait for the runtime thread to exit with it (HOST_GATHER_S and the groups' abort at most).
            time.sleep(HOST_GATHER_S + 2.0)
            os._exit(self._aborting_with)
        with contextlib.suppress(Exception):
            self.teardown(exit_reason="exit")

    def teardown(self, exit_reason: str, timeout_s: float = TEARDOWN_S + TEARDOWN_CLOSE_S) -> None:
        """The last words and the shutdown, in timeout_s together whatever the collector does."""
        deadline = time.monotonic() + timeout_s
        try:
            self.final(exit_reason=exit_reason, timeout_s=max(0.0, timeout_s - TEARDOWN_CLOSE_S))
        finally:
            self.shutdown(timeout_s=max(TEARDOWN_CLOSE_S, deadline - time.monotonic()))

    def shutdown(self, timeout_s: float = TEARDOWN_CLOSE_S) -> None:
        """Stop the threads and the exporter (what is still queued gets what is left of timeout_s, then is
        counted unsent); a thread that does not stop in time is a daemon, left behind."""
        deadline = time.monotonic() + timeout_s
        self._stop.set()
        with contextlib.suppress(Exception):
            atexit.unregister(self._atexit)
        if self._directives is not None:
            with contextlib.suppress(Exception):
                self._directives.stop()
        self.recorder.completion.stop(timeout_s=max(0.0, deadline - time.monotonic()))
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=max(0.0, min(0.01, deadline - time.monotonic())))
        self.shipper.close(max(0.0, deadline - time.monotonic()))
        if self._native is not None:
            with contextlib.suppress(Exception):
                self._native.close()
        for signum, previous in self._saved_handlers.items():
            with contextlib.suppress(Exception):
                if signal.getsignal(signum) == self._on_signal:
                    signal.signal(signum, previous)
        if self._wakeup_r is not None:
            with contextlib.suppress(Exception):
                signal.set_wakeup_fd(-1)
            self._wakeup_r = None
