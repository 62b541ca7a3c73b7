"""The HTTP stack's long poll: a handler answers LongPoll, the server holds the request on its
event loop (no worker thread) until another thread wakes it with an answer, or its time is up;
a client that goes away is let go within HOLD_CHECK_S."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest

from mycroft.http_server import HttpLimits, HttpServer, LongPoll, Request, Response


class Board:
    def __init__(self) -> None:
        self.value: bytes | None = None
        self.waiters: set[Callable[[], None]] = set()
        self.lock = threading.Lock()

    def publish(self, value: bytes) -> None:
        self.value = value
        with self.lock:
            waiters = list(self.waiters)
        for wake in waiters:
            wake()

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        with self.lock:
            self.waiters.add(wake)
        return lambda: self.waiters.discard(wake)


@pytest.fixture
def served() -> Iterator[tuple[str, Board, HttpServer]]:
    board = Board()

    def handler(request: Request) -> Response | LongPoll:
        def ready() -> Response | None:
            return None if board.value is None else Response(200, board.value)

        return ready() or LongPoll(ready, board.subscribe, float(request.query.get("wait", "5")), Response(204))

    server = HttpServer(handler, "127.0.0.1", 0, HttpLimits(workers=1), inline=lambda r: r.path == "/inline").start()
    yield f"http://127.0.0.1:{server.port}", board, server
    server.stop()


def _get(url: str) -> tuple[int, bytes, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=30) as response:
        return int(response.status), response.read(), time.monotonic() - started


@pytest.mark.parametrize("path", ["/held", "/inline"])
def test_held_polls_answer_when_woken_without_holding_a_worker(served: tuple[str, Board, HttpServer],
                                                             path: str) -> None:
    base, board, _ = served
    got: list[tuple[int, bytes, float]] = []
    threads = [threading.Thread(target=lambda: got.append(_get(f"{base}{path}?wait=10"))) for _ in range(20)]
    for thread in threads:  # 20 held polls on a server with one worker thread
        thread.start()
    deadline = time.monotonic() + 10
    while len(board.waiters) < 20 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(board.waiters) == 20
    board.publish(b'{"go": 1}')
    for thread in threads:
        thread.join(10)
    assert [(code, body) for code, body, _ in got] == [(200, b'{"go": 1}')] * 20
    assert max(took for _, _, took in got) < 5.0 and not board.waiters


def test_a_poll_times_out_with_its_answer(served: tuple[str, Board, HttpServer]) -> None:
    base, board, _ = served
    code, body, took = _get(f"{base}/held?wait=0.4")
    assert code == 204 and body == b"" and 0.35 <= took < 3.0 and not board.waiters


def test_a_client_that_leaves_is_let_go(served: tuple[str, Board, HttpServer]) -> None:
    base, board, server = served
    server.HOLD_CHECK_S = 0.3
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /held?wait=30 HTTP/1.1\r\nHost: x\r\n\r\n")
        deadline = time.monotonic() + 5
        while not board.waiters and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(board.waiters) == 1
    deadline = time.monotonic() + 5
    while board.waiters and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not board.waiters  # released long before its 30 s
