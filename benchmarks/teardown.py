"""Teardown with the collector down, slow or black-holing, against exporters off and no Mycroft.

    .venv/bin/python benchmarks/teardown.py [--runs 3] [--world 2] [--slow-s 5] [--protocol grpc|http]
                                            [--modes plain,off,up,down,slow,blackhole,syn_drop] [--json FILE]

Each run starts a real 2-rank gloo job (tests/instrumentation/jobs/teardown.py) as a launcher
would: one process per rank with RANK / WORLD_SIZE / MASTER_* set, under `opentelemetry-instrument`
(plain: without it). Every rank times its own `dist.destroy_process_group()` and prints the wall
time at which its script returned; this harness waits on each process and reads interpreter exit
as the process's end minus that time. Collector behaviours, all real processes and sockets:

- plain: no Mycroft; off: Mycroft with OTEL_TRACES_EXPORTER=none; up: a healthy OTLP receiver;
- down: a port nobody listens on (connection refused);
- slow: an OTLP receiver that answers every request after --slow-s seconds;
- blackhole: a socket that completes TCP handshakes and never reads or answers;
- syn_drop: a listener whose accept queue is full, so the kernel drops every SYN (what a routable
  address that drops SYNs looks like to the client: connect() waits).

Modes run interleaved, --runs rounds; the table gives the median over runs of each rank's
destroy_process_group() and interpreter exit, what each adds to plain, and the ratio to exporters off.
The export timeout is the OpenTelemetry default (OTEL_EXPORTER_OTLP_TIMEOUT 10 s), as users get it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
JOB = REPO / "tests" / "instrumentation" / "jobs" / "teardown.py"
BIN = Path(sys.executable).parent
MODES = ("plain", "off", "up", "down", "slow", "blackhole", "syn_drop")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def collector(mode: str, slow_s: float = 5.0, protocol: str = "grpc") -> Iterator[str | None]:
    """The OTLP endpoint of a collector that behaves as `mode` says (None: no collector involved)."""
    if mode in ("plain", "off"):
        yield None
        return
    if mode == "down":
        yield f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused
        return
    if mode in ("up", "slow"):
        from mycroft.otlp_server import OtlpReceiver

        release = threading.Event()

        def sink(records: list[Any]) -> None:
            if mode == "slow":
                release.wait(slow_s)  # answers after slow_s (the request itself was received)

        grpc_address, http_address = ("127.0.0.1:0", None) if protocol == "grpc" else (None, "127.0.0.1:0")
        receiver = OtlpReceiver(sink, grpc_address, http_address).start()
        port = receiver.grpc_port if protocol == "grpc" else receiver.http_port
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            release.set()
            receiver.stop(0)
        return
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    fillers: list[socket.socket] = []
    if mode == "blackhole":
        listener.listen(128)  # the kernel completes handshakes; nobody ever reads or answers
    elif mode == "syn_drop":
        listener.listen(0)  # an accept queue of one, filled here: the kernel then drops every SYN
        for _ in range(2):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(listener.getsockname())
            fillers.append(filler)
        time.sleep(0.2)
    else:
        raise ValueError(mode)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


@dataclass
class RankTimes:
    rank: int
    destroy_s: float
    exit_s: float  # the script's return -> the process gone
    handlers_s: float  # the script's return -> exit's thread joins and atexit functions done
    returncode: int
    stderr: str = field(repr=False, default="")


def run_job(mode: str, world: int = 2, steps: int = 20, slow_s: float = 5.0, protocol: str = "grpc",
            timeout_s: float = 120.0, extra_env: dict[str, str] | None = None) -> list[RankTimes]:
    """One job under `mode`; each rank's teardown times."""
    with collector(mode, slow_s, protocol) as endpoint:
        env = dict(os.environ)
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                   OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
                   OTEL_TRACES_EXPORTER="none" if mode == "off" else "otlp",
                   OTEL_EXPORTER_OTLP_PROTOCOL="grpc" if protocol == "grpc" else "http/protobuf",
                   OTEL_EXPORTER_OTLP_ENDPOINT=endpoint or "http://127.0.0.1:9")
        env.pop("OTEL_EXPORTER_OTLP_TIMEOUT", None)  # the default (10 s), as users get it
        env.update(extra_env or {})
        prefix = [] if mode == "plain" else [str(BIN / "opentelemetry-instrument")]
        processes = []
        for rank in range(world):
            rank_env = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
            processes.append(subprocess.Popen([*prefix, sys.executable, str(JOB), "--steps", str(steps)],
                                              env=rank_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True, cwd=str(REPO)))
        ended: dict[int, float] = {}
        outputs: dict[int, tuple[str, str]] = {}

        def wait(index: int, process: subprocess.Popen[str]) -> None:
            # the pipes are read while the process runs (a full pipe would block it); its exit is
            # seen when both close and wait() returns
            out, err = process.communicate(timeout=timeout_s)
            ended[index] = time.time()
            outputs[index] = (out, err)

        waiters = [threading.Thread(target=wait, args=(i, p)) for i, p in enumerate(processes)]
        for waiter in waiters:
            waiter.start()
        for waiter in waiters:
            waiter.join(timeout_s + 5)
        for process in processes:
            if process.poll() is None:
                process.kill()
    times = []
    for index, process in enumerate(processes):
        out, err = outputs.get(index, ("", ""))
        line = next((row for row in out.splitlines() if row.startswith("TEARDOWN ")), "")
        if not line:
            raise RuntimeError(f"{mode}: rank {index} printed no TEARDOWN line (rc {process.returncode}):\n"
                               f"{err[-3000:]}")
        report = json.loads(line[len("TEARDOWN "):])
        handlers_done = next((float(row.split()[1]) for row in out.splitlines() if row.startswith("HANDLERS ")),
                             ended[index])
        times.append(RankTimes(report["rank"], report["destroy_s"], ended[index] - report["end"],
                               handlers_done - report["end"], process.returncode, err))
    return times


