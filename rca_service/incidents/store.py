"""Incident persistence (SQLite), the alert outbox, the action outbox and the fleet memory.

Incidents are written on every event, so a restart loses none; firing ones are loaded
back into the tracker, so resolved incidents are never fired again and open ones are
not duplicated. Alert deliveries go through an outbox table: a notification accepted
before a crash is still delivered after the restart. Actions (actions.py) are written as
owed in the same transaction as the incident event that decided them, and each (incident,
action, target) once: a restart runs what is owed and never what is done. Directives
(abort_job) are written in the transaction that marks their action done. Each incident
also leaves one row per root-cause host (hosts.py), and the service notes which hosts ran
which jobs: the fleet memory outlives the jobs.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mycroft.auth import RUN_SEPARATOR

from .action_policy import COUNTED, EXEC, OWED, PUBLISHED, RUNNING, PlannedAction, Recent, base_job
from .hosts import HostAction, HostIncident, HostSeen, host_rows
from .tracker import FIRING, Incident, rfc3339

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY,
    job TEXT NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    detected_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    doc TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incidents_detected ON incidents(detected_at DESC);
CREATE INDEX IF NOT EXISTS incidents_status ON incidents(status);
CREATE TABLE IF NOT EXISTS actions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    incident TEXT NOT NULL,
    job TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    host TEXT NOT NULL,
    mode TEXT NOT NULL,
    rule TEXT NOT NULL,
    params TEXT NOT NULL,
    result TEXT NOT NULL,
    detail TEXT NOT NULL,
    decided_at REAL NOT NULL,
    due_at REAL NOT NULL,
    at REAL NOT NULL,
    UNIQUE(incident, action, target)
);
CREATE INDEX IF NOT EXISTS actions_result ON actions(result, due_at);
CREATE INDEX IF NOT EXISTS actions_decided ON actions(decided_at);
CREATE TABLE IF NOT EXISTS directives (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    job TEXT NOT NULL,
    run TEXT NOT NULL,
    incident TEXT NOT NULL,
    action TEXT NOT NULL,
    reason TEXT NOT NULL,
    exit_code INTEGER NOT NULL,
    issued_at REAL NOT NULL,
    expires_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS host_incidents (
    incident TEXT NOT NULL,
    host TEXT NOT NULL,
    job TEXT NOT NULL,
    kind TEXT NOT NULL,
    cause_kind TEXT NOT NULL,
    severity TEXT NOT NULL,
    at REAL NOT NULL,
    consequence INTEGER NOT NULL,
    PRIMARY KEY (incident, host)
);
CREATE INDEX IF NOT EXISTS host_incidents_at ON host_incidents(at);
CREATE TABLE IF NOT EXISTS hosts_seen (
    host TEXT NOT NULL,
    job TEXT NOT NULL,
    first_seen REAL NOT NULL,
    last_seen REAL NOT NULL,
    PRIMARY KEY (host, job)
);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    target TEXT NOT NULL,
    payload TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL,
    last_error TEXT NOT NULL DEFAULT ''
);
"""


@dataclass(slots=True)
class OutboxItem:
    seq: int
    target: str
    payload: dict[str, Any]
    attempts: int


