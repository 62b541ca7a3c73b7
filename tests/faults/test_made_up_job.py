"""The made-up job's spans against a real rank's: the same attributes, key by key.

The service-level tests (test_service, test_security, test_resilience, test_bounds, ...) feed
the RCA spans of mycroft/faults/made_up_job.py. They are built by the instrumentation's own
encoders, but what the runtime adds around them (dropped, comm_s, ops_done, phase, digests,
the resource) is written there again; this test runs one real gloo rank in this process under
MycroftInstrumentor, as torchrun would start it, and fails on any attribute one sends and the
other does not.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mycroft import schema
from mycroft.faults.made_up_job import Group, InFlightOp, StepJob, collective, heartbeat, p2p
from mycroft.otlp import SpanRecord

# the OpenTelemetry SDK's own resource attributes (Resource.create): no part of the span contract,
# and nothing of Mycroft's reads them
SDK_OWNED = ("telemetry.sdk.", "service.instance.id")


@dataclasses.dataclass
class RealRank:
    ops: dict[str, Any]  # op name -> the rank's first span of that op (ReadableSpan)
    beats: list[Any]  # its training-phase heartbeats, in order; the last one final
    live: Any  # a heartbeat built while the rank ran, with a closed digest block


@pytest.fixture(scope="module")
def real_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealRank]:
    """One world-size-1 gloo rank in this process, with torchrun's environment, traced in code."""
    import torch
    import torch.distributed as dist
    from mycroft.instrumentation.instrumentor import STARTUP_OWNER_ENV, MycroftInstrumentor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    store = tmp_path_factory.mktemp("pin") / "store"
    env = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "1",
           "TORCHELASTIC_RUN_ID": "pin-job", "MYCROFT_HEARTBEAT_INTERVAL": "30"}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():
            patch.setenv(key, value)
        # start_reporting sets it; setenv (not delenv, which records nothing when the variable is absent)
        # makes the context remove it afterwards: left behind, every job a later test launched inherited
        # it, and its ranks took themselves for a DataLoader worker of this process (no start-up reports)
        patch.setenv(STARTUP_OWNER_ENV, "")
        exporter = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        instrumentor = MycroftInstrumentor()
        instrumentor.instrument(tracer_provider=provider)
        try:
            dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
            t = torch.ones(4)
            for _ in range(schema.DIGEST_BLOCK):  # a closed digest block: its attributes are in the next beat
                dist.all_reduce(t)
            dist.broadcast(t, 0)
            runtime = instrumentor.runtime
            assert runtime is not None
            deadline = time.monotonic() + 10
            while runtime.recorder.done_not_taken() and time.monotonic() < deadline:  # drained by the runtime thread
                time.sleep(0.01)
            time.sleep(0.1)
            live = runtime._heartbeat(time.time_ns())
        finally:
            instrumentor.uninstrument()  # the final heartbeat ("uninstrument")
            if dist.is_initialized():
                dist.destroy_process_group()
    spans = exporter.get_finished_spans()
    ops: dict[str, Any] = {}
    for span in spans:
        if span.attributes.get(schema.ATTR_SPAN_KIND) in (schema.KIND_COLLECTIVE, schema.KIND_P2P):
            ops.setdefault(span.name, span)
    beats = [s for s in spans if s.name == schema.SPAN_HEARTBEAT
             and s.attributes.get(schema.ATTR_HB_PHASE) == schema.PHASE_TRAINING]
    yield RealRank(ops, beats, live)


def _keys(attributes: Any) -> set[str]:
    return set(attributes.keys())


def _resource_keys(span: Any) -> set[str]:
    return {key for key in span.resource.attributes if not key.startswith(SDK_OWNED)}


def _same(made: set[str], real: set[str], what: str) -> None:
    assert made == real, f"{what}: only made up {sorted(made - real)}, only real {sorted(real - made)}"


def test_the_real_rank_sent_what_the_comparison_needs(real_rank: RealRank) -> None:
    assert {schema.OP_ALL_REDUCE, schema.OP_BROADCAST} <= real_rank.ops.keys()
    assert real_rank.beats and real_rank.beats[-1].attributes.get(schema.ATTR_HB_FINAL) is True
    assert schema.ATTR_HB_DIGEST_GROUP_IDS in real_rank.live.attributes  # the block of 16 closed


@pytest.mark.slow
@pytest.mark.parametrize("op", [schema.OP_ALL_REDUCE, schema.OP_BROADCAST])
def test_collective_spans_carry_the_real_attributes_and_resource(real_rank: RealRank, op: str) -> None:
    real = real_rank.ops[op]
    made = collective("job", 0, 1, Group("0", (0,)), 1, 10.0, 10.1, op=op)
    _same(_keys(made.attributes), _keys(real.attributes), f"{op} span attributes")
    _same(_keys(made.resource), _resource_keys(real), f"{op} span resource")
    assert made.status_code == real.status.status_code.value  # OK on a completed op
    for key in (schema.ATTR_OP, schema.ATTR_API, schema.ATTR_SOURCE, schema.ATTR_TIMING, schema.ATTR_DTYPE,
                schema.ATTR_STATE, schema.ATTR_BACKEND, schema.ATTR_ASYNC, schema.ATTR_ROOT):
        assert made.attributes.get(key) == real.attributes.get(key), key


