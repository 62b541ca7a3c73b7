"""Shared bits of the framework examples: options, the simulated hang, the result line.

Every script accepts ``--steps N --seed S`` and, to inject a hang,
``--block-rank R --block-step S --block-point {before_forward,between_fwd_bwd,before_step}``:
rank R sleeps forever at that point of step S, so its peers block in the next collective.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import torch

BLOCK_POINTS = ("before_forward", "between_fwd_bwd", "before_step")


def parse_args(description: str, steps: int = 20, extra=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-rank", type=int, default=-1, help="rank that hangs (-1: none)")
    p.add_argument("--block-step", type=int, default=0, help="step at which it hangs")
    p.add_argument("--block-point", choices=BLOCK_POINTS, default="before_forward")
    if extra is not None:
        extra(p)
    return p.parse_args()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def maybe_block(args: argparse.Namespace, rank: int, step: int, point: str) -> None:
    """The simulated hang: the chosen rank stops at the chosen point, forever."""
    if rank == args.block_rank and step == args.block_step and point == args.block_point:
        print(f"rank {rank}: blocking at step {step} {point}", file=sys.stderr, flush=True)
        while True:
            time.sleep(1.0)


def regression_data(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Generator]:
    """The MLP examples' data (x: 1024 x 32, y = x @ w + noise) and the generator that drew it, which
    then shuffles their DataLoader: the same draws, so the same loss, in every script."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 32, generator=g)
    y = x @ torch.randn(32, 1, generator=g) + 0.1 * torch.randn(1024, 1, generator=g)
    return x, y, g


def regression_mlp() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def report(loss: float) -> None:
    if rank() == 0:
        print(f"final_loss={loss:.6f}", flush=True)
