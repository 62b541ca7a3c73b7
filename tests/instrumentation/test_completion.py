"""The completion tracker on fake Works: in order per stream, bounded, failures, the Flight Recorder's frontier."""

from __future__ import annotations

from mycroft.instrumentation.completion import CompletionTracker
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.recorder import OpRecord, Recorder

from mycroft import schema


class FakeWork:
    def __init__(self) -> None:
        self.done = False
        self.error: BaseException | None = None

    def is_completed(self) -> bool:
        return self.done

    def exception(self) -> BaseException | None:
        return self.error


def _group(gid: str = "g") -> GroupInfo:
    return GroupInfo(gid=gid, name=gid, desc="", ranks=(0, 1), ranks_text="0-1", group_rank=0, backend="nccl",
                     pg=None, device_async=True)


def _record(recorder: Recorder, group: GroupInfo, seq: int, op: str = schema.OP_ALL_REDUCE, peer: int = -1) -> OpRecord:
    record = OpRecord("api", op, group, seq, seq)
    record.peer = peer
    recorder.inflight[record] = record
    return record


def test_oldest_of_each_stream_decides_and_later_ops_wait_their_turn() -> None:
    recorder = Recorder(1024)
    tracker = CompletionTracker(recorder, max_works=8)
    g = _group()
    works = [FakeWork() for _ in range(3)]
    records = [_record(recorder, g, seq) for seq in (1, 2, 3)]
    p2p_work, p2p = FakeWork(), _record(recorder, g, 1, schema.OP_SEND, peer=1)
    for record, work in zip(records, works, strict=True):
        tracker.add(record, work)
    tracker.add(p2p, p2p_work)
    works[1].done = True  # the device cannot finish 2 before 1 on one stream: nothing yet
    p2p_work.done = True  # another stream: done now
    assert tracker.poll() == 1 and p2p.end_ns and not records[0].end_ns
    works[0].done = True
    assert tracker.poll() == 2
    assert [r.timing for r in records[:2]] == [schema.TIMING_DEVICE_POLLED] * 2 and g.completed == 2
    assert tracker.pending() == 1 and recorder.inflight == {records[2]: records[2]}


def test_beyond_the_cap_works_are_released_and_complete_by_stream_order() -> None:
    recorder = Recorder(1024)
    tracker = CompletionTracker(recorder, max_works=2)
    g = _group()
    works = [FakeWork() for _ in range(4)]
    records = [_record(recorder, g, seq) for seq in range(1, 5)]
    for record, work in zip(records, works, strict=True):
        tracker.add(record, work)
    assert tracker.released == 2  # 1 and 2 let go; 3 and 4 held
    works[2].done = True
    assert tracker.poll() == 3
    assert [r.timing for r in records[:3]] == [schema.TIMING_POLLED, schema.TIMING_POLLED,
                                                schema.TIMING_DEVICE_POLLED]
    # the last one completes by the Flight Recorder's frontier just as well
    assert tracker.complete_through("g", 4, schema.TIMING_FLIGHT_RECORDER) == 1
    assert records[3].timing == schema.TIMING_FLIGHT_RECORDER and tracker.pending() == 0


def test_a_failed_op_is_recorded_as_failed_and_shipped_at_once() -> None:
    recorder = Recorder(1024)
    tracker = CompletionTracker(recorder)
    work = FakeWork()
    record = _record(recorder, _group(), 1)
    tracker.add(record, work)
    work.done, work.error = True, RuntimeError("NCCL communicator was aborted")
    tracker.poll()
    assert record.state == schema.STATE_ERROR and "aborted" in record.error and recorder.failures_pending


def test_the_poller_thread_wakes_for_new_work_and_sleeps_when_idle() -> None:
    import time

    recorder = Recorder(1024)
    tracker = CompletionTracker(recorder, poll_s=0.001)
    tracker.start()
    try:
        work = FakeWork()
        record = _record(recorder, _group(), 1)
        tracker.add(record, work)
        work.done = True
        deadline = time.monotonic() + 5
        while not record.end_ns and time.monotonic() < deadline:
            time.sleep(0.01)
        assert record.end_ns
        polls = tracker.polls
        time.sleep(0.3)
        assert tracker.polls - polls <= 2  # idle: it waits on its event, no busy polling
    finally:
        tracker.stop()
