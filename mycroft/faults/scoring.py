"""Scoring a fault run against what the RCA service promises (pure functions).

Diagnosis: the first incident detected after the onset whose kind and first root cause
(rank, kind) are what the fault implies; the run is correct when that incident exists and
is the first non-info incident after the onset (an earlier wrong one means an operator
was told the wrong thing first; an info finding alone is no diagnosis). Incidents are
updated in place, so the harness polls until the first non-info one is right or the time
is up. Alert: the first webhook POST of a firing incident of the
job after the onset (what pages someone); for a remote service without our receiver, the
first `critical_at_unix`. Healthy runs: no critical incident and no alert at all;
info / warning incidents are reported, not failed.

Incidents are the API's dicts. A missing `severity` (a service older than severities)
reads as the old fixed mapping by kind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# fault -> (acceptable incident kinds, acceptable root-cause kinds of the faulty rank)
EXPECTED: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "block": (frozenset({"hang"}), frozenset({"not_entered"})),
    "chain": (frozenset({"hang"}), frozenset({"not_entered"})),
    "sigkill": (frozenset({"crash", "hang"}), frozenset({"process_lost"})),
    "sigstop": (frozenset({"hang", "crash"}), frozenset({"process_lost"})),
    "straggler": (frozenset({"slowdown"}), frozenset({"straggler"})),
    "mismatch": (frozenset({"mismatch"}), frozenset({"mismatch"})),  # the 4-rank job's op mismatch
    "mismatch_op": (frozenset({"mismatch"}), frozenset({"mismatch"})),
    "mismatch_size": (frozenset({"mismatch", "crash"}), frozenset({"mismatch"})),
    "mismatch_dtype": (frozenset({"mismatch", "crash"}), frozenset({"mismatch"})),
    "mismatch_silent": (frozenset({"mismatch"}), frozenset({"mismatch"})),  # completes: no crash to blame
    "deadlock": (frozenset({"deadlock"}), frozenset({"deadlock"})),
    "linkdown": (frozenset({"hang", "crash"}), frozenset({"process_lost", "link"})),
    "throttle": (frozenset({"slowdown"}), frozenset({"communication", "straggler"})),
}
# healthy scenarios: must raise no critical incident and no alert
HEALTHY = ("none", "checkpoint", "eval", "jitter", "slow_rank")
# the old fixed mapping, for services that predate severities
LEGACY_SEVERITY = {"hang": "critical", "crash": "critical", "deadlock": "critical", "mismatch": "critical",
                   "stall": "warning", "slowdown": "warning"}
SLOW_KINDS = frozenset({"slowdown"})


def severity(incident: dict[str, Any]) -> str:
    return str(incident.get("severity") or LEGACY_SEVERITY.get(str(incident.get("kind")), "warning"))


def critical_at(incident: dict[str, Any]) -> float | None:
    """When it first was critical: the service's own field, else (old service) its detection."""
    if incident.get("critical_at_unix") is not None:
        return float(incident["critical_at_unix"])
    if "critical_at_unix" not in incident and severity(incident) == "critical":
        return float(incident["detected_at_unix"])
    return None


def matches(fault: str, rank: int, incident: dict[str, Any]) -> bool:
    """Is this incident's verdict the one the fault implies (kind, first root cause)?"""
    kinds, rc_kinds = EXPECTED[fault]
    causes = incident.get("root_causes") or []
    if incident.get("kind") not in kinds or not causes:
        return False
    top = causes[0]
    if fault == "deadlock":  # a cycle cannot tell which member deviated: the faulty rank must be in it
        return rank in {c.get("rank") for c in causes if c.get("kind") == "deadlock"}
    if fault == "throttle":  # a slower link, not a rank: "communication" names no rank
        return top.get("kind") == "communication" or top.get("rank") == rank
    return top.get("rank") == rank and top.get("kind") in rc_kinds


@dataclass(frozen=True, slots=True)
class Diagnosis:
    incident: dict[str, Any] | None  # the first non-info incident after the onset
    correct: bool
    settled_wrong: bool  # the first non-info incident after the onset is wrong (it may still be updated)
    false_alarms: int  # non-info incidents detected before the onset


def diagnose(fault: str, rank: int, onset: float, incidents: list[dict[str, Any]]) -> Diagnosis:
    ordered = sorted(incidents, key=lambda i: float(i["detected_at_unix"]))
    before = [i for i in ordered if float(i["detected_at_unix"]) < onset and severity(i) != "info"]
    after = [i for i in ordered if float(i["detected_at_unix"]) >= onset]
    loud = [i for i in after if severity(i) != "info"]
    if loud and matches(fault, rank, loud[0]):
        return Diagnosis(loud[0], True, False, len(before))
    # nothing loud yet (an info finding is not a diagnosis), or the first loud verdict is wrong
    return Diagnosis(loud[0] if loud else None, False, bool(loud), len(before))


def first_alert(job: str, onset: float | None, posts: list[tuple[float, dict[str, Any]]]) -> tuple[float | None,
                                                                                                  int]:
    """(arrival of the job's first firing webhook after the onset, firing posts before the onset)."""
    mine = sorted((t, body) for t, body in posts if alert_job(body) == job and body.get("status") == "firing")
    before = sum(1 for t, _ in mine if onset is not None and t < onset)
    after = [t for t, _ in mine if onset is None or t >= onset]
    return (after[0] if after else None), before


def alert_job(body: dict[str, Any]) -> str | None:
    """The job a webhook body (Alertmanager format, Mycroft's extension) is about."""
    labels = body.get("commonLabels") or {}
    if labels.get("mycroft_job"):
        return str(labels["mycroft_job"])
    incident = (body.get("mycroft") or {}).get("incident") or {}
    return incident.get("job")


@dataclass(frozen=True, slots=True)
class HealthyVerdict:
    correct: bool
    criticals: int
    by_severity: dict[str, int]
    slow_rank_named: bool | None  # None when the run had no slower rank


def judge_healthy(exit_code: int | None, incidents: list[dict[str, Any]], alerts: int,
                  slow_rank: int | None = None) -> HealthyVerdict:
    counts: dict[str, int] = {}
    for i in incidents:
        counts[severity(i)] = counts.get(severity(i), 0) + 1
    criticals = sum(1 for i in incidents if severity(i) == "critical" or i.get("critical_at_unix"))
    named = None
    if slow_rank is not None:
        named = any(i.get("kind") in SLOW_KINDS and severity(i) != "critical"
                    and any(c.get("rank") == slow_rank for c in (i.get("root_causes") or [])[:1])
                    for i in incidents)
    return HealthyVerdict(exit_code == 0 and criticals == 0 and alerts == 0, criticals, counts, named)


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(len(ordered) - 1, int(k) + 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def score(fault: str, rank: int, onset: float, incidents: list[dict[str, Any]]) -> tuple[dict[str, Any] | None,
                                                                                        bool, int]:
    """(the first non-info incident after the onset, correct?, false alarms): for the network runs."""
    d = diagnose(fault, rank, onset, incidents)
    return d.incident, d.correct, d.false_alarms
