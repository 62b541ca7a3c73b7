"""Launch mycroft/faults/framework_jobs.py under each launcher, hang one rank, score the RCA.

    with local_rca() as rca:
        r = run_block(rca, "fsdp2", launcher="torchrun", rank=2, step=4, point="between_fwd_bwd")
        h = run_healthy(rca, "compile_fullgraph")     # no critical incident, same loss, same graph breaks

Launchers: `torchrun`, `distributed_run` (`python -m torch.distributed.run`), `spawn`
(`python -m mycroft.faults.framework_jobs --spawn N`: torch.multiprocessing.spawn, env://),
`srun` (a real SLURM cluster, tests/slurm_cluster.py; MASTER_ADDR / MASTER_PORT set here,
ranks from SLURM_PROCID) and `in_code` (plain torchrun, the job calls
`mycroft.instrumentation.start()` itself). Every instrumented launch but `in_code` goes through
`opentelemetry-instrument`.

Scoring (mycroft/faults/scoring.py): a block is right when the first non-info incident after the
onset is a hang whose first root cause is the blocked rank, `not_entered`; a start-up hang (a rank
blocked before init_process_group) when that incident's first root cause is the absent rank (any
kind; the kind is kept). Healthy runs: exit 0, no critical incident and no alert
(scoring.judge_healthy), the final loss equal (1e-5 relative) to an uninstrumented run of the same
seed, and no graph break more than that run counted.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .inject import RunResult, _watch_healthy, alerts_around, free_port, job_env, kill_tree, wait_for_onset
from .scoring import Diagnosis, critical_at, diagnose, severity

LAUNCHERS = ("torchrun", "torchrun_nodes", "distributed_run", "spawn", "srun", "in_code")
MODULE = "mycroft.faults.framework_jobs"
LOSS_RTOL = 1e-5
BIN = Path(sys.executable).parent


@dataclass
class Launch:
    """What to start: the command, its extra environment, and why it cannot run (if so)."""

    command: list[str]
    env: dict[str, str]
    unavailable: str = ""


def in_code_available() -> str:
    """Why the in-code launcher cannot run ('' when mycroft.instrumentation.start exists)."""
    try:
        import mycroft.instrumentation as mi
    except ImportError as exc:  # pragma: no cover - the package is ours
        return f"mycroft.instrumentation: {exc}"
    return "" if callable(getattr(mi, "start", None)) else "pending: mycroft.instrumentation.start() not there yet"


@dataclass
class Srun:
    """srun on a running SLURM cluster: the clients' environment (SLURM_CONF, the cluster's marker)."""

    env: dict[str, str]

    def prefix(self, nproc: int) -> list[str]:
        # --overcommit: 4 tasks on a 2-CPU node; --kill-on-bad-exit: one failed task ends the step
        return ["srun", "-n", str(nproc), "--overcommit", "--kill-on-bad-exit=1"]

    def cancel_all(self) -> None:
        """Tasks are slurmstepd's children, not srun's: killing srun does not end them."""
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            jobs = subprocess.run(["squeue", "-h", "-o", "%i"], env={**os.environ, **self.env}, capture_output=True,
                                  text=True, timeout=10).stdout.split()
            if jobs:
                subprocess.run(["scancel", "--signal=KILL", *jobs], env={**os.environ, **self.env},
                               capture_output=True, timeout=10)
                subprocess.run(["scancel", *jobs], env={**os.environ, **self.env}, capture_output=True, timeout=10)


def slurm_unavailable() -> str:
    """Why srun rows cannot run here ('' when tests/slurm_cluster.py can start a cluster)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "tests" / "slurm_cluster.py").exists():
        return "no SLURM cluster fixture (tests/slurm_cluster.py)"
    cluster = _slurm_module()
    return str(cluster.missing_requirements() or "")


def _slurm_module() -> Any:
    root = Path(__file__).resolve().parents[2]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    import importlib

    return importlib.import_module("tests.slurm_cluster")


@contextlib.contextmanager
def slurm() -> Iterator[Srun]:
    """A real single-node SLURM cluster (tests/slurm_cluster.py, root only) for the with-block."""
    with _slurm_module().start_slurm_cluster() as cluster:
        yield Srun({k: v for k, v in cluster.env.items() if k.startswith(("SLURM_CONF", "MYCROFT_SLURM"))})


