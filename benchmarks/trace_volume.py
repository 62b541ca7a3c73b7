"""Trace volume per rank under the trace budget (MYCROFT_TRACE_BUDGET, instrumentation/sampling.py).

    .venv/bin/python benchmarks/trace_volume.py [--seconds 30] [--rates 10,100] [--world 1024]

Runs the same 2-rank gloo loop (benchmarks/jobs/train_loop.py, one 1024-float all_reduce per step
at a fixed rate) under `opentelemetry-instrument`, exporting over OTLP/gRPC to a receiver here, at
each rate in three settings, all in one run:

- `sample 1.0`: no budget (MYCROFT_TRACE_BUDGET=inf): every collective a span, the old default;
- `default @ N ranks`: the default budget's share of an N-rank job (--world, 1,024 by default). The
  budget gives each stream budget / world kept collectives per second, so a 2-rank job with budget
  2048 * 2 / N keeps what each rank of an N-rank job keeps under the default: its bytes per rank are
  the N-rank job's;
- `default @ 2 ranks`: the default budget on this 2-rank job as it is (under its allowance: kept whole).

Bytes are the uncompressed OTLP protobuf of what each rank sent (ExportTraceServiceRequests of 512
spans, as the exporter batches), op spans and heartbeats apart, per second of the loop; `steady`
leaves out the budget's warm-up (a stream's first 3 epochs of 16 seqs are kept whole, then its first
measured level) by counting from the loop's 80th collective. Ratios are op-span bytes per collective
against `sample 1.0` at the same asked rate, from the same run of this script.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mycroft.instrumentation.config import DEFAULT_TRACE_BUDGET  # noqa: E402

from mycroft import schema  # noqa: E402
from mycroft.otlp import SpanRecord, request_from_records  # noqa: E402
from mycroft.otlp_server import OtlpReceiver  # noqa: E402
from tests.conftest import SpanSink, instrumented_env, run_torchrun  # noqa: E402

JOB = ROOT / "benchmarks" / "jobs" / "train_loop.py"
RANKS = 2
STEADY_FROM_SEQ = 80


@dataclass
class Row:
    rate: float  # collectives/s asked of the loop
    setting: str
    budget: float  # MYCROFT_TRACE_BUDGET of the run
    measured_rate: float  # collectives/s the loop made
    op_spans_per_rank_s: float
    op_bytes_per_rank_s: float
    hb_bytes_per_rank_s: float
    steady_op_bytes_per_rank_s: float
    kept_share: float  # op spans sent / ops
    ratio_to_sample_1: float = 0.0  # op-span bytes per collective, against sample 1.0's at the same rate
    steady_ratio_to_sample_1: float = 0.0


def _int(value: object) -> int:
    return int(value) if isinstance(value, int | float | str) else 0


def _bytes(records: list[SpanRecord]) -> int:
    return sum(request_from_records(records[i:i + 512]).ByteSize() for i in range(0, len(records), 512))


def run_one(sink: SpanSink, port: int, rate: float, seconds: float, setting: str, budget: float) -> Row:
    job = f"volume-{setting.replace(' ', '').replace('@', '-')}-{rate:g}-{time.time_ns()}"
    env = instrumented_env(port, MYCROFT_JOB_ID=job, MYCROFT_TRACE_BUDGET=str(budget))
    with tempfile.TemporaryDirectory() as tmp:
        result = run_torchrun(JOB, RANKS, env, "--steps", str(int(seconds * rate)), "--rate", str(rate),
                              "--size", "1024", "--out", tmp, timeout=seconds * 3 + 120)
    if result.returncode != 0:
        raise SystemExit(result.stderr[-3000:])
    sink.wait_for(lambda spans: sum(1 for s in spans if s.job_id == job and s.attributes.get(schema.ATTR_HB_FINAL))
                  >= RANKS, 20)
    records = [r for r in sink.snapshot() if r.job_id == job]
    per_rank: list[tuple[float, float, float, float, float, float]] = []
    for rank in range(RANKS):
        mine = [r for r in records if r.rank == rank]
        ops = [r for r in mine if r.kind == schema.KIND_COLLECTIVE]
        beats = [r for r in mine if r.kind == schema.KIND_HEARTBEAT and not r.attributes.get(schema.ATTR_HB_FINAL)]
        final = next(r for r in mine if r.attributes.get(schema.ATTR_HB_FINAL))
        done = sum(_int(final.attributes[key]) for key in (schema.ATTR_HB_SPANS_KEPT, schema.ATTR_HB_SPANS_ANOMALIES,
                                                             schema.ATTR_HB_SPANS_SAMPLED_OUT))
        # the loop: from its first op (kept: a stream's first epochs are) to the rank's final heartbeat
        elapsed = (final.end_ns - min(r.start_ns for r in ops)) / 1e9
        steady_ops = [r for r in ops if _int(r.attributes[schema.ATTR_SEQ]) >= STEADY_FROM_SEQ]
        steady_s = elapsed * max(0, done - STEADY_FROM_SEQ) / max(1, done)  # the loop runs at a fixed rate
        per_rank.append((done / elapsed, len(ops) / elapsed, _bytes(ops) / elapsed, _bytes(beats) / elapsed,
                         _bytes(steady_ops) / max(steady_s, 1e-9), len(ops) / max(1, done)))
    mean = [sum(v[i] for v in per_rank) / RANKS for i in range(6)]
    return Row(rate, setting, budget, round(mean[0], 1), round(mean[1], 2), round(mean[2], 1), round(mean[3], 1),
               round(mean[4], 1), round(mean[5], 4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--rates", default="10,100")
    parser.add_argument("--world", type=int, default=1024, help="the job size whose per-rank share is measured")
    parser.add_argument("--json", metavar="FILE", help="also write the rows here")
    args = parser.parse_args()
    sink = SpanSink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", None).start()
    assert receiver.grpc_port
    settings = [("sample 1.0", float("inf")),
                (f"default @ {args.world} ranks", DEFAULT_TRACE_BUDGET * RANKS / args.world),
                (f"default @ {RANKS} ranks", DEFAULT_TRACE_BUDGET)]
    rows: list[Row] = []
    try:
        for rate in (float(r) for r in args.rates.split(",")):
            base: Row | None = None
            for setting, budget in settings:
                row = run_one(sink, receiver.grpc_port, rate, args.seconds, setting, budget)
                if base is None:
                    base = row
                # op-span bytes per collective against sample 1.0's (the loops' rates differ a little)
                per_op = row.op_bytes_per_rank_s / row.measured_rate
                row.ratio_to_sample_1 = round(per_op / (base.op_bytes_per_rank_s / base.measured_rate), 4)
                row.steady_ratio_to_sample_1 = round(
                    (row.steady_op_bytes_per_rank_s / row.measured_rate)
                    / (base.steady_op_bytes_per_rank_s / base.measured_rate), 4)
                rows.append(row)
                print(json.dumps(asdict(row)), flush=True)
    finally:
        receiver.stop(0)
    print(f"\nbytes per rank per second (uncompressed OTLP protobuf), {RANKS}-rank gloo loop, {args.seconds:g} s a run;"
          f" default budget {DEFAULT_TRACE_BUDGET:g} spans/s per job. Op spans are what Jaeger / Tempo receive;"
          " heartbeats go to the RCA only (the shipped collector configs filter them before a trace backend).")
    print("| collectives/s | setting | op spans/s | op B/s | steady op B/s | heartbeat B/s | op B vs sample 1.0 "
          "| steady vs 1.0 | into the backend at --world ranks (steady) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        job = "-" if r.setting.endswith(f"@ {RANKS} ranks") else \
            f"{r.steady_op_bytes_per_rank_s * args.world / 1e6:.2f} MB/s"
        print(f"| {r.measured_rate:g} | {r.setting} | {r.op_spans_per_rank_s:g} | {r.op_bytes_per_rank_s:,.0f} | "
              f"{r.steady_op_bytes_per_rank_s:,.0f} | {r.hb_bytes_per_rank_s:,.0f} | {r.ratio_to_sample_1:.3f} | "
              f"{r.steady_ratio_to_sample_1:.4f} | {job} |")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
