"""The paper's flow state table and the culprit/victim join, on hand-written heartbeats."""

from __future__ import annotations

from typing import Any

import pytest
from mycroft.rca_service.analysis.flow_state import SIDE_RECV, SIDE_SEND, classify_flows, culprits, summarize

from mycroft import schema
from mycroft.schema import flow_state

IN_PROCESS = True  # pure functions on hand-written heartbeats (tests/native/conftest.py marks the rest slow)


@pytest.mark.parametrize(("g", "t", "d", "steps", "state"), [
    (0, 0, 0, 8, schema.FLOW_STATE_NOT_STARTED),
    (3, 2, 2, 8, schema.FLOW_STATE_NOT_TRANSMITTED),
    (3, 3, 2, 8, schema.FLOW_STATE_NOT_DELIVERED),
    (3, 3, 3, 8, schema.FLOW_STATE_GPU_NOT_READY),
    (8, 8, 8, 8, schema.FLOW_STATE_COMPLETE),
])
def test_state_table(g: int, t: int, d: int, steps: int, state: str) -> None:
    assert flow_state(g, t, d, steps) == state


def _hb(*flows: dict[str, Any]) -> dict[str, Any]:
    keys = {"comm": schema.ATTR_HB_FLOW_COMMS, "seq": schema.ATTR_HB_FLOW_SEQS, "ch": schema.ATTR_HB_FLOW_CHANNELS,
            "peer": schema.ATTR_HB_FLOW_PEERS, "send": schema.ATTR_HB_FLOW_SENDS, "steps": schema.ATTR_HB_FLOW_STEPS,
            "posted": schema.ATTR_HB_FLOW_POSTED, "g": schema.ATTR_HB_FLOW_GPU_READY,
            "t": schema.ATTR_HB_FLOW_TRANSMITTED, "d": schema.ATTR_HB_FLOW_DONE, "age": schema.ATTR_HB_FLOW_AGES_S}
    base = {"comm": "00000000000000aa", "seq": 7, "ch": 0, "steps": 8, "age": 5.0}
    return {attr: [{**base, **f}[k] for f in flows] for k, attr in keys.items()}


def test_sender_with_data_but_no_receive_buffer_blames_the_receiver() -> None:
    hbs = {
        0: _hb({"peer": 1, "send": True, "posted": 3, "g": 3, "t": 2, "d": 2}),
        1: _hb({"peer": 0, "send": False, "posted": 2, "g": 2, "t": 2, "d": 2}),
    }
    top = culprits(classify_flows(hbs))
    assert [(f.rank, f.side, f.state, f.suspect_rank, f.suspect_side) for f in top] == [
        (0, SIDE_SEND, schema.FLOW_STATE_NOT_TRANSMITTED, 1, SIDE_RECV),
        (1, SIDE_RECV, schema.FLOW_STATE_GPU_NOT_READY, 1, SIDE_RECV),
    ]
    assert summarize(classify_flows(hbs))["rank"] == 1


def test_sender_with_data_and_a_ready_receiver_blames_the_sender_nic() -> None:
    hbs = {
        0: _hb({"peer": 1, "send": True, "posted": 3, "g": 3, "t": 2, "d": 2}),
        1: _hb({"peer": 0, "send": False, "posted": 4, "g": 4, "t": 2, "d": 2}),
    }
    findings = classify_flows(hbs)
    assert (findings[0].rank, findings[0].suspect_rank, findings[0].suspect_side) == (0, 0, SIDE_SEND)
    assert findings[1].victim and findings[1].suspect_rank == 0  # the receiver just waits for it


def test_young_flows_are_left_out_and_missing_arrays_are_tolerated() -> None:
    hbs = {0: _hb({"peer": 1, "send": True, "posted": 1, "g": 0, "t": 0, "d": 0, "age": 0.05}), 1: {}}
    assert classify_flows(hbs, min_age_s=1.0) == []
    assert len(classify_flows(hbs)) == 1
    assert summarize([]) == {}


def test_two_dead_links_through_one_rank_name_that_rank_not_a_neighbour() -> None:
    # ring 3 -> 5 -> 7 -> 3, rank 5's NIC down: 3->5 and 5->7 posted and never delivered
    hbs = {
        3: _hb({"peer": 5, "send": True, "posted": 6, "g": 6, "t": 6, "d": 4},
               {"peer": 7, "send": False, "posted": 7, "g": 7, "t": 5, "d": 5}),
        5: _hb({"peer": 7, "send": True, "posted": 3, "g": 3, "t": 3, "d": 1},
               {"peer": 3, "send": False, "posted": 6, "g": 6, "t": 4, "d": 4}),
        7: _hb({"peer": 3, "send": True, "posted": 2, "g": 2, "t": 2, "d": 2},
               {"peer": 5, "send": False, "posted": 3, "g": 3, "t": 1, "d": 1}),
    }
    findings = classify_flows(hbs)
    assert {(f.rank, f.suspect_rank) for f in culprits(findings)} >= {(3, 5), (5, 7)}
    summary = summarize(findings)
    assert summary["rank"] == 5 and summary["side"] == "network" and "3->5" in summary["text"]
    # one dead link alone still names its receiver side (network or receiver)
    single = {3: hbs[3], 5: _hb({"peer": 3, "send": False, "posted": 6, "g": 6, "t": 4, "d": 4})}
    assert summarize(classify_flows(single))["rank"] == 5
    assert summarize(classify_flows({5: hbs[5], 7: hbs[7]}))["rank"] == 7


def test_a_2048_rank_ring_is_classified_in_linear_time() -> None:
    """The feeder join is an index: 8k flows took ~28 s with a scan per send flow."""
    import time

    from mycroft.faults.bigjob import BigJob, Layout
    from mycroft.faults.simfaults import plan

    p = plan("nic_down", 16384, 8, seed=2, rank=9001)
    job = BigJob("j", Layout(16384, tp=8), ops_per_s=10, fault=p, fault_at=1000.0)
    job.tick(999.0)
    job.tick(1001.0)
    attrs = {r: job.record(r, 1003.0).attributes for r in job.layout.dp_ranks(9001)}
    started = time.process_time()
    findings = classify_flows(attrs)
    assert time.process_time() - started < 2.0
    assert len(findings) == 4 * 2048 and summarize(findings)["rank"] == 9001
