"""A 4-rank gloo loop of all_reduce where one rank arrives late at one step.

    straggler.py --steps 6 --slow-rank 2 --slow-step 3 --delay 0.6
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--slow-rank", type=int, default=2)
    parser.add_argument("--slow-step", type=int, default=3)
    parser.add_argument("--delay", type=float, default=0.6)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    tensor = torch.ones(4096)
    for step in range(args.steps):
        if rank == args.slow_rank and step == args.slow_step:
            time.sleep(args.delay)
        dist.all_reduce(tensor)
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()
    print(f"DONE rank={rank} pid={os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
