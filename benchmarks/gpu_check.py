"""The GPU validation of Mycroft's NCCL path: one command, a few minutes on one GPU, one JSON verdict.

    .venv/bin/python benchmarks/gpu_check.py                       # NCCL on the GPU(s) here
    .venv/bin/python benchmarks/gpu_check.py --backend nccl_like   # the same checks on the CPU simulator

What it does (each job under `opentelemetry-instrument torchrun`, OTLP to an in-process
receiver or RCA service, NCCL_PROFILER_PLUGIN = the plugin it builds first):
1. a 1-rank NCCL job: the plugin loads (which profiler ABI version NCCL picked, from the
   communicator records in the ring; NCCL's 1-rank shortcut sends only API-level events);
2. a 2-rank job — two GPUs, or two ranks on one GPU (NCCL_MULTI_RANK_GPU_ENABLE=1, NCCL >=
   2.30), with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 so the NET transport (and its ProxyOp /
   ProxyStep events) is used: Coll / ProxyOp / KernelCh events reach the ring; nccl.collective
   spans join each rank's Python span; the all_reduce issued behind a long kernel
   (torch.cuda._sleep) ends after the kernel in both views while its call returned at
   enqueue; every op's end comes from the device (mycroft.timing = device_polled); the
   heartbeats carry the Flight Recorder's frontier (its pg_status keys match torch's groups:
   what DDP's C++ all-reduce is seen through on NCCL);
3. the same job with one rank stopped before a collective: the RCA service names it
   (not_entered) while the other waits in .item();
4. the step time of the job without Mycroft (no instrumentation, no plugin) against job 2's;
5. the profiler ABI NCCL picked is the one its version should pick (2.27 v4, 2.28 v5, 2.29/2.30
   v6, 2.31 v7), and the default event mask followed (no kernel-channel records on 2.31 unless
   MYCROFT_NATIVE_KERNEL_CH=1; on 2.31 a run with it measures what KernelCh costs the step);
6. chaining: job 2 again with MYCROFT_NCCL_PROFILER_CHAIN = the counting test plugin
   (native/test/chained.c): every rank's chained plugin initialised, saw only its own contexts,
   handles and parents, and counted at least as many Coll starts as Mycroft's ring has
   collectives; with --inspector PATH (NCCL Inspector's libnccl-profiler-inspector.so, built
   from NCCL's plugins/profiler/inspector) the same with the Inspector chained: it writes its
   dumps and Mycroft's ring still fills.

The verdict is "pass" when every check that could run passed, "fail" when one failed,
"skipped" when nothing could run (no GPU, a CPU-only torch, an NCCL too old for the plugin:
the output says which). Checks that cannot run here (e.g. 2 ranks on 1 GPU before NCCL 2.30)
are listed with the reason. Written for torch 2.13 + NCCL 2.27-2.31; not run on a GPU yet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "benchmarks" / "jobs" / "gpu_job.py"
BIN = Path(sys.executable).parent
PLUGIN_ABI = ((2, 27), (2, 31))  # NCCL releases whose profiler ABI (v4-v7) the plugin exports
MULTI_RANK_GPU = (2, 30)


# ------------------------------------------------------------------------------ environment
def environment(backend: str) -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": torch.__version__, "python": sys.version.split()[0], "backend": backend}
    try:
        import importlib.metadata as md

        env["nccl_wheels"] = {d.metadata["Name"]: d.version for d in md.distributions()
                              if d.metadata["Name"] and d.metadata["Name"].lower().startswith("nvidia-nccl")}
    except Exception:
        env["nccl_wheels"] = {}
    env["cuda_available"] = bool(torch.cuda.is_available())
    env["gpus"] = torch.cuda.device_count() if env["cuda_available"] else 0
    if env["gpus"]:
        env["gpu"] = torch.cuda.get_device_name(0)
    try:
        import torch.distributed as dist

        env["nccl_available"] = bool(dist.is_nccl_available())
    except Exception:
        env["nccl_available"] = False
    version = None
    if env["nccl_available"] and env["cuda_available"]:
        try:
            raw = torch.cuda.nccl.version()
            version = tuple(raw) if isinstance(raw, tuple) else (raw // 10000, raw // 100 % 100, raw % 100)
        except Exception:
            version = None
    env["nccl_version"] = ".".join(map(str, version)) if version else None
    env["_nccl_tuple"] = version
    return env


def why_not(env: dict[str, Any], backend: str) -> str | None:
    """Why nothing can run here (None: it can)."""
    if backend == "nccl_like":
        return None
    if not env["cuda_available"]:
        return f"no CUDA device visible to torch {env['torch']} (a CPU build or no GPU): nothing run on a GPU"
    if not env["nccl_available"] or not env["_nccl_tuple"]:
        return f"torch {env['torch']} carries no usable NCCL"
    if tuple(env["_nccl_tuple"][:2]) < PLUGIN_ABI[0]:
        return (f"NCCL {env['nccl_version']} (from torch's wheel) is older than 2.27: the plugin exports the "
                "profiler ABI v4-v7 only")
    return None


def two_rank_layout(env: dict[str, Any], backend: str) -> tuple[dict[str, str] | None, str]:
    """Environment of the 2-rank job, or None and why it cannot run."""
    net = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}  # the NET transport: ProxyOp / ProxyStep events
    if backend == "nccl_like":
        return {}, "2 ranks on the CPU simulator"
    if env["gpus"] >= 2:
        return net, "2 ranks on 2 GPUs, NET transport forced"
    if tuple(env["_nccl_tuple"][:2]) >= MULTI_RANK_GPU:
        return {**net, "NCCL_MULTI_RANK_GPU_ENABLE": "1", "MYCROFT_GPU_CHECK_SHARED_GPU": "1"}, \
            "2 ranks on 1 GPU (NCCL_MULTI_RANK_GPU_ENABLE=1), NET transport forced"
    return None, f"one GPU and NCCL {env['nccl_version']} < 2.30: two ranks cannot share it"


# ------------------------------------------------------------------------------ running jobs
class Sink:
    def __init__(self) -> None:
        self.records: list[Any] = []
        self._lock = threading.Lock()

    def __call__(self, records: list[Any]) -> None:
        with self._lock:
            self.records.extend(records)

    def snapshot(self) -> list[Any]:
        with self._lock:
            return list(self.records)


def job_env(endpoint: str, job: str, plugin: Path | None, extra: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://{endpoint}", OTEL_EXPORTER_OTLP_PROTOCOL="grpc",
               OTEL_TRACES_EXPORTER="otlp", OTEL_METRICS_EXPORTER="none", OTEL_LOGS_EXPORTER="none",
               OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", MYCROFT_JOB_ID=job, MYCROFT_HEARTBEAT_INTERVAL="0.5",
               MYCROFT_STACK_AFTER="0.3", NCCL_DEBUG=os.environ.get("NCCL_DEBUG", "WARN"))
    if plugin is not None:
        env["NCCL_PROFILER_PLUGIN"] = str(plugin)
    else:
        env.pop("NCCL_PROFILER_PLUGIN", None)
    env.update(extra)
    return env


def torchrun(nproc: int, args: list[str], instrumented: bool) -> list[str]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [str(BIN / "torchrun"), "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
               "--master-port", str(port), str(JOB), *args]
    return [str(BIN / "opentelemetry-instrument"), *command] if instrumented else command


def run_job(nproc: int, args: list[str], env: dict[str, str], out: Path, instrumented: bool = True,
            timeout: float = 120) -> tuple[int, list[dict[str, Any]], str]:
    out.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(torchrun(nproc, [*args, "--out", str(out)], instrumented), env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT))
    reports = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    return proc.returncode, reports, (proc.stdout + proc.stderr)[-4000:]


# ------------------------------------------------------------------------------ the checks (pure)
def expected_abi(nccl: tuple[int, ...] | None) -> int | None:
    """The profiler ABI NCCL looks up first among the plugin's (v7 from 2.31; None: unknown NCCL)."""
    if not nccl:
        return None
    minor = tuple(nccl[:2])
    return 7 if minor >= (2, 31) else 6 if minor >= (2, 29) else 5 if minor >= (2, 28) else 4


