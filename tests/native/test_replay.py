"""Replay NCCL's call sequence for a ring all-reduce through each ABI version; check spans and counters."""

from __future__ import annotations

from pathlib import Path

import pytest
from mycroft.instrumentation.native_reader import NativeReader
from mycroft.native.emulate import FAULT_GPU, FAULT_NETWORK, FAULT_PROXY, Fault, emulated_job, finish_rank, stop_points
from mycroft.rca_service.analysis.flow_state import SIDE_SEND, SUSPECT_NETWORK, classify_flows, culprits

from mycroft import schema
from mycroft.otlp import SpanRecord

NRANKS, CHANNELS, STEPS, CHUNK = 4, 4, 8, 1 << 17
COMM = 0x5EED0001
JOB = "job-native"
FAULTS = {
    "sendgpuwait": Fault(FAULT_GPU, rank=1, channel=1, step=3),
    "sendwait": Fault(FAULT_NETWORK, rank=2, channel=2, step=5),
    "never_completes": Fault(FAULT_PROXY, rank=0, channel=3, step=0),
}


def _run(ring_dir: Path, fault: Fault, versions: tuple[str, ...]) -> tuple[
        dict[int, list[SpanRecord]], dict[int, dict[str, object]], dict[int, list[SpanRecord]]]:
    """Spans before the pause, heartbeat attributes at the stall, spans after finalize; per rank."""
    before: dict[int, list[SpanRecord]] = {}
    heartbeats: dict[int, dict[str, object]] = {}
    after: dict[int, list[SpanRecord]] = {}
    with emulated_job(ring_dir, NRANKS, CHANNELS, STEPS, fault, versions=versions) as ranks:
        readers = {}
        for r in ranks:
            reader = NativeReader.open_for_pid(r.proc.pid, JOB, r.rank, ring_dir=ring_dir)
            assert reader is not None
            readers[r.rank] = reader
            before[r.rank] = reader.drain()
            heartbeats[r.rank] = reader.heartbeat_attributes()
        for r in ranks:
            finish_rank(r)
        for rank, reader in readers.items():
            after[rank] = reader.drain()
            reader.close()
    assert list(ring_dir.glob("mycroft-nccl-*")) == []  # drained rings of exited processes are removed
    return before, heartbeats, after


@pytest.fixture(scope="module", params=[("v4",), ("v5",), ("v6",), ("v4", "v5", "v6")],
                ids=["v4", "v5", "v6", "mixed"])
