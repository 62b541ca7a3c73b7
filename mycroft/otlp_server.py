"""OTLP trace receiver (gRPC + HTTP protobuf/JSON) shared by every Mycroft service.

The services hand it a sink: a callable that takes the decoded SpanRecords. Malformed
input is answered with a clear error (gRPC INVALID_ARGUMENT, HTTP 400 / 413 / 415) and
logged rate-limited; the server keeps serving. With an Authenticator, every request
needs `Authorization: Bearer <token>` of an ingest (or admin) token (401 /
UNAUTHENTICATED without), and spans are accepted or refused per job against the
token's job patterns (403 / PERMISSION_DENIED when any is refused; the allowed ones
still go in). Refusals are reported to `on_reject(reason, spans)` for /metrics.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from mycroft import schema
from mycroft.auth import ANONYMOUS_ADMIN, Authenticator, Principal
from mycroft.http_server import HttpError, HttpLimits, HttpServer, Request, Response, TlsFiles, decode_content
from mycroft.otlp import (
    DecodeCache,
    OtlpDecodeError,
    SpanRecord,
    decode_json,
    decode_protobuf,
    filter_request_jobs,
    parse_lean,
    records_from_lean,
    records_from_request,
)
from mycroft.ratelog import RateLimitedLog

log = logging.getLogger(__name__)
_bad_input = RateLimitedLog(log, every_s=10.0)

Sink = Callable[[list[SpanRecord]], "int | None"]  # returns how many spans it shed (OTLP partial success)
RequestSink = Callable[[trace_service_pb2.ExportTraceServiceRequest], None]
RejectHook = Callable[[str, int], None]

TRACE_SERVICE = "opentelemetry.proto.collector.trace.v1.TraceService"
PROTOBUF_TYPES = ("application/x-protobuf", "application/protobuf")
JSON_TYPE = "application/json"
#: kept for callers that size their own servers like ours
MAX_BODY_BYTES = HttpLimits().max_decoded_bytes

# reasons counted by on_reject (and in /metrics)
REJECT_UNAUTHENTICATED = "unauthenticated"
REJECT_FORBIDDEN_JOB = "forbidden_job"
REJECT_UNDECODABLE = "undecodable"
REJECT_TOO_LARGE = "too_large"


def split_host_port(address: str) -> tuple[str, int]:
    """"HOST:PORT" (or "[v6]:PORT", or "http://HOST:PORT") -> (host, port)."""
    text = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def partial_success(shed: int) -> trace_service_pb2.ExportTraceServiceResponse:
    """The OTLP answer to a request the sink took only part of (shed > 0): the client must not retry it."""
    response = trace_service_pb2.ExportTraceServiceResponse()
    if shed:
        response.partial_success.rejected_spans = shed
        response.partial_success.error_message = (f"{shed} non-heartbeat spans shed under load; "
                                                  "heartbeats were accepted")
    return response


def _noop_reject(reason: str, spans: int) -> None:
    pass


class _JobGate:
    """Per-job decisions of one principal, cached for the request."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal
        self._seen: dict[str, bool] = {}
        self.refused_jobs: set[str] = set()

    def __call__(self, job: str) -> bool:
        allowed = self._seen.get(job)
        if allowed is None:
            allowed = self._seen[job] = self.principal.allows_job(job)
            if not allowed:
                self.refused_jobs.add(job)
        return allowed

    def filter(self, records: list[SpanRecord]) -> list[SpanRecord]:
        if self.principal.all_jobs:
            return records
        return [record for record in records if self(record.job_id)]


def _refused_message(refused: int, jobs: set[str]) -> str:
    shown = ", ".join(sorted(repr(j[:64]) for j in jobs)[:5])
    return f"{refused} spans refused: this token may not write job(s) {shown}"


# ------------------------------------------------------------------------------------
# gRPC
# ------------------------------------------------------------------------------------
def grpc_credentials(tls: TlsFiles | None) -> grpc.ServerCredentials | None:
    if tls is None:
        return None
    cert, key, ca = tls.read()
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)


