"""Alert payloads (pure) and their delivery (the outbox worker).

Webhooks get Alertmanager's webhook format (version "4"), firing and resolved,
signed with HMAC-SHA256 when a secret is set:

    X-Mycroft-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>

signed afresh at every delivery attempt; a receiver recomputes the HMAC over the raw
body and refuses a timestamp outside its replay window (verify(): 300 s), so a captured
request cannot be replayed later (docs/security.md). Text that came from spans (job
names, stacks, error messages) is stripped of control characters, capped, and
HTML-escaped in the annotations meant for humans; bodies are JSON with <, > and &
written as unicode escapes, so no receiver embeds sender markup by accident.
A real Alertmanager gets /api/v2/alerts pushes. Failed deliveries stay in the
persistent outbox and are retried with exponential backoff.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import html
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from ..analysis.findings import at_least
from .store import Store
from .tracker import REFRESHED, RESOLVED, Incident, rfc3339, root_cause_line

log = logging.getLogger("mycroft.rca.alerts")

SIGNATURE_HEADER = "X-Mycroft-Signature"
WEBHOOK = "webhook"
ALERTMANAGER = "alertmanager"
FIRING_ENDS_AFTER_S = 900.0  # Alertmanager drops a firing alert not re-pushed by then
REPLAY_WINDOW_S = 300.0  # what verify() accepts between signing and checking
MAX_FIRING_ALERTS = 512  # distinct firing incidents paged at once; beyond it new ones are counted, not sent
MAX_LABEL_CHARS = 256
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # free text keeps newlines and tabs
_LABEL_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def safe_label(text: object, limit: int = MAX_LABEL_CHARS) -> str:
    """A label value from sender-controlled text: no control characters, capped."""
    return _LABEL_CONTROL.sub("", str(text))[:limit]


def safe_text(text: object, limit: int) -> str:
    """Free text for humans (summary, description): no control characters, capped, HTML-escaped."""
    return html.escape(_CONTROL.sub("", str(text))[:limit], quote=False)


def encode_body(payload: Any) -> bytes:
    """JSON with <, > and & as unicode escapes (as Go's encoder writes them): same values, no raw markup."""
    text = json.dumps(payload, default=str)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode()


def should_alert(action: str, incident: Incident, min_severity: str) -> bool:
    """Only what is meant to page someone reaches webhooks and Alertmanager.

    An incident is sent once it reaches `min_severity` (default critical), then on every
    change while firing, and its resolution only if it was sent: a normal pause (info), a
    slowdown (warning) or a teardown's consequence never page at the default.
    """
    if action == "resolved":
        return incident.alerted
    return incident.alerted or at_least(incident.severity, min_severity)


SEND = "send"
STAND_DOWN = "stand_down"


def alert_action(action: str, incident: Incident, min_severity: str) -> str | None:
    """What receivers get for one incident event: SEND its state, STAND_DOWN, or nothing.

    A paged incident whose severity falls below `min_severity` while it still fires (its
    holder turned out to be in a checkpoint, say) stands down: receivers get it as
    resolved, so nobody stays paged for a normal pause; it pages again if it rises.
    """
    if action == REFRESHED or not should_alert(action, incident, min_severity):
        return None
    if action != "resolved" and incident.alerted and not at_least(incident.severity, min_severity):
        return STAND_DOWN
    return SEND


def stood_down(incident: Incident, now: float) -> Incident:
    """The incident as receivers see it when it stands down: resolved there, firing here."""
    return dataclasses.replace(
        incident, status=RESOLVED, resolved_at=now, updated_at=now,
        evidence={**incident.evidence,
                  "resolved_because": f"severity fell to {incident.severity}: {incident.severity_reason}"})


def alert_labels(incident: Incident) -> dict[str, str]:
    causes = incident.root_causes
    ranks = [str(c.get("rank")) for c in causes if c.get("rank") is not None]
    return {
        "alertname": "Mycroft" + incident.kind.title().replace("_", ""),
        "mycroft_job": safe_label(incident.job),
        "kind": incident.kind,
        "severity": incident.severity,
        "incident_id": incident.id,
        "root_cause_kind": safe_label(causes[0].get("kind")) if causes else "unknown",
        "root_cause_ranks": ",".join(ranks[:16]) or "none",
        # the user's name for the job (OTEL_SERVICE_NAME) and the launch, beside the job id
        "mycroft_job_name": safe_label(incident.evidence.get("job_name") or incident.job),
        "mycroft_run": safe_label(incident.evidence.get("run_id") or "none"),
    }


def actions_line(actions: list[dict[str, Any]] | None) -> str:
    """What was done about the incident, one line per receiver annotation ("" when nothing)."""
    return "; ".join(f"{a.get('action')} {a.get('target') or '-'}: {a.get('result')} ({a.get('mode')})"
                     for a in (actions or [])[:8])


def alert_annotations(incident: Incident, external_url: str,
                      actions: list[dict[str, Any]] | None = None) -> dict[str, str]:
    causes = incident.root_causes
    base = external_url.rstrip("/")
    return {
        # what Mycroft did about it (or, observing, would have done): the policy's actions and their results
        "actions": safe_text(actions_line(actions), 1000),
        "summary": safe_text(incident.summary, 1000),
        "description": safe_text("\n".join(str(c.get("evidence", {}).get("text", "")) for c in causes[:8]), 4000),
        "root_cause": safe_text(root_cause_line({"root_causes": causes, "summary": incident.summary}), 500),
        "incident_url": f"{base}/api/v1/incidents/{incident.id}" if external_url else "",
        # the page with the wait-for graph and the timeline: what a human opens (generatorURL too)
        "incident_page": f"{base}/incidents/{incident.id}" if external_url else "",
    }


def fingerprint(labels: dict[str, str]) -> str:
    text = "\x1f".join(f"{k}={labels[k]}" for k in sorted(labels))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _ends_at(incident: Incident, now: float) -> str:
    if incident.status == RESOLVED and incident.resolved_at:
        return rfc3339(incident.resolved_at)
    return "0001-01-01T00:00:00Z"


def webhook_payload(incident: Incident, external_url: str = "", receiver: str = "mycroft",
                    actions: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Alertmanager webhook body (version 4) for one incident."""
    labels = alert_labels(incident)
    annotations = alert_annotations(incident, external_url, actions)
    group_labels = {"mycroft_job": labels["mycroft_job"], "kind": incident.kind}
    return {
        "version": "4",
        "groupKey": json.dumps(f'{{}}:{{kind="{incident.kind}", mycroft_job="{labels["mycroft_job"]}"}}')[1:-1],
        "truncatedAlerts": 0,
        "status": incident.status,
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": external_url,
        "alerts": [{
            "status": incident.status,
            "labels": labels,
            "annotations": annotations,
            "startsAt": rfc3339(incident.detected_at),
            "endsAt": _ends_at(incident, incident.updated_at),
            "generatorURL": annotations["incident_page"],
            "fingerprint": fingerprint(labels),
        }],
        # Mycroft's own record (receivers that know it need not call back), less the page's drawing:
        # alert bodies stay small, the drawing is one click away (generatorURL)
        "mycroft": {"incident": {**{k: v for k, v in incident.to_dict().items() if k != "view"},
                                 "actions": list(actions or [])}},
    }


def alertmanager_alerts(incident: Incident, external_url: str, now: float,
                        actions: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Body of POST /api/v2/alerts: firing alerts carry an endsAt we refresh by re-pushing."""
    ends = incident.resolved_at if incident.status == RESOLVED and incident.resolved_at else now + FIRING_ENDS_AFTER_S
    annotations = alert_annotations(incident, external_url, actions)
    return [{
        "labels": alert_labels(incident),
        "annotations": annotations,
        "startsAt": rfc3339(incident.detected_at),
        "endsAt": rfc3339(ends),
        "generatorURL": annotations["incident_page"] or "http://mycroft",
    }]


def sign(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The X-Mycroft-Signature value: "t=<unix s>,v1=<hex HMAC-SHA256(secret, b"<t>." + body)>"."""
    t = int(time.time()) if timestamp is None else int(timestamp)
    digest = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={digest}"


def verify(secret: str, body: bytes, header: str, now: float | None = None,
           window_s: float = REPLAY_WINDOW_S) -> bool:
    """What a receiver does: the HMAC matches the raw body and the timestamp is within the window."""
    fields = dict(part.strip().partition("=")[::2] for part in header.split(","))
    t_text, given = fields.get("t", ""), fields.get("v1", "")
    if not t_text.isdigit() or not given:
        return False
    now = time.time() if now is None else now
    if abs(now - int(t_text)) > window_s:
        return False
    return hmac.compare_digest(sign(secret, body, int(t_text)).partition(",v1=")[2], given)


def backoff_s(attempts: int, base: float = 0.5, cap: float = 60.0) -> float:
    return min(cap, base * (2 ** attempts))


Poster = Callable[[str, bytes, dict[str, str], float], int]


def http_post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


class Alerter:
    """Queues alert deliveries in the store's outbox and drains it on a thread."""

    def __init__(self, store: Store, webhooks: list[str], alertmanager: str | None, secret: str | None = None,
                 external_url: str = "", max_attempts: int = 12, post: Poster = http_post,
                 timeout_s: float = 5.0) -> None:
        self.store = store
        self.webhooks = list(webhooks)
        self.alertmanager = alertmanager.rstrip("/") if alertmanager else None
        self.secret = secret
        self.external_url = external_url
        self.max_attempts = max_attempts
        self.timeout_s = timeout_s
        self._post = post
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.sent = 0
        self.failed = 0
        self.given_up = 0
        self.max_firing = MAX_FIRING_ALERTS
        self._firing: set[str] = set()  # incidents paged as firing and not resolved since
        self.suppressed = 0  # firing incidents not paged because max_firing were already firing

    @property
    def enabled(self) -> bool:
        return bool(self.webhooks or self.alertmanager)

    def notify(self, incident: Incident, now: float | None = None) -> bool:
        """Queue the incident's current state for every configured receiver.

        At most `max_firing` distinct incidents are paged as firing at once (a flood of
        hung jobs must not become a flood of pages); past it a new one is counted in
        `suppressed` and False returned. Updates and resolutions of paged ones always go.
        """
        now = time.time() if now is None else now
        if incident.status == RESOLVED:
            self._firing.discard(incident.id)
        elif incident.id not in self._firing:
            if len(self._firing) >= self.max_firing:
                self.suppressed += 1
                return False
            self._firing.add(incident.id)
        actions = self.store.actions_of([incident.id])[incident.id]
        for url in self.webhooks:
            self.store.enqueue(f"{WEBHOOK} {url}", webhook_payload(incident, self.external_url, actions=actions), now)
        if self.alertmanager:
            self.store.enqueue(f"{ALERTMANAGER} {self.alertmanager}/api/v2/alerts",
                               {"alerts": alertmanager_alerts(incident, self.external_url, now, actions)}, now)
        self._wake.set()
        return True

    def refresh(self, incidents: list[Incident], now: float) -> None:
        """Re-push firing incidents to Alertmanager so they do not time out there."""
        if not self.alertmanager:
            return
        actions = self.store.actions_of(i.id for i in incidents)
        for incident in incidents:
            self.store.enqueue(f"{ALERTMANAGER} {self.alertmanager}/api/v2/alerts",
                               {"alerts": alertmanager_alerts(incident, self.external_url, now,
                                                              actions[incident.id])}, now)
        self._wake.set()

    def deliver_due(self, now: float | None = None) -> int:
        """One pass over the outbox; returns how many were delivered."""
        now = time.time() if now is None else now
        delivered = 0
        for item in self.store.due(now):
            kind, _, url = item.target.partition(" ")
            body = encode_body(item.payload["alerts"] if kind == ALERTMANAGER else item.payload)
            headers = {"Content-Type": "application/json", "User-Agent": "mycroft-rca"}
            if kind == WEBHOOK and self.secret:
                headers[SIGNATURE_HEADER] = sign(self.secret, body, int(time.time()))
            try:
                code = self._post(url, body, headers, self.timeout_s)
                error = "" if 200 <= code < 300 else f"HTTP {code}"
            except (OSError, ValueError) as exc:
                error = str(exc) or type(exc).__name__
            if not error:
                self.store.done(item.seq)
                self.sent += 1
                delivered += 1
                continue
            self.failed += 1
            if item.attempts + 1 >= self.max_attempts or (error.startswith("HTTP 4") and error != "HTTP 429"):
                log.error("giving up on alert to %s after %d attempts: %s", url, item.attempts + 1, error)
                self.store.done(item.seq)
                self.given_up += 1
            else:
                self.store.retry_later(item.seq, now + backoff_s(item.attempts), error)
        return delivered

    def start(self) -> Alerter:
        self._thread = threading.Thread(target=self._run, name="mycroft-rca-alerts", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.deliver_due()
            except Exception:  # keep delivering whatever a bad row did
                log.exception("alert delivery pass failed")
            self._wake.wait(0.2)
            self._wake.clear()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
