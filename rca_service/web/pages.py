"""HTML pages and SVG drawings of incidents and jobs, made on the server.

Static HTML + inline SVG, no script, no external resource (the cluster may be offline):
an incident page (`GET /incidents/{id}`, `mycroft rca analyze --html`), its wait-for
graph alone (`GET /incidents/{id}/graph.svg`), the jobs page (`GET /jobs`) and the hosts
page (`GET /hosts`: the fleet memory, lemon nodes first). Input is
the stored incident (its `view`, graph_view.py) or the API's jobs summary; every string
that came from spans (job names, stacks, group names) is escaped. Pure functions.
"""

from __future__ import annotations

import html
import itertools
import json
from typing import Any
from urllib.parse import quote

from ..analysis.findings import cause_who
from ..incidents.tracker import root_cause_line

NODE_W, NODE_H = 176, 42
COL_W, ROW_H = 236, 58
PAD = 16
PALETTE = ("#4e79a7", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#9c755f", "#bab0ac", "#f28e2b")
ROOT = "#d62728"
WAIT = "#ff9f1c"


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _color(name: str, palette: dict[str, str]) -> str:
    if name not in palette:
        palette[name] = PALETTE[len(palette) % len(PALETTE)]
    return palette[name]


# ------------------------------------------------------------------ wait-for graph
def graph_svg(view: dict[str, Any], standalone: bool = False) -> str:
    """The condensed wait-for graph, left (waiting) to right (root cause)."""
    nodes = list(view.get("nodes") or [])
    if not nodes:
        return '<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="320" height="40">' \
               '<text x="8" y="24">no wait-for graph for this incident</text></svg>'
    depth = max(int(n.get("dist", 0)) for n in nodes)
    chains = [list(c) for c in view.get("chains") or []]
    on_chain = {nid for c in chains for nid in c}
    chain_edges = {(a, b) for c in chains for a, b in itertools.pairwise(c)}
    order = {nid: i for i, nid in enumerate(nid for c in chains for nid in c)}
    columns: dict[int, list[dict[str, Any]]] = {}
    for n in sorted(nodes, key=lambda n: (n["id"] not in on_chain, order.get(n["id"], 0), int(n["id"][1:]))):
        columns.setdefault(depth - int(n.get("dist", 0)), []).append(n)
    pos: dict[str, tuple[float, float]] = {}
    for col, members in columns.items():
        for row, n in enumerate(members):
            pos[n["id"]] = (PAD + col * COL_W, PAD + 18 + row * ROW_H)
    width = PAD * 2 + (depth + 1) * COL_W - (COL_W - NODE_W)
    height = PAD * 2 + 18 + max(len(m) for m in columns.values()) * ROW_H + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">']
    if standalone:
        out.append(f"<style>{_SVG_STYLE}</style>")
    marker = ('viewBox="0 0 10 10" refX="9" refY="5" markerUnits="userSpaceOnUse" markerWidth="9" '
              'markerHeight="9" orient="auto-start-reverse"')
    out.append(f'<defs><marker id="arrow" {marker}><path d="M0,0 L10,5 L0,10 z" fill="#666"/></marker>'
               f'<marker id="arrow-chain" {marker}><path d="M0,0 L10,5 L0,10 z" fill="{ROOT}"/></marker></defs>')
    out.append(f'<text x="{PAD}" y="{PAD + 4}" class="axis">waits on &#8594;</text>'
               f'<text x="{width - PAD}" y="{PAD + 4}" class="axis" text-anchor="end">root cause</text>')
    for e in view.get("edges") or []:
        a, b = pos.get(e["from"]), pos.get(e["to"])
        if a is None or b is None:
            continue
        chain = (e["from"], e["to"]) in chain_edges
        x1, y1 = a[0] + NODE_W, a[1] + NODE_H / 2
        x2, y2 = b[0], b[1] + NODE_H / 2
        if x2 > x1:
            mid = (x1 + x2) / 2
            d = f"M{x1:.0f},{y1:.0f} C{mid:.0f},{y1:.0f} {mid:.0f},{y2:.0f} {x2:.0f},{y2:.0f}"
        else:  # same column or backwards (a cycle): an arc under the boxes
            x1, y1 = a[0] + NODE_W / 2, a[1] + NODE_H
            x2, y2 = b[0] + NODE_W / 2, b[1] + NODE_H
            low = max(y1, y2) + 24
            d = f"M{x1:.0f},{y1:.0f} C{x1:.0f},{low:.0f} {x2:.0f},{low:.0f} {x2:.0f},{y2:.0f}"
        cls = "edge chain" if chain else "edge"
        marker = "arrow-chain" if chain else "arrow"
        out.append(f'<path class="{cls}" data-from="{esc(e["from"])}" data-to="{esc(e["to"])}" d="{d}" '
                   f'marker-end="url(#{marker})"/>')
        if int(e.get("count", 1)) > 1:
            out.append(f'<text class="count" x="{(x1 + x2) / 2:.0f}" y="{(y1 + y2) / 2 - 4:.0f}">'
                       f'x{int(e["count"])}</text>')
    for n in nodes:
        x, y = pos[n["id"]]
        kind = str(n.get("type", ""))
        cls = f"node {kind}" + (" root" if n.get("root") else "") + (" onchain" if n["id"] in on_chain else "")
        attrs = f'data-node="{esc(n["id"])}" data-type="{esc(kind)}"'
        if kind == "rank":
            attrs += f' data-rank="{int(n["rank"])}"'
        if kind == "op":
            attrs += f' data-group="{esc(n.get("group", ""))}" data-seq="{int(n.get("seq", 0))}"'
        rx = 18 if kind in ("rank", "ranks") else 4
        tip = f'{n.get("label", "")} {n.get("sub", "")}'
        if kind == "rank" and n.get("host"):
            tip += f' on {n["host"]}'
        out.append(f'<g class="{cls}" {attrs}><title>{esc(tip)}</title>'
                   f'<rect x="{x:.0f}" y="{y:.0f}" width="{NODE_W}" height="{NODE_H}" rx="{rx}"/>'
                   f'<text x="{x + NODE_W / 2:.0f}" y="{y + 17:.0f}" text-anchor="middle" class="label">'
                   f'{esc(_clip(n.get("label", ""), 28))}</text>'
                   f'<text x="{x + NODE_W / 2:.0f}" y="{y + 33:.0f}" text-anchor="middle" class="sub">'
                   f'{esc(_clip(n.get("sub", ""), 30))}</text></g>')
    notes = []
    if view.get("omitted_nodes"):
        notes.append(f'{int(view["omitted_nodes"])} more nodes not drawn')
    notes.append(f'graph: {int(view.get("graph_nodes", 0))} nodes, {int(view.get("graph_edges", 0))} edges, '
                 f'{int(view.get("waiting_ranks", 0))} waiting ranks; drawn: {len(nodes)} nodes')
    out.append(f'<text x="{PAD}" y="{height - 10}" class="axis">{esc("; ".join(notes))}</text>')
    out.append("</svg>")
    return "".join(out)


def _clip(text: Any, n: int) -> str:
    s = str(text)
    return s if len(s) <= n else s[: n - 1] + "\u2026"


# ------------------------------------------------------------------ timelines
def _ticks(lo: float, hi: float, n: int = 6) -> list[float]:
    span = max(hi - lo, 1e-3)
    raw = span / n
    step = min((s for s in (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 300, 600)
                if s >= raw), default=raw)
    first = (lo // step + 1) * step
    out: list[float] = []
    t = first
    while t < hi and len(out) < 20:
        out.append(round(t, 6))
        t += step
    return out


def hang_timeline_svg(timeline: dict[str, Any], width: int = 1180) -> str:
    """Per rank and group: completed ops (bars), ops in flight (open bars to now), ops it never issued."""
    rows = list(timeline.get("rows") or [])
    if not rows:
        return '<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="320" height="40">' \
               '<text x="8" y="24">no timeline</text></svg>'
    now = float(timeline.get("now") or 0.0)
    starts = [float(o["start"]) for r in rows for o in r["ops"]]
    lo = min([*starts, -1.0])
    lo = max(lo, now - 60.0 if now > 0 else lo)  # at most a minute before now
    hi = max(now, 0.0) + 0.05 * max(now - lo, 1.0)
    left, right = 200, 230
    plot = width - left - right
    lane_h = 13

    def x(t: float) -> float:
        return left + (min(max(t, lo), hi) - lo) / (hi - lo) * plot

    palette: dict[str, str] = {}
    out: list[str] = []
    y = 28
    for row in rows:
        groups = sorted({o["group"] for o in row["ops"]}) or ["-"]
        h = max(1, len(groups)) * lane_h + 8
        role = str(row.get("role", ""))
        out.append(f'<g class="tl-row {esc(role)}" data-rank="{int(row["rank"])}">')
        out.append(f'<rect class="band {esc(role)}" x="0" y="{y - 2}" width="{width}" height="{h}"/>')
        label = f'rank {row["rank"]}' + {"root": " \u2190 root cause", "chain": " (chain)"}.get(role, "")
        out.append(f'<text x="6" y="{y + 11}" class="rowlabel">{esc(label)}</text>')
        for i, grp in enumerate(groups):
            gy = y + i * lane_h
            out.append(f'<text x="{left - 6}" y="{gy + 10}" text-anchor="end" class="lane">'
                       f'{esc(_clip(grp, 14))}</text>')
        for o in row["ops"]:
            gy = y + groups.index(o["group"]) * lane_h
            x0 = x(float(o["start"]))
            x1 = x(now if o["end"] is None else float(o["end"]))
            w = max(2.0, x1 - x0)
            if o["state"] == "in_flight":
                out.append(f'<rect class="op inflight" x="{x0:.1f}" y="{gy:.0f}" width="{w:.1f}" height="10">'
                           f'<title>{esc(o["group"])} seq {int(o["seq"])} {esc(o.get("op", ""))}: in flight since '
                           f'{float(o["start"]):+.3f}s</title></rect>')
            else:
                color = _color(o["group"].split(" ")[-1].rstrip("0123456789"), palette)
                out.append(f'<rect class="op done" fill="{color}" x="{x0:.1f}" y="{gy:.0f}" width="{w:.1f}" '
                           f'height="10"><title>{esc(o["group"])} seq {int(o["seq"])}: {float(o["start"]):+.3f}s '
                           f'to {float(o["end"]):+.3f}s</title></rect>')
        idle = row.get("idle_s")
        if role == "root" and idle:  # how long it has been outside communication: the gap that stands out
            x0 = x(now - float(idle))
            out.append(f'<rect class="idle" x="{x0:.1f}" y="{y:.0f}" width="{max(2.0, x(now) - x0):.1f}" '
                       f'height="10"><title>outside communication for {float(idle):.1f}s</title></rect>')
        missing = row.get("missing") or []
        if missing:
            text = "not issued: " + ", ".join(f'{m["group"]} seq {m["seq"]}' for m in missing[:3])
            out.append(f'<text class="missing" x="{left + plot + 8}" y="{y + 11}">{esc(_clip(text, 34))}</text>')
        elif row.get("status") == "never reported":
            out.append(f'<text class="missing" x="{left + plot + 8}" y="{y + 11}">never reported</text>')
        out.append("</g>")
        y += h + 4
    height = y + 24
    axis = [f'<line class="onset" x1="{x(0.0):.1f}" y1="14" x2="{x(0.0):.1f}" y2="{y}"/>',
            f'<text class="axis" x="{x(0.0) + 3:.1f}" y="12">onset</text>',
            f'<line class="now" x1="{x(now):.1f}" y1="14" x2="{x(now):.1f}" y2="{y}"/>',
            f'<text class="axis" x="{x(now) + 3:.1f}" y="24">detected</text>']
    for t in _ticks(lo, hi):
        axis.append(f'<text class="axis" x="{x(t):.1f}" y="{y + 16}" text-anchor="middle">{t:+g}s</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
            + "".join(out) + "".join(axis) + "</svg>")


def _line_chart(rows: list[dict[str, Any]], key: str, title: str, unit: str, width: int, height: int,
                cls: str) -> str:
    series = [(r, [(float(p[0]), float(p[1])) for p in r.get(key) or []]) for r in rows]
    pts = [p for _, s in series for p in s]
    left, top, bottom, right = 56, 24, 24, 120
    out: list[str] = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart {cls}" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<text x="{left}" y="14" class="title">{esc(title)}</text>']
    if not pts:
        out.append(f'<text x="{left}" y="{height / 2:.0f}">no samples</text></svg>')
        return "".join(out)
    t_lo, t_hi = min(p[0] for p in pts), max(p[0] for p in pts)
    v_lo, v_hi = 0.0, max(max(p[1] for p in pts) * 1.1, 1e-3)
    pw, ph = width - left - right, height - top - bottom

    def x(t: float) -> float:
        return left + (t - t_lo) / max(t_hi - t_lo, 1e-9) * pw

    def y(v: float) -> float:
        return top + ph - (v - v_lo) / (v_hi - v_lo) * ph

    out.append(f'<line class="axisline" x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}"/>'
               f'<line class="axisline" x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}"/>')
    for v in _ticks(v_lo, v_hi, 4):
        label = f"{v:.0%}" if unit == "%" else f"{v * 1000:.0f} ms"
        out.append(f'<text class="axis" x="{left - 4}" y="{y(v) + 4:.0f}" text-anchor="end">{label}</text>')
    for t in _ticks(t_lo, t_hi, 6):
        out.append(f'<text class="axis" x="{x(t):.0f}" y="{height - 6}" text-anchor="middle">{t:+g}s</text>')
    for r, s in sorted(series, key=lambda rs: rs[0].get("role") == "root"):  # the culprit drawn last, on top
        if not s:
            continue
        role = str(r.get("role", ""))
        d = " ".join(f"{'M' if i == 0 else 'L'}{x(t):.1f},{y(v):.1f}" for i, (t, v) in enumerate(s))
        out.append(f'<path class="series {esc(role)}" data-rank="{int(r["rank"])}" d="{d}">'
                   f'<title>rank {int(r["rank"])} ({esc(role)})</title></path>')
        if role == "root":
            t, v = s[-1]
            out.append(f'<text class="serieslabel root" x="{x(t) + 4:.0f}" y="{y(v) + 4:.0f}">rank {int(r["rank"])}'
                       f'</text>')
    out.append("</svg>")
    return "".join(out)


def slow_svgs(view: dict[str, Any]) -> str:
    rows = list(view.get("rows") or [])
    return (_line_chart(rows, "compute", "compute share per heartbeat interval (1 - time in communication)", "%",
                        1180, 240, "compute")
            + _line_chart(rows, "lag", "arrival lag: issued after the group's first member", "s", 1180, 240, "lag"))


# ------------------------------------------------------------------ pages
_SVG_STYLE = f"""
.node rect {{ fill: #eef3fa; stroke: #4e79a7; stroke-width: 1.2; }}
.node.ranks rect, .node.ops rect, .node.p2ps rect {{ fill: #f4f4f4; stroke: #888; stroke-dasharray: 4 2; }}
.node.op rect, .node.p2p rect {{ fill: #fff7e6; stroke: {WAIT}; }}
.node.onchain rect {{ stroke-width: 2; }}
.node.root rect {{ fill: #fde2e2; stroke: {ROOT}; stroke-width: 3; }}
.node .label {{ font-weight: bold; fill: #222; }} .node .sub {{ fill: #555; font-size: 11px; }}
.edge {{ fill: none; stroke: #888; stroke-width: 1.2; }}
.edge.chain {{ stroke: {ROOT}; stroke-width: 2.5; }}
.count {{ fill: #666; font-size: 10px; }} .axis {{ fill: #666; font-size: 11px; }}
.band {{ fill: transparent; }} .band.root {{ fill: #fde2e2; }} .band.chain {{ fill: #fff7e6; }}
.rowlabel {{ font-weight: bold; fill: #222; }} .lane {{ fill: #666; font-size: 10px; }}
.op.inflight {{ fill: {WAIT}; opacity: 0.55; stroke: {WAIT}; }}
.missing {{ fill: {ROOT}; font-weight: bold; }}
.idle {{ fill: none; stroke: {ROOT}; stroke-width: 1.5; stroke-dasharray: 5 3; }}
.onset {{ stroke: {ROOT}; stroke-dasharray: 4 3; }} .now {{ stroke: #333; stroke-dasharray: 2 2; }}
.axisline {{ stroke: #999; }} .title {{ font-weight: bold; fill: #222; }}
.series {{ fill: none; stroke: #9aa5b1; stroke-width: 1.2; opacity: 0.8; }}
.series.root {{ stroke: {ROOT}; stroke-width: 3; opacity: 1; }}
.series.waiting {{ stroke: {WAIT}; }} .serieslabel.root {{ fill: {ROOT}; font-weight: bold; }}
"""

_PAGE_STYLE = """
body { font-family: sans-serif; margin: 0; color: #222; background: #fafafa; }
header { background: #263238; color: #fff; padding: 10px 20px; }
header a { color: #cfd8dc; margin-right: 16px; }
main { padding: 12px 20px; max-width: 1240px; }
h1 { font-size: 20px; margin: 8px 0; } h2 { font-size: 16px; margin: 18px 0 6px; border-bottom: 1px solid #ddd; }
.badge { display: inline-block; padding: 2px 8px; border-radius: 10px; font-size: 12px; color: #fff; }
.critical { background: #d62728; } .warning { background: #f28e2b; } .info { background: #4e79a7; }
.firing { background: #b71c1c; } .resolved { background: #2e7d32; }
.summary { font-size: 15px; margin: 6px 0 10px; }
.cause { background: #fff; border-left: 5px solid #d62728; padding: 8px 12px; margin: 6px 0; }
pre { background: #263238; color: #eceff1; padding: 8px; overflow: auto; max-height: 260px; font-size: 12px; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ddd; padding: 3px 8px; }
th { background: #eceff1; text-align: left; }
.scroll { overflow: auto; max-width: 1240px; background: #fff; border: 1px solid #ddd; }
.muted { color: #666; font-size: 13px; } dl { display: grid; grid-template-columns: 160px 1fr; margin: 0; }
dt { color: #666; } dd { margin: 0 0 4px; }
.result { display: inline-block; padding: 1px 7px; border-radius: 8px; font-size: 12px; background: #eceff1; }
.result.done { background: #c8e6c9; }
.result.failed, .result.undeliverable, .result.interrupted { background: #ffcdd2; }
.result.observed { background: #e3f2fd; } .result.owed, .result.running { background: #fff3cd; }
tr.suspect td:first-child { border-left: 5px solid #d62728; font-weight: bold; }
.day { display: inline-block; width: 11px; height: 11px; margin-right: 2px; border-radius: 2px; background: #eceff1; }
.day.n1 { background: #ffcc80; } .day.n2 { background: #fb8c00; } .day.n3 { background: #d62728; }
.chip { display: inline-block; padding: 0 6px; margin: 1px 2px; border-radius: 8px; font-size: 12px;
        background: #eceff1; } .tiles { display: flex; gap: 12px; margin: 8px 0 14px; }
.tile { background: #fff; border: 1px solid #ddd; padding: 8px 14px; min-width: 120px; }
.tile b { display: block; font-size: 22px; } .tile.bad b { color: #d62728; } .nowrap { white-space: nowrap; }
"""


def _page(title: str, body: str) -> str:
    return ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=1280\"><link rel=\"icon\" href=\"data:,\">"
            f"<title>{esc(title)}</title><style>{_PAGE_STYLE}{_SVG_STYLE}</style></head><body>"
            "<header><a href=\"/jobs\">Jobs</a><a href=\"/hosts\">Hosts</a>"
            "<a href=\"/api/v1/incidents\">Incidents (JSON)</a>"
            f"<strong>Mycroft</strong></header><main>{body}</main></body></html>")


def _flows_table(flows: list[dict[str, Any]]) -> str:
    head = ("<table class=\"flows\"><tr><th>rank</th><th>peer</th><th>side</th><th>channel</th><th>seq</th>"
            "<th>GPU-ready</th><th>transmitted</th><th>done</th><th>steps</th><th>state</th><th>suspect</th></tr>")
    rows = []
    for f in flows[:32]:
        c = f.get("counters") or {}
        suspect = "" if f.get("suspect_rank") is None else f"rank {f['suspect_rank']} ({f.get('suspect_side', '')})"
        rows.append(f"<tr><td>{esc(f.get('rank'))}</td><td>{esc(f.get('peer'))}</td><td>{esc(f.get('side'))}</td>"
                    f"<td>{esc(f.get('channel'))}</td><td>{esc(f.get('seq'))}</td><td>{esc(c.get('gpu_ready'))}</td>"
                    f"<td>{esc(c.get('transmitted'))}</td><td>{esc(c.get('done'))}</td><td>{esc(c.get('steps'))}</td>"
                    f"<td>{esc(f.get('state'))}</td><td>{esc(suspect)}</td></tr>")
    return head + "".join(rows) + "</table>"


def incident_page(incident: dict[str, Any], api_base: str = "") -> str:
    """The whole incident page: verdict, root causes with their evidence, graph, timeline."""
    iid = str(incident.get("id", ""))
    sev = str(incident.get("severity", ""))
    status = str(incident.get("status", ""))
    view = incident.get("view") or {}
    evidence = incident.get("evidence") or {}
    named = str(evidence.get("job_name") or "")  # the user's name for the job (OTEL_SERVICE_NAME)
    run = str(evidence.get("run_id") or "")
    title = f"{named} ({incident.get('job', '')})" if named else str(incident.get("job", ""))
    body = [f'<h1>{esc(str(incident.get("kind", "")).title())} in job <span id="job">{esc(title)}</span> '
            f'<span class="badge {esc(sev)}" id="severity">{esc(sev)}</span> '
            f'<span class="badge {esc(status)}">{esc(status)}</span></h1>'
            + (f'<div class="muted" id="run">run {esc(run)}</div>' if run else ""),
            f'<div class="summary" id="summary">{esc(incident.get("summary", ""))}</div>',
            "<dl>",
            f'<dt>root cause</dt><dd id="root-cause-line"><strong>{esc(root_cause_line(incident))}</strong></dd>',
            f'<dt>why {esc(sev)}</dt><dd>{esc(incident.get("severity_reason") or "the default for this kind")}</dd>',
            f'<dt>detected</dt><dd>{esc(incident.get("detected_at", ""))}</dd>',
            f'<dt>root cause named</dt><dd>{esc(incident.get("root_cause_at") or "-")}</dd>',
            f'<dt>critical since</dt><dd>{esc(incident.get("critical_at") or "-")}</dd>',
            f'<dt>resolved</dt><dd>{esc(incident.get("resolved_at") or "-")}</dd>']
    if incident.get("actions"):  # what was done about it, at the top: the table is further down
        done = ", ".join(f'{a.get("action")} {a.get("target") or ""} {a.get("result")}'.replace("  ", " ")
                         for a in incident["actions"][:6])
        body.append(f'<dt>actions</dt><dd><a href="#actions">{esc(done)}</a></dd>')
    if incident.get("consequence_of"):
        other = str(incident["consequence_of"])
        body.append(f'<dt>consequence of</dt><dd><a href="{api_base}/incidents/{quote(other)}">{esc(other)}</a></dd>')
    body.append(f'<dt>data</dt><dd><a href="{api_base}/api/v1/incidents/{quote(iid)}">JSON</a>'
                + (f' &middot; <a href="{api_base}/incidents/{quote(iid)}/graph.svg">graph.svg</a>'
                   if view.get("kind") == "hang" else "") + "</dd></dl>")
    body.append("<h2>Root cause</h2>")
    for cause in (incident.get("root_causes") or [])[:8]:
        ev = cause.get("evidence") or {}
        part = [f'<div class="cause" data-rank="{esc(cause.get("rank"))}"><strong>{esc(cause_who(cause))}: '
                f'{esc(cause.get("kind"))}</strong><div>{esc(ev.get("text", ""))}</div>']
        if ev.get("longest_wait_chain"):
            part.append(f'<div class="muted">longest wait chain: {esc(ev["longest_wait_chain"])}</div>')
        stack = ev.get("stack") or ev.get("last_stack")
        if stack:
            part.append(f"<div class=\"muted\">its stack{' (last seen)' if ev.get('last_stack') else ''}:</div>"
                        f"<pre class=\"stack\">{esc(stack)}</pre>")
        if ev.get("flows"):
            part.append("<div class=\"muted\">native flow state (per channel / peer):</div>"
                        + _flows_table(list(ev["flows"])))
        part.append("</div>")
        body.append("".join(part))
    if view.get("kind") == "hang":
        body.append("<h2>Wait-for graph</h2><div class=\"muted\">an arrow A &#8594; B: A cannot progress until B "
                    "does; ranks waiting in the same op are drawn as one box; the root cause is red</div>")
        body.append(f'<div class="scroll" id="graph">{graph_svg(view)}</div>')
        body.append("<h2>Timeline around the onset</h2><div class=\"muted\">per rank and group: completed ops "
                    "(bars), ops in flight (orange, to detection), the root cause's time outside communication (dashed "
                    "red) and the ops it never issued</div>")
        body.append(f'<div class="scroll" id="timeline">{hang_timeline_svg(view.get("timeline") or {})}</div>')
    elif view.get("kind") == "slowdown":
        body.append("<h2>Compute and arrival over time</h2><div class=\"muted\">the root cause in red, the ranks "
                    "waiting on it in orange, seconds before the last heartbeat</div>")
        body.append(f'<div class="scroll" id="timeline">{slow_svgs(view)}</div>')
        body.append(_slow_table(view))
    graph = incident.get("wait_for_graph") or {}
    if graph.get("chains"):
        body.append("<h2>Wait chains</h2><ul>" + "".join(f"<li>{esc(c)}</li>" for c in graph["chains"][:8])
                    + "</ul>")
    if incident.get("actions"):
        body.append(_actions_table(list(incident["actions"])))
    if incident.get("consequences"):
        body.append("<h2>What happened next (consequences)</h2><ul>" + "".join(
            f'<li>{esc(c.get("at"))}: rank {esc(c.get("rank"))} {esc(c.get("kind"))} - {esc(c.get("text", ""))}</li>'
            for c in incident["consequences"][:16]) + "</ul>")
    ev = incident.get("evidence") or {}
    if ev:
        body.append("<h2>Evidence</h2><pre>" + esc(json.dumps(ev, indent=1, default=str)[:6000]) + "</pre>")
    return _page(f"{incident.get('kind', 'incident')} in {incident.get('job', '')} - Mycroft", "".join(body))


def _slow_table(view: dict[str, Any]) -> str:
    rows = ["<table class=\"slow\"><tr><th>rank</th><th>role</th><th>mean compute share</th>"
            "<th>mean arrival lag</th></tr>"]
    for r in view.get("rows") or []:
        mc = r.get("mean_compute")
        ml = r.get("mean_lag_s")
        rows.append(f"<tr data-rank=\"{int(r['rank'])}\"><td>{int(r['rank'])}</td><td>{esc(r.get('role'))}</td>"
                    f"<td>{'-' if mc is None else f'{mc:.0%}'}</td>"
                    f"<td>{'-' if ml is None else f'{ml * 1000:.0f} ms'}</td></tr>")
    return "".join(rows) + "</table>"


def jobs_page(jobs: list[dict[str, Any]], incidents: list[dict[str, Any]]) -> str:
    """Live jobs with their ranks' status, and the recent incidents linked."""
    body = ["<h1>Live jobs</h1>"]
    if not jobs:
        body.append("<p class=\"muted\">no live jobs</p>")
    for job in jobs[:64]:
        counts = ", ".join(f"{n} {s}" for s, n in sorted((job.get("status_counts") or {}).items()))
        body.append(f'<h2 class="job" data-job="{esc(job.get("job"))}">{esc(job.get("job"))} '
                    f'<span class="muted">world {esc(job.get("world_size"))}, {esc(job.get("ranks_seen"))} ranks seen '
                    f'({esc(counts)}), {esc(job.get("seconds_since_progress"))} s since progress</span></h2>')
        body.append("<table><tr><th>rank</th><th>status</th><th>host</th><th>heartbeat</th><th>silent s</th>"
                    "<th>idle s</th><th>in flight</th></tr>")
        for r in (job.get("ranks") or [])[:256]:
            inflight = "; ".join(f'{o.get("op")} {o.get("group_id", "")[:10]} seq {o.get("seq")} ({o.get("age_s")} s)'
                                 for o in (r.get("in_flight") or [])[:3])
            body.append(f'<tr><td>{esc(r.get("rank"))}</td><td>{esc(r.get("status"))}</td><td>{esc(r.get("host"))}'
                        f'</td><td>{esc(r.get("heartbeat"))}</td><td>{esc(r.get("silent_s"))}</td>'
                        f'<td>{esc(r.get("idle_s"))}</td><td>{esc(inflight)}</td></tr>')
        body.append("</table>")
    body.append("<h1>Recent incidents</h1><table><tr><th>detected</th><th>job</th><th>kind</th><th>severity</th>"
                "<th>status</th><th>root cause</th></tr>")
    for inc in incidents[:100]:
        body.append(f'<tr><td>{esc(inc.get("detected_at"))}</td><td>{esc(inc.get("job"))}</td>'
                    f'<td><a href="/incidents/{quote(str(inc.get("id", "")))}">{esc(inc.get("kind"))}</a></td>'
                    f'<td><span class="badge {esc(inc.get("severity"))}">{esc(inc.get("severity"))}</span></td>'
                    f'<td>{esc(inc.get("status"))}</td><td>{esc(_clip(root_cause_line(inc), 140))}</td></tr>')
    body.append("</table>")
    return _page("Jobs - Mycroft", "".join(body))


def _actions_table(actions: list[dict[str, Any]]) -> str:
    """What Mycroft did (or, observing, would have done) about the incident: its audit trail."""
    rows = ["<h2>Actions</h2><table class=\"actions\" id=\"actions\"><tr><th>action</th><th>target</th>"
            "<th>mode</th><th>result</th><th>at</th><th>detail</th></tr>"]
    for a in actions[:32]:
        result = str(a.get("result", ""))
        rows.append(f'<tr data-action="{esc(a.get("action"))}" data-result="{esc(result)}"><td>{esc(a.get("action"))}'
                    f'</td><td>{esc(a.get("target"))}</td><td>{esc(a.get("mode"))}</td>'
                    f'<td><span class="result {esc(result)}">{esc(result)}</span></td><td>{esc(a.get("at"))}</td>'
                    f'<td>{esc(_clip(a.get("detail", ""), 300))}</td></tr>')
    return "".join(rows) + "</table>"


def _days(daily: list[int]) -> str:
    """The last 14 days, oldest on the left: one square per day, darker with more incidents."""
    cells = []
    for age, n in reversed(list(enumerate(daily))):
        cls = "" if n <= 0 else f" n{min(n, 3)}"
        cells.append(f'<span class="day{cls}" title="{age} day(s) ago: {n} incident(s)"></span>')
    return "".join(cells)


def _ago(now: float, at: Any) -> str:
    """A time as an age ("3.2 d ago", "12 min ago"): a fleet is read by recency."""
    if at is None:
        return "-"
    delta = now - float(at)
    later = delta < 0
    delta = abs(delta)
    text = f"{delta:.0f} s" if delta < 90 else f"{delta / 60:.0f} min" if delta < 5400 else \
        f"{delta / 3600:.1f} h" if delta < 86400 * 1.5 else f"{delta / 86400:.1f} d"
    return f"in {text}" if later else f"{text} ago"


def hosts_page(hosts: list[dict[str, Any]], now: float) -> str:
    """The fleet memory: every host seen, suspects (lemon nodes) first, with what their ranks caused."""
    suspects = [h for h in hosts if h.get("suspect")]
    with_incidents = [h for h in hosts if h.get("incidents")]
    acted = sum(1 for h in hosts for a in h.get("actions") or [] if a.get("result") in ("done", "observed"))
    body = ["<h1>Hosts</h1><div class=\"muted\">every host a rank ran on, across jobs; a host is a suspect while "
            "enough recent incidents named one of its ranks as the root cause; what a launcher excludes: "
            "<code>srun --exclude=$(curl .../api/v1/hosts/suspect?format=slurm)</code></div>",
            f'<div class="tiles"><div class="tile"><b id="hosts-seen">{len(hosts)}</b>hosts seen</div>'
            f'<div class="tile{" bad" if suspects else ""}"><b id="hosts-suspect">{len(suspects)}</b>suspects</div>'
            f'<div class="tile"><b>{len(with_incidents)}</b>with root-cause incidents</div>'
            f'<div class="tile"><b>{acted}</b>node actions (done / observed)</div></div>',
            "<table class=\"hosts\" id=\"hosts\"><tr><th>host</th><th>suspect</th><th>incidents</th>"
            "<th>last 14 days</th><th>by kind</th><th>root causes</th><th>last incident</th><th>jobs</th>"
            "<th>seen first / last</th><th>node actions</th></tr>"]
    for h in hosts[:1000]:
        last = h.get("last_incident") or {}
        link = (f'<a href="/incidents/{quote(str(last.get("id", "")))}">{esc(last.get("kind"))}</a> '
                f'{esc(_ago(now, last.get("at_unix")))} <span class="muted">in {esc(_clip(last.get("job", ""), 20))}'
                "</span>" if last else "-")
        chips = "".join(f'<span class="chip">{esc(k)} {int(n)}</span>' for k, n in (h.get("by_kind") or {}).items())
        causes = "".join(f'<span class="chip">{esc(k)} {int(n)}</span>' for k, n in (h.get("by_cause") or {}).items())
        acts = "<br>".join(f'{esc(a.get("action"))} <span class="result {esc(a.get("result"))}">'
                           f'{esc(a.get("result"))}</span> {esc(_ago(now, a.get("at_unix")))}'
                           for a in (h.get("actions") or [])[:3])
        suspect = (f'<span class="badge critical" title="until {esc(h.get("suspect_until"))}">suspect</span> '
                   f'{esc(_ago(now, h.get("suspect_until_unix")).replace("in ", ""))} left'
                   if h.get("suspect") else "-")
        seen = f'{esc(_ago(now, h.get("first_seen_unix")))} / {esc(_ago(now, h.get("last_seen_unix")))}'
        body.append(f'<tr class="host{" suspect" if h.get("suspect") else ""}" data-host="{esc(h.get("host"))}">'
                    f'<td class="nowrap">{esc(h.get("host"))}</td><td class="nowrap">{suspect}</td>'
                    f'<td>{int(h.get("incidents") or 0)}</td><td class="nowrap">{_days(list(h.get("daily") or []))}'
                    f'</td><td>{chips or "-"}</td><td>{causes or "-"}</td><td>{link}</td>'
                    f'<td>{int(h.get("jobs") or 0)}</td><td class="muted nowrap">{seen}</td>'
                    f'<td class="nowrap">{acts or "-"}</td></tr>')
    body.append("</table>")
    if len(hosts) > 1000:
        body.append(f'<p class="muted">{len(hosts) - 1000} more hosts: /api/v1/hosts</p>')
    return _page("Hosts - Mycroft", "".join(body))


def standalone_graph_svg(incident: dict[str, Any]) -> str:
    """GET /incidents/{id}/graph.svg: the graph with its own style, for embedding elsewhere."""
    svg = graph_svg(incident.get("view") or {}, standalone=True)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + svg


def report_page(incidents: list[dict[str, Any]]) -> str:
    """`mycroft rca analyze --html`: the first root cause's page, the other incidents listed below it."""
    if not incidents:
        return _page("No incidents - Mycroft", "<h1>No incidents</h1><p>the recorded jobs look healthy</p>")
    first = next((i for i in incidents if not i.get("consequence_of") and i.get("severity") != "info"), incidents[0])
    page = incident_page(first)
    others = [i for i in incidents if i is not first]
    if not others:
        return page
    rows = "".join(f'<tr><td>{esc(i.get("detected_at"))}</td><td>{esc(i.get("job"))}</td><td>{esc(i.get("kind"))}</td>'
                   f'<td>{esc(i.get("severity"))}</td><td>{esc(i.get("status"))}</td>'
                   f'<td>{esc(_clip(root_cause_line(i), 160))}</td></tr>' for i in others[:200])
    table = ("<h2>Other incidents in this recording</h2><table><tr><th>detected</th><th>job</th><th>kind</th>"
             f"<th>severity</th><th>status</th><th>root cause</th></tr>{rows}</table>")
    return page.replace("</main>", table + "</main>", 1)