def grpc_server(limits: HttpLimits, max_workers: int = 8, max_concurrent_rpcs: int = 64) -> grpc.Server:
    """A gRPC server sized like our HTTP servers: bounded messages, RPCs and idle connections."""
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="mycroft-otlp-grpc"),
        options=[
            ("grpc.max_receive_message_length", limits.max_decoded_bytes),
            ("grpc.max_connection_idle_ms", 300_000),
            ("grpc.http2.max_ping_strikes", 2),
        ],
        maximum_concurrent_rpcs=max_concurrent_rpcs,
    )


def bind_grpc(server: grpc.Server, address: str, tls: TlsFiles | None) -> int:
    host, port = split_host_port(address)
    credentials = grpc_credentials(tls)
    target = f"{host}:{port}"
    bound = server.add_secure_port(target, credentials) if credentials else server.add_insecure_port(target)
    if not bound:
        raise OSError(f"cannot bind OTLP gRPC on {address}")
    return int(bound)


def trace_service_handler(export: Callable[[bytes, grpc.ServicerContext], bytes | None]) -> grpc.GenericRpcHandler:
    """TraceService/Export taking the raw request bytes, so undecodable input is ours to answer
    (INVALID_ARGUMENT) instead of grpc's INTERNAL "Exception deserializing request!" traceback."""

    def handle(payload: bytes, context: grpc.ServicerContext) -> bytes:
        return export(payload, context) or b""  # b"": an empty ExportTraceServiceResponse

    method = grpc.unary_unary_rpc_method_handler(handle, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(TRACE_SERVICE, {"Export": method})


def control_handler(where: Callable[[bytes, grpc.ServicerContext], bytes]) -> grpc.GenericRpcHandler:
    """schema.CONTROL_GRPC_SERVICE/Where, raw bytes in and out (a JSON answer; no protobuf to agree on)."""
    method = grpc.unary_unary_rpc_method_handler(where, request_deserializer=None, response_serializer=None)
    return grpc.method_handlers_generic_handler(schema.CONTROL_GRPC_SERVICE, {schema.CONTROL_GRPC_METHOD: method})


def grpc_principal(context: grpc.ServicerContext, auth: Authenticator | None,
                   on_reject: RejectHook) -> Principal:
    """The caller's ingest principal, or abort UNAUTHENTICATED / PERMISSION_DENIED."""
    if auth is None:
        return ANONYMOUS_ADMIN
    header = None
    for key, value in context.invocation_metadata() or ():
        if key.lower() == "authorization":
            header = value if isinstance(value, str) else value.decode("latin-1")
    principal = auth.header(header)
    if principal is None:
        on_reject(REJECT_UNAUTHENTICATED, 0)
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token")
    assert principal is not None
    if not principal.can_ingest:
        on_reject(REJECT_UNAUTHENTICATED, 0)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, f"a {principal.role} token may not send spans")
    return principal


def parse_grpc_request(payload: bytes, context: grpc.ServicerContext,
                       on_reject: RejectHook) -> trace_service_pb2.ExportTraceServiceRequest:
    request = trace_service_pb2.ExportTraceServiceRequest()
    try:
        request.ParseFromString(payload)
    except Exception as exc:  # protobuf raises DecodeError and friends
        on_reject(REJECT_UNDECODABLE, 0)
        _bad_input.warning("grpc-decode", "OTLP/gRPC: undecodable request from %s (%d bytes): %s",
                           context.peer(), len(payload), exc)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad OTLP request: not an ExportTraceServiceRequest: {exc}")
    return request


def _answer(shed: int) -> bytes | None:
    """The Export response: empty, or a partial success naming the spans shed."""
    return partial_success(shed).SerializeToString() if shed else None


