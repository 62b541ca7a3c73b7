"""Never harm, in the compiled hot path (instrumentation/_hotpath.c), with real torch.distributed (1-rank gloo
in this process; the fork cases in processes of their own, marked slow):

- only Exceptions are Mycroft's: a KeyboardInterrupt, SystemExit or GeneratorExit raised while the hot path
  runs Python code (a tensor subclass's __torch_function__ entered by a payload getter, payload_info, the
  rooted ops' helper, a custom __bool__, the thread's first PerThread, the recorder's own helpers) comes out
  of the call, and a collective not yet started is not run;
- per-thread state is the Python thread state's: a C++ thread that enters Python with a fresh thread state
  each time (torch Future.then callbacks on gloo's threads) gets each collective recorded once;
- configure() is all or nothing;
- a forked child starts with a clean ring and never completes the parent's op."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from mycroft.instrumentation import patching
from mycroft.instrumentation.groups import GroupInfo
from mycroft.instrumentation.op_record import OpRecord
from mycroft.instrumentation.recorder import Depth, PerThread, Recorder, payload_info

from mycroft import schema

hotpath = patching._hotpath
pytestmark = pytest.mark.skipif(hotpath is None, reason="the compiled hot path is not built")
JOBS = Path(__file__).parent / "jobs"


class Job:
    """1-rank gloo in this process, instrumented with the compiled hot path (no runtime: records stay)."""

    def __init__(self, store: Path) -> None:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
        self.pg = dist.distributed_c10d._get_default_group()
        self.recorder = Recorder(4096)
        self.recorder.world_rank = 0
        self.patcher = patching.Patcher()
        patching.install(self.patcher, self.recorder, None, lambda: None, lambda: None, hot_path=True)
        assert patching.hot_path_of(dist.all_reduce) is not None
        dist.all_reduce(torch.ones(1))  # the default group resolved (by the Python path): the next calls are C's
        assert patching.hot_path_of(dist.all_reduce).counts()[0] == 0
        dist.all_reduce(torch.ones(1))
        assert patching.hot_path_of(dist.all_reduce).counts()[0] == 1

    def seq(self) -> int:
        """torch's own count of this group's collectives: moves only when one runs"""
        return int(self.pg._get_sequence_number_for_group())

    def close(self) -> None:
        self.patcher.uninstall()
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Job]:
    assert not dist.is_initialized()
    made = Job(tmp_path_factory.mktemp("gloo") / "store")
    try:
        yield made
    finally:
        made.close()


class Once:
    """Raises `exc` the first time it is called (a Ctrl-C arrives once), then does nothing."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.exc = exc
        self.fired = 0

    def __call__(self) -> None:
        if not self.fired:
            self.fired += 1
            raise self.exc()


