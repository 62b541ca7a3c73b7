"""Fault-injection matrix on real instrumented gloo jobs: does the RCA name the right root cause, fast,
and page for it; and does it stay quiet on healthy jobs with irregular phases?

    .venv/bin/python benchmarks/fault_matrix.py                    # 8-rank 3D jobs (~30 min on 2 cores)
    .venv/bin/python benchmarks/fault_matrix.py --layout world     # the old 4-rank world all_reduce matrix
    .venv/bin/python benchmarks/fault_matrix.py --layout all --json results.json
    .venv/bin/python benchmarks/fault_matrix.py --runs 1 --healthy-runs 1 --faults block,deadlock   # a taste

3D: every fault of mycroft/faults/job3d.py `--runs` times (random rank, random step in
6..12, random op position; layouts cycled among 2x2x2, 2x4x1, 1x2x4, 4x1x2 where the fault
fits); block / sigkill / sigstop also at a random time (`<fault>@time`: in the first second
after init_process_group, right after the rank's first collective, or 1-3 s in); the
healthy irregular jobs (checkpoint, eval, jitter, slow_rank) `--healthy-runs` times.

Per row: correct (the first non-info incident after the onset has the right kind and
first root cause), diagnosis latency p50/p90 (onset -> detected_at), alert latency p50/p90
(onset -> the first firing webhook POST at the harness' receiver), false alarms (faults:
loud incidents or alerts before the onset; healthy: critical incidents plus alerts).
Healthy rows also count info / warning incidents and, for slow_rank, whether the slower
rank was named (bonus). Goals (issue 8): >= 95% correct, diagnosis p90 <= 3 s, zero
critical incidents and alerts on healthy runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mycroft.faults.inject import (
    HEALTHY_3D,
    MATRIX,
    MATRIX_3D,
    NET_FAULTS,
    PROCESS_FAULTS,
    WORLD,
    RunResult,
    describe,
    interruptible,
    local_rca,
    row_name,
    run_one,
    table,
)
from mycroft.faults.layout import Layout, unfit
from mycroft.faults.scoring import HEALTHY, percentile

LAYOUTS_8 = ("2x2x2", "2x4x1", "1x2x4", "4x1x2")


@dataclass
class Planned:
    fault: str
    layout: str
    trigger: str = "step"
    at_s: float | None = None
    nproc: int = 4
    kwargs: dict[str, Any] = field(default_factory=dict)


def plan_3d(faults: list[str], runs: int, healthy_runs: int, layouts: tuple[str, ...], rng: random.Random,
            timed: bool = True) -> list[Planned]:
    """The 3D matrix's runs, in order: each fault on the layouts it fits, cycled."""
    out: list[Planned] = []
    for fault in faults:
        fits = [lay for lay in layouts if unfit(fault, Layout.parse(lay)) is None]
        if not fits:
            continue
        count = healthy_runs if fault in HEALTHY else runs
        out += [Planned(fault, fits[i % len(fits)]) for i in range(count)]
        if timed and fault in PROCESS_FAULTS:
            # at a time: twice in the first second after init, twice right after the first collective,
            # then once 1-3 s in (a random op position, wherever the rank is)
            for i in range(runs):
                kind = i % 5
                trigger = "first" if kind in (1, 3) else "time"
                at_s = None if trigger == "first" else rng.uniform(1.0, 3.0) if kind == 4 else rng.uniform(0.0, 1.0)
                out.append(Planned(fault, fits[(i + 1) % len(fits)], trigger, at_s))
    return out


def plan_world(faults: list[str], runs: int, nproc: int) -> list[Planned]:
    return [Planned(fault, WORLD, nproc=3 if fault in NET_FAULTS else nproc) for fault in faults for _ in range(runs)]


