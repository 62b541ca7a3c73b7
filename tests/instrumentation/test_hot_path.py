"""The training thread's hot path, as rewritten for its cost (benchmarks/framework_matrix.py --costs-only):
per-spec `Recorder.beginner` closures read arguments by position or keyword as the generic path did,
and DDP's bucket completes in the one future callback DDP needs anyway, without an error of ours
ever reaching DDP."""

from __future__ import annotations

import functools

import pytest
import torch
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.ops import C10D_SPECS, OpSpec
from mycroft.instrumentation.patching import DDP_API, _bucket_done
from mycroft.instrumentation.recorder import OpRecord, Recorder

from mycroft import schema

ALL_REDUCE = next(spec for spec in C10D_SPECS if spec.api == "all_reduce")
BROADCAST = next(spec for spec in C10D_SPECS if spec.api == "broadcast")


def _gloo() -> GroupInfo:
    return GroupInfo(gid="g", name="g", desc="", ranks=(0, 3), ranks_text="0,3", group_rank=0, backend="gloo",
                     pg=None, device_async=False)


def _recorder() -> Recorder:
    recorder = Recorder(1024)
    recorder.groups._default = _gloo()  # what `group=None` resolves to (no torch.distributed here)
    return recorder


def test_arguments_read_by_position_or_keyword_alike() -> None:
    recorder = _recorder()
    begin = recorder.beginner(ALL_REDUCE, "torch.distributed.all_reduce")
    t = torch.ones(4, dtype=torch.float16)
    by_default = begin((t,), {})
    by_keyword = begin((), {"tensor": t, "op": "max", "async_op": True})
    by_position = begin((t, "min", None, 1), {})
    assert by_default is not None and by_keyword is not None and by_position is not None
    got = [(r.api, r.op, r.bytes, r.dtype, r.reduce_op, r.async_op) for r in (by_default, by_keyword, by_position)]
    assert got == [("torch.distributed.all_reduce", schema.OP_ALL_REDUCE, 8, torch.float16, None, False),
                   ("torch.distributed.all_reduce", schema.OP_ALL_REDUCE, 8, torch.float16, "max", True),
                   ("torch.distributed.all_reduce", schema.OP_ALL_REDUCE, 8, torch.float16, "min", True)]
    assert [r.seq for r in (by_default, by_keyword, by_position)] == [1, 2, 3]  # the group's own count
    assert recorder.inflight == {by_default: by_default, by_keyword: by_keyword, by_position: by_position}
    # the generic entry point gives the same record
    same = recorder.begin(ALL_REDUCE, (t, "min", None, True), {}, api="torch.distributed.all_reduce")
    assert same is not None and (same.bytes, same.dtype, same.reduce_op, same.async_op, same.seq) == \
        (8, torch.float16, "min", True, 4)


def test_keyword_only_arguments_never_read_from_positions() -> None:
    spec = OpSpec("made_up", schema.OP_ALL_REDUCE, (-1, "tensor"), (-1, "group"), (-1, "async_op"),
                  reduce_op=(-1, "op"))
    recorder = _recorder()
    small, large = torch.ones(2), torch.ones(64)
    record = recorder.beginner(spec)((large, large, large, large), {"tensor": small, "op": "sum"})
    assert record is not None and (record.bytes, record.reduce_op, record.async_op) == (8, "sum", False)


def test_rooted_collective_names_its_root_by_group_rank() -> None:
    recorder = _recorder()
    record = recorder.beginner(BROADCAST)((torch.ones(1),), {"group_src": 1})
    assert record is not None and record.root == 3  # group rank 1 of ranks (0, 3)


def test_odd_arguments_run_the_op_unrecorded_and_are_counted() -> None:
    recorder = _recorder()
    assert recorder.beginner(ALL_REDUCE)((torch.ones(1), None, object()), {}) is None  # a group torch rejects
    assert recorder.errors == 1 and not recorder.inflight


def _bucket(recorder: Recorder) -> tuple[OpRecord, torch.futures.Future, torch.futures.Future]:
    record = OpRecord(DDP_API, schema.OP_ALL_REDUCE, _gloo(), 1, 1, async_op=True)
    recorder.inflight[record] = record
    fut: torch.futures.Future = torch.futures.Future()
    return record, fut, fut.then(functools.partial(_bucket_done, recorder, record))


def test_ddp_bucket_completes_in_the_callback_ddp_waits_on() -> None:
    recorder = Recorder(1024)
    record, fut, then = _bucket(recorder)
    t = torch.ones(3)
    fut.set_result([t])
    assert then.wait() is t
    assert record.state == schema.STATE_COMPLETED and record.end_ns and not recorder.inflight
    assert list(recorder.queue) == [record]


def test_ddp_bucket_failure_reaches_ddp_and_the_span() -> None:
    recorder = Recorder(1024)
    record, fut, then = _bucket(recorder)
    fut.set_exception(RuntimeError("Connection closed by peer"))
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        then.wait()
    assert record.state == schema.STATE_ERROR and "Connection closed by peer" in record.error
    assert recorder.failures_pending and not recorder.inflight


def test_ddp_bucket_error_of_ours_never_reaches_ddp() -> None:
    recorder = Recorder(1024)
    record, fut, then = _bucket(recorder)
    record.group = None  # our bookkeeping breaks at completion (the Python and the compiled complete alike)
    t = torch.ones(3)
    fut.set_result([t])
    assert then.wait() is t
    assert recorder.errors == 1


def test_a_funcol_op_whose_tensor_is_gone_leaves_the_flight() -> None:
    """Tensors' ids are reused: an op whose tensor died unwaited (as far as we saw) is done when the
    next op's tensor takes its id, not in flight for ever under a key another op now holds."""
    recorder = _recorder()
    begin = recorder.beginner(ALL_REDUCE, "torch.distributed._functional_collectives.all_reduce", track=False)
    t = torch.ones(4)
    first, second = begin((t,), {}), begin((t,), {})
    assert first is not None and second is not None
    recorder.watch_tensor(first, t)
    recorder.watch_tensor(second, t)  # the same id: the first op's tensor is gone
    assert first.end_ns and first.state == schema.STATE_COMPLETED and first.timing == schema.TIMING_INFERRED
    assert list(recorder.inflight) == [second] and recorder.funcol_pending == {id(t): second}
    recorder.tensor_waited(t)
    assert not recorder.inflight and second.timing == schema.TIMING_EXACT
