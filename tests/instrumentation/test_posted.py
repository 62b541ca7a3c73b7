"""A rank that posted async ops and waits on none of them is in its own code (Recorder.posted_only),
and the Work.wait wrapper is what tells: gloo's p2p Works complete only inside wait(), so a rank
blocked after pipelining's batch_isend_irecv read as in a transfer (framework_matrix: Interleaved1F1B
and ZBV blocked between forward and backward were called a stalled link)."""

from __future__ import annotations

from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.patching import _work_wait_wrapper
from mycroft.instrumentation.recorder import OpRecord, Recorder

from mycroft import schema


def _gloo() -> GroupInfo:
    return GroupInfo(gid="g", name="g", desc="", ranks=(0, 1), ranks_text="0-1", group_rank=0, backend="gloo",
                     pg=None, device_async=False)


def _posted(recorder: Recorder, seq: int, op: str, returned: bool = True, async_op: bool = True) -> OpRecord:
    record = OpRecord("api", op, _gloo(), seq, seq)
    record.peer, record.async_op = 1, async_op
    record.call_end_ns = seq + 1 if returned else 0
    recorder.inflight[record] = record
    return record


def test_posted_only_while_no_thread_waits_and_every_call_returned() -> None:
    recorder = Recorder(1024)
    assert not recorder.posted_only([])  # nothing in flight: idle, not "posted"
    _posted(recorder, 1, schema.OP_SEND)
    _posted(recorder, 2, schema.OP_RECV)
    assert recorder.posted_only(recorder.snapshot_inflight())

    seen: list[bool] = []

    def wait(work: object) -> bool:  # stands for the C++ Work.wait
        seen.append(recorder.posted_only(recorder.snapshot_inflight()))
        return True

    assert _work_wait_wrapper(recorder, wait)(object()) is True
    assert seen == [False] and recorder.waiting == 0  # inside wait(): waiting; after it, not
    assert recorder.posted_only(recorder.snapshot_inflight())

    def failing(work: object) -> bool:
        raise RuntimeError("peer gone")

    try:
        _work_wait_wrapper(recorder, failing)(object())
    except RuntimeError:
        pass
    assert recorder.waiting == 0  # an exception leaves the count right


def test_a_call_still_running_or_a_sync_op_is_not_posted() -> None:
    recorder = Recorder(1024)
    _posted(recorder, 1, schema.OP_SEND)
    _posted(recorder, 2, schema.OP_RECV, returned=False)  # irecv's call has not returned
    assert not recorder.posted_only(recorder.snapshot_inflight())
    recorder = Recorder(1024)
    _posted(recorder, 1, schema.OP_SEND, async_op=False)  # dist.send: the call is the wait
    assert not recorder.posted_only(recorder.snapshot_inflight())


def test_a_collective_is_never_posted_only() -> None:
    """DDP's reducer and funcol wait for their collectives in C++ (no Work.wait in Python): a rank
    waiting there must keep its wait-for edges."""
    recorder = Recorder(1024)
    _posted(recorder, 1, schema.OP_SEND)
    _posted(recorder, 2, schema.OP_ALL_REDUCE)
    assert not recorder.posted_only(recorder.snapshot_inflight())
