"""The stack a heartbeat carries: the innermost frames, and the packages the stack went through
above them (what tells a lazy import's deep template compilation from a hang in user code)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from mycroft.instrumentation.stacks import main_thread_stack, summarize
from mycroft.rca_service.analysis.pauses import match_phase
from mycroft.rca_service.config import AnalysisConfig

from mycroft import schema
from tests.conftest import SpanSink, instrumented_env, run_torchrun

SITE = "/venv/lib/python3.11/site-packages"


def _deep_import_stack() -> list[tuple[str, int, str]]:
    """A DeepSpeed step that lazily imports inductor, whose module compiles jinja2 templates."""
    return [("train.py", 95, "<module>"), ("train.py", 79, "main"),
            (f"{SITE}/deepspeed/runtime/engine.py", 2100, "step"),
            (f"{SITE}/deepspeed/runtime/engine.py", 2040, "_take_model_step"),
            ("<frozen importlib._bootstrap>", 1176, "_find_and_load"),
            ("<frozen importlib._bootstrap_external>", 940, "exec_module"),
            ("<frozen importlib._bootstrap>", 241, "_call_with_frames_removed"),
            (f"{SITE}/torch/_inductor/codegen/cpp.py", 43, "<module>"),
            (f"{SITE}/jinja2/environment.py", 1100, "from_string"),
            *[(f"{SITE}/jinja2/visitor.py", 42 + i % 5, "visit") for i in range(30)]]


def test_the_packages_above_the_innermost_frames_are_kept_nearest_first() -> None:
    frames = _deep_import_stack()
    kept = summarize(frames, depth=8, context=16)
    assert kept[-8:] == frames[-8:]
    assert [f[0].rsplit("/", 1)[-1] for f in kept[:-8]] == [
        "train.py", "engine.py", "<frozen importlib._bootstrap>", "cpp.py", "environment.py"]
    assert summarize(frames, depth=8, context=2)[:2] == [frames[7], frames[8]]  # the nearest entries
    assert summarize(frames[:5], depth=8, context=16) == frames[:5]


def test_a_lazy_import_deep_in_a_template_compile_reads_as_a_pause_not_a_hang() -> None:
    """A healthy DeepSpeed start-up paged critical: three ranks compiled inductor's templates inside
    its lazy import on the first step; the innermost 8 frames showed only jinja2."""
    phases = AnalysisConfig().phases
    render = "\n".join(f"{f}:{n} in {name}" for f, n, name in summarize(_deep_import_stack(), 8, 16))
    assert match_phase(render, phases) is not None
    innermost_only = "\n".join(f"{f}:{n} in {name}" for f, n, name in _deep_import_stack()[-8:])
    assert match_phase(innermost_only, phases) is None


def test_the_main_thread_stack_is_read_from_the_frames() -> None:
    """From another thread (the heartbeat's), without reading source files."""
    ready, release, got = threading.Event(), threading.Event(), []

    def sample() -> None:
        ready.wait(5)
        got.append(main_thread_stack(4, 16))
        release.set()

    def recurse(n: int) -> None:
        if n == 0:
            ready.set()
            release.wait(5)
            return
        recurse(n - 1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    recurse(40)
    sampler.join(5)
    lines = got[0].splitlines()
    assert lines[-1].endswith(" in wait") and len(lines) <= 4 + 16
    assert sum(" in recurse" in line for line in lines) >= 1
    assert any(line.endswith(" in test_the_main_thread_stack_is_read_from_the_frames") for line in lines)


@pytest.mark.slow
def test_the_stack_is_the_issuing_threads_and_the_other_threads_come_beside_it(
        otlp_sink: tuple[SpanSink, int]) -> None:
    """Ray Train runs the training in a worker thread: the stuck rank's stack is the worker's (where it is
    stuck), not the main thread's framework loop; the main thread's stack comes beside it."""
    sink, port = otlp_sink
    env = instrumented_env(port, MYCROFT_HEARTBEAT_INTERVAL="0.25", MYCROFT_STACK_AFTER="0.5",
                           MYCROFT_JOB_ID="worker-thread-stacks")
    result = run_torchrun(Path(__file__).parent / "jobs" / "worker_thread.py", 2, env, "--stuck-seconds", "3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sink.wait_for(lambda spans: len({s.rank for s in spans if s.attributes.get(schema.ATTR_HB_FINAL)}) == 2,
                         15)
    beats = [s for s in sink.snapshot() if s.rank == 1 and s.kind == schema.KIND_HEARTBEAT
             and "stuck_in_the_worker_thread" in str(s.attributes.get(schema.ATTR_HB_STACK, ""))]
    assert beats, "no heartbeat of the stuck rank shows the worker thread's stack"
    others = str(beats[-1].attributes.get(schema.ATTR_HB_THREAD_STACKS, ""))
    assert "--- thread MainThread" in others and "framework_main_loop" in others, others
    assert "--- thread mycroft" not in others  # Mycroft's own threads are left out
