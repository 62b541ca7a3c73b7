"""What completion-from-the-device costs (issue 9): per op on the training thread, in the poller, and DDP's hook.

    .venv/bin/python benchmarks/completion_overhead.py [--blocks 21]

All in one process (world size 1), interleaved blocks, medians of the training thread's own
CPU time (time.thread_time: preemption and GIL waits on a shared 2-vCPU VM drop out; work on
other threads — gloo's, the simulated stream, Mycroft's exporter — is not counted):

1. per collective call on the training thread, the wrapper around a stand-in for the C++ call
   (so only Mycroft's work is timed): on a host-synchronous group (gloo: record, complete at
   return) and on a device-async group (the nccl_like simulator: the sync call re-issued
   async_op=True and waited, the Work handed to the completion tracker);
2. the same with the real calls: gloo all_reduce, and nccl_like all_reduce (enqueue on the
   simulated stream), plain vs traced;
3. the completion poller's own CPU time per op it completes (it runs beside the training
   thread and takes the GIL to poll);
4. DDP: a step of a small model with Mycroft's comm hook (the bucket all-reduce routed
   through the tracer) against the same model with DDP's built-in C++ all-reduce.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

BENCH = r'''
import json, statistics, sys, tempfile, time
import torch, torch.distributed as dist
from mycroft.faults import nccl_like
from mycroft.instrumentation.instrumentor import MycroftInstrumentor
from mycroft.instrumentation.ops import C10D_SPECS
from mycroft.instrumentation import patching
from mycroft.instrumentation.patching import _collective_wrapper
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

BLOCKS = int(sys.argv[1])

class Null(SpanExporter):
    def export(self, spans): return SpanExportResult.SUCCESS

class DoneWork:
    """Stands for a Work that the device already finished."""
    def wait(self, timeout=None): return True
    def is_completed(self): return True
    def exception(self): return None
    def get_future(self): return None

nccl_like.register()
instrumentor = MycroftInstrumentor()
instrumentor.instrument(span_exporter=Null())
tmp = tempfile.mkdtemp()
dist.init_process_group("gloo", init_method=f"file://{tmp}/s", rank=0, world_size=1)
device_group = dist.new_group([0], backend=nccl_like.BACKEND)
recorder = instrumentor._recorder
spec = next(s for s in C10D_SPECS if s.api == "all_reduce")

def standin(tensor, op=None, group=None, async_op=False):  # the C++ call, returning what NCCL would
    return DoneWork() if async_op else None

traced_standin = _collective_wrapper(recorder, spec, standin)
t = torch.ones(1024)

def block(fn, n, **kw):
    # CPU time of this (the training) thread: preemption and GIL waits on a loaded machine drop out
    start = time.thread_time_ns()
    for _ in range(n):
        fn(t, **kw)
    return (time.thread_time_ns() - start) / n

real_traced = dist.all_reduce
real_plain = patching.original_of(real_traced)
cases = {
    "standin_gloo_plain": (standin, 5000, {}),
    "standin_gloo_traced": (traced_standin, 5000, {}),
    "standin_device_plain": (standin, 5000, {"group": device_group}),
    "standin_device_traced": (traced_standin, 5000, {"group": device_group}),
    "gloo_plain": (real_plain, 500, {}),
    "gloo_traced": (real_traced, 500, {}),
    "nccl_like_plain": (real_plain, 300, {"group": device_group}),
    "nccl_like_traced": (real_traced, 300, {"group": device_group}),
}
# the poller's CPU time: wrap its poll() with a thread-CPU clock
tracker = recorder.completion
poll_cpu = [0.0]
completed = [0]
original_poll = tracker.poll
def timed_poll():
    t0 = time.thread_time()
    done = original_poll()
    poll_cpu[0] += time.thread_time() - t0
    completed[0] += done
    return done
tracker.poll = timed_poll

for _ in range(2):
    for fn, n, kw in cases.values():
        block(fn, n // 5, **kw)
nccl_like.synchronize()
results = {name: [] for name in cases}
for _ in range(BLOCKS):
    for name, (fn, n, kw) in cases.items():
        results[name].append(block(fn, n, **kw))
        if name.startswith("nccl_like"):
            nccl_like.synchronize()
out = {name: statistics.median(v) for name, v in results.items()}
time.sleep(0.2)
out["poller_cpu_us_per_completion"] = poll_cpu[0] * 1e6 / max(1, completed[0])
out["poller_completions"] = completed[0]
out["poller_polls"] = tracker.polls

# DDP: Mycroft's hook vs the built-in C++ all-reduce, same model shape, interleaved
from torch.nn.parallel import DistributedDataParallel as DDP
def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(8)])
hooked = DDP(model(), bucket_cap_mb=0.01)  # constructed under instrumentation: our hook
builtin = DDP.__new__(DDP)
DDP.__init__.__wrapped__(builtin, model(), bucket_cap_mb=0.01)  # the original constructor: no hook
x = torch.randn(16, 64)
def ddp_block(m, n=50):
    start = time.thread_time_ns()
    for _ in range(n):
        m(x).sum().backward()
    return (time.thread_time_ns() - start) / n
for _ in range(3):
    ddp_block(hooked, 10); ddp_block(builtin, 10)
hook_ns, builtin_ns = [], []
for _ in range(BLOCKS):
    hook_ns.append(ddp_block(hooked)); builtin_ns.append(ddp_block(builtin))
reducer = hooked.reducer
buckets = len(reducer._get_zeros_like_grad_buckets()) if hasattr(reducer, "_get_zeros_like_grad_buckets") else None
out["ddp_step_hooked_ns"] = statistics.median(hook_ns)
out["ddp_step_builtin_ns"] = statistics.median(builtin_ns)
out["ddp_buckets"] = buckets
print(json.dumps(out))
instrumentor.uninstrument()
dist.destroy_process_group()
'''


def measure(blocks: int) -> dict[str, float]:
    proc = subprocess.run([sys.executable, "-c", BENCH, str(blocks)], capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "OTEL_TRACES_EXPORTER": "none", "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=21)
    parser.add_argument("--json", action="store_true", help="print the raw figures as JSON")
    args = parser.parse_args()
    r = measure(args.blocks)
    if args.json:
        print(json.dumps(r, indent=2))
        return
    us = 1000.0
    gloo_added = (r["standin_gloo_traced"] - r["standin_gloo_plain"]) / us
    device_added = (r["standin_device_traced"] - r["standin_device_plain"]) / us
    print("added CPU per collective call on the training thread (wrapper around a stand-in for the C++ call):")
    print(f"  gloo path (complete at return):            {gloo_added:.2f} us")
    print(f"  device path (async + wait + tracker add):  {device_added:.2f} us  "
          f"({device_added / gloo_added:.2f}x the gloo path)")
    print("real calls, world size 1, 4 KiB all_reduce (training-thread CPU):")
    for name in ("gloo", "nccl_like"):
        plain, traced = r[f"{name}_plain"] / us, r[f"{name}_traced"] / us
        print(f"  {name:10s} plain {plain:8.2f} us, traced {traced:8.2f} us (+{traced - plain:.2f} us)")
    print(f"completion poller: {r['poller_cpu_us_per_completion']:.2f} us CPU per op it completed "
          f"({r['poller_completions']:.0f} ops in {r['poller_polls']:.0f} polls)")
    hooked, builtin = r["ddp_step_hooked_ns"] / us, r["ddp_step_builtin_ns"] / us
    buckets = r.get("ddp_buckets")
    per_bucket = f", {(hooked - builtin) / buckets:.2f} us per bucket" if buckets else ""
    print(f"DDP forward+backward, 8 Linear(64,64), small buckets ({buckets} buckets), gloo world 1: "
          f"built-in {builtin:.1f} us, Mycroft hook {hooked:.1f} us (+{hooked - builtin:.1f} us per step"
          f"{per_bucket}; ratio {hooked / builtin:.3f})")


if __name__ == "__main__":
    main()
