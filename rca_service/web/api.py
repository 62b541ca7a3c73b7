"""HTTP API: incidents, live jobs, hosts, directives, health, Prometheus metrics and the OpenAPI
description; and the pages made from them (pages.py): `/incidents/{id}`,
`/incidents/{id}/graph.svg`, `/jobs`, `/hosts`.

Served by mycroft.http_server (bounded, timeouts, optional TLS). With an Authenticator,
everything but /healthz needs `Authorization: Bearer` of a read or admin token (401
without, 403 for an ingest token or a job outside the token's patterns); lists show only
the token's jobs. `/api/v1/directives` is for the ranks: a token that may write a job's
telemetry (ingest) may also read its directives; a request is held (long poll, no thread)
until a directive arrives or `wait` runs out. The routes and their answers are described
in openapi.py.
"""

from __future__ import annotations

import json
import logging
import math
import time
from typing import Any, Protocol

from mycroft.auth import ANONYMOUS_ADMIN, RUN_SEPARATOR, Authenticator, Principal
from mycroft.http_server import HttpError, HttpLimits, HttpServer, LongPoll, Request, Response, TlsFiles
from mycroft.otlp_server import split_host_port

from ..incidents.directives import DirectiveBoard
from ..metrics import CONTENT_TYPE as PROMETHEUS_TYPE
from . import pages
from .openapi import OPENAPI

log = logging.getLogger("mycroft.rca.api")

# connections: a 16k-rank job whose every rank long-polls directives itself (no per-host relay), plus
# the API's readers; an idle held poll is a coroutine and a socket, no thread
API_LIMITS = HttpLimits(max_body_bytes=64 * 1024, max_decoded_bytes=64 * 1024, workers=4,
                        max_connections=16_384 + 1_024)
MAX_LIMIT = 10_000
INCIDENT_QUERY = ("limit", "job", "status")
DIRECTIVES = "/api/v1/directives"
QUERIES = {"/api/v1/incidents": INCIDENT_QUERY, DIRECTIVES: ("job", "run", "after", "wait", "host", "acked"),
           "/api/v1/hosts": ("limit",), "/api/v1/hosts/suspect": ("format",)}


class Backend(Protocol):
    def list_incidents(self, limit: int, job: str | None, status: str | None,
                       principal: Principal = ANONYMOUS_ADMIN) -> list[dict[str, Any]]: ...
    def get_incident(self, incident_id: str) -> dict[str, Any] | None: ...
    def jobs(self, principal: Principal = ANONYMOUS_ADMIN) -> list[dict[str, Any]]: ...
    def health(self) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...
    def hosts(self, principal: Principal = ANONYMOUS_ADMIN) -> list[dict[str, Any]]: ...

    @property
    def directives(self) -> DirectiveBoard: ...
    @property
    def max_directive_wait_s(self) -> float: ...


def _json(code: int, value: Any) -> Response:
    return Response(code, json.dumps(value, default=str).encode())


# pages carry no script and load nothing from elsewhere: say so to the browser too
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:",
                "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}


def _html(text: str) -> Response:
    return Response(200, text.encode(), "text/html; charset=utf-8", dict(PAGE_HEADERS))


def parse_limit(text: str | None) -> int:
    """The ?limit= of a list: an integer, clamped to 1..10000 (400 when not an integer)."""
    if text is None:
        return 100
    try:
        value = int(text)
    except ValueError as exc:
        raise HttpError(400, "limit must be an integer") from exc
    return max(1, min(value, MAX_LIMIT))


