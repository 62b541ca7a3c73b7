"""`mycroft rca serve | analyze`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from typing import Any

from .analysis.findings import cause_who
from .config import DEFAULT_PHASES, AnalysisConfig, Phase

_DEFAULTS = AnalysisConfig()


def _config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hang-min", type=float, default=_DEFAULTS.hang_min_s,
                        help="floor of the adaptive hang threshold, seconds (default %(default)s)")
    parser.add_argument("--resolve-after", type=float, default=_DEFAULTS.resolve_after_s,
                        help="seconds a condition must stay clear before its incident resolves")
    parser.add_argument("--job-ttl", type=float, default=_DEFAULTS.job_ttl_s,
                        help="forget a job silent this long, seconds")
    parser.add_argument("--pause-budget", type=float, default=_DEFAULTS.pause_budget_s,
                        help="any rank outside communication for less than this is a normal pause (info), "
                        "seconds; 0: only expected phases and learned pauses are (default %(default)s)")
    parser.add_argument("--phase", action="append", metavar="NAME=REGEX:BUDGET_S",
                        help="an expected phase: a regular expression over the holder's stack and its budget; "
                        "replaces the defaults (" + ", ".join(f"{p.name} {p.budget_s:g}s" for p in DEFAULT_PHASES)
                        + "); repeat for more; --phase none for no phases")


def parse_phase(text: str) -> Phase:
    """NAME=REGEX:BUDGET_S -> Phase (the budget after the last colon)."""
    name, sep, rest = text.partition("=")
    pattern, colon, budget = rest.rpartition(":")
    if not sep or not colon or not name.strip() or not pattern:
        raise ValueError(f"--phase {text!r}: expected NAME=REGEX:BUDGET_S")
    try:
        re.compile(pattern)
        seconds = float(budget)
    except (re.error, ValueError) as exc:
        raise ValueError(f"--phase {text!r}: {exc}") from None
    if seconds <= 0:
        raise ValueError(f"--phase {text!r}: the budget must be > 0")
    return Phase(name.strip(), pattern, seconds)


def _config(args: argparse.Namespace) -> AnalysisConfig:
    for name in ("hang_min", "resolve_after", "job_ttl"):
        value = getattr(args, name)
        if value is None or value <= 0:
            raise SystemExit(f"mycroft rca: --{name.replace('_', '-')} must be > 0")
    if args.pause_budget < 0:
        raise SystemExit("mycroft rca: --pause-budget must be >= 0")
    phases = DEFAULT_PHASES
    if args.phase:
        try:
            phases = tuple(parse_phase(p) for p in args.phase if p.strip().lower() != "none")
        except ValueError as exc:
            raise SystemExit(f"mycroft rca: {exc}") from None
    return dataclasses.replace(AnalysisConfig(), hang_min_s=args.hang_min, resolve_after_s=args.resolve_after,
                               job_ttl_s=args.job_ttl, pause_budget_s=args.pause_budget, phases=phases)


def _serve(args: argparse.Namespace) -> int:
    from mycroft.security_cli import security_options

    from .incidents.action_policy import PolicyError, load_policy
    from .service import RcaService, ServiceOptions, raise_fd_limit, tune_gc

    tune_gc()
    raise_fd_limit()
    auth, tls = security_options(args, "mycroft rca serve")
    policy = None
    if args.actions:
        try:
            policy = load_policy(args.actions)
        except PolicyError as exc:
            print(f"mycroft rca serve: {exc}", file=sys.stderr)
            return 1
    options = ServiceOptions(
        otlp_grpc=args.otlp_grpc, otlp_http=args.otlp_http, http=args.http, db=args.db,
        webhooks=args.webhook or [], webhook_secret=args.webhook_secret or os.environ.get("MYCROFT_WEBHOOK_SECRET"),
        alertmanager=args.alertmanager, forward=args.forward, external_url=args.external_url or "",
        tick_s=args.tick, analysis=_config(args), alert_min_severity=args.alert_min_severity, auth=auth,
        tls=tls, actions=policy)
    try:
        service = RcaService(options).start()
    except (OSError, ValueError) as exc:
        print(f"mycroft rca serve: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"otlp_grpc": service.receiver.grpc_port, "otlp_http": service.receiver.http_port,
                      "http": service.api.port, "db": args.db}), flush=True)
    stop.wait()
    service.stop()
    return 0


def _load(args: argparse.Namespace) -> list[Any]:
    from .postmortem.flight_recorder import load_dumps
    from .postmortem.loaders import load_jaeger, load_otlp_file, load_tempo

    records: list[Any] = []
    for path in args.otlp_json or []:
        records.extend(load_otlp_file(path))
    end = args.end if args.end is not None else time.time()
    start = args.start if args.start is not None else end - args.lookback
    if args.jaeger:
        if not args.service:
            raise SystemExit("mycroft rca analyze: --jaeger needs --service (the job's service.name)")
        records.extend(_said("Jaeger", load_jaeger(args.jaeger, args.service, start, end, args.limit)))
    if args.tempo:
        if not args.job:
            raise SystemExit("mycroft rca analyze: --tempo needs --job (mycroft.job.id)")
        records.extend(_said("Tempo", load_tempo(args.tempo, args.job, start, end, args.limit)))
    if args.flight_recorder:
        at_ns = int(args.at * 1e9) if args.at is not None else None
        records.extend(load_dumps(args.flight_recorder, job=args.job or "flight-recorder", dumped_at_ns=at_ns,
                                  allow_pickle=args.allow_pickle))
    return records


def _said(backend: str, pulled: Any) -> list[Any]:
    """A backend's spans; what it could not give goes to stderr (the analysis runs on the rest)."""
    for note in pulled.notes:
        print(f"mycroft rca analyze: {note}", file=sys.stderr)
    if pulled.missing:
        print(f"mycroft rca analyze: {backend} no longer has {len(pulled.missing)} of the {pulled.traces} traces "
              f"it found (404), e.g. {pulled.missing[0]}; analysed without them", file=sys.stderr)
    if pulled.failed:
        trace_id, why = next(iter(pulled.failed.items()))
        print(f"mycroft rca analyze: {backend} could not send {len(pulled.failed)} of the {pulled.traces} traces "
              f"(e.g. {trace_id}: {why}); analysed without them", file=sys.stderr)
    return list(pulled.records)


