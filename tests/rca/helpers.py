"""Small servers the RCA tests talk to: a recording webhook receiver and an RCA service fixture."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class WebhookReceiver:
    """Records POSTs; answers the first `fail_first` with 503 to exercise retries."""

    def __init__(self, fail_first: int = 0) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        self.attempts = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.attempts += 1
                code = 503 if outer.attempts <= outer.fail_first else 200
                if code == 200:
                    outer.requests.append(({k: v for k, v in self.headers.items()}, body))
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def payloads(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.requests]

    def wait(self, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.requests) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.payloads()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def http(url: str, body: bytes | None = None, headers: dict[str, str] | None = None,
         method: str | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as exc:
        return int(exc.code), bytes(exc.read())


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())
