"""A script that never initialises torch.distributed: must run exactly as before."""

import sys
import threading

import torch

x = torch.ones(3) * 2
print("RESULT", x.sum().item())
print("THREADS", sorted(t.name for t in threading.enumerate() if t.name.startswith("mycroft")))
import torch.distributed as dist  # noqa: E402
from mycroft.instrumentation import patching  # noqa: E402

print("PATCHED", patching.installed_by_us(dist.all_reduce))
sys.exit(3)
