"""DDP (C++ bucket all-reduces), a Python all_gather and a functional all_reduce per step, on gloo or the
NCCL-like backend: every world collective should reach the trace backend, one trace per collective.

Args: --backend gloo|nccl_like --steps N --unused (find_unused_parameters: the bitmap all-reduce too).
Prints "ISSUED <rank> <world collectives issued>" at the end (torch's own counter for the group).
"""

import argparse

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(256, 256)
        self.b = torch.nn.Linear(256, 4)
        self.spare = torch.nn.Linear(4, 4)  # used only with --unused off... never: find_unused_parameters' case

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--unused", action="store_true")
    args = parser.parse_args()
    if args.backend == "nccl_like":
        from mycroft.faults import nccl_like

        nccl_like.register()
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net()
    if not args.unused:
        net.spare = None  # type: ignore[assignment]
    # two buckets: the 256x256 weight fills one (its 256 KB over the 0.2 MB cap), the rest another
    model = DDP(net, bucket_cap_mb=0.2, find_unused_parameters=args.unused)
    for _ in range(args.steps):
        model(torch.randn(8, 256)).sum().backward()
        out = [torch.empty(4) for _ in range(dist.get_world_size())]
        dist.all_gather(out, torch.full((4,), float(rank)))
        funcol.all_reduce(torch.ones(16), "sum", dist.group.WORLD).wait()
    if args.backend == "nccl_like":
        nccl_like.synchronize()
    print(f"ISSUED {rank} {dist.group.WORLD._get_sequence_number_for_group()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
