"""Processor throughput and export-volume reduction.

    .venv/bin/python benchmarks/processor_throughput.py [--collectives 2000] [--json out.json]

Measures, on a synthetic 8-rank all_reduce loop built from the span contract:
  1. the pure core (CollectorProcessor.process) in spans/s, without and with
     native-style step detail;
  2. each deployment end to end, in spans/s: OTLP gRPC client -> `mycroft processor
     serve` -> OTLP receiver, and client -> `mycroft collector run` (rotel + processor)
     -> OTLP receiver; the clock stops when every expected output span has arrived;
  3. the reduction in exported volume (spans and OTLP bytes) on the run with step detail.
Senders, the processor and the receiver share this machine's cores, so the deployment
figures are lower bounds.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any, TypeVar

import grpc
from mycroft.collector_processor.config import ProcessorConfig
from mycroft.collector_processor.pipeline import CollectorProcessor
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from mycroft import schema
from mycroft.faults import made_up_spans as syn
from mycroft.otlp import SpanRecord, request_from_records

BIN = Path(sys.executable).parent
WORLD = 8
SHAPE = syn.StepDetail(channels=2, steps=8, counter_samples=2)


def workload(collectives: int, detail: bool) -> list[list[SpanRecord]]:
    return list(syn.training_run(collectives, world=WORLD, step_detail=SHAPE if detail else None,
                                 heartbeat_every=10))


def bench_core(batches: list[list[SpanRecord]], repeat: int) -> dict[str, Any]:
    """Best of `repeat` runs (the machine is shared; the best run is the least disturbed)."""
    spans_in = sum(len(b) for b in batches)
    runs: list[float] = []
    for _ in range(repeat):
        proc = CollectorProcessor(ProcessorConfig(linger_s=0.0))
        out_spans = 0
        t0 = time.perf_counter()
        for i, batch in enumerate(batches):
            now = i * 0.002
            out_spans += len(proc.process(batch, now)) + len(proc.tick(now))
        out_spans += len(proc.flush())
        runs.append(time.perf_counter() - t0)
    seconds = min(runs)
    return {"spans_in": spans_in, "spans_out": out_spans, "seconds": round(seconds, 3),
            "spans_per_s": round(spans_in / seconds), "runs_s": [round(r, 3) for r in runs],
            "counters": proc.counters.snapshot()}


def volume(batches: list[list[SpanRecord]]) -> dict[str, Any]:
    """Spans and OTLP protobuf bytes in vs out of the core (the export-volume reduction)."""
    proc = CollectorProcessor(ProcessorConfig(linger_s=0.0))
    bytes_in = bytes_out = spans_in = spans_out = 0
    for i, batch in enumerate(batches):
        out = proc.process(batch, i * 0.002)
        out.extend(proc.tick(i * 0.002))
        spans_in += len(batch)
        spans_out += len(out)
        bytes_in += request_from_records(batch).ByteSize()
        if len(out):
            bytes_out += request_from_records(out.all()).ByteSize()
    rest = proc.flush().all()
    spans_out += len(rest)
    bytes_out += request_from_records(rest).ByteSize() if rest else 0
    return {"spans_in": spans_in, "spans_out": spans_out, "bytes_in": bytes_in, "bytes_out": bytes_out,
            "span_reduction": round(1 - spans_out / spans_in, 4), "byte_reduction": round(1 - bytes_out / bytes_in, 4),
            "span_ratio": round(spans_in / spans_out, 2)}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class CountingSink(trace_service_pb2_grpc.TraceServiceServicer):
    """Downstream receiver that counts spans and summaries without decoding them (it shares
    the CPUs with what is measured, so it must cost as little as possible)."""

    def __init__(self) -> None:
        self.count = 0
        self.summaries = 0
        self.lock = threading.Lock()

    def Export(self, request, context):
        count = summaries = 0
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                count += len(ss.spans)
                if ss.scope.name == schema.PROCESSOR_SCOPE:
                    summaries += sum(1 for span in ss.spans if span.name == schema.SPAN_COLLECTIVE_SUMMARY)
        with self.lock:
            self.count += count
            self.summaries += summaries
        return trace_service_pb2.ExportTraceServiceResponse()


Sink = TypeVar("Sink", bound=CountingSink)


def serve_sink(sink: Sink) -> tuple[Sink, grpc.Server, int]:
    """A gRPC OTLP trace server on a free local port, answered by `sink`."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(sink, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return sink, server, port


def counting_sink() -> tuple[CountingSink, grpc.Server, int]:
    return serve_sink(CountingSink())


