"""Every op family, on a real 4-rank gloo job under opentelemetry-instrument torchrun."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from mycroft.instrumentation.ops import C10D_SPECS
from mycroft.instrumentation.patching import DDP_API

from mycroft import schema
from tests.conftest import SpanSink, instrumented_env, run_torchrun

JOB = Path(__file__).parent / "jobs" / "all_ops.py"
WORLD = 4
from mycroft.instrumentation.patching import FUNCOL_PREFIX as FUNCOL  # noqa: E402

pytestmark = pytest.mark.slow  # one real 4-rank torchrun job


@pytest.fixture(scope="module")
def traced_job(request: pytest.FixtureRequest) -> tuple[list, str]:
    from mycroft.otlp_server import OtlpReceiver

    sink = SpanSink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", None).start()
    try:
        # MYCROFT_DDP_HOOK=1: every issuer with a span of its own (DDP's buckets are the Flight Recorder's by default)
        env = instrumented_env(receiver.grpc_port, MYCROFT_HEARTBEAT_INTERVAL="0.5", MYCROFT_JOB_ID="all-ops",
                               MYCROFT_DDP_HOOK="1")
        result = run_torchrun(JOB, WORLD, env)
        assert result.returncode == 0, result.stderr[-4000:]
        sink.wait_for(lambda spans: sum(1 for s in spans if s.kind == schema.KIND_HEARTBEAT
                                        and s.attributes.get(schema.ATTR_HB_FINAL)) >= WORLD, timeout=15)
        return sink.snapshot(), result.stdout
    finally:
        receiver.stop(0)


def _ops(spans: list) -> list:
    return [s for s in spans if s.kind in (schema.KIND_COLLECTIVE, schema.KIND_P2P)]


def _groups_of(stdout: str, label: str) -> set[str]:
    """Names of the group(s) the ranks reported for one step (a mesh dim has one group per slice)."""
    names = set(re.findall(rf"DID {label} group=\[([^\]]+)\]", stdout))
    assert names, f"job did not report {label}"
    return names


def test_every_public_api_is_traced_on_every_rank(traced_job: tuple[list, str]) -> None:
    spans, _ = traced_job
    ranks_by_api: dict[str, set[int]] = defaultdict(set)
    for span in _ops(spans):
        ranks_by_api[span.attributes[schema.ATTR_API]].add(span.rank)
    wanted = {f"torch.distributed.{spec.api}" for spec in C10D_SPECS if spec.api != "monitored_barrier"}
    wanted.update(("torch.distributed.batch_isend_irecv", "torch.distributed._coalescing_manager",
                   "torch.distributed._broadcast_coalesced"))
    missing = {api for api in wanted if ranks_by_api.get(api) != set(range(WORLD))}
    assert not missing, {api: sorted(ranks_by_api.get(api, ())) for api in missing}


def test_one_span_per_member_and_one_trace_per_collective(traced_job: tuple[list, str]) -> None:
    spans, _ = traced_job
    by_trace: dict[int, list] = defaultdict(list)
    for span in _ops(spans):
        by_trace[span.trace_id].append(span)
    assert len(by_trace) > 40
    for members in by_trace.values():
        first = members[0]
        if first.kind == schema.KIND_P2P:
            assert sorted(s.rank for s in members) == sorted(
                {first.attributes[schema.ATTR_P2P_SRC], first.attributes[schema.ATTR_P2P_DST]})
            assert {s.attributes[schema.ATTR_OP] for s in members} == {schema.OP_SEND, schema.OP_RECV}
            continue
        expected = schema.decode_ranks(str(first.attributes[schema.ATTR_GROUP_RANKS]))
        assert sorted(s.rank for s in members) == expected, first.attributes
        assert len({s.attributes[schema.ATTR_OP] for s in members}) == 1
        assert len({s.attributes[schema.ATTR_SEQ] for s in members}) == 1
        gid = first.attributes[schema.ATTR_GROUP_ID]
        assert first.trace_id == schema.collective_trace_id("all-ops", str(gid), int(first.attributes[schema.ATTR_SEQ]))


def test_contract_attributes(traced_job: tuple[list, str]) -> None:
    spans, _ = traced_job
    required = {schema.ATTR_SPAN_KIND, schema.ATTR_OP, schema.ATTR_GROUP_ID, schema.ATTR_GROUP_NAME,
                schema.ATTR_GROUP_SIZE, schema.ATTR_GROUP_RANKS, schema.ATTR_GROUP_RANK, schema.ATTR_SEQ,
                schema.ATTR_BYTES, schema.ATTR_BACKEND, schema.ATTR_STATE}
    ops = _ops(spans)
    assert len(ops) > 40
    for span in ops:
        assert required <= span.attributes.keys(), span.attributes
        assert span.attributes[schema.ATTR_STATE] == schema.STATE_COMPLETED, span.attributes
        assert span.end_ns >= span.start_ns > 0
        assert span.resource[schema.RES_JOB_ID] == "all-ops"
        assert span.resource[schema.RES_WORLD_SIZE] == WORLD
        assert span.resource[schema.RES_RANK] == span.attributes[schema.ATTR_RANK]
        if span.kind == schema.KIND_P2P:
            assert span.attributes[schema.ATTR_PEER] in range(WORLD)
    all_reduce = next(s for s in _ops(spans) if s.attributes[schema.ATTR_API] == "torch.distributed.all_reduce")
    assert all_reduce.attributes[schema.ATTR_BYTES] == 8 * 4
    assert all_reduce.attributes[schema.ATTR_DTYPE] == "float32"
    broadcast = next(s for s in _ops(spans) if s.attributes[schema.ATTR_OP] == schema.OP_BROADCAST
                     and s.attributes[schema.ATTR_API] == "torch.distributed.broadcast")
    assert broadcast.attributes[schema.ATTR_ROOT] == 0


def test_async_ops_are_traced_with_their_completion(traced_job: tuple[list, str]) -> None:
    spans, _ = traced_job
    async_apis = {s.attributes[schema.ATTR_API] for s in _ops(spans) if s.attributes[schema.ATTR_ASYNC]}
    for api in ("all_reduce", "all_gather_single", "barrier", "isend", "irecv"):
        assert f"torch.distributed.{api}" in async_apis


def test_subgroups_and_device_mesh_groups(traced_job: tuple[list, str]) -> None:
    spans, stdout = traced_job
    sizes = {s.attributes[schema.ATTR_GROUP_SIZE] for s in _ops(spans)}
    assert {2, 4} <= sizes
    tp = _groups_of(stdout, "mesh_tp_all_reduce")
    assert len(tp) == 2, re.findall(r".*DID mesh_tp_all_reduce.*", stdout)
    tp_spans = [s for s in _ops(spans) if s.attributes[schema.ATTR_GROUP_NAME] in tp]
    assert {s.rank for s in tp_spans} == set(range(WORLD))
    assert all(s.attributes[schema.ATTR_GROUP_SIZE] == 2 for s in tp_spans)


def test_ddp_fsdp_and_functional_collectives_are_present(traced_job: tuple[list, str]) -> None:
    spans, stdout = traced_job
    ops = _ops(spans)
    (ddp_group,) = _groups_of(stdout, "ddp_backward")
    ddp = [s for s in ops if s.attributes[schema.ATTR_API] == DDP_API]
    assert {s.rank for s in ddp} == set(range(WORLD))
    assert all(s.attributes[schema.ATTR_GROUP_NAME] == ddp_group for s in ddp)
    assert ddp[0].attributes[schema.ATTR_BYTES] == (16 * 16 + 16) * 4  # one bucket: weight + bias

    (fsdp_group,) = _groups_of(stdout, "fsdp_step")
    fsdp_ops = {(s.attributes[schema.ATTR_OP], s.rank) for s in ops
                if s.attributes[schema.ATTR_GROUP_NAME] == fsdp_group}
    for rank in range(WORLD):
        assert (schema.OP_ALL_GATHER, rank) in fsdp_ops
        assert (schema.OP_REDUCE_SCATTER, rank) in fsdp_ops

    funcol = [s for s in ops if str(s.attributes[schema.ATTR_API]).startswith(FUNCOL)]
    assert {s.rank for s in funcol if s.attributes[schema.ATTR_OP] == schema.OP_ALL_REDUCE} == set(range(WORLD))
    tp = _groups_of(stdout, "mesh_tp_all_reduce")
    dtensor = [s for s in funcol if s.attributes[schema.ATTR_OP] == schema.OP_ALL_GATHER]
    assert {s.rank for s in dtensor} == set(range(WORLD))
    assert {s.attributes[schema.ATTR_GROUP_NAME] for s in dtensor} == tp, re.findall(r".*DID mesh_tp.*", stdout)


def test_heartbeats_report_frontier_and_end_with_a_final_record(traced_job: tuple[list, str]) -> None:
    spans, _ = traced_job
    beats = [s for s in spans if s.kind == schema.KIND_HEARTBEAT]
    assert {s.rank for s in beats} == set(range(WORLD))
    finals = [s for s in beats if s.attributes.get(schema.ATTR_HB_FINAL)]
    assert {s.rank for s in finals} == set(range(WORLD))
    for beat in beats:
        ids = beat.attributes[schema.ATTR_HB_GROUP_IDS]
        assert len(ids) == len(beat.attributes[schema.ATTR_HB_GROUP_ISSUED]) == len(
            beat.attributes[schema.ATTR_HB_GROUP_COMPLETED])
    last = max((s for s in finals if s.rank == 0), key=lambda s: s.end_ns)
    assert max(last.attributes[schema.ATTR_HB_GROUP_COMPLETED]) > 10


def test_each_group_counts_the_same_on_every_member(traced_job: tuple[list, str]) -> None:
    """At the end every member of a group has completed the same collectives in it. pg_status names
    groups by each rank's own pg ids, which differ from torch's group names on a rank that is no
    member of some new_group (mesh slices): read as names, a group took another's frontier as its own."""
    spans, _ = traced_job
    finals = [s for s in spans if s.kind == schema.KIND_HEARTBEAT and s.attributes.get(schema.ATTR_HB_FINAL)]
    by_group: dict[str, dict[int, int]] = defaultdict(dict)
    for beat in finals:
        attrs = beat.attributes
        for gid, completed in zip(attrs[schema.ATTR_HB_GROUP_IDS], attrs[schema.ATTR_HB_GROUP_COMPLETED], strict=True):
            by_group[gid][beat.rank] = completed
    shared = {gid: counts for gid, counts in by_group.items() if len(counts) > 1}
    assert len(shared) >= 4, by_group
    assert {gid: counts for gid, counts in shared.items() if len(set(counts.values())) > 1} == {}
