"""Benchmark of the native NCCL profiler plugin (no GPU: driven through its exported ABI).

    .venv/bin/python benchmarks/native_bench.py [--seconds 3] [--out result.json] [--baseline-rev REV]

Reports
- the median cost of a start/record/stop triple through the ncclProfiler_v6 table, for
  ProxyStep (the event NCCL issues per step per flow: the hot one), ProxyOp and Coll;
  the same with a second plugin chained (MYCROFT_NCCL_PROFILER_CHAIN = the test's counting
  plugin, native/test/chained.c: an atomic count and a handle per event), and the difference;
  with valgrind installed, the same triples in instructions (callgrind over the table's
  start/record/stop functions: deterministic, unlike wall time on a shared machine);
- the hot-path clock (raw counter ticks, converted by the publisher) against
  CLOCK_MONOTONIC over 2 s: largest difference, recalibrations, never backwards;
- with --baseline-rev (e.g. the commit before a hot-path change), the same figures for
  the plugin built from that revision, measured in the same run, and the ratios;
- events/s a single NCCL-like thread issues while the ring is drained, with a C reader
  and with the Python NativeReader, plus what was dropped (ring full / pool full);
- bytes recorded per collective (an 8-channel ring all-reduce: 1 coll + 16 flows + 8 kernel
  channels, 128-byte records; snapshots add more only for collectives slower than the
  snapshot interval).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from mycroft.instrumentation.native_reader import NativeReader
from mycroft.native import BUILD_DIR, PACKAGE_DIR, library_path
from mycroft.native.ring import RECORD_SIZE

DRIVER = BUILD_DIR / "driver"


def _json_line(text: str) -> dict[str, Any]:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def hot_path(env: dict[str, str], lib: Path | None = None) -> dict[str, Any]:
    lib = lib or library_path()
    runs = [_json_line(subprocess.run([str(DRIVER), "bench", str(lib)], env=env, check=True,
                                      capture_output=True, text=True).stdout) for _ in range(3)]
    return {key: sorted(run[key] for run in runs)[1] for key in runs[0]}  # median of 3 medians


def _table_functions(lib: Path) -> list[str]:
    """The v6 table's start / stop / record functions in `lib` (their names changed with v7: a
    toggle on a function the table's entry calls would switch collection off inside it)."""
    names = set(subprocess.run(["nm", str(lib)], capture_output=True, text=True, check=True).stdout.split())
    start = "start_v6" if "start_v6" in names else "start_v5"
    stop = "stop_any" if "stop_any" in names else "core_stop"
    return [start, stop, "record_any"]


def callgrind_instructions(env: dict[str, str], lib: Path | None = None, n: int = 20000) -> dict[str, Any] | None:
    """Instructions per ProxyStep, ProxyOp and Coll start/record/stop triple (None without valgrind);
    with MYCROFT_NCCL_PROFILER_CHAIN in env, the chained plugin's work is counted in."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    lib = lib or library_path()
    toggles = [f"--toggle-collect={name}" for name in _table_functions(lib)]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("step", "op", "coll"):
            proc = subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={tmp}/cg.out",
                                   "--collect-atstart=no", *toggles, str(DRIVER), "calls", str(lib), str(n), kind],
                                  env=env, capture_output=True, text=True, check=True)
            collected = re.search(r"Collected : ([0-9]+)", proc.stderr)
            assert collected, proc.stderr[-2000:]
            out[{"step": "proxy_step_triple", "op": "proxy_op_triple", "coll": "coll_triple"}[kind]] = \
                round(int(collected.group(1)) / n, 1)
    return out


def clock_check(env: dict[str, str], seconds: float = 2.0) -> dict[str, Any]:
    out = subprocess.run([str(DRIVER), "clock", str(library_path()), str(seconds)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return _json_line(out)


def build_revision(rev: str, into: Path) -> Path:
    """The plugin as it was at git revision `rev`, built with the Makefile's flags."""
    src = into / "src"
    src.mkdir(parents=True)
    for name in ("plugin.c", "mycroft_ring.h", "nccl_profiler_abi.h"):
        text = subprocess.run(["git", "-C", str(PACKAGE_DIR), "show", f"{rev}:native/src/{name}"], check=True,
                              capture_output=True, text=True).stdout
        (src / name).write_text(text)
    lib = into / "libmycroft_nccl_profiler.so"
    subprocess.run(["cc", "-std=c11", "-g", "-Wall", "-fPIC", "-fvisibility=hidden", "-O2", "-shared", "-o", str(lib),
                    str(src / "plugin.c"), "-pthread"], check=True)
    return lib


