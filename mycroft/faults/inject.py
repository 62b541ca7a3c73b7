"""`mycroft inject`: launch an instrumented gloo job, inject one fault, score the RCA's verdict.

    mycroft inject --fault block                                # 4 ranks, world all_reduce (the old job)
    mycroft inject --layout 3d --fault block                    # 8-rank TP x PP x DP job (2x2x2)
    mycroft inject --layout 2x4x1 --fault sigkill --trigger time --at 0.3   # 0.3 s after init
    mycroft inject --layout 3d --fault all --runs 5 --json out.json         # every fault of the layout
    mycroft inject --fault sigstop --rca-otlp 10.0.0.5:4317 --rca-api http://10.0.0.5:8080

Layouts: `world` runs mycroft/faults/faultjob.py (N ranks, one world all_reduce per step);
`TPxPPxDP` (or `3d` = 2x2x2) runs mycroft/faults/job3d.py (1F1B pipeline with p2p, TP and
DP all_reduces). The faulty rank writes the onset time just before it misbehaves.

Scoring (mycroft/faults/scoring.py): correct when the first non-info incident after the
onset has the fault's kind and first root cause (rank, kind); diagnosis latency is onset
-> that incident's detected_at; alert latency is onset -> the first firing webhook POST
for the job at a receiver the harness runs (or `critical_at` of a remote service).
Healthy runs (`none`, and on 3D jobs `checkpoint`, `eval`, `jitter`, `slow_rank`) must
finish with no critical incident and no alert.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .layout import Layout, unfit
from .processes import free_port, job_command, job_env, kill_tree
from .scoring import EXPECTED, HEALTHY, alert_job, critical_at, diagnose, first_alert, judge_healthy, percentile

MATRIX = ("block", "sigkill", "sigstop", "straggler", "mismatch", "mismatch_silent", "deadlock", "chain",
          "none")  # world layout
MATRIX_3D = ("block", "chain", "sigkill", "sigstop", "straggler", "mismatch_dtype", "mismatch_size", "mismatch_op",
             "deadlock")
HEALTHY_3D = ("checkpoint", "eval", "jitter", "slow_rank")
PROCESS_FAULTS = ("block", "sigkill", "sigstop")
MIN_NPROC = {"chain": 4, "mismatch": 3, "mismatch_size": 3, "mismatch_dtype": 3, "mismatch_op": 3,
             "mismatch_silent": 3}
NET_FAULTS = ("linkdown", "throttle")  # mycroft/faults/netfault.py: namespaces, ip link, tc
WORLD = "world"
PAGING_KINDS = frozenset({"hang", "crash", "deadlock", "mismatch"})  # what a fault's verdict should page for
WORLD_NAMES = {"mismatch_op": "mismatch"}  # faultjob.py's name for a fault
# job3d.py's healthy scenarios: extra environment and steps
SCENARIOS: dict[str, dict[str, str]] = {
    "none": {"MYCROFT_JOB_STEPS": "30"},
    "checkpoint": {"MYCROFT_JOB_STEPS": "24", "MYCROFT_JOB_CKPT_EVERY": "8", "MYCROFT_JOB_CKPT_S": "2-4"},
    "eval": {"MYCROFT_JOB_STEPS": "24", "MYCROFT_JOB_EVAL_EVERY": "8", "MYCROFT_JOB_EVAL_S": "1-2"},
    "jitter": {"MYCROFT_JOB_STEPS": "40", "MYCROFT_JOB_JITTER": "0.5", "MYCROFT_JOB_SPIKE_P": "0.03",
               "MYCROFT_JOB_SPIKE_S": "0.1"},
    "slow_rank": {"MYCROFT_JOB_STEPS": "40", "MYCROFT_JOB_SLOW_FACTOR": "1.15"},
}


@dataclass
class RunResult:
    fault: str
    nproc: int
    rank: int
    step: int
    job: str
    layout: str = WORLD
    trigger: str = "step"
    at_s: float | None = None  # time trigger: seconds after init_process_group
    onset: float | None = None
    correct: bool = False
    detection_s: float | None = None  # onset -> detected_at of the right incident
    root_cause_s: float | None = None  # onset -> root_cause_at
    seen_s: float | None = None  # onset -> when the harness first read the right verdict from the service
    alert_s: float | None = None  # onset -> first firing webhook POST (or critical_at)
    false_alarms: int = 0  # faulty runs: loud incidents / alerts before the onset; healthy: criticals + alerts
    incident: dict[str, Any] | None = None
    note: str = ""
    wall_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


class Rca(Protocol):
    otlp_grpc: str

    def incidents(self, job: str) -> list[dict[str, Any]]: ...

    def alerts(self) -> list[tuple[float, dict[str, Any]]] | None: ...


class RemoteRca:
    """A running `mycroft rca serve`, reached over its OTLP and HTTP ports (alerts: its critical_at)."""

    def __init__(self, otlp_grpc: str, api: str) -> None:
        self.otlp_grpc = otlp_grpc
        self.api = api.rstrip("/")

    def incidents(self, job: str) -> list[dict[str, Any]]:
        url = f"{self.api}/api/v1/incidents?job={urllib.parse.quote(job)}&limit=1000"
        with urllib.request.urlopen(url, timeout=5) as response:
            return list(json.loads(response.read()))

    def alerts(self) -> list[tuple[float, dict[str, Any]]] | None:
        return None


@contextlib.contextmanager
def local_rca(db_dir: str | None = None, host: str = "127.0.0.1", **options: Any) -> Iterator[Any]:
    """An in-process RCA service on free ports of `host` with a temporary database, paging a
    webhook receiver of ours (unless `webhooks` is given)."""
    from mycroft.rca_service.service import RcaService, ServiceOptions

    from .webhook import WebhookReceiver

    tmp = tempfile.mkdtemp(prefix="mycroft-rca-") if db_dir is None else db_dir
    # the service's incident log goes to a file beside its database, not over the progress line
    rca_log = logging.getLogger("mycroft.rca")
    quiet = not rca_log.handlers
    if quiet:
        handler = logging.FileHandler(os.path.join(tmp, "rca.log"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        rca_log.addHandler(handler)
        rca_log.propagate = False
    receiver = WebhookReceiver().start()
    options.setdefault("webhooks", [receiver.url])
    service = RcaService(ServiceOptions(otlp_grpc=f"{host}:0", otlp_http=f"{host}:0", http=f"{host}:0",
                                        db=os.path.join(tmp, "incidents.db"), tick_s=0.1, **options)).start()

    class Local:
        otlp_grpc = f"{host}:{service.receiver.grpc_port}"
        api = f"http://{host}:{service.api.port}"

        def incidents(self, job: str) -> list[dict[str, Any]]:
            return service.store.list_incidents(1000, job)

        def alerts(self) -> list[tuple[float, dict[str, Any]]] | None:
            return receiver.snapshot() if receiver.url in options["webhooks"] else None

    try:
        local = Local()
        local.service = service  # type: ignore[attr-defined]
        local.webhook = receiver  # type: ignore[attr-defined]
        yield local
    finally:
        service.stop()
        receiver.stop()
        if quiet:
            rca_log.removeHandler(handler)
            handler.close()
            rca_log.propagate = True
        if db_dir is None:
            shutil.rmtree(tmp, ignore_errors=True)


def _brief(incident: dict[str, Any]) -> dict[str, Any]:
    """What the JSON keeps of an incident on a correct run (wrong runs keep it whole)."""
    causes = incident.get("root_causes") or []
    return {"kind": incident.get("kind"), "severity": incident.get("severity"), "status": incident.get("status"),
            "severity_reason": incident.get("severity_reason"), "resolved_at_unix": incident.get("resolved_at_unix"),
            "detected_at_unix": incident.get("detected_at_unix"), "critical_at_unix": incident.get("critical_at_unix"),
            "root_causes": [(c.get("rank"), c.get("kind")) for c in causes[:4]], "summary": incident.get("summary")}


def _verdict_note(incident: dict[str, Any] | None) -> str:
    if not incident:
        return "no incident"
    causes = incident.get("root_causes") or [{}]
    return f"{incident['kind']}/{incident.get('severity', '?')}: rank {causes[0].get('rank')} {causes[0].get('kind')}"


def run_one(rca: Rca, fault: str, nproc: int = 4, rank: int | None = None, step: int | None = None,
            heartbeat: float = 0.5, step_s: float = 0.05, timeout_s: float = 30.0, healthy_steps: int = 60,
            rng: random.Random | None = None, log_dir: str | None = None,
            startup_timeout_s: float = 120.0, linger_s: float = 0.0, layout: str = WORLD,
            trigger: str = "step", at_s: float | None = None, position: str = "any",
            alert_timeout_s: float | None = None, env: dict[str, str] | None = None,
            until: Callable[[dict[str, Any]], bool] | None = None) -> RunResult:
    """One instrumented job with one fault (or a healthy scenario), scored against the RCA service.

    `layout`: "world" (faultjob.py on `nproc` ranks) or "TPxPPxDP" / "3d" (job3d.py).
    `trigger` (3D jobs): "step" (at `step`, before a random op of `position`), "time" (`at_s`
    seconds after init_process_group; process faults) or "first" (right after the first collective).
    The run stops once the verdict is in and the alert arrived (or `alert_timeout_s` after
    the onset passed, default `timeout_s`), or `timeout_s` after the onset. `until`: a further
    wish for the right incident (e.g. evidence that a firing incident brings up to date as the
    fault spreads): the watch goes on, within `timeout_s`, until it holds.
    """
    if fault not in EXPECTED and fault not in HEALTHY:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join([*EXPECTED, *HEALTHY])}")
    rng = rng or random.Random()
    three_d = layout != WORLD
    shape = Layout.parse("2x2x2" if layout == "3d" else layout) if three_d else None
    if shape is not None:
        why = unfit(fault, shape)
        if why:
            raise ValueError(f"{fault} on {shape}: {why}")
        nproc = shape.world
    else:
        nproc = max(nproc, MIN_NPROC.get(fault, 2))
        if fault == "chain" and nproc % 2:
            nproc += 1  # its TP x DP layout pairs the ranks (faultjob.py): an odd world runs one rank more
        if fault in HEALTHY and fault != "none":
            raise ValueError(f"the healthy scenario {fault!r} runs on 3D layouts (--layout 3d)")
        if trigger != "step":
            raise ValueError("the world layout injects at a step; time triggers need a 3D layout")
    if trigger not in ("step", "time", "first"):
        raise ValueError(f"unknown trigger {trigger!r}")
    if trigger != "step" and fault not in (*PROCESS_FAULTS, "straggler"):
        raise ValueError(f"{fault} is injected at a step (only block, sigkill, sigstop, straggler take a time)")
    rank = rng.randrange(nproc) if rank is None else rank
    step = (rng.randint(6, 12) if three_d else rng.randint(20, 35)) if step is None else step
    if trigger == "time" and at_s is None:
        at_s = rng.uniform(0.0, 1.0)
    job = f"inject-{fault}-{uuid.uuid4().hex[:8]}"
    result = RunResult(fault=fault, nproc=nproc, rank=rank, step=step, job=job, layout=str(shape or WORLD),
                       trigger=trigger, at_s=at_s if trigger == "time" else None)
    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    if fault in NET_FAULTS:
        return _run_net(rca, fault, nproc, rank, step, heartbeat, step_s, timeout_s, log_dir, result)
    work = tempfile.mkdtemp(prefix="mycroft-inject-")
    onset_file = os.path.join(work, "onset.json")
    log_path = os.path.join(log_dir or work, f"{job}.log")
    healthy = fault in HEALTHY
    job_fault = "none" if healthy else fault
    if shape is None:
        steps = healthy_steps if healthy else step + 100_000
        run_env = job_env(rca.otlp_grpc, job, WORLD_NAMES.get(job_fault, job_fault), rank, step, steps, onset_file,
                          heartbeat, step_s)
        command = job_command(nproc, free_port())
    else:
        run_env = job_env(rca.otlp_grpc, job, job_fault, rank, step, 0, onset_file, heartbeat, step_s)
        run_env.update(MYCROFT_JOB_LAYOUT=str(shape), MYCROFT_FAULT_TRIGGER=trigger,
                       MYCROFT_FAULT_AT_S=str(at_s if at_s is not None else 0.5), MYCROFT_FAULT_POSITION=position,
                       MYCROFT_FAULT_SEED=str(rng.randrange(1 << 30)), MYCROFT_JOB_STEPS="100000")
        if healthy:
            run_env.update(SCENARIOS[fault])
            if fault == "slow_rank":
                run_env["MYCROFT_JOB_SLOW_RANK"] = str(rank)
        command = job_command(nproc, free_port(), "mycroft.faults.job3d")
    run_env.update(env or {})
    started = time.time()
    for attempt in range(3):
        if attempt:  # the free port was taken before torchrun bound it (parallel test suites): again
            command = job_command(nproc, free_port(), command[command.index("-m") + 1])
            result.extra["port_retries"] = attempt
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(command, env=run_env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        try:
            if healthy:
                steps = int(run_env.get("MYCROFT_JOB_STEPS", healthy_steps)) if shape else healthy_steps
                _watch_healthy(rca, result, proc, startup_timeout_s + steps * 1.0, heartbeat,
                               rank if fault == "slow_rank" else None)
            else:
                _watch_fault(rca, result, proc, onset_file, startup_timeout_s, timeout_s,
                             timeout_s if alert_timeout_s is None else alert_timeout_s, log_path, until)
        finally:
            if linger_s and result.incident is not None:
                time.sleep(linger_s)  # let the faulty state run on, so the recorded traces show it
            kill_tree(proc)
            result.wall_s = time.time() - started
            if log_dir is None and result.correct:
                shutil.rmtree(work, ignore_errors=True)
            else:
                result.extra["log"] = log_path
        if result.correct or not _port_was_taken(log_path, result):
            return result
    return result


def _port_was_taken(log_path: str, result: RunResult) -> bool:
    """The launcher died binding its rendezvous port before any worker ran."""
    if result.onset is not None or result.extra.get("exit") == 0:
        return False
    try:
        text = Path(log_path).read_text(errors="replace")
    except OSError:
        return False
    return "EADDRINUSE" in text and "failed to listen" in text


def _watch_healthy(rca: Rca, result: RunResult, proc: subprocess.Popen[bytes], wait_s: float, heartbeat: float,
                   slow_rank: int | None) -> None:
    try:
        code: int | None = proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        code = None
    time.sleep(max(3.0, 4 * heartbeat))  # long enough for a lost-heartbeat verdict to fire
    incidents = rca.incidents(result.job)
    mine = [(t, body) for t, body in (rca.alerts() or []) if alert_job(body) == result.job]
    fired = sum(1 for _, body in mine if body.get("status") == "firing")
    verdict = judge_healthy(code, incidents, fired, slow_rank)
    result.correct = verdict.correct
    result.false_alarms = verdict.criticals + fired
    result.extra.update(exit=code, incidents=verdict.by_severity, alerts=fired, slow_rank_named=verdict.slow_rank_named,
                        incident_list=incidents if not verdict.correct else [_brief(i) for i in incidents])
    if mine:  # what paged, as it stood when it paged (the incident may have changed since)
        result.extra["alert_bodies"] = [{"arrived_unix": t, "status": body.get("status"),
                                         "incident": (body.get("mycroft") or {}).get("incident")} for t, body in mine]
    seen = ", ".join(f"{n} {s}" for s, n in sorted(verdict.by_severity.items())) or "no incidents"
    result.note = f"exit {code}; {seen}; {fired} alert(s)"
    if slow_rank is not None:
        result.note += f"; slow rank {slow_rank} {'named' if verdict.slow_rank_named else 'not named'}"


def wait_for_onset(proc: subprocess.Popen[bytes], onset_file: str, startup_s: float) -> dict[str, Any] | None:
    """The facts the job wrote when its fault struck; None when it ended or `startup_s` passed first."""
    deadline = time.time() + startup_s
    while not os.path.exists(onset_file):
        if proc.poll() is not None or time.time() > deadline:
            return None
        time.sleep(0.05)
    facts: dict[str, Any] = json.loads(Path(onset_file).read_text())
    return facts


def alerts_around(rca: Rca, job: str, onset: float, incidents: list[dict[str, Any]]) -> tuple[float | None, int]:
    """(the first alert of `job` at or after the onset, how many came before it): from the receiver's
    posts when there is one, else from the incidents' critical times."""
    posts = rca.alerts()
    if posts is not None:
        return first_alert(job, onset, posts)
    crit = [c for c in (critical_at(i) for i in incidents) if c is not None]
    return min((c for c in crit if c >= onset), default=None), sum(c < onset for c in crit)


