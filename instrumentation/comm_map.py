"""Which torch process group an NCCL communicator belongs to: the join between native and Python spans.

The native plugin knows a communicator by NCCL's commHash / commId, its name (whatever
torch put in ncclConfig_t.commName, possibly empty), its size and this process's rank in it,
and numbers collectives by NCCL's seqNumber. The Python side knows groups by torch's name,
members and this rank's group rank, and numbers collectives by torch's per-group seq. Both
run in the same process on the same clock, and NCCL starts a collective's Coll event inside
the Python call that issued it. So (pure, no I/O):

1. candidates: device-async groups of the communicator's size in which this process has
   the communicator's rank;
2. evidence: each native collective of the communicator that started inside the call window
   of a candidate's Python op of the same family votes for (group, torch seq - NCCL seq);
3. a communicator maps to the (group, offset) with the most votes once it has
   `min_votes` and no rival has as many; a single candidate with no contradicting vote maps
   with the offset of its votes. A communicator's name only breaks ties (torch may put the
   group name or description there; it is not relied on).

Collectives issued outside Python (DDP's C++ reducer when not hooked) give no votes but
follow the same offset. Limits: p2p communicators (torch opens one per peer pair) are not
mapped; coalesced ops that NCCL counts as several collectives shift the offset and are
re-voted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mycroft import schema

# NCCL func names -> the contract's op families (what a Python op must be to match)
NCCL_OPS = {
    "AllReduce": schema.OP_ALL_REDUCE, "AllGather": schema.OP_ALL_GATHER,
    "ReduceScatter": schema.OP_REDUCE_SCATTER, "Broadcast": schema.OP_BROADCAST, "Reduce": schema.OP_REDUCE,
    "Gather": schema.OP_GATHER, "Scatter": schema.OP_SCATTER, "AllToAll": schema.OP_ALL_TO_ALL,
    "Send": schema.OP_SEND, "Recv": schema.OP_RECV,
}
# torch issues some ops as another NCCL collective (barrier: an all-reduce of one element;
# gather / scatter / all_to_all: grouped send/recv, not a Coll event)
_FAMILIES = {schema.OP_BARRIER: schema.OP_ALL_REDUCE}


@dataclass(frozen=True, slots=True)
class CommInfo:
    comm_hash: int
    name: str
    nranks: int
    rank: int


@dataclass(frozen=True, slots=True)
class GroupShape:
    gid: str
    name: str
    desc: str
    ranks: tuple[int, ...]
    group_rank: int


@dataclass(frozen=True, slots=True)
class PyOp:
    """A collective as the Python side saw it: its seq and the window of its issuing call."""

    gid: str
    seq: int
    op: str
    start_ns: int
    call_end_ns: int  # 0: still in the call


@dataclass(frozen=True, slots=True)
class NativeColl:
    comm_hash: int
    seq: int  # NCCL's seqNumber
    func: str
    start_ns: int


@dataclass(frozen=True, slots=True)
class CommMapping:
    gid: str
    ranks: tuple[int, ...]
    seq_offset: int  # torch seq = NCCL seqNumber + offset
    votes: int


def _name_hint(comm: CommInfo, group: GroupShape) -> bool:
    tokens = {t for t in comm.name.replace(":", " ").replace("/", " ").split() if t}
    return bool(tokens) and (group.name in tokens or (bool(group.desc) and group.desc in comm.name))


def match_comms(comms: Iterable[CommInfo], colls: Iterable[NativeColl], groups: Sequence[GroupShape],
                ops: Iterable[PyOp], slack_ns: int = 2_000_000, min_votes: int = 2) -> dict[int, CommMapping]:
    """Map communicators to groups (see the module docstring); unsure ones are left out."""
    by_group: dict[str, list[PyOp]] = {}
    for op in ops:
        by_group.setdefault(op.gid, []).append(op)
    for lst in by_group.values():
        lst.sort(key=lambda o: o.start_ns)
    colls_by_comm: dict[int, list[NativeColl]] = {}
    for coll in colls:
        colls_by_comm.setdefault(coll.comm_hash, []).append(coll)
    out: dict[int, CommMapping] = {}
    for comm in comms:
        candidates = [g for g in groups if len(g.ranks) == comm.nranks and g.group_rank == comm.rank]
        if not candidates:
            continue
        votes: Counter[tuple[str, int]] = Counter()
        for coll in colls_by_comm.get(comm.comm_hash, []):
            family = NCCL_OPS.get(coll.func)
            if family is None:
                continue
            for group in candidates:
                for op in by_group.get(group.gid, []):
                    if op.start_ns - slack_ns > coll.start_ns:
                        break
                    end = op.call_end_ns or (coll.start_ns + slack_ns)
                    if _FAMILIES.get(op.op, op.op) == family and coll.start_ns <= end + slack_ns:
                        votes[(group.gid, op.seq - coll.seq)] += 1
        ranked = votes.most_common()
        if ranked:
            (gid, offset), count = ranked[0]
            rival = ranked[1][1] if len(ranked) > 1 else 0
            lone = len(candidates) == 1 and len(ranked) == 1
            if count > rival and (count >= min_votes or lone):
                group = next(g for g in candidates if g.gid == gid)
                out[comm.comm_hash] = CommMapping(gid, group.ranks, offset, count)
                continue
            tied = [key for key, n in ranked if n == count]
            hinted = [key for key in tied if _name_hint(comm, next(g for g in candidates if g.gid == key[0]))]
            if len(hinted) == 1 and count >= min_votes:
                gid, offset = hinted[0]
                group = next(g for g in candidates if g.gid == gid)
                out[comm.comm_hash] = CommMapping(gid, group.ranks, offset, count)
    return out
