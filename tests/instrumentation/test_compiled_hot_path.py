"""The compiled hot path (instrumentation/_hotpath.c) against its definition, the Python wrapper.

The same fixed sequence of real torch.distributed calls (1-rank gloo: positional and keyword arguments,
a subgroup, an async op, rooted ops, list payloads, a nested call, an op torch fails, a non-group) is
recorded once with the compiled path and once without: the records, the groups' counters and the
recorder's counts must be the same, and the compiled path must have taken the calls it is for."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mycroft.instrumentation import patching

JOB = Path(__file__).parent / "jobs" / "hot_path_calls.py"


@functools.cache
def _recorded(hot: bool) -> dict[str, Any]:
    result = subprocess.run([sys.executable, str(JOB), "1" if hot else "0"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    *_, first, second = result.stdout.strip().splitlines()
    return {**json.loads(first), **json.loads(second)}


def test_compiled_hot_path_is_built() -> None:
    """The set-up builds it (an optional extension: a silent build failure would leave every call slow)."""
    assert patching._hotpath is not None


@pytest.mark.slow
def test_compiled_and_python_paths_record_the_same() -> None:
    compiled, python = _recorded(hot=True), _recorded(hot=False)
    assert compiled["taken"] >= 12  # the plain sync collectives went through C ...
    assert python["taken"] == 0  # ... and none did with MYCROFT_HOT_PATH off
    for key in ("records", "groups", "errors", "ops_done", "inflight", "recorder_errors", "comm_ns"):
        assert compiled[key] == python[key], key
    records = compiled["records"]
    assert len(records) == 17 and all(r["timed"] for r in records)
    # Tensor.nbytes replaced for one call: the compiled path read the new one (its getters follow the type)
    assert [r["bytes"] for r in records if r["op"] == "all_reduce"][-2:] == [12345, 32]
    assert [r["state"] for r in records].count("error") == 1  # torch's own failure, recorded, raised as before
    assert compiled["errors"] == ["RuntimeError", "ValueError"]
    assert compiled["recorder_errors"] == 1  # the non-group: counted, the op ran unrecorded
    assert compiled["inflight"] == 0 and compiled["comm_ns"]
    assert next(r for r in records if r["async_op"])["state"] == "completed"  # through the Python issued()
    assert [r["root"] for r in records if r["op"] == "broadcast"] == [0, 0]


@pytest.mark.slow
def test_sync_ops_go_through_the_ring_and_overflow_into_records() -> None:
    """The compiled path writes each plain sync collective into the recorder's ring (no OpRecord on the
    training thread), the failed one included (it leaves the ring as a record); past the ring's slots the
    calls are OpRecords in the queue, nothing dropped, every seq once and in order."""
    ring = _recorded(hot=True)["ring"]
    # every call the compiled path took but the async all_reduce and the two broadcasts (a root: a record)
    assert ring["taken"] == _recorded(hot=True)["taken"] - 3 == 12
    assert ring["full"] == 0
    assert ring["seqs_in_order"]  # 5,000 calls, 4,096 slots: 4,096 from the ring, then 904 records
    assert ring["full_after_many"] == 5000 - 4096
    assert _recorded(hot=False)["ring"] == {"taken": 0, "full": 0, "seqs_in_order": False,
                                            "full_after_many": 0}  # the Python path: its queue of 4,096


@pytest.mark.slow
def test_compiled_hot_path_follows_a_new_recorder_in_every_thread() -> None:
    """A second recorder in the same process: the depth the compiled path keeps per thread follows it, in
    the main thread and in another; an all_reduce inside another wrapped call is not recorded again."""
    compiled, python = _recorded(hot=True)["second"], _recorded(hot=False)["second"]
    assert compiled["records"] == python["records"]
    ops = [r[1] for r in compiled["records"]]
    assert (ops.count("broadcast"), ops.count("all_reduce"), ops.count("all_gather")) == (2, 3, 2)
    assert compiled["ops_done"] == python["ops_done"] == 7
    assert compiled["taken"] == 3 and python["taken"] == 0  # the three outer all_reduces went through C


def test_recorder_counters_alike_with_and_without_the_extension() -> None:
    """Recorder.counters: C integers where the extension is built, a slotted class where it is not: the
    same names, zeros when made, ints in and out, nothing else settable."""
    from mycroft.instrumentation import recorder

    assert patching._hotpath is not None and recorder.Counters is patching._hotpath.Counters
    names = ("last_activity_ns", "comm_ns", "comm_since_ns", "ops_done")
    for made in (recorder.PyCounters(), patching._hotpath.Counters()):
        assert [getattr(made, name) for name in names] == [0, 0, 0, 0]
        made.ops_done += 1
        made.last_activity_ns = 1_790_000_000_123_456_789
        assert (made.ops_done, made.last_activity_ns) == (1, 1_790_000_000_123_456_789)
        with pytest.raises(AttributeError):
            made.comm_s = 1.0


@pytest.mark.slow
def test_compiled_hot_path_keeps_no_reference() -> None:
    before, after = _recorded(hot=True)["refcounts"]
    assert before == after  # the tensor and the group after 2,000 calls


def test_compiled_work_wait_counts_the_thread_inside_and_keeps_the_outcome() -> None:
    """_hotpath.Wait, installed as torch's Work.wait: binds like a method, hands every argument on,
    `waiters` is one longer exactly while the original runs, and the original's error reaches the caller."""
    import collections

    import pytest

    compiled = patching._hotpath
    assert compiled is not None
    waiters: collections.deque[None] = collections.deque()
    seen: list[tuple[Any, ...]] = []

    def original(work: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append((work, args, kwargs, len(waiters)))
        if kwargs.get("fail"):
            raise TimeoutError("the wait timed out")
        return "done"

    class Work:
        wait = compiled.Wait(original, waiters)

    work = Work()
    assert work.wait() == "done" and work.wait(5, timeout=2.0) == "done"
    assert Work.wait(work) == "done"  # through the class, as torch's own code may call it
    with pytest.raises(TimeoutError, match="timed out"):
        work.wait(fail=True)
    assert seen == [(work, (), {}, 1), (work, (5,), {"timeout": 2.0}, 1), (work, (), {}, 1),
                    (work, (), {"fail": True}, 1)]
    assert len(waiters) == 0


@pytest.mark.slow
def test_torch_work_wait_is_the_compiled_one_while_instrumented() -> None:
    """With the hot path on, torch's Work.wait is the compiled one (a real Work binds it as a method; no
    waiter left after the job's waits) and uninstall puts torch's back (the job asserts it)."""
    assert _recorded(hot=True)["work_wait"] == ["Wait", "method", 0, 0]
    assert _recorded(hot=False)["work_wait"] == ["function", "method", 0, 0]


DOOR_JOB = Path(__file__).parent / "jobs" / "door_calls.py"


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["deferred", "dynamo_first", "registration_fails", "no_substitute"])
def test_door_records_eager_calls_and_lets_dynamo_compile_them(mode: str) -> None:
    """torch.distributed holds a builtin door; Dynamo gets a stand-in for it whether it is imported after
    instrumenting (post-import hook) or before, and a shim takes the door's place where it cannot: in every
    case a fullgraph compile of c10d collectives computes as in eager with no graph break; a torch without
    substitute_in_graph gets the shim from the start."""
    result = subprocess.run([sys.executable, str(DOOR_JOB), mode], capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert facts["dynamo_at_install"] == (mode == "dynamo_first")
    # a torch without substitute_in_graph: the shim in front of the door from the start
    assert facts["installed_kind"] == ("function" if mode == "no_substitute" else "builtin_function_or_method")
    assert facts["pickles"]  # by name, as torch's own function does
    assert facts["held_unpickles_to_torch"] is (None if mode == "no_substitute" else True)
    # the stand-in registered: the door stays; refused: a Python shim took its place in torch's modules
    assert facts["after_compile_kind"] == ("function" if mode in ("registration_fails", "no_substitute")
                                           else "builtin_function_or_method")
    assert facts["eager_ops"] == ["all_reduce"] * 4
    assert facts["compiled_equal"] and facts["graph_breaks"] == 0
    # Dynamo rewrote torch's collectives as it does without Mycroft (not the door called from the graph)
    ops = [t for t in facts["graph_targets"] if "c10d" in t or "all_" in t]
    assert ops == ["_c10d_functional.all_reduce", "_c10d_functional.wait_tensor",
                   "_c10d_functional.all_gather_into_tensor", "_c10d_functional.wait_tensor"], ops
    # uninstrumented: torch's own function is back, and a door someone still holds records nothing
    assert facts["restored"] and facts["held_detached"]
    assert facts["held_is_door"] == (mode != "no_substitute")  # a held shim fronts the same door
    assert facts["second_recorded"] == 2 and facts["after_uninstrument_recorded"] == 0
    if mode == "registration_fails":
        assert result.stderr.count("Dynamo cannot trace all_reduce through its door") == 1  # said once


@pytest.mark.slow
def test_the_ring_read_again_from_inside_its_own_reads() -> None:
    """A garbage collection started while an OpRecord is allocated for a slot runs gc.callbacks (on 3.11 at
    once, in C): here they drain the ring and copy its ops, as another thread taking the GIL at that instant
    would. Every op comes out once, every copy whole, the process alive (a slot read after another read
    released it crashed it: exit 139)."""
    job = Path(__file__).parent / "jobs" / "ring_reentry.py"
    result = subprocess.run([sys.executable, str(job)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr[-3000:])
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["taken_by_ring"] >= 60 and found["reentered"]
    assert found["seqs"] == [[seq, 1] for seq in range(1, 65)]
    assert found["copies_whole"] and found["lost"] == 0 and found["left"] == 0