FIGURES = ("destroy_s", "handlers_s", "exit_s")


def summarise(results: dict[str, list[list[RankTimes]]]) -> dict[str, dict[str, float]]:
    """Per mode: the median (and max) over runs and ranks of each figure, what each adds to plain and to
    exporters off, and the teardown (destroy + exit) as a ratio to exporters off."""
    table: dict[str, dict[str, float]] = {}
    for mode, runs in results.items():
        flat = [rank for run in runs for rank in run]
        row: dict[str, float] = {}
        for figure in FIGURES:
            values = [getattr(r, figure) for r in flat]
            row[figure] = statistics.median(values)
            row[figure.replace("_s", "_max_s")] = max(values)
        table[mode] = row
    for reference in ("plain", "off"):
        if reference not in table:
            continue
        base = table[reference]
        for row in table.values():
            for figure in FIGURES:
                row[f"{figure[:-2]}_added_vs_{reference}_s"] = row[figure] - base[figure]
    if "off" in table:
        base_total = table["off"]["destroy_s"] + table["off"]["exit_s"]
        for row in table.values():
            row["teardown_ratio_vs_off"] = (row["destroy_s"] + row["exit_s"]) / base_total if base_total else math.nan
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slow-s", type=float, default=5.0)
    parser.add_argument("--protocol", choices=("grpc", "http"), default="grpc")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    modes = [mode for mode in args.modes.split(",") if mode]
    results: dict[str, list[list[RankTimes]]] = {mode: [] for mode in modes}
    for index in range(args.runs):  # interleaved: every mode sees the same phases of this machine's load
        for mode in (modes if index % 2 == 0 else list(reversed(modes))):
            results[mode].append(run_job(mode, args.world, args.steps, args.slow_s, args.protocol))
    table = summarise(results)
    print(f"teardown, {args.world} ranks, {args.runs} runs, OTLP/{args.protocol}: seconds, median over runs and "
          f"ranks [max]; + = added to plain (no Mycroft); ratio = (destroy + exit) / exporters off's")
    print(f"{'collector':<10} {'destroy_pg':>16} {'exit handlers':>16} {'exit':>16} {'+destroy':>9} "
          f"{'+handlers':>10} {'+exit':>7} {'ratio':>6}")
    for mode in modes:
        row = table[mode]
        cells = " ".join(f"{row[f]:>7.3f} [{row[f.replace('_s', '_max_s')]:6.3f}]" for f in FIGURES)
        added = [row.get(f"{f[:-2]}_added_vs_plain_s", math.nan) for f in FIGURES]
        print(f"{mode:<10} {cells} {added[0]:>9.3f} {added[1]:>10.3f} {added[2]:>7.3f} "
              f"{row.get('teardown_ratio_vs_off', math.nan):>6.2f}")
    for mode in modes:  # the one line each rank says about what it could not send
        lines = sorted({line.strip() for run in results[mode] for rank in run
                        for line in rank.stderr.splitlines() if "unsent at teardown" in line})
        for line in lines[:2]:
            print(f"  {mode}: {line}")
    document = {"table": table, "runs": {mode: [[vars(r) | {"stderr": ""} for r in run] for run in runs]
                                         for mode, runs in results.items()}}
    if args.json:
        Path(args.json).write_text(json.dumps(document, indent=1))
    print(json.dumps(table))


if __name__ == "__main__":
    main()
