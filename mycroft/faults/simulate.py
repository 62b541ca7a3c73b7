"""`mycroft simulate`: a big simulated job (bigjob.py) against a real `mycroft rca serve` over OTLP/gRPC.

    mycroft simulate --ranks 16384 --tp 8 --ops 10 --op-spans 0 --fault block --seconds 20
    mycroft simulate --ranks 256 --fault all,none --runs 2 --seed 7     # every kind, one service

Starts the RCA service as its own process (or uses --endpoint/--api of a running one),
runs sender processes that each own a slice of the ranks and send one heartbeat per rank
per interval (plus op spans when --op-spans > 0: the share of collectives kept by
trace-id head sampling), injects the fault (simfaults.py: 7 process and 7 NCCL kinds;
several runs are several jobs on the same service and senders), and prints one JSON line
per run: verdict, right or wrong, detection / root-cause latency, the service's CPU, RSS
and analysis pass times, spans offered / applied / dropped, bytes per rank per second.
Progress goes to stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any

EXPORT = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sender(port: int, params: dict[str, Any], ranks: list[int], offset: float, out: Any, ready: Any,
            clock: Any) -> None:
    """One sender process: its ranks' heartbeats (and sampled op spans) of every run, every interval."""
    import grpc

    from mycroft.faults.bigjob import BigJob, Layout
    from mycroft.faults.simfaults import FaultPlan

    jobs = [BigJob(run["job"], Layout(params["world"], params["tp"], params["pp"]), params["ops"],
                   params["interval"], fault=FaultPlan(**run["plan"])) for run in params["runs"]]
    channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 64 << 20)],
                                    compression=grpc.Compression.Gzip if params.get("gzip") else None)
    export = channel.unary_unary(EXPORT, request_serializer=None, response_deserializer=None)
    stats = {"hb": 0, "hb_bytes": 0, "hb_refused": 0, "hb_lost": 0, "ops": 0, "op_bytes": 0, "op_refused": 0,
             "build_s": 0.0, "late_ticks": 0, "op_shed_answers": 0}
    batch = params["batch"]
    for job in jobs:  # templates built before the clock starts
        for rank in ranks:
            job.prepare(rank)
    ready.put(len(ranks))
    while not clock[0]:
        time.sleep(0.05)
    start, interval = clock[0], params["interval"]
    end = clock[1]
    for i, job in enumerate(jobs):
        job.fault_at = clock[2 + i]
    # every tick's requests are built before the clock starts (the situations are known in
    # advance), so while the run lasts this process only sends: the service gets the CPU
    built = time.perf_counter()
    plan: list[list[tuple[str, bytes, int]]] = []
    k = 0
    while start + k * interval < end:
        nominal = start + k * interval
        now = nominal + offset
        requests: list[tuple[str, bytes, int]] = []
        for job in jobs:
            job.tick(nominal)
            for i in range(0, len(ranks), batch):
                payload, count = job.heartbeat_request(ranks[i:i + batch], now)
                if count:
                    requests.append(("hb", payload, count))
            if params["op_keep"] > 0:
                # requests of about `batch` op spans, as a collector's batch processor packs them (at
                # 1% of 10 ops/s a request of 4096 ranks' spans holds ~410: it was batch / 8 ranks'
                # spans once, 8-80x more requests than a gateway sends, each ~1.8 ms of gRPC server)
                per_rank = params["ops"] * params["interval"] * params["op_keep"]
                step = max(1, min(len(ranks), int(batch / per_rank) if per_rank > 0 else len(ranks)))
                for i in range(0, len(ranks), step):
                    payload, count = job.op_span_bytes(ranks[i:i + step], now, params["op_keep"])
                    if count:
                        requests.append(("op", payload, count))
        plan.append(requests)
        k += 1
    stats["build_s"] = time.perf_counter() - built
    pending: list[tuple[str, int, Any, bytes]] = []
    for k, requests in enumerate(plan):
        wait = start + k * interval + offset - time.time()
        if wait > 0:
            time.sleep(wait)
        elif wait < -interval:  # fell a tick behind (or built too slowly): skip it, as a rank would
            stats["late_ticks"] += 1
            continue
        for kind, payload, count in requests:
            # asynchronous, like thousands of independent ranks: a slow service does not slow the
            # offered load down; it queues, sheds or refuses (bounded in flight per sender)
            while len(pending) >= 64:
                _settle(pending.pop(0), stats, export)
            stats["hb" if kind == "hb" else "ops"] += count
            stats["hb_bytes" if kind == "hb" else "op_bytes"] += len(payload)
            pending.append((kind, count, export.future(payload, timeout=10), payload))
        while pending and pending[0][2].done():
            _settle(pending.pop(0), stats, export)
    for item in pending:
        _settle(item, stats, export)
    channel.close()
    out.put(stats)


