"""`mycroft collector run`: the embedded collector (the Mycroft processor, hosted by rotel or
standalone) in one command.

Prints one JSON line {"event": "ready", "engine": ...} once it accepts OTLP (and, when rotel
cannot host the processor, one line on stderr saying why the standalone engine runs), then
runs until SIGINT / SIGTERM (or until the engine dies, which exits non-zero).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading

from .cli import add_processor_options, config_from_args
from .collector import DEFAULT_ENGINE, ENGINES, CollectorError, EmbeddedCollector
from .config import COLLECTOR_OTLP_GRPC, COLLECTOR_OTLP_HTTP


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mycroft collector run", description="The Mycroft processor behind "
                                     "the standard OTLP ports: ranks -> this -> backends.")
    parser.add_argument("--otlp-grpc", default=COLLECTOR_OTLP_GRPC, metavar="HOST:PORT",
                        help="OTLP gRPC listen address (default %(default)s)")
    parser.add_argument("--otlp-http", default=COLLECTOR_OTLP_HTTP, metavar="HOST:PORT",
                        help="OTLP HTTP listen address (default %(default)s)")
    parser.add_argument("--export", action="append", required=True, metavar="ENDPOINT",
                        help="OTLP gRPC endpoint (http://host:port): the RCA service, Jaeger, Tempo...; repeat")
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE,
                        help="what hosts the processor: the standalone service, or rotel (where rotel cannot "
                             "host it, the standalone service, said in one line); default %(default)s")
    parser.add_argument("--workdir", default=None, help="pid / log / stats files (default: a temp dir)")
    parser.add_argument("--print-env", action="store_true",
                        help="print rotel's configuration as environment variables and exit")
    add_processor_options(parser)
    args = parser.parse_args(argv)
    if args.print_env:
        collector = EmbeddedCollector(args.export, args.otlp_grpc, args.otlp_http, config_from_args(args))
        if len(args.export) > 1:
            print("mycroft collector run: rotel 0.0.1a15 exports traces to one endpoint; with several --export "
                  "endpoints `mycroft collector run` adds a local tee, which plain rotel cannot", file=sys.stderr)
            return 2
        env = collector.rotel_env()
        print("\n".join(f"{key}={value}" for key, value in env.items()))
        return 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        collector = EmbeddedCollector(args.export, args.otlp_grpc, args.otlp_http, config_from_args(args),
                                      workdir=args.workdir, engine=args.engine)
        collector.start()
    except (CollectorError, ValueError, OSError) as exc:
        print(f"mycroft collector run: {exc}", file=sys.stderr)
        return 2
    notice = collector.notice()
    if notice:
        print(f"mycroft collector run: {notice}", file=sys.stderr, flush=True)
    print(json.dumps({"event": "ready", "engine": collector.engine_used, "otlp_grpc": args.otlp_grpc,
                      "otlp_http": args.otlp_http, "export": args.export, "workdir": str(collector.workdir),
                      "pid": collector.proc.pid if collector.proc else None}), flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    code = 0
    try:
        while not stop.wait(0.5):
            if not collector.running():
                print(f"mycroft collector run: the {collector.describe()} exited unexpectedly:\n"
                      f"{collector.output_tail()}", file=sys.stderr)
                code = 1
                break
    finally:
        collector.stop()
        print(json.dumps({"event": "stopped", **collector.stats()}), flush=True)
    return code


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: mycroft collector run --otlp-grpc HOST:PORT --otlp-http HOST:PORT "
              "--export ENDPOINT [--export ENDPOINT]...")
        return 0 if argv else 2
    if argv[0] == "run":
        return _run(argv[1:])
    print(f"mycroft collector: unknown subcommand {argv[0]!r} (expected: run)", file=sys.stderr)
    return 2
