"""`mycroft inject`: launch an instrumented N-rank gloo job, inject one fault, score the incident.

    mycroft inject --fault block --nproc 4                # one run against an in-process RCA service
    mycroft inject --fault all --runs 5 --json out.json   # the matrix
    mycroft inject --fault sigstop --rca-otlp 10.0.0.5:4317 --rca-api http://10.0.0.5:8080

A run is scored on the first incident the RCA service raises for the job after the
fault's onset (the faulty rank writes the onset time just before it misbehaves):
correct when the incident kind and its first root cause (rank and kind) are what the
fault implies. Latencies are from onset to detected_at and to root_cause_at.
Incidents raised before the onset, or on a healthy run, are false alarms.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

# fault -> (acceptable incident kinds, acceptable root-cause kinds of the faulty rank)
EXPECTED: dict[str, tuple[set[str], set[str]]] = {
    "block": ({"hang"}, {"not_entered"}),
    "chain": ({"hang"}, {"not_entered"}),
    "sigkill": ({"crash", "hang"}, {"process_lost"}),
    "sigstop": ({"hang", "crash"}, {"process_lost"}),
    "straggler": ({"slowdown"}, {"straggler"}),
    "mismatch": ({"mismatch"}, {"mismatch"}),
    "mismatch_size": ({"mismatch", "crash"}, {"mismatch"}),
    "deadlock": ({"deadlock"}, {"deadlock"}),
    "linkdown": ({"hang", "crash"}, {"process_lost", "link"}),
    "throttle": ({"slowdown"}, {"communication", "straggler"}),
    "none": (set(), set()),
}
MATRIX = ("block", "sigkill", "sigstop", "straggler", "mismatch", "deadlock", "chain", "none")
MIN_NPROC = {"chain": 4, "mismatch": 3, "mismatch_size": 3}
NET_FAULTS = ("linkdown", "throttle")  # mycroft/faults/netfault.py: namespaces, ip link, tc


@dataclass
class RunResult:
    fault: str
    nproc: int
    rank: int
    step: int
    job: str
    onset: float | None = None
    correct: bool = False
    detection_s: float | None = None
    root_cause_s: float | None = None
    false_alarms: int = 0
    incident: dict[str, Any] | None = None
    note: str = ""
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Rca(Protocol):
    otlp_grpc: str

    def incidents(self, job: str) -> list[dict[str, Any]]: ...


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RemoteRca:
    """A running `mycroft rca serve`, reached over its OTLP and HTTP ports."""

    def __init__(self, otlp_grpc: str, api: str) -> None:
        self.otlp_grpc = otlp_grpc
        self.api = api.rstrip("/")

    def incidents(self, job: str) -> list[dict[str, Any]]:
        url = f"{self.api}/api/v1/incidents?job={urllib.parse.quote(job)}&limit=1000"
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.loads(response.read()))


@contextlib.contextmanager
def local_rca(db_dir: str | None = None, host: str = "127.0.0.1", **options: Any) -> Iterator[Any]:
    """An in-process RCA service on free ports of `host` with a temporary database."""
    from mycroft.rca_service.service import RcaService, ServiceOptions

    tmp = tempfile.mkdtemp(prefix="mycroft-rca-") if db_dir is None else db_dir
    service = RcaService(ServiceOptions(otlp_grpc=f"{host}:0", otlp_http=f"{host}:0", http=f"{host}:0",
                                        db=os.path.join(tmp, "incidents.db"), tick_s=0.1, **options)).start()

    class Local:
        otlp_grpc = f"{host}:{service.receiver.grpc_port}"
        api = f"http://{host}:{service.api.port}"

        def incidents(self, job: str) -> list[dict[str, Any]]:
            return service.store.list_incidents(1000, job)

    try:
        local = Local()
        local.service = service  # type: ignore[attr-defined]
        yield local
    finally:
        service.stop()
        if db_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def job_command(nproc: int, master_port: int) -> list[str]:
    bin_dir = Path(sys.executable).parent
    torchrun = [str(bin_dir / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
                "--master-port", str(master_port), "--monitor-interval", "0.1",
                "-m", "mycroft.faults.faultjob"]
    return [str(bin_dir / "opentelemetry-instrument"), *torchrun]


def job_env(rca_grpc: str, job: str, fault: str, rank: int, step: int, steps: int, onset_file: str,
            heartbeat: float, step_s: float) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{rca_grpc}", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
        OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
        OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MYCROFT_JOB_ID=job,
        MYCROFT_HEARTBEAT_INTERVAL=str(heartbeat), MYCROFT_FAULT=fault, MYCROFT_FAULT_RANK=str(rank),
        MYCROFT_FAULT_STEP=str(step), MYCROFT_FAULT_STEPS=str(steps), MYCROFT_FAULT_ONSET_FILE=onset_file,
        MYCROFT_FAULT_STEP_S=str(step_s),
        # the stack of a rank outside communication is the evidence for "not entered": send it early
        MYCROFT_STACK_AFTER=os.environ.get("MYCROFT_STACK_AFTER", "0.3"),
    )
    return env


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each worker in a session of its own)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill the launcher and every worker it started (continuing stopped ones first)."""
    victims = [*_descendants(proc.pid), proc.pid]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def score(fault: str, rank: int, onset: float, incidents: list[dict[str, Any]]) -> tuple[dict[str, Any] | None,
                                                                                        bool, int]:
    """(the incident scored, correct?, false alarms) for a faulty run."""
    ordered = sorted(incidents, key=lambda i: i["detected_at_unix"])
    before = [i for i in ordered if i["detected_at_unix"] < onset]
    after = [i for i in ordered if i["detected_at_unix"] >= onset and i.get("root_causes")]
    if not after:
        return None, False, len(before)
    first = after[0]
    kinds, rc_kinds = EXPECTED[fault]
    causes = first["root_causes"]
    top = causes[0]
    if fault == "deadlock":
        ranks = {c["rank"] for c in causes if c["kind"] == "deadlock"}
        ok = first["kind"] in kinds and rank in ranks
    elif fault == "throttle":  # a slower link, not a rank: "communication" names no rank
        ok = first["kind"] in kinds and (top["kind"] == "communication" or top["rank"] == rank)
    else:
        ok = first["kind"] in kinds and top["rank"] == rank and top["kind"] in rc_kinds
    return first, ok, len(before)