def _analyze(args: argparse.Namespace) -> int:
    from .postmortem.loaders import LoadError
    from .postmortem.offline import replay

    try:
        records = _load(args)
    except LoadError as exc:
        print(f"mycroft rca analyze: {exc}", file=sys.stderr)
        return 1
    if not records:
        print("mycroft rca analyze: no spans found in the given sources", file=sys.stderr)
        return 1
    result = replay(records, _config(args), tick_s=args.tick, until=args.at)
    incidents = [inc.to_dict() for inc in result.incidents]
    if args.export:
        try:
            from .postmortem import frames
        except ImportError:
            print("mycroft rca analyze: --export needs pandas: pip install 'mycroft-tracing[analysis]'",
                  file=sys.stderr)
            return 1
        for path in frames.from_records(records).export(args.export):
            print(f"wrote {path}", file=sys.stderr)
    if args.html:
        from .web.pages import report_page

        with open(args.html, "w", encoding="utf-8") as f:
            f.write(report_page(incidents))
    if args.format == "json":
        print(json.dumps({"spans": len(records), "jobs": sorted(result.engine.jobs), "incidents": incidents},
                         indent=2, default=str))
    else:
        print(f"{len(records)} spans, jobs: {', '.join(sorted(result.engine.jobs)) or '-'}")
        if not incidents:
            print("no incidents: the recorded jobs look healthy")
        first = next((i for i in incidents if not i.get("consequence_of") and i["severity"] != "info"), None)
        if first is not None and first["root_causes"]:
            top = first["root_causes"][0]
            who = cause_who(top)
            print(f"first root cause: {who} ({top['kind']}) in the {first['kind']} detected {first['detected_at']}")
        for inc in incidents:
            also = f", a consequence of {inc['consequence_of']}" if inc.get("consequence_of") else ""
            print(f"\n[{inc['status']}] {inc['kind']} ({inc['severity']}{also}) in job {inc['job']} "
                  f"detected {inc['detected_at']}")
            print(f"  {inc['summary']}")
            for later in inc.get("consequences", [])[:8]:
                print(f"  then (consequence) at {later['at']}: rank {later['rank']} {later['kind']}")
            for rc in inc["root_causes"]:
                print(f"  - {cause_who(rc)}: {rc['kind']}: {rc['evidence'].get('text', '')}")
            for chain in inc["wait_for_graph"].get("chains", [])[:4]:
                print(f"    chain: {chain}")
    return 2 if any(inc["status"] == "firing" for inc in incidents) else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mycroft rca", description="Mycroft root cause analysis service")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the live service")
    serve.add_argument("--otlp-grpc", default="0.0.0.0:4317", help="OTLP/gRPC listen HOST:PORT ('' to disable)")
    serve.add_argument("--otlp-http", default="0.0.0.0:4318", help="OTLP/HTTP listen HOST:PORT ('' to disable)")
    serve.add_argument("--http", default="0.0.0.0:8080", help="API listen HOST:PORT")
    serve.add_argument("--db", default="mycroft-rca.db", help="SQLite incident database")
    serve.add_argument("--webhook", action="append", metavar="URL", help="POST Alertmanager-format alerts here")
    serve.add_argument("--webhook-secret", help="HMAC-SHA256 secret (or MYCROFT_WEBHOOK_SECRET)")
    serve.add_argument("--alertmanager", metavar="URL", help="push alerts to this Alertmanager's /api/v2/alerts")
    serve.add_argument("--forward", metavar="OTLP_ENDPOINT",
                       help="tee received spans to http(s)://host:port (OTLP/HTTP) or host:port (OTLP/gRPC)")
    serve.add_argument("--external-url", help="this service's URL, for links in alerts")
    serve.add_argument("--alert-min-severity", choices=("info", "warning", "critical"), default="critical",
                       help="the least severity sent to webhooks / Alertmanager (default %(default)s: only what "
                       "should page someone; every incident is in the API either way)")
    serve.add_argument("--actions", metavar="FILE",
                       help="action policy (YAML): what to do about an incident (abort the job, drain the node, "
                       "run a command); mode observe (the default) records what would be done (docs/actions.md)")
    serve.add_argument("--tick", type=float, default=0.2, help="analysis period, seconds")
    serve.add_argument("-v", "--verbose", action="store_true")
    from mycroft.security_cli import security_args

    security_args(serve)
    _config_args(serve)
    analyze = sub.add_parser("analyze", help="post-mortem: run the same analysis on recorded spans / dumps")
    analyze.add_argument("--otlp-json", action="append", metavar="FILE", help="OTLP JSON file(s)")
    analyze.add_argument("--jaeger", metavar="URL", help="Jaeger query base URL (api_v3)")
    analyze.add_argument("--tempo", metavar="URL", help="Tempo base URL (HTTP API)")
    analyze.add_argument("--service", help="service.name to pull from Jaeger (the job id by default)")
    analyze.add_argument("--job", help="mycroft.job.id (Tempo query; name for Flight Recorder dumps)")
    analyze.add_argument("--flight-recorder", nargs="+", metavar="DUMP",
                         help="Flight Recorder dumps, one per rank (rank = trailing number of the file name)")
    analyze.add_argument("--allow-pickle", action="store_true", help="read pickled Flight Recorder dumps")
    analyze.add_argument("--start", type=float, help="window start, unix seconds")
    analyze.add_argument("--end", type=float, help="window end, unix seconds")
    analyze.add_argument("--lookback", type=float, default=3600.0, help="window length when --start is absent")
    analyze.add_argument("--limit", type=int, default=1000, help="max traces to pull")
    analyze.add_argument("--at", type=float, help="analyse as of this unix time (default: the last span)")
    analyze.add_argument("--tick", type=float, default=0.25, help="replay step, seconds of span time")
    analyze.add_argument("--format", choices=("text", "json"), default="text")
    analyze.add_argument("--export", metavar="DIR",
                         help="also write the recording as tables (collectives, ranks, heartbeats, groups: CSV) "
                         "into DIR; needs pandas (the 'analysis' extra)")
    analyze.add_argument("--html", metavar="FILE",
                         help="also write the incident page of the first root cause (graph, timeline, evidence), "
                         "with the other incidents listed, to FILE")
    _config_args(analyze)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "serve":
        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        return _serve(args)
    if args.jaeger and not args.service and args.job:
        args.service = args.job
    return _analyze(args)


if __name__ == "__main__":
    sys.exit(main())
