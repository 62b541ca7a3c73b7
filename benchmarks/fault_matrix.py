"""Fault-injection matrix: every fault >= 5 times on real instrumented gloo jobs, randomized rank and step.

    .venv/bin/python benchmarks/fault_matrix.py [--runs 5] [--nproc 4] [--json results.json]

Prints: fault, runs, correct root cause, detection latency p50/p90, root-cause latency
p50/p90, false alarms. Goals: >= 95% correct, detection p90 <= 3 s, root cause p90 <= 5 s,
zero false alarms on healthy runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import sys
from dataclasses import asdict
from pathlib import Path

from mycroft.faults.inject import MATRIX, NET_FAULTS, _pct, interruptible, local_rca, run_one, table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--faults", default=",".join(MATRIX))
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", help="write every run here")
    parser.add_argument("--log-dir", help="keep job logs here")
    parser.add_argument("--net", action="store_true", help="also the network faults (root: namespaces, tc)")
    args = parser.parse_args()
    parser_faults = args.faults.split(",") + (list(NET_FAULTS) if args.net else [])
    rng = random.Random(args.seed)
    results = []
    interruptible()
    with local_rca() as rca, contextlib.suppress(KeyboardInterrupt):
        for fault in parser_faults:
            for _ in range(args.runs):
                nproc = 3 if fault in NET_FAULTS else args.nproc
                r = run_one(rca, fault, nproc=nproc, heartbeat=args.heartbeat, rng=rng, log_dir=args.log_dir)
                results.append(r)
                print(f"{fault:<10} rank {r.rank} step {r.step}: {'ok ' if r.correct else 'BAD'} {r.note}", flush=True)
    print()
    print(table(results))
    faulty = [r for r in results if r.fault != "none"]
    det = [r.detection_s for r in faulty if r.detection_s is not None]
    rc = [r.root_cause_s for r in faulty if r.root_cause_s is not None]
    correct = sum(r.correct for r in results)
    print(f"\noverall: correct {correct}/{len(results)} ({100 * correct / max(1, len(results)):.0f}%), "
          f"detection p90 {_pct(det, 0.9) or 0:.2f}s, root cause p90 {_pct(rc, 0.9) or 0:.2f}s, "
          f"false alarms on healthy runs {sum(r.false_alarms for r in results if r.fault == 'none')}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))
    return 0 if correct == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