def _watch_fault(rca: Rca, result: RunResult, proc: subprocess.Popen[bytes], onset_file: str,
                 startup_timeout_s: float, timeout_s: float, alert_timeout_s: float, log_path: str,
                 until: Callable[[dict[str, Any]], bool] | None = None) -> None:
    facts = wait_for_onset(proc, onset_file, startup_timeout_s)
    if facts is None:
        result.note = f"no onset (job exit {proc.poll()}); see {log_path}"
        return
    onset = result.onset = float(facts["onset"])
    result.extra.update(position=facts.get("position"), onset_step=facts.get("step"),
                        since_init_s=facts.get("since_init_s"))
    settle_s = 5.0  # a wrong first verdict may still be corrected in place: give it this long
    pages = bool(EXPECTED[result.fault][0] & PAGING_KINDS)
    alert_deadline = onset + alert_timeout_s
    seen_right: float | None = None
    alert_at: float | None = None
    diag = None
    incidents: list[dict[str, Any]] = []
    while True:
        now = time.time()
        incidents = rca.incidents(result.job)
        diag = diagnose(result.fault, result.rank, onset, incidents)
        if diag.correct and seen_right is None:
            seen_right = now
        alert_at, early = alerts_around(rca, result.job, onset, incidents)
        diagnosed = diag.correct or (diag.settled_wrong and diag.incident is not None
                                     and now - float(diag.incident["detected_at_unix"]) > settle_s)
        if diagnosed and alert_at is None and not pages and diag.incident is not None:
            # a slowdown is not meant to page: wait a little for a severity change, not the whole time
            alert_deadline = min(onset + alert_timeout_s, float(diag.incident["detected_at_unix"]) + settle_s)
        wished = until is None or (diag.correct and diag.incident is not None and until(diag.incident))
        if diagnosed and wished and (alert_at is not None or now > alert_deadline):
            break
        if now > onset + timeout_s:
            break
        time.sleep(0.1)
    result.false_alarms = diag.false_alarms + early
    result.correct = diag.correct
    result.incident = diag.incident
    if diag.incident is not None and diag.correct:
        result.detection_s = float(diag.incident["detected_at_unix"]) - onset
        rc_at = diag.incident.get("root_cause_at_unix")
        result.root_cause_s = float(rc_at) - onset if rc_at else None
        result.seen_s = (seen_right - onset) if seen_right is not None else None
    result.alert_s = alert_at - onset if alert_at is not None else None
    result.extra["incident_list"] = [_brief(i) if diag.correct else i for i in incidents]
    alert = "no alert" if alert_at is None else f"alert {alert_at - onset:.2f}s"
    if diag.incident is None:
        result.note = f"no incident within {timeout_s:g}s of onset; {alert}; see {log_path}"
    else:
        result.note = f"{_verdict_note(diag.incident)}; {alert}"


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


