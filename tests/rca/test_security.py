"""Authentication, job scoping and TLS of the RCA service, over real sockets: OTLP/HTTP,
OTLP/gRPC and the API, with tokens per role and job pattern and a certificate made here."""

from __future__ import annotations

import copy
import dataclasses
import json
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.service import RcaService, ServiceOptions
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from mycroft.auth import AuthConfigError, Authenticator, sha256_hex
from mycroft.faults.made_up_job import StepJob
from mycroft.http_server import TlsFiles
from mycroft.otlp import SpanRecord, request_from_records

from ..netprobe import Certs, make_certs
from .helpers import http, wait_until

TOKENS = {
    "ingest-llama": "tok-ingest-llama",
    "ingest-all": "tok-ingest-all",
    "read-llama": "tok-read-llama",
    "admin": "tok-admin-0000",
}
AUTH = Authenticator.from_mapping({"tokens": [
    {"token": TOKENS["ingest-llama"], "role": "ingest", "jobs": ["llama-*"]},
    {"token_sha256": sha256_hex(TOKENS["ingest-all"]), "role": "ingest"},
    {"token": TOKENS["read-llama"], "role": "read", "jobs": ["llama-*"]},
    {"token": TOKENS["admin"], "role": "admin", "jobs": ["nothing-matches"]},
]})


def _bearer(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[name]}"}


def _options(db: Path, **kw: object) -> ServiceOptions:
    cfg = dataclasses.replace(AnalysisConfig(), resolve_after_s=0.5)
    return ServiceOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", http="127.0.0.1:0", db=str(db),
                          tick_s=0.05, analysis=cfg, **kw)  # type: ignore[arg-type]


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[RcaService]:
    service = RcaService(_options(tmp_path / "rca.db", auth=AUTH)).start()
    try:
        yield service
    finally:
        service.stop()


def _hung(name: str) -> list[SpanRecord]:
    job = StepJob(name, 4, t0=time.time() - 5.0)
    return job.steps(20) + job.heartbeats(time.time(), blocked={0: 2.0, 1: 2.0, 3: 2.0}, not_entered=[2])


def _otlp(service: RcaService, records: list[SpanRecord], headers: dict[str, str]) -> tuple[int, bytes]:
    body = request_from_records(records).SerializeToString()
    return http(f"http://127.0.0.1:{service.receiver.http_port}/v1/traces", body,
                {"Content-Type": "application/x-protobuf", **headers})