class Store:
    """Thread-safe SQLite store; ":memory:" works for tests."""

    def __init__(self, path: str | Path) -> None:
        if str(path) != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------------ incidents
    def save(self, incident: Incident, actions: Sequence[PlannedAction] = ()) -> None:
        """The incident, its fleet-memory rows and the actions decided on this event: one transaction."""
        record = incident.to_dict()
        doc = json.dumps(record, default=str)
        rows = host_rows(record)
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO incidents(id, job, kind, status, detected_at, updated_at, doc) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET status=excluded.status, "
                    "updated_at=excluded.updated_at, doc=excluded.doc",
                    (incident.id, incident.job, incident.kind, incident.status, incident.detected_at,
                     incident.updated_at, doc))
                self._db.executemany(
                    "INSERT OR REPLACE INTO host_incidents(incident, host, job, kind, cause_kind, severity, at, "
                    "consequence) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [(r.incident, r.host, r.job, r.kind, r.cause_kind, r.severity, r.at, int(r.consequence))
                     for r in rows])
                self._db.executemany(
                    "INSERT OR IGNORE INTO actions(incident, job, action, target, host, mode, rule, params, result, "
                    "detail, decided_at, due_at, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(a.incident, a.job, a.action, a.target, a.host, a.mode, a.rule, json.dumps(a.params),
                      a.result, a.detail[:2000], a.decided_at, a.due_at, a.decided_at) for a in actions])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def get(self, incident_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT doc FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def list_incidents(self, limit: int = 100, job: str | None = None, status: str | None = None,
                       job_allowed: Callable[[str], bool] | None = None) -> list[dict[str, Any]]:
        """Newest first. `job` also matches its other runs ("JOB#RUN"); `job_allowed` (a
        token's job patterns) filters in the query, so the limit counts only what is shown."""
        query = "SELECT doc FROM incidents"
        clauses: list[str] = []
        args: list[Any] = []
        if job:
            clauses.append("(job = ? OR substr(job, 1, ?) = ?)")
            args += [job, len(job) + 1, job + RUN_SEPARATOR]
        if job_allowed is not None:
            clauses.append("mycroft_job_allowed(job)")
        if status:
            clauses.append("status = ?")
            args.append(status)
        if clauses:
            query += " WHERE " + " AND ".join(clauses)
        query += " ORDER BY detected_at DESC, rowid DESC LIMIT ?"
        args.append(str(max(1, min(limit, 10000))))
        with self._lock:
            if job_allowed is not None:
                self._db.create_function("mycroft_job_allowed", 1, lambda j: bool(job_allowed(str(j))),
                                         deterministic=True)
            rows = self._db.execute(query, args).fetchall()
        return [json.loads(row[0]) for row in rows]

    def firing(self) -> list[Incident]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM incidents WHERE status = ?", (FIRING,)).fetchall()
        return [Incident.from_dict(json.loads(row[0])) for row in rows]

    def count(self) -> dict[str, int]:
        with self._lock:
            rows = self._db.execute("SELECT status, COUNT(*) FROM incidents GROUP BY status").fetchall()
        return {status: n for status, n in rows}

    # ------------------------------------------------------------------ outbox
    def enqueue(self, target: str, payload: dict[str, Any], now: float | None = None) -> None:
        with self._lock:
            self._db.execute("INSERT INTO outbox(target, payload, next_at) VALUES (?, ?, ?)",
                             (target, json.dumps(payload), now if now is not None else time.time()))

    def due(self, now: float, limit: int = 64) -> list[OutboxItem]:
        with self._lock:
            rows = self._db.execute(
                "SELECT seq, target, payload, attempts FROM outbox WHERE next_at <= ? ORDER BY seq LIMIT ?",
                (now, limit)).fetchall()
        return [OutboxItem(seq, target, json.loads(payload), attempts) for seq, target, payload, attempts in rows]

    def done(self, seq: int) -> None:
        with self._lock:
            self._db.execute("DELETE FROM outbox WHERE seq = ?", (seq,))

    def retry_later(self, seq: int, next_at: float, error: str) -> None:
        with self._lock:
            self._db.execute("UPDATE outbox SET attempts = attempts + 1, next_at = ?, last_error = ? WHERE seq = ?",
                             (next_at, error[:500], seq))

    def outbox_size(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    # ------------------------------------------------------------------ actions
    def actions_of(self, incident_ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
        """The audit records of these incidents' actions, in the order they were decided."""
        ids = list(dict.fromkeys(incident_ids))
        out: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
        with self._lock:
            for start in range(0, len(ids), 500):
                chunk = ids[start:start + 500]
                rows = self._db.execute(
                    f"SELECT {_ACTION_COLUMNS} FROM actions WHERE incident IN ({','.join('?' * len(chunk))}) "
                    "ORDER BY id", chunk).fetchall()
                for row in rows:
                    action = ActionRow(*row)
                    out[action.incident].append(action.to_dict())
        return out

    def action_history(self, incident_id: str, since: float) -> tuple[frozenset[tuple[str, str]], list[Recent]]:
        """(this incident's recorded (action, target) pairs, every counted action decided since `since`)."""
        with self._lock:
            mine = self._db.execute("SELECT action, target FROM actions WHERE incident = ?", (incident_id,)).fetchall()
            rows = self._db.execute(
                f"SELECT decided_at, job, action, host FROM actions WHERE decided_at >= ? AND result IN "
                f"({','.join('?' * len(COUNTED))})", (since, *sorted(COUNTED))).fetchall()
        return frozenset((a, t) for a, t in mine), [Recent(at, base_job(job), a, h) for at, job, a, h in rows]

    def due_actions(self, now: float, limit: int = 16) -> list[ActionRow]:
        with self._lock:
            rows = self._db.execute(f"SELECT {_ACTION_COLUMNS} FROM actions WHERE result = ? AND due_at <= ? "
                                    "ORDER BY due_at, id LIMIT ?", (OWED, now, limit)).fetchall()
        return [ActionRow(*row) for row in rows]

    def published_aborts(self) -> list[tuple[ActionRow, int]]:
        """Abort actions published and not yet acknowledged (result PUBLISHED), each with its directive's seq:
        after a restart the runner waits for their acknowledgment again."""
        with self._lock:
            rows = self._db.execute(
                f"SELECT {', '.join('a.' + c.strip() for c in _ACTION_COLUMNS.split(','))}, MAX(d.seq) "
                "FROM actions a JOIN directives d ON d.incident = a.incident AND d.job = a.job "
                "WHERE a.result = ? GROUP BY a.id", (PUBLISHED,)).fetchall()
        return [(ActionRow(*row[:-1]), int(row[-1])) for row in rows]

    def next_due_at(self) -> float | None:
        with self._lock:
            row = self._db.execute("SELECT MIN(due_at) FROM actions WHERE result = ?", (OWED,)).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def set_action(self, action_id: int, result: str, detail: str, at: float, expect: str | None = None) -> bool:
        """Record an action's result (only if it is still `expect`, when given); True when written."""
        query = "UPDATE actions SET result = ?, detail = ?, at = ? WHERE id = ?"
        args: list[Any] = [result, detail[:2000], at, action_id]
        if expect is not None:
            query += " AND result = ?"
            args.append(expect)
        with self._lock:
            return self._db.execute(query, args).rowcount == 1

    def finish_with_directive(self, row: ActionRow, directive: dict[str, Any], result: str, detail: str,
                              at: float) -> int:
        """Publish a directive and mark its action done in one transaction; returns its seq."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                cursor = self._db.execute(
                    "INSERT INTO directives(job, run, incident, action, reason, exit_code, issued_at, expires_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (directive["job"], directive["run"], directive["incident"], directive["action"],
                     directive["reason"], directive["exit_code"], directive["issued_at_unix"],
                     directive["expires_at_unix"]))
                seq = int(cursor.lastrowid or 0)
                self._db.execute("UPDATE actions SET result = ?, detail = ?, at = ? WHERE id = ?",
                                 (result, detail.replace("{seq}", str(seq))[:2000], at, row.id))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return seq

    def recover_actions(self, now: float) -> tuple[int, int]:
        """After a restart: actions that were running are owed again, except exec (a user command
        may not be idempotent: it is recorded as interrupted, never run twice). (owed again, interrupted)"""
        with self._lock:
            interrupted = self._db.execute(
                "UPDATE actions SET result = 'interrupted', detail = 'the service stopped while it ran: not run "
                "again (it may or may not have completed)', at = ? WHERE result = ? AND action = ?",
                (now, RUNNING, EXEC)).rowcount
            again = self._db.execute("UPDATE actions SET result = ?, detail = detail || ' (run again after a "
                                     "restart)' WHERE result = ?", (OWED, RUNNING)).rowcount
        return again, interrupted

    def directives(self, live_at: float) -> list[dict[str, Any]]:
        """Every directive not expired at `live_at`, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT seq, job, run, incident, action, reason, exit_code, issued_at, expires_at "
                                    "FROM directives WHERE expires_at > ? ORDER BY seq", (live_at,)).fetchall()
        return [directive_dict(*row) for row in rows]

    def action_counts(self) -> dict[tuple[str, str], int]:
        with self._lock:
            rows = self._db.execute("SELECT action, result, COUNT(*) FROM actions GROUP BY action, result").fetchall()
        return {(a, r): int(n) for a, r, n in rows}

    # ------------------------------------------------------------------ fleet memory
    def note_hosts_seen(self, seen: Iterable[tuple[str, str, float, float]]) -> None:
        """(host, job, first seen, last seen) of live jobs' ranks."""
        with self._lock:
            self._db.executemany(
                "INSERT INTO hosts_seen(host, job, first_seen, last_seen) VALUES (?, ?, ?, ?) ON CONFLICT(host, job) "
                "DO UPDATE SET first_seen = MIN(first_seen, excluded.first_seen), "
                "last_seen = MAX(last_seen, excluded.last_seen)", list(seen))

    def fleet(self, since: float) -> tuple[list[HostSeen], list[HostIncident], list[HostAction]]:
        """What the fleet memory holds since `since`: hosts seen, root-cause rows, node actions."""
        with self._lock:
            seen = self._db.execute("SELECT host, job, first_seen, last_seen FROM hosts_seen WHERE last_seen >= ?",
                                    (since,)).fetchall()
            incidents = self._db.execute(
                "SELECT incident, host, job, kind, cause_kind, severity, at, consequence FROM host_incidents "
                "WHERE at >= ?", (since,)).fetchall()
            actions = self._db.execute("SELECT host, action, mode, result, at, incident FROM actions "
                                       "WHERE host != '' AND decided_at >= ?", (since,)).fetchall()
        return ([HostSeen(*r) for r in seen],
                [HostIncident(i, h, j, k, c, s, at, bool(q)) for i, h, j, k, c, s, at, q in incidents],
                [HostAction(*r) for r in actions])

    def prune_fleet(self, before: float) -> None:
        with self._lock:
            self._db.execute("DELETE FROM hosts_seen WHERE last_seen < ?", (before,))
            self._db.execute("DELETE FROM host_incidents WHERE at < ?", (before,))
            self._db.execute("DELETE FROM directives WHERE expires_at < ?", (before,))


_ACTION_COLUMNS = "id, incident, job, action, target, host, mode, rule, params, result, detail, decided_at, due_at, at"


@dataclass(slots=True)
class ActionRow:
    id: int
    incident: str
    job: str
    action: str
    target: str
    host: str
    mode: str
    rule: str
    params_json: str
    result: str
    detail: str
    decided_at: float
    due_at: float
    at: float

    @property
    def params(self) -> dict[str, Any]:
        value = json.loads(self.params_json)
        return value if isinstance(value, dict) else {}

    def to_dict(self) -> dict[str, Any]:
        """The audit record, as GET /api/v1/incidents/{id} shows it."""
        return {"action": self.action, "mode": self.mode, "target": self.target, "at": rfc3339(self.at),
                "result": self.result, "detail": self.detail, "rule": self.rule, "host": self.host or None,
                "decided_at": rfc3339(self.decided_at), "at_unix": self.at, "due_at_unix": self.due_at}


def directive_dict(seq: int, job: str, run: str, incident: str, action: str, reason: str, exit_code: int,
                   issued_at: float, expires_at: float) -> dict[str, Any]:
    """A directive as GET /api/v1/directives answers it."""
    return {"seq": int(seq), "job": job, "run": run or None, "action": action, "incident": incident,
            "reason": reason, "exit_code": int(exit_code), "issued_at": rfc3339(issued_at),
            "issued_at_unix": issued_at, "expires_at_unix": expires_at}
