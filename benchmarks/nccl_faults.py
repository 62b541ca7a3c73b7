"""The paper's seven NCCL faults (and the process faults) at scale: % right, detection p50 / p90, bytes.

    .venv/bin/python benchmarks/nccl_faults.py --both-models --runs 5          # issue 44: both models, model time

`--both-models` scores the RCA on two models of NCCL, each fed to the engine through the OTLP wire
format on the model's own clock (mycroft/faults/nccl_model/drive.py; no wall clock, so a loaded
machine cannot turn into a verdict): the NCCL source model (mycroft/faults/nccl_model: 8 hosts x 4
GPUs, 8 channels, proxy steps with the 8-step window and clear-to-send, its 8 faults, layouts dp
and tp4dp8, with op spans and heartbeat-only) and the existing simulator (bigjob.py / simfaults.py,
its 14 faults, heartbeat-only as `mycroft simulate` sends them). Per fault: right as first raised
(the first loud incident after the onset names the fault's rank with an expected kind), root-cause
changes per incident (max, mean), detection p50 / p90 (onset -> detected_at), loud incidents before
the onset; healthy runs (`none`) are right when nothing loud is raised.

    .venv/bin/python benchmarks/nccl_faults.py                       # nccl faults, 1k and 16k ranks, 5 runs each
    .venv/bin/python benchmarks/nccl_faults.py --faults all --worlds 256,1024 --runs 5 --json out.json

Each cell is `--runs` runs of `mycroft simulate` (mycroft/faults/simulate.py: N simulated
ranks whose heartbeats -- native flow counters included -- are built by the
instrumentation's own encoders, over OTLP/gRPC to a real `mycroft rca serve`), each run
with its own seed: the faulty rank, the fault's magnitude and its onset (a random share of
an interval after the warm-up) differ. Runs of one world go `--concurrent` at a time to one
service (each its own job); a 16k-rank world runs one at a time. Prints one JSON line per
run, then the table: runs, % right, detection and root-cause p50 / p90, what the RCA said
when it was wrong, service CPU / RSS, heartbeat bytes per 8-rank machine per second and per
iteration against the paper's 46.8 KB.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections import Counter, defaultdict
from typing import Any

PAPER_KB_PER_ITERATION = 46.8  # per machine (8 GPUs), the paper's measured telemetry volume


def _simulate(world: int, faults: list[str], seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    cmd = [sys.executable, "-m", "mycroft.cli", "simulate", "--ranks", str(world), "--tp", "8",
           "--fault", ",".join(faults), "--seed", str(seed), "--interval", str(args.interval),
           "--warmup", str(args.warmup), "--seconds", str(args.seconds), "--ops", "10",
           "--senders", str(args.senders if world >= 4096 else 1)]
    started = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return [{"fault": f, "ranks": world, "seed": seed, "error": (out.stderr or out.stdout)[-600:]} for f in faults]
    for line in lines:
        line["wall_s"] = round(time.time() - started, 1)
    return lines


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (p90 of 5 runs is the largest)."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[max(0, math.ceil(q * len(ordered)) - 1)], 2)


def _said(r: dict[str, Any]) -> str:
    """What a wrong run said instead: no verdict, or kind:root-cause kind rank."""
    if not r.get("verdict"):
        return "no verdict"
    kind, rank = (r.get("verdict_root_causes") or [[None, None]])[0]
    return f"{r['verdict']}:{kind} {'(right rank)' if rank == r.get('fault_rank') else f'rank {rank}'}"


def _row(world: int, fault: str, runs: list[dict[str, Any]], iteration_s: float) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    right = [r for r in ok if r.get("right")]
    detected = [float(r["detected_s"]) for r in right if r.get("detected_s") is not None]
    rooted = [float(r["root_cause_s"]) for r in right if r.get("root_cause_s") is not None]
    wrong = Counter(_said(r) for r in ok if not r.get("right"))
    hb = [float(r["heartbeat_bytes_per_rank_s"]) for r in ok if r.get("heartbeat_bytes_per_rank_s")]
    per_machine = 8 * statistics.median(hb) if hb else None
    return {
        "world": world, "fault": fault, "runs": len(runs), "errors": len(runs) - len(ok),
        "right_pct": round(100 * len(right) / len(runs)) if runs else None,
        "detected_p50_s": round(statistics.median(detected), 2) if detected else None,
        "detected_p90_s": _pct(detected, 0.9), "root_cause_p50_s": round(statistics.median(rooted), 2)
        if rooted else None, "root_cause_p90_s": _pct(rooted, 0.9),
        "wrong": dict(wrong), "info_verdicts": sum(1 for r in right if r.get("verdict_severity") == "info"),
        "false_before_onset": sum(int(r.get("false_incidents_before_fault") or 0) for r in ok),
        "heartbeats_lost": sum(int(r.get("heartbeats_lost") or 0) for r in ok),
        "service_cpu_pct_max": max((float(r["service_cpu_pct"]) for r in ok if r.get("service_cpu_pct")),
                                   default=None),
        "service_rss_mb_max": max((int(r["service_rss_mb"]) for r in ok if r.get("service_rss_mb")), default=None),
        "concurrent": max((int(r.get("concurrent_runs") or 1) for r in ok), default=None),
        "kb_per_machine_s": round(per_machine / 1000, 2) if per_machine else None,
        "kb_per_machine_iteration": round(per_machine * iteration_s / 1000, 1) if per_machine else None,
    }


def _both_models(args: argparse.Namespace) -> int:
    """Issue 44's table: both models, per fault and mode, on model time."""
    from mycroft.faults.nccl_model.cluster import FAULTS as MODEL_FAULTS
    from mycroft.faults.nccl_model.drive import run_bigjob, run_model
    from mycroft.faults.simfaults import FAULTS as SIM_FAULTS

    rows: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    layouts = [x for x in args.layouts.split(",") if x]
    model_faults = [*MODEL_FAULTS, "none"] if args.model_faults == "all" else args.model_faults.split(",")
    sim_faults = [*SIM_FAULTS, "none"] if args.sim_faults == "all" else [x for x in args.sim_faults.split(",") if x]
    started = time.time()
    for i in range(args.runs):
        seed = args.seed + i
        for layout in layouts:
            for mode in args.modes.split(","):
                for fault in model_faults:
                    out = run_model(fault, seed, layout=layout, hb_only=mode == "hb_only", seconds=args.model_seconds)
                    line = out.as_dict() | {"model": "nccl_source"}
                    print(json.dumps(line), flush=True)
                    rows[("nccl_source", f"{layout}/{mode}", fault)].append(line)
        for fault in sim_faults:
            out = run_bigjob(fault, seed, world=args.sim_world, tp=8, seconds=args.sim_seconds)
            line = out.as_dict() | {"model": "simulator"}
            print(json.dumps(line), flush=True)
            rows[("simulator", f"{args.sim_world}r/hb_only", fault)].append(line)
    print(f"\n{sum(map(len, rows.values()))} runs in {time.time() - started:.0f} s\n")
    print("| model | layout / mode | fault | runs | right as first raised | changes / incident max (mean) | "
          "detected p50 / p90 s | loud before onset | said instead |")
    print("|---|---|---|---|---|---|---|---|---|")
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    table = []
    for (model, where, fault), runs in rows.items():
        right = sum(1 for r in runs if r["right"])
        totals[model][0] += right
        totals[model][1] += len(runs)
        det = [float(r["detected_s"]) for r in runs if r["right"] and r["detected_s"] is not None]
        changes = [c for r in runs for c in r["changes"]]
        wrong = Counter(f"{r['verdict']}:{(r['root_cause'] or [None, None])[0]} rank "
                        f"{(r['root_cause'] or [None, None])[1]}" if r["verdict"] else "no verdict"
                        for r in runs if not r["right"])
        row = {"model": model, "where": where, "fault": fault, "runs": len(runs), "right": right,
               "max_changes": max(changes, default=0),
               "mean_changes": round(statistics.fmean(changes), 2) if changes else 0.0,
               "p50": round(statistics.median(det), 2) if det else None, "p90": _pct(det, 0.9),
               "loud_before": sum(int(r["loud_before"]) for r in runs), "wrong": dict(wrong)}
        table.append(row)
        print(f"| {model} | {where} | {fault} | {len(runs)} | {right}/{len(runs)} | {row['max_changes']} "
              f"({row['mean_changes']}) | {row['p50']} / {row['p90']} | {row['loud_before']} | "
              f"{', '.join(f'{k} x{v}' for k, v in wrong.items()) or '-'} |")
    print()
    for model, (right, n) in totals.items():
        print(f"{model}: {right}/{n} right as first raised ({100 * right / max(1, n):.0f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": {"/".join(k): v for k, v in rows.items()}, "table": table}, f, indent=1)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default="nccl", help="as `mycroft simulate --fault`: nccl | process | all | a,b")
    parser.add_argument("--worlds", default="1024,16384")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--concurrent", type=int, default=7, help="runs per service at worlds below 4,096 ranks")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--senders", type=int, default=2, help="sender processes at 4,096 ranks and more")
    parser.add_argument("--iteration-s", type=float, default=5.0,
                        help="training iteration length for the bytes-per-iteration figure (the paper's unit)")
    parser.add_argument("--json", help="write every run and the table here")
    parser.add_argument("--from-json", nargs="*", default=[], help="only print the table of these saved runs")
    parser.add_argument("--both-models", action="store_true",
                        help="issue 44: the NCCL source model and the existing simulator, on model time")
    parser.add_argument("--layouts", default="dp,tp4dp8", help="--both-models: the source model's layouts")
    parser.add_argument("--modes", default="spans,hb_only", help="--both-models: with op spans, heartbeats only")
    parser.add_argument("--model-faults", default="all", help="--both-models: source-model faults (all = 8 + none)")
    parser.add_argument("--sim-faults", default="all", help="--both-models: simulator faults (all = 14 + none)")
    parser.add_argument("--model-seconds", type=float, default=30.0)
    parser.add_argument("--sim-seconds", type=float, default=20.0)
    parser.add_argument("--sim-world", type=int, default=256)
    args = parser.parse_args()
    if args.both_models:
        return _both_models(args)
    from mycroft.faults.simulate import fault_list

    faults = fault_list(args.faults)
    results: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for path in args.from_json:
        with open(path) as f:
            for runs in json.load(f)["runs"].values():
                for line in runs:
                    results[(int(line["ranks"]) if "ranks" in line else 0, line["fault"])].append(line)
    for world in (int(w) for w in args.worlds.split(",")) if not args.from_json else ():
        width = 1 if world >= 4096 else max(1, args.concurrent)
        jobs = [(f, i) for i in range(args.runs) for f in faults]
        for k in range(0, len(jobs), width):
            batch = jobs[k:k + width]
            seed = args.seed + k  # simulate derives each run's own seed from it and the fault
            for line in _simulate(world, [f for f, _ in batch], seed, args):
                print(json.dumps(line), flush=True)
                results[(world, line["fault"])].append(line)
    rows = [_row(w, f, runs, args.iteration_s) for (w, f), runs in results.items()]
    print()
    print("| world | fault | runs | right (of which info) | detected p50 / p90 s | root cause p50 / p90 s | "
          "said instead | "
          "false before onset | hb lost | service CPU max | RSS MB max | KB / machine / s | KB / machine / "
          f"{args.iteration_s:g}-s iteration (paper {PAPER_KB_PER_ITERATION}) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['world']:,} | {r['fault']} | {r['runs']} | {r['right_pct']}% ({r['info_verdicts']}) | "
              f"{r['detected_p50_s']} / "
              f"{r['detected_p90_s']} | {r['root_cause_p50_s']} / {r['root_cause_p90_s']} | "
              f"{', '.join(f'{k} x{v}' for k, v in r['wrong'].items()) or '-'} | {r['false_before_onset']} | "
              f"{r['heartbeats_lost']} | {r['service_cpu_pct_max']}% (x{r['concurrent']} jobs) | "
              f"{r['service_rss_mb_max']} | {r['kb_per_machine_s']} | {r['kb_per_machine_iteration']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": {f"{w}/{k}": v for (w, k), v in results.items()}, "table": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
