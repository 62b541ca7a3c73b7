"""Alert payloads, signing, retry/backoff from the persistent outbox, and a real Alertmanager."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mycroft.rca_service.analysis.findings import Finding, RootCause
from mycroft.rca_service.incidents.alerts import (
    Alerter,
    alertmanager_alerts,
    backoff_s,
    sign,
    verify,
    webhook_payload,
)
from mycroft.rca_service.incidents.store import Store
from mycroft.rca_service.incidents.tracker import FIRING, RESOLVED, Incident, IncidentTracker

from tests.components import require

from .helpers import get_json, wait_until

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def _incident(now: float = 1_700_000_000.0) -> Incident:
    tracker = IncidentTracker(resolve_after_s=1.0)
    finding = Finding("job-a", "hang", "3 ranks stuck", [RootCause(5, "not_entered", {"text": "rank 5 sleeps"})])
    return tracker.observe("job-a", [finding], now)[0].incident


def test_webhook_payload_is_alertmanager_v4() -> None:
    incident = _incident()
    body = webhook_payload(incident, "http://rca:8080")
    assert body["version"] == "4" and body["status"] == FIRING
    alert = body["alerts"][0]
    assert alert["labels"]["alertname"] == "MycroftHang"
    assert alert["labels"]["root_cause_ranks"] == "5"
    assert alert["startsAt"] == "2023-11-14T22:13:20.000Z"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"
    assert alert["generatorURL"] == f"http://rca:8080/incidents/{incident.id}"  # the page a human opens
    assert alert["annotations"]["incident_url"] == f"http://rca:8080/api/v1/incidents/{incident.id}"
    assert alert["annotations"]["root_cause"].startswith("rank 5 (")
    assert "view" not in body["mycroft"]["incident"] and body["mycroft"]["incident"]["id"] == incident.id
    assert body["groupLabels"] == {"mycroft_job": "job-a", "kind": "hang"}
    assert "rank 5 sleeps" in alert["annotations"]["description"]


def test_signature_round_trip_and_replay_window() -> None:
    body = b'{"a": 1}'
    assert verify("k", body, sign("k", body))
    assert not verify("k", body + b" ", sign("k", body))
    assert not verify("other", body, sign("k", body))
    old = sign("k", body, timestamp=int(time.time()) - 301)
    assert not verify("k", body, old)  # a captured request replayed 5 minutes later is refused
    assert verify("k", body, old, window_s=600)
    t = int(time.time())
    forged = sign("k", body, t).replace(f"t={t}", f"t={t + 1}")  # a fresh timestamp on an old HMAC
    assert not verify("k", body, forged)
    assert not verify("k", body, "sha256=" + "0" * 64) and not verify("k", body, "t=x,v1=y")


def test_outbox_retries_with_backoff_and_survives_restart(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    calls: list[tuple[str, dict[str, str]]] = []
    answers = iter([503, OSError("refused"), 200])

    def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> int:
        calls.append((url, headers))
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    store = Store(db)
    alerter = Alerter(store, ["http://hook"], None, secret="k", post=post)
    alerter.notify(_incident(), now=100.0)
    assert alerter.deliver_due(now=100.0) == 0
    store.close()
    # restart: the notification is still owed
    store = Store(db)
    alerter = Alerter(store, ["http://hook"], None, secret="k", post=post)
    assert alerter.deliver_due(now=100.1) == 0  # not due yet: backoff
    assert alerter.deliver_due(now=100.0 + backoff_s(0) + 0.01) == 0  # second failure
    assert alerter.deliver_due(now=100.0 + backoff_s(0) + backoff_s(1) + 0.02) == 1
    assert store.outbox_size() == 0
    assert len(calls) == 3 and calls[-1][1]["X-Mycroft-Signature"].startswith("t=")  # signed per attempt
    store.close()


def test_client_errors_are_not_retried_forever(tmp_path: Path) -> None:
    store = Store(tmp_path / "b.db")
    alerter = Alerter(store, ["http://hook"], None, post=lambda *a: 400)
    alerter.notify(_incident(), now=0.0)
    alerter.deliver_due(now=0.0)
    assert store.outbox_size() == 0 and alerter.given_up == 1


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[str]:
    require("alertmanager")
    assert ALERTMANAGER is not None
    config = tmp_path / "am.yml"
    config.write_text("route:\n  receiver: devnull\n  group_wait: 0s\nreceivers:\n  - name: devnull\n")
    port = _free_port()
    proc = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            try:
                get_json(f"{url}/api/v2/status")
                return True
            except OSError:
                return False

        if not wait_until(ready, 20):
            pytest.fail("alertmanager did not start")
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=10)


@pytest.mark.slow
def test_real_alertmanager_receives_firing_then_resolved(tmp_path: Path, alertmanager: str) -> None:
    store = Store(tmp_path / "c.db")
    alerter = Alerter(store, [], alertmanager)
    incident = _incident(now=time.time())
    alerter.notify(incident)
    assert alerter.deliver_due() == 1

    def alerts(active: bool) -> list[dict]:
        flag = "true" if active else "false"
        return list(get_json(f"{alertmanager}/api/v2/alerts?active={flag}&silenced=false&inhibited=false"))

    assert wait_until(lambda: len(alerts(True)) == 1, 10)
    got = alerts(True)[0]
    assert got["labels"]["incident_id"] == incident.id and got["labels"]["root_cause_ranks"] == "5"
    assert got["status"]["state"] == "active"
    incident.status, incident.resolved_at = RESOLVED, time.time()
    payload = alertmanager_alerts(incident, "", time.time())
    assert json.loads(json.dumps(payload))[0]["endsAt"]
    alerter.notify(incident)
    assert alerter.deliver_due() == 1
    assert wait_until(lambda: not alerts(True), 10)
    store.close()