def kernel_channels_by_default(abi: int | None) -> bool:
    """The plugin's default mask asks for KernelCh up to v6 (NCCL <= 2.30), not on v7 (4-13 %, nccl#2355)."""
    return abi is None or abi <= 6


def check_plugin(reports: list[dict[str, Any]], nranks: int, nccl: tuple[int, ...] | None = None) -> dict[str, Any]:
    """Every rank's ring holds a communicator record: NCCL loaded the plugin, with the ABI its version picks."""
    comms = [c for r in reports for c in r.get("ring", {}).get("comms", [])]
    versions = sorted({c["api_version"] for c in comms})
    loaded = len(reports) == nranks and all(r.get("ring", {}).get("comms") for r in reports)
    want = expected_abi(nccl)
    right = want is None or versions == [want]
    detail = "" if loaded else "a rank's ring has no communicator record: NCCL did not load the plugin"
    if loaded and not right:
        detail = f"NCCL {'.'.join(map(str, nccl or ()))} picked ABI {versions}, expected v{want}"
    return {"ok": loaded and right, "abi_versions": versions, "abi_expected": want, "communicators": comms[:8],
            "detail": detail}


def check_chain(reports: list[dict[str, Any]], counts: list[dict[str, Any]], nranks: int) -> dict[str, Any]:
    """The chained counting plugin ran beside Mycroft in every rank: its own contexts, handles and
    parents only, and at least as many Coll starts as Mycroft's ring has collectives."""
    by_pid = {int(c.get("pid", -1)): c for c in counts}
    rows = []
    for r in reports:
        ring = r.get("ring", {})
        suffix = str(ring.get("path", "")).rsplit("mycroft-nccl-", 1)[-1]
        c = by_pid.get(int(suffix), {}) if suffix.isdigit() else {}
        colls = int(ring.get("kinds", {}).get("coll_done", 0))
        rows.append({"rank": r.get("rank"), "chained_inits": c.get("inits", 0), "chained_coll_starts":
                     int(c.get("starts", {}).get("2", 0)), "mycroft_collectives": colls,
                     "foreign": {k: c.get(k, 0) for k in ("bad_ctx", "bad_handle", "bad_parent")}})
    ok = len(rows) == nranks and all(
        row["chained_inits"] >= 1 and not any(row["foreign"].values())
        and 0 < row["mycroft_collectives"] <= row["chained_coll_starts"] for row in rows)
    return {"ok": ok, "ranks": rows,
            "detail": "" if ok else "a rank's chained plugin did not run, saw a handle not its own, or missed calls"}


