"""DDP on the NCCL-semantics CPU backend; one rank stops before a step's forward for a while.

Mycroft keeps DDP's built-in (C++) all-reduce on NCCL-like backends: the bucket all-reduces
are seen through the Flight Recorder only. Args: --steps N --late-rank R --late-step S
--late-seconds X. Prints "PID <rank> <pid>" and "LATE <rank>".
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
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--late-rank", type=int, default=-1)
    parser.add_argument("--late-step", type=int, default=-1)
    parser.add_argument("--late-seconds", type=float, default=0.0)
    args = parser.parse_args()
    nccl_like.register()
    dist.init_process_group(nccl_like.BACKEND)
    rank = dist.get_rank()
    print(f"PID {rank} {os.getpid()}", flush=True)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
    for step in range(args.steps):
        if rank == args.late_rank and step == args.late_step:
            print(f"LATE {rank} step={step}", flush=True)
            wait_here_on_purpose(args.late_seconds)
        model(torch.randn(8, 64)).sum().backward()
        nccl_like.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
