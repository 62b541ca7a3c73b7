"""The services' HTTP/gRPC edges under hostile and buggy input (issue 10's probe table),
over real sockets: each probe gets the status code or bound asserted, and the server
keeps serving afterwards."""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from mycroft.http_server import HttpLimits, decode_content
from mycroft.otlp import SpanRecord, encode_json, request_from_records
from mycroft.otlp_server import OtlpReceiver

from .conftest import SpanSink
from .netprobe import post, raw_http, threads_of

PB_HEAD = b"POST /v1/traces HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-protobuf\r\n"
LIMITS = HttpLimits(max_body_bytes=1 << 20, max_decoded_bytes=4 << 20, idle_timeout_s=1.0, body_timeout_s=1.0,
                    max_connections=1500)


def _records(n: int = 3, job: str = "edge-job") -> list[SpanRecord]:
    return [SpanRecord(trace_id=i + 1, span_id=i + 1, name="mycroft.heartbeat", start_ns=1, end_ns=2,
                       attributes={"mycroft.span.kind": "heartbeat"},
                       resource={"mycroft.job.id": job, "mycroft.rank": i, "mycroft.world_size": n})
            for i in range(n)]


@pytest.fixture
def receiver() -> Iterator[tuple[OtlpReceiver, SpanSink]]:
    sink = SpanSink()
    server = OtlpReceiver(sink, "127.0.0.1:0", "127.0.0.1:0", limits=LIMITS).start()
    try:
        yield server, sink
    finally:
        server.stop(0)


def _serving(port: int) -> bool:
    body = request_from_records(_records()).SerializeToString()
    return raw_http(port, post("/v1/traces", body)).status == 200


@pytest.mark.parametrize("value", ["abc", "-5", "1e3", ""])
def test_malformed_content_length_is_a_400(receiver: tuple[OtlpReceiver, SpanSink], value: str) -> None:
    server, _ = receiver
    head = (f"POST /v1/traces HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-protobuf\r\n"
            f"Content-Length: {value}\r\n\r\n").encode()
    reply = raw_http(server.http_port or 0, head + b"abc", timeout=3.0)
    assert reply.status == 400 and reply.seconds < 1.0
    assert _serving(server.http_port or 0)


