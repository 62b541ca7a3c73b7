"""Only Exceptions are Mycroft's to handle: KeyboardInterrupt, SystemExit and GeneratorExit pass through.

Real gloo processes (jobs/interrupts.py), started as a launcher starts them, plain and under
`opentelemetry-instrument` with a real collector, through the Python wrappers (MYCROFT_HOT_PATH=0)
and the compiled hot path: a Ctrl-C (SIGINT) while a rank waits inside a collective or inside
Work.wait(), a tensor subclass raising KeyboardInterrupt or SystemExit from the argument checks (one
SystemExit whose str() fails, which noting the op's failure turned into a RuntimeError: exit 1 for 7),
a KeyboardInterrupt in a coalescing block, a generator closed inside one. Each must end the same way
as without Mycroft (the same exception, not chained onto another, the same exit status, the same
lines printed) and no later: the exception reaches the top within 0.5 s of plain's delay.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from mycroft import schema
from tests.conftest import BIN, REPO, SpanSink, free_port

JOB = Path(__file__).parent / "jobs" / "interrupts.py"
TWO_RANKS = ("sigint", "sigint_wait")
CASES = ("sigint", "sigint_wait", "subclass_ki", "subclass_exit", "odd_exit", "coalesced_ki", "generator_close")
BOUND_S = 0.5


@dataclass
class Outcome:
    returncode: int
    lines: list[str]  # what rank 0 printed, times taken out
    delay_s: float | None  # sigint cases: the peer's collective done -> the exception at rank 0's top
    stderr: str


def _run(case: str, mode: str, port: int) -> Outcome:
    world = 2 if case in TWO_RANKS else 1
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
               LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
               OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none", OTEL_TRACES_EXPORTER="otlp",
               OTEL_EXPORTER_OTLP_PROTOCOL="grpc", OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
               MYCROFT_HOT_PATH="0" if mode == "python" else "1")
    prefix = [] if mode == "plain" else [str(BIN / "opentelemetry-instrument")]
    processes = [subprocess.Popen([*prefix, sys.executable, str(JOB), "--case", case],
                                  env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=str(REPO))
                 for rank in range(world)]
    outputs = [process.communicate(timeout=120) for process in processes]
    for rank, process in enumerate(processes[1:], start=1):
        assert process.returncode == 0, (case, mode, rank, outputs[rank][1][-3000:])
    out, err = outputs[0]
    lines = []
    for line in out.splitlines():
        words = line.split()
        if line.startswith("DONE"):
            line = "DONE"  # without its time
        elif line.startswith("UNCAUGHT"):
            line = f"UNCAUGHT {words[1]} context={words[3]}"
        lines.append(line)
    delay = None
    if world == 2:
        peer_done = next(float(row.split()[2]) for row in outputs[1][0].splitlines() if row.startswith("DONE"))
        caught = [float(row.split()[2]) for row in out.splitlines() if row.startswith("UNCAUGHT")]
        delay = caught[0] - peer_done if caught else None
    return Outcome(processes[0].returncode, lines, delay, err)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_interrupts_and_exits_pass_through_as_without_mycroft(case: str, otlp_sink: tuple[SpanSink, int]) -> None:
    _, port = otlp_sink
    plain = _run(case, "plain", port)
    # the reference, checked: what Python does without Mycroft
    # -2: Python re-raises the SIGINT of an uncaught KeyboardInterrupt to die of it
    expected_code = {"subclass_exit": 7, "odd_exit": 7, "generator_close": 0}.get(case, -2)
    assert plain.returncode == expected_code, (case, plain.returncode, plain.stderr[-3000:])
    for mode in ("python", "hot"):
        traced = _run(case, mode, port)
        assert (traced.returncode, traced.lines) == (plain.returncode, plain.lines), \
            (case, mode, plain.lines, traced.lines, traced.stderr[-3000:])
        if plain.delay_s is not None:
            assert traced.delay_s is not None and traced.delay_s - plain.delay_s <= BOUND_S, \
                (case, mode, plain.delay_s, traced.delay_s)


class _OddExit(SystemExit):
    def __str__(self) -> str:
        raise RuntimeError("no str")


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), SystemExit(3), GeneratorExit(), _OddExit(7)],
                         ids=["KeyboardInterrupt", "SystemExit", "GeneratorExit", "odd SystemExit"])
def test_noting_a_failure_ends_the_record_and_never_raises(exc: BaseException) -> None:
    from mycroft.instrumentation.groups import GroupInfo
    from mycroft.instrumentation.patching import note_failure
    from mycroft.instrumentation.recorder import OpRecord, Recorder

    recorder = Recorder(64)
    group = GroupInfo(gid="g", name="g", desc="", ranks=(0, 1), ranks_text="0,1", group_rank=0, backend="gloo",
                      pg=None, device_async=False)
    record = OpRecord("torch.distributed.all_reduce", schema.OP_ALL_REDUCE, group, 1, 1)
    recorder.inflight[record] = record
    note_failure(recorder, record, exc)  # nothing raised here: the wrapper re-raises exc itself
    assert record.state == schema.STATE_ERROR and record.end_ns and not recorder.inflight
    assert record.error.startswith(type(exc).__name__)
    assert recorder.errors == (1 if isinstance(exc, _OddExit) else 0)