def launch(framework: str, launcher: str, job_args: list[str], nproc: int = 4, instrumented: bool = True,
           srun: Srun | None = None) -> Launch:
    """The command line of one job (`job_args`: framework_jobs options after --framework)."""
    port = free_port()
    args = ["--framework", framework, *job_args]
    python = [sys.executable]
    prefix = [str(BIN / "opentelemetry-instrument")] if instrumented and launcher != "in_code" else []
    elastic = ["--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "--monitor-interval", "0.1", "-m", MODULE]
    if launcher == "torchrun":
        return Launch([*prefix, str(BIN / "torchrun"), *elastic, *args], {})
    if launcher == "torchrun_nodes":  # two torchrun agents on this machine playing two nodes (c10d rendezvous)
        if nproc % 2:
            return Launch([], {}, "torchrun_nodes needs an even number of ranks")
        rdzv = ["--nnodes", "2", "--nproc-per-node", str(nproc // 2), "--rdzv-backend", "c10d",
                "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"nodes-{port}"]
        agent = shlex.join([*prefix, str(BIN / "torchrun"), *rdzv, "--monitor-interval", "0.1", "-m", MODULE, *args])
        return Launch(["/bin/sh", "-c", f"{agent} & {agent} & wait"], {})
    if launcher == "distributed_run":
        return Launch([*prefix, *python, "-m", "torch.distributed.run", *elastic, *args], {})
    if launcher == "spawn":
        return Launch([*prefix, *python, "-m", MODULE, "--spawn", str(nproc), *args],
                      {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    if launcher == "in_code":
        why = in_code_available() if instrumented else ""
        extra = ["--in-code"] if instrumented else []
        return Launch([str(BIN / "torchrun"), *elastic, *args, *extra], {}, why)
    if launcher == "srun":
        if srun is None:
            return Launch([], {}, slurm_unavailable() or "no SLURM cluster started for this run")
        root = str(Path(__file__).resolve().parents[2])
        return Launch([*srun.prefix(nproc), *prefix, *python, "-m", MODULE, *args],
                      {**srun.env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))})
    raise ValueError(f"unknown launcher {launcher!r}; one of {', '.join(LAUNCHERS)}")


def diagnose_startup(rank: int, onset: float, incidents: list[dict[str, Any]]) -> Diagnosis:
    """A rank absent from the start: the first non-info incident after the onset must name it first."""
    ordered = sorted(incidents, key=lambda i: float(i["detected_at_unix"]))
    before = [i for i in ordered if float(i["detected_at_unix"]) < onset and severity(i) != "info"]
    loud = [i for i in ordered if float(i["detected_at_unix"]) >= onset and severity(i) != "info"]
    if not loud:
        return Diagnosis(None, False, False, len(before))
    causes = loud[0].get("root_causes") or [{}]
    right = causes[0].get("rank") == rank
    return Diagnosis(loud[0], right, not right, len(before))


def _brief(incident: dict[str, Any] | None) -> str:
    if not incident:
        return "no incident"
    causes = incident.get("root_causes") or [{}]
    return (f"{incident.get('kind')}/{incident.get('severity', '?')}: rank {causes[0].get('rank')} "
            f"{causes[0].get('kind')}")


def _watch(rca: Any, result: RunResult, proc: subprocess.Popen[bytes], onset_file: str, startup_s: float,
           timeout_s: float, startup_fault: bool) -> None:
    """Wait for the onset, then poll the incidents until the verdict is right, or wrong and settled."""
    facts = wait_for_onset(proc, onset_file, startup_s)
    if facts is None:
        result.note = f"no onset (job exit {proc.poll()})"
        return
    onset = result.onset = float(facts["onset"])
    result.extra.update(position=facts.get("position"), onset_step=facts.get("step"),
                        first_step_ended=facts.get("first_step_ended"))
    diag = Diagnosis(None, False, False, 0)
    alert_at: float | None = None
    early = 0
    while True:
        now = time.time()
        incidents = rca.incidents(result.job)
        diag = (diagnose_startup(result.rank, onset, incidents) if startup_fault
                else diagnose("block", result.rank, onset, incidents))
        alert_at, early = alerts_around(rca, result.job, onset, incidents)
        settled = diag.settled_wrong and diag.incident is not None and \
            now - float(diag.incident["detected_at_unix"]) > 5.0
        if (diag.correct and (alert_at is not None or now > onset + min(timeout_s, 10.0))) or settled:
            break
        if now > onset + timeout_s:
            break
        time.sleep(0.1)
    result.correct, result.incident, result.false_alarms = diag.correct, diag.incident, diag.false_alarms + early
    if diag.correct and diag.incident is not None:
        result.detection_s = float(diag.incident["detected_at_unix"]) - onset
        rc_at = diag.incident.get("root_cause_at_unix")
        result.root_cause_s = float(rc_at) - onset if rc_at else None
    result.alert_s = alert_at - onset if alert_at is not None else None
    result.note = _brief(diag.incident) + ("" if alert_at is None else f"; alert {alert_at - onset:.2f}s")
    early_loud = [i for i in incidents if float(i["detected_at_unix"]) < onset and severity(i) != "info"]
    steady_from = facts.get("first_step_ended")
    # loud incidents between the end of the first step and the onset: the job ran steadily then
    result.extra["false_alarms_steady"] = None if steady_from is None else \
        sum(1 for i in early_loud if float(i["detected_at_unix"]) >= float(steady_from))
    # ... of them, those that paged (critical before the onset): a warning there is the RCA saying a rank
    # was out of communication about a hang threshold (a slow step on a loaded host), which can be true
    paged = [c for c in (critical_at(i) for i in incidents) if c is not None and c < onset]
    result.extra["pages_steady"] = None if steady_from is None else sum(1 for c in paged if c >= float(steady_from))
    if early_loud:
        first = min(early_loud, key=lambda i: float(i["detected_at_unix"]))
        result.note += (f"; {len(early_loud)} loud incident(s) before the onset, first "
                        f"{float(first['detected_at_unix']) - onset:+.2f}s {_brief(first)}")
    result.extra["incidents"] = [{"kind": i.get("kind"), "severity": i.get("severity"),
                                  "root_causes": [(c.get("rank"), c.get("kind")) for c in
                                                  (i.get("root_causes") or [])[:4]],
                                  "detected_at_unix": i.get("detected_at_unix"), "summary": i.get("summary")}
                                 for i in incidents]


def _start(launch_: Launch, env: dict[str, str], log_path: str) -> subprocess.Popen[bytes]:
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    with open(log_path, "wb") as log:
        return subprocess.Popen(launch_.command, env={**env, **launch_.env}, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=str(Path(__file__).resolve().parents[2]))


def _tail(path: str, lines: int = 12) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def run_block(rca: Any, framework: str, launcher: str = "torchrun", rank: int = 0, step: int = 3,
              point: str = "any", seed: int = 0, nproc: int = 4, heartbeat: float = 0.5, timeout_s: float = 20.0,
              startup_s: float = 240.0, log_dir: str | None = None, srun: Srun | None = None,
              env: dict[str, str] | None = None, compile_backend: str = "aot_eager",
              job_args: list[str] | None = None, warmup_s: float = 3.0) -> RunResult:
    """One instrumented job where `rank` blocks forever at `point` of the `step`'th step that begins
    `warmup_s` after its first step ended (startup: before init_process_group), scored against the RCA.
    result.extra: framework, launcher, point, onset_step (the job's own step number), log."""
    job = f"fw-{framework}-{uuid.uuid4().hex[:8]}"
    startup = framework == "startup"
    result = RunResult(fault="block", nproc=nproc, rank=rank, step=0 if startup else step, job=job,
                       layout=f"{framework}/{launcher}")
    result.extra.update(framework=framework, launcher=launcher, point="before_init" if startup else point,
                        seed=seed)
    work = tempfile.mkdtemp(prefix="mycroft-fw-")
    onset_file = os.path.join(work, "onset.json")
    log_path = os.path.join(log_dir or work, f"{job}.log")
    args = ["--steps", "1000000", "--seed", str(seed), "--fault", "block", "--fault-rank", str(rank),
            "--fault-step", str(step), "--warmup-s", str(warmup_s), "--fault-point", point, "--onset-file", onset_file,
            "--compile-backend", compile_backend, *(job_args or [])]
    what = launch(framework, launcher, args, nproc, srun=srun)
    if what.unavailable:
        result.note = f"skipped: {what.unavailable}"
        result.extra["skipped"] = what.unavailable
        return result
    run_env = job_env(rca.otlp_grpc, job, "none", rank, step, 0, onset_file, heartbeat, 0.0)
    run_env.update(env or {})
    started = time.time()
    proc = _start(what, run_env, log_path)
    try:
        _watch(rca, result, proc, onset_file, startup_s, timeout_s, startup)
    finally:
        kill_tree(proc)
        if launcher == "srun" and srun is not None:
            srun.cancel_all()
        result.wall_s = time.time() - started
        if result.correct and log_dir is None:
            shutil.rmtree(work, ignore_errors=True)
        else:
            result.extra["log"] = log_path
            if result.onset is None:
                result.note += "\n" + _tail(log_path)
    return result


def plain_run(framework: str, launcher: str = "torchrun", seed: int = 0, steps: int = 12, nproc: int = 4,
              timeout_s: float = 300.0, srun: Srun | None = None, compile_backend: str = "aot_eager",
              log_dir: str | None = None) -> dict[str, Any]:
    """The uninstrumented reference: {"exit", "loss", "graph_breaks", "step_s"} (+ "log" when kept).

    One that fails is run once more ("retried": the first exit code): torch itself, with no
    Mycroft loaded, rarely aborts at interpreter teardown ("terminate called without an active
    exception": once in the first 5 plain DDP runs of a matrix here), and a reference that did not finish scores
    nothing about the instrumented run. The instrumented runs get no such second chance.
    """
    retried: int | None = None
    for attempt in range(2):
        out = _plain_once(framework, launcher, seed, steps, nproc, timeout_s, srun, compile_backend, log_dir)
        if out.get("exit") == 0 or out.get("skipped") or attempt == 1:
            break
        retried = out.get("exit")
    if retried is not None:
        out["retried"] = retried
    return out


def _plain_once(framework: str, launcher: str, seed: int, steps: int, nproc: int, timeout_s: float,
                srun: Srun | None, compile_backend: str, log_dir: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mycroft-fw-plain-") as work:
        log_path = os.path.join(log_dir or work, f"plain-{framework}-{launcher}-{uuid.uuid4().hex[:8]}.log")
        out = _finished(framework, launcher, seed, steps, nproc, timeout_s, srun, compile_backend, work,
                        instrumented=False, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"},
                        log_path=log_path)
        if out.get("exit") != 0:  # keep the log of a failed reference
            kept = os.path.join(tempfile.gettempdir(), os.path.basename(log_path))
            with contextlib.suppress(OSError):
                shutil.copy(log_path, kept)
                out["log"] = kept
    return out


def _finished(framework: str, launcher: str, seed: int, steps: int, nproc: int, timeout_s: float,
              srun: Srun | None, compile_backend: str, work: str, instrumented: bool,
              env: dict[str, str], log_path: str | None = None,
              proc_out: list[subprocess.Popen[bytes]] | None = None) -> dict[str, Any]:
    loss_file, gb_file = os.path.join(work, "loss.json"), os.path.join(work, "graph_breaks.json")
    log_path = log_path or os.path.join(work, "job.log")
    job_args = ["--steps", str(steps), "--seed", str(seed), "--loss-file", loss_file, "--graph-breaks-file", gb_file,
                "--compile-backend", compile_backend]
    what = launch(framework, launcher, job_args, nproc, instrumented=instrumented, srun=srun)
    if what.unavailable:
        return {"exit": None, "skipped": what.unavailable}
    proc = _start(what, env, log_path)
    if proc_out is not None:
        proc_out.append(proc)
    try:
        code: int | None = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        kill_tree(proc)
        if launcher == "srun" and srun is not None:
            srun.cancel_all()
    out: dict[str, Any] = {"exit": code}
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads(Path(loss_file).read_text())
        out.update(loss=doc["loss"], params_sum=doc.get("params_sum"), step_s=doc.get("step_s"))
    with contextlib.suppress(OSError, ValueError):
        gb = json.loads(Path(gb_file).read_text())
        out.update(graph_breaks=gb["graph_breaks"], graph_break_reasons=gb.get("reasons"))
    if code != 0:
        out["log_tail"] = _tail(log_path, 40)
    return out


def same_loss(a: float | None, b: float | None, rtol: float = LOSS_RTOL) -> bool:
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return False
    return abs(a - b) <= rtol * max(abs(a), abs(b), 1e-12)


def run_healthy(rca: Any, framework: str, launcher: str = "torchrun", seed: int = 0, steps: int = 12,
                nproc: int = 4, heartbeat: float = 0.5, reference: dict[str, Any] | None = None,
                timeout_s: float = 300.0, log_dir: str | None = None, srun: Srun | None = None,
                env: dict[str, str] | None = None, compile_backend: str = "aot_eager") -> RunResult:
    """A healthy instrumented run, scored: exit 0, no critical incident or alert, the same final
    loss as the uninstrumented `reference` (run here when not given), no added graph break."""
    job = f"fw-{framework}-ok-{uuid.uuid4().hex[:8]}"
    result = RunResult(fault="none", nproc=nproc, rank=-1, step=0, job=job, layout=f"{framework}/{launcher}")
    result.extra.update(framework=framework, launcher=launcher, seed=seed)
    if launcher == "in_code" and in_code_available():
        result.note = f"skipped: {in_code_available()}"
        result.extra["skipped"] = in_code_available()
        return result
    if reference is None:
        reference = plain_run(framework, launcher if launcher != "in_code" else "torchrun", seed, steps, nproc,
                              timeout_s, srun, compile_backend, log_dir)
    result.extra["reference"] = {k: v for k, v in reference.items() if k != "log_tail"}
    if reference.get("skipped"):
        result.note = f"skipped: {reference['skipped']}"
        result.extra["skipped"] = reference["skipped"]
        return result
    work = tempfile.mkdtemp(prefix="mycroft-fw-ok-")
    log_path = os.path.join(log_dir or work, f"{job}.log")
    run_env = job_env(rca.otlp_grpc, job, "none", 0, 0, 0, "", heartbeat, 0.0)
    run_env.update(env or {})
    started = time.time()
    procs: list[subprocess.Popen[bytes]] = []
    traced = _finished(framework, launcher, seed, steps, nproc, timeout_s, srun, compile_backend, work, True,
                       run_env, log_path, procs)
    result.wall_s = time.time() - started
    if traced.get("skipped"):
        result.note = f"skipped: {traced['skipped']}"
        result.extra["skipped"] = traced["skipped"]
        return result

    class Done:  # _watch_healthy waits on the (already finished) job
        def wait(self, timeout: float | None = None) -> int | None:
            return traced["exit"]

    _watch_healthy(rca, result, Done(), 0.0, heartbeat, None)  # type: ignore[arg-type]
    quiet = result.correct
    loss_ok = same_loss(traced.get("loss"), reference.get("loss"))
    gb_plain, gb_traced = reference.get("graph_breaks"), traced.get("graph_breaks")
    breaks_ok = gb_plain is not None and gb_traced is not None and gb_traced <= gb_plain
    result.correct = quiet and loss_ok and breaks_ok and reference.get("exit") == 0
    result.extra.update(traced={k: v for k, v in traced.items() if k != "log_tail"}, quiet=quiet, loss_ok=loss_ok,
                        graph_breaks_ok=breaks_ok)
    result.note += (f"; loss {traced.get('loss')} vs plain {reference.get('loss')} ({'=' if loss_ok else '!='})"
                    f"; graph breaks {gb_traced} vs plain {gb_plain}")
    if reference.get("exit") != 0:
        result.note += f"; plain run exit {reference.get('exit')}"
    if reference.get("retried") is not None:
        result.note += f" (plain run retried: exit {reference['retried']} the first time)"
    if not result.correct:
        result.extra["log"] = log_path
        if traced.get("exit") != 0:
            result.note += "\n" + str(traced.get("log_tail", ""))
        if reference.get("exit") != 0:
            result.note += "\nreference: " + str(reference.get("log_tail", ""))
    elif log_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return result
