"""The incident drawing (graph_view.py) and pages (pages.py) on synthetic jobs: bounded at 16k
ranks, the root cause and the chain marked, sender text escaped, `analyze --html` written."""

from __future__ import annotations

import json
import re
from pathlib import Path

from mycroft.rca_service import cli
from mycroft.rca_service.analysis import graph_view
from mycroft.rca_service.analysis.verdict import analyze_job
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.incidents.tracker import IncidentTracker
from mycroft.rca_service.ingest.state import JobState, apply_records
from mycroft.rca_service.web.pages import graph_svg, incident_page, jobs_page

from mycroft.faults.made_up_job import Group, InFlightOp, heartbeat
from mycroft.otlp import encode_json

from .test_offline import _hung_records

NOW = 10_005.0


def _tp_dp_hang(world: int, tp: int, culprit: int) -> JobState:
    """One rank never enters its TP all_reduce; its TP peers wait on it, everyone else in DP on a TP peer."""
    cfg = AnalysisConfig()
    tps = [Group(f"tp{k}", tuple(range(k * tp, (k + 1) * tp))) for k in range(world // tp)]
    dps = [Group(f"dp{j}", tuple(range(j, world, tp))) for j in range(tp)]
    s = 7
    hbs = []
    for r in range(world):
        mine, dp = tps[r // tp], dps[r % tp]
        if r == culprit:
            hbs.append(heartbeat("big", r, world, NOW, 1, [mine, dp], [s - 1, s - 1], [s - 1, s - 1], idle_s=3.0,
                                 stack='File "train.py", line 1, in <load_batch>'))
        elif r in tps[culprit // tp].ranks:
            hbs.append(heartbeat("big", r, world, NOW, 1, [mine, dp], [s, s - 1], [s - 1, s - 1],
                                 [InFlightOp(mine, s, age_s=3.0)]))
        else:
            hbs.append(heartbeat("big", r, world, NOW, 1, [mine, dp], [s, s], [s, s - 1],
                                 [InFlightOp(dp, s, age_s=2.9)]))
    jobs: dict[str, JobState] = {}
    apply_records(jobs, hbs, NOW, cfg)
    return jobs["big"]


def test_a_16k_rank_hang_draws_small_with_the_root_cause_and_chain_marked() -> None:
    world, culprit = 16384, 8195
    job = _tp_dp_hang(world, 8, culprit)
    [finding] = analyze_job(job, NOW + 0.1, AnalysisConfig())
    view = finding.drawing()
    assert view["kind"] == "hang" and view["waiting_ranks"] == world - 1
    assert len(view["nodes"]) <= graph_view.MAX_NODES
    assert len(json.dumps(view)) < 64 * 1024  # stored with the incident: 16k ranks stay small
    roots = [n for n in view["nodes"] if n["root"]]
    assert [(n["type"], n.get("rank")) for n in roots] == [("rank", culprit)]
    by_id = {n["id"]: n for n in view["nodes"]}
    # the longest chain: rank -> DP op -> TP peer -> TP op -> culprit, across two groups
    chain = [by_id[i] for i in view["chains"][0]]
    assert chain[-1]["rank"] == culprit
    assert {graph_view.family(n["group"]) for n in chain if n["type"] == "op"} == {"tp", "dp"}
    # every waiting rank is accounted for in some node
    assert sum(n["count"] for n in view["nodes"] if n["type"] in ("rank", "ranks")) == world
    timeline = view["timeline"]["rows"]
    assert timeline[0]["rank"] == culprit and timeline[0]["role"] == "root"
    # neither its TP op (its TP peers wait) nor its DP op (its DP peers wait) was issued
    assert {m["group"] for m in timeline[0]["missing"]} == {f"tp{culprit // 8}", f"dp{culprit % 8}"}
    svg = graph_svg(view)
    assert svg.count('class="node rank root') == 1 and f'data-rank="{culprit}"' in svg
    assert svg.count('class="edge chain"') == len(chain) - 1


def test_page_escapes_what_came_from_spans() -> None:
    job = _tp_dp_hang(16, 4, 5)
    [finding] = analyze_job(job, NOW + 0.1, AnalysisConfig())
    incident = IncidentTracker(3.0).observe("big", [finding], NOW + 0.1)[0].incident.to_dict()
    incident["job"] = "<script>alert(1)</script>"
    incident["root_causes"][0]["evidence"]["stack"] = '<img src=x onerror="alert(2)">'
    page = incident_page(incident)
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;" in page and "&lt;load_batch&gt;" in page
    jobs = jobs_page([{"job": "<b>j</b>", "ranks": [{"rank": 0, "status": "alive", "host": "<i>h</i>"}]}],
                     [incident])
    assert "<b>j" not in jobs and "<i>h" not in jobs and re.search(r'href="/incidents/[0-9a-f]+"', jobs)


def test_analyze_writes_the_incident_page(tmp_path: Path) -> None:
    spans = tmp_path / "spans.json"
    spans.write_text(json.dumps(encode_json(_hung_records())))
    out = tmp_path / "incident.html"
    assert cli.main(["analyze", "--otlp-json", str(spans), "--html", str(out)]) == 2
    page = out.read_text()
    assert page.startswith("<!doctype html>") and 'class="node rank root onchain" data-node' in page
    assert 'data-rank="2"' in page and "not issued" in page
