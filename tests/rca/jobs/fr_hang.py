"""Rank 1 sleeps before the 6th all_reduce; after 2.5 s every rank dumps its Flight Recorder and exits."""

import json
import os
import threading
import time

import torch
import torch.distributed as dist


def dump_then_exit(rank: int) -> None:
    time.sleep(2.5)
    trace = torch._C._distributed_c10d._dump_fr_trace_json(True, False)
    text = trace if isinstance(trace, str) else trace.decode()
    json.loads(text)
    path = os.path.join(os.environ["FR_OUT"], f"fr_rank_{rank}.json")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    os._exit(0)


dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1024)
for _step in range(1, 6):
    dist.all_reduce(t)
threading.Thread(target=dump_then_exit, args=(rank,), daemon=True).start()
if rank == 1:
    time.sleep(3600)
dist.all_reduce(t)
time.sleep(3600)
