"""The one HTTP stack of every Mycroft service (OTLP/HTTP receivers, the RCA API, metrics).

Built on aiohttp's server (aio-libs; strict llhttp request parser, asyncio connections,
TLS through the standard ssl module) instead of http.server's thread per connection:
an idle or half-open connection costs a few KB and no thread, and is closed after
`idle_timeout_s`. What aiohttp does not bound, this module does, before any byte
reaches a handler:

- connections: at most `max_connections` at once; the next one gets a 503 and is closed;
- request head: aiohttp's parser (line and header-field sizes, Content-Length syntax:
  `abc` or `-5` is a 400) and the idle timeout (a head not finished in time closes it);
- body: a declared Content-Length over `max_body_bytes` is a 413 at once, a body that
  does not arrive within `body_timeout_s` is a 408, a chunked one is cut at the cap;
- concurrency: `workers` threads run the (blocking) handlers, and only that many
  request bodies are held in memory at once; the others wait before they are read.

Handlers are plain functions `Request -> Response`, so the services stay synchronous. A
handler may instead answer a `LongPoll`: the request is then held on the event loop (no
thread, a few KB) until the answer is ready or its time is up, for endpoints that thousands
of clients wait on at once (the RCA service's directives).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import zlib
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDictProxy

from mycroft.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
_errors = RateLimitedLog(log, every_s=10.0)


class _OncePerInterval(logging.Filter):
    """aiohttp logs a traceback per malformed request; keep one line per 10 s, no traceback."""

    def __init__(self, every_s: float = 10.0) -> None:
        super().__init__()
        self._limit = RateLimitedLog(log, every_s)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING:
            reason = record.exc_info[1] if record.exc_info else None
            self._limit.warning("aiohttp", "HTTP: %s%s", record.getMessage(),
                                f": {str(reason).strip().splitlines()[0] if str(reason).strip() else reason!r}"
                                if reason is not None else "")
            return False
        return True


_parser_log = logging.getLogger("mycroft.http_server.aiohttp")
_parser_log.addFilter(_OncePerInterval())

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Bounds on what one HTTP server accepts (defaults sized for OTLP batches of ranks)."""

    max_body_bytes: int = 16 * MiB  # on the wire (the OTel collector's default is 20 MiB)
    max_decoded_bytes: int = 32 * MiB  # after Content-Encoding: a gzip bomb stops here (413)
    idle_timeout_s: float = 10.0  # a connection without a complete request head for this long is closed
    body_timeout_s: float = 15.0  # the whole body must arrive within this (else 408)
    max_connections: int = 1024
    workers: int = 8  # handler threads; also the number of bodies held at once
    json_max_depth: int = 64
    tls_handshake_timeout_s: float = 10.0


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM paths: the server's certificate chain and key, and optionally a CA for client certs (mTLS)."""

    cert: str
    key: str
    client_ca: str | None = None

    def server_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        if self.client_ca:
            context.load_verify_locations(cafile=self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def read(self) -> tuple[bytes, bytes, bytes | None]:
        """(cert, key, client CA) bytes, for gRPC's credentials."""
        with open(self.cert, "rb") as f:
            cert = f.read()
        with open(self.key, "rb") as f:
            key = f.read()
        ca = None
        if self.client_ca:
            with open(self.client_ca, "rb") as f:
                ca = f.read()
        return cert, key, ca


@dataclass(slots=True)
class Request:
    method: str
    path: str
    query: Mapping[str, str]
    headers: CIMultiDictProxy[str]
    body: bytes = b""
    peer: str = ""
    principal: Any = None  # what the head check returned (the authenticated caller)

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name, default)


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(slots=True)
class LongPoll:
    """An answer that is not ready yet. The server subscribes `wake` (any thread may call it when
    the answer may have changed; `subscribe` returns the function that unsubscribes), then
    calls `ready()` on its event loop (it must not block) at once and after every wake, and
    answers what it returns, or `on_timeout` once `timeout_s` has passed."""

    ready: Callable[[], Response | None]
    subscribe: Callable[[Callable[[], None]], Callable[[], None]]
    timeout_s: float
    on_timeout: Response


Handler = Callable[[Request], "Response | LongPoll"]
HeadCheck = Callable[[Request], Any]  # runs before the body is read; raises HttpError to refuse