class OtlpReceiver:
    """Serves OTLP/gRPC and OTLP/HTTP on the given addresses until stop().

    `grpc_request_sink`, when given, takes gRPC requests undecoded (the processor's fast
    path); otherwise gRPC requests are decoded into records for `sink` like HTTP ones.
    """

    def __init__(self, sink: Sink, grpc_address: str | None, http_address: str | None,
                 max_workers: int = 8, *, auth: Authenticator | None = None, tls: TlsFiles | None = None,
                 limits: HttpLimits | None = None, on_reject: RejectHook | None = None,
                 grpc_request_sink: RequestSink | None = None, max_concurrent_rpcs: int = 64,
                 decode_cache: DecodeCache | None = None,
                 prefilter: Callable[[Any], int] | None = None,
                 control: Callable[[], bytes | None] | None = None) -> None:
        self._sink = sink
        # "where is your control API?" (schema.CONTROL_*): a rank that exports here polls directives there
        self._control = control
        self._cache = decode_cache  # repeated arrays / resources decoded once (the sink treats values as read-only)
        # gRPC requests pass it before the costly decode (a full or a lean request: both have
        # resource_spans / scope_spans / spans with names), or, decoded by the compiled path, as
        # their list of records: it may drop spans in place (load shedding), returns how many
        self._prefilter = prefilter
        self._request_sink = grpc_request_sink
        self._auth = auth
        self._reject = on_reject or _noop_reject
        self.limits = limits or HttpLimits()
        self._grpc_server: grpc.Server | None = None
        self._http_server: HttpServer | None = None
        self.grpc_port: int | None = None
        self.http_port: int | None = None
        if http_address:  # HTTP first: it validates the TLS files before gRPC reads them
            host, port = split_host_port(http_address)
            self._http_server = HttpServer(self._handle_http, host, port, self.limits, tls, "mycroft-otlp-http",
                                           head_check=self._http_head)
            self.http_port = self._http_server.port
        if grpc_address:
            self._grpc_server = grpc_server(self.limits, max_workers, max_concurrent_rpcs)
            self._grpc_server.add_generic_rpc_handlers((trace_service_handler(self._export_grpc),))
            if control is not None:
                self._grpc_server.add_generic_rpc_handlers((control_handler(self._control_grpc),))
            try:
                self.grpc_port = bind_grpc(self._grpc_server, grpc_address, tls)
            except Exception:
                if self._http_server is not None:
                    self._http_server.stop(0)
                raise

    def start(self) -> OtlpReceiver:
        if self._grpc_server is not None:
            self._grpc_server.start()
        if self._http_server is not None:
            self._http_server.start()
        return self

    def stop(self, grace: float = 1.0) -> None:
        if self._grpc_server is not None:
            self._grpc_server.stop(grace).wait()
        if self._http_server is not None:
            self._http_server.stop(min(grace, 0.5))

    # ------------------------------------------------------------------ gRPC
    def _export_grpc(self, payload: bytes, context: grpc.ServicerContext) -> bytes | None:
        principal = grpc_principal(context, self._auth, self._reject)
        gate = _JobGate(principal)
        refused = 0
        shed = 0
        # the fast path: a receiver with a DecodeCache and a caller who may write every job parses
        # with the lean schema (key-values as bytes, memoized); per-job filtering needs the full one
        lean = self._request_sink is None and self._cache is not None and principal.all_jobs
        if lean:
            assert self._cache is not None
            try:
                records = self._cache.decode_compiled(payload)
            except OtlpDecodeError as exc:
                records = None
                self._bad_grpc(context, payload, exc)
            if records is not None:
                early = self._prefilter(records) if self._prefilter is not None else 0
                return _answer(self._sink_shed(records, context) + early)
            try:
                request = parse_lean(payload)
            except OtlpDecodeError as exc:
                self._bad_grpc(context, payload, exc)
        else:
            request = parse_grpc_request(payload, context, self._reject)
        if not principal.all_jobs:
            refused = filter_request_jobs(request, gate)
        early = self._prefilter(request) if self._prefilter is not None else 0
        if self._request_sink is not None:
            try:
                self._request_sink(request)
            except OverflowError as exc:  # sinks raise it when they shed load
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        else:
            try:
                if lean:
                    assert self._cache is not None
                    records = records_from_lean(request, self._cache)
                else:
                    records = records_from_request(request, self._cache)
            except OtlpDecodeError as exc:
                self._reject(REJECT_UNDECODABLE, 0)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad OTLP request: {exc}")
            shed = self._sink_shed(records, context)
        if refused:
            self._reject(REJECT_FORBIDDEN_JOB, refused)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, _refused_message(refused, gate.refused_jobs))
        return _answer(shed + early)

    def _bad_grpc(self, context: grpc.ServicerContext, payload: bytes, exc: OtlpDecodeError) -> None:
        self._reject(REJECT_UNDECODABLE, 0)
        _bad_input.warning("grpc-decode", "OTLP/gRPC: undecodable request from %s (%d bytes): %s",
                           context.peer(), len(payload), exc)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad OTLP request: {exc}")

    def _sink_shed(self, records: list[SpanRecord] | None, context: grpc.ServicerContext) -> int:
        """Decoded records to the sink; how many it shed (a sink that refuses aborts the RPC)."""
        shed = 0
        try:
            if records:
                shed = self._sink(records) or 0
        except OverflowError as exc:  # sinks raise it when they shed load
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc))
        return shed

    def _control_grpc(self, payload: bytes, context: grpc.ServicerContext) -> bytes:
        answer = self._control() if self._control is not None else None
        if answer is None:
            context.abort(grpc.StatusCode.UNAVAILABLE, "this service runs no control API")
        return answer or b""

    # ------------------------------------------------------------------ HTTP
    def _http_head(self, request: Request) -> Principal:
        """Checks that need no body: path, method, content type, token (before a byte is buffered)."""
        if self._control is not None and request.path.rstrip("/") == schema.CONTROL_HTTP_PATH:
            if request.method != "GET":
                raise HttpError(405, f"GET {schema.CONTROL_HTTP_PATH}", {"Allow": "GET"})
            return ANONYMOUS_ADMIN  # says only a port: no token needed, nothing else is served
        if request.path.rstrip("/") != "/v1/traces":
            raise HttpError(404, "only /v1/traces is served here")
        if request.method != "POST":
            raise HttpError(405, "POST OTLP spans to /v1/traces", {"Allow": "POST"})
        content_type = request.header("Content-Type").split(";", 1)[0].strip().lower()
        if content_type not in (*PROTOBUF_TYPES, JSON_TYPE):
            raise HttpError(415, f"unsupported Content-Type {content_type or '(none)'!r}: "
                                 "send application/x-protobuf or application/json")
        if self._auth is None:
            return ANONYMOUS_ADMIN
        principal = self._auth.header(request.header("Authorization") or None)
        if principal is None:
            self._reject(REJECT_UNAUTHENTICATED, 0)
            raise HttpError(401, "missing or invalid bearer token", {"WWW-Authenticate": 'Bearer realm="mycroft"'})
        if not principal.can_ingest:
            self._reject(REJECT_UNAUTHENTICATED, 0)
            raise HttpError(403, f"a {principal.role} token may not send spans")
        return principal

    def _handle_http(self, request: Request) -> Response:
        if self._control is not None and request.path.rstrip("/") == schema.CONTROL_HTTP_PATH:
            where = self._control()
            if where is None:
                raise HttpError(503, "this service runs no control API")
            return Response(200, where, "application/json")
        principal = request.principal if isinstance(request.principal, Principal) else ANONYMOUS_ADMIN
        content_type = request.header("Content-Type").split(";", 1)[0].strip().lower()
        try:
            body = decode_content(request.body, request.header("Content-Encoding"), self.limits.max_decoded_bytes)
            if content_type == JSON_TYPE:
                records = decode_json(body, max_depth=self.limits.json_max_depth)
            else:
                records = decode_protobuf(body, self._cache)
        except HttpError as exc:
            self._reject(REJECT_TOO_LARGE if exc.status == 413 else REJECT_UNDECODABLE, 0)
            raise
        except OtlpDecodeError as exc:
            self._reject(REJECT_UNDECODABLE, 0)
            _bad_input.warning("http-decode", "OTLP/HTTP: bad request from %s: %s", request.peer, exc)
            raise HttpError(400, f"bad OTLP request: {exc}") from exc
        gate = _JobGate(principal)
        allowed = gate.filter(records)
        refused = len(records) - len(allowed)
        shed: int | None = 0
        if allowed:
            try:
                shed = self._sink(allowed)
            except OverflowError as exc:
                raise HttpError(429, str(exc), {"Retry-After": "1"}) from exc
        if refused:
            self._reject(REJECT_FORBIDDEN_JOB, refused)
            body_out: dict[str, Any] = {"error": _refused_message(refused, gate.refused_jobs),
                                        "accepted_spans": len(allowed), "rejected_spans": refused}
            return Response(403, json.dumps(body_out).encode())
        answer = partial_success(shed or 0)
        if content_type == JSON_TYPE:
            return Response(200, json.dumps(json_format.MessageToDict(answer)).encode() if shed else b"{}")
        return Response(200, answer.SerializeToString(), "application/x-protobuf")
