"""Per-heartbeat costs of the live path in one process: decode (plain / DecodeCache), fold, analysis pass.

    .venv/bin/python benchmarks/bigjob_costs.py [--ranks 1024,4096,16384] [--gc default|serve]

The wire bytes are the simulator's (mycroft/faults/bigjob.py: the instrumentation's own
encoders). Each figure is the best of 3 over a whole tick of the world (healthy: a tick
before the fault; hung: 5 s after a rank blocked before its TP collective); the fold is
timed by folding that tick's records again (a repeated heartbeat is folded like a new one).
CPU time of this process only, so the figures mean something on a shared machine; the
ratio plain / cached is measured on the same bytes in the same run. `--gc serve` uses the
cyclic-GC thresholds `mycroft rca serve` sets (rca_service.service.SERVE_GC_THRESHOLDS) where
this checkout has them. Run it with PYTHONPATH pointing at another checkout's package tree
for a before / after on the same machine load.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from mycroft.rca_service import service as service_mod
from mycroft.rca_service.incidents.engine import Engine

from mycroft.faults.bigjob import BigJob, Layout
from mycroft.otlp import DecodeCache, decode_protobuf


def _best(fn: object, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()  # type: ignore[operator]
        best = min(best, time.process_time() - t0)
    return best


def measure(n: int) -> dict[str, float]:
    t0 = 1_000.0
    job = BigJob("costs", Layout(n, 8), 10, fault_rank=n // 2 + 3, fault_at=t0 + 8)
    ranks = list(range(n))
    engine, cache = Engine(), DecodeCache()
    out: dict[str, float] = {}
    for k in range(14):
        now = t0 + k
        job.tick(now)
        payload = job.heartbeat_bytes(ranks, now)
        tag = {6: "healthy", 13: "hung"}.get(k)
        if tag:
            out[f"decode_plain_us_{tag}"] = 1e6 * _best(lambda p=payload: decode_protobuf(p)) / n
            out[f"decode_cached_us_{tag}"] = 1e6 * _best(lambda p=payload: decode_protobuf(p, cache)) / n
        records = decode_protobuf(payload, cache)
        engine.ingest(records, now + 0.01)
        if tag:
            later = iter([now + 0.01 + 0.001 * i for i in range(1, 10)])
            out[f"fold_us_{tag}"] = 1e6 * _best(
                lambda r=records, at=later: engine.ingest(r, next(at))) / n
        t = time.process_time()
        engine.step(now + 0.5)
        if tag:
            out[f"pass_s_{tag}"] = time.process_time() - t
            out[f"pass2_s_{tag}"] = _best(lambda at=now + 0.6: engine.step(at), 2)  # nothing new since the last pass
    out["verdict_right"] = float(any(i.kind == "hang" and i.root_causes and i.root_causes[0].get("rank") == n // 2 + 3
                                     for i in engine.tracker.active.values()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--gc", choices=("default", "serve"), default="serve")
    args = parser.parse_args()
    thresholds = getattr(service_mod, "SERVE_GC_THRESHOLDS", None)
    if args.gc == "serve" and thresholds:
        gc.set_threshold(*thresholds)
    print(f"gc thresholds {gc.get_threshold()}")
    print("| ranks | decode plain us/hb | decode cached us/hb | fold us/hb | pass s (healthy / hung) | "
          "pass again s (healthy / hung) | hb/s one core can take | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        m = measure(n)
        per_hb = m["decode_cached_us_healthy"] + m["fold_us_healthy"]
        print(f"| {n:,} | {m['decode_plain_us_healthy']:.1f} | {m['decode_cached_us_healthy']:.1f} | "
              f"{m['fold_us_healthy']:.1f} | {m['pass_s_healthy']:.3f} / {m['pass_s_hung']:.3f} | "
              f"{m['pass2_s_healthy']:.3f} / {m['pass2_s_hung']:.3f} | "
              f"{1e6 / per_hb:,.0f} | {'right' if m['verdict_right'] else 'wrong'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
