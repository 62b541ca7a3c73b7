"""A webhook receiver for the harness: records when each alert arrived and what it said.

The RCA service pages through webhooks (Alertmanager's format); the harness hands it this
receiver's URL and measures alert latency from the fault's onset to the POST's arrival,
the way an on-call engineer would experience it.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookReceiver:
    """HTTP server on 127.0.0.1 (a free port); `posts` holds (arrival unix s, JSON body)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.posts: list[tuple[float, dict[str, Any]]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                arrived = time.time()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    doc = json.loads(body or b"{}")
                except ValueError:
                    doc = {"unparsed": body.decode(errors="replace")}
                with receiver._lock:
                    receiver.posts.append((arrived, doc if isinstance(doc, dict) else {"body": doc}))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer((host, 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://{host}:{self._server.server_address[1]}/alerts"
        self._thread = threading.Thread(target=self._server.serve_forever, name="mycroft-webhook", daemon=True)

    def start(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def snapshot(self) -> list[tuple[float, dict[str, Any]]]:
        with self._lock:
            return list(self.posts)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
