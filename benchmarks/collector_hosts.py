"""rotel-hosted vs standalone processor behind `mycroft collector run`, on the same load.

    .venv/bin/python benchmarks/collector_hosts.py [--collectives 2000] [--rate 4000] [--repeat 2] [--json out.json]

Both engines run through the real command (`mycroft collector run --engine rotel|standalone`,
same ports, flags and processor config), one OTLP gRPC client in this process, one counting
OTLP receiver downstream. The runs alternate (rotel, standalone, rotel, ...) so a change in
the shared machine's load falls on both, and every ratio is taken from the same run. Loads:

  plain    2000 collectives x 8 ranks + heartbeats, as fast as the engine takes it
  detail   a quarter of them with native step detail (40 detail spans per collective)
  paced    the detail workload offered at --rate spans/s (below both capacities): what the
           same traffic costs each engine in CPU, and how long a heartbeat takes through it
           (a probe heartbeat every 0.1 s on its own channel, send -> arrival downstream)

Per run: spans/s (the clock stops when the last summary arrives), CPU seconds of the
engine's process tree (the `collector run` supervisor + rotel-agent or `processor serve`,
from /proc, threads included), peak and idle RSS of that tree, and the processor's own
drop counters (shedding is disabled in both: rotel's CPU budget at 100 %, the standalone
backlog far above the load).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc  # noqa: E402

from benchmarks.processor_throughput import CountingSink, free_port, serve_sink, workload  # noqa: E402
from mycroft import schema  # noqa: E402
from mycroft.faults import made_up_spans as syn  # noqa: E402
from mycroft.otlp import request_from_records  # noqa: E402

BIN = Path(sys.executable).parent
ENGINES = ("rotel", "standalone")
CLK_TCK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (all their threads)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except OSError:
            continue
    return total / CLK_TCK


def rss_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as handle:
                total += next(int(line.split()[1]) for line in handle if line.startswith("VmRSS:"))
        except (OSError, StopIteration):
            continue
    return total / 1024


class Sampler(threading.Thread):
    """Peak RSS of the engine's tree, sampled every 50 ms."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self._done = pid, 0.0, threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.05):
            self.peak = max(self.peak, rss_mib(tree(self.pid)))

    def stop(self) -> float:
        self._done.set()
        self.join()
        return self.peak


class TimingSink(CountingSink):
    """Counts like processor_throughput's sink; notes when each heartbeat arrives (by span id)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: dict[int, float] = {}

    def Export(self, request, context):
        now = time.monotonic()
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if span.name == schema.SPAN_HEARTBEAT:
                        self.arrived[int.from_bytes(span.span_id, "big")] = now
        return super().Export(request, context)


class HeartbeatProbe(threading.Thread):
    """One heartbeat every 0.1 s on its own channel; sent times by span id."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(address))
        self.sent: dict[int, float] = {}
        self._done = threading.Event()

    def run(self) -> None:
        counter = 0
        while not self._done.wait(0.1):
            counter += 1
            beat = syn.heartbeat_span(0, counter, time.time_ns(), job="probe")
            request = request_from_records([beat])
            self.sent[beat.span_id] = time.monotonic()
            self.stub.Export(request, timeout=10)

    def latencies_ms(self, arrived: dict[int, float]) -> list[float]:
        self._done.set()
        self.join()
        time.sleep(0.5)  # the last probes' way through
        return sorted((arrived[k] - t) * 1000 for k, t in self.sent.items() if k in arrived)


def run_once(engine: str, requests: list[Any], spans: int, expected_summaries: int,
             rate: float | None) -> dict[str, Any]:
    sink, server, sink_port = serve_sink(TimingSink())
    grpc_port, http_port = free_port(), free_port()
    workdir = tempfile.mkdtemp(prefix=f"mycroft-bench-{engine}-")
    command = [str(BIN / "mycroft"), "collector", "run", "--engine", engine, "--otlp-grpc", f"127.0.0.1:{grpc_port}",
               "--otlp-http", f"127.0.0.1:{http_port}", "--export", f"http://127.0.0.1:{sink_port}",
               "--linger", "0.05", "--workdir", workdir]
    # capacity, not shedding: rotel's CPU budget at 100 %; the standalone backlog above the whole load
    env = dict(os.environ, MYCROFT_PROCESSOR_BUSY="1.0", MYCROFT_PROCESSOR_MAX_BACKLOG=str(10 ** 7))
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        ready = next(json.loads(line) for line in proc.stdout if line.startswith("{") and '"ready"' in line)
        assert ready["engine"] == engine, ready
        time.sleep(1.0)  # settle: imports done, first stats written
        pids = tree(proc.pid)
        idle_rss = rss_mib(pids)
        sampler = Sampler(proc.pid)
        sampler.start()
        stub = trace_service_pb2_grpc.TraceServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        probe = HeartbeatProbe(f"127.0.0.1:{grpc_port}") if rate else None
        cpu0 = cpu_s(tree(proc.pid))
        if probe:
            probe.start()
        t0 = time.perf_counter()
        sent = 0
        for request, count in requests:
            if rate:
                lag = t0 + sent / rate - time.perf_counter()
                if lag > 0:
                    time.sleep(lag)
            stub.Export(request, timeout=60)
            sent += count
        deadline = time.monotonic() + 120
        while sink.summaries < expected_summaries and time.monotonic() < deadline:
            time.sleep(0.005)
        seconds = time.perf_counter() - t0
        pids = tree(proc.pid)
        cpu = cpu_s(pids) - cpu0
        peak = sampler.stop()
        beats = probe.latencies_ms(sink.arrived) if probe else []
        result = {"engine": engine, "spans_in": spans, "spans_out": sink.count, "summaries": sink.summaries,
                  "complete": sink.summaries >= expected_summaries, "seconds": round(seconds, 3),
                  "spans_per_s": round(spans / seconds), "cpu_s": round(cpu, 2),
                  "cpu_cores": round(cpu / seconds, 2), "cpu_us_per_span": round(cpu / spans * 1e6, 1),
                  "rss_idle_mib": round(idle_rss, 1), "rss_peak_mib": round(peak, 1), "processes": len(pids)}
        if beats:
            result["heartbeat_ms_p50"] = round(statistics.median(beats), 1)
            result["heartbeat_ms_p95"] = round(beats[int(0.95 * (len(beats) - 1))], 1)
            result["heartbeats_probed"] = f"{len(beats)}/{len(probe.sent) if probe else 0}"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out = ""
        server.stop(0)
        shutil.rmtree(workdir, ignore_errors=True)
    stopped = [json.loads(line) for line in out.splitlines() if line.startswith("{") and '"stopped"' in line]
    counters = stopped[-1].get("counters", {}) if stopped else {}
    result["shed"] = {k: v for k, v in counters.items() if (k.startswith("dropped_") or k == "unjoined_overload") and v}
    return result


