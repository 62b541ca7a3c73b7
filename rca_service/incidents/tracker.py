"""Incident lifecycle: findings over time -> firing / updated / resolved incidents.

One firing incident per (job, kind). A condition must stay clear for
`resolve_after_s` before its incident resolves, so a flapping trigger does not spam.
No I/O here; the store and the alerters consume the returned events.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..analysis.findings import (
    CRITICAL,
    EVIDENCE_WAITED_OPS,
    RC_COMMUNICATION,
    RC_DEADLOCK,
    RC_LINK,
    RC_MISMATCH,
    RC_NOT_ENTERED,
    RC_PROCESS_EXITED,
    RC_PROCESS_LOST,
    RC_STRAGGLER,
    SEVERITY,
    SLOWDOWN,
    Finding,
    cause_who,
)

FIRING = "firing"
RESOLVED = "resolved"
REFRESHED = "refreshed"  # event: same story, current evidence (saved for the API; never alerts)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass(slots=True)
class Incident:
    id: str
    job: str
    kind: str
    status: str
    detected_at: float
    summary: str
    root_causes: list[dict[str, Any]]
    graph: dict[str, Any]
    evidence: dict[str, Any]
    updated_at: float
    root_cause_at: float | None = None
    resolved_at: float | None = None
    last_seen_at: float = 0.0  # last analysis pass that still saw the condition
    updates: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    severity: str = ""  # current; it may rise (a pause over budget) or fall while firing
    severity_reason: str = ""
    critical_at: float | None = None  # first time it was critical (what pages someone)
    consequences: list[dict[str, Any]] = field(default_factory=list)  # later events it explains
    consequence_of: str | None = None  # id of the earlier incident that explains this one
    alerted: bool = False  # a firing alert went out (so its resolution goes out too)
    view: dict[str, Any] = field(default_factory=dict)  # the page's drawing (graph_view.py)
    # the host of each root-cause rank (str(rank) -> host.name) as of when it was named: what the
    # fleet memory (hosts.py) and node actions (actions.py) act on after the job's state is gone
    root_cause_hosts: dict[str, str] = field(default_factory=dict)
    # every change of the first root cause while firing: {at, at_unix, from, to, why} (issue 44)
    verdict_changes: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.severity:
            self.severity = SEVERITY.get(self.kind, "warning")

    @property
    def key(self) -> str:
        return f"{self.job}/{self.kind}"

    def take_story(self, finding: Finding, causes: list[dict[str, Any]]) -> None:
        """This pass's root causes, summary, graph, evidence and drawing (kept when it draws nothing)."""
        self.root_causes = causes
        self.summary = finding.summary
        self.graph = finding.graph
        self.evidence = finding.evidence
        self.view = finding.drawing() or self.view

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "job": self.job, "kind": self.kind, "status": self.status,
            "severity": self.severity, "severity_reason": self.severity_reason,
            "critical_at": rfc3339(self.critical_at) if self.critical_at else None,
            "critical_at_unix": self.critical_at,
            "consequences": self.consequences, "consequence_of": self.consequence_of, "alerted": self.alerted,
            "detected_at": rfc3339(self.detected_at),
            "root_cause_at": rfc3339(self.root_cause_at) if self.root_cause_at else None,
            "resolved_at": rfc3339(self.resolved_at) if self.resolved_at else None,
            "updated_at": rfc3339(self.updated_at),
            "detected_at_unix": self.detected_at,
            "root_cause_at_unix": self.root_cause_at,
            "resolved_at_unix": self.resolved_at,
            "summary": self.summary, "root_causes": self.root_causes,
            "wait_for_graph": self.graph, "evidence": self.evidence, "updates": self.updates,
            "view": self.view, "root_cause_hosts": self.root_cause_hosts, "verdict_changes": self.verdict_changes,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Incident:
        return cls(
            id=d["id"], job=d["job"], kind=d["kind"], status=d["status"],
            detected_at=float(d["detected_at_unix"]), summary=d.get("summary", ""),
            root_causes=list(d.get("root_causes", [])), graph=dict(d.get("wait_for_graph", {})),
            evidence=dict(d.get("evidence", {})), updated_at=parse_rfc3339(d["updated_at"]),
            root_cause_at=d.get("root_cause_at_unix"), resolved_at=d.get("resolved_at_unix"),
            last_seen_at=parse_rfc3339(d["updated_at"]), updates=int(d.get("updates", 0)),
            severity=str(d.get("severity") or ""), severity_reason=str(d.get("severity_reason") or ""),
            critical_at=d.get("critical_at_unix"), consequences=list(d.get("consequences") or []),
            consequence_of=d.get("consequence_of"), alerted=bool(d.get("alerted", False)),
            view=dict(d.get("view") or {}), root_cause_hosts=dict(d.get("root_cause_hosts") or {}),
            verdict_changes=list(d.get("verdict_changes") or []),
        )


