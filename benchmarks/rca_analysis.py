"""Analysis time of one pass over a synthetic 16,384-rank job (goal: <= 1 s).

    .venv/bin/python benchmarks/rca_analysis.py [--world 16384] [--tp 8]

The job has a world group, TP groups of `tp` ranks and DP groups across them, 20
completed world collectives with every rank's span, and one heartbeat per rank. Three
states are timed: healthy; a hang where one rank never enters its TP collective (its TP
peers wait on it, every other rank waits in DP on a stuck TP peer: a 16k-node wait-for
graph with chains across groups); and the same with the rank silent (process lost).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from mycroft.rca_service.analysis.verdict import analyze_job
from mycroft.rca_service.config import AnalysisConfig
from mycroft.rca_service.ingest.state import JobState, apply_records

from mycroft.faults.made_up_job import Group, InFlightOp, collective, heartbeat


def build(world: int, tp: int, culprit: int, hang: bool, silent: bool, cfg: AnalysisConfig) -> tuple[JobState, float,
                                                                                                       int]:
    jobs: dict[str, JobState] = {}
    everyone = Group("0", tuple(range(world)))
    tps = [Group(f"tp{k}", tuple(range(k * tp, (k + 1) * tp))) for k in range(world // tp)]
    dps = [Group(f"dp{j}", tuple(range(j, world, tp))) for j in range(tp)]
    t0 = 10_000.0
    spans = 0
    started = time.perf_counter()
    for seq in range(1, 21):
        batch = [collective("big", r, world, everyone, seq, t0 + seq * 0.1, t0 + seq * 0.1 + 0.01)
                 for r in range(world)]
        spans += len(batch)
        apply_records(jobs, batch, t0 + seq * 0.1 + 0.02, cfg)
    now = t0 + 5.0
    hbs = []
    s = 7
    culprit_tp = tps[culprit // tp]
    for r in range(world):
        my_tp, my_dp = tps[r // tp], dps[r % tp]
        groups = [everyone, my_tp, my_dp]
        if not hang:
            hbs.append(heartbeat("big", r, world, now, 1, groups, [20, s, s], [20, s, s]))
        elif r == culprit:
            if not silent:
                hbs.append(heartbeat("big", r, world, now, 1, groups, [20, s - 1, s - 1], [20, s - 1, s - 1],
                                     idle_s=3.0, stack='File "train.py", line 1, in load'))
        elif r in culprit_tp.ranks:
            hbs.append(heartbeat("big", r, world, now, 1, groups, [20, s, s - 1], [20, s - 1, s - 1],
                                 [InFlightOp(my_tp, s, age_s=3.0)]))
        else:
            hbs.append(heartbeat("big", r, world, now, 1, groups, [20, s, s], [20, s, s - 1],
                                 [InFlightOp(my_dp, s, age_s=2.9)]))
    if silent:
        # the culprit's last heartbeat is old
        apply_records(jobs, [heartbeat("big", culprit, world, now - 4, 1, [everyone, culprit_tp, dps[culprit % tp]],
                                       [20, s - 1, s - 1], [20, s - 1, s - 1])], now - 4, cfg)
    apply_records(jobs, hbs, now, cfg)
    spans += len(hbs)
    return jobs["big"], time.perf_counter() - started, spans


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, default=16384)
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    cfg = AnalysisConfig()
    culprit = args.world // 2 + 3
    print(f"world {args.world}, TP {args.tp}, DP {args.world // args.tp}; culprit rank {culprit}")
    worst = 0.0
    for name, hang, silent in (("healthy", False, False), ("hang: not entered", True, False),
                               ("hang: process lost", True, True)):
        job, fold_s, spans = build(args.world, args.tp, culprit, hang, silent, cfg)
        now = 10_005.0 + 0.1
        times = []
        findings = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            findings = analyze_job(job, now, cfg)
            times.append(time.perf_counter() - t)
        verdict = "no finding"
        if findings:
            f = findings[0]
            top = f.root_causes[0]
            verdict = f"{f.kind}: rank {top.rank} {top.kind}, graph {f.graph.get('nodes')} nodes"
        worst = max(worst, statistics.median(times))
        print(f"{name:<20} analysis p50 {statistics.median(times) * 1000:7.1f} ms  max {max(times) * 1000:7.1f} ms  "
              f"(state fold of {spans} spans: {fold_s:.1f} s, {spans / fold_s:,.0f} spans/s)  -> {verdict}")
    print(f"\nworst median analysis time: {worst * 1000:.0f} ms (goal <= 1000 ms)")
    return 0 if worst <= 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
