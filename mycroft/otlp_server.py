"""OTLP trace receiver (gRPC + HTTP protobuf/JSON) shared by every Mycroft service.

The services hand it a sink: a callable that takes the decoded SpanRecords and the
raw request (for tee/forwarding). Malformed input is answered with a clear error
(gRPC INVALID_ARGUMENT, HTTP 400) and the server keeps serving.
"""

from __future__ import annotations

import gzip
import logging
import threading
import zlib
from collections.abc import Callable
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mycroft.otlp import OtlpDecodeError, SpanRecord, decode_json, decode_protobuf, records_from_request

log = logging.getLogger(__name__)

Sink = Callable[[list[SpanRecord]], None]
MAX_BODY_BYTES = 64 * 1024 * 1024


def split_host_port(address: str) -> tuple[str, int]:
    """"HOST:PORT" (or "[v6]:PORT", or "http://HOST:PORT") -> (host, port)."""
    text = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, sink: Sink) -> None:
        self._sink = sink

    def Export(self, request, context):  # the gRPC method name
        try:
            records = records_from_request(request)
        except Exception as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad OTLP request: {exc}")
        try:
            self._sink(records)
        except OverflowError as exc:  # sinks raise it when they shed load
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return trace_service_pb2.ExportTraceServiceResponse()


def _decode_body(content_type: str, encoding: str, body: bytes) -> list[SpanRecord]:
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    elif encoding not in ("", "identity"):
        raise OtlpDecodeError(f"unsupported Content-Encoding {encoding!r}")
    if content_type.startswith("application/json"):
        return decode_json(body)
    if content_type.startswith(("application/x-protobuf", "application/protobuf", "")):
        return decode_protobuf(body)
    raise OtlpDecodeError(f"unsupported Content-Type {content_type!r}")


def _make_http_handler(sink: Sink) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            log.debug("otlp-http: " + format, *args)

        def _reply(self, code: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            if self.path.split("?", 1)[0].rstrip("/") != "/v1/traces":
                self._reply(404, b'{"error": "only /v1/traces is served here"}')
                return
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self._reply(413, b'{"error": "body too large"}')
                self.close_connection = True
                return
            body = self.rfile.read(length)
            content_type = (self.headers.get("Content-Type") or "").lower()
            try:
                records = _decode_body(content_type, (self.headers.get("Content-Encoding") or "").lower(), body)
            except (OtlpDecodeError, OSError, zlib.error, EOFError) as exc:
                message = str(exc).replace('"', "'")
                self._reply(400, f'{{"error": "bad OTLP request: {message}"}}'.encode())
                return
            try:
                sink(records)
            except OverflowError as exc:
                self._reply(429, f'{{"error": "{exc}"}}'.encode())
                return
            if content_type.startswith("application/json"):
                self._reply(200, b"{}")
            else:
                self._reply(200, trace_service_pb2.ExportTraceServiceResponse().SerializeToString(),
                            "application/x-protobuf")

    return Handler


class OtlpReceiver:
    """Serves OTLP/gRPC and OTLP/HTTP on the given addresses until stop()."""

    def __init__(self, sink: Sink, grpc_address: str | None, http_address: str | None,
                 max_workers: int = 8) -> None:
        self._sink = sink
        self._grpc_server: grpc.Server | None = None
        self._http_server: ThreadingHTTPServer | None = None
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        if grpc_address:
            self._grpc_server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=max_workers),
                options=[("grpc.max_receive_message_length", MAX_BODY_BYTES)],
            )
            trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceService(sink), self._grpc_server)
            host, port = split_host_port(grpc_address)
            self.grpc_port = self._grpc_server.add_insecure_port(f"{host}:{port}")
            if not self.grpc_port:
                raise OSError(f"cannot bind OTLP gRPC on {grpc_address}")
        if http_address:
            host, port = split_host_port(http_address)
            self._http_server = ThreadingHTTPServer((host, port), _make_http_handler(sink))
            self._http_server.daemon_threads = True
            self.http_port = self._http_server.server_address[1]

    def start(self) -> OtlpReceiver:
        if self._grpc_server is not None:
            self._grpc_server.start()
        if self._http_server is not None:
            threading.Thread(target=self._http_server.serve_forever, name="mycroft-otlp-http",
                             daemon=True).start()
        return self

    def stop(self, grace: float = 1.0) -> None:
        if self._grpc_server is not None:
            self._grpc_server.stop(grace).wait()
        if self._http_server is not None:
            self._http_server.shutdown()
            self._http_server.server_close()