def _grpc(port: int, records: list[SpanRecord], token: str | None) -> grpc.StatusCode:
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(request_from_records(records), timeout=5,
                                                                    metadata=metadata)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_auth_config_file_forms(tmp_path: Path) -> None:
    good = tmp_path / "auth.yaml"
    good.write_text('tokens:\n  - token: "s3cret-ingest"\n    role: ingest\n    jobs: ["llama-*"]\n'
                    f'  - token_sha256: "{sha256_hex("s3cret-reader")}"\n    role: read\n')
    auth = Authenticator.load(str(good))
    ingest = auth.header("Bearer s3cret-ingest")
    assert ingest is not None and ingest.can_ingest and not ingest.can_read
    assert ingest.allows_job("llama-7b") and not ingest.allows_job("gpt-2") and ingest.allows_job("llama-7b#run2")
    reader = auth.header("bearer s3cret-reader")
    assert reader is not None and reader.can_read and reader.allows_job("anything")
    assert auth.header("Bearer wrong") is None and auth.header("Basic s3cret-ingest") is None
    assert auth.header(None) is None and auth.header("Bearer ") is None
    for text in ("tokens: []", "nope", "tokens:\n  - token: short1\n    role: ingest",
                 "tokens:\n  - token: long-enough\n    role: root",
                 "tokens:\n  - token: long-enough\n    token_sha256: ab\n    role: read",
                 "tokens:\n  - token: long-enough\n    role: read\n    jobs: []"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(AuthConfigError):
            Authenticator.load(str(bad))


def test_ingest_needs_a_valid_ingest_token(secured: RcaService) -> None:
    records = StepJob("llama-a", 2).steps(2)
    assert _otlp(secured, records, {})[0] == 401
    assert _otlp(secured, records, {"Authorization": "Bearer not-a-token"})[0] == 401
    assert _otlp(secured, records, _bearer("read-llama"))[0] == 403  # a read token cannot write
    assert _otlp(secured, records, _bearer("ingest-llama"))[0] == 200
    port = secured.receiver.grpc_port or 0
    assert _grpc(port, records, None) == grpc.StatusCode.UNAUTHENTICATED
    assert _grpc(port, records, "not-a-token") == grpc.StatusCode.UNAUTHENTICATED
    assert _grpc(port, records, TOKENS["read-llama"]) == grpc.StatusCode.PERMISSION_DENIED
    assert _grpc(port, records, TOKENS["ingest-llama"]) == grpc.StatusCode.OK
    assert wait_until(lambda: secured.engine.jobs.get("llama-a") is not None, 5)
    metrics = http(f"http://127.0.0.1:{secured.api.port}/metrics", headers=_bearer("admin"))[1].decode()
    assert 'mycroft_rca_requests_rejected_total{reason="unauthenticated"} 6' in metrics


def test_cross_tenant_write_is_refused_per_job(secured: RcaService) -> None:
    """A llama-* token cannot write (nor resolve) another tenant's job; its own spans still go in."""
    victim = StepJob("gpt-victim", 4, t0=time.time() - 5.0)
    assert _otlp(secured, victim.steps(20), _bearer("ingest-all"))[0] == 200
    stop = threading.Event()

    def still_hung() -> None:  # the victim's ranks keep reporting the hang
        while not stop.wait(0.25):
            _otlp(secured, victim.heartbeats(time.time(), not_entered=[2]), _bearer("ingest-all"))

    feeder = threading.Thread(target=still_hung, daemon=True)
    feeder.start()
    api = f"http://127.0.0.1:{secured.api.port}"

    def incidents() -> list[dict[str, Any]]:
        return list(json.loads(http(f"{api}/api/v1/incidents", headers=_bearer("admin"))[1]))

    try:
        assert wait_until(lambda: len(incidents()) == 1, 5)
        # spoofed healthy progress for the victim, mixed with the sender's own job
        healthy = copy.deepcopy(victim)
        spoof = healthy.steps(5) + healthy.heartbeats(time.time(), not_entered=range(4), stack="")
        own = StepJob("llama-own", 2).steps(2)
        code, body = _otlp(secured, spoof + own, _bearer("ingest-llama"))
        assert code == 403
        answer = json.loads(body)
        assert answer["rejected_spans"] == len(spoof) and answer["accepted_spans"] == len(own)
        assert _grpc(secured.receiver.grpc_port or 0, spoof, TOKENS["ingest-llama"]) == \
            grpc.StatusCode.PERMISSION_DENIED
        time.sleep(1.5)  # past resolve_after: a spoof that got in would have resolved it
        assert [(i["status"], i["job"]) for i in incidents()] == [("firing", "gpt-victim")]
        assert "llama-own" in secured.engine.jobs
        metrics = http(f"{api}/metrics", headers=_bearer("admin"))[1].decode()
        assert f'mycroft_rca_spans_dropped_total{{reason="forbidden_job"}} {2 * len(spoof)}' in metrics
    finally:
        stop.set()
        feeder.join()
    # control: the same progress from a token that may write the job resolves the incident
    assert _otlp(secured, spoof, _bearer("ingest-all"))[0] == 200
    assert wait_until(lambda: [i["status"] for i in incidents()] == ["resolved"], 5)


def test_api_roles_and_job_scoping(secured: RcaService) -> None:
    assert _otlp(secured, _hung("gpt-x"), _bearer("ingest-all"))[0] == 200
    assert _otlp(secured, _hung("llama-y"), _bearer("ingest-all"))[0] == 200
    api = f"http://127.0.0.1:{secured.api.port}"
    assert wait_until(lambda: len(json.loads(http(f"{api}/api/v1/incidents", headers=_bearer("admin"))[1])) == 2, 5)
    assert http(f"{api}/healthz")[0] == 200  # open
    for path in ("/api/v1/incidents", "/api/v1/jobs", "/metrics", "/api/v1/openapi.json"):
        code, _ = http(api + path)
        assert code == 401, path
        assert http(api + path, headers={"Authorization": "Bearer nope"})[0] == 401
        assert http(api + path, headers=_bearer("ingest-all"))[0] == 403, path  # ingest cannot read
    mine = json.loads(http(f"{api}/api/v1/incidents", headers=_bearer("read-llama"))[1])
    assert [i["job"] for i in mine] == ["llama-y"]
    jobs = json.loads(http(f"{api}/api/v1/jobs", headers=_bearer("read-llama"))[1])
    assert [j["job"] for j in jobs] == ["llama-y"]
    everything = json.loads(http(f"{api}/api/v1/incidents", headers=_bearer("admin"))[1])
    assert sorted(i["job"] for i in everything) == ["gpt-x", "llama-y"]  # admin: any job, whatever its patterns
    other = next(i for i in everything if i["job"] == "gpt-x")
    assert http(f"{api}/api/v1/incidents/{other['id']}", headers=_bearer("read-llama"))[0] == 403
    # the pages obey the same roles and job patterns as the JSON they are made from
    mine_id = next(i for i in everything if i["job"] == "llama-y")["id"]
    for path in ("/jobs", f"/incidents/{mine_id}", f"/incidents/{mine_id}/graph.svg"):
        assert http(api + path)[0] == 401, path
        assert http(api + path, headers=_bearer("ingest-all"))[0] == 403, path
        assert http(api + path, headers=_bearer("read-llama"))[0] == 200, path
    for path in (f"/incidents/{other['id']}", f"/incidents/{other['id']}/graph.svg"):
        assert http(api + path, headers=_bearer("read-llama"))[0] == 403, path
    jobs_page = http(f"{api}/jobs", headers=_bearer("read-llama"))[1].decode()
    assert "llama-y" in jobs_page and "gpt-x" not in jobs_page
    assert http(f"{api}/api/v1/incidents?job=gpt-x", headers=_bearer("read-llama"))[0] == 403
    assert http(f"{api}/api/v1/incidents?job=llama-y", headers=_bearer("read-llama"))[0] == 200
    assert http(f"{api}/api/v1/incidents", b"{}", {**_bearer("admin"), "Content-Type": "application/json"},
                method="POST")[0] == 405


def test_without_auth_config_everything_is_open(tmp_path: Path) -> None:
    service = RcaService(_options(tmp_path / "rca.db")).start()
    try:
        records = StepJob("open-job", 2).steps(2)
        assert _otlp(service, records, {})[0] == 200
        assert _grpc(service.receiver.grpc_port or 0, records, None) == grpc.StatusCode.OK
        assert http(f"http://127.0.0.1:{service.api.port}/api/v1/jobs")[0] == 200
    finally:
        service.stop()


def _client_context(certs: Certs, with_client_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certs.ca))
    if with_client_cert:
        context.load_cert_chain(str(certs.client_cert), str(certs.client_key))
    return context