class ApiHandler:
    """Routes one request; pure over the backend (no sockets here)."""

    def __init__(self, backend: Backend, auth: Authenticator | None = None) -> None:
        self.backend = backend
        self.auth = auth

    def head(self, request: Request) -> Principal:
        path = request.path.rstrip("/") or "/"
        if request.method not in ("GET", "HEAD"):
            raise HttpError(405, "read-only API; send spans to the OTLP ports", {"Allow": "GET, HEAD"})
        if path == "/healthz" or self.auth is None:
            return ANONYMOUS_ADMIN
        principal = self.auth.header(request.header("Authorization") or None)
        if principal is None:
            raise HttpError(401, "missing or invalid bearer token", {"WWW-Authenticate": 'Bearer realm="mycroft"'})
        if not principal.can_read and not (path == DIRECTIVES and principal.can_ingest):
            raise HttpError(403, f"a {principal.role} token may not read the API")
        return principal

    def __call__(self, request: Request) -> Response | LongPoll:
        principal = request.principal if isinstance(request.principal, Principal) else self.head(request)
        path = request.path.rstrip("/") or "/"
        query = request.query
        allowed = QUERIES.get(path, ())
        unknown = sorted(set(query) - set(allowed))
        if unknown:  # a typo (?limt=5) is an error, not a silently unfiltered answer
            raise HttpError(400, f"unknown query parameter {unknown[0][:64]!r}"
                                 + (f"; this path takes {', '.join(allowed)}" if allowed else ""))
        if path == "/healthz":
            return _json(200, self.backend.health())
        if path == "/metrics":
            return Response(200, self.backend.metrics_text().encode(), PROMETHEUS_TYPE)
        if path == "/api/v1/openapi.json":
            return _json(200, OPENAPI)
        if path == "/api/v1/incidents":
            limit = parse_limit(query.get("limit"))
            status = query.get("status")
            if status not in (None, "firing", "resolved"):
                raise HttpError(400, "status must be firing or resolved")
            job = query.get("job") or None
            if job is not None and not principal.allows_job(job):
                raise HttpError(403, f"this token may not read job {job[:64]!r}")
            return _json(200, self.backend.list_incidents(limit, job, status, principal))
        if path.startswith("/api/v1/incidents/"):
            return _json(200, self._incident(path.rsplit("/", 1)[1], principal))
        if path == "/api/v1/jobs":
            return _json(200, self.backend.jobs(principal))
        if path == DIRECTIVES:
            return self._directives(request, principal)
        if path == "/api/v1/hosts":
            return _json(200, self.backend.hosts(principal)[: parse_limit(query.get("limit"))])
        if path == "/api/v1/hosts/suspect":
            form = query.get("format", "json")
            if form not in ("json", "slurm"):
                raise HttpError(400, "format must be json or slurm")
            suspects = [h for h in self.backend.hosts(principal) if h.get("suspect")]
            if form == "slurm":  # one line for `srun --exclude=$(curl ...)`
                return Response(200, (",".join(sorted(str(h["host"]) for h in suspects)) + "\n").encode(),
                                "text/plain; charset=utf-8")
            return _json(200, suspects)
        if path == "/hosts":
            return _html(pages.hosts_page(self.backend.hosts(principal), time.time()))
        if path.startswith("/incidents/"):
            rest = path.removeprefix("/incidents/")
            if rest.endswith("/graph.svg"):
                incident = self._incident(rest.removesuffix("/graph.svg"), principal)
                return Response(200, pages.standalone_graph_svg(incident).encode(), "image/svg+xml",
                                dict(PAGE_HEADERS))
            if "/" not in rest:
                return _html(pages.incident_page(self._incident(rest, principal)))
        if path in ("/jobs", "/"):
            return _html(pages.jobs_page(self.backend.jobs(principal),
                                         self.backend.list_incidents(50, None, None, principal)))
        raise HttpError(404, "not found; try /jobs, /hosts, /incidents/{id}, /api/v1/incidents, /api/v1/jobs, "
                             "/api/v1/hosts, /api/v1/openapi.json, /healthz, /metrics")

    def _directives(self, request: Request, principal: Principal) -> Response | LongPoll:
        """The next directive of a job after `after`, now or when one is published within `wait` s (204: none)."""
        query = request.query
        job = query.get("job") or ""
        if not job:
            raise HttpError(400, "job is required (the job id the ranks report, mycroft.job.id)")
        if not principal.allows_job(job):
            raise HttpError(403, f"this token may not read job {job[:64]!r}")
        base, _, run_in_key = job.partition(RUN_SEPARATOR)
        run = query.get("run") or run_in_key or None
        try:
            after = int(query.get("after", "0"))
            wait = float(query.get("wait", "0"))
            acked = int(query["acked"]) if query.get("acked") else None
        except ValueError as exc:
            raise HttpError(400, "after and acked must be integers, wait a number of seconds") from exc
        if after < 0 or not math.isfinite(wait) or wait < 0 or (acked is not None and acked < 0):
            raise HttpError(400, "after, acked and wait must be >= 0")
        wait = min(wait, self.backend.max_directive_wait_s)
        board = self.backend.directives
        who = (query.get("host") or request.peer or "?")[:256]
        board.note_poll(base, who, time.time())
        if acked:
            board.note_ack(base, acked, who)

        def ready() -> Response | None:
            found = board.next(base, run, after, time.time())
            return None if found is None else _json(200, found)

        answer = ready()
        if answer is not None or wait <= 0:
            return answer or Response(204, b"")
        return LongPoll(ready, lambda wake: board.subscribe(base, wake), wait, Response(204, b""))

    def _incident(self, incident_id: str, principal: Principal) -> dict[str, Any]:
        incident = self.backend.get_incident(incident_id)
        if incident is None:
            raise HttpError(404, f"no incident {incident_id[:64]!r}")
        if not principal.allows_job(str(incident.get("job", ""))):
            raise HttpError(403, "this token may not read that incident's job")
        return incident


class ApiServer:
    def __init__(self, backend: Backend, address: str, auth: Authenticator | None = None,
                 tls: TlsFiles | None = None, limits: HttpLimits = API_LIMITS) -> None:
        host, port = split_host_port(address)
        handler = ApiHandler(backend, auth)
        self._server = HttpServer(handler, host, port, limits, tls, "mycroft-rca-api", head_check=handler.head,
                                  inline=lambda request: request.path == DIRECTIVES)  # no thread hop per poll
        self.port = self._server.port

    def start(self) -> ApiServer:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()