@dataclass(slots=True)
class Event:
    """A change worth persisting and alerting on."""

    action: str  # "fired", "updated", "resolved", REFRESHED
    incident: Incident


def _cause_signature(causes: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(c.get("rank"), c.get("kind")) for c in causes]


def _has_stack(causes: list[dict[str, Any]]) -> list[bool]:
    return [bool(c.get("evidence", {}).get("stack")) for c in causes]


# root-cause kinds a teardown produces: a rank that was killed (lost) or told to exit (exited)
_AFTERMATH = {RC_PROCESS_LOST, RC_PROCESS_EXITED}
# first causes that teardown cannot overrule: it was alive and elsewhere, or it diverged
_FIRST_CAUSES = {RC_NOT_ENTERED, RC_MISMATCH}


# root causes read off the data path over many heartbeats, and the members of one wait-for cycle: one names
# another only on evidence that outweighs it
_WEIGHED = {RC_LINK, RC_STRAGGLER, RC_COMMUNICATION, RC_DEADLOCK}
_LOUDNESS = {"info": 0, "warning": 1, CRITICAL: 2}
CHALLENGER = "challenger"  # Incident.extra: the would-be first root cause, since when, and why it won


def _first(causes: list[dict[str, Any]]) -> tuple[Any, Any]:
    return (causes[0].get("rank"), causes[0].get("kind")) if causes else (None, None)


def _consequence(cause: dict[str, Any], now: float) -> dict[str, Any]:
    text = str(cause.get("evidence", {}).get("text", ""))
    return {"at": rfc3339(now), "at_unix": now, "rank": cause.get("rank"), "kind": cause.get("kind"), "text": text}