def check_inspector(reports: list[dict[str, Any]], dump_dir: Path) -> dict[str, Any]:
    """NCCL Inspector chained behind Mycroft wrote its dumps, and Mycroft's rings still filled."""
    dumps = [p for p in dump_dir.rglob("*") if p.is_file() and p.stat().st_size > 0] if dump_dir.exists() else []
    colls = sum(int(r.get("ring", {}).get("kinds", {}).get("coll_done", 0)) for r in reports)
    ok = bool(dumps) and colls > 0
    return {"ok": ok, "inspector_files": [str(p.relative_to(dump_dir)) for p in dumps[:8]],
            "mycroft_collectives": colls, "detail": "" if ok else "no Inspector dump, or no Mycroft records"}


def check_events(reports: list[dict[str, Any]], spans: list[Any], expect_flows: bool,
                 expect_kernel: bool = True) -> dict[str, Any]:
    from mycroft import schema

    kinds: dict[str, int] = {}
    for r in reports:
        for kind, n in r.get("ring", {}).get("kinds", {}).items():
            kinds[kind] = kinds.get(kind, 0) + n
    by_span: dict[str, int] = {}
    for s in spans:
        if s.kind in (schema.KIND_NATIVE_COLL, schema.KIND_NATIVE_FLOW, schema.KIND_NATIVE_KERNEL_CHANNEL):
            by_span[s.kind] = by_span.get(s.kind, 0) + 1
    need = ["coll_done"] + (["kernel_channel"] if expect_kernel else []) + (["flow_done"] if expect_flows else [])
    missing = [k for k in need if not kinds.get(k)]
    unasked = [] if expect_kernel or not kinds.get("kernel_channel") else ["kernel_channel"]
    dropped = sum(r.get("ring", {}).get("dropped_records", 0) + r.get("ring", {}).get("dropped_events", 0)
                  for r in reports)
    detail = f"no {', '.join(missing)} records in the rings" if missing else ""
    if unasked:
        detail = "kernel_channel records although the default mask leaves KernelCh off on this NCCL"
    return {"ok": not missing and not unasked and bool(by_span.get(schema.KIND_NATIVE_COLL)), "ring_records": kinds,
            "native_spans": by_span, "dropped": dropped, "detail": detail}


