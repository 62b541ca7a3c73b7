"""Framework matrix: a rank hangs inside real DDP / FSDP2 / DTensor / compiled / pipelined /
Megatron- and DeepSpeed-style / DCP / DeviceMesh jobs, under each launcher; does the RCA name it?

    .venv/bin/python benchmarks/framework_matrix.py                          # every row, 3 block runs each
    .venv/bin/python benchmarks/framework_matrix.py --quick                  # one per family, 1 run, short cost runs
    .venv/bin/python benchmarks/framework_matrix.py --frameworks ddp,fsdp2 --runs 5 --json out.json
    .venv/bin/python benchmarks/framework_matrix.py --launchers torchrun,spawn --cross   # every framework x launcher
    .venv/bin/python benchmarks/framework_matrix.py --report out.json        # reprint a JSON's tables

Jobs: mycroft/faults/framework_jobs.py on 4 gloo ranks (see its docstring for what each framework
issues); launched by mycroft/faults/framework_runs.py. Rows: every framework under `torchrun`, and
`ddp` + `startup` under every other launcher (two torchrun agents playing two nodes with a c10d
rendezvous, `python -m torch.distributed.run`, mp.spawn with
env://, srun on a real SLURM cluster when tests/slurm_cluster.py provides one, and the in-code
`mycroft.instrumentation.start()`); `--cross` runs every framework under every launcher chosen.
Per row: `--runs` block runs, each on a random rank at a random step (the 1st..5th that begins
`--warmup` s after the job's first step ended: past exporters connecting, compiling, ranks
drifting) and point of the step (before the forward, between forward and backward, before the optimizer step;
startup: before init_process_group), drawn from the printed seed; and one healthy run, scored: no critical incident
or alert, the final loss equal (1e-5 relative) to an uninstrumented run of the same seed, no graph
break more than that run counted. A block is right when the RCA's first loud incident after the
onset is a hang naming that rank `not_entered` (startup: naming the absent rank).
Goals: 100% right rank, diagnosis p90 <= 2 s, zero critical incidents on healthy runs. The
table's `early` column counts loud incidents and alerts before the onset (scored as false alarms:
a verdict that was already out before the rank blocked is no diagnosis of the block), then those of
them raised after the first step ended (the job running steadily), then those that paged then.

Costs, measured in the same invocation:
- per op, per issuer, on the training thread (time.thread_time, one gloo process of world size 1,
  blocks switching MycroftInstrumentor().instrument() / uninstrument() in the same process):
  a Python `dist.all_reduce` call, a DDP bucket (the C++ reducer, seen by the Flight Recorder's
  frontier by default; and routed through Mycroft's comm hook with MYCROFT_DDP_HOOK=1; the DDP is
  rebuilt after each switch, since the instrumentation hooks it at construction), and a collective inside compiled code
  (torch.compile fullgraph, aot_eager, 8 funcol all_reduces per call);
- the in-run step-time A/B: 4-rank jobs under opentelemetry-instrument switching the
  instrumentation off / on every `--ab-block` steps (framework_jobs --ab-block), median step
  traced / plain; and the same for the process's CPU time per step (every thread: where the
  machine has fewer cores than ranks, wall time is mostly the scheduler's and CPU time is what
  tracing costs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.instrumentation_overhead import ab_times_ratio  # noqa: E402
from mycroft.faults.framework_jobs import FRAMEWORKS, POINTS  # noqa: E402
from mycroft.faults.framework_runs import (  # noqa: E402
    LAUNCHERS,
    launch,
    run_block,
    run_healthy,
    slurm,
    slurm_unavailable,
)
from mycroft.faults.inject import RunResult, interruptible, job_env, kill_tree, local_rca  # noqa: E402
from mycroft.faults.scoring import percentile  # noqa: E402

LAUNCHER_FRAMEWORKS = ("ddp", "startup")  # what runs under the launchers other than torchrun
QUICK = ("ddp", "fsdp2", "tp_eager", "compile_fullgraph", "pipe_1f1b", "megatron_coalescing", "dcp", "mesh2d",
         "startup")
AB_FRAMEWORKS = ("ddp", "tp_eager", "compile_fullgraph")  # the three issuers: reducer, Python calls, compiled


def plan_rows(frameworks: list[str], launchers: list[str], cross: bool) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    for launcher in launchers:
        for framework in frameworks:
            if launcher == "torchrun" or cross or framework in LAUNCHER_FRAMEWORKS:
                rows.append((framework, launcher))
    return rows


# ------------------------------------------------------------------------------------------ per-op cost
PER_OP = r'''
import gc, json, os, random, statistics, sys, tempfile, time
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel as DDP
from mycroft.instrumentation.instrumentor import MycroftInstrumentor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class Null(SpanExporter):
    def export(self, spans):
        return SpanExportResult.SUCCESS


torch.set_num_threads(1)
reps, n_call, n_ddp, n_comp = (int(v) for v in sys.argv[1:5])
tmp = tempfile.mkdtemp()
instrumentor = MycroftInstrumentor()
dist.init_process_group("gloo", init_method=f"file://{tmp}/s", rank=0, world_size=1)
t = torch.ones(1024)


def python_call(n):
    for _ in range(n):
        dist.all_reduce(t)  # looked up per call: follows instrument() / uninstrument()


model = torch.nn.Sequential(*[torch.nn.Linear(128, 128) for _ in range(8)])
x = torch.randn(4, 128)


def make_ddp():
    d = DDP(model, bucket_cap_mb=0.06)  # one bucket per layer once the first iteration rebuilt them
    for _ in range(3):
        d(x).sum().backward()
    return d


def ddp_steps(d, n):
    for _ in range(n):
        d(x).sum().backward()


PER_CALL = 8


@torch.compile(fullgraph=True, backend="aot_eager")
def compiled(v):
    for _ in range(PER_CALL):
        v = funcol.all_reduce(v, "sum", dist.group.WORLD) * 0.5
    return v


def compiled_calls(n):
    for _ in range(n):
        compiled(t)


def cpu(fn, *a):
    gc.collect()
    start = time.thread_time_ns()
    fn(*a)
    return time.thread_time_ns() - start


res = {k: {"traced": [], "plain": []} for k in ("python_call", "ddp_reducer", "ddp_hook", "compiled")}
buckets = 0
for i in range(3 * reps):  # traced (defaults), plain, traced with MYCROFT_DDP_HOOK=1 (DDP only)
    mode = ("traced", "plain", "hooked")[i % 3]
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    if mode != "plain":
        os.environ["MYCROFT_DDP_HOOK"] = "1" if mode == "hooked" else "auto"
        instrumentor.instrument(span_exporter=Null())
    d = make_ddp()
    buckets = len(d.reducer._get_zeros_like_grad_buckets())
    if mode == "hooked":
        res["ddp_hook"]["traced"].append(cpu(ddp_steps, d, n_ddp) / (n_ddp * buckets))
        del d
        continue
    python_call(50)
    compiled_calls(5)
    res["python_call"][mode].append(cpu(python_call, n_call) / n_call)
    res["ddp_reducer"][mode].append(cpu(ddp_steps, d, n_ddp) / (n_ddp * buckets))
    if mode == "plain":
        res["ddp_hook"]["plain"].append(res["ddp_reducer"]["plain"][-1])
    res["compiled"][mode].append(cpu(compiled_calls, n_comp) / (n_comp * PER_CALL))
    del d
if instrumentor.is_instrumented_by_opentelemetry:
    instrumentor.uninstrument()

# The Python call, paired in one instrumented process (runtime running): torch's own all_reduce, the
# function Mycroft installs (the compiled hot path where built) and the Python wrapper alone, in alternating
# blocks; per-rep differences share the machine's phase, which instrument() / uninstrument() blocks do not.
from mycroft.instrumentation import patching
from mycroft.instrumentation.ops import C10D_SPECS

plain_fn = dist.all_reduce
os.environ["MYCROFT_HOT_PATH"] = "1"
instrumentor.instrument(span_exporter=Null())
installed_fn = dist.all_reduce
installed_compiled = patching.hot_path_of(installed_fn) is not None  # (uninstrumenting detaches it)
spec = next(s for s in C10D_SPECS if s.api == "all_reduce")
wrapper_fn = patching._collective_wrapper(instrumentor._recorder, spec, plain_fn, hot_path=False)
paired = {"plain": [], "installed": [], "python": []}
fns = [("plain", plain_fn), ("installed", installed_fn), ("python", wrapper_fn)]
for i in range(2 * reps):
    for name, fn in (fns if i % 2 else fns[::-1]):
        paired[name].append(cpu(lambda f=fn: [f(t) for _ in range(n_call)]) / n_call)

# The same, interleaved call by call in a shuffled order, each call timed alone (thread CPU): a call's cost
# swings 2x with the VM's phase from one block to the next, and calls next to each other in time share it,
# so the difference of each quantile is the steadiest in-situ figure. And the hot path alone after a real
# collective: a no-op in torch's place, wrapped and not (what Mycroft adds with the caches as a collective
# leaves them; the same no-op called back to back is the warm figure).
def noop(tensor, op=None, group=None, async_op=False):
    return None


noop_installed = patching._collective_wrapper(instrumentor._recorder, spec, noop, hot_path=True)
clock = time.thread_time_ns
each = {"plain": [], "installed": [], "noop": [], "noop_installed": []}
order = [("plain", plain_fn), ("installed", installed_fn)]
rng = random.Random(reps)
for i in range(4 * n_call):
    rng.shuffle(order)
    for name, fn in order:
        begun = clock()
        fn(t)
        each[name].append(clock() - begun)
    for name, fn in (("noop", noop), ("noop_installed", noop_installed)):
        plain_fn(t)
        begun = clock()
        fn(t)
        each[name].append(clock() - begun)
warm = {"noop": [], "noop_installed": []}
for i in range(4 * n_call):
    for name, fn in (("noop", noop), ("noop_installed", noop_installed)):
        begun = clock()
        fn(t)
        warm[name].append(clock() - begun)
instrumentor.uninstrument()


def quantile_gaps(a, b):
    a, b = sorted(a), sorted(b)
    at = lambda v, q: v[int(q * (len(v) - 1))]
    return {"q25_ns": at(a, .25) - at(b, .25), "median_ns": at(a, .5) - at(b, .5), "q75_ns": at(a, .75) - at(b, .75),
            "plain_median_ns": at(b, .5)}


def spread(a, b):
    """Per-rep differences (median, quartiles), and min(a) - min(b): the VM's noise only ever adds time,
    so each side's least-disturbed block is the steadiest estimate of what the call itself costs."""
    d = sorted(x - y for x, y in zip(a, b))
    return {"median_ns": statistics.median(d), "q1_ns": d[len(d) // 4], "q3_ns": d[(3 * len(d)) // 4],
            "min_based_ns": min(a) - min(b)}


from torch._dynamo.utils import counters

out = {}
for k, v in res.items():
    pairs = sorted(a - b for a, b in zip(v["traced"], v["plain"]))
    out[k] = {"plain_ns": statistics.median(v["plain"]), "traced_ns": statistics.median(v["traced"]),
              "added_median_ns": statistics.median(pairs), "added_min_ns": min(v["traced"]) - min(v["plain"]),
              "pairs_q1_ns": pairs[len(pairs) // 4], "pairs_q3_ns": pairs[(3 * len(pairs)) // 4]}
out["python_call_paired"] = {"plain_ns": statistics.median(paired["plain"]),
                             "compiled": installed_compiled,
                             "installed": spread(paired["installed"], paired["plain"]),
                             "python_wrapper": spread(paired["python"], paired["plain"]),
                             "installed_vs_python": spread(paired["installed"], paired["python"])}
out["python_call_interleaved"] = {"installed": quantile_gaps(each["installed"], each["plain"]),
                                  "hot_path_cold": quantile_gaps(each["noop_installed"], each["noop"]),
                                  "hot_path_warm": quantile_gaps(warm["noop_installed"], warm["noop"]),
                                  "calls": 4 * n_call}
out["ddp_buckets"] = buckets
out["graph_breaks"] = sum(counters["graph_break"].values())
out["recompiles"] = sum(counters["recompiles"].values()) if "recompiles" in counters else 0
print("PER_OP " + json.dumps(out))
dist.destroy_process_group()
'''


def per_op_cost(reps: int, quick: bool) -> dict[str, Any]:
    n_call, n_ddp, n_comp = (500, 10, 50) if quick else (2000, 40, 200)
    result = subprocess.run([sys.executable, "-c", PER_OP, str(reps), str(n_call), str(n_ddp), str(n_comp)],
                            capture_output=True, text=True, timeout=1800, cwd=str(ROOT),
                            env={**os.environ, "OTEL_TRACES_EXPORTER": "none", "OMP_NUM_THREADS": "1"})
    line = next((ln for ln in result.stdout.splitlines() if ln.startswith("PER_OP ")), None)
    if result.returncode != 0 or line is None:
        return {"error": (result.stderr or result.stdout)[-3000:]}
    return dict(json.loads(line[len("PER_OP "):]))


# ------------------------------------------------------------------------------------------ A/B
def ab_ratio(framework: str, steps: int, block: int, grpc_port: int) -> dict[str, Any]:
    """One 4-rank instrumented job switching the instrumentation off / on every `block` steps."""
    with tempfile.TemporaryDirectory(prefix="mycroft-fw-ab-") as out:
        what = launch(framework, "torchrun", ["--steps", str(steps), "--ab-block", str(block), "--ab-out", out])
        env = job_env(f"127.0.0.1:{grpc_port}", f"ab-{framework}", "none", 0, 0, 0, "", 1.0, 0.0)
        log = Path(out) / "job.log"
        with open(log, "wb") as handle:
            proc = subprocess.Popen(what.command, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                    start_new_session=True, cwd=str(ROOT))
        try:
            code = proc.wait(timeout=1200)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_tree(proc)
        if code != 0:
            kept = Path(tempfile.gettempdir()) / f"mycroft-ab-{framework}-{int(time.time())}.log"
            kept.write_bytes(log.read_bytes())  # the whole log: a crash's cause is rarely in the tail
            return {"framework": framework, "error": f"exit {code} (log: {kept}): " +
                    log.read_text(errors="replace")[-2000:]}
        plain, traced, ratio, pairs = ab_times_ratio(Path(out), block)
        cpu_plain, cpu_traced, cpu_ratio, cpu_pairs = ab_times_ratio(Path(out), block, "cpu")
        telemetry = telemetry_share(Path(out))
    return {"framework": framework, "steps": steps, "block": block, "plain_ms": plain * 1e3,
            "traced_ms": traced * 1e3, "ratio": ratio, "pair_ratios": pairs, "cpu_plain_ms": cpu_plain * 1e3,
            "cpu_traced_ms": cpu_traced * 1e3, "cpu_ratio": cpu_ratio, "cpu_pair_ratios": cpu_pairs, **telemetry}


def telemetry_share(out: Path) -> dict[str, float]:
    """The telemetry threads' CPU in the traced blocks (framework_jobs' telemetry-<rank>.txt), as a share of
    the process's CPU and in ms per second of wall time, per rank: what the background costs, per thread,
    free of the step-to-step noise that the process's CPU per step carries."""
    used = cpu = wall = 0.0
    for path in out.glob("telemetry-*.txt"):
        for line in path.read_text().split("\n"):
            if line.strip():
                block_used, block_cpu, block_wall = (float(v) for v in line.split())
                used, cpu, wall = used + block_used, cpu + block_cpu, wall + block_wall
    if not cpu or not wall:
        return {}
    return {"telemetry_share": used / cpu, "telemetry_ms_per_s": used / wall * 1e3}


# ------------------------------------------------------------------------------------------ report
def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


def row_summary(framework: str, launcher: str, results: list[RunResult]) -> dict[str, Any]:
    mine = [r for r in results if r.extra.get("framework") == framework and r.extra.get("launcher") == launcher]
    blocks = [r for r in mine if r.fault == "block" and not r.extra.get("skipped")]
    healthy = [r for r in mine if r.fault == "none" and not r.extra.get("skipped")]
    det = [r.detection_s for r in blocks if r.detection_s is not None]
    skipped = next((r.extra["skipped"] for r in mine if r.extra.get("skipped")), "")
    wrong = [f"rank {r.rank} step {r.step} {r.extra.get('point')}: {r.note.splitlines()[0] if r.note else ''}"
             for r in blocks if not r.correct]
    return {"framework": framework, "launcher": launcher, "runs": len(blocks), "right": sum(r.correct for r in blocks),
            "false_alarms": sum(r.false_alarms for r in blocks),
            "false_alarms_steady": sum(r.extra.get("false_alarms_steady") or 0 for r in blocks),
            "pages_steady": sum(r.extra.get("pages_steady") or 0 for r in blocks),
            "diagnosis_p50_s": percentile(det, 0.5), "diagnosis_p90_s": percentile(det, 0.9),
            "healthy_runs": len(healthy), "healthy_ok": sum(r.correct for r in healthy),
            "healthy_quiet": sum(bool(r.extra.get("quiet")) for r in healthy),
            "healthy_loss_equal": sum(bool(r.extra.get("loss_ok")) for r in healthy),
            "healthy_graph_breaks_ok": sum(bool(r.extra.get("graph_breaks_ok")) for r in healthy),
            "graph_breaks": [(r.extra.get("traced") or {}).get("graph_breaks") for r in healthy],
            "graph_breaks_plain": [(r.extra.get("reference") or {}).get("graph_breaks") for r in healthy],
            "skipped": skipped, "wrong": wrong,
            "healthy_notes": [r.note.splitlines()[0] for r in healthy if not r.correct]}


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"\n{'framework':<20} {'launcher':<16} {'right rank':>10} {'diag p50':>9} {'p90':>7} {'early':>7}  "
          f"{'healthy: quiet / same loss / breaks':<36} note")
    for s in rows:
        if s["skipped"] and not s["runs"] and not s["healthy_runs"]:
            print(f"{s['framework']:<20} {s['launcher']:<16} {'-':>10} {'-':>9} {'-':>7} {'-':>7}  {'-':<36} "
                  f"{s['skipped']}")
            continue
        n = s["healthy_runs"]
        healthy = (f"{s['healthy_quiet']}/{n} {s['healthy_loss_equal']}/{n} {s['healthy_graph_breaks_ok']}/{n}"
                   f" ({','.join(str(g) for g in s['graph_breaks'])} vs "
                   f"{','.join(str(g) for g in s['graph_breaks_plain'])})") if n else "-"
        note = "; ".join(s["wrong"][:1] + s["healthy_notes"][:1])
        early = f"{s.get('false_alarms', 0)}/{s.get('false_alarms_steady', 0)}/{s.get('pages_steady', 0)}"
        print(f"{s['framework']:<20} {s['launcher']:<16} {s['right']:>4}/{s['runs']:<5} "
              f"{_fmt(s['diagnosis_p50_s']):>9} {_fmt(s['diagnosis_p90_s']):>7} {early:>7}  "
              f"{healthy:<36} {note[:160]}")


def totals(rows: list[dict[str, Any]], results: list[RunResult]) -> dict[str, Any]:
    blocks = [r for r in results if r.fault == "block" and not r.extra.get("skipped")]
    healthy = [r for r in results if r.fault == "none" and not r.extra.get("skipped")]
    det = [r.detection_s for r in blocks if r.detection_s is not None]
    return {"block_runs": len(blocks), "right": sum(r.correct for r in blocks),
            "diagnosis_p90_s": percentile(det, 0.9), "diagnosis_p50_s": percentile(det, 0.5),
            "healthy_runs": len(healthy), "healthy_ok": sum(r.correct for r in healthy),
            "healthy_criticals": sum(r.false_alarms for r in healthy),
            "rows_skipped": [f"{s['framework']}/{s['launcher']}: {s['skipped']}" for s in rows if s["skipped"]]}


def print_costs(per_op: dict[str, Any] | None, ab: list[dict[str, Any]]) -> None:
    if per_op:
        print("\nadded training-thread CPU per op (one process, instrument() / uninstrument() blocks; "
              "median of pairs [q1, q3], and min traced - min plain):")
        if "error" in per_op:
            print("  error: " + per_op["error"][-500:])
        for issuer, label in (("python_call", "Python dist.all_reduce (4 KiB)"),
                              ("ddp_reducer", f"DDP bucket ({per_op.get('ddp_buckets')}/step), default"),
                              ("ddp_hook", "DDP bucket, MYCROFT_DDP_HOOK=1"),
                              ("compiled", "compiled funcol all_reduce (fullgraph)")):
            v = per_op.get(issuer)
            if v:
                print(f"  {label:<40} plain {v['plain_ns'] / 1e3:8.2f} us  traced {v['traced_ns'] / 1e3:8.2f} us  "
                      f"added {v['added_median_ns'] / 1e3:+7.2f} us [{v['pairs_q1_ns'] / 1e3:+.2f}, "
                      f"{v['pairs_q3_ns'] / 1e3:+.2f}]  min-based {v['added_min_ns'] / 1e3:+7.2f} us")
        paired = per_op.get("python_call_paired")
        if paired:
            def fmt(v: dict[str, float]) -> str:
                text = f"{v['median_ns'] / 1e3:+.2f} us [{v['q1_ns'] / 1e3:+.2f}, {v['q3_ns'] / 1e3:+.2f}]"
                return text + (f" (min-based {v['min_based_ns'] / 1e3:+.2f})" if "min_based_ns" in v else "")

            print(f"  Python dist.all_reduce, paired in one traced process (plain {paired['plain_ns'] / 1e3:.2f} us): "
                  f"installed ({'compiled hot path' if paired['compiled'] else 'Python wrapper'}) "
                  f"{fmt(paired['installed'])}; Python wrapper alone {fmt(paired['python_wrapper'])}; "
                  f"installed - wrapper {fmt(paired['installed_vs_python'])}")
        inter = per_op.get("python_call_interleaved")
        if inter:
            def gaps(v: dict[str, float]) -> str:
                return f"{v['median_ns'] / 1e3:+.2f} us [{v['q25_ns'] / 1e3:+.2f}, {v['q75_ns'] / 1e3:+.2f}]"

            print(f"  Python dist.all_reduce, interleaved call by call ({inter['calls']} each, plain "
                  f"{inter['installed']['plain_median_ns'] / 1e3:.2f} us): installed {gaps(inter['installed'])} "
                  f"(median, quartiles); the hot path alone after a collective {gaps(inter['hot_path_cold'])}, "
                  f"back to back {gaps(inter['hot_path_warm'])}")
        if "graph_breaks" in per_op:
            print(f"  compiled: {per_op['graph_breaks']} graph breaks, {per_op.get('recompiles')} recompiles "
                  "over the switches")
    for r in ab:
        if "error" in r:
            print(f"A/B {r['framework']}: {r['error'][-300:]}")
            continue
        pairs = r["pair_ratios"]
        print(f"A/B {r['framework']:<18} 4 ranks, switching every {r['block']} steps ({r['steps']} steps): "
              f"median step plain {r['plain_ms']:.2f} ms, traced {r['traced_ms']:.2f} ms, ratio {r['ratio']:.3f}; "
              f"block pairs median {statistics.median(pairs) if pairs else float('nan'):.3f} "
              f"[{min(pairs, default=float('nan')):.2f}-{max(pairs, default=float('nan')):.2f}]")
        cpu = r.get("cpu_pair_ratios")
        if cpu:
            print(f"    {'':<18} process CPU per step: plain {r['cpu_plain_ms']:.2f} ms, traced "
                  f"{r['cpu_traced_ms']:.2f} ms, ratio {r['cpu_ratio']:.3f}; block pairs median "
                  f"{statistics.median(cpu):.3f} [{min(cpu):.2f}-{max(cpu):.2f}]")
        if "telemetry_share" in r:
            print(f"    {'':<18} telemetry threads (Mycroft's, gRPC's) in the traced blocks: "
                  f"{r['telemetry_share'] * 100:.2f}% of the process's CPU, {r['telemetry_ms_per_s']:.2f} ms/s a rank")


def _git() -> dict[str, Any]:
    def run(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, cwd=str(ROOT), timeout=10).stdout
        except (OSError, subprocess.SubprocessError):
            return ""

    dirty = [ln[3:] for ln in run("status", "--porcelain").splitlines() if ln.startswith(" M") or ln.startswith("M")]
    return {"commit": run("rev-parse", "--short", "HEAD").strip(), "modified": dirty}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frameworks", help=f"comma-separated (default: all: {','.join(FRAMEWORKS)})")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="comma-separated launchers")
    parser.add_argument("--cross", action="store_true", help="every framework under every launcher")
    parser.add_argument("--runs", type=int, default=3, help="block runs per row")
    parser.add_argument("--no-healthy", action="store_true", help="skip the healthy runs")
    parser.add_argument("--quick", action="store_true",
                        help=f"one block run per row, frameworks {','.join(QUICK)} (unless --frameworks), "
                        "launchers torchrun,spawn, short cost runs")
    parser.add_argument("--no-costs", action="store_true", help="skip the per-op cost and the A/B")
    parser.add_argument("--costs-only", action="store_true", help="only the per-op cost and the A/B")
    parser.add_argument("--cost-reps", type=int, default=21, help="per-op cost: instrument/uninstrument pairs")
    parser.add_argument("--ab-frameworks", default=",".join(AB_FRAMEWORKS))
    parser.add_argument("--ab-steps", type=int, default=400)
    parser.add_argument("--ab-block", type=int, default=50)
    parser.add_argument("--heartbeat", type=float, default=0.5, help="MYCROFT_HEARTBEAT_INTERVAL of the jobs")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds after the onset to wait for a verdict")
    parser.add_argument("--healthy-steps", type=int, default=12)
    parser.add_argument("--compile-backend", default="aot_eager",
                        help="tp_compiled / compile_fullgraph (inductor works too: ~1 min of compiling per job here)")
    parser.add_argument("--warmup", type=float, default=3.0,
                        help="block runs: seconds after the first step ended before the fault step counts")
    parser.add_argument("--seed", type=int)
    parser.add_argument("--json", help="write every run, the rows and the costs here")
    parser.add_argument("--log-dir", help="keep every job's log here")
    parser.add_argument("--report", metavar="FILE", help="only print the tables of a JSON this script wrote")
    args = parser.parse_args()
    if args.report:
        doc = json.loads(Path(args.report).read_text())
        print(f"{args.report}: {doc.get('meta')}")
        print_table(doc["rows"])
        print(json.dumps(doc.get("totals"), indent=1))
        print_costs(doc.get("per_op"), doc.get("ab") or [])
        return 0
    if args.quick:
        args.runs = 1
        if args.launchers == ",".join(LAUNCHERS):
            args.launchers = "torchrun,spawn"
        args.cost_reps = min(args.cost_reps, 7)
        args.ab_steps = min(args.ab_steps, 200)
    frameworks = args.frameworks.split(",") if args.frameworks else list(QUICK if args.quick else FRAMEWORKS)
    launchers = args.launchers.split(",")
    bad = [f for f in frameworks if f not in FRAMEWORKS] + [la for la in launchers if la not in LAUNCHERS]
    if bad:
        parser.error(f"unknown: {bad}; frameworks {sorted(FRAMEWORKS)}, launchers {LAUNCHERS}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    rows = [] if args.costs_only else plan_rows(frameworks, launchers, args.cross)
    started = time.time()
    meta = {"seed": seed, **_git(), "host": platform.node(), "cpus": os.cpu_count(), "argv": sys.argv[1:],
            "heartbeat_s": args.heartbeat, "started_unix": started}
    dirty = " + uncommitted " + ",".join(meta["modified"]) if meta["modified"] else ""
    print(f"framework matrix: {len(rows)} rows x ({args.runs} block + {0 if args.no_healthy else 1} healthy), "
          f"seed {seed}, commit {meta['commit']}{dirty}", flush=True)
    results: list[RunResult] = []
    per_op: dict[str, Any] | None = None
    ab: list[dict[str, Any]] = []
    interruptible()
    srun_cm: contextlib.AbstractContextManager[Any] = contextlib.nullcontext(None)
    if any(la == "srun" for _, la in rows):
        why = slurm_unavailable()
        if why:
            print(f"srun rows: not run ({why})", flush=True)
        else:
            srun_cm = slurm()
    with local_rca() as rca, srun_cm as srun, contextlib.suppress(KeyboardInterrupt):
        for k, (framework, launcher) in enumerate(rows, 1):
            for _ in range(args.runs):
                rank = rng.randrange(4)
                step = rng.randint(1, 5)  # the 1st..5th step after the warm-up
                point = rng.choice(POINTS)
                r = run_block(rca, framework, launcher, rank=rank, step=step, point=point, seed=rng.randrange(1000),
                              heartbeat=args.heartbeat, timeout_s=args.timeout, log_dir=args.log_dir, srun=srun,
                              warmup_s=args.warmup, compile_backend=args.compile_backend)
                results.append(r)
                where = "before init" if framework == "startup" else \
                    f"step {r.extra.get('onset_step', '?')} (+{step}) {point}"
                det = "-" if r.detection_s is None else f"{r.detection_s:.2f}s"
                print(f"[{k}/{len(rows)}] {framework:<20} {launcher:<16} block rank {rank} {where:<26} "
                      f"{'OK ' if r.correct else 'BAD'} diag {det:<6} ({r.note.splitlines()[0] if r.note else ''})",
                      flush=True)
                if r.extra.get("skipped"):
                    break
            if not args.no_healthy:
                h_seed = rng.randrange(1000)
                h = run_healthy(rca, framework, launcher, seed=h_seed, steps=args.healthy_steps,
                                heartbeat=args.heartbeat, log_dir=args.log_dir, srun=srun,
                                compile_backend=args.compile_backend)
                results.append(h)
                print(f"[{k}/{len(rows)}] {framework:<20} {launcher:<16} healthy seed {h_seed:<19} "
                      f"{'OK ' if h.correct else 'BAD'} ({h.note.splitlines()[0] if h.note else ''})", flush=True)
        if not args.no_costs:
            per_op = per_op_cost(args.cost_reps, args.quick)
            from mycroft.otlp_server import OtlpReceiver

            receiver = OtlpReceiver(lambda records: None, "127.0.0.1:0", None).start()
            try:
                for framework in args.ab_frameworks.split(","):
                    if framework:
                        ab.append(ab_ratio(framework, args.ab_steps, args.ab_block, int(receiver.grpc_port or 0)))
            finally:
                receiver.stop(0)
    took = time.time() - started
    summaries = [row_summary(f, la, results) for f, la in rows]
    print_table(summaries)
    tot = totals(summaries, results)
    n = max(1, tot["block_runs"])
    if rows:
        print(f"\nblock runs: right rank {tot['right']}/{tot['block_runs']} ({100 * tot['right'] / n:.0f}%, "
              "goal 100%), "
              f"diagnosis p50 {_fmt(tot['diagnosis_p50_s'])} p90 {_fmt(tot['diagnosis_p90_s'])} (goal <= 2 s); "
              f"healthy {tot['healthy_ok']}/{tot['healthy_runs']} clean, {tot['healthy_criticals']} critical "
              f"incidents + alerts (goal 0)")
    for line in tot["rows_skipped"]:
        print(f"not run: {line}")
    print_costs(per_op, ab)
    print(f"\n{len(results)} runs in {took / 60:.1f} min")
    if args.json:
        meta["took_s"] = took
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": summaries, "totals": tot, "per_op": per_op,
                                               "ab": ab, "runs": [asdict(r) for r in results]}, indent=2,
                                              default=str))
    ok = rows and tot["right"] == tot["block_runs"] and tot["healthy_ok"] == tot["healthy_runs"]
    return 0 if ok or args.costs_only else 1


if __name__ == "__main__":
    sys.exit(main())