def test_tls_and_mutual_tls_with_a_real_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "pki")
    tls = TlsFiles(str(certs.server_cert), str(certs.server_key), str(certs.ca))
    service = RcaService(_options(tmp_path / "rca.db", auth=AUTH, tls=tls)).start()
    try:
        api = f"https://127.0.0.1:{service.api.port}/api/v1/jobs"
        request = urllib.request.Request(api, headers=_bearer("admin"))
        with urllib.request.urlopen(request, context=_client_context(certs, True), timeout=5) as response:
            assert response.status == 200
        with pytest.raises((ssl.SSLError, OSError)):  # no client certificate: the handshake fails
            urllib.request.urlopen(request, context=_client_context(certs, False), timeout=5)
        untrusting = ssl.create_default_context(cafile=str(certs.other_ca))
        with pytest.raises((ssl.SSLError, OSError)):  # a client that does not trust our CA refuses us
            urllib.request.urlopen(request, context=untrusting, timeout=5)
        with pytest.raises(OSError):  # plain HTTP on the TLS port gets nothing useful
            urllib.request.urlopen(f"http://127.0.0.1:{service.api.port}/healthz", timeout=5)

        records = StepJob("llama-tls", 2).steps(2)
        body = request_from_records(records).SerializeToString()
        otlp = urllib.request.Request(f"https://127.0.0.1:{service.receiver.http_port}/v1/traces", data=body,
                                      headers={"Content-Type": "application/x-protobuf", **_bearer("ingest-llama")})
        with urllib.request.urlopen(otlp, context=_client_context(certs, True), timeout=5) as response:
            assert response.status == 200
        credentials = grpc.ssl_channel_credentials(certs.ca.read_bytes(), certs.client_key.read_bytes(),
                                                   certs.client_cert.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{service.receiver.grpc_port}", credentials) as channel:
            trace_service_pb2_grpc.TraceServiceStub(channel).Export(
                request_from_records(records), timeout=5, metadata=(("authorization", f"Bearer {TOKENS['admin']}"),))
        no_client = grpc.ssl_channel_credentials(certs.ca.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{service.receiver.grpc_port}", no_client) as channel:
            with pytest.raises(grpc.RpcError) as err:
                trace_service_pb2_grpc.TraceServiceStub(channel).Export(request_from_records(records), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        service.stop()


@pytest.mark.slow  # real processes, seconds each
def test_cli_flags_warning_and_refusals(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "pki")
    cmd = [sys.executable, "-m", "mycroft.cli", "rca", "serve", "--otlp-grpc", "127.0.0.1:0", "--db",
           str(tmp_path / "x.db")]
    out = subprocess.run([*cmd, "--tls-cert", str(certs.server_cert)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--tls-cert and --tls-key go together" in out.stderr
    out = subprocess.run([*cmd, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.client_key)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "cannot use --tls-cert" in out.stderr  # key of another certificate
    bad = tmp_path / "bad.yaml"
    bad.write_text("tokens: [{token: x, role: ingest}]")
    out = subprocess.run([*cmd, "--auth-config", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "tokens[0]" in out.stderr
    # binding beyond loopback without auth: a loud warning on stderr
    proc = subprocess.Popen([*cmd[:-4], "--otlp-grpc", "", "--otlp-http", "0.0.0.0:0", "--http", "127.0.0.1:0",
                             "--db", str(tmp_path / "w.db")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        json.loads(proc.stdout.readline())
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert "WITHOUT AUTHENTICATION" in err and "0.0.0.0:0" in err
