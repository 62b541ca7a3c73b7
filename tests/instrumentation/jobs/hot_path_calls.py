"""A fixed sequence of torch.distributed calls on a 1-rank gloo group, recorded with the compiled hot path
on or off (argv[1]); prints what the recorder holds afterwards as JSON (tests/instrumentation/
test_compiled_hot_path.py compares the two). No runtime: the records stay in the ring and the queue to be
read."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from mycroft.instrumentation import patching
from mycroft.instrumentation.ops import C10D_SPECS
from mycroft.instrumentation.recorder import Recorder


def main() -> None:
    hot = sys.argv[1] == "1"
    dist.init_process_group("gloo", init_method=f"file://{tempfile.mkdtemp()}/store", rank=0, world_size=1)
    sub = dist.new_group([0])
    recorder = Recorder(4096)
    recorder.world_rank = 0
    work_type = torch._C._distributed_c10d.Work
    torch_wait = work_type.__dict__["wait"]
    patcher = patching.Patcher()
    patching.install(patcher, recorder, None, lambda: None, lambda: None, hot_path=hot)
    t = torch.ones(8)
    errors: list[str] = []

    def expect_error(call: object) -> None:
        try:
            call()  # type: ignore[operator]
        except Exception as exc:  # the op's own error reaches the caller, the same either way
            errors.append(type(exc).__name__)

    dist.all_reduce(t)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sub)
    dist.all_reduce(t, dist.ReduceOp.SUM, None, False)
    dist.all_reduce(torch.ones(3, dtype=torch.int64), group=None)
    work = dist.all_reduce(t, async_op=True)
    installed_wait = type(work_type.__dict__["wait"]).__name__, type(work.wait).__name__, recorder.waiting
    work.wait()
    dist.broadcast(t, src=0)
    dist.broadcast(t, group_src=0, group=sub)
    dist.all_gather([torch.zeros(8)], t)
    dist.all_gather_into_tensor(torch.zeros(8), t)
    dist.reduce_scatter_tensor(torch.zeros(8), t)
    dist.barrier()
    dist.all_gather_object([None], {"nested": "all_gather inside: one record"})
    expect_error(lambda: dist.all_gather([torch.zeros(3), torch.zeros(3)], t))  # wrong list: torch raises
    expect_error(lambda: dist.all_reduce(t, group=object()))  # not a group: unrecorded, torch raises
    dist.all_reduce(t)
    torch.Tensor.nbytes = property(lambda self: 12345)  # the tensor type changed: its getters are read anew
    dist.all_reduce(t)
    del torch.Tensor.nbytes
    dist.all_reduce(t)
    deadline = time.monotonic() + 5
    while not recorder.idle() and time.monotonic() < deadline:  # the async op completes in its future's callback
        time.sleep(0.01)

    records = [{"api": r.api, "op": r.op, "group": r.group.gid, "seq": r.seq, "bytes": r.bytes,
                "dtype": str(r.dtype), "reduce_op": str(r.reduce_op), "async_op": r.async_op, "state": r.state,
                "root": r.root, "error": r.error.split(":")[0], "timing": r.timing, "device": r.device,
                "timed": 0 < r.start_ns <= r.end_ns}
               for r in sorted(recorder.take_done(), key=lambda r: r.start_ns)]  # in issue order
    groups = sorted((info.gid, info.issued, info.completed) for info in recorder.groups.all())
    taken = _taken()

    ring = {"taken": recorder.ring.taken, "full": recorder.ring.full}

    # nothing leaks per call: the tensor and the group are referenced as before after many calls, more calls
    # than the ring holds (the rest are OpRecords in the queue)
    before = (sys.getrefcount(t), sys.getrefcount(sub))
    for _ in range(5000):
        dist.all_reduce(t, group=sub)
    many = recorder.take_done()
    ring["seqs_in_order"] = [r.seq for r in many] == list(range(many[0].seq, many[0].seq + 5000))
    ring["full_after_many"] = recorder.ring.full
    del many
    after = (sys.getrefcount(t), sys.getrefcount(sub))
    print(json.dumps({"records": records, "groups": groups, "errors": errors, "ops_done": recorder.counters.ops_done,
                      "inflight": len(recorder.snapshot_inflight()), "recorder_errors": recorder.errors,
                      "ring": ring,
                      "taken": taken, "refcounts": [before, after], "comm_ns": recorder.counters.comm_ns > 0,
                      "work_wait": [*installed_wait, recorder.waiting]}))
    patcher.uninstall()
    assert work_type.__dict__["wait"] is torch_wait

    # a second recorder (a new PerThread): each thread's nesting depth follows it, in this thread and in
    # another one. `outer`, a wrapped call (the Python wrapper) whose original issues an all_reduce: one
    # record, the outer one, only if the compiled path reads the depth the new wrapper set
    again = Recorder(4096)
    again.world_rank = 0
    patcher = patching.Patcher()
    patching.install(patcher, again, None, lambda: None, lambda: None, hot_path=hot)
    broadcast = next(spec for spec in C10D_SPECS if spec.api == "broadcast")
    outer = patching._collective_wrapper(again, broadcast, lambda *args: dist.all_reduce(t), hot_path=False)

    def other_thread() -> None:
        dist.all_reduce(t)
        outer(t, 0)
        dist.all_gather_object([None], "two all_gathers")
        dist.all_reduce(t, group=sub)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    outer(t, 0)
    dist.all_reduce(t)
    second = {"records": sorted([r.api, r.op, r.group.gid, r.seq, r.state] for r in again.take_done()),
              "taken": _taken(), "ops_done": again.counters.ops_done}
    patcher.uninstall()
    print(json.dumps({"second": second}))
    dist.destroy_process_group()


def _taken() -> int:
    """Calls the installed compiled hot paths took (0 with it off)."""
    hot = {id(h): h for h in (patching.hot_path_of(fn) for fn in vars(dist).values()) if h is not None}
    return sum(h.counts()[0] for h in hot.values())


if __name__ == "__main__":
    main()
