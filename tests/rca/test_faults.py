"""Fault injection on real instrumented gloo jobs against a live RCA service (short version).

Each test launches `opentelemetry-instrument torchrun` with the fault job, injects one fault
at a random step on a random rank, and checks the incident the service raises: the right
root cause, quickly, and nothing on a healthy run. benchmarks/fault_matrix.py runs the
full matrix with latency percentiles.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from mycroft.faults.inject import local_rca, run_one

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rca() -> Iterator[Any]:
    with local_rca() as service:
        yield service


def _chain_crosses_two_groups(incident: dict[str, Any]) -> bool:
    return str(incident["root_causes"][0]["evidence"].get("longest_wait_chain", "")).count("[group") == 2


@pytest.mark.parametrize("fault", ["block", "sigkill", "sigstop", "straggler", "mismatch", "deadlock", "chain"])
def test_fault_is_found_with_its_root_cause(rca: Any, fault: str, fault_rng: random.Random) -> None:
    # a chain spreads: the DP waiter's heartbeat may come a pass after the incident fired, and a
    # firing incident brings its evidence up to date (incidents.py, refresh_after_s): watch for it
    until = _chain_crosses_two_groups if fault == "chain" else None
    result = run_one(rca, fault, nproc=4, rng=fault_rng, timeout_s=20, until=until)
    assert result.correct, (result.note, result.incident)
    assert result.false_alarms == 0
    assert result.detection_s is not None and result.detection_s <= 5.0
    assert result.root_cause_s is not None and result.root_cause_s <= 5.0
    incident = result.incident
    assert incident is not None
    top = incident["root_causes"][0]
    assert top["evidence"]["text"]
    if fault == "chain":
        # the blockage spread from the faulty rank's TP pair into a DP pair: the chain crosses two groups
        longest = top["evidence"]["longest_wait_chain"]
        assert longest.count("[group") == 2, longest
    if fault == "block":
        assert "faultjob.py" in top["evidence"].get("stack", ""), top["evidence"]


def test_healthy_run_raises_nothing(rca: Any) -> None:
    result = run_one(rca, "none", nproc=4, healthy_steps=60)
    assert result.correct, result.note
    assert result.false_alarms == 0


def test_a_mismatch_that_completes_is_found_from_heartbeat_digests_when_op_spans_are_sampled_away(
        rca: Any, fault_rng: random.Random) -> None:
    """int32 where the others reduce float32: equal sizes, no error, wrong results. With no op
    span sent (MYCROFT_OP_SPAN_SAMPLE=0) only the heartbeats' signature digests can show it."""
    result = run_one(rca, "mismatch_silent", nproc=4, rng=fault_rng, timeout_s=20,
                     env={"MYCROFT_OP_SPAN_SAMPLE": "0"})
    assert result.correct, (result.note, result.incident)
    assert result.false_alarms == 0
    assert result.detection_s is not None and result.detection_s <= 5.0
    top = result.incident["root_causes"][0] if result.incident else {}
    assert top["evidence"]["compared_with"] == "digest" and "without an error" in top["evidence"]["text"]
