"""Incident persistence (SQLite) and the alert outbox.

Incidents are written on every event, so a restart loses none; firing ones are loaded
back into the tracker, so resolved incidents are never fired again and open ones are
not duplicated. Alert deliveries go through an outbox table: a notification accepted
before a crash is still delivered after the restart.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mycroft.auth import RUN_SEPARATOR

from .incidents import FIRING, Incident

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
    def save(self, incident: Incident) -> None:
        doc = json.dumps(incident.to_dict(), default=str)
        with self._lock:
            self._db.execute(
                "INSERT INTO incidents(id, job, kind, status, detected_at, updated_at, doc) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO UPDATE SET status=excluded.status, "
                "updated_at=excluded.updated_at, doc=excluded.doc",
                (incident.id, incident.job, incident.kind, incident.status, incident.detected_at,
                 incident.updated_at, doc))

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
