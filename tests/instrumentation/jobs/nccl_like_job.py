"""A training loop on the NCCL-semantics CPU backend: ops return at enqueue, the host syncs later.

Each step: compute, all_reduce (returns at once), then synchronize() — the step's
`loss.item()` / `torch.cuda.synchronize()`. One rank may stop before a step's all_reduce.

Args: --steps N --late-rank R --late-step S --late-seconds X [--extra-ops]
      [--kernel-step S --kernel-seconds X]
Prints "PID <rank> <pid>", "LATE <rank>" when it starts sleeping, and per step
"CALL <rank> <step> <seconds the all_reduce call took>".
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

from mycroft.faults import nccl_like


def wait_here_on_purpose(seconds: float) -> None:
    time.sleep(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--late-rank", type=int, default=-1)
    parser.add_argument("--late-step", type=int, default=-1)
    parser.add_argument("--late-seconds", type=float, default=0.0)
    parser.add_argument("--extra-ops", action="store_true", help="also sync send/recv, barrier, async ops")
    parser.add_argument("--kernel-step", type=int, default=-1, help="a long 'kernel' before this step's op")
    parser.add_argument("--kernel-seconds", type=float, default=0.0)
    parser.add_argument("--size", type=int, default=1024)
    args = parser.parse_args()
    nccl_like.register()
    dist.init_process_group(nccl_like.BACKEND)
    rank, world = dist.get_rank(), dist.get_world_size()
    print(f"PID {rank} {os.getpid()}", flush=True)
    grad = torch.zeros(args.size)
    for step in range(args.steps):
        if rank == args.late_rank and step == args.late_step:
            print(f"LATE {rank} step={step}", flush=True)
            wait_here_on_purpose(args.late_seconds)
        grad.copy_(torch.randn(args.size))
        if step == args.kernel_step:
            nccl_like.sleep_on_stream(args.kernel_seconds)  # plays torch.cuda._sleep: the op queues behind it
        started = time.perf_counter()
        dist.all_reduce(grad)
        print(f"CALL {rank} {step} {time.perf_counter() - started:.6f}", flush=True)
        nccl_like.synchronize()  # the step's loss.item(): the host waits for the device
    if args.extra_ops:
        peer = rank ^ 1
        if peer < world:
            buf = torch.full((8,), float(rank))
            if rank % 2 == 0:
                dist.send(buf, peer)
                dist.recv(buf, peer)
            else:
                dist.recv(buf, peer)
                dist.send(buf, peer)
        work = dist.all_reduce(grad, async_op=True)
        work.wait()
        dist.barrier()
        nccl_like.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