_pct = percentile  # the benchmarks' old name


def row_name(r: RunResult) -> str:
    """Matrix row: the fault, with `@time` for one injected at a time (after init, or right after
    the first collective) rather than at a step."""
    return r.fault if r.trigger == "step" else f"{r.fault}@time"


def table(results: list[RunResult]) -> str:
    """fault | runs | correct | diagnosis p50/p90 | alert p50/p90 | false alarms"""
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}s"

    lines = [f"{'fault':<16} {'runs':>4} {'correct':>9} {'diag p50':>9} {'p90':>7} {'alert p50':>9} {'p90':>7} "
             f"{'false alarms':>12}"]
    for name in dict.fromkeys(row_name(r) for r in results):
        rows = [r for r in results if row_name(r) == name]
        det = [r.detection_s for r in rows if r.detection_s is not None]
        alert = [r.alert_s for r in rows if r.alert_s is not None]
        ok = sum(r.correct for r in rows)
        lines.append(f"{name:<16} {len(rows):>4} {ok:>4}/{len(rows):<4} {fmt(percentile(det, 0.5)):>9} "
                     f"{fmt(percentile(det, 0.9)):>7} {fmt(percentile(alert, 0.5)):>9} "
                     f"{fmt(percentile(alert, 0.9)):>7} {sum(r.false_alarms for r in rows):>12}")
    return "\n".join(lines)