def flood_c_reader(seconds: float, env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run([str(DRIVER), "flood", str(library_path()), str(seconds), "internal"], env=env,
                         check=True, capture_output=True, text=True).stdout
    return _json_line(out)


def flood_python_reader(seconds: float, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.Popen([str(DRIVER), "flood", str(library_path()), str(seconds), "external"], env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    ready = proc.stdout.readline()
    assert ready.startswith("READY"), ready
    reader = NativeReader.open_for_pid(proc.pid, "bench", 0, ring_dir=env["MYCROFT_NATIVE_RING_DIR"])
    assert reader is not None
    stop = threading.Event()
    spans = 0
    busy = 0.0

    def drain() -> None:
        nonlocal spans, busy
        while not stop.is_set():
            t0 = time.thread_time()  # CPU time: the machine may be shared
            spans += len(reader.drain())
            busy += time.thread_time() - t0
            time.sleep(0.01)

    thread = threading.Thread(target=drain)
    thread.start()
    proc.stdin.write("go\n")
    proc.stdin.flush()
    finished = proc.stdout.readline()
    assert finished.startswith("FINISHED"), finished
    stop.set()
    thread.join()
    spans += len(reader.drain())
    proc.stdin.write("go\n")
    proc.stdin.flush()
    result = _json_line(proc.stdout.read())
    proc.wait()
    reader.close()
    result["python_records_read"] = reader.records_read
    result["python_spans"] = spans
    result["python_records_per_cpu_s"] = round(reader.records_read / busy) if busy else None
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--baseline-rev", default=None,
                        help="git revision whose plugin is measured beside this one (e.g. the commit before a change)")
    args = parser.parse_args(argv)
    subprocess.run(["make", "-s", "-C", str(PACKAGE_DIR), "all", "driver", "chain"], check=True)
    with tempfile.TemporaryDirectory() as ring_dir:
        env = {**os.environ, "MYCROFT_NATIVE_RING_DIR": ring_dir}
        big = {**env, "MYCROFT_NATIVE_POOL_COLLS": "65536", "MYCROFT_NATIVE_POOL_FLOWS": "262144",
               "MYCROFT_NATIVE_POOL_KCHS": "131072", "MYCROFT_NATIVE_RING_RECORDS": "1048576"}
        alone = hot_path(env)
        chained = hot_path({**env, "MYCROFT_NCCL_PROFILER_CHAIN": str(BUILD_DIR / "libchain_counter.so")})
        result: dict[str, Any] = {
            "hot_path_median_ns": alone,
            "hot_path_median_ns_chained": chained,
            "chaining_added_ns": {key: round(chained[key] - alone[key], 1) for key in alone},
            "hot_path_instructions": callgrind_instructions(env),
            "hot_path_instructions_chained": callgrind_instructions(
                {**env, "MYCROFT_NCCL_PROFILER_CHAIN": str(BUILD_DIR / "libchain_counter.so")}),
            "clock": clock_check(env),
            "flood_c_reader_default_pools": flood_c_reader(args.seconds, env),
            "flood_c_reader_big_pools": flood_c_reader(args.seconds, big),
            "flood_python_reader_default_pools": flood_python_reader(args.seconds, env),
            "bytes_per_collective_8ch_ring_allreduce_completion_only": (1 + 16 + 8) * RECORD_SIZE,
            "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        }
        if args.baseline_rev:
            with tempfile.TemporaryDirectory() as tmp:
                lib = build_revision(args.baseline_rev, Path(tmp))
                base = {"rev": args.baseline_rev, "hot_path_median_ns": hot_path(env, lib),
                        "hot_path_instructions": callgrind_instructions(env, lib)}
                now = hot_path(env)  # again, right after the baseline: the ratio is taken in one stretch
            base["ratio_ns_now_over_baseline"] = {key: round(now[key] / base["hot_path_median_ns"][key], 2)
                                                  for key in now}
            result["baseline"] = base
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
