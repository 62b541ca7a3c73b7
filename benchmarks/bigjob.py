"""The scale table of issue 11: one `mycroft rca serve` fed by 1k / 4k / 16k simulated ranks over OTLP/gRPC.

    .venv/bin/python benchmarks/bigjob.py [--rows 1k-hb,16k-hb,...] [--baseline-python /path/to/other/.venv/bin/python]

Each row is one `mycroft simulate` run (mycroft/faults/simulate.py): the ranks' heartbeats at
1 Hz (plus op spans: "all" sends every op span, "diet" the 1% kept by trace-id head
sampling), a rank blocked before its TP collective after 6 s, 20 s in all. With
--baseline-python, every row first runs against the service of that interpreter's mycroft
(another checkout, e.g. main before a change) and then against this one: before / after in
the same run, on the same machine load. Prints one JSON line per run, then the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROWS = {  # name -> (ranks, ops per rank per second, share of op spans sent)
    "1k-hb": (1024, 10, 0.0), "1k-10all": (1024, 10, 1.0), "1k-50all": (1024, 50, 1.0),
    "1k-10diet": (1024, 10, 0.01), "1k-50diet": (1024, 50, 0.01),
    "4k-hb": (4096, 10, 0.0), "4k-10all": (4096, 10, 1.0), "4k-10diet": (4096, 10, 0.01),
    "4k-50diet": (4096, 50, 0.01),
    "16k-hb": (16384, 10, 0.0), "16k-10diet": (16384, 10, 0.01), "16k-50diet": (16384, 50, 0.01),
}
DEFAULT_ROWS = "1k-hb,1k-10diet,1k-50diet,4k-hb,4k-10diet,4k-50diet,16k-hb,16k-10diet,16k-50diet"


def _run(ranks: int, ops: int, keep: float, python: str | None, seconds: float, batch: int,
         compression: str) -> dict[str, object]:
    cmd = [sys.executable, "-m", "mycroft.cli", "simulate", "--ranks", str(ranks), "--ops", str(ops),
           "--op-spans", str(keep), "--seconds", str(seconds), "--warmup", "6", "--batch", str(batch),
           "--compression", compression]
    if python:
        cmd += ["--service-python", python]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {"error": (out.stderr or out.stdout)[-400:]}
    return dict(json.loads(lines[-1]))


def _parts(r: dict[str, object]) -> str:
    parts = r.get("service_cpu_pct_parts")
    return f" ({parts.get('fold')} / {parts.get('analysis')})" if isinstance(parts, dict) else ""


def _cell(r: dict[str, object], key: str, fmt: str = "{}") -> str:
    value = r.get(key)
    return "-" if value is None else fmt.format(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=DEFAULT_ROWS, help="comma-separated: " + ", ".join(ROWS))
    parser.add_argument("--runs", type=int, default=1, help="runs per row (a p90 needs several)")
    parser.add_argument("--baseline-python", help="run each row against this interpreter's service first")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=512,
                        help="heartbeats per OTLP request: 512 an SDK's or agent's export batch; 4096 what the "
                             "shipped gateway (otel-config/otelcol/gateway.yaml, send_batch_size) hands the RCA tier")
    parser.add_argument("--compression", choices=("none", "gzip"), default="none",
                        help="of the requests: gzip is what an OTel Collector's otlp exporter sends by default")
    args = parser.parse_args()
    table = []
    for name in args.rows.split(","):
        ranks, ops, keep = ROWS[name]
        for _ in range(args.runs):
            for label, python in ([("before", args.baseline_python)] if args.baseline_python else []) + \
                    [("after", None)]:
                load = os.getloadavg()[0]
                result = _run(ranks, ops, keep, python, args.seconds, args.batch, args.compression)
                result["row"], result["build"] = name, label
                result["batch"], result["compression"] = args.batch, args.compression
                result["load_avg"] = f"{load:.1f}-{os.getloadavg()[0]:.1f}"
                print(json.dumps(result), flush=True)
                table.append(result)
    print()
    print("| row | build | load avg | applied / offered spans/s | hb lost | shed | service CPU (fold / analysis) "
          "| RSS MB | pass p50 / max s | verdict | detected s | false before T0 | hb B/rank/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in table:
        verdict = "error" if "error" in r else (
            f"{r.get('verdict')} {'right' if r.get('right') else 'WRONG'} {r.get('verdict_root_causes')}"
            if r.get("verdict") else "none")
        print(f"| {r['row']} | {r['build']} | {r.get('load_avg')} "
              f"| {_cell(r, 'applied_spans_s')} / {_cell(r, 'offered_spans_s')} "
              f"| {_cell(r, 'heartbeats_lost')} | {_cell(r, 'dropped_spans')} | {_cell(r, 'service_cpu_pct', '{}%')}"
              f"{_parts(r)} "
              f"| {_cell(r, 'service_rss_mb')} | {_cell(r, 'analysis_s_p50')} / {_cell(r, 'analysis_s_max')} "
              f"| {verdict} | {_cell(r, 'detected_s')} | {_cell(r, 'false_incidents_before_fault')} "
              f"| {_cell(r, 'heartbeat_bytes_per_rank_s')} |")
    print()
    for name in dict.fromkeys(str(r["row"]) for r in table):  # detection p50 / p90 per row and build
        for label in ("before", "after"):
            runs = [r for r in table if r["row"] == name and r["build"] == label]
            if not runs:
                continue
            right = sum(bool(r.get("right")) for r in runs)
            detected = sorted(float(r["detected_s"]) for r in runs  # type: ignore[arg-type]
                              if r.get("right") and r.get("detected_s") is not None)
            p90 = detected[min(len(detected) - 1, int(0.9 * len(detected)))] if detected else None
            print(f"{name} {label}: {right}/{len(runs)} right, detection p50 "
                  f"{statistics.median(detected) if detected else None} s, p90 {p90} s (nearest rank)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
