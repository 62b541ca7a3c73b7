"""Fleet memory: per host, the incidents its ranks were the root cause of, across jobs.

A job's state is forgotten an hour after it stops reporting; a bad node outlives many jobs.
So every incident leaves one lean row per root-cause host (`host_rows`, written with the
incident), and the service notes which hosts ran which jobs; `fold` turns those rows and the
actions taken into one record per host, and `suspect` says which hosts a launcher should
avoid, until when. Pure functions: the store reads the rows, the API and pages show the fold.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..analysis.findings import CRITICAL, INFO, RC_LINK, RC_NOT_ENTERED, RC_PROCESS_LOST, RC_STRAGGLER

DAY_S = 86400.0
STRIP_DAYS = 14  # the Hosts page's per-day strip


@dataclass(frozen=True, slots=True)
class SuspectConfig:
    """A host is a suspect while >= min_incidents incidents within window_s named one of its ranks
    with a root cause of these kinds (mismatch and deadlock are the program's, not the node's)."""

    min_incidents: int = 2
    window_s: float = 7 * DAY_S
    cause_kinds: tuple[str, ...] = (RC_PROCESS_LOST, RC_LINK, RC_STRAGGLER, RC_NOT_ENTERED)


@dataclass(frozen=True, slots=True)
class HostIncident:
    """One incident as one of its root-cause hosts remembers it."""

    incident: str
    host: str
    job: str
    kind: str  # the incident's kind (hang, crash, ...)
    cause_kind: str  # the root cause of that host's rank (process_lost, link, ...)
    severity: str  # critical once it was ever critical, else its last severity
    at: float  # detected_at
    consequence: bool  # a consequence of an earlier incident: never counted against the host


@dataclass(frozen=True, slots=True)
class HostSeen:
    host: str
    job: str
    first_seen: float
    last_seen: float


@dataclass(frozen=True, slots=True)
class HostAction:
    host: str
    action: str
    mode: str
    result: str
    at: float
    incident: str


@dataclass(slots=True)
class HostRecord:
    host: str
    first_seen: float | None = None
    last_seen: float | None = None
    jobs: set[str] = field(default_factory=set)
    incidents: int = 0  # warning / critical incidents its ranks were the root cause of (no consequences)
    by_kind: dict[str, int] = field(default_factory=dict)
    by_cause: dict[str, int] = field(default_factory=dict)
    last_incident: dict[str, Any] | None = None
    counted: list[float] = field(default_factory=list)  # times of the incidents that count towards suspicion
    daily: list[int] = field(default_factory=lambda: [0] * STRIP_DAYS)  # incidents per day, today first
    actions: list[dict[str, Any]] = field(default_factory=list)  # newest first
    suspect_until: float | None = None

    @property
    def suspect(self) -> bool:
        return self.suspect_until is not None

    def to_dict(self, now: float) -> dict[str, Any]:
        from .tracker import rfc3339

        last = dict(self.last_incident) if self.last_incident else None
        if last is not None:
            last["at"] = rfc3339(float(last["at_unix"]))
        return {
            "host": self.host, "suspect": self.suspect,
            "suspect_until": rfc3339(self.suspect_until) if self.suspect_until else None,
            "suspect_until_unix": self.suspect_until,
            "incidents": self.incidents, "recent_incidents": len(self.counted),
            "by_kind": dict(sorted(self.by_kind.items())), "by_cause": dict(sorted(self.by_cause.items())),
            "first_seen": rfc3339(self.first_seen) if self.first_seen else None,
            "last_seen": rfc3339(self.last_seen) if self.last_seen else None,
            "first_seen_unix": self.first_seen, "last_seen_unix": self.last_seen,
            "jobs": len(self.jobs), "last_incident": last, "daily": list(self.daily),
            "actions": [{**a, "at": rfc3339(float(a["at_unix"]))} for a in self.actions[:16]],
        }


def host_rows(incident: Mapping[str, Any]) -> list[HostIncident]:
    """The rows an incident leaves: one per host a root-cause rank of it ran on (first cause wins)."""
    hosts: Mapping[str, str] = incident.get("root_cause_hosts") or {}
    if not hosts:
        return []
    severity = CRITICAL if incident.get("critical_at_unix") else str(incident.get("severity") or "")
    rows: dict[str, HostIncident] = {}
    for cause in incident.get("root_causes") or []:
        host = hosts.get(str(cause.get("rank")))
        if not host or host in rows:
            continue
        rows[host] = HostIncident(str(incident["id"]), host, str(incident.get("job", "")), str(incident.get("kind")),
                                  str(cause.get("kind")), severity, float(incident.get("detected_at_unix") or 0.0),
                                  bool(incident.get("consequence_of")))
    return list(rows.values())


def fold(seen: Iterable[HostSeen], incidents: Iterable[HostIncident], actions: Iterable[HostAction],
         now: float, cfg: SuspectConfig) -> list[HostRecord]:
    """One record per host: suspects first (latest expiry first), then by incidents, then by name."""
    records: dict[str, HostRecord] = {}

    def record(host: str) -> HostRecord:
        found = records.get(host)
        if found is None:
            found = records[host] = HostRecord(host)
        return found

    def saw(rec: HostRecord, at: float) -> None:
        rec.first_seen = at if rec.first_seen is None else min(rec.first_seen, at)
        rec.last_seen = at if rec.last_seen is None else max(rec.last_seen, at)

    for s in seen:
        rec = record(s.host)
        rec.jobs.add(s.job)
        saw(rec, s.first_seen)
        saw(rec, s.last_seen)
    kinds = set(cfg.cause_kinds)
    for row in incidents:
        rec = record(row.host)
        rec.jobs.add(row.job)
        saw(rec, row.at)
        if row.consequence or row.severity == INFO:
            continue  # a teardown's aftermath, a normal pause: not the host's doing
        rec.incidents += 1
        rec.by_kind[row.kind] = rec.by_kind.get(row.kind, 0) + 1
        rec.by_cause[row.cause_kind] = rec.by_cause.get(row.cause_kind, 0) + 1
        if rec.last_incident is None or row.at > float(rec.last_incident["at_unix"]):
            rec.last_incident = {"id": row.incident, "at_unix": row.at, "kind": row.kind,
                                 "cause_kind": row.cause_kind, "job": row.job}
        age = now - row.at
        if 0 <= age < STRIP_DAYS * DAY_S:
            rec.daily[int(age // DAY_S)] += 1
        if row.cause_kind in kinds and age < cfg.window_s:
            rec.counted.append(row.at)
    for act in actions:
        rec = record(act.host)
        rec.actions.append({"action": act.action, "mode": act.mode, "result": act.result, "at_unix": act.at,
                            "incident": act.incident})
    for rec in records.values():
        rec.actions.sort(key=lambda a: -float(a["at_unix"]))
        rec.counted.sort(reverse=True)
        if cfg.min_incidents > 0 and len(rec.counted) >= cfg.min_incidents:
            until = rec.counted[cfg.min_incidents - 1] + cfg.window_s  # when the N-th latest leaves the window
            rec.suspect_until = until if until > now else None
    return sorted(records.values(), key=lambda r: (not r.suspect, -(r.suspect_until or 0.0), -r.incidents, r.host))


def suspects(records: Iterable[HostRecord]) -> list[HostRecord]:
    return [r for r in records if r.suspect]


def slurm_exclude(records: Iterable[HostRecord]) -> str:
    """`srun --exclude=` takes a comma-separated host list: the suspects, by name."""
    return ",".join(sorted(r.host for r in records if r.suspect))
