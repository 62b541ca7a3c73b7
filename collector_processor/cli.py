"""`mycroft processor serve`: run the standalone OTLP processor service until signalled.

Prints one JSON line {"event": "ready", ...} with the bound ports once it serves (port 0
picks a free one), so scripts and tests know where it listens.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from .config import PROCESSOR_OTLP_GRPC, PROCESSOR_OTLP_HTTP, ProcessorConfig

if TYPE_CHECKING:
    from .service import ProcessorService


def add_processor_options(parser: argparse.ArgumentParser) -> None:
    """Options of the processor core, shared by `processor serve` and `collector run`."""
    defaults = ProcessorConfig()
    group = parser.add_argument_group("processor")
    group.add_argument("--window", type=float, default=defaults.window_s, metavar="S",
                       help="seconds a collective waits for all members (default %(default)s)")
    group.add_argument("--linger", type=float, default=defaults.linger_s, metavar="S",
                       help="seconds a complete collective waits for trailing native detail (default %(default)s)")
    group.add_argument("--max-open", type=int, default=defaults.max_open, metavar="N",
                       help="open collectives held at once (default %(default)s)")
    group.add_argument("--max-detail", type=int, default=defaults.max_detail_total, metavar="N",
                       help="raw native detail spans buffered at once (default %(default)s)")
    group.add_argument("--skew-threshold", type=float, default=defaults.skew_threshold_s, metavar="S",
                       help="arrival skew that keeps a collective's raw detail (default %(default)s)")
    group.add_argument("--slow-factor", type=float, default=defaults.slow_factor, metavar="X",
                       help="slower than X times its baseline keeps raw detail (default %(default)s)")


def config_from_args(args: argparse.Namespace) -> ProcessorConfig:
    if getattr(args, "config_json", None):  # the embedded collector's standalone engine: the whole config
        return ProcessorConfig(**json.loads(args.config_json))
    return ProcessorConfig(window_s=args.window, linger_s=args.linger, max_open=args.max_open,
                           max_detail_total=args.max_detail, skew_threshold_s=args.skew_threshold,
                           slow_factor=args.slow_factor)


def wait_for_signal() -> None:
    """Block until SIGINT / SIGTERM."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass


def _serve_for_collector(service: ProcessorService, stats_file: str, flush_file: str) -> None:
    """Until SIGINT / SIGTERM: counters to `stats_file` every second (the first at once: the embedded
    collector's readiness), and one flush of every window when `flush_file` appears (its graceful stop)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    flushed = False
    last_stats = 0.0
    while True:
        if flush_file and not flushed and os.path.exists(flush_file):
            flushed = service.flush() or True
            last_stats = 0.0
        now = time.monotonic()
        if stats_file and now - last_stats >= 1.0:
            last_stats = now
            service.write_stats(stats_file, flushed)
        if stop.wait(0.05):
            return


def _serve(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mycroft processor serve",
                                     description="Standalone Mycroft processor: OTLP in, OTLP gRPC out.")
    parser.add_argument("--otlp-grpc", default=PROCESSOR_OTLP_GRPC, metavar="HOST:PORT",
                        help="OTLP gRPC listen address (default %(default)s; '' to disable)")
    parser.add_argument("--otlp-http", default=PROCESSOR_OTLP_HTTP, metavar="HOST:PORT",
                        help="OTLP HTTP listen address (default %(default)s; '' to disable)")
    parser.add_argument("--export", action="append", required=True, metavar="ENDPOINT",
                        help="OTLP gRPC endpoint to send to (http://host:port); repeat to fan out")
    parser.add_argument("--metrics", default="", metavar="HOST:PORT",
                        help="serve Prometheus counters on http://HOST:PORT/metrics")
    parser.add_argument("--max-backlog", type=int, default=50_000, metavar="N",
                        help="spans queued for the core before it sheds (default %(default)s)")
    parser.add_argument("--max-export-queue", type=int, default=50_000, metavar="N",
                        help="spans queued per endpoint and lane before export drops (default %(default)s)")
    parser.add_argument("--log-level", default="INFO")
    # the embedded collector's standalone engine (`mycroft collector run`): its config, counters and flush
    parser.add_argument("--config-json", default="", help=argparse.SUPPRESS)
    parser.add_argument("--stats-file", default="", help=argparse.SUPPRESS)
    parser.add_argument("--flush-file", default="", help=argparse.SUPPRESS)
    from mycroft.security_cli import security_args, security_options, warn_if_open

    security_args(parser, client_ca=False)
    add_processor_options(parser)
    args = parser.parse_args(argv)
    auth, tls = security_options(args, "mycroft processor serve")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from .service import ProcessorService  # grpc import only when serving

    try:
        service = ProcessorService(args.otlp_grpc or None, args.otlp_http or None, args.export,
                                   config_from_args(args), metrics=args.metrics or None,
                                   max_queue_spans=args.max_export_queue, max_backlog_spans=args.max_backlog,
                                   auth=auth, tls=tls)
    except (OSError, ValueError) as exc:
        print(f"mycroft processor serve: {exc}", file=sys.stderr)
        return 2
    service.start()
    warn_if_open("mycroft processor serve", [args.otlp_grpc, args.otlp_http, args.metrics], auth)
    print(json.dumps({"event": "ready", "otlp_grpc": service.grpc_port, "otlp_http": service.http_port,
                      "metrics": service.metrics_port, "export": args.export}), flush=True)
    try:
        if args.stats_file or args.flush_file:
            _serve_for_collector(service, args.stats_file, args.flush_file)
        else:
            wait_for_signal()
    finally:
        service.stop()
        if args.stats_file:
            service.write_stats(args.stats_file, flushed=True)
        print(json.dumps({"event": "stopped", "counters": service.counters.snapshot()}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: mycroft processor serve --otlp-grpc HOST:PORT --otlp-http HOST:PORT "
              "--export ENDPOINT [--export ENDPOINT]...")
        return 0 if argv else 2
    if argv[0] == "serve":
        return _serve(argv[1:])
    print(f"mycroft processor: unknown subcommand {argv[0]!r} (expected: serve)", file=sys.stderr)
    return 2
