"""Process groups as the span contract sees them: stable id, name, members, sequence.

Sequence numbers: every member must put the same `seq` on the same collective, and
it must agree with torch's own numbering (Flight Recorder's collective_seq_id) so
post-mortems line up. torch's per-group op counter
(`ProcessGroup._get_sequence_number_for_group`) counts p2p ops too on some backends
(gloo) and not on others (NCCL); p2p ops are only issued by one side of a group, so
we measure how much each of our own p2p ops moved the counter and subtract it.
Collectives that bypass Python (DDP's C++ reducer, C++ broadcasts at DDP init) still
move the counter, so numbering stays right after them.
"""

from __future__ import annotations

import bisect
import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mycroft import schema

# Backends whose ops return at enqueue and complete later on the device (ProcessGroupNCCL:
# Work.wait() only makes the current stream wait). A Python process group can declare the
# same with a class attribute `_mycroft_device_async = True` (the CPU simulator does).
DEVICE_ASYNC_BACKENDS = frozenset({"nccl", "xccl"})


def completes_on_device(pg: Any, backend: str) -> bool:
    """Whether the group's ops complete after their call returns (completion must come from the Work)."""
    if getattr(pg, "_mycroft_device_async", False):
        return True
    # "nccl", or a device map such as "cpu:gloo,cuda:nccl" (CUDA tensors then go to NCCL)
    names = {part.rsplit(":", 1)[-1].strip() for part in backend.lower().split(",")}
    return bool(names & DEVICE_ASYNC_BACKENDS)

P2P_TAKEN_MAX = 16384  # p2p counter positions kept per group for frontier reads


@dataclass(slots=True)
class GroupInfo:
    """Static facts of one group plus this rank's counters in it (mutated on the hot path)."""

    gid: str
    name: str
    desc: str
    ranks: tuple[int, ...]
    ranks_text: str
    group_rank: int
    backend: str
    pg: Any  # the ProcessGroup, to read its counter; held weakly once registered (see `_weak`)
    has_counter: bool = True
    own_counter: int = 0  # fallback when the backend has no sequence counter
    p2p_counter_delta: int = 0  # how far our own p2p ops moved torch's counter
    # the counter values our p2p ops took, above the frontier last read (see `collective_frontier`)
    p2p_taken: list[int] = field(default_factory=list)
    p2p_below: int = 0  # ... and how many lie at or below it
    pair_seq: dict[tuple[int, int], int] = field(default_factory=dict)
    issued: int = 0  # last collective seq issued on this rank
    completed: int = 0  # last collective seq completed on this rank
    device_async: bool = False  # ops complete on the device after the call returns (NCCL)
    fr_completed: int = -1  # the Flight Recorder's last completed seq (-1: unknown)
    fr_enqueued: int = -1  # ... and last enqueued
    # set once here, read per op (the hot path): the group, whether held weakly or not, by one call;
    # torch's counter as its class's function (no bound method built, no attribute lookup per op)
    deref: Callable[[], Any] = field(init=False, repr=False, compare=False)
    seq_of: Callable[[Any], int] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.deref = self.pg if isinstance(self.pg, weakref.ref) else functools.partial(_same, self.pg)
        self.seq_of = getattr(type(self.pg() if isinstance(self.pg, weakref.ref) else self.pg),
                              "_get_sequence_number_for_group", None)

    @property
    def size(self) -> int:
        return len(self.ranks)

    def process_group(self) -> Any:
        """The live ProcessGroup, or None once torch has let it go."""
        return self.deref()

    def counter(self) -> int:
        if self.has_counter:
            try:
                return int(self.seq_of(self.deref()))  # type: ignore[misc]  # None: caught, no counter
            except Exception:
                self.has_counter = False
        return self.own_counter

    def next_collective_seq(self) -> int:
        """The seq the collective about to be issued will get (call just before issuing).

        Once per collective on the training thread: torch's counter is read here directly (what
        `counter` does, without its second call and int()).
        """
        if self.has_counter:
            try:
                seq = self.seq_of(self.deref()) - self.p2p_counter_delta + 1  # type: ignore[misc]
                self.issued = seq
                return seq
            except Exception:  # no counter on this backend (None, or no such method)
                self.has_counter = False
        seq = self.own_counter - self.p2p_counter_delta + 1
        self.own_counter += 1
        self.issued = seq
        return seq

    def note_p2p(self, before: int, after: int) -> None:
        """Our p2p op moved torch's counter from `before` to `after` (gloo counts p2p ops there)."""
        self.p2p_counter_delta += after - before
        if after > before:
            self.p2p_taken.extend(range(before + 1, after + 1))
            if len(self.p2p_taken) > P2P_TAKEN_MAX:  # no frontier reads here: keep it bounded
                del self.p2p_taken[:-P2P_TAKEN_MAX]
                self.p2p_below = self.p2p_counter_delta - P2P_TAKEN_MAX

    def collective_frontier(self, enqueued: int, completed: int) -> tuple[int, int]:
        """pg_status's (last enqueued, last completed) in this group's collective numbering.

        gloo's pg_status counts on torch's counter, which p2p ops move too, while collective seqs
        (ours, and the Flight Recorder entries') count collectives only: each p2p position at or
        below a frontier value is taken off it. The frontier only moves forward, so the positions
        below the completed one are folded into a count.
        """
        if not self.p2p_counter_delta:
            return enqueued, completed
        taken = self.p2p_taken
        below_completed = bisect.bisect_right(taken, completed)
        out = (enqueued - self.p2p_below - bisect.bisect_right(taken, enqueued) if enqueued >= 0 else enqueued,
               completed - self.p2p_below - below_completed if completed >= 0 else completed)
        if below_completed:
            del taken[:below_completed]
            self.p2p_below += below_completed
        return out

    def next_pair_seq(self, src: int, dst: int) -> int:
        key = (src, dst)
        seq = self.pair_seq.get(key, 0) + 1
        self.pair_seq[key] = seq
        return seq


