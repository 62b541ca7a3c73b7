"""The live service over real sockets: OTLP ingest (gRPC, HTTP protobuf and JSON), API,
metrics, persistence across restarts, webhooks, back-pressure and forwarding."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.incidents.alerts import SIGNATURE_HEADER, verify
from mycroft.rca_service.service import RcaService, ServiceOptions
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import SpanRecord, encode_json, request_from_records
from mycroft.otlp_server import OtlpReceiver

from .helpers import WebhookReceiver, get_json, http, wait_until

SECRET = "s3cret"


def _options(db: Path, **kw: object) -> ServiceOptions:
    cfg = dataclasses.replace(AnalysisConfig(), resolve_after_s=0.5)
    return ServiceOptions(otlp_grpc="127.0.0.1:0", otlp_http="127.0.0.1:0", http="127.0.0.1:0", db=str(db),
                          tick_s=0.05, analysis=cfg, **kw)  # type: ignore[arg-type]


@pytest.fixture
def hook() -> Iterator[WebhookReceiver]:
    receiver = WebhookReceiver(fail_first=1)
    yield receiver
    receiver.close()


def _grpc_export(port: int, records: list[SpanRecord]) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        trace_service_pb2_grpc.TraceServiceStub(channel).Export(request_from_records(records), timeout=5)


def _hung_job(name: str) -> tuple[StepJob, list[SpanRecord], list[SpanRecord]]:
    """(job, 20 healthy steps, heartbeats of rank 2 blocking the others for 2 s) on wall-clock time."""
    job = StepJob(name, 4, t0=time.time() - 5.0)
    healthy = job.steps(20)
    hang = job.heartbeats(time.time(), blocked={0: 2.0, 1: 2.0, 3: 2.0}, not_entered=[2])
    return job, healthy, hang


def test_ingest_detect_alert_persist_restart(tmp_path: Path, hook: WebhookReceiver) -> None:
    db = tmp_path / "rca.db"
    service = RcaService(_options(db, webhooks=[hook.url], webhook_secret=SECRET)).start()
    try:
        api = f"http://127.0.0.1:{service.api.port}"
        job, healthy, hang = _hung_job("svc-job")
        _grpc_export(service.receiver.grpc_port or 0, healthy)
        # the same contract over OTLP/HTTP protobuf and OTLP/HTTP JSON (the whole moment in each: split
        # across two requests, an analysis pass between them could fire on half of it)
        otlp = f"http://127.0.0.1:{service.receiver.http_port}/v1/traces"
        code, _ = http(otlp, request_from_records(hang).SerializeToString(),
                       {"Content-Type": "application/x-protobuf"})
        assert code == 200
        code, _ = http(otlp, json.dumps(encode_json(hang)).encode(), {"Content-Type": "application/json"})
        assert code == 200
        # malformed input: a clear error, and the service keeps serving
        code, body = http(otlp, b"\x00garbage", {"Content-Type": "application/x-protobuf"})
        assert code == 400 and b"bad OTLP request" in body
        code, body = http(otlp, b"{not json", {"Content-Type": "application/json"})
        assert code == 400

        assert wait_until(lambda: get_json(f"{api}/api/v1/incidents"), 5)
        incidents = get_json(f"{api}/api/v1/incidents")
        assert len(incidents) == 1
        incident = incidents[0]
        assert incident["kind"] == "hang" and incident["status"] == "firing" and incident["job"] == "svc-job"
        assert incident["detected_at"].endswith("Z")
        assert incident["root_causes"][0]["rank"] == 2
        assert incident["root_causes"][0]["kind"] == "not_entered"
        assert incident["wait_for_graph"]["waiting_ranks"] == 3
        assert get_json(f"{api}/api/v1/incidents/{incident['id']}")["id"] == incident["id"]
        assert http(f"{api}/api/v1/incidents/nope")[0] == 404
        assert http(f"{api}/api/v1/incidents?limit=x")[0] == 400
        jobs = get_json(f"{api}/api/v1/jobs")
        assert jobs[0]["job"] == "svc-job" and jobs[0]["ranks_seen"] == 4
        assert get_json(f"{api}/healthz")["status"] == "ok"
        metrics = http(f"{api}/metrics")[1].decode()
        assert "mycroft_rca_spans_received_total" in metrics and 'mycroft_rca_incidents{status="firing"} 1' in metrics

        # the webhook: retried after a 503, Alertmanager v4 format, HMAC-signed
        payloads = hook.wait(1)
        assert payloads[0]["version"] == "4" and payloads[0]["status"] == "firing"
        assert payloads[0]["alerts"][0]["labels"]["root_cause_ranks"] == "2"
        headers, body = hook.requests[0]
        assert verify(SECRET, body, headers[SIGNATURE_HEADER])
        assert hook.attempts >= 2

        # rank 2 arrives; the job moves on; the incident resolves and the webhook says so
        healthy_again = job.steps(5)
        healthy_again += job.heartbeats(time.time(), not_entered=range(4), stack="")
        _grpc_export(service.receiver.grpc_port or 0, healthy_again)
        payloads = hook.wait(2)
        assert [p["status"] for p in payloads] == ["firing", "resolved"]
        assert payloads[1]["alerts"][0]["endsAt"] != "0001-01-01T00:00:00Z"
        # a new hang in another job stays firing across the restart
        _, healthy2, hang2 = _hung_job("svc-job-2")
        _grpc_export(service.receiver.grpc_port or 0, healthy2 + hang2)
        assert wait_until(lambda: len(get_json(f"{api}/api/v1/incidents")) == 2, 5)
        hook.wait(3)
    finally:
        service.stop()

    sent_before = len(hook.requests)
    service = RcaService(_options(db, webhooks=[hook.url], webhook_secret=SECRET)).start()
    try:
        api = f"http://127.0.0.1:{service.api.port}"
        incidents = get_json(f"{api}/api/v1/incidents")
        assert [i["status"] for i in incidents] == ["firing", "resolved"]  # newest first, none lost
        # the still-hung job reports again: same incident, not a second one
        _, _, hang2 = _hung_job("svc-job-2")
        _grpc_export(service.receiver.grpc_port or 0, hang2)
        time.sleep(0.5)
        assert len(get_json(f"{api}/api/v1/incidents")) == 2
        assert len(hook.requests) == sent_before  # nothing re-fired
    finally:
        service.stop()


def test_flood_is_refused_with_backpressure_not_memory(tmp_path: Path) -> None:
    options = _options(tmp_path / "rca.db", max_queued_spans=50)
    service = RcaService(options)
    # stall the ingest worker so the queue fills up
    service._apply = lambda records, at: time.sleep(10)  # type: ignore[method-assign]
    service.ingest._apply = service._apply
    service.start()
    try:
        job = StepJob("flood", 8)
        batch = job.steps(5)  # 40 spans
        otlp = f"http://127.0.0.1:{service.receiver.http_port}/v1/traces"
        body = request_from_records(batch).SerializeToString()
        codes = [http(otlp, body, {"Content-Type": "application/x-protobuf"})[0] for _ in range(4)]
        assert codes[0] == 200 and 429 in codes
        assert service.ingest.queued <= 50
        metrics = http(f"http://127.0.0.1:{service.api.port}/metrics")[1].decode()
        assert 'mycroft_rca_spans_dropped_total{reason="queue_full"}' in metrics
    finally:
        service.ingest._stop = True
        service._stop.set()
        service.alerter.stop()
        service.receiver.stop(0)
        service.api.stop()
        service.store.close()


def test_forward_tees_spans_downstream(tmp_path: Path) -> None:
    got: list[SpanRecord] = []
    downstream = OtlpReceiver(got.extend, "127.0.0.1:0", "127.0.0.1:0").start()
    services = [
        RcaService(_options(tmp_path / "a.db", forward=f"127.0.0.1:{downstream.grpc_port}")).start(),
        RcaService(_options(tmp_path / "b.db", forward=f"http://127.0.0.1:{downstream.http_port}")).start(),
    ]
    try:
        job = StepJob("fwd", 2)
        for service in services:
            _grpc_export(service.receiver.grpc_port or 0, job.steps(3))
        assert wait_until(lambda: len(got) == 12, 5)
        assert {r.job_id for r in got} == {"fwd"}
    finally:
        for service in services:
            service.stop()
        downstream.stop(0)


def test_costly_passes_are_spaced_but_never_past_the_cap() -> None:
    """Big jobs' passes are held to the share of a core; one costly pass (a hang's onset: drawing,
    storing) must not push the next one seconds away."""
    from mycroft.rca_service.service import pass_wait

    options = ServiceOptions()
    share, cap = options.max_analysis_share, options.max_pass_wait_s
    assert pass_wait(0.002, 0.2, share, cap) == 0.2  # a small job: every tick
    spaced = pass_wait(0.02, 0.2, share, cap)  # a 16k-rank pass: held to the share of a core
    assert 0.2 < spaced <= cap and abs(0.02 / (0.02 + spaced) - share) < 1e-9
    assert pass_wait(0.4, 0.2, share, cap) == cap  # the onset's costly pass
    assert pass_wait(0.4, 0.2, share) > 4.0  # (what it would have waited uncapped)
