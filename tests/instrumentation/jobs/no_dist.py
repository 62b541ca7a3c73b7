"""A script that never initialises torch.distributed: must run exactly as before."""

import sys
import threading

import torch

x = torch.ones(3) * 2
print("RESULT", x.sum().item())
print("THREADS", sorted(t.name for t in threading.enumerate() if t.name.startswith("mycroft")))
import torch.distributed as dist  # noqa: E402

print("PATCHED", getattr(dist.all_reduce, "__mycroft_wrapped__", False))
sys.exit(3)
