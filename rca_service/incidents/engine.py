"""The analysis engine: job states + incident tracker, stepped by the caller's clock.

No threads, sockets or files: the live service drives it with wall-clock time and the
offline analyzer drives it with span time, so both reach the same verdicts.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from mycroft.otlp import SpanRecord

from ..analysis.findings import HANG, RC_NOT_ENTERED
from ..analysis.pauses import learn
from ..analysis.triggers import spoke_at, statuses
from ..analysis.verdict import analyze_job
from ..config import AnalysisConfig
from ..ingest.state import JobState, apply_records, expire_jobs
from .tracker import Event, Incident, IncidentTracker


@dataclass(slots=True)
class PassStats:
    jobs: int = 0
    seconds: float = 0.0
    max_job_seconds: float = 0.0
    slowest_job: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


class Engine:
    def __init__(self, cfg: AnalysisConfig | None = None, firing: list[Incident] | None = None) -> None:
        self.cfg = cfg or AnalysisConfig()
        self.jobs: dict[str, JobState] = {}
        self.tracker = IncidentTracker(self.cfg.resolve_after_s, firing, self.cfg.consequence_window_s)
        self.last_pass = PassStats()
        self._evicted: list[str] = []  # jobs dropped by the job cap since the last step

    def ingest(self, records: Iterable[SpanRecord], received_at: float, *, use_span_time: bool = False,
               rejected: dict[str, int] | None = None) -> int:
        """Fold records in; refusals are counted by reason into `rejected` (admission.py)."""
        return apply_records(self.jobs, records, received_at, self.cfg, use_span_time=use_span_time,
                             rejected=rejected, evicted=self._evicted)

    def step(self, now: float) -> list[Event]:
        """One analysis pass over every job."""
        events: list[Event] = []
        started = time.perf_counter()
        stats = PassStats()
        for job_id in expire_jobs(self.jobs, now, self.cfg):
            events.extend(self.tracker.resolve_job(job_id, now, "job expired"))
        evicted, self._evicted = self._evicted, []
        for job_id in dict.fromkeys(evicted):  # its state is gone: nothing could ever resolve its incidents
            if job_id not in self.jobs:
                events.extend(self.tracker.resolve_job(job_id, now, "job evicted to stay under max_jobs (stale)"))
        # incidents loaded at start-up for jobs that never report again
        orphans = {inc.job for inc in self.tracker.active.values()
                   if inc.job not in self.jobs and now - inc.last_seen_at > self.cfg.job_ttl_s}
        for job_id in sorted(orphans):
            events.extend(self.tracker.resolve_job(job_id, now, "job gone (no telemetry since restart)"))
        for job_id, job in list(self.jobs.items()):
            t0 = time.perf_counter()
            findings = analyze_job(job, now, self.cfg)
            job_events = self.tracker.observe(job_id, findings, now)
            for event in job_events:
                if event.action == "resolved":
                    self._learn_pause(job, event.incident)
                else:
                    note_hosts(event.incident, job)
            events.extend(job_events)
            took = time.perf_counter() - t0
            if took > stats.max_job_seconds:
                stats.max_job_seconds, stats.slowest_job = took, job_id
        stats.jobs = len(self.jobs)
        stats.seconds = time.perf_counter() - started
        self.last_pass = stats
        return events

    def _learn_pause(self, job: JobState, incident: Incident) -> None:
        """A hang that cleared on its own, held by ranks alive elsewhere, was a pause: remember it."""
        if incident.kind != HANG or incident.consequence_of or not incident.root_causes:
            return
        if any(c.get("kind") != RC_NOT_ENTERED for c in incident.root_causes):
            return
        if incident.evidence.get("resolved_because") != "condition cleared" or \
                job.last_progress_at <= incident.detected_at:
            return  # torn down, not resumed
        held = max(0.0, incident.last_seen_at - incident.detected_at) + float(
            incident.evidence.get("threshold_s", 0.0) or 0.0)
        for cause in incident.root_causes:
            stack = str(cause.get("evidence", {}).get("stack", ""))
            rank = job.ranks.get(cause.get("rank", -1))
            if rank is not None and not rank.final:
                learn(job.pauses, rank.rank, stack, held)

    def jobs_summary(self, now: float) -> list[dict[str, Any]]:
        """Live view for GET /api/v1/jobs: ranks, groups and progress per job."""
        out = []
        for job in self.jobs.values():
            status = statuses(job, now, self.cfg)
            counts: dict[str, int] = {}
            for s in status.values():
                counts[s] = counts.get(s, 0) + 1
            groups = []
            for group in list(job.groups.values())[:256]:
                issued = [job.ranks[r].issued.get(group.group_id, 0) for r in group.ranks if r in job.ranks]
                completed = [job.ranks[r].completed.get(group.group_id, 0) for r in group.ranks if r in job.ranks]
                groups.append({
                    "id": group.group_id, "name": group.name, "size": group.size,
                    "issued_min": min(issued, default=0), "issued_max": max(issued, default=0),
                    "completed_min": min(completed, default=0), "completed_max": max(completed, default=0),
                })
            ranks = []
            for rank in list(job.ranks.values())[:1024]:
                spoke = spoke_at(job, rank) or rank.last_seen
                ranks.append({
                    "rank": rank.rank, "status": status.get(rank.rank), "host": rank.host, "pid": rank.pid,
                    "heartbeat": rank.heartbeat_number, "silent_s": round(max(0.0, now - spoke), 3),
                    "idle_s": round(rank.idle_at(now), 3), "exit_reason": rank.exit_reason or None,
                    "in_flight": [{"group_id": op.group_id, "seq": op.seq, "op": op.op, "peer": op.peer,
                                   "age_s": round(op.age_at(now), 3)} for op in rank.inflight],
                })
            # a multi-node launch's torchrun agents (one per node) while they waited for each other
            agents = [{"host": a.host, "pid": a.pid, "node_rank": a.node_rank if a.node_rank >= 0 else None,
                       "backend": a.backend, "nodes_min": a.nodes_min, "nodes_max": a.nodes_max,
                       "nodes_joined": a.joined if a.joined >= 0 else None, "done": a.done,
                       "waited_s": round(a.phase_s + (0.0 if a.done else max(0.0, now - a.last_at)), 3)}
                      for a in list(job.agents.values())[:1024]]
            out.append({
                "job": job.job_id, "world_size": job.world_size, "ranks_seen": len(job.ranks),
                "status_counts": counts, "spans": job.spans, "heartbeats": job.heartbeats,
                "completions": job.completions,
                "seconds_since_progress": round(max(0.0, now - job.last_progress_at), 3),
                "groups": groups, "ranks": ranks, "agents": agents,
            })
        return out


def note_hosts(incident: Incident, job: JobState, limit: int = 256) -> None:
    """Record the host of each root-cause rank while the job's state still knows it (ranks of a
    dead host stop reporting and their state expires; the incident is what is remembered)."""
    for cause in incident.root_causes[:limit]:
        rank = cause.get("rank")
        state = job.ranks.get(rank) if isinstance(rank, int) else None
        if state is not None and state.host and str(rank) not in incident.root_cause_hosts:
            incident.root_cause_hosts[str(rank)] = state.host