class HttpError(Exception):
    """Raised by handlers (or helpers) for a clean error reply."""

    def __init__(self, status: int, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = dict(headers or {})


def json_error(status: int, message: str, headers: Mapping[str, str] | None = None) -> Response:
    import json

    return Response(status, json.dumps({"error": message}).encode(), headers=dict(headers or {}))


def decode_content(body: bytes, encoding: str, limit: int) -> bytes:
    """Undo Content-Encoding with a cap on the decoded size (HttpError 413 past it, 400 if corrupt)."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding == "gzip":
        decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
    elif encoding == "deflate":
        decoder = zlib.decompressobj()
    else:
        raise HttpError(415, f"unsupported Content-Encoding {encoding!r} (gzip, deflate or identity)")
    out = bytearray()
    data = body
    try:
        while data:
            out += decoder.decompress(data, limit + 1 - len(out))
            if len(out) > limit:
                raise HttpError(413, f"decoded body over {limit} bytes")
            data = decoder.unconsumed_tail
            if decoder.eof:
                break
        if not decoder.eof:
            out += decoder.flush()
            if len(out) > limit:
                raise HttpError(413, f"decoded body over {limit} bytes")
            if not decoder.eof:
                raise HttpError(400, f"truncated {encoding} body")
    except zlib.error as exc:
        raise HttpError(400, f"corrupt {encoding} body: {exc}") from exc
    return bytes(out)


_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Type: application/json\r\n"
            b"Content-Length: 40\r\n\r\n{\"error\": \"too many connections; retry\"}")


class _Refuse(asyncio.Protocol):
    """A connection over the cap: told so, then closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_REFUSAL)
        transport.close()


