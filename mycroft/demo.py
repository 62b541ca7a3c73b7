"""`mycroft demo`: the whole path on one machine, no other set-up.

    RCA service  <-  collector (Mycroft processor,  <-  4 instrumented gloo ranks (torchrun)
                     standalone or in rotel)           one of them misbehaves at a random step

Prints the incident the RCA service raised (root cause, evidence, latency from the
fault's onset) and where the traces are: an OTLP JSON file of everything the collector
exported, readable by `mycroft rca analyze --otlp-json` or any OTLP tool.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from mycroft.otlp import SpanRecord, encode_json
from mycroft.otlp_server import OtlpReceiver

FAULTS = ("block", "sigkill", "sigstop", "straggler", "mismatch", "deadlock", "chain")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class TraceFile:
    """An OTLP receiver that keeps what the collector exports, for the user to look at."""

    def __init__(self) -> None:
        self.records: list[SpanRecord] = []
        self._lock = threading.Lock()
        self.receiver = OtlpReceiver(self._sink, "127.0.0.1:0", None).start()
        self.endpoint = f"http://127.0.0.1:{self.receiver.grpc_port}"

    def _sink(self, records: list[SpanRecord]) -> None:
        with self._lock:
            self.records.extend(records)

    def write(self, path: Path, job: str) -> int:
        with self._lock:
            mine = [record for record in self.records if record.job_id == job]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(encode_json(mine)))
        return len(mine)

    def stop(self) -> None:
        self.receiver.stop(0)


class _ThroughCollector:
    """What the inject harness needs: where ranks send OTLP, and the RCA service's incidents."""

    def __init__(self, collector_grpc: str, rca: Any) -> None:
        self.otlp_grpc = collector_grpc
        self._rca = rca

    def incidents(self, job: str) -> list[dict[str, Any]]:
        return list(self._rca.incidents(job))

    def alerts(self) -> list[tuple[float, dict[str, Any]]] | None:
        return self._rca.alerts()


def _print_incident(result: Any, trace_path: Path, spans: int, api: str) -> None:
    incident = result.incident
    print()
    print("=" * 78)
    if incident is None:
        print(f"NO VERDICT: {result.note}")
        print("=" * 78)
        return
    verdict = "CORRECT" if result.correct else "WRONG"
    print(f"INCIDENT {incident['id']}  kind={incident['kind']}  status={incident['status']}  job={incident['job']}")
    print(f"  injected: {result.fault} on rank {result.rank} at step {result.step}   -> verdict {verdict}")
    detection = f"{result.detection_s:.2f} s" if result.detection_s is not None else "-"
    root_cause = f"{result.root_cause_s:.2f} s" if result.root_cause_s is not None else "-"
    print(f"  detected {detection} after onset; root cause named {root_cause} after onset")
    print(f"  summary: {incident.get('summary', '')}")
    for cause in incident.get("root_causes", []):
        where = f"rank {cause['rank']}" if cause.get("rank") is not None else "link"
        print(f"  ROOT CAUSE: {where}: {cause['kind']}")
        evidence = cause.get("evidence", {})
        text = evidence.get("text") if isinstance(evidence, dict) else str(evidence)
        if text:
            for line in str(text).splitlines():
                print(f"      {line}")
    graph = incident.get("wait_for_graph", {})
    if graph:
        print(f"  wait-for graph: {json.dumps(graph)[:400]}")
    print()
    print(f"  traces: {trace_path}  ({spans} spans, OTLP JSON; one trace per collective, one span per rank)")
    print(f"      replay the analysis offline: mycroft rca analyze --otlp-json {trace_path}")
    print("      live, point the collector at Jaeger/Tempo: mycroft collector run ... --export http://jaeger:4317")
    print(f"  the RCA API served it at {api}/api/v1/incidents/{incident['id']} while the demo ran")
    print("=" * 78)


def main(argv: list[str] | None = None) -> int:
    from mycroft.collector_processor.collector import DEFAULT_ENGINE, ENGINES, EmbeddedCollector

    parser = argparse.ArgumentParser(prog="mycroft demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fault", choices=FAULTS, default="block")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--rank", type=int, default=None, help="faulty rank (random by default)")
    parser.add_argument("--step", type=int, default=None, help="fault step (random by default)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", default=".mycroft/demo", help="where the trace file and job log go")
    parser.add_argument("--no-collector", action="store_true", help="ranks export straight to the RCA service")
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                        help="what hosts the collector's processor (mycroft collector run --engine; default "
                             "%(default)s)")
    args = parser.parse_args(argv)

    from mycroft.faults.inject import local_rca, run_one

    rng = random.Random(args.seed)
    # the job inherits this: heartbeats carry the main-thread stack after 0.5 s outside communication,
    # so the verdict can say where a rank that never entered the collective is
    os.environ.setdefault("MYCROFT_STACK_AFTER", "0.5")
    out = Path(args.out).resolve()
    traces = TraceFile()
    print(f"mycroft demo: {args.nproc}-rank gloo training job, fault '{args.fault}' on a random rank and step")
    with contextlib.ExitStack() as stack:
        stack.callback(traces.stop)
        rca = stack.enter_context(local_rca())
        print(f"  RCA service: OTLP gRPC {rca.otlp_grpc}, API {rca.api}")
        if args.no_collector:
            target: Any = rca
            print("  no collector: ranks export straight to the RCA service")
        else:
            grpc_address = f"127.0.0.1:{_free_port()}"
            collector = EmbeddedCollector(exports=[f"http://{rca.otlp_grpc}", traces.endpoint],
                                          otlp_grpc=grpc_address, otlp_http=f"127.0.0.1:{_free_port()}",
                                          engine=args.engine)
            stack.enter_context(collector)
            notice = collector.notice()
            print(f"  collector: {collector.describe()} on {grpc_address}, exporting to the RCA service "
                  f"and to {traces.endpoint}" + (f"; {notice}" if notice else ""))
            target = _ThroughCollector(grpc_address, rca)
        print("  launching: opentelemetry-instrument torchrun --nproc-per-node "
              f"{args.nproc} -m mycroft.faults.faultjob ...")
        result = run_one(target, args.fault, nproc=args.nproc, rank=args.rank, step=args.step, rng=rng,
                         log_dir=str(out), linger_s=3.0)
        trace_path = out / f"{result.job}.otlp.json"
        if args.no_collector:
            spans = 0
        else:
            import time

            time.sleep(1.0)  # the collector's last batch
            spans = traces.write(trace_path, result.job)
        _print_incident(result, trace_path if spans else out, spans, rca.api)
    return 0 if result.correct else 1


if __name__ == "__main__":
    sys.exit(main())
