"""DDP (2 ranks): rank 1 spends 3 s between forward and backward at step 2; rank 0 waits in the bucket all-reduce."""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1)))
for step in range(4):
    out = model(torch.ones(4, 8)).sum()
    if rank == 1 and step == 2:
        time.sleep(3.0)
    out.backward()
dist.destroy_process_group()
