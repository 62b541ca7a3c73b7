"""abort_job on real torchrun jobs: fault onset -> RCA verdict -> every rank of the job gone.

    .venv/bin/python benchmarks/abort_latency.py [--runs 3] [--json out.json] [--quick] [--seed S]
                                                 [--gloo-timeout 20]

A real `mycroft rca serve --actions FILE` (a subprocess; policy `mode: act`, one rule: hang,
crash, deadlock, mismatch at critical -> abort_job) and real instrumented gloo jobs launched as
`opentelemetry-instrument torchrun ...` with MYCROFT_CONTROL_ENDPOINT set to the service's API:

* act, per layout (`world`: mycroft/faults/faultjob.py on 4 ranks; `3d`: job3d.py, TP 2 x PP 2
  x DP 2, 8 ranks) and fault (block, sigstop, deadlock, sigkill), `--runs` runs each, faulty
  rank and step drawn from the printed seed. Timeline per run: onset (the onset file the faulty
  rank writes just before it misbehaves) -> verdict (the acted incident's detected_at and
  critical_at) -> the abort action done / the directive issued -> every worker process gone
  (torchrun's children, found in /proc and polled every 10 ms: gone = exited, zombie or reaped)
  -> torchrun's exit. Checked per rank: its stderr (torchrun --tee/--log-dir, one file per rank)
  holds the `mycroft: aborting: ... (incident <id>)` line and torchrun's error summary gives its
  exit code (75 for a rank that left on the abort, -9 for the frozen one its siblings reap).
  sigkill is torchrun's own teardown (a worker died: torchrun SIGTERMs the rest at once), shown
  for comparison; the abort has nothing left to do there.
* act, `sigstop@poller` (`--poller-runs`, 1 per layout): the harness itself SIGSTOPs the rank
  that holds the host's directive-poller lock (instrumentation/directives.py elects one rank per
  host by flock) once the job runs; the random sigstop above hits it 1 time in 4 (world) or 8 (3D).
  A stopped process keeps its flock, so no other rank takes over polling: see the run's problems.
* observe (a second service, `mode: observe`), one run per layout and fault: the action is
  recorded `observed`, and 10 s after the critical verdict every worker still runs and none
  printed the line.
* healthy 3D jobs under act (`checkpoint`: rank 0 saves 2-4 s while the rest wait in a
  barrier, 3 times; `eval`: 1-2 s of evaluation without collectives, 3 times; `none`): exit 0,
  no action of any kind on any of the job's incidents (GET /api/v1/incidents/{id}), no directive.
* `--gloo-timeout S` (optional): the same faults on the 3D job with no control endpoint and
  gloo's process-group timeout set to S (torch.distributed's default_pg_timeout, what an
  explicit `init_process_group(timeout=...)` sets): how long the backend's own timeout takes
  to end the job.

The baseline without Mycroft: gloo's default process-group timeout is 30 min (torch
`default_pg_timeout`), NCCL's watchdog 10 min (`default_pg_nccl_timeout`, with async error
handling); a rank blocked outside a collective (block) or a frozen process (sigstop) is held
that long, and a hang in the host code with no collective in flight is held forever.
Prints a table and one JSON document (`--json FILE` writes it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mycroft.faults.inject import SCENARIOS, free_port, job_command, job_env
from mycroft.faults.scoring import diagnose, percentile

EXIT_CODE = 75
ABORT_LINE = "mycroft: aborting:"
NPROC = {"world": 4, "3d": 8}
FAULTS = ("block", "sigstop", "deadlock", "sigkill")
HEALTHY = ("checkpoint", "eval", "none")
KINDS = ["hang", "crash", "deadlock", "mismatch"]
BACKEND_TIMEOUT_S = {"gloo": 1800.0, "nccl": 600.0}  # torch default_pg_timeout / default_pg_nccl_timeout
HEARTBEAT_S = 0.5
POLL_S = 0.01
SUMMARY = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+) \(pid: (\d+)\)")


def policy_yaml(mode: str) -> str:
    return (f"mode: {mode}\nrules:\n  - name: stuck-jobs\n    kinds: [{', '.join(KINDS)}]\n"
            "    min_severity: critical\n    do: [abort_job]\n")


class Service:
    """A `mycroft rca serve --actions FILE` subprocess on free local ports."""

    def __init__(self, mode: str, work: str) -> None:
        self.mode = mode
        self.work = work
        os.makedirs(work, exist_ok=True)
        actions = os.path.join(work, f"actions-{mode}.yaml")
        Path(actions).write_text(policy_yaml(mode))
        self.log_path = os.path.join(work, f"rca-{mode}.log")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mycroft.cli", "rca", "serve", "--otlp-grpc", "127.0.0.1:0",
                 "--otlp-http", "", "--http", "127.0.0.1:0", "--db", os.path.join(work, f"rca-{mode}.db"),
                 "--actions", actions], stdout=subprocess.PIPE, stderr=log, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"mycroft rca serve did not start: {Path(self.log_path).read_text()[-2000:]}")
        ports = json.loads(line)
        self.otlp_grpc = f"127.0.0.1:{ports['otlp_grpc']}"
        self.api = f"http://127.0.0.1:{ports['http']}"

    def get(self, path: str, **query: Any) -> Any:
        url = f"{self.api}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else "")
        with urllib.request.urlopen(url, timeout=10) as response:
            return None if response.status == 204 else json.loads(response.read())

    def incidents(self, job: str) -> list[dict[str, Any]]:
        """Every incident of the job, each as GET /api/v1/incidents/{id} has it (with its actions)."""
        return [self.get(f"/api/v1/incidents/{i['id']}") for i in self.get("/api/v1/incidents", job=job, limit=1000)]

    def directive(self, job: str) -> dict[str, Any] | None:
        """The job's first live directive, if any (answered at once: wait=0)."""
        found: dict[str, Any] | None = self.get("/api/v1/directives", job=job, after=0, wait=0)
        return found

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Run:
    mode: str  # act | observe | timeout (gloo's own timeout, no control endpoint) | healthy
    layout: str
    fault: str
    rank: int
    step: int
    seed: int
    job: str
    ok: bool = False
    problems: list[str] = field(default_factory=list)
    onset: float | None = None
    detected_at: float | None = None
    critical_at: float | None = None
    action: dict[str, Any] | None = None  # the abort_job record of the acted incident
    directive_issued_at: float | None = None
    incident: dict[str, Any] | None = None  # brief
    diagnosis_right: bool | None = None
    rank_gone_at: dict[int, float] = field(default_factory=dict)
    all_gone_at: float | None = None
    torchrun_exit_at: float | None = None
    torchrun_code: int | None = None
    exit_codes: dict[int, int] = field(default_factory=dict)  # torchrun's error summary
    lines: dict[int, str] = field(default_factory=dict)  # the abort line, per rank
    frozen: list[int] = field(default_factory=list)  # ranks seen stopped (SIGSTOP)
    poller_rank: int | None = None  # the host's elected directive poller at the onset (its flock, /proc/locks)
    actions: list[dict[str, Any]] = field(default_factory=list)  # healthy / observe: every action recorded
    incidents_by_severity: dict[str, int] = field(default_factory=dict)
    alive_after_verdict: int | None = None  # observe: workers still there 10 s after the verdict
    wall_s: float = 0.0
    port_retries: int = 0
    log: str | None = None

    def since(self, start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else round(end - start, 3)

    @property
    def onset_to_gone(self) -> float | None:
        return self.since(self.onset, self.all_gone_at)

    @property
    def verdict_to_gone(self) -> float | None:
        return self.since(self.critical_at, self.all_gone_at)

    def figures(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(onset_to_detected_s=self.since(self.onset, self.detected_at),
                   onset_to_critical_s=self.since(self.onset, self.critical_at),
                   critical_to_action_done_s=self.since(self.critical_at, (self.action or {}).get("at_unix")),
                   critical_to_directive_s=self.since(self.critical_at, self.directive_issued_at),
                   onset_to_all_gone_s=self.onset_to_gone, verdict_to_all_gone_s=self.verdict_to_gone,
                   verdict_to_torchrun_exit_s=self.since(self.critical_at, self.torchrun_exit_at),
                   rank_gone_after_verdict_s={r: self.since(self.critical_at, t) for r, t in
                                              sorted(self.rank_gone_at.items())})
        return out


def _state(pid: int) -> str | None:
    """The process state letter from /proc (None: no such process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def _flock_holder(path: str) -> int | None:
    """The pid holding a flock on `path` (/proc/locks), if any."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5].rsplit(":", 1)[-1] == str(inode):
            return int(fields[4])
    return None


class Job:
    """One torchrun job, its workers tracked by pid and rank."""

    def __init__(self, service: Service, run: Run, work: str, control: bool = True,
                 gloo_timeout_s: float | None = None, max_steps: int | None = None) -> None:
        self.run = run
        self.work = work
        self.nproc = NPROC[run.layout]
        self.onset_file = os.path.join(work, "onset.json")
        self.log_dir = os.path.join(work, "ranks")
        self.log_path = os.path.join(work, "job.log")
        healthy = run.fault in HEALTHY
        fault = "none" if healthy or "@" in run.fault else run.fault  # sigstop@poller: the harness stops it
        if run.layout == "world":
            steps = (max_steps or 60) if healthy else run.step + 100_000
            env = job_env(service.otlp_grpc, run.job, fault, run.rank, run.step, steps, self.onset_file,
                          HEARTBEAT_S, 0.05)
            module = "mycroft.faults.faultjob"
        else:
            env = job_env(service.otlp_grpc, run.job, fault, run.rank, run.step, 0, self.onset_file, HEARTBEAT_S,
                          0.05)
            env.update(MYCROFT_JOB_LAYOUT="2x2x2", MYCROFT_FAULT_TRIGGER="step", MYCROFT_FAULT_AT_S="0.5",
                       MYCROFT_FAULT_POSITION="any", MYCROFT_FAULT_SEED=str(run.seed), MYCROFT_JOB_STEPS="100000")
            if healthy:
                env.update(SCENARIOS[run.fault])
            if max_steps:
                env["MYCROFT_JOB_STEPS"] = str(max_steps)
            module = "mycroft.faults.job3d"
        if control:
            env["MYCROFT_CONTROL_ENDPOINT"] = service.api
        self.env = env
        self.target = ["-m", module]
        if gloo_timeout_s is not None:  # gloo's own timeout: the job's default_pg_timeout, then the module
            runner = os.path.join(work, "with_timeout.py")
            Path(runner).write_text(
                "import datetime, runpy, sys\nimport torch.distributed.distributed_c10d as c10d\n"
                f"c10d.default_pg_timeout = datetime.timedelta(seconds={gloo_timeout_s!r})\n"
                f"sys.argv = [{module!r}]\nrunpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n")
            self.target = [runner]
        self.proc: subprocess.Popen[bytes] | None = None
        self.workers: dict[int, int] = {}  # pid -> rank
        self.started = 0.0

    def command(self) -> list[str]:
        command = job_command(self.nproc, free_port(), "X")
        at = command.index("-m")
        return [*command[:at], "--log-dir", self.log_dir, "--tee", "3", *self.target]

    def start(self) -> None:
        for _ in range(3):  # the free port can be taken before torchrun binds it
            shutil.rmtree(self.log_dir, ignore_errors=True)
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(self.command(), env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)
            self.started = time.time()
            deadline = time.time() + 20
            while time.time() < deadline and self.proc.poll() is None and not self._discover():
                time.sleep(0.2)
            if self.proc.poll() is None or "EADDRINUSE" not in Path(self.log_path).read_text(errors="replace"):
                return
            self.run.port_retries += 1  # another job took the port: not this run's fault, try another

    def poller(self) -> int | None:
        """The pid of the host's elected directive poller (the rank holding the job's relay lock)."""
        from mycroft.instrumentation.directives import relay_paths

        pid = _flock_holder(relay_paths(self.run.job)[0])
        return pid if pid in self.workers else None

    def freeze(self, which: str, warm_s: float = 6.0, within_s: float = 180.0) -> None:
        """SIGSTOP the host's directive poller ("poller") or another rank ("other") once the job has run
        `warm_s` with its poller elected, and write the onset file as the job's faults do."""
        deadline = time.time() + within_s
        while time.time() < deadline and (not self._discover() or self.poller() is None):
            time.sleep(0.2)
        time.sleep(warm_s)
        poller = self.poller()
        if poller is None:
            self.run.problems.append("no directive poller found to freeze")
            return
        victim = poller if which == "poller" else next(p for p in sorted(self.workers) if p != poller)
        self.run.rank = self.workers[victim]
        os.kill(victim, signal.SIGSTOP)
        tmp = Path(self.onset_file + ".tmp")
        tmp.write_text(json.dumps({"fault": "sigstop", "rank": self.run.rank, "onset": time.time(),
                                   "position": f"harness ({which})"}))
        tmp.replace(self.onset_file)

    def _discover(self) -> bool:
        """Find torchrun's workers (and their ranks); True once all are known."""
        assert self.proc is not None
        if len(self.workers) < self.nproc:
            for pid in _children(self.proc.pid):
                if pid not in self.workers:
                    rank = _rank_of(pid)
                    if rank is not None:
                        self.workers[pid] = rank
        return len(self.workers) >= self.nproc

    def watch(self, until_onset_s: float, after_onset_s: float, observe_s: float | None = None,
              service: Service | None = None) -> None:
        """Poll the process tree every 10 ms until every worker and torchrun are gone (or time is up).
        `observe_s`: stop `observe_s` after the incident's critical verdict instead (observe mode)."""
        assert self.proc is not None
        run = self.run
        next_scan = 0.0
        next_query = 0.0
        stop_at: float | None = None
        while True:
            now = time.time()
            if len(self.workers) < self.nproc and now >= next_scan:
                next_scan = now + 0.2
                self._discover()
            for pid, rank in self.workers.items():
                if rank in run.rank_gone_at:
                    continue
                state = _state(pid)
                if state is None or state in "ZX":
                    run.rank_gone_at[rank] = now
                elif state in "Tt" and rank not in run.frozen:
                    run.frozen.append(rank)
            if run.all_gone_at is None and len(self.workers) >= self.nproc and \
                    len(run.rank_gone_at) >= self.nproc:
                run.all_gone_at = max(run.rank_gone_at.values())
            if run.torchrun_exit_at is None and self.proc.poll() is not None:
                run.torchrun_exit_at = now
                run.torchrun_code = self.proc.returncode
            if run.onset is None and os.path.exists(self.onset_file):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    run.onset = float(json.loads(Path(self.onset_file).read_text())["onset"])
                    holder = self.poller()
                    run.poller_rank = self.workers.get(holder) if holder is not None else None
            if run.all_gone_at is not None and run.torchrun_exit_at is not None:
                return
            if run.torchrun_exit_at is not None and now - run.torchrun_exit_at > 2.0:
                return  # torchrun is gone; what it left behind is reported below
            if observe_s is not None and service is not None and run.onset is not None and now >= next_query:
                next_query = now + 0.2
                crit = [i.get("critical_at_unix") for i in service.get("/api/v1/incidents", job=run.job, limit=100)
                        if i.get("critical_at_unix") and not i.get("consequence_of")]
                if crit and stop_at is None:
                    stop_at = min(crit) + observe_s
            if stop_at is not None and now >= stop_at:
                run.alive_after_verdict = sum(1 for r in self.workers.values() if r not in run.rank_gone_at)
                return
            if run.onset is None and now - self.started > until_onset_s:
                run.problems.append(f"no onset within {until_onset_s:g}s of the launch")
                return
            if run.onset is not None and now - run.onset > after_onset_s:
                run.problems.append(f"the job was still there {after_onset_s:g}s after the onset")
                return
            time.sleep(POLL_S)

    def finish(self) -> str:
        """Kill what is left, read torchrun's summary and the per-rank abort lines; the job's output."""
        assert self.proc is not None
        if self.proc.poll() is None:
            # SIGKILL alone, no SIGCONT first (inject.kill_tree's way): a stopped poller let go on would
            # still read the abort from its socket, relay it, and its siblings print the line post mortem
            live = [pid for pid, rank in self.workers.items() if rank not in self.run.rank_gone_at]
            below = _children(self.proc.pid)
            for pid in dict.fromkeys([*live, *below, *(c for b in below for c in _children(b)), self.proc.pid]):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        out = Path(self.log_path).read_text(errors="replace")
        for rank, code, _pid in SUMMARY.findall(out):
            self.run.exit_codes[int(rank)] = int(code)
        for path in glob.glob(os.path.join(self.log_dir, "**", "attempt_*", "*", "stderr.log"), recursive=True):
            rank = int(Path(path).parent.name)  # local rank = rank on one node
            with contextlib.suppress(OSError):
                for line in Path(path).read_text(errors="replace").splitlines():
                    if line.startswith(ABORT_LINE):
                        self.run.lines[rank] = line
        return out


def _forget_relay(job: str) -> None:
    """The job's host relay files in /dev/shm (instrumentation/directives.py): the ranks never remove
    them, so the harness does once every process of the job is gone."""
    from mycroft.instrumentation.directives import relay_paths

    for path in relay_paths(job):
        with contextlib.suppress(OSError):
            os.remove(path)


def _brief(incident: dict[str, Any]) -> dict[str, Any]:
    causes = incident.get("root_causes") or []
    return {"id": incident.get("id"), "kind": incident.get("kind"), "severity": incident.get("severity"),
            "root_causes": [(c.get("rank"), c.get("kind")) for c in causes[:4]], "summary": incident.get("summary")}


def _settle(service: Service, job: str, want: str | None, wait_s: float) -> list[dict[str, Any]]:
    """The job's incidents, waiting up to `wait_s` for an abort_job record with result `want` to appear."""
    deadline = time.time() + wait_s
    while True:
        incidents = service.incidents(job)
        results = {a.get("result") for i in incidents for a in i.get("actions") or [] if a.get("action") == "abort_job"}
        if want is None or want in results or time.time() > deadline:
            return incidents
        time.sleep(0.2)


def _acted(incidents: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the incident with an abort_job action, that action), first decided first."""
    found = [(_unix(a, "decided_at") or 0.0, i, a) for i in incidents for a in i.get("actions") or []
             if a.get("action") == "abort_job"]
    if not found:
        return None, None
    _, incident, action = min(found, key=lambda x: x[0])
    return incident, action


def _unix(action: dict[str, Any], key: str) -> float | None:
    value = action.get(f"{key}_unix", action.get(key))
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str) and value:
        with contextlib.suppress(ValueError):
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    return None


def run_fault(service: Service, layout: str, fault: str, rng: random.Random, work_root: str, mode: str = "act",
              rank: int | None = None, step: int | None = None, gloo_timeout_s: float | None = None,
              observe_s: float = 10.0, keep_logs: bool = False) -> Run:
    """One faulty job under `service` (act or observe; mode "timeout": no control endpoint, gloo's timeout)."""
    nproc = NPROC[layout]
    rank = rng.randrange(nproc) if rank is None else rank
    step = (rng.randint(6, 12) if layout == "3d" else rng.randint(20, 35)) if step is None else step
    run = Run(mode=mode, layout=layout, fault=fault, rank=rank, step=step, seed=rng.randrange(1 << 30),
              job=f"abort-{mode}-{layout}-{fault}-{uuid.uuid4().hex[:8]}")
    work = tempfile.mkdtemp(prefix=f"{run.job}-", dir=work_root)
    started = time.time()
    job = Job(service, run, work, control=mode != "timeout", gloo_timeout_s=gloo_timeout_s,
              max_steps=100_000 if "@" in fault else None)
    try:
        job.start()
        after = (gloo_timeout_s or 0) + 60.0
        if "@" in fault:  # sigstop@poller / sigstop@other: the harness freezes a rank it picks
            job.freeze(fault.split("@", 1)[1])
            after = 15.0  # the verdict comes ~1 s after the onset, the ranks should be gone 5 s later
        job.watch(until_onset_s=180.0, after_onset_s=after,
                  observe_s=observe_s if mode == "observe" else None, service=service)
    finally:
        out = job.finish()
        _forget_relay(run.job)
    run.wall_s = round(time.time() - started, 1)
    incidents = _settle(service, run.job, {"act": "done", "observe": "observed"}.get(mode), 5.0)
    incident, action = _acted(incidents)
    if run.onset is not None:
        run.diagnosis_right = diagnose(fault.split("@")[0], run.rank, run.onset, incidents).correct
    if incident is None:  # no action: the verdict is the first firing critical incident after the onset
        crit = [i for i in incidents if i.get("critical_at_unix") and not i.get("consequence_of")]
        incident = min(crit, key=lambda i: i["critical_at_unix"]) if crit else None
    if incident is not None:
        run.incident = _brief(incident)
        run.detected_at = incident.get("detected_at_unix")
        run.critical_at = incident.get("critical_at_unix")
    if action is not None:
        run.action = {k: action.get(k) for k in ("action", "mode", "result", "detail", "rule", "target")}
        run.action.update(decided_at_unix=_unix(action, "decided_at"), at_unix=_unix(action, "at"))
    with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
        directive = service.directive(run.job)
        if directive is not None:
            run.directive_issued_at = directive.get("issued_at_unix")
    run.actions = [{"incident": i.get("id"), **{k: a.get(k) for k in ("action", "mode", "result")}}
                   for i in incidents for a in i.get("actions") or []]
    _judge(run, out, incident)
    if not run.ok or keep_logs:
        run.log = work
    else:
        shutil.rmtree(work, ignore_errors=True)
    return run


def _judge(run: Run, out: str, incident: dict[str, Any] | None) -> None:
    p = run.problems
    base = run.fault.split("@")[0]
    if run.onset is None:
        p.append("no onset")
        return
    if run.mode == "timeout":
        if run.all_gone_at is None:
            p.append("not every worker left")
        run.ok = not p
        return
    if base == "sigkill":  # torchrun's own teardown; the abort may come after everyone is gone
        if run.all_gone_at is None:
            p.append("not every worker left")
        run.ok = not p
        return
    if incident is None or run.critical_at is None:
        p.append("no critical verdict")
        run.ok = False
        return
    if run.mode == "observe":
        if run.action is None or run.action.get("result") != "observed" or run.action.get("mode") != "observe":
            p.append(f"abort_job not recorded as observed: {run.action}")
        if run.lines:
            p.append(f"ranks {sorted(run.lines)} printed the abort line under observe")
        if run.alive_after_verdict is None or run.alive_after_verdict < NPROC[run.layout]:
            p.append(f"only {run.alive_after_verdict} of {NPROC[run.layout]} workers alive 10 s after the verdict")
        run.ok = not p
        return
    if run.action is None or run.action.get("result") != "done" or run.action.get("mode") != "act":
        p.append(f"abort_job not done: {run.action}")
    if run.all_gone_at is None:
        stuck = sorted(r for r in range(NPROC[run.layout]) if r not in run.rank_gone_at)
        p.append(f"ranks {stuck} still there")
        if base == "sigstop" and run.poller_rank == run.rank:
            p.append(f"the frozen rank {run.rank} is the host's elected directive poller: it still holds the "
                     "relay flock, so no other rank polls and the abort never reaches the host")
    elif run.all_gone_at - run.critical_at > 5.0:
        p.append(f"last rank gone {run.all_gone_at - run.critical_at:.2f}s after the verdict (> 5 s)")
    live = [r for r in range(NPROC[run.layout]) if not (base == "sigstop" and r == run.rank)]
    no_line = [r for r in live if r not in run.lines]
    if no_line:
        p.append(f"ranks {no_line} printed no abort line")
    iid = str(incident.get("id"))
    wrong = [r for r, line in run.lines.items() if iid not in line]
    if wrong:
        p.append(f"ranks {wrong}: the line does not name incident {iid}")
    not75 = {r: run.exit_codes.get(r) for r in live if run.exit_codes.get(r) != EXIT_CODE}
    if not75:
        p.append(f"exit codes other than {EXIT_CODE} (torchrun's summary): {not75}")
    if base == "sigstop" and run.exit_codes.get(run.rank) not in (-9, None):
        p.append(f"the frozen rank {run.rank} exited {run.exit_codes.get(run.rank)} (expected -9, reaped)")
    if f"exitcode  : {EXIT_CODE}" not in out:
        p.append("torchrun's summary has no exitcode 75")
    run.ok = not p


def run_healthy(service: Service, scenario: str, rng: random.Random, work_root: str, layout: str = "3d",
                keep_logs: bool = False) -> Run:
    """A healthy job under an acting service: exit 0, no action recorded, no directive."""
    run = Run(mode="healthy", layout=layout, fault=scenario, rank=-1, step=-1, seed=rng.randrange(1 << 30),
              job=f"abort-healthy-{layout}-{scenario}-{uuid.uuid4().hex[:8]}")
    work = tempfile.mkdtemp(prefix=f"{run.job}-", dir=work_root)
    started = time.time()
    job = Job(service, run, work)
    try:
        job.start()
        assert job.proc is not None
        try:
            job.proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            run.problems.append("still running after 240 s")
        run.torchrun_code = job.proc.poll()
    finally:
        job.finish()
        _forget_relay(run.job)
    run.wall_s = round(time.time() - started, 1)
    time.sleep(max(3.0, 4 * HEARTBEAT_S))  # long enough for a lost-heartbeat verdict to fire
    incidents = service.incidents(run.job)
    for i in incidents:
        sev = str(i.get("severity"))
        run.incidents_by_severity[sev] = run.incidents_by_severity.get(sev, 0) + 1
    run.actions = [{"incident": i.get("id"), **{k: a.get(k) for k in ("action", "mode", "result", "detail")}}
                   for i in incidents for a in i.get("actions") or []]
    if run.torchrun_code != 0:
        run.problems.append(f"exit {run.torchrun_code}")
    if run.actions:
        run.problems.append(f"actions decided: {run.actions}")
    if service.directive(run.job) is not None:
        run.problems.append("a directive was published")
    if run.lines:
        run.problems.append(f"ranks {sorted(run.lines)} printed the abort line")
    run.ok = not run.problems
    if not run.ok or keep_logs:
        run.log = work
    else:
        shutil.rmtree(work, ignore_errors=True)
    return run


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def describe(r: Run) -> str:
    if r.mode == "healthy":
        sev = ", ".join(f"{n} {s}" for s, n in sorted(r.incidents_by_severity.items())) or "no incidents"
        return (f"healthy {r.layout:<5} {r.fault:<10} {'OK ' if r.ok else 'BAD'} exit {r.torchrun_code}; {sev}; "
                f"{len(r.actions)} action(s); {r.wall_s:.0f}s wall" + (f" -- {'; '.join(r.problems)}" if r.problems
                                                                         else ""))
    codes = ",".join(f"{k}:{v}" for k, v in sorted(r.exit_codes.items()))
    verdict = r.incident["kind"] + "/" + str((r.incident["root_causes"] or [[None, None]])[0]) if r.incident else "-"
    extra = f" alive@+10s {r.alive_after_verdict}" if r.mode == "observe" else ""
    return (f"{r.mode:<7} {r.layout:<5} {r.fault:<8} rank {r.rank} step {r.step:<2} {'OK ' if r.ok else 'BAD'} "
            f"onset->crit {_fmt(r.since(r.onset, r.critical_at))} crit->gone {_fmt(r.verdict_to_gone)} "
            f"onset->gone {_fmt(r.onset_to_gone)} lines {len(r.lines)} codes [{codes}] {verdict}{extra}"
            + (f" -- {'; '.join(r.problems)}" if r.problems else ""))


def summary(runs: list[Run]) -> list[dict[str, Any]]:
    rows = []
    keys = dict.fromkeys((r.mode, r.layout, r.fault) for r in runs if r.mode in ("act", "timeout"))
    for mode, layout, fault in keys:
        mine = [r for r in runs if (r.mode, r.layout, r.fault) == (mode, layout, fault)]
        og = [x for x in (r.onset_to_gone for r in mine) if x is not None]
        vg = [x for x in (r.verdict_to_gone for r in mine) if x is not None]
        ve = [x for x in (r.since(r.critical_at, r.torchrun_exit_at) for r in mine) if x is not None]
        oc = [x for x in (r.since(r.onset, r.critical_at) for r in mine) if x is not None]
        og50 = percentile(og, 0.5)
        # how much sooner than gloo's default timeout (sigkill: torchrun's own teardown, no timeout involved)
        sooner = BACKEND_TIMEOUT_S["gloo"] / og50 if og50 and mode == "act" and fault != "sigkill" else None
        rows.append({"mode": mode, "layout": layout, "fault": fault, "runs": len(mine), "ok": sum(r.ok for r in mine),
                     "onset_to_critical_p50": percentile(oc, 0.5), "onset_to_critical_p90": percentile(oc, 0.9),
                     "onset_to_all_gone_p50": percentile(og, 0.5), "onset_to_all_gone_p90": percentile(og, 0.9),
                     "verdict_to_all_gone_p50": percentile(vg, 0.5), "verdict_to_all_gone_p90": percentile(vg, 0.9),
                     "verdict_to_torchrun_exit_p50": percentile(ve, 0.5),
                     "verdict_to_torchrun_exit_p90": percentile(ve, 0.9),
                     "times_sooner_than_gloo_default": round(sooner) if sooner else None})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'mode':<7} {'layout':<6} {'fault':<14} {'ok':>5}  {'onset->crit p50/p90':>20}  "
             f"{'onset->all gone p50/p90':>24}  {'verdict->all gone p50/p90':>26}  {'verdict->torchrun exit':>22}"]
    for row in rows:
        def pair(key: str, row: dict[str, Any] = row) -> str:
            return f"{_fmt(row[key + '_p50'])} / {_fmt(row[key + '_p90'])}"

        lines.append(f"{row['mode']:<7} {row['layout']:<6} {row['fault']:<14} {row['ok']:>2}/{row['runs']:<2}  "
                     f"{pair('onset_to_critical'):>20}  {pair('onset_to_all_gone'):>24}  "
                     f"{pair('verdict_to_all_gone'):>26}  {pair('verdict_to_torchrun_exit'):>22}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="act runs per layout and fault")
    parser.add_argument("--layouts", default="world,3d")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--healthy", default=",".join(HEALTHY), help="healthy 3D scenarios under act ('' for none)")
    parser.add_argument("--observe-runs", type=int, default=1, help="observe runs per layout and fault (not sigkill)")
    parser.add_argument("--poller-runs", type=int, default=1,
                        help="act runs per layout of sigstop@poller: the harness SIGSTOPs the host's elected "
                        "directive poller (0: skip)")
    parser.add_argument("--gloo-timeout", type=float, default=0.0,
                        help="also run the 3D faults with this gloo process-group timeout and no abort (0: skip)")
    parser.add_argument("--quick", action="store_true",
                        help="1 run per layout and fault, no sigkill, observe on 3D block only, healthy checkpoint")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    layouts = [x for x in args.layouts.split(",") if x]
    faults = [x for x in args.faults.split(",") if x]
    healthy = [x for x in args.healthy.split(",") if x]
    observe = [(layout, f) for layout in layouts for f in faults if f != "sigkill"] * args.observe_runs
    if args.quick:
        args.runs = 1
        faults = [f for f in faults if f != "sigkill"]
        observe = [("3d", "block")] if "3d" in layouts else []
        healthy = healthy[:1] if healthy else []
        args.poller_runs = min(args.poller_runs, 1)
    bad = [f for f in faults if f not in FAULTS] + [h for h in healthy if h not in HEALTHY] + \
        [x for x in layouts if x not in NPROC]
    if bad:
        parser.error(f"unknown {bad}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    print(f"seed {seed}; baseline: gloo default_pg_timeout {BACKEND_TIMEOUT_S['gloo']:.0f}s (30 min), "
          f"NCCL watchdog default {BACKEND_TIMEOUT_S['nccl']:.0f}s (10 min)", flush=True)
    rng = random.Random(seed)
    work_root = tempfile.mkdtemp(prefix="mycroft-abort-bench-")
    runs: list[Run] = []

    def note(r: Run) -> None:
        runs.append(r)
        print(describe(r) + (f" (logs {r.log})" if r.log else ""), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        act = Service("act", work_root)
        try:
            for layout in layouts:
                for fault in faults:
                    for _ in range(args.runs):
                        note(run_fault(act, layout, fault, rng, work_root, keep_logs=args.keep_logs))
            for layout in layouts:
                for _ in range(args.poller_runs):
                    note(run_fault(act, layout, "sigstop@poller", rng, work_root, keep_logs=args.keep_logs))
            for scenario in healthy:
                note(run_healthy(act, scenario, rng, work_root, keep_logs=args.keep_logs))
            if args.gloo_timeout > 0:
                for fault in [f for f in faults if f != "sigkill"]:
                    note(run_fault(act, "3d", fault, rng, work_root, mode="timeout", gloo_timeout_s=args.gloo_timeout,
                                   keep_logs=args.keep_logs))
        finally:
            act.stop()
        if observe:
            obs = Service("observe", work_root)
            try:
                for layout, fault in observe:
                    note(run_fault(obs, layout, fault, rng, work_root, mode="observe", keep_logs=args.keep_logs))
            finally:
                obs.stop()
    rows = summary(runs)
    print()
    print(table(rows))
    for mode in ("observe", "healthy"):
        mine = [r for r in runs if r.mode == mode]
        if mine:
            print(f"{mode}: {sum(r.ok for r in mine)}/{len(mine)} ok")
    doc = {"seed": seed, "backend_timeout_s": BACKEND_TIMEOUT_S, "heartbeat_s": HEARTBEAT_S,
           "cpus": os.cpu_count(), "load_avg": os.getloadavg(), "summary": rows,
           "runs": [r.figures() for r in runs]}
    print(json.dumps({"seed": seed, "summary": rows}))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2, default=str))
    if not any(r.log for r in runs):
        shutil.rmtree(work_root, ignore_errors=True)
    return 0 if runs and all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