class HttpServer:
    """Serves `handler` on HOST:PORT (optionally TLS) from its own event-loop thread."""

    def __init__(self, handler: Handler, host: str, port: int, limits: HttpLimits | None = None,
                 tls: TlsFiles | None = None, name: str = "mycroft-http",
                 head_check: HeadCheck | None = None,
                 on_connection_refused: Callable[[], None] | None = None,
                 inline: Callable[[Request], bool] | None = None) -> None:
        self.limits = limits or HttpLimits()
        self._handler = handler
        self._head_check = head_check
        # body-less requests this says yes to are handled on the event loop, without the hop to a worker
        # thread (their handler must not block: in-memory lookups, like a long poll's first check)
        self._inline = inline
        self._name = name
        self._tls = tls.server_context() if tls else None  # bad cert paths fail here, before binding
        self._on_refused = on_connection_refused
        self._loop = asyncio.new_event_loop()
        self._pool = ThreadPoolExecutor(self.limits.workers, thread_name_prefix=f"{name}-worker")
        self._bodies = asyncio.Semaphore(self.limits.workers)
        self._thread: threading.Thread | None = None
        self.refused_connections = 0
        self._web = web.Server(self._handle, loop=self._loop, keepalive_timeout=self.limits.idle_timeout_s,
                               auto_decompress=False, max_line_size=8190, max_field_size=8190,
                               access_log=None, logger=_parser_log, lingering_time=0.0)
        self._server = self._loop.run_until_complete(self._loop.create_server(
            self._protocol, host, port, ssl=self._tls, backlog=512, reuse_address=True,
            ssl_handshake_timeout=self.limits.tls_handshake_timeout_s if self._tls else None))
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def tls(self) -> bool:
        return self._tls is not None

    def _protocol(self) -> asyncio.BaseProtocol:
        if len(self._web.connections) >= self.limits.max_connections:
            self.refused_connections += 1
            if self._on_refused is not None:
                self._on_refused()
            return _Refuse()
        return self._web()

    def start(self) -> HttpServer:
        self._thread = threading.Thread(target=self._loop.run_forever, name=self._name, daemon=True)
        self._thread.start()
        return self

    def stop(self, grace_s: float = 0.5) -> None:
        async def shutdown() -> None:
            self._server.close()
            await self._web.shutdown(grace_s)
            await self._server.wait_closed()
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in others:
                task.cancel()
            await asyncio.gather(*others, return_exceptions=True)

        if self._thread is not None and self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(grace_s + 2.0)
            except Exception as exc:  # stopping must not raise; say what was left
                log.debug("%s: shutdown: %r", self._name, exc)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=2.0)
        else:
            self._loop.run_until_complete(shutdown())
        if not self._loop.is_running():
            self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ per request
    async def _handle(self, http: web.BaseRequest) -> web.StreamResponse:
        request = Request(http.method, http.path, dict(http.query), http.headers,
                          peer=str(http.remote or ""))
        body_read = False
        try:
            if self._head_check is not None:
                request.principal = self._head_check(request)
            if http.body_exists or http.content_length:
                body_read = True
                async with self._bodies:
                    request.body = await self._read_body(http)
                    response = await self._loop.run_in_executor(self._pool, self._call, request)
            elif self._inline is not None and self._inline(request):
                response = self._call(request)
            else:
                response = await self._loop.run_in_executor(self._pool, self._call, request)
        except HttpError as exc:
            response = json_error(exc.status, exc.message, exc.headers)
        if isinstance(response, LongPoll):
            transport = http.transport
            response = await self._hold(response, lambda: transport is None or transport.is_closing())
        reply = web.Response(status=response.status, body=response.body if http.method != "HEAD" else None,
                             headers=response.headers)
        reply.content_type = response.content_type.split(";", 1)[0]
        if ";" in response.content_type:
            reply.headers["Content-Type"] = response.content_type
        if http.method == "HEAD":
            reply.headers["Content-Length"] = str(len(response.body))
        if response.status in (408, 413) or response.status >= 500 or (http.body_exists and not body_read):
            reply.force_close()  # an unread or half-read body must not be parsed as the next request
        return reply

    #: a held poll whose client went away is noticed within this (aiohttp does not cancel a handler
    #: on disconnect): a client that reconnects in a loop cannot pile up held polls for a minute each
    HOLD_CHECK_S = 10.0

    async def _hold(self, poll: LongPoll, gone: Callable[[], bool]) -> Response:
        """Wait on the loop for the poll's answer: no thread is held, only this coroutine."""
        woken = asyncio.Event()
        loop = self._loop

        def wake() -> None:
            try:
                loop.call_soon_threadsafe(woken.set)
            except RuntimeError:  # the loop closed (server stopped): nobody waits any more
                pass

        unsubscribe = poll.subscribe(wake)
        try:
            deadline = loop.time() + max(0.0, poll.timeout_s)
            while True:
                woken.clear()  # cleared before ready(): a wake from now on is seen (set runs on this loop)
                try:
                    answer = poll.ready()
                except HttpError as exc:
                    return json_error(exc.status, exc.message, exc.headers)
                if answer is not None:
                    return answer
                left = deadline - loop.time()
                if left <= 0 or gone():
                    return poll.on_timeout
                try:
                    async with asyncio.timeout(min(left, self.HOLD_CHECK_S)):
                        await woken.wait()
                except TimeoutError:
                    pass
        finally:
            unsubscribe()

    async def _read_body(self, http: web.BaseRequest) -> bytes:
        limit = self.limits.max_body_bytes
        declared = http.content_length
        if declared is not None and declared > limit:
            raise HttpError(413, f"body of {declared} bytes over the {limit}-byte limit")
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while True:
                    chunk = await http.content.readany()
                    if not chunk:
                        break
                    size += len(chunk)
                    if size > limit:
                        raise HttpError(413, f"body over the {limit}-byte limit")
                    chunks.append(chunk)
        except TimeoutError as exc:
            raise HttpError(408, f"body not received within {self.limits.body_timeout_s:g} s") from exc
        except ConnectionError as exc:
            raise HttpError(400, f"connection lost while reading the body: {exc}") from exc
        except Exception as exc:  # aiohttp's payload errors (bad chunked encoding, ...)
            if isinstance(exc, HttpError):
                raise
            raise HttpError(400, f"unreadable body: {exc}") from exc
        if declared is not None and size != declared:
            raise HttpError(400, f"body of {size} bytes, Content-Length said {declared}")
        return b"".join(chunks)

    def _call(self, request: Request) -> Response | LongPoll:
        try:
            return self._handler(request)
        except HttpError as exc:
            return json_error(exc.status, exc.message, exc.headers)
        except Exception as exc:  # answer, log (rate-limited), keep serving
            _errors.exception(f"{self._name} {request.path}", "%s: error on %s %s", self._name, request.method,
                              request.path)
            return json_error(500, f"internal error: {type(exc).__name__}")

