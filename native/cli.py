"""`mycroft native path | build | dump PID | clean`: the plugin's command line."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from mycroft.native import build, installed_plugin, library_path
from mycroft.native.ring import FILE_PREFIX, Ring, RingError, fallback_dir, find_ring, pid_alive, ring_dir


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mycroft native", description="NCCL profiler plugin")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("path", help="print the absolute path to set as NCCL_PROFILER_PLUGIN")
    sub.add_parser("build", help="build the plugin (make -C native)")
    dump = sub.add_parser("dump", help="print a process's ring (live or left behind) as JSON lines")
    dump.add_argument("pid", type=int)
    dump.add_argument("--ring-dir", default=None, help="default: $MYCROFT_NATIVE_RING_DIR or /dev/shm")
    dump.add_argument("--header", action="store_true", help="first print the ring's counters")
    clean = sub.add_parser("clean", help="remove rings left behind by processes that no longer exist "
                                          "(in the ring dir and the fallback dir)")
    clean.add_argument("--ring-dir", default=None)
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "path":
        found = installed_plugin()
        print(found or library_path())
        if found is None:
            print("mycroft native: not built yet; run `mycroft native build`", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "build":
        try:
            print(build())
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            print(f"mycroft native build: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.cmd == "dump":
        path = find_ring(args.pid, args.ring_dir)
        try:
            ring = Ring(path, writable=False)
        except FileNotFoundError:
            print(f"mycroft native dump: no ring for pid {args.pid} at {path}", file=sys.stderr)
            return 1
        except RingError as exc:
            print(f"mycroft native dump: {exc}", file=sys.stderr)
            return 1
        with ring:
            if args.header:
                print(json.dumps({"kind": "header", "pid": ring.pid, "alive": pid_alive(ring.pid),
                                  **ring.counters()}))
            for record in ring.records():
                print(json.dumps(record.to_json()))
        return 0
    if args.cmd == "clean":
        removed = 0
        dirs = dict.fromkeys([ring_dir(args.ring_dir), fallback_dir()])  # the same dir once
        for path in (p for d in dirs for p in d.glob(f"{FILE_PREFIX}*")):
            suffix = path.name[len(FILE_PREFIX):]
            if suffix.isdigit() and not pid_alive(int(suffix)):
                path.unlink(missing_ok=True)
                removed += 1
        print(f"removed {removed} ring(s)")
        return 0
    return 2
