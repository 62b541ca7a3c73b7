"""The 3D-parallel fault job against a live RCA service (short version of benchmarks/fault_matrix.py).

Each test launches `opentelemetry-instrument torchrun` with mycroft/faults/job3d.py (TP x PP x DP,
1F1B pipeline p2p, TP and DP all_reduces), injects one fault on a random rank (random op
position; process faults also at a random time in the first second, or right after the
first collective) and checks the RCA's first loud verdict and the webhook alert. 8 ranks
where the propagation across groups is the point, 4 where it is not (2 shared cores).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

from mycroft.faults.inject import PAGING_KINDS, local_rca, run_one
from mycroft.faults.scoring import EXPECTED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rca() -> Iterator[Any]:
    with local_rca() as service:
        yield service


@pytest.mark.parametrize("fault,layout,trigger", [
    ("block", "2x2x2", "step"),          # before a random TP / PP / DP op
    ("chain", "2x2x2", "step"),          # TP peer waits in TP, the next stage in PP recv, DP peers in DP
    ("straggler", "2x2x2", "step"),      # +150 ms a step: its TP/PP/DP peers inherit the lateness
    ("block", "2x2x1", "time"),          # within the first second after init_process_group
    ("sigkill", "2x2x1", "time"),        # possibly before its first heartbeat or span
    ("sigstop", "1x2x2", "first"),       # right after its first collective
    ("mismatch_dtype", "2x1x2", "step"),  # float64 in a 2-rank DP group: gloo aborts the peer
    ("mismatch_size", "1x1x4", "step"),
    ("mismatch_op", "1x2x2", "step"),
    ("deadlock", "1x2x2", "step"),       # one 1F1B exchange in swapped order
])
def test_fault_on_3d_job(rca: Any, fault: str, layout: str, trigger: str, fault_rng: random.Random) -> None:
    rng = fault_rng
    rank, env = None, {}
    if fault == "chain":
        # a first-stage rank at its step's first TP all_reduce: its TP peer waits in TP at once, and the
        # next stage's ranks already wait in PP recv (on it, and on its peer): the chain is there at detection
        # (benchmarks/fault_matrix.py draws the position freely)
        rank, env = rng.randrange(2 * 2), {"MYCROFT_FAULT_NTH": "0"}
    result = run_one(rca, fault, layout=layout, trigger=trigger, rank=rank, rng=rng, timeout_s=20,
                     alert_timeout_s=10, env=env)
    assert result.onset is not None, result.note
    assert result.correct, (result.note, result.extra, result.incident)
    assert result.false_alarms == 0
    assert result.detection_s is not None and result.detection_s <= 5.0
    if EXPECTED[fault][0] <= PAGING_KINDS:  # a stuck or broken job pages someone
        assert result.alert_s is not None and result.alert_s <= 10.0, result.note
    incident = result.incident
    assert incident is not None
    top = incident["root_causes"][0]
    assert top["evidence"]["text"]
    if fault in ("block", "chain") and trigger == "step":
        assert "stuck_in_user_code" in top["evidence"].get("stack", ""), top["evidence"]
    if fault == "chain":
        # e.g. rank 2 -> [p2p 2->6 seq 35] -> rank 6 -> [group 4 seq 68] -> rank 7
        longest = top["evidence"]["longest_wait_chain"]
        assert longest.count("[") >= 2, longest


@pytest.mark.parametrize("scenario,layout,env", [
    # two checkpoints of 2-3 s (rank 0 in save_checkpoint, the rest in a barrier)
    ("checkpoint", "2x1x2", {"MYCROFT_JOB_STEPS": "10", "MYCROFT_JOB_CKPT_EVERY": "5", "MYCROFT_JOB_CKPT_S": "2-3"}),
    # two evaluation phases of 1-2 s, then a metrics all_reduce
    ("eval", "2x1x2", {"MYCROFT_JOB_STEPS": "10", "MYCROFT_JOB_EVAL_EVERY": "5"}),
    # one rank ~15% slower, the rest jittery: a finding at most, never a page
    ("slow_rank", "2x2x2", {"MYCROFT_JOB_STEPS": "25", "MYCROFT_JOB_JITTER": "0.3"}),
])
def test_healthy_irregular_job_raises_no_critical_and_no_alert(rca: Any, scenario: str, layout: str,
                                                               env: dict[str, str],
                                                               fault_rng: random.Random) -> None:
    result = run_one(rca, scenario, layout=layout, rng=fault_rng, env=env)
    assert result.extra["exit"] == 0, result.note
    assert result.correct, (result.note, result.extra["incident_list"])
    assert result.false_alarms == 0
