"""Scoring rules of the fault harness (pure): what counts as right, first, loud and alerted."""

from __future__ import annotations

from typing import Any

from mycroft.faults.scoring import critical_at, diagnose, first_alert, judge_healthy, percentile


def _incident(kind: str, at: float, rank: int | None, rc: str, severity: str | None = None,
              critical: float | None = None, job: str = "j") -> dict[str, Any]:
    doc: dict[str, Any] = {"job": job, "kind": kind, "detected_at_unix": at,
                           "root_causes": [{"rank": rank, "kind": rc}]}
    if severity is not None:
        doc.update(severity=severity, critical_at_unix=critical)
    return doc


def test_first_loud_incident_after_onset_decides() -> None:
    right = _incident("hang", 11.0, 3, "not_entered", "critical", 11.0)
    assert diagnose("block", 3, 10.0, [right]).correct
    # an info note first does not count against the verdict; a wrong warning first does
    info = _incident("hang", 10.5, 0, "not_entered", "info")
    assert diagnose("block", 3, 10.0, [info, right]).correct
    wrong = _incident("slowdown", 10.5, 2, "straggler", "warning")
    d = diagnose("block", 3, 10.0, [wrong, right])
    assert not d.correct and d.settled_wrong and d.incident is wrong
    # before the onset: a false alarm, not the verdict
    early = _incident("hang", 9.0, 3, "not_entered", "critical", 9.0)
    d = diagnose("block", 3, 10.0, [early, right])
    assert d.correct and d.false_alarms == 1
    # nothing loud yet: undecided, not settled
    d = diagnose("block", 3, 10.0, [info])
    assert not d.correct and not d.settled_wrong


def test_verdict_rules_per_fault() -> None:
    assert diagnose("sigkill", 1, 0.0, [_incident("crash", 1.0, 1, "process_lost")]).correct
    assert not diagnose("sigkill", 1, 0.0, [_incident("crash", 1.0, 2, "process_lost")]).correct
    assert not diagnose("mismatch_dtype", 1, 0.0, [_incident("crash", 1.0, 2, "process_lost")]).correct
    cycle = {"job": "j", "kind": "deadlock", "detected_at_unix": 1.0,
             "root_causes": [{"rank": 4, "kind": "deadlock"}, {"rank": 0, "kind": "deadlock"}]}
    assert diagnose("deadlock", 0, 0.0, [cycle]).correct and not diagnose("deadlock", 2, 0.0, [cycle]).correct


def test_legacy_incidents_without_severity() -> None:
    old = _incident("hang", 5.0, 1, "not_entered")
    assert critical_at(old) == 5.0 and critical_at(_incident("slowdown", 5.0, 1, "straggler")) is None
    assert critical_at(_incident("hang", 5.0, 1, "not_entered", "info")) is None


def test_alerts_are_the_jobs_firing_posts_after_onset() -> None:
    def body(job: str, status: str = "firing") -> dict[str, Any]:
        return {"status": status, "commonLabels": {"mycroft_job": job}}

    posts = [(4.0, body("j")), (6.0, body("other")), (7.0, body("j", "resolved")), (8.0, body("j"))]
    assert first_alert("j", 5.0, posts) == (8.0, 1)
    assert first_alert("j", None, posts) == (4.0, 0)


def test_healthy_runs_fail_on_a_critical_or_an_alert_only() -> None:
    slow = _incident("slowdown", 3.0, 5, "straggler", "info")
    v = judge_healthy(0, [slow], alerts=0, slow_rank=5)
    assert v.correct and v.slow_rank_named and v.by_severity == {"info": 1}
    assert not judge_healthy(0, [_incident("hang", 3.0, 0, "not_entered", "warning", 9.0)], 0).correct
    assert not judge_healthy(0, [], alerts=1).correct and not judge_healthy(1, [], alerts=0).correct
    assert judge_healthy(0, [], 0, slow_rank=2).slow_rank_named is False


def test_percentile() -> None:
    assert percentile([], 0.5) is None and percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert abs((percentile(list(map(float, range(11))), 0.9) or 0) - 9.0) < 1e-9