def check_join(spans: list[Any]) -> dict[str, Any]:
    """nccl.collective spans are children of their rank's Python span, in the collective's trace."""
    from mycroft import schema

    python = {(s.trace_id, s.span_id): s for s in spans if s.kind == schema.KIND_COLLECTIVE}
    native = [s for s in spans if s.kind == schema.KIND_NATIVE_COLL]
    joined = [s for s in native if (parent := python.get((s.trace_id, s.parent_span_id))) is not None
              and parent.rank == s.rank]
    share = len(joined) / len(native) if native else 0.0
    unmapped = sorted({str(s.attributes.get(schema.ATTR_GROUP_ID)) for s in native if s not in joined})[:4]
    return {"ok": bool(native) and share >= 0.9, "native_collectives": len(native), "joined": len(joined),
            "share": round(share, 3), "unjoined_groups": unmapped}


def check_long_kernel(spans: list[Any], reports: list[dict[str, Any]], seq: int, seconds: float) -> dict[str, Any]:
    """The all_reduce issued behind a long kernel: its call returns at enqueue, its spans end after the kernel."""
    from mycroft import schema

    out: dict[str, Any] = {"seq": seq, "kernel_s": seconds, "ranks": {}}
    ok = bool(reports)
    for r in reports:
        rank = r["rank"]
        py = [s for s in spans if s.kind == schema.KIND_COLLECTIVE and s.rank == rank
              and s.attributes.get(schema.ATTR_SEQ) == seq]
        nat = [s for s in spans if s.kind == schema.KIND_NATIVE_COLL and s.rank == rank
               and s.attributes.get(schema.ATTR_SEQ) == seq]
        row: dict[str, Any] = {"call_s": r.get("kernel_call_s")}
        if py:
            row["python_span_s"] = round((py[0].end_ns - py[0].start_ns) / 1e9, 4)
            row["timing"] = py[0].attributes.get(schema.ATTR_TIMING)
        if nat:
            row["native_span_s"] = round((nat[0].end_ns - nat[0].start_ns) / 1e9, 4)
        good = (bool(py) and row["python_span_s"] >= 0.8 * seconds and row["call_s"] is not None
                and row["call_s"] < 0.5 * seconds and bool(nat) and row["native_span_s"] >= 0.8 * seconds)
        row["ok"] = good
        ok = ok and good
        out["ranks"][rank] = row
    out["ok"] = ok
    return out


def check_device_timing(spans: list[Any]) -> dict[str, Any]:
    from mycroft import schema

    timings: dict[str, int] = {}
    for s in spans:
        if s.kind == schema.KIND_COLLECTIVE:
            key = str(s.attributes.get(schema.ATTR_TIMING))
            timings[key] = timings.get(key, 0) + 1
    return {"ok": bool(timings) and set(timings) == {schema.TIMING_DEVICE_POLLED}, "timings": timings}


