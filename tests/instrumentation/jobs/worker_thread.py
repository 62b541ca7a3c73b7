"""A Ray-Train-like rank: the main thread waits in a framework loop while a worker thread runs the training
and issues every collective; one rank's worker then stops in user code (`stuck_in_the_worker_thread`)."""

from __future__ import annotations

import argparse
import os
import threading
import time

import torch
import torch.distributed as dist


def stuck_in_the_worker_thread(seconds: float) -> None:
    time.sleep(seconds)


def train(steps: int, stuck_rank: int, stuck_s: float) -> None:
    t = torch.ones(64)
    for step in range(steps):
        dist.all_reduce(t)
        if step == steps // 2 and dist.get_rank() == stuck_rank:
            stuck_in_the_worker_thread(stuck_s)
        time.sleep(0.02)


def framework_main_loop(worker: threading.Thread) -> None:
    while worker.is_alive():
        worker.join(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--stuck-rank", type=int, default=1)
    parser.add_argument("--stuck-seconds", type=float, default=3.0)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    worker = threading.Thread(target=train, args=(args.steps, args.stuck_rank, args.stuck_seconds),
                              name="train-worker")
    worker.start()
    framework_main_loop(worker)
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {os.environ.get('RANK')} done", flush=True)


if __name__ == "__main__":
    main()
