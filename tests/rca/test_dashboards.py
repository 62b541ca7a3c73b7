"""The compose set-up's Grafana dashboard and Alertmanager template against the real service
and the real amtool: every metric the dashboard queries is one the service exports, every
datasource it names is provisioned, and the template renders the root-cause line and the page."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from mycroft.rca_service.analysis.findings import Finding, RootCause
from mycroft.rca_service.incidents.alerts import webhook_payload
from mycroft.rca_service.incidents.tracker import IncidentTracker
from mycroft.rca_service.service import RcaService, ServiceOptions

COMPOSE = Path(__file__).resolve().parents[2] / "otel-config" / "compose"
AMTOOL = shutil.which("amtool")


def _exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", []) if "expr" in t]


def test_dashboard_queries_what_the_service_exports(tmp_path: Path) -> None:
    dashboard = json.loads((COMPOSE / "grafana" / "mycroft.json").read_text())
    service = RcaService(ServiceOptions(otlp_grpc=None, otlp_http=None, http="127.0.0.1:0",
                                        db=str(tmp_path / "d.db"))).start()
    try:
        exported = set(service.metrics._help)
    finally:
        service.stop()
    queried = {m for e in _exprs(dashboard) for m in re.findall(r"\bmycroft_rca_\w+", e)}
    assert queried and queried <= exported, queried - exported
    uids = {d.get("uid") for d in yaml.safe_load((COMPOSE / "grafana-datasources.yaml").read_text())["datasources"]}
    used = {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p}
    assert used <= uids, used - uids
    traces = [t["query"] for p in dashboard["panels"] for t in p.get("targets", []) if t.get("queryType") == "traceql"]
    assert traces and all("resource.mycroft.job.id" in q for q in traces)  # one row (link) per collective trace
    provider = yaml.safe_load((COMPOSE / "grafana-dashboards.yaml").read_text())["providers"][0]
    compose = yaml.safe_load((COMPOSE / "docker-compose.yaml").read_text())
    assert f"./grafana:{provider['options']['path']}:ro" in compose["services"]["grafana"]["volumes"]


@pytest.mark.slow
@pytest.mark.requires("amtool")
def test_alertmanager_template_shows_the_root_cause_line(tmp_path: Path) -> None:
    assert AMTOOL is not None
    check = subprocess.run([AMTOOL, "check-config", str(COMPOSE / "alertmanager.yaml")], capture_output=True,
                           text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    finding = Finding("llama-70b", "hang", "7 ranks stuck in communication",
                      [RootCause(5, "not_entered", {"text": "rank 5 is alive but has not entered the op"})])
    incident = IncidentTracker(3.0).observe("llama-70b", [finding], 1_700_000_000.0)[0].incident
    data = tmp_path / "data.json"
    actions = [{"action": "abort_job", "target": "llama-70b", "result": "done", "mode": "act"}]
    data.write_text(json.dumps(webhook_payload(incident, "http://rca.example:8080", actions=actions)))  # template.Data
    out = subprocess.run([AMTOOL, "template", "render", f"--template.glob={COMPOSE / 'mycroft.tmpl'}",
                          '--template.text={{ template "mycroft.title" . }}\n{{ template "mycroft.text" . }}',
                          f"--template.data={data}"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "[FIRING:1] MycroftHang in llama-70b (critical)" in out.stdout
    assert "root cause: rank 5 (not_entered): rank 5 is alive but has not entered the op" in out.stdout
    assert f"graph and timeline: http://rca.example:8080/incidents/{incident.id}" in out.stdout
    assert "actions: abort_job llama-70b: done (act)" in out.stdout