def encode(batches: list[list[Any]], batch_spans: int = 2000) -> tuple[list[tuple[Any, int]], int]:
    flat = [record for batch in batches for record in batch]
    chunks = [flat[i:i + batch_spans] for i in range(0, len(flat), batch_spans)]
    return [(request_from_records(chunk), len(chunk)) for chunk in chunks], len(flat)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--collectives", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=4000.0, help="spans/s offered in the paced load")
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs per engine and load")
    parser.add_argument("--loads", default="plain,detail,paced", help="which loads, comma-separated")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    plain = workload(args.collectives, detail=False)
    detailed = workload(max(1, args.collectives // 4), detail=True)
    paced = workload(max(1, args.collectives // 20), detail=True)
    loads = {name: load for name, load in (("plain", (plain, None)), ("detail", (detailed, None)),
                                           ("paced", (paced, args.rate))) if name in args.loads.split(",")}
    encoded = {name: (*encode(batches), len(batches), rate) for name, (batches, rate) in loads.items()}
    gc.collect()
    gc.freeze()
    results: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                           "load_avg": os.getloadavg()},
                               "rate": args.rate, "runs": {}}
    for name, (requests, spans, summaries, rate) in encoded.items():
        runs: dict[str, list[dict[str, Any]]] = {engine: [] for engine in ENGINES}
        for _ in range(args.repeat):
            for engine in ENGINES:  # alternate: a load change on the shared machine hits both
                runs[engine].append(run_once(engine, requests, spans, summaries, rate))
        results["runs"][name] = runs
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; medians of {args.repeat} alternating runs")
    header = f"{'load':<7} {'engine':<11} {'spans/s':>9} {'CPU s':>7} {'us/span':>8} {'cores':>6} " \
             f"{'RSS idle':>9} {'RSS peak':>9}  shed"
    print(header)
    summary: dict[str, Any] = {}
    for name, runs in results["runs"].items():
        med: dict[str, dict[str, float]] = {}
        for engine, items in runs.items():
            med[engine] = {key: statistics.median(r[key] for r in items)
                           for key in ("spans_per_s", "cpu_s", "cpu_us_per_span", "cpu_cores", "rss_idle_mib",
                                       "rss_peak_mib")}
            shed = {k: v for r in items for k, v in r["shed"].items()}
            complete = all(r["complete"] for r in items)
            m = med[engine]
            if "heartbeat_ms_p50" in items[0]:
                m["heartbeat_ms_p50"] = statistics.median(r["heartbeat_ms_p50"] for r in items)
                m["heartbeat_ms_p95"] = statistics.median(r["heartbeat_ms_p95"] for r in items)
            beats = (f"  heartbeat p50 {m['heartbeat_ms_p50']:.0f} ms p95 {m['heartbeat_ms_p95']:.0f} ms"
                     if "heartbeat_ms_p50" in m else "")
            print(f"{name:<7} {engine:<11} {m['spans_per_s']:>9,.0f} {m['cpu_s']:>7.2f} {m['cpu_us_per_span']:>8.1f} "
                  f"{m['cpu_cores']:>6.2f} {m['rss_idle_mib']:>8.0f}M {m['rss_peak_mib']:>8.0f}M  "
                  f"{shed or '-'}{'' if complete else '  INCOMPLETE'}{beats}")
        # ratios run by run (rotel / standalone of the same alternating pair), then their median
        pairs = list(zip(runs["rotel"], runs["standalone"], strict=True))
        ratio = {key: round(statistics.median(a[key] / b[key] for a, b in pairs), 2)
                 for key in ("spans_per_s", "cpu_us_per_span", "rss_peak_mib", "rss_idle_mib")}
        summary[name] = {"median": med, "rotel_over_standalone": ratio}
        print(f"{name:<7} rotel/standalone: spans/s x{ratio['spans_per_s']}, CPU per span x{ratio['cpu_us_per_span']}, "
              f"RSS peak x{ratio['rss_peak_mib']}, RSS idle x{ratio['rss_idle_mib']}")
    results["summary"] = summary
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