def gpu_stall(request: pytest.FixtureRequest, built: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple:
    ring_dir = tmp_path_factory.mktemp("rings")
    return _run(ring_dir, FAULTS["sendgpuwait"], request.param)


def _by_name(spans: list[SpanRecord], name: str) -> list[SpanRecord]:
    return [s for s in spans if s.name == name]


def test_completed_collective_becomes_a_span_tree_in_the_collective_trace(gpu_stall: tuple) -> None:
    before, _, _ = gpu_stall
    trace = schema.collective_trace_id(JOB, f"nccl:{COMM:016x}", 0)
    for rank, spans in before.items():
        colls = _by_name(spans, schema.SPAN_NATIVE_COLL)
        assert len(colls) == 1, [s.attributes for s in colls]
        coll = colls[0]
        a = coll.attributes
        assert coll.trace_id == trace
        assert coll.parent_span_id == schema.rank_span_id(trace, rank)  # under the Python-level span
        assert a[schema.ATTR_SPAN_KIND] == schema.KIND_NATIVE_COLL
        assert a[schema.ATTR_OP] == schema.OP_ALL_REDUCE and a[schema.ATTR_NCCL_FUNC] == "AllReduce"
        assert (a[schema.ATTR_NCCL_ALGO], a[schema.ATTR_NCCL_PROTO]) == ("RING", "SIMPLE")
        assert a[schema.ATTR_NCCL_CHANNELS] == CHANNELS
        assert a[schema.ATTR_BYTES] == (1 << 22) * 4
        assert a[schema.ATTR_SEQ] == 0 and a[schema.ATTR_RANK] == rank
        assert a[schema.ATTR_STATE] == schema.STATE_COMPLETED and coll.end_ns >= coll.start_ns > 0
        flows = [s for s in _by_name(spans, schema.SPAN_NATIVE_FLOW) if s.trace_id == trace]
        assert len(flows) == 2 * CHANNELS
        assert {s.parent_span_id for s in flows} == {coll.span_id}
        assert len({s.span_id for s in flows}) == len(flows)
        peers = {(f.attributes[schema.ATTR_NCCL_CHANNEL], f.attributes[schema.ATTR_NCCL_IS_SEND],
                  f.attributes[schema.ATTR_PEER]) for f in flows}
        assert peers == {(ch, send, (rank + 1) % NRANKS if send else (rank - 1) % NRANKS)
                         for ch in range(CHANNELS) for send in (True, False)}
        for f in flows:
            fa = f.attributes
            assert (fa[schema.ATTR_FLOW_POSTED], fa[schema.ATTR_FLOW_GPU_READY], fa[schema.ATTR_FLOW_TRANSMITTED],
                    fa[schema.ATTR_FLOW_DONE]) == (STEPS, STEPS, STEPS, STEPS)
            assert fa[schema.ATTR_FLOW_STALL_STATE] == schema.FLOW_STATE_COMPLETE
            assert fa[schema.ATTR_BYTES] == STEPS * CHUNK and fa[schema.ATTR_NCCL_STEPS] == STEPS
            assert f.start_ns <= f.end_ns <= coll.end_ns
        kchs = [s for s in _by_name(spans, schema.SPAN_NATIVE_KERNEL_CHANNEL) if s.trace_id == trace]
        assert sorted(k.attributes[schema.ATTR_NCCL_CHANNEL] for k in kchs) == list(range(CHANNELS))
        for k in kchs:
            gpu_start = k.attributes[schema.ATTR_NCCL_GPU_START_NS]
            assert isinstance(gpu_start, int) and k.attributes[schema.ATTR_NCCL_GPU_STOP_NS] == gpu_start + 500
        assert all(s.resource == {} for s in spans)  # the caller fills the resource


def test_stalled_collective_is_not_reported_finished_but_its_finished_channels_are(gpu_stall: tuple) -> None:
    before, _, _ = gpu_stall
    stalled = schema.collective_trace_id(JOB, f"nccl:{COMM:016x}", 1)
    for spans in before.values():
        assert not [s for s in _by_name(spans, schema.SPAN_NATIVE_COLL) if s.trace_id == stalled]
        done = {s.attributes[schema.ATTR_NCCL_CHANNEL] for s in _by_name(spans, schema.SPAN_NATIVE_FLOW)
                if s.trace_id == stalled}
        assert done == {0, 2, 3}  # channel 1 holds the stall


def test_heartbeat_counters_match_the_replayed_progress(gpu_stall: tuple) -> None:
    _, heartbeats, _ = gpu_stall
    fault = FAULTS["sendgpuwait"]
    stops = stop_points(NRANKS, STEPS, fault)
    for rank, hb in heartbeats.items():
        send_done, recv_done = stops[rank]
        rows = list(zip(hb[schema.ATTR_HB_FLOW_CHANNELS], hb[schema.ATTR_HB_FLOW_SENDS],
                        hb[schema.ATTR_HB_FLOW_PEERS], hb[schema.ATTR_HB_FLOW_POSTED],
                        hb[schema.ATTR_HB_FLOW_GPU_READY], hb[schema.ATTR_HB_FLOW_TRANSMITTED],
                        hb[schema.ATTR_HB_FLOW_DONE], hb[schema.ATTR_HB_FLOW_SEQS],
                        hb[schema.ATTR_HB_FLOW_COMMS], strict=True))
        expected = []
        if send_done < STEPS:  # the proxy posted the next step and waits in SendGPUWait
            expected.append((1, True, (rank + 1) % NRANKS, send_done + 1, send_done, send_done, send_done, 1,
                             f"{COMM:016x}"))
        if recv_done < STEPS:  # receive posted, data not there
            expected.append((1, False, (rank - 1) % NRANKS, recv_done + 1, recv_done + 1, recv_done, recv_done, 1,
                             f"{COMM:016x}"))
        assert sorted(rows) == sorted(expected), rank
        assert all(0 <= age < 30 for age in hb[schema.ATTR_HB_FLOW_AGES_S])
        assert set(hb[schema.ATTR_HB_FLOW_RANKS]) == {rank}


def test_finalize_with_open_events_closes_them_as_in_flight(gpu_stall: tuple) -> None:
    _, heartbeats, after = gpu_stall
    stalled = schema.collective_trace_id(JOB, f"nccl:{COMM:016x}", 1)
    for rank, spans in after.items():
        colls = _by_name(spans, schema.SPAN_NATIVE_COLL)
        assert [c.trace_id for c in colls] == [stalled]
        assert colls[0].attributes[schema.ATTR_STATE] == schema.STATE_IN_FLIGHT and colls[0].status_code == 2
        flows = _by_name(spans, schema.SPAN_NATIVE_FLOW)
        assert len(flows) == len(heartbeats[rank][schema.ATTR_HB_FLOW_CHANNELS])
        assert all(f.attributes[schema.ATTR_STATE] == schema.STATE_IN_FLIGHT for f in flows)
        assert all(f.attributes[schema.ATTR_FLOW_STALL_STATE] != schema.FLOW_STATE_COMPLETE for f in flows)


@pytest.mark.parametrize("name", list(FAULTS))
def test_rca_names_the_stalled_flow_side_and_peer(name: str, built: Path, ring_dir: Path) -> None:
    fault = FAULTS[name]
    _, heartbeats, _ = _run(ring_dir, fault, ("v6",))
    findings = classify_flows(heartbeats)
    guilty = culprits(findings)
    assert len(guilty) == 1, [g.evidence for g in guilty]
    top = guilty[0]
    assert findings[0] is top
    assert (top.rank, top.channel, top.side, top.peer) == (fault.rank, fault.channel, SIDE_SEND,
                                                           (fault.rank + 1) % NRANKS)
    expected_state = {FAULT_GPU: schema.FLOW_STATE_GPU_NOT_READY, FAULT_NETWORK: schema.FLOW_STATE_NOT_DELIVERED,
                      FAULT_PROXY: schema.FLOW_STATE_NOT_STARTED}[fault.kind]
    assert top.state == expected_state
    if fault.kind == FAULT_NETWORK:
        assert (top.suspect_rank, top.suspect_side) == ((fault.rank + 1) % NRANKS, SUSPECT_NETWORK)
        assert f"link {fault.rank}->{(fault.rank + 1) % NRANKS}" in top.evidence
    else:
        assert (top.suspect_rank, top.suspect_side) == (fault.rank, SIDE_SEND)
    assert top.proxy_state == {FAULT_GPU: "SendGPUWait", FAULT_NETWORK: "SendWait", FAULT_PROXY: ""}[fault.kind]
    # every other stalled flow is explained by it: the victims point back along the ring
    assert all(f.victim for f in findings[1:])
    assert all(f.suspect_rank == f.peer for f in findings if f.side != SIDE_SEND)  # receivers wait on senders


def test_map_comm_joins_the_python_level_trace(built: Path, ring_dir: Path) -> None:
    gid = schema.group_id("0", range(NRANKS))
    with emulated_job(ring_dir, NRANKS, 2, 4, None) as ranks:
        readers = []
        for r in ranks:
            reader = NativeReader.open_for_pid(r.proc.pid, JOB, 10 + r.rank, ring_dir=ring_dir)
            assert reader is not None
            reader.map_comm(COMM, gid, ranks=[10, 11, 12, 13], seq_offset=5)
            readers.append(reader)
        for r, reader in zip(ranks, readers, strict=True):
            spans = reader.drain()
            coll = [s for s in spans if s.name == schema.SPAN_NATIVE_COLL and s.attributes[schema.ATTR_SEQ] == 5]
            assert len(coll) == 1
            trace = schema.collective_trace_id(JOB, gid, 5)
            assert coll[0].trace_id == trace
            assert coll[0].parent_span_id == schema.rank_span_id(trace, 10 + r.rank)
            peers = {s.attributes[schema.ATTR_PEER] for s in spans if s.name == schema.SPAN_NATIVE_FLOW}
            assert peers == {10 + (r.rank + 1) % NRANKS, 10 + (r.rank - 1) % NRANKS}
            reader.close()


def test_open_for_pid_without_a_ring_is_none(ring_dir: Path) -> None:
    assert NativeReader.open_for_pid(999_999_999, JOB, 0, ring_dir=ring_dir) is None
    (ring_dir / "mycroft-nccl-12345").write_bytes(b"not a ring")
    assert NativeReader.open_for_pid(12345, JOB, 0, ring_dir=ring_dir) is None