def _interrupting(once: Once) -> type[torch.Tensor]:
    class Interrupting(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            once()
            return super().__torch_function__(func, types, args, kwargs or {})

    return Interrupting


STOPS = [KeyboardInterrupt, SystemExit, GeneratorExit]


@pytest.mark.parametrize("exc", STOPS, ids=[e.__name__ for e in STOPS])
def test_a_stop_in_the_payload_getter_comes_out_and_the_collective_does_not_run(job: Job,
                                                                               exc: type[BaseException]) -> None:
    """The hot path reads the payload's nbytes, which enters a tensor subclass's __torch_function__: the
    stop raised there comes out of dist.all_reduce, as it does from torch's own call, and nothing runs."""
    plain = patching.original_of(dist.all_reduce)
    once = Once(exc)
    tensor = torch.ones(4).as_subclass(_interrupting(once))
    before = job.seq()
    with pytest.raises(exc):
        plain(tensor)  # torch's own function: its first look at the tensor raises it
    assert once.fired == 1 and job.seq() == before
    once.fired = 0
    taken = job.recorder.ring.taken
    with pytest.raises(exc):
        dist.all_reduce(tensor)
    assert once.fired == 1
    assert job.seq() == before  # the collective did not run (it did, once the stop was cleared)
    assert job.recorder.ring.taken == taken and job.recorder.idle()
    dist.all_reduce(tensor)  # the next call runs and is recorded
    assert job.seq() == before + 1 and job.recorder.ring.taken == taken + 1


def test_a_stop_in_payload_info_comes_out(job: Job) -> None:
    """reduce_scatter's payload is a list: payload_info (Python) reads its tensors, where a subclass's
    __torch_function__ raises KeyboardInterrupt."""
    once = Once(KeyboardInterrupt)
    tensor = torch.ones(4).as_subclass(_interrupting(once))
    before = job.seq()
    with pytest.raises(KeyboardInterrupt):
        dist.reduce_scatter(torch.zeros(4), [tensor])
    assert once.fired == 1 and job.seq() == before


class _Flag:
    """async_op=False whose __bool__ runs `hook` first"""

    def __init__(self, hook: Callable[[], None]) -> None:
        self.hook = hook

    def __bool__(self) -> bool:
        self.hook()
        return False


def test_a_stop_in_a_custom_bool_comes_out(job: Job) -> None:
    once = Once(KeyboardInterrupt)
    before = job.seq()
    with pytest.raises(KeyboardInterrupt):
        dist.all_reduce(torch.ones(4), async_op=_Flag(once))
    assert once.fired == 1 and job.seq() == before


def test_a_stop_in_the_root_helper_comes_out(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    """broadcast's root is read by a Python helper: a stop that lands there comes out, nothing runs."""
    once = Once(SystemExit)
    root_field = Recorder._root_field

    def landing(*args: Any) -> None:
        once()
        root_field(*args)

    monkeypatch.setattr(Recorder, "_root_field", staticmethod(landing))
    before = job.seq()
    with pytest.raises(SystemExit):
        dist.broadcast(torch.ones(4), src=0)
    assert once.fired == 1 and job.seq() == before and job.recorder.idle()


def test_a_stop_in_a_new_threads_first_depth_comes_out(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread's first collective makes its PerThread (Python __init__): a stop there comes out of the call."""
    once = Once(KeyboardInterrupt)
    init = PerThread.__init__

    def landing(self: PerThread, *args: Any, **kwargs: Any) -> None:
        once()
        init(self, *args, **kwargs)

    monkeypatch.setattr(PerThread, "__init__", landing)
    before = job.seq()
    caught: list[BaseException] = []

    def other() -> None:
        try:
            dist.all_reduce(torch.ones(4))
        except BaseException as exc:
            caught.append(exc)

    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    assert once.fired == 1
    assert [type(exc) for exc in caught] == [KeyboardInterrupt] and job.seq() == before


def test_a_stop_in_the_recorders_error_note_comes_out_after_the_op(job: Job,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Bookkeeping fails after the collective ran (here: the group's completed count unreadable) and the stop
    lands in the recorder's error note: it comes out of the call; the op ran (as it would have)."""
    once = Once(KeyboardInterrupt)
    note = Recorder._note_error

    def landing(self: Recorder, where: str, exc: BaseException) -> None:
        once()
        note(self, where, exc)

    monkeypatch.setattr(Recorder, "_note_error", landing)
    info = job.recorder.groups.resolve(None)
    assert info is not None
    completed = info.completed
    info.completed = "unreadable"
    before = job.seq()
    try:
        with pytest.raises(KeyboardInterrupt):
            dist.all_reduce(torch.ones(4))
    finally:
        info.completed = completed
    assert once.fired == 1 and job.seq() == before + 1


def test_a_stop_while_noting_torchs_failure_comes_out(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's call fails and the stop lands in Recorder.failed: the stop comes out, torch's error with it
    (its context)."""
    once = Once(KeyboardInterrupt)
    failed = Recorder.failed

    def landing(self: Recorder, record: OpRecord, exc: BaseException) -> None:
        once()
        failed(self, record, exc)

    monkeypatch.setattr(Recorder, "failed", landing)
    with pytest.raises(KeyboardInterrupt) as raised:
        dist.all_gather([torch.zeros(3), torch.zeros(3)], torch.ones(4))  # wrong list: torch raises
    assert once.fired == 1 and isinstance(raised.value.__context__, (RuntimeError, ValueError))


def test_an_exception_in_our_python_code_stays_ours(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the rule: an Exception raised in the same place is ours: the op runs, recorded by
    the Python wrapper (which meets the error again and counts it) or unrecorded."""
    raised = Once(RuntimeError)
    tensor = torch.ones(4).as_subclass(_interrupting(raised))
    before = job.seq()
    dist.all_reduce(tensor)
    assert raised.fired == 1 and job.seq() == before + 1


@pytest.mark.slow
def test_callbacks_on_gloos_threads_record_each_collective_once(tmp_path: Path) -> None:
    """torch runs a Future's then() callback on the gloo thread that completes the Work, entering Python with
    a new thread state each time (pybind11's gil_scoped_acquire): per-thread state follows the thread state,
    so each all_gather_into_tensor issued there is one record, each seq once (2 ranks, the peer late)."""
    facts = _run_job("then", 2, tmp_path)
    # the case this is about: callbacks on gloo's threads, several on one OS thread
    assert facts["callback_threads"] == [True] * 6 and facts["distinct_threads"] < 6, facts
    gathers = [record for record in facts["records"] if record[0] == schema.OP_ALL_GATHER]
    seqs = [seq for _, seq, _ in gathers]
    assert len(gathers) == 6 and len(set(seqs)) == 6, facts["records"]  # each once (was: most twice)


def _run_job(case: str, world: int, folder: Path) -> dict[str, Any]:
    """tests/instrumentation/jobs/hotpath_harm.py's `case` on `world` ranks; rank 0's facts"""
    ranks = [subprocess.Popen([sys.executable, str(JOBS / "hotpath_harm.py"), case, str(rank), str(world),
                               str(folder)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    outcomes = []
    try:
        for process in ranks:
            outcomes.append(process.communicate(timeout=120))
    finally:
        for process in ranks:
            process.kill()
    for process, (_, err) in zip(ranks, outcomes, strict=True):
        assert process.returncode == 0, err[-3000:]
    facts: dict[str, Any] = json.loads(outcomes[0][0].strip().splitlines()[-1])
    return facts


def test_configure_is_all_or_nothing(job: Job) -> None:
    """A configure() that fails changes nothing: the records stay right (the record offsets were overwritten
    before the group type was checked)."""
    assert hotpath is not None

    class StateFirst:  # CPython sorts a class's slots: a base's slot comes first, so ...
        __slots__ = ("state",)

    class Shifted(StateFirst):  # ... OpRecord's slot names at other offsets, within the same size
        __slots__ = tuple(name for name in OpRecord.__slots__ if name not in ("state", "__dict__"))

    class NotAGroup:
        pass

    with pytest.raises(TypeError):
        hotpath.configure(Shifted, NotAGroup, Depth, payload_info, schema.STATE_COMPLETED,
                          schema.STATE_IN_FLIGHT)
    try:
        job.recorder.take_done()
        tensor = torch.ones(4, dtype=torch.float64)
        dist.all_reduce(tensor)
        dist.broadcast(tensor, src=0)  # an OpRecord built in C
        records = job.recorder.take_done()
        got = sorted((r.api, r.op, r.bytes, str(r.dtype), r.state, r.async_op) for r in records)
        assert got == [("torch.distributed.all_reduce", schema.OP_ALL_REDUCE, 32, "torch.float64",
                        schema.STATE_COMPLETED, False),
                       ("torch.distributed.broadcast", schema.OP_BROADCAST, 32, "torch.float64",
                        schema.STATE_COMPLETED, False)], got
    finally:  # today's code left the wrong offsets: put the right ones back for the tests after this one
        hotpath.configure(OpRecord, GroupInfo, Depth, payload_info, schema.STATE_COMPLETED, schema.STATE_IN_FLIGHT)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["other_thread", "own_thread"])
def test_a_child_forked_mid_op_starts_clean(tmp_path: Path, case: str) -> None:
    """A fork while a collective is in flight in the ring (other_thread: another thread's, as a DataLoader worker
    is forked while a communication thread waits, 2 ranks; own_thread: the op's own thread forks inside torch's
    call and the child leaves the call with an error, 1 rank): the child's ring is empty, nothing of the
    parent's is in flight or completed there, and its own collectives go to its fresh ring, in order; the
    parent's op completes in the parent, once."""
    facts = _run_job(case, 2 if case == "other_thread" else 1, tmp_path)
    child, parent = facts["child"], facts["parent"]
    assert [op for op, _, state in parent["records"]] == [schema.OP_ALL_REDUCE] and parent["idle"], parent
    assert parent["records"][0][2] == schema.STATE_COMPLETED
    assert child["at_fork"] == {"ring_len": 0, "ring_in_flight": 0, "inflight": [], "idle": True, "done": [],
                                "taken": 0}, child
    assert child["left"] == [] and not child["failures_pending"], child  # the parent's op not completed here
    assert child["own"] == [[schema.OP_ALL_REDUCE, seq, schema.STATE_COMPLETED] for seq in (1, 2, 3)], child
    assert child["own_taken_by_ring"] == 3
