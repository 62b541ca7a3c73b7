"""The Hosts page of a fleet, loaded from a running service in headless Chromium.

Two weeks of a 24-host fleet's incidents are written into the service's store the way the
service writes them (store.save of incidents whose root-cause ranks ran on those hosts), and
one live job then loses a rank on the worst host: the acting policy drains it (a stub
scontrol). The page must list every host, the suspects first with their expiry, the drain,
and no console error; the screenshot is test-artefacts/hosts-page.png (docs/img/hosts-page.png
is one of these).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from mycroft.rca_service.incidents.action_policy import parse_policy
from mycroft.rca_service.incidents.hosts import DAY_S
from mycroft.rca_service.incidents.tracker import Incident
from mycroft.rca_service.service import RcaService, ServiceOptions

from .browser import ARTEFACTS, Browser
from .feeds import Feeder
from .helpers import get_json, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.requires("chromium")]

HOSTS = [f"gpu-node-{i:03d}" for i in range(1, 25)]
# (host, days ago, incident kind, root-cause kind, severity, consequence)
HISTORY = [
    ("gpu-node-017", 0.4, "hang", "process_lost", "critical", False),
    ("gpu-node-017", 2.2, "crash", "process_lost", "critical", False),
    ("gpu-node-017", 5.1, "hang", "process_lost", "critical", False),
    ("gpu-node-017", 11.0, "slowdown", "straggler", "warning", False),
    ("gpu-node-009", 1.3, "slowdown", "link", "warning", False),
    ("gpu-node-009", 3.8, "hang", "link", "critical", False),
    ("gpu-node-003", 0.9, "hang", "not_entered", "critical", False),
    ("gpu-node-021", 1.1, "mismatch", "mismatch", "critical", False),
    ("gpu-node-021", 1.2, "mismatch", "mismatch", "critical", False),
    ("gpu-node-012", 6.5, "crash", "process_lost", "info", True),
    ("gpu-node-005", 9.0, "hang", "not_entered", "critical", False),
]


def _history(service: RcaService, now: float) -> None:
    for i, (host, days, kind, cause, severity, consequence) in enumerate(HISTORY):
        at = now - days * DAY_S
        incident = Incident(id=f"hist{i:02d}{host[-3:]}", job=f"train-{i % 4}", kind=kind, status="resolved",
                            detected_at=at, summary=f"{kind}: rank {i} ({cause})",
                            root_causes=[{"rank": i, "kind": cause, "evidence": {"text": f"rank {i} {cause}"}}],
                            graph={}, evidence={"resolved_because": "condition cleared"}, updated_at=at + 60,
                            resolved_at=at + 60, severity=severity, critical_at=at if severity == "critical" else None,
                            consequence_of="earlier" if consequence else None, root_cause_hosts={str(i): host})
        service.store.save(incident)
    service.store.note_hosts_seen((host, f"train-{j}", now - 13 * DAY_S + j * 3600, now - 600)
                                  for host in HOSTS for j in range(3))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[RcaService, str]]:
    stub = tmp_path / "scontrol"
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    policy = parse_policy(yaml.safe_load(f"""
mode: act
rules:
  - kinds: [hang, crash]
    do: [abort_job, drain_node]
slurm: {{scontrol: {stub}}}
"""))
    service = RcaService(ServiceOptions(otlp_grpc=None, otlp_http="127.0.0.1:0", http="127.0.0.1:0",
                                        db=str(tmp_path / "rca.db"), tick_s=0.05, actions=policy)).start()
    try:
        yield service, f"http://127.0.0.1:{service.api.port}"
    finally:
        service.stop()


HOSTS_DOM = """(() => {
  const rows = Array.from(document.querySelectorAll('#hosts tr.host'));
  return {
    hosts: rows.map(r => r.dataset.host),
    suspects: rows.filter(r => r.classList.contains('suspect')).map(r => r.dataset.host),
    lemonCells: Array.from(rows[0].querySelectorAll('td')).map(td => td.textContent),
    seen: document.querySelector('#hosts-seen').textContent,
    width: document.documentElement.scrollWidth,
  };
})()"""


def test_hosts_page_shows_the_lemon_nodes_first(fleet: tuple[RcaService, str]) -> None:
    service, api = fleet
    _history(service, time.time())
    # a live job loses rank 1, on the worst host: a hang held by a lost process -> abort + drain
    live = Feeder("llama-70b", service.receiver.http_port or 0, culprit=1, lost=True,
                  hosts={0: "gpu-node-016", 1: "gpu-node-017", 2: "gpu-node-018", 3: "gpu-node-019"})
    try:
        def drained() -> bool:
            incidents = get_json(f"{api}/api/v1/incidents?job=llama-70b")
            return any(a["action"] == "drain_node" and a["result"] == "done"
                       for i in incidents for a in i.get("actions", []))

        assert wait_until(drained, 20), get_json(f"{api}/api/v1/incidents?job=llama-70b")
    finally:
        live.stop()
    service.note_hosts()
    browser = Browser()
    try:
        visit = browser.visit(f"{api}/hosts", HOSTS_DOM, ARTEFACTS / "hosts-page.png", height=900)
    finally:
        browser.close()
    dom: dict[str, Any] = visit.value
    assert visit.errors == [], visit.errors
    assert dom["suspects"] == ["gpu-node-017", "gpu-node-009"], dom
    assert dom["hosts"][:2] == ["gpu-node-017", "gpu-node-009"] and len(dom["hosts"]) == len(HOSTS)
    assert dom["seen"] == str(len(HOSTS))
    assert any("drain_node done" in cell for cell in dom["lemonCells"]), dom["lemonCells"]
    assert dom["width"] <= 1280, dom
    assert visit.screenshot is not None and visit.screenshot.stat().st_size > 10_000
