"""Heartbeats on real jobs: a blocked rank, and last words on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from mycroft import schema
from mycroft.faults.inject import kill_tree
from tests.conftest import SpanSink, instrumented_env, run_torchrun, torchrun_command

pytestmark = pytest.mark.slow  # real torchrun jobs and subprocesses

JOB = Path(__file__).parent / "jobs" / "blocking.py"


def _beats(spans: list, rank: int) -> list:
    return sorted((s for s in spans if s.kind == schema.KIND_HEARTBEAT and s.rank == rank), key=lambda s: s.end_ns)


def test_blocked_rank_is_in_flight_for_others_and_reports_its_stack(otlp_sink: tuple[SpanSink, int]) -> None:
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.25", MYCROFT_STACK_AFTER="0.5",
                           MYCROFT_JOB_ID="blocked")
    # rank 2 sleeps 4 s at step 3, before that step's all_reduce (seq 4 of the default group)
    result = run_torchrun(JOB, 3, env, "--steps", "6", "--block-rank", "2", "--block-step", "3",
                          "--block-seconds", "4")
    assert result.returncode == 0, result.stderr[-3000:]
    sink.wait_for(lambda spans: len([s for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)]) >= 3, 15)
    spans = sink.snapshot()
    for waiting_rank in (0, 1):
        stuck = [b for b in _beats(spans, waiting_rank)
                 if 4 in b.attributes[schema.ATTR_HB_INFLIGHT_SEQS]
                 and max(b.attributes[schema.ATTR_HB_INFLIGHT_AGES_S]) > 1.0]
        assert stuck, f"rank {waiting_rank} never reported seq 4 in flight"
        beat = stuck[-1]
        index = beat.attributes[schema.ATTR_HB_INFLIGHT_SEQS].index(4)
        assert beat.attributes[schema.ATTR_HB_INFLIGHT_OPS][index] == schema.OP_ALL_REDUCE
        group = beat.attributes[schema.ATTR_HB_INFLIGHT_GROUP_IDS][index]
        at = beat.attributes[schema.ATTR_HB_GROUP_IDS].index(group)
        assert beat.attributes[schema.ATTR_HB_GROUP_ISSUED][at] == 4
        assert beat.attributes[schema.ATTR_HB_GROUP_COMPLETED][at] == 3
    stacked = [b for b in _beats(spans, 2)
               if b.attributes.get(schema.ATTR_HB_STACK) and not b.attributes.get(schema.ATTR_HB_FINAL)]
    # the beats taken while it slept (one taken as it woke may show the all_reduce it went on to)
    blocked = [b for b in stacked if "wait_here_on_purpose" in str(b.attributes[schema.ATTR_HB_STACK])]
    assert blocked, f"the blocked rank never reported a stack: {[b.attributes[schema.ATTR_HB_STACK] for b in stacked]}"
    stack = str(blocked[-1].attributes[schema.ATTR_HB_STACK])
    assert "blocking.py" in stack
    assert blocked[-1].attributes[schema.ATTR_HB_INFLIGHT_SEQS] == []
    assert float(blocked[-1].attributes[schema.ATTR_HB_IDLE_S]) > 0.5
    issued = blocked[-1].attributes[schema.ATTR_HB_GROUP_ISSUED]
    assert 3 in issued  # it stopped after issuing seq 3


def test_sigterm_gives_a_final_heartbeat_even_inside_a_collective(otlp_sink: tuple[SpanSink, int]) -> None:
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.25", MYCROFT_JOB_ID="sigterm")
    command = torchrun_command(JOB, 2, "--steps", "4", "--block-rank", "1", "--block-step", "1",
                               "--block-seconds", "120")
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: dict[int, int] = {}
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 90
        blocking = False
        while time.monotonic() < deadline and not (blocking and len(pids) == 2):
            line = process.stdout.readline()
            # ranks write unbuffered into one pipe: two reports can share a line
            for rank, pid in re.findall(r"PID (\d+) (\d+)", line):
                pids[int(rank)] = int(pid)
            blocking = blocking or "BLOCKING" in line
        assert len(pids) == 2 and blocking
        # rank 0 is now inside all_reduce (C++), rank 1 sleeps in Python
        assert sink.wait_for(lambda spans: any(2 in b.attributes[schema.ATTR_HB_INFLIGHT_SEQS]
                                               for b in _beats(spans, 0)), 20)
        import os

        os.kill(pids[0], signal.SIGTERM)
        os.kill(pids[1], signal.SIGTERM)
        assert sink.wait_for(lambda spans: {b.rank for b in spans if b.attributes.get(schema.ATTR_HB_FINAL)}
                             == {0, 1}, 20)
    finally:
        kill_tree(process)
    spans = sink.snapshot()
    final0 = next(b for b in _beats(spans, 0) if b.attributes.get(schema.ATTR_HB_FINAL))
    assert final0.attributes[schema.ATTR_HB_EXIT_REASON] == "SIGTERM"
    assert 2 in final0.attributes[schema.ATTR_HB_INFLIGHT_SEQS]
    in_flight = [s for s in spans if s.rank == 0 and s.attributes.get(schema.ATTR_STATE) == schema.STATE_IN_FLIGHT]
    assert [s.attributes[schema.ATTR_SEQ] for s in in_flight] == [2]
    final1 = next(b for b in _beats(spans, 1) if b.attributes.get(schema.ATTR_HB_FINAL))
    assert final1.attributes[schema.ATTR_HB_EXIT_REASON] == "SIGTERM"
    assert "wait_here_on_purpose" in str(final1.attributes.get(schema.ATTR_HB_STACK, ""))


def test_sigterm_during_the_exit_flush_waits_for_the_final_heartbeat(tmp_path: Path) -> None:
    """A peer dies, this rank exits, torchrun's SIGTERM lands mid-flush: the final record still goes out."""
    import subprocess
    import sys

    log = tmp_path / "exported.txt"
    script = tmp_path / "exit_flush.py"
    script.write_text(f"""
import os, signal, tempfile, time
import torch.distributed as dist
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from mycroft.instrumentation.instrumentor import MycroftInstrumentor

class SlowExporter(SpanExporter):
    def export(self, spans):
        for span in spans:
            if span.attributes.get("{schema.ATTR_HB_FINAL}"):
                os.kill(os.getpid(), signal.SIGTERM)  # lands while the exit flush waits on us
                time.sleep(0.3)
                with open({str(log)!r}, "a") as handle:
                    handle.write(span.attributes["{schema.ATTR_HB_EXIT_REASON}"] + "\\n")
        return SpanExportResult.SUCCESS

MycroftInstrumentor().instrument(span_exporter=SlowExporter())
dist.init_process_group("gloo", init_method=f"file://{{tempfile.mkdtemp()}}/s", rank=0, world_size=1)
# exit without destroy_process_group: the atexit hook sends the final heartbeat
""")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    assert log.read_text().split() == ["exit"], result.stderr[-2000:]
    assert result.returncode == -signal.SIGTERM  # and the signal still ends the process
