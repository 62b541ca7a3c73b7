"""Real gloo jobs for tests/instrumentation/test_hotpath_harm.py, the compiled hot path installed with a Recorder
and no runtime (records stay to be read). argv: case, rank, world size, a shared folder. Rank 0 prints its
facts as one JSON line.

then: rank 0 attaches Future.then(callback) to an async all_reduce its peer joins only then, so the callback
  runs on one of gloo's two worker threads (a new Python thread state each time) and issues
  all_gather_into_tensor there.
other_thread: rank 0's thread T is inside an all_reduce its peer has not joined when the main thread forks;
  the child reports its recorder and runs three collectives of its own on a 1-rank group it makes.
own_thread (1 rank): the all_reduce's own thread forks inside torch's call (the payload's __torch_function__);
  the child leaves the call with an error and reports its recorder, then runs three collectives of its own."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from mycroft.instrumentation import patching
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.recorder import Recorder

warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's deprecation


def _records(recorder: Recorder) -> list[list[Any]]:
    return [[r.op, r.seq, r.state] for r in sorted(recorder.take_done(), key=lambda r: r.start_ns)]


def _state(recorder: Recorder) -> dict[str, Any]:
    return {"ring_len": len(recorder.ring), "ring_in_flight": recorder.ring.in_flight,
            "inflight": [[r.op, r.seq] for r in recorder.snapshot_inflight()], "idle": recorder.idle(),
            "done": [[r.op, r.seq] for r in recorder.ring.done()], "taken": recorder.ring.taken}


def _own_ops(recorder: Recorder, folder: Path) -> dict[str, Any]:
    """The child's own collectives, on a 1-rank gloo group it makes (its parent's group is the parent's)."""
    store = dist.FileStore(str(folder / f"child-store-{os.getpid()}"), 1)
    pg = dist.ProcessGroupGloo(store, 0, 1)
    recorder.groups._by_pg[id(pg)] = GroupInfo(gid="child", name="child", desc="", ranks=(0,), ranks_text="0",
                                               group_rank=0, backend="gloo", pg=weakref.ref(pg))
    taken = recorder.ring.taken
    for _ in range(3):
        dist.all_reduce(torch.ones(4), group=pg)
    return {"own": _records(recorder), "own_taken_by_ring": recorder.ring.taken - taken}


def _child_report(recorder: Recorder, folder: Path, at_fork: dict[str, Any], left: Any) -> None:
    try:
        facts = {"at_fork": at_fork, "left": left, "failures_pending": recorder.failures_pending,
                 **_own_ops(recorder, folder)}
        (folder / "child.json").write_text(json.dumps(facts))
    finally:
        os._exit(0)


def main() -> None:
    case, rank, world, folder = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    store = dist.distributed_c10d._get_default_store()
    recorder = Recorder(4096)
    recorder.world_rank = rank
    patcher = patching.Patcher()
    patching.install(patcher, recorder, None, lambda: None, lambda: None, hot_path=True)
    dist.all_reduce(torch.ones(1))  # the default group resolved: the next calls go through C
    recorder.take_done()
    facts: dict[str, Any] = {}

    if case == "then":
        threads: list[int] = []

        def callback(fut: Any) -> None:
            dist.all_gather_into_tensor(torch.zeros(8 * world), torch.ones(8))
            threads.append(threading.get_ident())

        for index in range(6):
            if rank == 1:  # joins once rank 0 has attached its callback: rank 0's Work completes on its gloo thread
                store.wait([f"attached-{index}"])
            future = dist.all_reduce(torch.ones(8), async_op=True).get_future().then(callback)
            if rank == 0:
                store.set(f"attached-{index}", "1")
            future.wait()
        main_thread = threading.get_ident()
        facts = {"records": _records(recorder), "callback_threads": [t != main_thread for t in threads],
                 "distinct_threads": len(set(threads))}

    elif case == "other_thread":
        if rank == 1:
            store.wait(["forked"])
            dist.all_reduce(torch.ones(4))
        else:
            thread = threading.Thread(target=dist.all_reduce, args=(torch.ones(4),))
            thread.start()
            deadline = time.monotonic() + 30
            while recorder.ring.in_flight == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert recorder.ring.in_flight == 1
            time.sleep(0.05)  # inside torch's call by now
            pid = os.fork()
            if pid == 0:
                _child_report(recorder, folder, _state(recorder), [])
            os.waitpid(pid, 0)
            store.set("forked", "1")
            thread.join()

    elif case == "own_thread":
        pids: list[int] = []

        class Forking(torch.Tensor):
            @classmethod
            def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                if not pids and recorder.ring.in_flight:
                    pid = os.fork()
                    pids.append(pid)
                    if pid == 0:
                        at_fork.update(_state(recorder))
                        raise RuntimeError("the child leaves torch's call")
                return super().__torch_function__(func, types, args, kwargs or {})

        at_fork: dict[str, Any] = {}
        try:
            dist.all_reduce(torch.ones(4).as_subclass(Forking))
        except RuntimeError:
            if pids == [0]:
                _child_report(recorder, folder, at_fork, _records(recorder))
            raise
        os.waitpid(pids[0], 0)

    if rank == 0 and case != "then":
        facts = {"parent": {"records": _records(recorder), "idle": recorder.idle()},
                 "child": json.loads((folder / "child.json").read_text())}
    patcher.uninstall()
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps(facts))


if __name__ == "__main__":
    main()