def _ready(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{") and '"ready"' in line:
            return dict(json.loads(line))
    raise RuntimeError(f"no ready line: {proc.stderr.read() if proc.stderr else ''}")


def bench_deployment(mode: str, batches: list[list[SpanRecord]], expected_summaries: int,
                     batch_spans: int = 2000) -> dict[str, Any]:
    sink, server, sink_port = counting_sink()
    export = f"http://127.0.0.1:{sink_port}"
    workdir = tempfile.mkdtemp(prefix="mycroft-bench-")
    env = dict(os.environ)
    if mode == "service":
        command = [str(BIN / "mycroft"), "processor", "serve", "--otlp-grpc", "127.0.0.1:0", "--otlp-http", "",
                   "--export", export, "--linger", "0.05", "--log-level", "WARNING",
                   "--max-backlog", str(10 ** 7)]  # measure capacity: no shedding
    else:
        grpc_port, http_port = free_port(), free_port()
        command = [str(BIN / "mycroft"), "collector", "run", "--engine", "rotel",
                   "--otlp-grpc", f"127.0.0.1:{grpc_port}",
                   "--otlp-http", f"127.0.0.1:{http_port}", "--export", export, "--linger", "0.05",
                   "--workdir", workdir]
        env["MYCROFT_PROCESSOR_BUSY"] = "1.0"  # measure capacity: no shedding
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        ready = _ready(proc)
        port = ready["otlp_grpc"] if mode == "service" else grpc_port
        # pre-encode (the client's cost is not the processor's)
        flat = [record for batch in batches for record in batch]
        requests = [request_from_records(flat[i:i + batch_spans]) for i in range(0, len(flat), batch_spans)]
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
        t0 = time.perf_counter()
        for request in requests:
            stub.Export(request, timeout=60)
        sent_s = time.perf_counter() - t0
        deadline = time.monotonic() + 120
        while sink.summaries < expected_summaries and time.monotonic() < deadline:
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        result = {"spans_in": len(flat), "spans_out": sink.count, "summaries": sink.summaries,
                  "seconds": round(seconds, 3), "accept_seconds": round(sent_s, 3),
                  "spans_per_s": round(len(flat) / seconds), "complete": sink.summaries >= expected_summaries}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out = ""
        server.stop(0)
    stopped = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"stopped"' in line]
    counters = stopped[-1].get("counters", {}) if stopped else {}
    result["shed"] = {k: v for k, v in counters.items() if k.startswith("dropped_") or k == "unjoined_overload"}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collectives", type=int, default=2000)
    parser.add_argument("--json", default="")
    parser.add_argument("--repeat", type=int, default=5, help="core runs; the best is reported")
    parser.add_argument("--deploy-repeat", type=int, default=2, help="runs per deployment; the best is reported")
    parser.add_argument("--skip-deployments", action="store_true")
    args = parser.parse_args()
    plain = workload(args.collectives, detail=False)
    detailed = workload(max(1, args.collectives // 4), detail=True)
    # the workloads are ~200k live objects the collector never owns: keep them out of the
    # cyclic GC's generations so its passes over them do not land in the timed loops
    gc.collect()
    gc.freeze()
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workload": {"world": WORLD, "collectives_plain": args.collectives,
                     "collectives_detail": len(detailed), "step_detail": SHAPE.__dict__ if hasattr(SHAPE, "__dict__")
                     else {"channels": SHAPE.channels, "steps": SHAPE.steps, "counter_samples": SHAPE.counter_samples}},
        "core_plain": bench_core(plain, args.repeat),
        "core_detail": bench_core(detailed, args.repeat),
        "reduction_detail": volume(detailed),
    }
    if not args.skip_deployments:
        for mode in ("service", "rotel"):
            for name, batches in (("plain", plain), ("detail", detailed)):
                runs = [bench_deployment(mode, batches, len(batches)) for _ in range(args.deploy_repeat)]
                best = max(runs, key=lambda r: r["spans_per_s"])
                best["runs_spans_per_s"] = [r["spans_per_s"] for r in runs]
                results[f"{mode}_{name}"] = best
    for name, value in results.items():
        if isinstance(value, dict) and "spans_per_s" in value:
            print(f"{name:<16} {value['spans_per_s']:>10,} spans/s  ({value['spans_in']:,} spans in, "
                  f"{value['spans_out']:,} out, {value['seconds']} s)")
    red = results["reduction_detail"]
    print(f"reduction (step detail): spans {red['spans_in']:,} -> {red['spans_out']:,} "
          f"({red['span_reduction']:.1%} fewer), OTLP bytes {red['bytes_in']:,} -> {red['bytes_out']:,} "
          f"({red['byte_reduction']:.1%} fewer)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
