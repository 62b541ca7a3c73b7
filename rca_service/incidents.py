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

from .findings import SEVERITY, Finding

FIRING = "firing"
RESOLVED = "resolved"


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

    @property
    def key(self) -> str:
        return f"{self.job}/{self.kind}"

    @property
    def severity(self) -> str:
        return SEVERITY.get(self.kind, "warning")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "job": self.job, "kind": self.kind, "status": self.status,
            "severity": self.severity,
            "detected_at": rfc3339(self.detected_at),
            "root_cause_at": rfc3339(self.root_cause_at) if self.root_cause_at else None,
            "resolved_at": rfc3339(self.resolved_at) if self.resolved_at else None,
            "updated_at": rfc3339(self.updated_at),
            "detected_at_unix": self.detected_at,
            "root_cause_at_unix": self.root_cause_at,
            "resolved_at_unix": self.resolved_at,
            "summary": self.summary, "root_causes": self.root_causes,
            "wait_for_graph": self.graph, "evidence": self.evidence, "updates": self.updates,
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
        )


@dataclass(slots=True)
class Event:
    """A change worth persisting and alerting on."""

    action: str  # "fired", "updated", "resolved"
    incident: Incident


def _cause_signature(causes: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(c.get("rank"), c.get("kind")) for c in causes]


class IncidentTracker:
    """Turns each pass's findings into incident events; holds only the firing incidents."""

    def __init__(self, resolve_after_s: float, firing: list[Incident] | None = None) -> None:
        self.resolve_after_s = resolve_after_s
        self.active: dict[str, Incident] = {i.key: i for i in (firing or []) if i.status == FIRING}

    def observe(self, job: str, findings: list[Finding], now: float) -> list[Event]:
        """Apply one analysis pass of one job."""
        events: list[Event] = []
        seen: set[str] = set()
        for finding in findings:
            seen.add(finding.key)
            causes = [rc.to_dict() for rc in finding.root_causes]
            current = self.active.get(finding.key)
            if current is None:
                incident = Incident(
                    id=uuid.uuid4().hex[:16], job=job, kind=finding.kind, status=FIRING, detected_at=now,
                    summary=finding.summary, root_causes=causes, graph=finding.graph,
                    evidence=finding.evidence, updated_at=now, root_cause_at=now if causes else None,
                    last_seen_at=now)
                self.active[finding.key] = incident
                events.append(Event("fired", incident))
                continue
            current.last_seen_at = now
            if _cause_signature(causes) != _cause_signature(current.root_causes) or (
                    causes and current.root_cause_at is None):
                current.root_causes = causes
                current.summary = finding.summary
                current.graph = finding.graph
                current.evidence = finding.evidence
                current.updated_at = now
                current.updates += 1
                if causes and current.root_cause_at is None:
                    current.root_cause_at = now
                events.append(Event("updated", current))
        for key, incident in list(self.active.items()):
            if incident.job != job or key in seen:
                continue
            if now - incident.last_seen_at >= self.resolve_after_s:
                events.append(self._resolve(key, now, "condition cleared"))
        return events

    def resolve_job(self, job: str, now: float, reason: str) -> list[Event]:
        """The job is gone (expired): close what is still open for it."""
        return [self._resolve(key, now, reason) for key, inc in list(self.active.items()) if inc.job == job]

    def _resolve(self, key: str, now: float, reason: str) -> Event:
        incident = self.active.pop(key)
        incident.status = RESOLVED
        incident.resolved_at = now
        incident.updated_at = now
        incident.evidence = {**incident.evidence, "resolved_because": reason}
        return Event("resolved", incident)
