"""The hot path's ring read again from inside its own reads: a garbage collection started by the allocation
of an OpRecord runs gc.callbacks, which here drain the ring and copy its in-flight and done ops (as a
runtime thread taking the GIL at that instant would). Prints, as JSON, each seq's count over every drain
and whether the copies made inside were whole. Run by test_compiled_hot_path.py in a subprocess: a slot read
half-released crashes the process."""

from __future__ import annotations

import collections
import gc
import json
import tempfile

import torch
import torch.distributed as dist
from mycroft.instrumentation import patching
from mycroft.instrumentation.recorder import Recorder

OPS = 64


def main() -> None:
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    recorder = Recorder(4096)
    recorder.world_rank = 0
    patcher = patching.Patcher()
    patching.install(patcher, recorder, None, lambda: None, lambda: None, hot_path=True)
    t = torch.ones(8)
    seqs: collections.Counter[int] = collections.Counter()
    copies_whole = []
    inside = []

    def reenter(phase: str, info: dict[str, int]) -> None:
        if phase != "start" or inside:
            return
        inside.append(1)
        try:
            copies = recorder.snapshot_inflight() + recorder.done_not_taken()
            copies_whole.append(all(r.api and r.group is not None and r.seq > 0 for r in copies))
            seqs.update(r.seq for r in recorder.take_done())
        finally:
            inside.pop()

    for _ in range(OPS):
        dist.all_reduce(t)
    taken_by_ring = recorder.ring.taken
    gc.callbacks.append(reenter)
    gc.set_threshold(1)  # a collection at (nearly) every allocation of a tracked object
    try:
        for _ in range(3):
            copies = recorder.done_not_taken()
            copies_whole.append(all(r.api and r.seq > 0 for r in copies))
        seqs.update(r.seq for r in recorder.take_done())
    finally:
        gc.set_threshold(700)
        gc.callbacks.remove(reenter)
    patcher.uninstall()
    print(json.dumps({"taken_by_ring": taken_by_ring, "seqs": sorted(seqs.items()), "copies_whole": all(copies_whole),
                      "reentered": len(copies_whole) > 3, "lost": recorder.ring.lost, "left": len(recorder.ring)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
