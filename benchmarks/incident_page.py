"""Time to draw and render the incident page of 1k / 4k / 16k-rank hangs (goal < 1 s each).

    .venv/bin/python benchmarks/incident_page.py [--worlds 1024 4096 16384] [--tp 8]

The job is rca_analysis.py's synthetic one (world, TP and DP groups; one rank never
enters its TP all_reduce, its TP peers wait on it, every other rank waits in DP on a
stuck TP peer). Timed: the drawing (graph_view.hang_view: condensing the wait-for graph,
the timeline), the page (pages.incident_page: HTML + SVG) and the stored view's JSON
size. The analysis itself is rca_analysis.py's benchmark.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from mycroft.rca_service.analysis.verdict import analyze_job
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.incidents.tracker import IncidentTracker
from mycroft.rca_service.web.pages import incident_page
from rca_analysis import build


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--worlds", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cfg = AnalysisConfig()
    worst = 0.0
    for world in args.worlds:
        culprit = world // 2 + 3
        job, _, _ = build(world, args.tp, culprit, True, False, cfg)
        now = 10_005.0 + 0.1
        findings = analyze_job(job, now, cfg)
        if not findings or findings[0].draw is None:
            print(f"world {world}: no hang finding to draw", file=sys.stderr)
            return 1
        finding = findings[0]
        draw_t, page_t = [], []
        page = ""
        view: dict[str, object] = {}
        for _ in range(args.repeat):
            t = time.perf_counter()
            view = finding.drawing()
            draw_t.append(time.perf_counter() - t)
            incident = IncidentTracker(3.0).observe(job.job_id, [finding], now)[0].incident.to_dict()
            t = time.perf_counter()
            page = incident_page(incident)
            page_t.append(time.perf_counter() - t)
        total = statistics.median(draw_t) + statistics.median(page_t)
        worst = max(worst, total)
        nodes = view.get("nodes") or []
        print(f"world {world:>6}: draw p50 {statistics.median(draw_t) * 1000:6.1f} ms, page p50 "
              f"{statistics.median(page_t) * 1000:6.1f} ms, total {total * 1000:6.1f} ms; "
              f"{len(nodes)} drawn nodes (graph {view.get('graph_nodes')}), "
              f"view {len(json.dumps(view)) / 1024:.1f} KiB, "
              f"page {len(page) / 1024:.0f} KiB; root cause rank {finding.root_causes[0].rank}")
    print(f"\nworst draw + render: {worst * 1000:.0f} ms (goal < 1000 ms)")
    return 0 if worst < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
