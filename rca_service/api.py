"""HTTP API: incidents, live jobs, health and Prometheus metrics (stdlib http.server)."""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

from mycroft.otlp_server import split_host_port

log = logging.getLogger("mycroft.rca.api")


class Backend(Protocol):
    def list_incidents(self, limit: int, job: str | None, status: str | None) -> list[dict[str, Any]]: ...
    def get_incident(self, incident_id: str) -> dict[str, Any] | None: ...
    def jobs(self) -> list[dict[str, Any]]: ...
    def health(self) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...


def _handler(backend: Backend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            log.debug("api: " + format, *args)

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, code: int, value: Any) -> None:
            self._send(code, json.dumps(value, default=str).encode(), "application/json")

        def _error(self, code: int, message: str) -> None:
            self._json(code, {"error": message})

        def do_HEAD(self) -> None:
            self.do_GET()

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            path = url.path.rstrip("/") or "/"
            query = urllib.parse.parse_qs(url.query)
            try:
                self._route(path, query)
            except Exception as exc:  # answer, log, keep serving
                log.exception("API error on %s", self.path)
                self._error(500, f"internal error: {exc}")

        def _route(self, path: str, query: dict[str, list[str]]) -> None:
            if path == "/healthz":
                self._json(200, backend.health())
            elif path == "/metrics":
                self._send(200, backend.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif path == "/api/v1/incidents":
                try:
                    limit = int(query.get("limit", ["100"])[0])
                except ValueError:
                    self._error(400, "limit must be an integer")
                    return
                status = query.get("status", [None])[0]
                if status not in (None, "firing", "resolved"):
                    self._error(400, "status must be firing or resolved")
                    return
                self._json(200, backend.list_incidents(limit, query.get("job", [None])[0], status))
            elif path.startswith("/api/v1/incidents/"):
                incident_id = path.rsplit("/", 1)[1]
                incident = backend.get_incident(incident_id)
                if incident is None:
                    self._error(404, f"no incident {incident_id!r}")
                else:
                    self._json(200, incident)
            elif path == "/api/v1/jobs":
                self._json(200, backend.jobs())
            else:
                self._error(404, "not found; try /api/v1/incidents, /api/v1/jobs, /healthz, /metrics")

        def do_POST(self) -> None:
            self._error(405, "read-only API; send spans to the OTLP ports")

    return Handler


class ApiServer:
    def __init__(self, backend: Backend, address: str) -> None:
        host, port = split_host_port(address)
        self._server = ThreadingHTTPServer((host, port), _handler(backend))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread: threading.Thread | None = None

    def start(self) -> ApiServer:
        self._thread = threading.Thread(target=self._server.serve_forever, name="mycroft-rca-api", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