def test_short_body_times_out_with_408(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, sink = receiver
    head = PB_HEAD + b"Content-Length: 1048576\r\n\r\n"
    reply = raw_http(server.http_port or 0, head + b"abc", timeout=5.0)
    assert reply.status == 408 and reply.header("Connection") == "close"
    assert LIMITS.body_timeout_s <= reply.seconds < LIMITS.body_timeout_s + 1.5
    assert not sink.records


def test_declared_giant_body_is_a_413_at_once(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, _ = receiver
    head = PB_HEAD + b"Content-Length: 1000000000000\r\n\r\n"
    reply = raw_http(server.http_port or 0, head + b"abc", timeout=3.0)
    assert reply.status == 413 and reply.seconds < 0.5 and reply.header("Connection") == "close"


def test_chunked_body_over_the_cap_is_a_413(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, _ = receiver
    chunk = b"x" * 65536
    chunks = b"".join(b"%x\r\n" % len(chunk) + chunk + b"\r\n" for _ in range(20)) + b"0\r\n\r\n"
    head = PB_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"
    assert raw_http(server.http_port or 0, head + chunks, timeout=3.0).status == 413


def test_gzip_bomb_stops_at_the_decoded_cap(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, _ = receiver
    bomb = gzip.compress(b"\0" * (64 << 20), 9)  # 64 MiB of zeros in ~64 KB
    reply = raw_http(server.http_port or 0, post("/v1/traces", bomb, extra="Content-Encoding: gzip\r\n"))
    assert reply.status == 413 and b"decoded body over" in reply.body
    # the same request within the cap is decoded and accepted
    good = gzip.compress(request_from_records(_records()).SerializeToString())
    assert raw_http(server.http_port or 0, post("/v1/traces", good, extra="Content-Encoding: gzip\r\n")).status == 200
    corrupt = good[:10] + b"\xff" * 20
    reply = raw_http(server.http_port or 0, post("/v1/traces", corrupt, extra="Content-Encoding: gzip\r\n"))
    assert reply.status == 400
    other = raw_http(server.http_port or 0, post("/v1/traces", good, extra="Content-Encoding: br\r\n"))
    assert other.status == 415


def test_decode_content_cap_is_exact() -> None:
    data = os.urandom(1000)
    packed = gzip.compress(data)
    assert decode_content(packed, "gzip", 1000) == data
    with pytest.raises(Exception, match="over 999"):
        decode_content(packed, "gzip", 999)


@pytest.mark.parametrize("content_type", ["text/plain", "", "application/xml", "application/jsonx"])
def test_other_content_types_are_a_415(receiver: tuple[OtlpReceiver, SpanSink], content_type: str) -> None:
    server, sink = receiver
    body = request_from_records(_records()).SerializeToString()
    extra = f"Content-Type: {content_type}\r\n" if content_type else ""
    data = f"POST /v1/traces HTTP/1.1\r\nHost: t\r\n{extra}Content-Length: {len(body)}\r\n\r\n".encode() + body
    assert raw_http(server.http_port or 0, data).status == 415
    assert not sink.records


def test_deep_json_is_a_400_not_a_recursion_crash(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, _ = receiver
    for deep in (b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 100 + b"1" + b"}" * 100):
        reply = raw_http(server.http_port or 0, post("/v1/traces", deep, "application/json"))
        assert reply.status == 400 and b"nested deeper" in reply.body
    good = json.dumps(encode_json(_records())).encode()
    assert raw_http(server.http_port or 0, post("/v1/traces", good, "application/json")).status == 200


def test_wrong_path_and_method(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, _ = receiver
    assert raw_http(server.http_port or 0, post("/v1/metrics", b"x")).status == 404
    reply = raw_http(server.http_port or 0, b"GET /v1/traces HTTP/1.1\r\nHost: t\r\n\r\n")
    assert reply.status == 405 and reply.header("Allow") == "POST"


def test_idle_half_open_connections_cost_no_threads_and_are_closed(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, _ = receiver
    pid = os.getpid()
    before = threads_of(pid)
    socks = []
    for i in range(1000):
        sock = socket.create_connection(("127.0.0.1", server.http_port or 0), timeout=5)
        if i % 2:
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: t\r\n")  # half a request head
        socks.append(sock)
    try:
        time.sleep(0.3)
        assert threads_of(pid) - before < 20  # not one per connection
        assert _serving(server.http_port or 0)  # and the server still answers
        deadline = time.monotonic() + LIMITS.idle_timeout_s + 5.0
        open_socks = list(socks)
        while open_socks and time.monotonic() < deadline:
            still = []
            for sock in open_socks:
                sock.setblocking(False)
                try:
                    if sock.recv(1) == b"":
                        continue  # closed by the server
                except BlockingIOError:
                    still.append(sock)
                except OSError:
                    continue
            open_socks = still
            time.sleep(0.2)
        assert not open_socks, f"{len(open_socks)} idle connections still open after the idle timeout"
    finally:
        for sock in socks:
            sock.close()


class _EmptyBackend:
    def list_incidents(self, limit: int, job: str | None, status: str | None, principal: object = None) -> list:
        return []

    def get_incident(self, incident_id: str) -> None:
        return None

    def jobs(self, principal: object = None) -> list:
        return []

    def health(self) -> dict:
        return {"status": "ok"}

    def metrics_text(self) -> str:
        return ""


def _closed_by_server(sock: socket.socket, wait_s: float = 0.5) -> bool:
    """True once the server has closed the connection (EOF or reset, after any reply it sent first);
    False when it still holds it open: nothing arrives within wait_s. A read timeout is "open"."""
    sock.settimeout(wait_s)
    try:
        while sock.recv(4096):
            pass  # a reply (an error page, a 408) before the close
        return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_api_idle_connections_are_closed_too() -> None:
    from mycroft.rca_service.web.api import ApiServer

    api = ApiServer(_EmptyBackend(), "127.0.0.1:0", limits=LIMITS).start()
    pid = os.getpid()
    before = threads_of(pid)
    socks = [socket.create_connection(("127.0.0.1", api.port), timeout=5) for _ in range(300)]
    try:
        for sock in socks[::2]:
            sock.sendall(b"GET /api/v1/jobs HTTP/1.1\r\n")  # never finished
        time.sleep(0.3)
        assert threads_of(pid) - before < 10
        assert raw_http(api.port, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").status == 200
        time.sleep(LIMITS.idle_timeout_s + 1.5)
        still_open = sum(not _closed_by_server(sock) for sock in socks)
        assert still_open == 0, f"{still_open} of {len(socks)} idle connections still open after the idle timeout"
    finally:
        for sock in socks:
            sock.close()
        api.stop()


def test_connections_over_the_cap_get_a_503() -> None:
    sink = SpanSink()
    limits = HttpLimits(idle_timeout_s=5.0, max_connections=50)
    server = OtlpReceiver(sink, None, "127.0.0.1:0", limits=limits).start()
    socks = [socket.create_connection(("127.0.0.1", server.http_port or 0)) for _ in range(50)]
    try:
        time.sleep(0.2)
        reply = raw_http(server.http_port or 0, post("/v1/traces", b""))
        assert reply.status == 503 and reply.header("Connection") == "close"
        for sock in socks[:10]:
            sock.close()
        time.sleep(0.3)
        assert _serving(server.http_port or 0)
    finally:
        for sock in socks:
            sock.close()
        server.stop(0)


def _raw_grpc(port: int, payload: bytes) -> grpc.RpcError | None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(
            "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
            request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=5)
        except grpc.RpcError as exc:
            return exc
    return None


def test_grpc_garbage_is_invalid_argument_and_logged_rate_limited(receiver: tuple[OtlpReceiver, SpanSink],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    server, sink = receiver
    caplog.set_level(logging.DEBUG)
    errors = [_raw_grpc(server.grpc_port or 0, b"\xff\xff\xff garbage" + bytes([i])) for i in range(20)]
    assert all(e is not None and e.code() == grpc.StatusCode.INVALID_ARGUMENT for e in errors)
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(noisy) <= 1 and not any(r.exc_info for r in noisy)
    # valid requests still go through
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(request_from_records(_records()), timeout=5)
    assert len(sink.records) == 3
    assert _raw_grpc(server.grpc_port or 0, ExportTraceServiceRequest().SerializeToString()) is None


def test_parallel_clients_all_answered(receiver: tuple[OtlpReceiver, SpanSink]) -> None:
    server, sink = receiver
    body = request_from_records(_records(4)).SerializeToString()
    codes: list[int | None] = []

    def client() -> None:
        for _ in range(10):
            codes.append(raw_http(server.http_port or 0, post("/v1/traces", body)).status)

    threads = [threading.Thread(target=client) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * 80 and len(sink.records) == 320