class GroupRegistry:
    """Resolves a ProcessGroup (or None for the default group) to its GroupInfo, cached."""

    def __init__(self) -> None:
        self._by_pg: dict[int, GroupInfo] = {}
        self._default: GroupInfo | None = None

    def all(self) -> list[GroupInfo]:
        return list(self._by_pg.values())

    def reset(self) -> None:
        """Forget every group (after destroy_process_group the objects die and ids recycle)."""
        self._by_pg = {}
        self._default = None

    def resolve(self, pg: Any) -> GroupInfo | None:
        """None when this rank is not a member (torch then skips the op too)."""
        if pg is None:
            if self._default is None:
                import torch.distributed as dist

                self._default = self.resolve(dist.distributed_c10d._get_default_group())
            return self._default
        info = self._by_pg.get(id(pg))
        if info is not None and info.deref() is pg:
            return info
        return self._register(pg)

    def _register(self, pg: Any) -> GroupInfo | None:
        import torch.distributed as dist

        if pg is None or pg is dist.GroupMember.NON_GROUP_MEMBER:
            return None
        ranks = tuple(dist.get_process_group_ranks(pg))
        name = str(getattr(pg, "group_name", "") or dist.distributed_c10d._get_process_group_name(pg))
        desc = str(getattr(pg, "group_desc", "") or "")
        try:
            backend = str(dist.get_backend(pg))
        except Exception:
            backend = "unknown"
        ranks_text = schema.encode_ranks(ranks)
        info = GroupInfo(
            gid=schema.group_id(name, ranks),
            name=name,
            desc=desc,
            ranks=ranks,
            ranks_text=ranks_text,
            group_rank=pg.rank(),
            backend=backend,
            pg=_weak(pg),
            device_async=completes_on_device(pg, backend),
        )
        self._by_pg[id(pg)] = info
        return info


def _same(pg: Any) -> Any:
    """What a strongly held group's `deref` returns."""
    return pg


def _weak(pg: Any) -> Any:
    """A weak reference to `pg`, so that tracing never keeps a process group alive.

    A group kept past destroy_process_group (by a record still queued, or a cycle only the
    final garbage collection breaks) keeps gloo's worker threads running into interpreter
    shutdown; one that then drops a tensor takes the GIL, and CPython ends it with
    pthread_exit, whose unwinding through torch's noexcept destructors aborts the process
    ("terminate called without an active exception").
    """
    try:
        return weakref.ref(pg)
    except TypeError:  # a backend object without weak references: hold it as before
        return pg
