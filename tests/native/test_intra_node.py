"""Intra-node hangs: one node without the network transport gives no ProxyOp / ProxyStep events,
so no flow counters. Emulated ranks (one driver process each) replay Coll + KernelCh only; the
RCA classifies what the heartbeats still carry: kernel channels running and collectives enqueued."""

from __future__ import annotations

from pathlib import Path

import pytest
from mycroft.instrumentation.native_reader import NativeReader
from mycroft.native.emulate import INTRA_GPU, INTRA_HOST, INTRA_TRANSPORT, emulated_job, finish_rank, intra_node_scripts
from mycroft.rca_service.analysis import flow_state, kernel_progress

from mycroft import schema

NRANKS, CHANNELS, STALLED = 4, 2, 2
COMM = f"{0x1A7A0001:016x}"
JOB = "job-intra"


def _heartbeats(ring_dir: Path, stall: str | None, version: str) -> dict[int, dict[str, object]]:
    scripts = intra_node_scripts(NRANKS, CHANNELS, stall, STALLED)
    heartbeats: dict[int, dict[str, object]] = {}
    with emulated_job(ring_dir, NRANKS, CHANNELS, 0, None, version=version, scripts=scripts) as ranks:
        readers = []
        for r in ranks:
            reader = NativeReader.open_for_pid(r.proc.pid, JOB, r.rank, ring_dir=ring_dir)
            assert reader is not None
            reader.drain()
            heartbeats[r.rank] = reader.heartbeat_attributes()
            readers.append(reader)
        for r in ranks:
            finish_rank(r)
        for reader in readers:
            reader.drain()
            reader.close()
    return heartbeats


def test_heartbeats_carry_running_kernel_channels_and_enqueued_collectives(built: Path, ring_dir: Path) -> None:
    hb = _heartbeats(ring_dir, INTRA_GPU, "v6")
    for rank, attrs in hb.items():
        assert schema.ATTR_HB_FLOW_COMMS not in attrs  # no proxy events at all
        assert attrs[schema.ATTR_HB_FLOW_NCOLL_COMMS] == [COMM] and attrs[schema.ATTR_HB_FLOW_NCOLL_SEQS] == [1]
        if rank == STALLED:
            assert attrs[schema.ATTR_HB_FLOW_NCOLL_KERNELS] == [0] and schema.ATTR_HB_FLOW_KCH_SEQS not in attrs
        else:
            assert attrs[schema.ATTR_HB_FLOW_NCOLL_KERNELS] == [CHANNELS]
            assert attrs[schema.ATTR_HB_FLOW_KCH_SEQS] == [1] * CHANNELS
            channels = attrs[schema.ATTR_HB_FLOW_KCH_CHANNELS]
            assert isinstance(channels, list) and sorted(channels) == list(range(CHANNELS))


def test_rank_whose_kernel_never_started_is_named(built: Path, ring_dir: Path) -> None:
    hb = _heartbeats(ring_dir, INTRA_GPU, "v6")
    findings = kernel_progress.classify_kernels(hb)
    top = findings[0]
    assert (top.rank, top.state, top.culprit, top.suspect_side) == (STALLED, schema.KERNEL_STATE_NOT_STARTED, True,
                                                                    kernel_progress.SIDE_GPU)
    assert [f.rank for f in findings if f.culprit] == [STALLED]
    assert {f.state for f in findings[1:]} == {schema.KERNEL_STATE_RUNNING}
    # through the flow classifier the verdict calls: the same suspect, side "kernel"
    summary = flow_state.summarize(flow_state.classify_flows(hb))
    assert (summary["rank"], summary["state"], summary["side"]) == (STALLED, schema.KERNEL_STATE_NOT_STARTED,
                                                                    kernel_progress.SIDE_GPU)
    assert "has not started on the GPU" in summary["text"]


def test_every_kernel_running_blames_the_transport_not_a_rank(built: Path, ring_dir: Path) -> None:
    hb = _heartbeats(ring_dir, INTRA_TRANSPORT, "v6")
    findings = kernel_progress.classify_kernels(hb)
    assert len(findings) == NRANKS and not [f for f in findings if f.culprit]
    assert {f.suspect_side for f in findings} == {kernel_progress.SIDE_TRANSPORT}
    assert kernel_progress.summarize(findings)["rank"] is None
    assert "rank" not in flow_state.summarize(flow_state.classify_flows(hb))  # no culprit for the verdict


@pytest.mark.parametrize("version", ["v6", "v7"])
def test_rank_that_never_enqueued_is_named_even_without_kernel_channels(built: Path, ring_dir: Path,
                                                                        version: str) -> None:
    """v7's default mask has no KernelCh (NCCL 2.31): only the enqueued collectives remain."""
    hb = _heartbeats(ring_dir, INTRA_HOST, version)
    if version == "v7":
        assert not any(schema.ATTR_HB_FLOW_KCH_SEQS in a for a in hb.values())
    findings = kernel_progress.classify_kernels(hb)
    culprits = [f for f in findings if f.culprit]
    assert [(f.rank, f.state, f.suspect_side) for f in culprits] == [
        (STALLED, schema.KERNEL_STATE_NOT_ENQUEUED, kernel_progress.SIDE_HOST)]


def test_no_evidence_no_finding() -> None:
    assert kernel_progress.classify_kernels({0: {}, 1: {schema.ATTR_HB_FLOW_KCH_COMMS: ["a"]}}) == []
    assert kernel_progress.summarize([]) == {}