def run_one(rca: Rca, fault: str, nproc: int = 4, rank: int | None = None, step: int | None = None,
            heartbeat: float = 0.5, step_s: float = 0.05, timeout_s: float = 30.0, healthy_steps: int = 60,
            rng: random.Random | None = None, log_dir: str | None = None,
            startup_timeout_s: float = 120.0, linger_s: float = 0.0) -> RunResult:
    """One instrumented job with one fault, scored against the RCA service's incidents."""
    if fault not in EXPECTED:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(EXPECTED)}")
    rng = rng or random.Random()
    nproc = max(nproc, MIN_NPROC.get(fault, 2))
    rank = rng.randrange(nproc) if rank is None else rank
    step = rng.randint(20, 35) if step is None else step
    steps = healthy_steps if fault == "none" else step + 100_000
    job = f"inject-{fault}-{uuid.uuid4().hex[:8]}"
    result = RunResult(fault=fault, nproc=nproc, rank=rank, step=step, job=job)
    work = tempfile.mkdtemp(prefix="mycroft-inject-")
    onset_file = os.path.join(work, "onset.json")
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    if fault in NET_FAULTS:
        return _run_net(rca, fault, nproc, rank, step, heartbeat, step_s, timeout_s, log_dir, result)
    log_path = os.path.join(log_dir or work, f"{job}.log")
    env = job_env(rca.otlp_grpc, job, fault, rank, step, steps, onset_file, heartbeat, step_s)
    started = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(job_command(nproc, free_port()), env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        if fault == "none":
            try:
                code = proc.wait(timeout=startup_timeout_s + healthy_steps * step_s * 4)
            except subprocess.TimeoutExpired:
                code = None
            time.sleep(max(3.0, 4 * heartbeat))  # long enough for a lost-heartbeat verdict to fire
            incidents = rca.incidents(job)
            result.false_alarms = len(incidents)
            result.correct = code == 0 and not incidents
            result.note = f"exit {code}" + (f"; incidents: {[i['kind'] for i in incidents]}" if incidents else "")
            return result
        deadline = time.time() + startup_timeout_s
        while not os.path.exists(onset_file):
            if proc.poll() is not None or time.time() > deadline:
                result.note = f"no onset (job exit {proc.poll()}); see {log_path}"
                return result
            time.sleep(0.05)
        result.onset = float(json.loads(Path(onset_file).read_text())["onset"])
        deadline = result.onset + timeout_s
        incident = None
        while time.time() < deadline:
            incident, correct, before = score(fault, rank, result.onset, rca.incidents(job))
            if incident is not None:
                result.correct, result.false_alarms, result.incident = correct, before, incident
                break
            time.sleep(0.1)
        if incident is None:
            _, _, result.false_alarms = score(fault, rank, result.onset, rca.incidents(job))
            result.note = f"no incident within {timeout_s:g}s of onset; see {log_path}"
            return result
        result.detection_s = incident["detected_at_unix"] - result.onset
        rc_at = incident.get("root_cause_at_unix")
        result.root_cause_s = rc_at - result.onset if rc_at else None
        top = incident["root_causes"][0]
        result.note = f"{incident['kind']}: rank {top['rank']} {top['kind']}"
        return result
    finally:
        if linger_s and result.incident is not None:
            time.sleep(linger_s)  # let the faulty state run on, so the recorded traces show it
        _kill_tree(proc)
        result.wall_s = time.time() - started
        if log_dir is None and result.correct:
            shutil.rmtree(work, ignore_errors=True)


def _run_net(rca: Rca, fault: str, nproc: int, rank: int, step: int, heartbeat: float, step_s: float,
             timeout_s: float, log_dir: str | None, result: RunResult) -> RunResult:
    """Ranks in network namespaces; an in-process service is re-bound on the bridge for them."""
    from . import netfault

    why = netfault.available()
    if why:
        result.note = f"skipped: network faults {why}"
        return result
    started = time.time()
    with netfault.topology(nproc) as topo:
        if isinstance(rca, RemoteRca):
            result = netfault.run_net(rca, fault, nproc, rank, step, heartbeat, step_s, timeout_s, log_dir,
                                      result, topo)
        else:
            with local_rca(host=topo.gateway) as bridged:
                result = netfault.run_net(bridged, fault, nproc, rank, step, heartbeat, step_s, timeout_s,
                                          log_dir, result, topo)
    result.wall_s = time.time() - started
    return result


def interruptible() -> None:
    """SIGTERM behaves like Ctrl-C: the current run's `finally` still kills its job's processes."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(len(ordered) - 1, int(k) + 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def table(results: list[RunResult]) -> str:
    """fault | runs | correct root cause | detection p50/p90 | root cause p50/p90 | false alarms"""
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}s"

    lines = [f"{'fault':<14} {'runs':>4} {'correct':>9} {'detect p50':>10} {'p90':>7} {'rc p50':>8} {'p90':>7} "
             f"{'false alarms':>12}"]
    faults = list(dict.fromkeys(r.fault for r in results))
    for fault in faults:
        rows = [r for r in results if r.fault == fault]
        det = [r.detection_s for r in rows if r.detection_s is not None]
        rc = [r.root_cause_s for r in rows if r.root_cause_s is not None]
        ok = sum(r.correct for r in rows)
        lines.append(f"{fault:<14} {len(rows):>4} {ok:>4}/{len(rows):<4} {fmt(_pct(det, 0.5)):>10} "
                     f"{fmt(_pct(det, 0.9)):>7} {fmt(_pct(rc, 0.5)):>8} {fmt(_pct(rc, 0.9)):>7} "
                     f"{sum(r.false_alarms for r in rows):>12}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mycroft inject", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", default="block",
                        help=f"one of {', '.join(EXPECTED)}; 'all' (the process-level matrix); "
                        "'net' (network faults, root)")
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--rank", type=int, help="faulty rank (random by default)")
    parser.add_argument("--step", type=int, help="fault step (random in 20..35 by default)")
    parser.add_argument("--runs", type=int, default=1, help="runs per fault")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="MYCROFT_HEARTBEAT_INTERVAL for the job")
    parser.add_argument("--step-s", type=float, default=0.05, help="simulated compute per step")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds after onset to wait for a verdict")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--rca-otlp", help="HOST:PORT of a running service's OTLP/gRPC (default: start one)")
    parser.add_argument("--rca-api", help="base URL of that service's HTTP API")
    parser.add_argument("--log-dir", help="keep the jobs' logs here")
    parser.add_argument("--json", metavar="FILE", help="write every run's result here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    faults = list(MATRIX) if args.fault == "all" else list(NET_FAULTS) if args.fault == "net" else \
        args.fault.split(",")
    unknown = [f for f in faults if f not in EXPECTED]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; one of {', '.join(EXPECTED)}")
    if bool(args.rca_otlp) != bool(args.rca_api):
        parser.error("--rca-otlp and --rca-api go together")
    rng = random.Random(args.seed)
    results: list[RunResult] = []
    ctx: contextlib.AbstractContextManager[Any] = (
        contextlib.nullcontext(RemoteRca(args.rca_otlp, args.rca_api)) if args.rca_otlp else local_rca())
    interruptible()
    with ctx as rca, contextlib.suppress(KeyboardInterrupt):
        for fault in faults:
            for _ in range(args.runs):
                r = run_one(rca, fault, args.nproc, args.rank, args.step, args.heartbeat, args.step_s, args.timeout,
                            rng=rng, log_dir=args.log_dir)
                results.append(r)
                det_s = "-" if r.detection_s is None else f"{r.detection_s:.2f}s"
                rc_s = "-" if r.root_cause_s is None else f"{r.root_cause_s:.2f}s"
                print(f"{fault:<13} rank {r.rank} step {r.step}: {'OK ' if r.correct else 'BAD'} detect {det_s} "
                      f"root cause {rc_s} false alarms {r.false_alarms} ({r.note})", flush=True)
    print()
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))
    det = [r.detection_s for r in results if r.detection_s is not None]
    if det:
        print(f"\nall faults: detection p90 {_pct(det, 0.9):.2f}s, "
              f"correct {sum(r.correct for r in results)}/{len(results)}")
    return 0 if all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

