"""OTLP ingest rate of the RCA service (spans/s received over gRPC and folded into job state).

    .venv/bin/python benchmarks/rca_ingest.py [--seconds 10] [--clients 2] [--batch 512] [--world 256]

Client processes replay pre-encoded ExportTraceServiceRequests of collective spans and
heartbeats of a `--world`-rank job as fast as the service accepts them (a refusal under
back-pressure is retried after 10 ms). The service runs in this process with its real
receiver, queue, engine and analysis loop.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

import grpc
from mycroft.rca_service.service import RcaService, ServiceOptions

from mycroft.faults.made_up_job import StepJob
from mycroft.otlp import request_from_records


def _client(port: int, payloads: list[bytes], seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export",
                                 request_serializer=None, response_deserializer=None)
    sent = refused = 0
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        try:
            export(payloads[i % len(payloads)], timeout=10)
            sent += 1
        except grpc.RpcError:
            refused += 1
            time.sleep(0.01)
        i += 1
    out.put((sent, refused))
    channel.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--world", type=int, default=256)
    args = parser.parse_args()
    job = StepJob("ingest", args.world)
    records = job.steps(max(1, 4 * args.batch // args.world))
    records += job.heartbeats(job.now, not_entered=range(args.world), stack="")
    batches = [records[i:i + args.batch] for i in range(0, len(records), args.batch)]
    batches = [b for b in batches if len(b) == args.batch] or batches
    payloads = [request_from_records(b).SerializeToString() for b in batches]
    spans_per_request = sum(len(b) for b in batches) / len(batches)
    with tempfile.TemporaryDirectory() as tmp:
        service = RcaService(ServiceOptions(otlp_grpc="127.0.0.1:0", otlp_http=None, http="127.0.0.1:0",
                                            db=os.path.join(tmp, "rca.db"))).start()
        ctx = mp.get_context("spawn")  # no fork of a process that runs gRPC threads
        queue: mp.Queue = ctx.Queue()  # type: ignore[type-arg]
        procs = [ctx.Process(target=_client, args=(service.receiver.grpc_port, payloads, args.seconds, queue))
                 for _ in range(args.clients)]
        started = time.monotonic()
        for p in procs:
            p.start()
        results = [queue.get() for _ in procs]
        for p in procs:
            p.join()
        elapsed = time.monotonic() - started
        accepted = sum(s for s, _ in results) * spans_per_request
        refused = sum(r for _, r in results)
        service.ingest.drain(60)
        applied_elapsed = time.monotonic() - started
        applied = service.metrics.counters.get("mycroft_rca_spans_applied_total", 0.0)
        analysis = service.engine.last_pass.seconds
        service.stop()
    print(f"{args.clients} client(s), {spans_per_request:.0f} spans/request, world {args.world}, {elapsed:.1f} s")
    print(f"accepted: {accepted:,.0f} spans, {accepted / elapsed:,.0f} spans/s ({refused} requests refused "
          f"under back-pressure and retried)")
    print(f"applied to job state: {applied:,.0f} spans, {applied / applied_elapsed:,.0f} spans/s; "
          f"last analysis pass {analysis * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
