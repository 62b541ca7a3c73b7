"""Completion from the device, on real torchrun jobs over the NCCL-semantics CPU backend.

mycroft.faults.nccl_like returns from every op at enqueue, like ProcessGroupNCCL; only the
Work knows when the op finished. These jobs run under opentelemetry-instrument, ship real
OTLP, and (the hang) go to a real in-process RCA service.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from mycroft import schema
from mycroft.faults.inject import kill_tree, local_rca
from tests.conftest import SpanSink, instrumented_env, run_torchrun, torchrun_command

JOB = Path(__file__).parent / "jobs" / "nccl_like_job.py"
pytestmark = pytest.mark.slow


def _ops(spans: list[Any], rank: int, op: str) -> dict[int, Any]:
    return {s.attributes[schema.ATTR_SEQ]: s for s in spans
            if s.rank == rank and s.kind in (schema.KIND_COLLECTIVE, schema.KIND_P2P) and s.name == op}


def test_a_late_peer_leaves_the_op_in_flight_after_the_call_returned(otlp_sink: tuple[SpanSink, int]) -> None:
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.25", MYCROFT_STACK_AFTER="0.5",
                           MYCROFT_JOB_ID="nccl-like-late")
    late = 2.5
    # rank 2 arrives 2.5 s late at step 2's all_reduce (seq 3 of the default group)
    result = run_torchrun(JOB, 3, env, "--steps", "5", "--late-rank", "2", "--late-step", "2",
                          "--late-seconds", str(late), "--extra-ops")
    assert result.returncode == 0, result.stderr[-3000:]
    calls = {(int(r), int(s)): float(t) for r, s, t in re.findall(r"CALL (\d+) (\d+) ([0-9.]+)", result.stdout)}
    assert sink.wait_for(lambda spans: len({s.rank for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)}) == 3,
                         15)
    spans = sink.snapshot()
    for rank in (0, 1):
        # the call returned at enqueue ...
        assert calls[(rank, 2)] < 0.5, calls
        reduce = _ops(spans, rank, schema.OP_ALL_REDUCE)
        span = reduce[3]
        a = span.attributes
        # ... and the span ends when the op completed: after the late peer arrived
        assert (span.end_ns - span.start_ns) / 1e9 >= late - 0.3, a
        assert a[schema.ATTR_CALL_S] < 0.5
        assert a[schema.ATTR_TIMING] == schema.TIMING_DEVICE_POLLED
        # meanwhile the heartbeats showed it in flight, the call returned, the host in synchronize()
        beats = [s for s in spans if s.kind == schema.KIND_HEARTBEAT and s.rank == rank
                 and 3 in s.attributes[schema.ATTR_HB_INFLIGHT_SEQS]]
        waiting = [b for b in beats if max(b.attributes[schema.ATTR_HB_INFLIGHT_AGES_S]) > 1.0]
        assert waiting, f"rank {rank} never reported seq 3 in flight for long"
        beat = waiting[0]  # mid-wait: the last one may come after synchronize() returned and seq 4 was issued
        index = beat.attributes[schema.ATTR_HB_INFLIGHT_SEQS].index(3)
        assert beat.attributes[schema.ATTR_HB_INFLIGHT_RETURNED][index] is True
        at = beat.attributes[schema.ATTR_HB_GROUP_IDS].index(beat.attributes[schema.ATTR_HB_INFLIGHT_GROUP_IDS][index])
        assert beat.attributes[schema.ATTR_HB_GROUP_ISSUED][at] == 3
        assert beat.attributes[schema.ATTR_HB_GROUP_COMPLETED][at] == 2
        stack = str(beat.attributes.get(schema.ATTR_HB_STACK, ""))
        assert "nccl_like.py" in stack and "in synchronize" in stack and "nccl_like_job.py" in stack, stack
    # the late rank itself: short op, it came last
    mine = _ops(spans, 2, schema.OP_ALL_REDUCE)[3]
    assert (mine.end_ns - mine.start_ns) / 1e9 < 1.0
    # every rank numbers the same ops the same way, and every op of the NCCL-like group ends from the device
    for rank in range(3):
        ops = [s for s in spans if s.rank == rank and s.kind in (schema.KIND_COLLECTIVE, schema.KIND_P2P)]
        assert {s.attributes[schema.ATTR_TIMING] for s in ops} == {schema.TIMING_DEVICE_POLLED}, rank
        assert sorted(_ops(spans, rank, schema.OP_ALL_REDUCE)) == [1, 2, 3, 4, 5, 6]
        assert sorted(_ops(spans, rank, schema.OP_BARRIER)) == [7]
    # sync send / recv: the Work of the isend / irecv torch issues inside them is the op's
    assert set(_ops(spans, 0, schema.OP_SEND)) == {1} and set(_ops(spans, 1, schema.OP_RECV)) == {1}
    assert not [s for s in spans if s.attributes.get(schema.ATTR_STATE) == schema.STATE_IN_FLIGHT]


def test_a_rank_blocked_before_a_collective_is_the_root_cause_while_the_others_wait_in_synchronize() -> None:
    with local_rca() as rca:
        job = f"nccl-like-block-{os.getpid()}-{int(time.time())}"
        env = instrumented_env(None, OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca.otlp_grpc}", MYCROFT_JOB_ID=job,
                               MYCROFT_HEARTBEAT_INTERVAL="0.5", MYCROFT_STACK_AFTER="0.3")
        command = torchrun_command(JOB, 3, "--steps", "8", "--late-rank", "1", "--late-step", "3",
                                   "--late-seconds", "120")
        process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   start_new_session=True)
        try:
            assert process.stdout is not None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and "LATE 1" not in process.stdout.readline():
                pass
            onset = time.time()
            incident = None
            while time.time() < onset + 30 and incident is None:
                incident = next((i for i in rca.incidents(job) if i.get("root_causes")), None)
                time.sleep(0.2)
        finally:
            kill_tree(process)  # torchrun starts each worker in a session of its own: killpg misses them
        assert incident is not None, "no incident with a root cause within 30 s"
        top = incident["root_causes"][0]
        assert incident["kind"] == "hang", incident
        assert (top["rank"], top["kind"]) == (1, "not_entered"), incident
        assert "wait_here_on_purpose" in top["evidence"].get("stack", ""), top["evidence"]
        assert incident["detected_at_unix"] - onset < 10.0


def test_native_spans_join_the_python_trace_and_a_collective_behind_a_long_kernel_ends_after_it(
        otlp_sink: tuple[SpanSink, int]) -> None:
    """The NCCL profiler plugin, driven by the simulator as NCCL drives it, in a real torchrun job.

    Nobody names the plugin: the instrumentation sets NCCL_PROFILER_PLUGIN itself at start-up
    (instrumentation/nccl_plugin.py). Communicators are mapped to torch groups by shape and
    call-window evidence (commName is left empty), so each rank's nccl.collective span is a child
    of its own Python span.
    """
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.25", MYCROFT_JOB_ID="nccl-like-native")
    for name in ("NCCL_PROFILER_PLUGIN", "MYCROFT_NCCL_PROFILER_CHAIN", "MYCROFT_NCCL_PLUGIN"):
        env.pop(name, None)
    kernel = 0.6
    result = run_torchrun(JOB, 2, env, "--steps", "40", "--kernel-step", "30", "--kernel-seconds", str(kernel))
    assert result.returncode == 0, result.stderr[-3000:]
    assert sink.wait_for(lambda spans: len({s.rank for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)}) == 2,
                         15)
    spans = sink.snapshot()
    python = {(s.trace_id, s.span_id): s for s in spans if s.kind == schema.KIND_COLLECTIVE}
    native = [s for s in spans if s.kind == schema.KIND_NATIVE_COLL]
    channels = [s for s in spans if s.kind == schema.KIND_NATIVE_KERNEL_CHANNEL]
    for rank in (0, 1):
        mine = [s for s in native if s.rank == rank]
        assert len(mine) >= 32, f"rank {rank}: {len(mine)} native collectives"
        for span in mine:
            parent = python.get((span.trace_id, span.parent_span_id))
            assert parent is not None and parent.rank == rank, span.attributes
            assert span.attributes[schema.ATTR_SEQ] == parent.attributes[schema.ATTR_SEQ]
            assert span.attributes[schema.ATTR_GROUP_ID] == parent.attributes[schema.ATTR_GROUP_ID]
        ids, traces = {s.span_id for s in mine}, {s.trace_id for s in mine}
        kernels = [c for c in channels if c.rank == rank and c.trace_id in traces]
        assert len(kernels) >= 32 and all(c.parent_span_id in ids for c in kernels)
        # step 30's all_reduce (seq 31) queued behind a 0.6 s kernel: it ends after it, in both views
        behind = next(s for s in mine if s.attributes[schema.ATTR_SEQ] == 31)
        assert (behind.end_ns - behind.start_ns) / 1e9 >= kernel - 0.05
        py = python[(behind.trace_id, behind.parent_span_id)]
        assert (py.end_ns - py.start_ns) / 1e9 >= kernel - 0.05 and py.attributes[schema.ATTR_CALL_S] < 0.1
    # one trace per collective, both ranks in it
    by_trace: dict[int, set[int]] = {}
    for span in native:
        by_trace.setdefault(span.trace_id, set()).add(span.rank)
    assert sum(1 for ranks in by_trace.values() if ranks == {0, 1}) >= 30


def test_ddp_keeps_its_builtin_all_reduce_on_nccl_like_and_the_flight_recorder_shows_it_in_flight(
        otlp_sink: tuple[SpanSink, int]) -> None:
    """No Python hook where the all-reduce completes on the device: the bucket op a late peer holds
    up is in flight in the heartbeats from the Flight Recorder's entries, and gets its span."""
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.25", MYCROFT_JOB_ID="nccl-like-ddp")
    late = 2.5
    result = run_torchrun(Path(__file__).parent / "jobs" / "nccl_like_ddp.py", 2, env, "--steps", "6",
                          "--late-rank", "1", "--late-step", "3", "--late-seconds", str(late))
    assert result.returncode == 0, result.stderr[-3000:]
    assert sink.wait_for(lambda spans: len({s.rank for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)}) == 2,
                         15)
    spans = sink.snapshot()
    ops = [s for s in spans if s.kind == schema.KIND_COLLECTIVE]
    assert not [s for s in ops if "DistributedDataParallel" in str(s.attributes.get(schema.ATTR_API))]  # no hook
    # C++-issued ops get a span when a frontier read finds them in flight: the held-up one for sure
    # (DDP's constructor broadcasts are C++-issued too: under load a frontier read can catch one in flight)
    found = [s for s in ops if s.rank == 0 and s.attributes[schema.ATTR_SOURCE] == schema.SOURCE_FLIGHT_RECORDER]
    held = [s for s in found if s.name == schema.OP_ALL_REDUCE]
    assert held and all(s.attributes[schema.ATTR_TIMING] == schema.TIMING_FLIGHT_RECORDER for s in found), \
        [s.attributes for s in found]
    long = [s for s in held if (s.end_ns - s.start_ns) / 1e9 >= late - 0.5]
    assert len(long) == 1, [(s.attributes[schema.ATTR_SEQ], s.end_ns - s.start_ns) for s in held]
    span = long[0]
    seq = span.attributes[schema.ATTR_SEQ]
    assert span.attributes[schema.ATTR_BYTES] == (64 * 64 + 64) * 4  # the one bucket: weight and bias, float32
    beats = [b for b in spans if b.kind == schema.KIND_HEARTBEAT and b.rank == 0
             and seq in b.attributes[schema.ATTR_HB_INFLIGHT_SEQS]]
    assert beats and max(max(b.attributes[schema.ATTR_HB_INFLIGHT_AGES_S]) for b in beats) > 1.5
    at = beats[-1].attributes[schema.ATTR_HB_INFLIGHT_SEQS].index(seq)
    assert beats[-1].attributes[schema.ATTR_HB_INFLIGHT_OPS][at] == schema.OP_ALL_REDUCE