def check_frontier(spans: list[Any]) -> dict[str, Any]:
    """The Flight Recorder's pg_status is read and its groups match torch's (heartbeats carry its frontier).

    DDP's C++ all-reduce on NCCL is seen through this frontier only (no Python hook there).
    """
    from mycroft import schema

    best = -1
    for s in spans:
        if s.kind == schema.KIND_HEARTBEAT:
            values = s.attributes.get(schema.ATTR_HB_GROUP_FR_COMPLETED) or []
            best = max([best, *[int(v) for v in values]])
    return {"ok": best > 0, "max_fr_completed": best,
            "detail": "" if best > 0 else "no heartbeat carried a Flight Recorder frontier: pg_status unread "
                                          "or its keys do not match torch's group names"}


def check_overhead(plain: list[dict[str, Any]], traced: list[dict[str, Any]]) -> dict[str, Any]:
    def median_step(reports: list[dict[str, Any]]) -> float | None:
        times = [t for r in reports for t in r.get("step_times", [])[5:]]  # warm-up steps out
        return statistics.median(times) if times else None

    a, b = median_step(plain), median_step(traced)
    if not a or not b:
        return {"ok": False, "detail": "a run produced no step times"}
    return {"ok": True, "plain_step_ms": round(a * 1e3, 3), "mycroft_step_ms": round(b * 1e3, 3),
            "ratio": round(b / a, 4), "note": "separate runs; the traced run has one long-kernel step (median)"}


def verdict(checks: dict[str, dict[str, Any]]) -> str:
    ran = [c for c in checks.values() if c.get("ok") is not None]
    if not ran:
        return "skipped"
    return "pass" if all(c["ok"] for c in ran) else "fail"


# ------------------------------------------------------------------------------ the run
def build_plugin() -> Path:
    from mycroft.native import PACKAGE_DIR, library_path

    if shutil.which("make"):  # the plugin and the counting plugin the chaining check chains
        subprocess.run(["make", "-s", "-C", str(PACKAGE_DIR), "all", "chain"], check=True, capture_output=True)
    else:
        subprocess.run([sys.executable, "-m", "mycroft.cli", "native", "build"], check=True, capture_output=True)
    return library_path()


def hang_check(backend: str, plugin: Path, layout: dict[str, str], work: Path, steps: int) -> dict[str, Any]:
    from mycroft.faults.inject import local_rca

    with local_rca() as rca:
        job = f"gpu-check-hang-{os.getpid()}"
        env = job_env(rca.otlp_grpc, job, plugin, layout)
        out = work / "hang"
        out.mkdir()
        command = torchrun(2, ["--backend", backend, "--steps", str(steps + 1000), "--hang-rank", "1",
                               "--hang-step", "10", "--out", str(out)], True)
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, cwd=str(ROOT))
        incident = None
        onset = None
        try:
            assert proc.stdout is not None
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                if "HANG 1" in line:
                    onset = time.time()
                    break
            while onset is not None and time.time() < onset + 30 and incident is None:
                incident = next((i for i in rca.incidents(job) if i.get("root_causes")), None)
                time.sleep(0.2)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    if onset is None:
        return {"ok": False, "detail": "the job never reached the hang"}
    if incident is None:
        return {"ok": False, "detail": "no incident with a root cause within 30 s"}
    top = incident["root_causes"][0]
    ok = incident["kind"] == "hang" and top["rank"] == 1 and top["kind"] == "not_entered"
    return {"ok": ok, "incident": incident["kind"], "root_cause": {"rank": top["rank"], "kind": top["kind"]},
            "detected_s": round(incident["detected_at_unix"] - onset, 2),
            "evidence": str(top.get("evidence", {}).get("text", ""))[:300]}


