"""An incident's root cause is history: deaths after it are consequences recorded on it, never a rewrite."""

from __future__ import annotations

from mycroft.rca_service.analysis.findings import (
    RC_NOT_ENTERED,
    RC_PROCESS_EXITED,
    RC_PROCESS_LOST,
    Finding,
    RootCause,
)
from mycroft.rca_service.incidents.tracker import IncidentTracker


def _hang(causes: list[tuple[int, str]], severity: str) -> Finding:
    return Finding(job="j", kind="hang", summary=f"{len(causes)} cause(s)", severity=severity,
                   root_causes=[RootCause(rank, kind, {"text": f"rank {rank} {kind}"}) for rank, kind in causes])


def _story(tracker: IncidentTracker) -> list[tuple[int | None, str | None]]:
    (incident,) = tracker.active.values()
    return [(c.get("rank"), c.get("kind")) for c in incident.root_causes]


def _fire_not_entered(severity: str = "warning") -> IncidentTracker:
    tracker = IncidentTracker(resolve_after_s=5.0)
    tracker.observe("j", [_hang([(1, RC_NOT_ENTERED)], severity)], now=100.0)
    return tracker


def test_a_teardown_that_kills_every_rank_after_a_warning_is_a_consequence() -> None:
    """The Lightning case: rank 1 never entered (a warning, not yet paged); the launcher's teardown then
    kills ranks 0, 1 and 3, which go silent (lost) and the pass names them: the story stays rank 1."""
    tracker = _fire_not_entered()
    tracker.observe("j", [_hang([(0, RC_PROCESS_LOST), (1, RC_PROCESS_LOST), (3, RC_PROCESS_LOST)], "critical")],
                    now=104.0)
    assert _story(tracker) == [(1, RC_NOT_ENTERED)]
    (incident,) = tracker.active.values()
    assert sorted(c["rank"] for c in incident.consequences) == [0, 1, 3]
    assert incident.severity == "warning"  # the teardown does not page on the old story's behalf


def test_exits_beside_the_same_first_cause_are_consequences_too() -> None:
    tracker = _fire_not_entered("critical")
    tracker.observe("j", [_hang([(1, RC_NOT_ENTERED), (0, RC_PROCESS_EXITED), (3, RC_PROCESS_EXITED)], "critical")],
                    now=103.0)
    assert _story(tracker) == [(1, RC_NOT_ENTERED)]
    (incident,) = tracker.active.values()
    assert sorted(c["rank"] for c in incident.consequences) == [0, 3]


def test_a_named_rank_that_dies_alone_while_its_peers_wait_is_the_crash_story() -> None:
    """SIGKILL right after a heartbeat: the rank named (stack pending) is lost while the others still
    wait for it; that crash is the root cause, not a consequence."""
    tracker = _fire_not_entered()
    tracker.observe("j", [_hang([(1, RC_PROCESS_LOST)], "critical")], now=103.0)
    assert _story(tracker) == [(1, RC_PROCESS_LOST)]


def test_a_different_live_cause_still_replaces_the_story() -> None:
    tracker = _fire_not_entered()
    tracker.observe("j", [_hang([(2, RC_NOT_ENTERED)], "warning")], now=103.0)
    assert _story(tracker) == [(2, RC_NOT_ENTERED)]


def test_the_culprits_other_threads_are_on_the_incident() -> None:
    """The stuck rank's heartbeats carry its other threads' stacks beside its own: the root cause shows both."""
    from mycroft.rca_service.incidents.engine import Engine

    from mycroft import schema
    from mycroft.faults.made_up_job import StepJob

    engine, job = Engine(), StepJob("threads", 4)
    for _ in range(30):
        engine.ingest(job.steps(1), job.now)
        engine.ingest(job.heartbeats(job.now, not_entered=range(4), stack=""), job.now)
        engine.step(job.now)
    stack = 'ray/train/worker.py:80 in run\ntrain.py:40 in train_loop\ntrain.py:12 in stuck_here'
    others = "--- thread MainThread\nray/_private/worker.py:900 in main_loop"
    fired = []
    t = job.now
    for _ in range(16):
        beats = job.heartbeats(t, not_entered=[2], stack=stack)
        for beat in beats:
            if beat.rank == 2:
                beat.attributes[schema.ATTR_HB_THREAD_STACKS] = others
        engine.ingest(beats, t)
        fired += [e.incident for e in engine.step(t) if e.action in ("fired", "updated")]
        t += 0.5
    causes = [c for incident in fired for c in incident.root_causes if c.get("rank") == 2]
    assert causes and causes[-1]["evidence"]["stack"] == stack
    assert causes[-1]["evidence"]["threads"] == others
