"""The benchmark's training loop: a small MLP step plus collectives, timed per step.

Args: --steps N --collectives-per-step K --size ELEMENTS --rate STEPS_PER_S (0 = flat out) --out DIR
"""

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--collectives-per-step", type=int, default=1)
    parser.add_argument("--size", type=int, default=65536)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    buffer = torch.zeros(args.size)
    times = []
    period = 1.0 / args.rate if args.rate else 0.0
    next_start = time.perf_counter()
    for _ in range(args.steps):
        if period:
            delay = next_start - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            next_start += period
        started = time.perf_counter()
        model(torch.randn(32, 256)).sum().backward()
        for _ in range(args.collectives_per_step):
            dist.all_reduce(buffer)
        times.append(time.perf_counter() - started)
    dist.barrier()
    with open(os.path.join(args.out, f"steps-{rank}.txt"), "w") as handle:
        handle.write("\n".join(f"{t:.7f}" for t in times))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