class IncidentTracker:
    """Turns each pass's findings into incident events; holds only the firing incidents.

    One causal story: the first root cause of an incident stands. When the ranks it named
    are later killed or told to exit (the operator's or torchrun's teardown, a peer aborted
    by the library), that is recorded as a consequence, not as a new root cause (unless the
    story had not paged yet and its rank is now lost while its peers wait: a crash); and an
    incident that fires while an earlier critical one of the same job is open (or just
    resolved) and names only lost / exited ranks is marked as its consequence, at info.
    """

    def __init__(self, resolve_after_s: float, firing: list[Incident] | None = None,
                 consequence_window_s: float = 120.0, refresh_after_s: float = 5.0,
                 verdict_hold_s: float = 5.0) -> None:
        self.resolve_after_s = resolve_after_s
        self.verdict_hold_s = verdict_hold_s  # a challenger at the same loudness must hold this long
        self.consequence_window_s = consequence_window_s
        self.refresh_after_s = refresh_after_s  # at most this often, evidence of an unchanged story
        self.active: dict[str, Incident] = {i.key: i for i in (firing or []) if i.status == FIRING}
        self._recent_critical: dict[str, Incident] = {}  # job -> its latest critical incident
        self._last_pass: dict[str, float] = {}  # job -> when observe() last ran for it

    def _cause_of(self, job: str, causes: list[dict[str, Any]], now: float, key: str) -> Incident | None:
        """The earlier critical incident that explains an incident naming only lost / exited ranks."""
        if not causes or any(c.get("kind") not in _AFTERMATH for c in causes):
            return None
        earlier = self._recent_critical.get(job)
        if earlier is None or earlier.key == key:
            return None
        if earlier.status == FIRING or (earlier.resolved_at and now - earlier.resolved_at <= self.consequence_window_s):
            return earlier
        return None

    def observe(self, job: str, findings: list[Finding], now: float) -> list[Event]:
        """Apply one analysis pass of one job."""
        events: list[Event] = []
        seen: set[str] = set()
        for finding in findings:
            seen.add(finding.key)
            causes = [rc.to_dict() for rc in finding.root_causes]
            current = self.active.get(finding.key)
            if current is not None and self._moved_on(current, finding):
                events.append(self._resolve(finding.key, now, "condition cleared: the job moved on to other ops"))
                current = None
            if current is None:
                incident = Incident(
                    id=uuid.uuid4().hex[:16], job=job, kind=finding.kind, status=FIRING, detected_at=now,
                    summary=finding.summary, root_causes=causes, graph=finding.graph,
                    evidence=finding.evidence, updated_at=now, root_cause_at=now if causes else None,
                    last_seen_at=now, severity=finding.severity, severity_reason=finding.severity_reason,
                    view=finding.drawing())
                cause = self._cause_of(job, causes, now, incident.key)
                if cause is not None:
                    incident.consequence_of = cause.id
                    incident.severity = "info"
                    incident.severity_reason = (f"a consequence of incident {cause.id} ({cause.kind}: "
                                                f"{cause.summary[:160]})")
                    cause.consequences.extend(_consequence(c, now) for c in causes[:16])
                    cause.updated_at = now
                    cause.updates += 1
                    events.append(Event("updated", cause))
                self._note_severity(incident, now)
                self.active[finding.key] = incident
                events.append(Event("fired", incident))
                continue
            current.last_seen_at = now
            if self._update(current, finding, causes, now):
                events.append(Event("updated", current))
            elif self._refresh(current, finding, causes, now):
                events.append(Event(REFRESHED, current))
        for key, incident in list(self.active.items()):
            if incident.job != job or key in seen:
                continue
            if now - incident.last_seen_at >= self.resolve_after_s:
                events.append(self._resolve(key, now, "condition cleared"))
        self._last_pass[job] = now
        return events

    def _moved_on(self, current: Incident, finding: Finding) -> bool:
        """A hang that cleared (its finding missing from the job's last pass) and is back in other ops
        only: the job made progress in between, so this is a new hang (a block right after a pause),
        not the old one flapping; it gets its own incident, detected now."""
        last_pass = self._last_pass.get(current.job)
        if last_pass is None or current.last_seen_at >= last_pass:
            return False  # seen in the last pass: the same condition, still standing
        before = current.evidence.get(EVIDENCE_WAITED_OPS) or []
        after = finding.evidence.get(EVIDENCE_WAITED_OPS) or []
        return bool(before) and bool(after) and set(before).isdisjoint(after)

    def _update(self, current: Incident, finding: Finding, causes: list[dict[str, Any]], now: float) -> bool:
        """Fold one pass into a firing incident; True when something worth an event changed."""
        old = current.root_causes
        changed = False
        if causes and old and _cause_signature(causes) != _cause_signature(old):
            old_ranks = {c.get("rank") for c in old}
            deaths = [c for c in causes if c.get("kind") in _AFTERMATH]
            alive = [c for c in causes if c.get("kind") not in _AFTERMATH]
            # a story that has not paged yet (a holder whose stack is on the way) whose named rank then dies
            # alone while its peers still wait: the crash is the story (SIGKILL right after a heartbeat). A
            # teardown kills the peers too: that is no crash story
            died_before_paging = current.severity != CRITICAL and finding.severity == CRITICAL and \
                all(c.get("kind") == RC_PROCESS_LOST for c in causes) and \
                {c.get("rank") for c in causes} <= old_ranks
            if all(c.get("kind") in _FIRST_CAUSES for c in old) and deaths and not died_before_paging and \
                    (not alive or _cause_signature(alive) == _cause_signature(old)):
                # teardown after the fact (deaths alone, or beside the same first cause): the first cause
                # stands; what happened next is recorded on it
                known = {(c.get("rank"), c.get("kind")) for c in current.consequences}
                fresh = [c for c in deaths if (c.get("rank"), c.get("kind")) not in known]
                if fresh:
                    current.consequences.extend(_consequence(c, now) for c in fresh[:16])
                    changed = True
                causes = []  # keep root causes, summary and severity as they were
            elif old_ranks and {c.get("rank") for c in causes} == old_ranks and \
                    all(c.get("kind") in _AFTERMATH for c in causes) and \
                    all(c.get("kind") in _AFTERMATH for c in old):
                causes = []  # lost <-> exited of the same ranks: no news
        if causes and old and _first(causes) != _first(old):
            if not self._outweighs(current, finding, causes, now):
                return changed  # the standing verdict holds until a challenger outweighs it
            current.verdict_changes.append({"at": rfc3339(now), "at_unix": now, "from": list(_first(old)),
                                            "to": list(_first(causes)),
                                            "why": current.extra.pop(CHALLENGER, {}).get("why", "")})
        elif causes and old:
            current.extra.pop(CHALLENGER, None)  # the standing cause named again: a challenger starts over
        if causes and (_cause_signature(causes) != _cause_signature(old) or _has_stack(causes) != _has_stack(old)
                       or current.root_cause_at is None):
            # new root causes, or the same ones with their evidence completed (a stack arrived)
            current.take_story(finding, causes)
            if current.root_cause_at is None:
                current.root_cause_at = now
            changed = True
        elif causes and current.kind == SLOWDOWN and \
                [c.get("evidence", {}).get("mode") for c in causes] != [c.get("evidence", {}).get("mode") for c in old]:
            current.root_causes = causes  # same straggler, other rule (onset <-> imbalance): its text follows
            current.summary = finding.summary
            changed = True
        if causes and current.consequence_of is None and finding.severity != current.severity:
            current.severity = finding.severity
            current.severity_reason = finding.severity_reason
            current.summary = finding.summary
            current.evidence = finding.evidence
            changed = True
        if changed:
            current.updated_at = now
            current.updates += 1
            self._note_severity(current, now)
        return changed

    def _outweighs(self, current: Incident, finding: Finding, causes: list[dict[str, Any]], now: float) -> bool:
        """Whether a finding naming another first root cause may replace the standing one.

        The rule (docs/rca.md, "One verdict"): a verdict read off the data path (link, straggler,
        communication) or naming a member of a wait-for cycle (deadlock) changes only on evidence
        that outweighs it -- a louder finding (info -> warning -> critical) at once; at the same
        loudness or lower, only a challenger named in every pass for verdict_hold_s while the
        standing cause was named in none. Any other change (a rank died, a holder's evidence
        completed) is a new story and goes through as before."""
        if not all(c.get("kind") in _WEIGHED for c in current.root_causes[:1] + causes[:1]):
            return True
        if _LOUDNESS.get(finding.severity, 1) > _LOUDNESS.get(current.severity, 1):
            current.extra[CHALLENGER] = {"why": f"a {finding.severity} finding over a {current.severity} one"}
            return True
        seen = current.extra.get(CHALLENGER)
        sig = list(_first(causes))
        if not seen or seen.get("sig") != sig:
            current.extra[CHALLENGER] = {"sig": sig, "since": now}
            return False
        held = now - float(seen.get("since", now))
        if held < self.verdict_hold_s:
            return False
        seen["why"] = (f"named in every pass for {held:.1f}s (hold {self.verdict_hold_s:g}s) while "
                       f"{list(_first(current.root_causes))} was not")
        return True

    def _refresh(self, current: Incident, finding: Finding, causes: list[dict[str, Any]], now: float) -> bool:
        """Same root causes and severity: bring the evidence up to date (more ranks now wait,
        the chain grew, ages), at most every refresh_after_s; the first cause and its
        consequences stay as they are."""
        if not causes or _cause_signature(causes) != _cause_signature(current.root_causes) or \
                now - current.updated_at < self.refresh_after_s or current.consequence_of is not None:
            return False
        if (finding.summary, finding.graph, finding.evidence, causes) == \
                (current.summary, current.graph, current.evidence, current.root_causes):
            return False
        current.take_story(finding, causes)
        current.updated_at = now
        return True

    def _note_severity(self, incident: Incident, now: float) -> None:
        if incident.severity == CRITICAL:
            if incident.critical_at is None:
                incident.critical_at = now
            self._recent_critical[incident.job] = incident

    def resolve_job(self, job: str, now: float, reason: str) -> list[Event]:
        """The job is gone (expired): close what is still open for it."""
        self._recent_critical.pop(job, None)
        self._last_pass.pop(job, None)
        return [self._resolve(key, now, reason) for key, inc in list(self.active.items()) if inc.job == job]

    def _resolve(self, key: str, now: float, reason: str) -> Event:
        incident = self.active.pop(key)
        incident.status = RESOLVED
        incident.resolved_at = now
        incident.updated_at = now
        incident.evidence = {**incident.evidence, "resolved_because": reason}
        return Event("resolved", incident)


def root_cause_line(incident: dict[str, Any]) -> str:
    """One line for an alert or a list of incidents: who, what kind, and why."""
    causes = incident.get("root_causes") or []
    if not causes:
        return str(incident.get("summary", ""))[:300]
    top = causes[0]
    return f"{cause_who(top)} ({top.get('kind')}): {top.get('evidence', {}).get('text', '')}"[:500]