def chain_checks(backend: str, plugin: Path, layout: dict[str, str], endpoint: str, work: Path, steps: int,
                 inspector: Path | None) -> dict[str, dict[str, Any]]:
    """Item 6: the counting plugin chained (and NCCL Inspector, when given)."""
    from mycroft.native import BUILD_DIR

    counter = BUILD_DIR / "libchain_counter.so"
    checks: dict[str, dict[str, Any]] = {}
    if not counter.exists():
        checks["chained_plugin_runs_beside"] = {"ok": None, "skipped": "no make: the counting plugin is not built"}
    else:
        out = work / "chain"
        out.mkdir()
        env = job_env(endpoint, "gpu-check-chain", plugin, {
            **layout, "MYCROFT_NCCL_PROFILER_CHAIN": str(counter), "CHAIN_COUNTER_OUT": str(out / "counts-%p.json")})
        code, reports, tail = run_job(2, ["--backend", backend, "--steps", str(steps)], env, out / "job")
        counts = [json.loads(p.read_text()) for p in sorted(out.glob("counts-*.json")) if p.read_text()]
        checks["chained_plugin_runs_beside"] = check_chain(reports, counts, 2) if code == 0 else \
            {"ok": False, "detail": tail}
    if inspector is None:
        checks["inspector_chained"] = {"ok": None, "skipped": "no --inspector PATH given"}
    else:
        dump = work / "inspector-dump"
        env = job_env(endpoint, "gpu-check-inspector", plugin, {
            **layout, "MYCROFT_NCCL_PROFILER_CHAIN": str(inspector), "NCCL_INSPECTOR_ENABLE": "1",
            "NCCL_INSPECTOR_DUMP_DIR": str(dump), "NCCL_INSPECTOR_DUMP_MIN_SIZE_BYTES": "0"})
        code, reports, tail = run_job(2, ["--backend", backend, "--steps", str(steps)], env, work / "inspector")
        checks["inspector_chained"] = check_inspector(reports, dump) if code == 0 else {"ok": False, "detail": tail}
    return checks


def kernel_ch_cost(backend: str, plugin: Path, layout: dict[str, str], endpoint: str, work: Path, steps: int,
                   default_reports: list[dict[str, Any]], abi: int | None) -> dict[str, dict[str, Any]]:
    """Item 5 on NCCL >= 2.31: KernelCh asked for (MYCROFT_NATIVE_KERNEL_CH=1) comes, and what it costs."""
    if abi is None or abi < 7:
        skipped = {"ok": None, "skipped": "KernelCh is in the default mask before NCCL 2.31"}
        return {"kernel_channels_on_request": skipped, "kernel_ch_cost_2_31": dict(skipped)}
    env = job_env(endpoint, "gpu-check-kch", plugin, {**layout, "MYCROFT_NATIVE_KERNEL_CH": "1"})
    code, reports, tail = run_job(2, ["--backend", backend, "--steps", str(steps)], env, work / "kch")
    if code != 0:
        return {"kernel_channels_on_request": {"ok": False, "detail": tail}}
    kinds = sum(int(r.get("ring", {}).get("kinds", {}).get("kernel_channel", 0)) for r in reports)
    cost = check_overhead(default_reports, reports)  # the default run is the baseline here
    cost["note"] = "step time with KernelCh over without it, both traced (nccl#2355: 4.3-13.3 % on 2.31.2)"
    return {"kernel_channels_on_request": {"ok": kinds > 0, "kernel_channel_records": kinds},
            "kernel_ch_cost_2_31": cost}


