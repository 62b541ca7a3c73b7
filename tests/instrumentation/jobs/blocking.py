"""A small training loop where one rank stops before a collective for a while.

Args: --steps N --block-rank R --block-step S --block-seconds X [--step-sleep Y]
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def wait_here_on_purpose(seconds: float) -> None:
    time.sleep(seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--block-rank", type=int, default=-1)
    parser.add_argument("--block-step", type=int, default=-1)
    parser.add_argument("--block-seconds", type=float, default=0.0)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--out", default="", help="directory for steptimes-<rank>.txt")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"PID {rank} {os.getpid()}", flush=True)
    model = torch.nn.Linear(args.size // 16, 16)
    grad = torch.zeros(args.size)
    step_times = []
    for step in range(args.steps):
        started = time.perf_counter()
        if rank == args.block_rank and step == args.block_step:
            print(f"BLOCKING {rank} step={step}", flush=True)
            wait_here_on_purpose(args.block_seconds)
        loss = model(torch.randn(8, args.size // 16)).sum()
        loss.backward()
        grad.copy_(torch.randn(args.size))
        dist.all_reduce(grad)
        if args.step_sleep:
            time.sleep(args.step_sleep)
        step_times.append(time.perf_counter() - started)
    if args.out:
        with open(os.path.join(args.out, f"steptimes-{rank}.txt"), "w") as handle:
            handle.write("\n".join(f"{t:.6f}" for t in step_times))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