def _settle(item: tuple[str, int, Any, bytes], stats: dict[str, Any], export: Any) -> None:
    """Wait for one export. A refused heartbeat request is retried twice with backoff, as OTLP
    exporters retry RESOURCE_EXHAUSTED; refused op spans are lost."""
    kind, count, future, payload = item
    try:
        answer = future.result()
        if answer:  # a partial success: the service shed this request's op spans
            stats["op_shed_answers"] += 1
        return
    except Exception:
        if kind != "hb":
            stats["op_refused"] += count
            return
    stats["hb_refused"] += 1
    for attempt in range(2):
        time.sleep(0.1 * (attempt + 1))
        try:
            export(payload, timeout=10)
            return
        except Exception:
            stats["hb_refused"] += 1
    stats["hb_lost"] += count


def _get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return bytes(response.read())


def _metrics(api: str) -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        text = _get(api + "/metrics").decode()
    except Exception:
        return out
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, _, value = line.rpartition(" ")
        try:
            out[name] = out.get(name, 0.0) + float(value)
        except ValueError:
            continue
    return out


def _metric(values: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in values.items() if k == prefix or k.startswith(prefix + "{"))


def _proc(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MB) of a process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        with open(f"/proc/{pid}/status") as f:
            rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
        return cpu, rss
    except (OSError, StopIteration, IndexError, ValueError):
        return 0.0, 0.0


def fault_list(spec: str) -> list[str]:
    """--fault: one kind, a comma list, or a set: all | process | nccl."""
    from mycroft.faults.simfaults import FAULTS, NCCL_FAULTS, PROCESS_FAULTS

    sets = {"all": FAULTS, "process": PROCESS_FAULTS, "nccl": NCCL_FAULTS}
    out: list[str] = []
    for part in spec.split(","):
        part = part.strip()
        out.extend(sets.get(part, (part,)))
    for kind in out:
        if kind not in FAULTS and kind != "none":
            raise SystemExit(f"unknown fault {kind!r}; known: {', '.join(FAULTS)}, none, all, process, nccl")
    return out


