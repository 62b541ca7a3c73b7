"""A local OTLP gRPC tee: one input, every `--export` endpoint as output.

rotel 0.0.1a15 (agent alpha10) accepts a single trace exporter ("Only one exporter
supported for ROTEL_EXPORTERS_TRACES"), while fan-out to the RCA service plus
Jaeger/Tempo is the normal case. With more than one endpoint, EmbeddedCollector points
rotel's exporter at this tee, which forwards each request unchanged (no decode, no
re-encode) through a per-endpoint bounded queue, so one slow backend never stalls
the others or rotel.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from .export import Fanout
from .stats import Counters


class _TeeService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, fanout: Fanout, counters: Counters) -> None:
        self._fanout = fanout
        self._counters = counters

    def Export(self, request, context):
        self._fanout.submit_request(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class ExportTee:
    """gRPC OTLP receiver on `listen` that copies every request to every endpoint."""

    def __init__(self, endpoints: Sequence[str], listen: str = "127.0.0.1:0", max_queue_spans: int = 200_000) -> None:
        self.counters = Counters()
        self.fanout = Fanout(endpoints, self.counters, max_queue_spans=max_queue_spans)
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4),
                                   options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)])
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TeeService(self.fanout, self.counters),
                                                                  self._server)
        self.port = self._server.add_insecure_port(listen)
        if not self.port:
            raise OSError(f"cannot bind the export tee on {listen}")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def start(self) -> ExportTee:
        self._server.start()
        return self

    def stop(self, drain_s: float = 5.0) -> None:
        self._server.stop(0.5).wait()
        self.fanout.close(drain_s)