def summary(results: list[RunResult]) -> dict[str, Any]:
    faulty = [r for r in results if r.fault not in HEALTHY]
    healthy = [r for r in results if r.fault in HEALTHY]
    det = [r.detection_s for r in faulty if r.detection_s is not None]
    alert = [r.alert_s for r in faulty if r.alert_s is not None]
    rows: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(row_name(r) for r in results):
        mine = [r for r in results if row_name(r) == name]
        d = [r.detection_s for r in mine if r.detection_s is not None]
        a = [r.alert_s for r in mine if r.alert_s is not None]
        rows[name] = {"runs": len(mine), "correct": sum(r.correct for r in mine),
                      "diagnosis_p50_s": percentile(d, 0.5), "diagnosis_p90_s": percentile(d, 0.9),
                      "alert_p50_s": percentile(a, 0.5), "alert_p90_s": percentile(a, 0.9),
                      "alerted": len(a), "false_alarms": sum(r.false_alarms for r in mine),
                      "layouts": sorted({r.layout for r in mine})}
        if name in HEALTHY:
            sev: dict[str, int] = {}
            for r in mine:
                for k, v in (r.extra.get("incidents") or {}).items():
                    sev[k] = sev.get(k, 0) + v
            rows[name]["incidents_by_severity"] = sev
            if name == "slow_rank":
                rows[name]["slow_rank_named"] = sum(bool(r.extra.get("slow_rank_named")) for r in mine)
    return {
        "faulty_runs": len(faulty), "faulty_correct": sum(r.correct for r in faulty),
        "diagnosis_p90_s": percentile(det, 0.9), "alert_p90_s": percentile(alert, 0.9),
        "healthy_runs": len(healthy), "healthy_clean": sum(r.correct for r in healthy),
        "healthy_criticals_and_alerts": sum(r.false_alarms for r in healthy),
        "false_alarms_before_onset": sum(r.false_alarms for r in faulty),
        "rows": rows,
    }


def _healthy_table(results: list[RunResult]) -> str:
    lines = [f"{'healthy':<12} {'runs':>4} {'clean':>7} {'critical+alerts':>15} {'info':>5} {'warning':>7} "
             f"{'bonus: slow rank named':>22}"]
    for name in dict.fromkeys(r.fault for r in results if r.fault in HEALTHY):
        mine = [r for r in results if r.fault == name]
        sev: dict[str, int] = {}
        for r in mine:
            for k, v in (r.extra.get("incidents") or {}).items():
                sev[k] = sev.get(k, 0) + v
        bonus = f"{sum(bool(r.extra.get('slow_rank_named')) for r in mine)}/{len(mine)}" if name == "slow_rank" else "-"
        lines.append(f"{name:<12} {len(mine):>4} {sum(r.correct for r in mine):>3}/{len(mine):<3} "
                     f"{sum(r.false_alarms for r in mine):>15} {sev.get('info', 0):>5} {sev.get('warning', 0):>7} "
                     f"{bonus:>22}")
    return "\n".join(lines)