def describe(r: RunResult) -> str:
    where = f"{r.layout} rank {r.rank if r.fault not in HEALTHY or r.fault == 'slow_rank' else '-'}"
    when = {"step": f"step {r.step}", "first": "after 1st op",
            "time": f"t+{r.at_s:.2f}s" if r.at_s is not None else "time"}[r.trigger]
    pos = r.extra.get("position")
    det = "-" if r.detection_s is None else f"{r.detection_s:.2f}s"
    return (f"{row_name(r):<16} {where:<16} {when:<12} {pos or '':<8} {'OK ' if r.correct else 'BAD'} "
            f"diag {det:<6} ({r.note})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mycroft inject", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fault", default="block",
                        help=f"one of {', '.join([*EXPECTED, *HEALTHY])}; comma-separated; 'all' (the layout's "
                        "matrix); 'net' (network faults, root)")
    parser.add_argument("--layout", default=WORLD, help="world (default) | 3d (= 2x2x2) | TPxPPxDP, e.g. 2x4x1")
    parser.add_argument("--nproc", type=int, default=4, help="world layout: ranks")
    parser.add_argument("--rank", type=int, help="faulty rank (random by default)")
    parser.add_argument("--step", type=int, help="fault step (random by default)")
    parser.add_argument("--trigger", default="step", choices=("step", "time", "first"),
                        help="3D process faults: at a step, at a time after init (--at), or after the first op")
    parser.add_argument("--at", type=float, help="time trigger: seconds after init_process_group (random in [0, 1])")
    parser.add_argument("--position", default="any", choices=("any", "tp", "pp", "dp"),
                        help="3D step trigger: before which kind of op")
    parser.add_argument("--runs", type=int, default=1, help="runs per fault")
    parser.add_argument("--heartbeat", type=float, default=0.5, help="MYCROFT_HEARTBEAT_INTERVAL for the job")
    parser.add_argument("--step-s", type=float, default=0.05, help="world layout: simulated compute per step")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds after onset to wait for a verdict")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--rca-otlp", help="HOST:PORT of a running service's OTLP/gRPC (default: start one)")
    parser.add_argument("--rca-api", help="base URL of that service's HTTP API")
    parser.add_argument("--log-dir", help="keep the jobs' logs here")
    parser.add_argument("--json", metavar="FILE", help="write every run's result here")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    three_d = args.layout != WORLD
    if args.fault == "all":
        faults = list(MATRIX_3D + HEALTHY_3D) if three_d else list(MATRIX)
    else:
        faults = list(NET_FAULTS) if args.fault == "net" else args.fault.split(",")
    unknown = [f for f in faults if f not in EXPECTED and f not in HEALTHY]
    if unknown:
        parser.error(f"unknown fault(s) {unknown}; one of {', '.join([*EXPECTED, *HEALTHY])}")
    if bool(args.rca_otlp) != bool(args.rca_api):
        parser.error("--rca-otlp and --rca-api go together")
    if three_d:
        try:
            shape = Layout.parse("2x2x2" if args.layout == "3d" else args.layout)
        except ValueError as exc:
            parser.error(str(exc))
        if args.fault == "all":
            faults = [f for f in faults if unfit(f, shape) is None]
        bad = {f: unfit(f, shape) for f in faults if unfit(f, shape)}
        if bad:
            parser.error("; ".join(f"{f}: {why}" for f, why in bad.items()))
    rng = random.Random(args.seed)
    results: list[RunResult] = []
    ctx: contextlib.AbstractContextManager[Any] = (
        contextlib.nullcontext(RemoteRca(args.rca_otlp, args.rca_api)) if args.rca_otlp else local_rca())
    interruptible()
    total = len(faults) * args.runs
    with ctx as rca, contextlib.suppress(KeyboardInterrupt):
        for fault in faults:
            for _ in range(args.runs):
                trigger = args.trigger if fault in (*PROCESS_FAULTS, "straggler") else "step"
                k = len(results) + 1
                if sys.stdout.isatty():
                    print(f"\r[{k}/{total}] running {fault}... {total - k + 1} left", end="", flush=True)
                r = run_one(rca, fault, args.nproc, args.rank, args.step, args.heartbeat, args.step_s, args.timeout,
                            rng=rng, log_dir=args.log_dir, layout=args.layout, trigger=trigger, at_s=args.at,
                            position=args.position)
                results.append(r)
                print(("\r\033[K" if sys.stdout.isatty() else "") + f"[{k}/{total}] {describe(r)}", flush=True)
    print()
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2, default=str))
    return 0 if results and all(r.correct for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
