"""DDP (no comm hook: the bucket all-reduces run from the C++ reducer) where one rank turns slow.

Environment: STRAGGLER_RANK (-1: none), STRAGGLER_EXTRA_S (its extra time per step, default 0.1),
STRAGGLER_AFTER_S (from when, default 8), STRAGGLER_ONSET_FILE (it writes {"onset": time} there),
STRAGGLER_STEPS (default: until killed), STRAGGLER_BUSY=1 (the extra time is spent computing, a
throttled device's way, instead of sleeping, a slow data loader's). SLOW_IMPORT_RANK / SLOW_IMPORT_S:
that rank spends that long importing a module before it builds DDP (a slow start: its peers wait
in DDP's construction).
"""

import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
if rank == int(os.environ.get("SLOW_IMPORT_RANK", "-1")):
    import sys
    import tempfile

    where = tempfile.mkdtemp(prefix="slow-import-")
    with open(os.path.join(where, "slow_module.py"), "w") as handle:
        handle.write(f"import time\ntime.sleep({float(os.environ.get('SLOW_IMPORT_S', '5'))})\n")
    sys.path.insert(0, where)
    import slow_module  # noqa: F401
layers = [torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256), torch.nn.ReLU(),
          torch.nn.Linear(256, 8)]
model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=0.5)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow_rank = int(os.environ.get("STRAGGLER_RANK", "-1"))
extra_s = float(os.environ.get("STRAGGLER_EXTRA_S", "0.1"))
after_s = float(os.environ.get("STRAGGLER_AFTER_S", "8"))
onset_file = os.environ.get("STRAGGLER_ONSET_FILE", "")
busy = os.environ.get("STRAGGLER_BUSY") == "1"
steps = int(os.environ.get("STRAGGLER_STEPS", "0")) or 10**9
start = time.time()
slow = False
for step in range(steps):
    if rank == slow_rank and time.time() - start >= after_s:
        if not slow and onset_file:
            with open(onset_file, "w") as handle:
                json.dump({"onset": time.time(), "step": step}, handle)
        slow = True
        until = time.perf_counter() + extra_s  # the straggler's extra time (its peers wait in the all-reduce)
        while busy and time.perf_counter() < until:
            torch.mm(torch.ones(64, 64), torch.ones(64, 64))
        time.sleep(max(0.0, until - time.perf_counter()))
    x, y = torch.randn(32, 256), torch.randn(32, 8)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
dist.destroy_process_group()
