"""The telemetry diet on a real torchrun job: op spans head-sampled by trace id (whole collectives,
the same on every rank), slow ops always kept, heartbeats untouched."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from mycroft import schema
from tests.conftest import SpanSink, instrumented_env, run_torchrun

JOB = Path(__file__).parent / "jobs" / "blocking.py"


def test_sampled_op_spans_keep_whole_collectives_and_every_slow_op(otlp_sink: tuple[SpanSink, int]) -> None:
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.25", MYCROFT_JOB_ID="diet",
                           MYCROFT_OP_SPAN_SAMPLE="0.3", MYCROFT_KEEP_SLOW_OPS_S="0.8")
    # rank 2 sleeps 1.5 s before step 5's all_reduce (seq 6): ranks 0 and 1 wait in it that long
    result = run_torchrun(JOB, 3, env, "--steps", "24", "--block-rank", "2", "--block-step", "5",
                          "--block-seconds", "1.5")
    assert result.returncode == 0, result.stderr[-3000:]
    sink.wait_for(lambda spans: len([s for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)]) >= 3, 15)
    spans = sink.snapshot()
    ops = [s for s in spans if s.kind == schema.KIND_COLLECTIVE]
    by_trace: dict[int, set[int]] = defaultdict(set)
    seqs: dict[int, int] = {}
    for span in ops:
        by_trace[span.trace_id].add(span.rank or 0)
        seqs[span.trace_id] = int(span.attributes[schema.ATTR_SEQ])  # type: ignore[arg-type]
    beats = [s for s in spans if s.kind == schema.KIND_HEARTBEAT and s.rank == 0]
    issued = max((max(v) for b in beats if (v := b.attributes[schema.ATTR_HB_GROUP_ISSUED])),  # type: ignore[type-var]
                 default=0)
    assert issued >= 24
    assert 2 <= len(by_trace) < issued  # about 30% of the collectives, by their trace ids
    slow = [t for t, s in seqs.items() if s == 6]
    assert slow and {0, 1} <= by_trace[slow[0]]  # the waiters' slow op goes whatever its trace id says
    for trace, ranks in by_trace.items():
        expected = schema.keep_trace(trace, 0.3)
        if trace not in slow:
            assert expected and ranks == {0, 1, 2}, (seqs[trace], ranks)  # kept whole, on every rank
    assert all(len([b for b in spans if b.kind == schema.KIND_HEARTBEAT and b.rank == r]) >= 3 for r in range(3))
