"""The worker of benchmarks/gpu_check.py: a short training loop on NCCL (GPU) or on the nccl_like simulator (CPU).

Each step: a little compute, an all_reduce (returns at enqueue on both backends), then the
step's `.item()` — the host waits for the device there. Options put a long kernel before one
step's all_reduce (torch.cuda._sleep / nccl_like.sleep_on_stream) or make one rank stop
before a step's all_reduce for good (the hang). At the end each rank writes a JSON report:
step times, the call time of the kernel step's all_reduce, and what its NCCL profiler ring
holds (read without consuming it: communicators with the ABI version NCCL picked, record
counts per kind).

    torchrun --nproc-per-node 2 benchmarks/jobs/gpu_job.py --backend nccl --out DIR [...]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def wait_here_on_purpose(seconds: float) -> None:
    time.sleep(seconds)


def ring_summary() -> dict[str, Any]:
    """This process's ring, looked at (not consumed): what reached it from NCCL."""
    try:
        from mycroft.native import ring as ringmod
    except Exception as exc:  # pragma: no cover - the package is installed with the checker
        return {"error": repr(exc)}
    path = ringmod.ring_path(os.getpid(), os.environ.get("MYCROFT_NATIVE_RING_DIR") or None)
    if not Path(path).exists():
        return {"exists": False, "path": str(path)}
    ring = ringmod.Ring(path, writable=False)
    try:
        records = list(ring.records())
        counters = ring.counters()
    finally:
        ring.close()
    kinds = Counter(rec.kind_name for rec in records)
    comms = [{"comm": f"{rec.comm_hash:016x}", "name": rec.fields.get("name", ""), "nranks": rec.fields.get("nranks"),
              "rank": rec.rank, "api_version": rec.fields.get("api_version")}
             for rec in records if rec.kind == ringmod.REC_COMM]
    return {"exists": True, "path": str(path), "kinds": dict(kinds), "comms": comms,
            "dropped_records": int(counters["dropped_records"]), "dropped_events": int(counters["dropped_events"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=["nccl", "nccl_like"], default="nccl")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--size", type=int, default=1 << 20, help="all_reduce elements (float32)")
    parser.add_argument("--kernel-step", type=int, default=-1)
    parser.add_argument("--kernel-seconds", type=float, default=0.3)
    parser.add_argument("--hang-rank", type=int, default=-1)
    parser.add_argument("--hang-step", type=int, default=-1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    if args.backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        index = 0 if os.environ.get("MYCROFT_GPU_CHECK_SHARED_GPU") == "1" else local
        torch.cuda.set_device(index)
        device = torch.device("cuda", index)
        dist.init_process_group("nccl", device_id=device)
        # cycles per second of torch.cuda._sleep, measured once with CUDA events
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(20_000_000)
        stop.record()
        stop.synchronize()
        cycles_per_s = 20_000_000 / (start.elapsed_time(stop) / 1000.0)

        def long_kernel(seconds: float) -> None:
            torch.cuda._sleep(int(seconds * cycles_per_s))

        def host_sync(t: torch.Tensor) -> float:
            return float(t[0].item())  # the step's loss.item(): the host waits for the device
    else:
        from mycroft.faults import nccl_like

        nccl_like.register()
        dist.init_process_group(nccl_like.BACKEND)
        device = torch.device("cpu")

        def long_kernel(seconds: float) -> None:
            nccl_like.sleep_on_stream(seconds)

        def host_sync(t: torch.Tensor) -> float:
            nccl_like.synchronize()  # plays the .item() / cuda.synchronize() of a GPU step
            return float(t[0].item())

    rank = dist.get_rank()
    print(f"PID {rank} {os.getpid()}", flush=True)
    grad = torch.ones(args.size, device=device)
    weight = torch.randn(256, 256, device=device)
    step_times: list[float] = []
    kernel_call_s = None
    for step in range(args.steps):
        started = time.perf_counter()
        if rank == args.hang_rank and step == args.hang_step:
            print(f"HANG {rank} step={step}", flush=True)
            wait_here_on_purpose(3600)
        act = weight @ weight  # a little compute before the collective
        grad.mul_(0.5).add_(act[0, 0] * 0)
        if step == args.kernel_step:
            long_kernel(args.kernel_seconds)
        called = time.perf_counter()
        dist.all_reduce(grad)
        if step == args.kernel_step:
            kernel_call_s = time.perf_counter() - called
        host_sync(grad)
        step_times.append(time.perf_counter() - started)
    report = {"rank": rank, "world_size": dist.get_world_size(), "backend": args.backend,
              "step_times": step_times, "kernel_step": args.kernel_step, "kernel_call_s": kernel_call_s,
              "ring": ring_summary()}
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
