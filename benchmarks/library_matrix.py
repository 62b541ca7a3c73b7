"""Real training libraries, random faults: `python benchmarks/library_matrix.py [--runs 2] [--seed S]`.

Each script of examples/frameworks (HF Accelerate, megatron-core TP x DP and PP x DP, DeepSpeed
ZeRO 1-3, torchtitan TP x FSDP2, PyTorch Lightning, the Transformers Trainer; options drawn too)
runs zero-code under `opentelemetry-instrument torchrun --nproc-per-node 4` against a fresh
in-process RCA service, with one rank hanging forever at a random step (3-12) and point of the
step (before the forward, between forward and backward, before the optimizer step), all drawn from
the printed seed: the test suite's cases are fixed, these are not. Scored like the test: the first
loud incident after the onset must be a hang naming that rank first; also counted, loud incidents
and pages raised before the onset (after the job's first collectives: the libraries' start-up is
minutes of imports and set-up on 2 cores). A library that is not installed is skipped.

Goals: 100% right rank; diagnosis within 2 s of the onset at p90.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mycroft.faults.inject import free_port, kill_tree, local_rca  # noqa: E402
from mycroft.faults.scoring import critical_at, diagnose, severity  # noqa: E402

EXAMPLES = ROOT / "examples" / "frameworks"
BIN = Path(sys.executable).parent
POINTS = ("before_forward", "between_fwd_bwd", "before_step")
# (script, module that must import, option sets to draw from)
LIBRARIES: list[tuple[str, str, list[list[str]]]] = [
    ("accelerate_ddp.py", "accelerate", [[]]),
    ("megatron_core_tp_dp.py", "megatron.core",
     [["--tp", "2"], ["--tp", "2", "--dist-opt"], ["--tp", "1", "--pp", "2"]]),
    ("deepspeed_zero.py", "deepspeed", [["--stage", "1"], ["--stage", "2"], ["--stage", "3"]]),
    ("torchtitan_llama3_tp_fsdp.py", "torchtitan", [["--tp", "2"], ["--tp", "1"]]),
    ("lightning_ddp.py", "lightning", [[]]),
    ("hf_trainer.py", "transformers", [[]]),
]


def one_run(script: str, options: list[str], rank: int, step: int, point: str, timeout_s: float) -> dict[str, Any]:
    """One instrumented 4-rank run of `script` with `rank` hanging at `point` of `step`, scored."""
    out: dict[str, Any] = {"script": script, "options": options, "rank": rank, "step": step, "point": point}
    with local_rca() as rca:
        job = f"libm-{script.split('_')[0]}-{free_port()}"
        env = {**os.environ, "MYCROFT_JOB_ID": job, "MYCROFT_HEARTBEAT_INTERVAL": "0.5", "DS_ACCELERATOR": "cpu",
               "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{rca.otlp_grpc}", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
               "OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none",
               "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        command = [str(BIN / "opentelemetry-instrument"), str(BIN / "torchrun"), "--nproc-per-node", "4",
                   "--master-port", str(free_port()), str(EXAMPLES / script), *options, "--steps", "100000",
                   "--block-rank", str(rank), "--block-step", str(step), "--block-point", point]
        lines: list[str] = []
        onset: list[float] = []
        marker = f"rank {rank}: blocking"
        started = time.time()
        with subprocess.Popen(command, env=env, cwd=str(EXAMPLES), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, start_new_session=True) as proc:
            def read() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    lines.append(line)
                    if marker in line and not onset:
                        onset.append(time.time())

            threading.Thread(target=read, daemon=True).start()
            found = None
            try:
                deadline = started + 600
                while time.time() < deadline and proc.poll() is None:
                    if onset and time.time() > onset[0] + timeout_s:
                        break
                    if onset:
                        found = diagnose("block", rank, onset[0] - 0.5, rca.incidents(job))
                        if found.correct:
                            break
                    time.sleep(0.2)
            finally:
                kill_tree(proc)
        incidents = rca.incidents(job)
    out["wall_s"] = round(time.time() - started, 1)
    if not onset:
        out.update(correct=False, note=f"no onset (exit {proc.returncode}): " + "".join(lines)[-800:])
        return out
    t0 = onset[0]
    out["correct"] = bool(found is not None and found.correct)
    if found is not None and found.incident is not None:
        out["detection_s"] = round(float(found.incident["detected_at_unix"]) - t0, 3)
        causes = found.incident.get("root_causes") or [{}]
        out["named"] = f"{found.incident.get('kind')}: rank {causes[0].get('rank')} {causes[0].get('kind')}"
    out["loud_before"] = sum(1 for i in incidents if float(i["detected_at_unix"]) < t0 - 0.5 and severity(i) != "info")
    out["pages_before"] = sum(1 for i in incidents if (c := critical_at(i)) is not None and c < t0 - 0.5)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per library")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--libraries", help="comma-separated script prefixes (default: all)")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds after the onset to wait for a verdict")
    parser.add_argument("--json", help="write every run here")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    wanted = set(args.libraries.split(",")) if args.libraries else None
    print(f"library matrix: seed {seed}, {args.runs} run(s) per library", flush=True)
    results: list[dict[str, Any]] = []
    for script, module, option_sets in LIBRARIES:
        if wanted and script.split("_")[0] not in wanted:
            continue
        if importlib.util.find_spec(module.split(".")[0]) is None:
            print(f"{script:<30} skipped: {module} not installed", flush=True)
            continue
        for _ in range(args.runs):
            run = one_run(script, rng.choice(option_sets), rng.randrange(4), rng.randrange(3, 13), rng.choice(POINTS),
                          args.timeout)
            results.append(run)
            print(f"{script:<30} {' '.join(run['options']):<18} rank {run['rank']} step {run['step']:>2} "
                  f"{run['point']:<16} {'RIGHT' if run['correct'] else 'WRONG'} "
                  f"{run.get('detection_s', '-')!s:>7} s  loud before {run.get('loud_before', '-')} "
                  f"pages before {run.get('pages_before', '-')}  ({run['wall_s']} s) {run.get('named', '')} "
                  f"{run.get('note', '')[:300]}", flush=True)
    detections = sorted(r["detection_s"] for r in results if r.get("correct") and "detection_s" in r)
    right = sum(bool(r.get("correct")) for r in results)
    p90 = detections[min(len(detections) - 1, int(0.9 * len(detections)))] if detections else None
    print(f"\nright rank {right}/{len(results)}; diagnosis p50 "
          f"{statistics.median(detections) if detections else '-'} s, p90 {p90 if p90 is not None else '-'} s; "
          f"loud before the onset {sum(r.get('loud_before', 0) for r in results)}, pages before "
          f"{sum(r.get('pages_before', 0) for r in results)} (seed {seed})")
    if args.json:
        Path(args.json).write_text(json.dumps({"seed": seed, "runs": results}, indent=1))
    return 0 if right == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
