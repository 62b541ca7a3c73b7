"""`mycroft` command line: a thin dispatcher; each component owns its subcommands.

Subcommand modules are imported lazily so `mycroft native path` never pays for torch
or grpc imports it does not need.
"""

from __future__ import annotations

import importlib
import sys

# subcommand -> (module with `main(argv: list[str]) -> int`, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("mycroft.demo", "run the end-to-end demo: traced multi-rank job, injected fault, RCA verdict"),
    "rca": ("mycroft.rca_service.cli", "root cause analysis service: serve | analyze"),
    "inject": ("mycroft.faults.inject", "launch an instrumented job, inject a fault, score the incident"),
    "simulate": ("mycroft.faults.simulate", "a big simulated job over OTLP against the RCA service, one JSON line"),
    "processor": ("mycroft.collector_processor.cli", "standalone OTLP processor service: serve"),
    "collector": ("mycroft.collector_processor.cli_collector", "embedded collector (rotel + processor): run"),
    "native": ("mycroft.native.cli", "NCCL profiler plugin: path | build | dump PID"),
}


def _usage() -> str:
    lines = ["usage: mycroft <command> [args...]", "", "commands:"]
    lines += [f"  {name:<10} {help_text}" for name, (_, help_text) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from mycroft import __version__

        print(__version__)
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"mycroft: unknown command {args[0]!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(args[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