def test_p2p_spans_carry_the_collective_fields_and_the_pair(real_rank: RealRank) -> None:
    """A world of one has no peer; a p2p span is a collective's attributes (same encoder) plus the pair."""
    real = real_rank.ops[schema.OP_ALL_REDUCE]
    made = p2p("job", 0, 2, Group("0", (0, 1)), schema.OP_SEND, 1, 1, 10.0, 10.1)
    pair = {schema.ATTR_PEER, schema.ATTR_P2P_SRC, schema.ATTR_P2P_DST}
    _same(_keys(made.attributes), _keys(real.attributes) | pair, "p2p span attributes")


@pytest.mark.slow
def test_heartbeats_carry_every_attribute_of_a_real_ranks(real_rank: RealRank) -> None:
    group = Group("0", (0,))
    # a live beat with a closed digest block, as StepJob's ranks send after 16 steps
    job = StepJob("job", 1)
    job.steps(schema.DIGEST_BLOCK)
    live = job.heartbeats(job.now + 0.05, not_entered=[0], stack="")[0]
    real_live = {k for k in _keys(real_rank.live.attributes) if k != schema.ATTR_HB_STACK}
    _same(_keys(live.attributes), real_live, "live heartbeat attributes")
    assert live.attributes[schema.ATTR_HB_PHASE] == real_rank.live.attributes[schema.ATTR_HB_PHASE]
    # the final beat: stack, final, exit reason
    final_real = real_rank.beats[-1]
    final = heartbeat("job", 0, 1, 20.0, 9, [group], [17], [17], stack="train.py:1 in main", final=True,
                      exit_reason="uninstrument")
    real_final = _keys(final_real.attributes) - {schema.ATTR_HB_DIGEST_GROUP_IDS, schema.ATTR_HB_DIGEST_BLOCKS,
                                                 schema.ATTR_HB_DIGEST_VALUES}  # repeats of the block above
    _same(_keys(final.attributes), real_final, "final heartbeat attributes")
    _same(_keys(final.resource), _resource_keys(final_real), "heartbeat resource")
    assert final.name == final_real.name and final.status_code == final_real.status.status_code.value


@pytest.mark.slow
def test_the_processors_made_up_spans_carry_the_real_attributes_too(real_rank: RealRank) -> None:
    """made_up_spans (the collector's tests and benchmarks): the same encoders, the same pin."""
    from mycroft.faults import made_up_spans as syn

    real = real_rank.ops[schema.OP_ALL_REDUCE]
    span = syn.collective_span(0, 1, 10, 1000)
    _same(_keys(span.attributes), _keys(real.attributes), "made_up_spans collective attributes")
    _same(_keys(span.resource), _resource_keys(real), "made_up_spans resource")
    beat = syn.heartbeat_span(0, 3, 10**18)
    real_live = _keys(real_rank.live.attributes) - {schema.ATTR_HB_STACK, schema.ATTR_HB_DIGEST_GROUP_IDS,
                                                    schema.ATTR_HB_DIGEST_BLOCKS, schema.ATTR_HB_DIGEST_VALUES}
    _same(_keys(beat.attributes), real_live, "made_up_spans heartbeat attributes")
    assert beat.attributes[schema.ATTR_HB_INFLIGHT_GROUP_IDS] == ["g1"]


def test_the_encoders_fill_what_made_up_heartbeats_lacked_by_hand() -> None:
    """The five attributes the hand encoding missed (issue 26), device-async ones on an NCCL group."""
    nccl = Group("tp", (0, 1), backend="nccl")
    beat = heartbeat("job", 0, 2, 5.0, 1, [nccl], [8], [6], [InFlightOp(nccl, 7, returned=True, dtype="bfloat16")],
                     comm_s=1.25, ops_done=6, fr_completed=[5])
    a = beat.attributes
    assert a[schema.ATTR_HB_COMM_S] == 1.25 and a[schema.ATTR_HB_OPS_DONE] == 6
    assert a[schema.ATTR_HB_INFLIGHT_DTYPES] == ["bfloat16"]
    assert a[schema.ATTR_HB_INFLIGHT_RETURNED] == [True]
    assert a[schema.ATTR_HB_GROUP_FR_COMPLETED] == [5]
    gloo = heartbeat("job", 0, 2, 5.0, 1, [Group("dp", (0, 1))], [3], [3])
    assert schema.ATTR_HB_INFLIGHT_RETURNED not in gloo.attributes  # host-synchronous: as a gloo rank sends


def test_step_job_counts_time_in_communication_as_a_recorder_does() -> None:
    job = StepJob("job", 2, step_s=0.1)
    job.steps(3, slow_rank=1, slow_extra_s=0.05)
    fast, slow = job.comm
    assert fast > slow > 0  # the straggler's peer waits for it
    beats: list[SpanRecord] = job.heartbeats(job.now + 0.5, blocked={0: 0.5})
    assert beats[0].attributes[schema.ATTR_HB_COMM_S] == pytest.approx(fast + 0.5, abs=1e-6)
    assert beats[0].attributes[schema.ATTR_HB_OPS_DONE] == 3