def _git_head() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layout", default="3d", choices=("3d", "world", "all"),
                        help="3d: the 8-rank TP x PP x DP matrix (default); world: the old 4-rank one; all: both")
    parser.add_argument("--layouts", default=",".join(LAYOUTS_8),
                        help="3D layouts to cycle (TPxPPxDP, comma-separated)")
    parser.add_argument("--runs", type=int, default=5, help="runs per fault (and per timed process fault)")
    parser.add_argument("--healthy-runs", type=int, default=5, help="runs per healthy 3D scenario")
    parser.add_argument("--faults", help="only these (comma-separated; default: the layout's matrix)")
    parser.add_argument("--no-timed", action="store_true", help="3D: skip the process faults injected at a time")
    parser.add_argument("--nproc", type=int, default=4, help="world layout: ranks")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="MYCROFT_HEARTBEAT_INTERVAL of the jobs")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds after the onset to wait for a verdict")
    parser.add_argument("--alert-timeout", type=float, default=20.0,
                        help="seconds after the onset to wait for an alert")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", help="write every run and the summary here")
    parser.add_argument("--log-dir", help="keep job logs here (wrong runs keep theirs in /tmp anyway)")
    parser.add_argument("--net", action="store_true", help="world: also the network faults (root: namespaces, tc)")
    parser.add_argument("--report", metavar="FILE", help="only print the tables of a JSON written by --json")
    args = parser.parse_args()
    if args.report:
        return reprint(args.report)
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    chosen = args.faults.split(",") if args.faults else None
    plan: list[Planned] = []
    if args.layout in ("3d", "all"):
        layouts = tuple(args.layouts.split(","))
        for lay in layouts:
            Layout.parse(lay)
        faults = chosen or [*MATRIX_3D, *HEALTHY_3D]
        plan += plan_3d([f for f in faults if f in MATRIX_3D or f in HEALTHY_3D], args.runs, args.healthy_runs,
                        layouts, rng, timed=not args.no_timed)
    if args.layout in ("world", "all"):
        faults = chosen or list(MATRIX)
        faults += list(NET_FAULTS) if args.net else []
        plan += plan_world([f for f in faults if f in MATRIX or f in NET_FAULTS or f.startswith("mismatch")],
                           args.runs, args.nproc)
    if not plan:
        parser.error("nothing to run")
    tty = sys.stdout.isatty()
    results: list[RunResult] = []
    started = time.time()
    print(f"fault matrix: {len(plan)} runs, seed {seed}, heartbeat {args.heartbeat}s", flush=True)
    interruptible()
    with local_rca() as rca, contextlib.suppress(KeyboardInterrupt):
        for k, p in enumerate(plan, 1):
            if tty:
                eta = (time.time() - started) / max(1, k - 1) * (len(plan) - k + 1) if k > 1 else 0
                print(f"\r[{k}/{len(plan)}] running {p.fault} on {p.layout} ({p.trigger})... "
                      f"{len(plan) - k + 1} left, ~{eta / 60:.0f} min", end="", flush=True)
            r = run_one(rca, p.fault, nproc=p.nproc, heartbeat=args.heartbeat, timeout_s=args.timeout,
                        alert_timeout_s=args.alert_timeout, rng=rng, log_dir=args.log_dir, layout=p.layout,
                        trigger=p.trigger, at_s=p.at_s)
            results.append(r)
            print(("\r\033[K" if tty else "") + f"[{k}/{len(plan)}] {describe(r)}", flush=True)
    took = time.time() - started
    s = report(results, took)
    if args.json:
        meta = {"seed": seed, "heartbeat_s": args.heartbeat, "commit": _git_head(), "host": platform.node(),
                "cpus": os.cpu_count(), "took_s": took, "argv": sys.argv[1:],
                "started_unix": started}
        Path(args.json).write_text(json.dumps({"meta": meta, "summary": s, "runs": [asdict(r) for r in results]},
                                              indent=2, default=str))
    return 0 if results and all(r.correct for r in results) else 1


def report(results: list[RunResult], took: float | None = None) -> dict[str, Any]:
    """Print the tables, one set per job family (8-rank 3D, 4-rank world); the summary by family."""
    out: dict[str, Any] = {}
    for family, mine in (("3d", [r for r in results if r.layout != WORLD]),
                         ("world", [r for r in results if r.layout == WORLD])):
        if not mine:
            continue
        faulty = [r for r in mine if r.fault not in HEALTHY]
        print(f"\n{'8-rank 3D jobs (TP x PP x DP)' if family == '3d' else '4-rank world all_reduce job'}:")
        if faulty:
            print(table(faulty))
        if any(r.fault in HEALTHY for r in mine):
            print()
            print(_healthy_table(mine))
        s = out[family] = summary(mine)
        n = max(1, s["faulty_runs"])
        print(f"faults: correct {s['faulty_correct']}/{s['faulty_runs']} ({100 * s['faulty_correct'] / n:.0f}%), "
              f"diagnosis p90 {s['diagnosis_p90_s'] or 0:.2f}s, alert p90 {s['alert_p90_s'] or 0:.2f}s; "
              f"healthy: {s['healthy_clean']}/{s['healthy_runs']} clean, "
              f"{s['healthy_criticals_and_alerts']} critical incidents + alerts")
    if took is not None:
        print(f"\n{len(results)} runs in {took / 60:.1f} min")
    return out


def reprint(path: str) -> int:
    """`--report FILE`: the tables of a JSON this script wrote, without running anything."""
    doc = json.loads(Path(path).read_text())
    results = [RunResult(**r) for r in doc["runs"]]
    print(f"{path}: {doc.get('meta', {})}")
    report(results, (doc.get("meta") or {}).get("took_s"))
    return 0

if __name__ == "__main__":
    sys.exit(main())
