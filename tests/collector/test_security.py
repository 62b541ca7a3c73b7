"""`mycroft processor serve --auth-config --tls-cert --tls-key` as users run it: a real process
between ranks and an authenticated downstream, over TLS with a certificate made here."""

from __future__ import annotations

import os
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from mycroft import schema
from mycroft.auth import Authenticator
from mycroft.otlp import SpanRecord, request_from_records
from mycroft.otlp_server import OtlpReceiver
from tests.conftest import BIN, REPO, SpanSink

from ..netprobe import make_certs
from .procs import _read_ready, stop

AUTH_YAML = """tokens:
  - token: "rank-token-llama"
    role: ingest
    jobs: ["llama-*"]
  - token: "scraper-token-1"
    role: read
"""


def _heartbeats(job: str, n: int = 2) -> list[SpanRecord]:
    return [SpanRecord(trace_id=100 + i, span_id=1 + i, name=schema.SPAN_HEARTBEAT, start_ns=1, end_ns=2,
                       attributes={schema.ATTR_SPAN_KIND: schema.KIND_HEARTBEAT, schema.ATTR_HB_COUNTER: 1},
                       resource={schema.RES_JOB_ID: job, schema.RES_RANK: i, schema.RES_WORLD_SIZE: n})
            for i in range(n)]


@pytest.mark.slow
def test_processor_service_auth_and_tls(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "pki")
    auth_file = tmp_path / "auth.yaml"
    auth_file.write_text(AUTH_YAML)
    downstream_sink = SpanSink()
    downstream = OtlpReceiver(downstream_sink, "127.0.0.1:0", None, auth=Authenticator.from_mapping(
        {"tokens": [{"token": "processor-export-token", "role": "ingest"}]})).start()
    env = dict(os.environ, OTEL_EXPORTER_OTLP_HEADERS="authorization=Bearer%20processor-export-token")
    command = [str(BIN / "mycroft"), "processor", "serve", "--otlp-grpc", "127.0.0.1:0", "--otlp-http",
               "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--log-level", "WARNING",
               "--export", f"http://127.0.0.1:{downstream.grpc_port}", "--auth-config", str(auth_file),
               "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env=env)
    try:
        ready = _read_ready(proc, 30)
        credentials = grpc.ssl_channel_credentials(certs.ca.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{ready['otlp_grpc']}", credentials) as channel:
            stub = trace_service_pb2_grpc.TraceServiceStub(channel)

            def export(records: list[SpanRecord], token: str | None) -> grpc.StatusCode:
                metadata = (("authorization", f"Bearer {token}"),) if token else None
                try:
                    stub.Export(request_from_records(records), timeout=5, metadata=metadata)
                except grpc.RpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK

            assert export(_heartbeats("llama-a"), None) == grpc.StatusCode.UNAUTHENTICATED
            assert export(_heartbeats("llama-a"), "scraper-token-1") == grpc.StatusCode.PERMISSION_DENIED
            assert export(_heartbeats("gpt-b") + _heartbeats("llama-a"), "rank-token-llama") == \
                grpc.StatusCode.PERMISSION_DENIED  # the gpt-b spans are refused; llama-a's go through
            assert export(_heartbeats("llama-c"), "rank-token-llama") == grpc.StatusCode.OK
            garbage = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                          request_serializer=None, response_deserializer=None)
            try:
                garbage(b"\xff\xfe not protobuf", timeout=5, metadata=(("authorization", "Bearer rank-token-llama"),))
                raise AssertionError("garbage accepted")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert downstream_sink.wait_for(lambda rs: {r.job_id for r in rs} == {"llama-a", "llama-c"}
                                        and len(rs) == 4, 10)

        context = ssl.create_default_context(cafile=str(certs.ca))
        body = request_from_records(_heartbeats("llama-d")).SerializeToString()

        def post(token: str | None) -> int:
            headers = {"Content-Type": "application/x-protobuf"}
            if token:
                headers["Authorization"] = f"Bearer {token}"
            request = urllib.request.Request(f"https://127.0.0.1:{ready['otlp_http']}/v1/traces", data=body,
                                             headers=headers)
            try:
                with urllib.request.urlopen(request, context=context, timeout=5) as response:
                    return int(response.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert post(None) == 401 and post("rank-token-llama") == 200

        def scrape(token: str | None) -> tuple[int, str]:
            request = urllib.request.Request(f"https://127.0.0.1:{ready['metrics']}/metrics",
                                             headers={"Authorization": f"Bearer {token}"} if token else {})
            try:
                with urllib.request.urlopen(request, context=context, timeout=5) as response:
                    return int(response.status), response.read().decode()
            except urllib.error.HTTPError as exc:
                return int(exc.code), ""

        assert scrape(None)[0] == 401 and scrape("rank-token-llama")[0] == 403
        code, text = scrape("scraper-token-1")
        assert code == 200
        assert "mycroft_processor_requests_unauthenticated_total 3.0" in text  # 2 gRPC + 1 HTTP
        assert "mycroft_processor_dropped_forbidden_job_total 2.0" in text
        assert "mycroft_processor_requests_undecodable_total 1.0" in text
    finally:
        code, _ = stop(proc)
        downstream.stop(0)
    assert code == 0