def check_ring(faults: list[str], dp: int) -> None:
    """The NCCL faults are modelled on the data-parallel ring through the faulty rank (its flows,
    its neighbours): a ring of fewer than 3 ranks has no neighbour on each side to tell it apart."""
    from mycroft.faults.simfaults import NCCL_FAULTS

    nccl = [kind for kind in faults if kind in NCCL_FAULTS]
    if nccl and dp < 3:
        raise SystemExit(f"{', '.join(nccl)}: the NCCL faults run on a data-parallel ring of at least 3 ranks; "
                         f"--ranks / (--tp x --pp) is {dp} (use --fault process, or more ranks)")


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Start the service (unless --endpoint), run the senders, watch the service; one result per run."""
    procs: list[Any] = []
    service: list[subprocess.Popen[bytes]] = []
    tmp = tempfile.mkdtemp(prefix="mycroft-sim-")
    try:
        return _run(args, procs, service, tmp)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for s in service:
            if s.poll() is None:
                s.terminate()
                try:
                    s.wait(10)
                except subprocess.TimeoutExpired:
                    s.kill()
        shutil.rmtree(tmp, ignore_errors=True)


def _plans(args: argparse.Namespace) -> list[dict[str, Any]]:
    """One run per (fault, repetition): its job id, fault plan (rank, magnitude) and onset delay."""
    import random

    from mycroft.faults.simfaults import plan

    runs = []
    stamp = f"{os.getpid()}-{int(time.time())}"
    seen: dict[str, int] = {}
    for kind in fault_list(args.fault):
        for _ in range(args.runs):
            i = seen[kind] = seen.get(kind, -1) + 1  # a kind listed twice gets its own job and seed
            seed = args.seed + 7919 * i + sum(map(ord, kind))
            fp = plan(kind, args.ranks, args.tp, seed, args.fault_rank, args.pp)
            if kind == "none":
                fp = plan("block", args.ranks, args.tp, seed, args.fault_rank, args.pp)
            delay = random.Random(seed).uniform(0.0, args.onset_spread) * args.interval
            runs.append({"job": f"sim-{kind}-{args.ranks}-{i}-{stamp}", "kind": kind, "seed": seed,
                         "plan": {**fp.as_dict(), "kind": kind}, "delay": delay})
    return runs


def _run(args: argparse.Namespace, procs: list[Any], started: list[subprocess.Popen[bytes]],
         tmp: str) -> list[dict[str, Any]]:
    from mycroft.faults.simfaults import EXPECTED, score

    runs = _plans(args)
    service: subprocess.Popen[bytes] | None = None
    if args.endpoint:
        grpc_port = int(args.endpoint.rsplit(":", 1)[1])
        api = args.api.rstrip("/")
    else:
        grpc_port, http_port = _free_port(), _free_port()
        api = f"http://127.0.0.1:{http_port}"
        cmd = [args.service_python or sys.executable, "-m", "mycroft.cli", "rca", "serve",
               "--otlp-grpc", f"127.0.0.1:{grpc_port}", "--otlp-http", "", "--http", f"127.0.0.1:{http_port}",
               "--db", os.path.join(tmp, "rca.db")]
        with open(os.path.join(tmp, "rca.log"), "wb") as log_file:  # the child keeps its own descriptor
            service = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file)
        started.append(service)
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                _get(api + "/healthz", 1.0)
                break
            except Exception:
                time.sleep(0.2)
    params = {"runs": [{"job": r["job"], "plan": r["plan"]} for r in runs], "world": args.ranks, "tp": args.tp,
              "pp": args.pp, "ops": args.ops, "interval": args.interval, "batch": args.batch,
              "op_keep": args.op_spans, "gzip": args.compression == "gzip"}
    ranks = list(range(args.ranks))
    n = max(1, args.senders)
    ctx = mp.get_context("spawn")
    queue: Any = ctx.Queue()
    ready: Any = ctx.Queue()
    clock: Any = ctx.Array("d", 2 + len(runs))  # start, end, each run's onset: set once the senders are ready
    procs.extend(ctx.Process(target=_sender, args=(grpc_port, params, ranks[i::n], args.interval * i / n, queue,
                                                   ready, clock)) for i in range(n))
    for p in procs:
        p.start()
    for _ in procs:
        ready.get(timeout=600)
    load = args.ranks * len(runs) * args.seconds * (1 + args.ops * min(1.0, args.op_spans)) / n
    start = time.time() + (args.prebuild_s if args.prebuild_s >= 0 else 5.0 + 40e-6 * load)
    onsets = [start + args.warmup * args.interval + r["delay"] if r["kind"] != "none" else 0.0 for r in runs]
    end = start + args.seconds
    for i, at in enumerate(onsets):
        clock[2 + i] = at
    clock[1] = end
    clock[0] = start
    pid = service.pid if service is not None else 0
    samples: list[dict[str, float]] = []
    by_job: dict[str, dict[str, dict[str, Any]]] = {r["job"]: {} for r in runs}
    cpu0 = (0.0, 0.0)
    rss_max = 0.0
    tty = sys.stderr.isatty()
    while time.time() < end + args.tail_s:
        time.sleep(0.25)
        now = time.time()
        if now < start:
            continue
        if pid:
            cpu, rss = _proc(pid)
            rss_max = max(rss_max, rss)
            if not cpu0[1] and now >= start + args.warmup_cpu_s:
                cpu0 = (cpu, now)
        if len(samples) < 1 or now - samples[-1]["at"] >= 1.0:
            m = _metrics(api)
            m["at"] = now
            m["cpu"] = _proc(pid)[0] if pid else 0.0
            samples.append(m)
            if tty:
                seen = sum(1 for incs in by_job.values() if incs)
                print(f"\r[simulate] {now - start:5.1f}/{args.seconds:g}s  {len(runs)} run(s), {seen} with an "
                      f"incident  applied {int(_metric(m, 'mycroft_rca_spans_applied_total'))} spans",
                      end="", file=sys.stderr, flush=True)
        try:
            listed = json.loads(_get(f"{api}/api/v1/incidents?limit={max(50, 8 * len(runs))}", 5.0))
        except Exception:
            listed = []
        for inc in listed:
            incidents = by_job.get(str(inc.get("job", "")).split("#")[0])
            if incidents is None:
                continue
            incidents.setdefault(inc["id"], {"kind": inc["kind"], "detected": inc["detected_at_unix"],
                                             "severity": inc["severity"], "seen_at": now})
            record = incidents[inc["id"]]
            record["kind"] = inc["kind"]
            record["severity"] = inc["severity"]
            record["root_causes"] = [(c.get("kind"), c.get("rank")) for c in inc.get("root_causes", [])][:16]
            record["root_cause_at"] = inc.get("root_cause_at_unix")
            record["n_root_causes"] = len(inc.get("root_causes", []))
    if tty:
        print(file=sys.stderr)
    cpu1 = _proc(pid) if pid else (0.0, 0.0)
    cpu_window = (time.time(), cpu1[0])
    results = [queue.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    total = {key: sum(r[key] for r in results) for key in results[0]}
    last = samples[-1] if samples else {}
    passes = [s.get("mycroft_rca_analysis_seconds", 0.0) for s in samples if s.get("at", 0) >= start]
    queued = [s.get("mycroft_rca_queued_spans", 0.0) for s in samples]
    duration = end - start
    window = [x for x in samples if x.get("at", 0) >= start + args.warmup_cpu_s]
    applied_in_window = (_metric(window[-1], "mycroft_rca_spans_applied_total")
                         - _metric(window[0], "mycroft_rca_spans_applied_total")) if len(window) >= 2 else 0.0
    cpu_in_window = window[-1]["cpu"] - window[0]["cpu"] if len(window) >= 2 else 0.0
    shared: dict[str, Any] = {
        "ranks": args.ranks, "tp": args.tp, "ops_per_rank_s": args.ops, "op_spans_kept": args.op_spans,
        "interval_s": args.interval, "concurrent_runs": len(runs),
        "offered_spans_s": round((total["hb"] + total["ops"]) / duration),
        "offered_heartbeats_s": round(total["hb"] / duration),
        "applied_spans_s": round(_metric(last, "mycroft_rca_spans_applied_total") / duration),
        "dropped_spans": int(_metric(last, "mycroft_rca_spans_dropped_total")),
        "heartbeats_lost": total["hb_lost"], "heartbeat_requests_refused": total["hb_refused"],
        "op_spans_refused": total["op_refused"], "queued_max": int(max(queued, default=0)),
        "service_cpu_pct": round(100 * (cpu_window[1] - cpu0[0]) / max(1e-9, cpu_window[0] - cpu0[1]), 1)
        if cpu0[1] else None,
        # where it goes: the fold and the analysis threads count their own CPU; the rest is the
        # receivers (gRPC, decode), the API and the alerter
        "service_cpu_pct_parts": {part: round(100 * (_metric(window[-1], key) - _metric(window[0], key))
                                              / max(1e-9, window[-1]["at"] - window[0]["at"]), 1)
                                  for part, key in (("fold", 'mycroft_rca_cpu_seconds_total{part="fold"}'),
                                                    ("analysis", 'mycroft_rca_cpu_seconds_total{part="analysis"}'))}
        if len(window) >= 2 else None,
        "service_cpu_us_per_applied_span": round(1e6 * cpu_in_window / applied_in_window, 1)
        if applied_in_window else None,
        "service_rss_mb": round(rss_max), "analysis_s_p50": round(statistics.median(passes), 3) if passes else None,
        "analysis_s_max": round(max(passes), 3) if passes else None,
        # every run sends the same number of heartbeats (less a silent rank's): bytes per rank per run
        "heartbeat_bytes_per_rank_s": round(total["hb_bytes"] / len(runs) / args.ranks / duration, 1),
        "op_bytes_per_rank_s": round(total["op_bytes"] / len(runs) / args.ranks / duration, 1),
        "sender_build_s": round(total["build_s"], 2), "sender_late_ticks": total["late_ticks"],
    }
    out = []
    for r, fault_at in zip(runs, onsets, strict=True):
        first = sorted(by_job[r["job"]].values(), key=lambda i: i["detected"])
        before = [i for i in first if i["detected"] < fault_at] if fault_at else first
        after = [i for i in first if not fault_at or i["detected"] >= fault_at]
        loud = [i for i in after if i["severity"] != "info"]
        verdict: dict[str, Any] | None = (loud or after)[0] if (loud or after) else None
        causes = [tuple(c) for c in verdict["root_causes"]] if verdict else []
        plan_ = r["plan"]
        expected = EXPECTED.get(r["kind"])
        out.append({
            "fault": r["kind"], "fault_rank": plan_["rank"] if r["kind"] != "none" else None,
            "fault_partner": plan_["partner"] if r["kind"] == "deadlock" else None,
            "fault_factor": plan_["factor"], "seed": r["seed"], "job": r["job"],
            "expected": {"kinds": sorted(expected[0]), "root_cause_kinds": sorted(expected[1])} if expected else None,
            "verdict": verdict["kind"] if verdict else None,
            "verdict_severity": verdict["severity"] if verdict else None,
            "verdict_root_causes": [list(c) for c in causes[:4]] if verdict else None,
            "right": score(r["kind"], plan_["rank"], plan_["partner"], verdict["kind"] if verdict else None,
                           causes),
            "detected_s": round(verdict["detected"] - fault_at, 2) if verdict and fault_at else None,
            "root_cause_s": round((verdict.get("root_cause_at") or verdict["detected"]) - fault_at, 2)
            if verdict and fault_at else None,
            "false_incidents_before_fault": len(before) if fault_at else len(first),
            "false_incident_kinds": sorted({i["kind"] for i in before}) if fault_at else sorted(
                {i["kind"] for i in first}),
            "incidents": [(i["kind"], i["severity"], round(i["detected"] - fault_at, 2) if fault_at else None,
                           i.get("root_causes", [])[:2]) for i in first][:6],
            **shared,
        })
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mycroft simulate", description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--pp", type=int, default=1)
    p.add_argument("--ops", type=int, default=10, help="collectives per rank per second the job runs")
    p.add_argument("--op-spans", type=float, default=0.0,
                   help="share of collectives whose op spans are sent (trace-id head sampling; 0: none)")
    p.add_argument("--fault", default="block",
                   help="a fault kind (mycroft/faults/simfaults.py), a comma list, or all | process | nccl | none; "
                        "each is its own job on the same service, sent by the same senders")
    p.add_argument("--runs", type=int, default=1, help="runs per fault, each with its own seed (rank, magnitude, "
                                                       "onset)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault-rank", type=int, default=-1, help="the faulty rank (default: drawn from the seed)")
    p.add_argument("--onset-spread", type=float, default=1.0,
                   help="the onset is delayed by a random share of up to this many intervals (from the seed)")
    p.add_argument("--interval", type=float, default=1.0, help="heartbeat interval, seconds")
    p.add_argument("--warmup", type=int, default=6, help="heartbeat intervals before the fault")
    p.add_argument("--seconds", type=float, default=20.0, help="length of the run from the first heartbeat")
    p.add_argument("--tail-s", type=float, default=1.0)
    p.add_argument("--warmup-cpu-s", type=float, default=2.0)
    p.add_argument("--senders", type=int, default=2)
    p.add_argument("--prebuild-s", type=float, default=-1.0,
                   help="time the senders get to build every request of the run (default: from the load)")
    p.add_argument("--batch", type=int, default=512, help="heartbeats per OTLP request (an agent's batch)")
    p.add_argument("--compression", choices=("none", "gzip"), default="none",
                   help="of the OTLP/gRPC requests (gzip: the OTel Collector otlp exporter's default)")
    p.add_argument("--endpoint", help="OTLP/gRPC HOST:PORT of a running RCA service (default: start one)")
    p.add_argument("--api", default="http://127.0.0.1:8080", help="its API base URL (with --endpoint)")
    p.add_argument("--service-python", help="the Python whose mycroft runs the service (another checkout's venv: "
                                            "a baseline measured in the same run)")
    return p


def _exit_on_term(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # so run() stops the service and the senders it started


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _exit_on_term)
    if args.ranks % (args.tp * args.pp):
        raise SystemExit("--ranks must be a multiple of --tp x --pp")
    check_ring(fault_list(args.fault), args.ranks // (args.tp * args.pp))
    for line in run(args):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
