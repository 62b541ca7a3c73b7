"""The compiled begin / complete (instrumentation/_hot.c) do what recorder.py's Python ones do.

The same calls go through a Recorder with the compiled path and one without, on a real gloo
process group (world size 1, torch's own seq counter) and on groups the Python code handles
for C (no counter, not yet registered): the records, the groups' counters and the recorders'
bookkeeping must be equal, errors counted alike, and the op never harmed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mycroft.instrumentation import recorder as recorder_module
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.ops import C10D_ONLY_IN_DIST, C10D_SPECS, OpSpec
from mycroft.instrumentation.recorder import OpRecord, Recorder

from mycroft import schema

pytestmark = pytest.mark.skipif(recorder_module._hot is None, reason="the compiled hot path is not built here")

COLLECTIVES = [spec for spec in (*C10D_SPECS, *C10D_ONLY_IN_DIST) if not spec.is_p2p]
FIELDS = [name for name in OpRecord.__slots__ if name not in ("start_ns", "end_ns", "group")]


@pytest.fixture(scope="module")
def world() -> Iterator[Any]:
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
        try:
            yield dist.new_group([0])
        finally:
            dist.destroy_process_group()


def _pair() -> tuple[Recorder, Recorder]:
    fast, slow = Recorder(1024, compiled=True), Recorder(1024, compiled=False)
    assert fast.compiled and not slow.compiled
    return fast, slow


def _fields(record: OpRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    out = {name: getattr(record, name) for name in FIELDS}
    out["group"] = record.group.gid
    out["timed"] = (record.start_ns > 0, record.end_ns >= record.start_ns if record.end_ns else 0)
    return out


def _state(recorder: Recorder) -> dict[str, Any]:
    return {"inflight": [_fields(r) for r in recorder.inflight], "queue": [_fields(r) for r in recorder.queue],
            "ops_done": recorder.ops_done, "errors": recorder.errors, "comm": recorder.comm_ns > 0,
            "groups": sorted((g.gid, g.issued, g.completed, g.has_counter, g.own_counter)
                             for g in recorder.groups.all())}


def _calls(spec: OpSpec, group: Any) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Ways users call `spec`: by position, by keyword, odd payloads, the group given or not."""
    t = torch.arange(6, dtype=torch.float64)
    position, keyword = spec.group
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = [((t,), {}), ((), {spec.payload[1] or "x": [t, t[:2]]})]
    if spec.payload[1]:
        calls += [((), {spec.payload[1]: t}), ((), {spec.payload[1]: None}), ((), {spec.payload[1]: "odd"})]
    if keyword:
        calls += [((t,), {keyword: group}), ((t,), {keyword: None})]
    if position >= 0:
        calls.append(((*[t] * position, group), {}))
    if spec.async_op[1]:
        calls += [((t,), {spec.async_op[1]: True}), ((t,), {spec.async_op[1]: 0})]
    if spec.reduce_op[1]:
        calls.append(((t,), {spec.reduce_op[1]: dist.ReduceOp.MAX}))
    if spec.root[1]:
        calls += [((t,), {spec.root[1]: 0}), ((t,), {spec.root[1]: "not a rank"})]
    if spec.group_root[1]:
        calls.append(((t,), {spec.group_root[1]: 0}))
    return calls


@pytest.mark.parametrize("spec", COLLECTIVES, ids=lambda spec: spec.api)
def test_begin_and_complete_are_the_python_ones(world: Any, spec: OpSpec) -> None:
    fast, slow = _pair()
    begins = [recorder.beginner(spec, "torch.distributed." + spec.api) for recorder in (fast, slow)]
    assert type(begins[0]).__name__ == "Beginner" and callable(begins[1])
    for args, kwargs in _calls(spec, world):
        got = [begin(args, dict(kwargs)) for begin in begins]
        assert _fields(got[0]) == _fields(got[1]), (args, kwargs)
        assert _state(fast) == _state(slow)
        dist.all_reduce(torch.ones(1), group=world)  # torch's counters move between the calls
        dist.all_reduce(torch.ones(1))
    for state, timing in ((schema.STATE_COMPLETED, schema.TIMING_EXACT), (schema.STATE_ERROR, schema.TIMING_POLLED)):
        for recorder in (fast, slow):
            for record in list(recorder.inflight)[:2]:
                recorder.complete(record, state=state, timing=timing)
                recorder.complete(record)  # done already: nothing changes
        assert _state(fast) == _state(slow)
    for recorder in (fast, slow):
        for record in list(recorder.inflight):
            recorder.complete(record, timing=schema.TIMING_INFERRED)
    assert _state(fast) == _state(slow) and not fast.inflight and fast.comm_ns > 0


def test_groups_the_python_code_handles(world: Any) -> None:
    """A group without torch's counter (its own count), one not yet registered, a dead one."""
    fast, slow = _pair()
    spec = next(s for s in C10D_SPECS if s.api == "all_reduce")
    for recorder in (fast, slow):
        recorder.groups._default = GroupInfo(gid="own", name="own", desc="", ranks=(0,), ranks_text="0",
                                             group_rank=0, backend="made-up", pg=object())
    begins = [recorder.beginner(spec) for recorder in (fast, slow)]
    t = torch.ones(3)
    for args in ((t,), (t, dist.ReduceOp.SUM, world), (t, dist.ReduceOp.SUM, None), (t, None, world)):
        got = [begin(args, {}) for begin in begins]
        assert _fields(got[0]) == _fields(got[1])
    assert _state(fast) == _state(slow)
    assert fast.groups._default is not None and fast.groups._default.own_counter == 2  # counted by us
    for recorder in (fast, slow):  # an object that is no process group: counted, the op runs unrecorded
        assert recorder.beginner(spec)((t, None, object()), {}) is None
    assert _state(fast) == _state(slow) and fast.errors == 1


def test_complete_takes_records_of_any_kind_and_queue_limits(world: Any) -> None:
    fast, slow = Recorder(2, compiled=True), Recorder(2, compiled=False)
    spec = next(s for s in C10D_SPECS if s.api == "broadcast")
    records = []
    for recorder in (fast, slow):
        begin = recorder.beginner(spec)
        records.append([begin((torch.ones(2), 0), {}) for _ in range(4)])
    for mine, theirs in zip(*records, strict=True):
        fast.complete(mine)
        slow.complete(theirs)
    assert _state(fast) == _state(slow) and fast.dropped == slow.dropped == 2 and len(fast.queue) == 2

    class Later(OpRecord):  # not the OpRecord the compiled code was built for: the Python complete runs
        __slots__ = ()

    info = fast.groups.resolve(world)
    assert info is not None
    odd = Later("api", schema.OP_SEND, info, 3, 1)
    fast.inflight[odd] = odd
    fast.complete(odd, timing=schema.TIMING_POLLED)
    assert odd.end_ns and odd.timing == schema.TIMING_POLLED and odd not in fast.inflight
    with pytest.raises(TypeError):
        fast.complete(odd, bogus=1)  # type: ignore[call-arg]