def run(backend: str, steps: int, kernel_s: float, inspector: Path | None = None) -> dict[str, Any]:
    from mycroft.otlp_server import OtlpReceiver

    started = time.monotonic()
    env = environment(backend)
    checks: dict[str, dict[str, Any]] = {}
    reason = why_not(env, backend)
    result: dict[str, Any] = {"environment": {k: v for k, v in env.items() if not k.startswith("_")},
                              "ran_on_gpu": False, "checks": checks}
    if reason:
        result.update(verdict="skipped", reason=reason, seconds=round(time.monotonic() - started, 1))
        return result
    plugin = build_plugin()
    result["plugin"] = str(plugin)
    kernel_step = min(20, steps // 2)
    sink = Sink()
    receiver = OtlpReceiver(sink, "127.0.0.1:0", None).start()
    endpoint = f"127.0.0.1:{receiver.grpc_port}"
    with tempfile.TemporaryDirectory(prefix="mycroft-gpu-check-") as tmp:
        work = Path(tmp)
        try:
            # 1. one rank: the plugin loads (NCCL's 1-rank shortcut: API-level events only)
            code, reports, tail = run_job(1, ["--backend", backend, "--steps", "20"],
                                          job_env(endpoint, "gpu-check-1rank", plugin, {}), work / "one")
            checks["one_rank_job"] = {"ok": code == 0, "detail": "" if code == 0 else tail}
            nccl = env["_nccl_tuple"] if backend == "nccl" else None
            abi = expected_abi(nccl)
            checks["plugin_loads_1_rank"] = check_plugin(reports, 1, nccl)
            # 2. two ranks, NET transport: events, join, long kernel, device timing
            layout, how = two_rank_layout(env, backend)
            if layout is None:
                for name in ("two_rank_job", "events_reach_the_ring", "native_spans_join_python_trace",
                             "collective_behind_long_kernel", "completion_from_device", "flight_recorder_frontier",
                             "hang_named_by_rca", "step_time_overhead", "chained_plugin_runs_beside",
                             "inspector_chained", "kernel_channels_on_request", "kernel_ch_cost_2_31"):
                    checks[name] = {"ok": None, "skipped": how}
            else:
                sink.records.clear()
                code, reports, tail = run_job(
                    2, ["--backend", backend, "--steps", str(steps), "--kernel-step", str(kernel_step),
                        "--kernel-seconds", str(kernel_s)],
                    job_env(endpoint, "gpu-check-2rank", plugin, layout), work / "two")
                checks["two_rank_job"] = {"ok": code == 0, "layout": how, "detail": "" if code == 0 else tail}
                time.sleep(2.0)  # the exporters' last batches
                spans = sink.snapshot()
                checks["plugin_loads_2_ranks"] = check_plugin(reports, 2, nccl)
                checks["events_reach_the_ring"] = check_events(reports, spans, expect_flows=True,
                                                               expect_kernel=kernel_channels_by_default(abi))
                checks["native_spans_join_python_trace"] = check_join(spans)
                checks["collective_behind_long_kernel"] = check_long_kernel(spans, reports, kernel_step + 1, kernel_s)
                checks["completion_from_device"] = check_device_timing(spans)
                checks["flight_recorder_frontier"] = check_frontier(spans)
                # 4. the same loop without Mycroft (no instrumentation, no plugin)
                code, plain, tail = run_job(2, ["--backend", backend, "--steps", str(steps)],
                                            job_env(endpoint, "gpu-check-plain", None, layout), work / "plain",
                                            instrumented=False)
                checks["step_time_overhead"] = check_overhead(plain, reports) if code == 0 else \
                    {"ok": False, "detail": tail}
                # 5. on 2.31: KernelCh on request, and its cost
                checks.update(kernel_ch_cost(backend, plugin, layout, endpoint, work, steps, reports, abi))
                # 6. chaining: the counting plugin (and NCCL Inspector) beside Mycroft
                checks.update(chain_checks(backend, plugin, layout, endpoint, work, min(steps, 60), inspector))
                # 3. one rank stops before a collective: the RCA names it
                checks["hang_named_by_rca"] = hang_check(backend, plugin, layout, work, steps)
        finally:
            receiver.stop(0)
    result["ran_on_gpu"] = backend == "nccl"
    result["verdict"] = verdict(checks)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=["nccl", "nccl_like"], default="nccl",
                        help="nccl: the GPU(s) here; nccl_like: the CPU simulator (the checks' own test)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--kernel-seconds", type=float, default=0.3)
    parser.add_argument("--inspector", type=Path, default=None,
                        help="NCCL Inspector's libnccl-profiler-inspector.so: also check it chained behind Mycroft")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args.backend, args.steps, args.kernel_seconds, args.inspector)
    text = json.dumps(result, indent=2, default=str)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if result["verdict"] in ("pass", "skipped") else 1


if __name__ == "__main__":
    sys.exit(main())
