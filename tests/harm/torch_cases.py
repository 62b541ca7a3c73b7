"""PyTorch's own torch.distributed test bodies as one spawn test class, as PyTorch's
test/distributed/test_distributed_spawn.py builds it: TestDistBackend (2 ranks started with
multiprocessing spawn, each `init_process_group(backend, file:// store)`) + DistributedTest._DistTestBase.

Imported by the driver (tests/harm/torch_suite.py) after it set BACKEND, WORLD_SIZE, TEMP_DIR and
INIT_METHOD, and by each spawned rank, which inherits that environment and unpickles the class from here.
A probe test of ours rides along: each rank writes whether Mycroft is loaded and patched torch.distributed.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.distributed_test import DistributedTest, TestDistBackend

PROBE_DIR_ENV = "MYCROFT_HARM_PROBE_DIR"
PROBE_TEST = "test_zz_mycroft_harm_probe"


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):  # type: ignore[misc]
    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()

    def test_zz_mycroft_harm_probe(self) -> None:
        """Not PyTorch's: proves (or disproves) that the ranks of this run carry Mycroft."""
        loaded = "mycroft.instrumentation.patching" in sys.modules
        patched, source = False, ""
        if loaded:
            from mycroft.instrumentation import patching

            patched, source = bool(patching.installed_by_us(dist.all_reduce)), patching.__file__
        tensor = torch.ones(4)
        dist.all_reduce(tensor)  # one traced collective the collector can see
        assert tensor.tolist() == [float(dist.get_world_size())] * 4
        folder = os.environ.get(PROBE_DIR_ENV)
        if folder:
            with open(os.path.join(folder, f"probe-{dist.get_rank()}.json"), "w") as out:
                json.dump({"rank": dist.get_rank(), "loaded": loaded, "patched": patched, "source": source}, out)


_backend = os.environ["BACKEND"]
_init = "NoInitFile" if os.environ.get("INIT_METHOD", "env://") == "env://" else ""
_name = f"TestDistBackendWithSpawn{_backend.upper()}{_init}"  # the spawned ranks unpickle it by this name
TestDistBackendWithSpawn.__name__ = TestDistBackendWithSpawn.__qualname__ = _name
globals()[TestDistBackendWithSpawn.__name__] = TestDistBackendWithSpawn
