"""Intra-node hang evidence when NCCL emits no proxy events (pure functions).

On one node without the network transport NCCL has no ProxyOp / ProxyStep events (nccl#1623,
#1765), so there are no flow counters to classify. What the profiler plugin can still tell, per
rank, from the heartbeat arrays it fills (instrumentation/native_reader.py):

* the collectives NCCL was given and has not finished (Coll events: enqueue), and how many of
  their kernel channels were seen (ATTR_HB_FLOW_NCOLL_*);
* the communicators it is in and the highest collective seq finished in each (ATTR_HB_FLOW_NCOMM_*);
* the kernel channels running: started on the GPU, not finished (KernelCh events, with the GPU
  timer; ATTR_HB_FLOW_KCH_*). KernelCh is on by default up to NCCL 2.30 and off on 2.31
  (MYCROFT_NATIVE_KERNEL_CH=1), where it costs 4-13 % (nccl#2355).

For one collective (comm, seq) that does not finish, each rank is then in one state: kernel
running (its GPU is inside the collective, waiting for peers), kernel not started (enqueued, but
its GPU has not reached the kernel: busy with earlier work on the stream), or not enqueued (its
NCCL has not been given the collective: a member of the communicator whose highest finished or
enqueued seq is lower). A collective kernel only finishes when every rank's kernel runs, so while
some ranks are inside it, the ranks not inside it are the cause; when every rank is inside it and
no channel finishes, no rank is to blame by this evidence: the intra-node transport (NVLink / P2P /
SHM) does not move data. Without kernel-channel events a collective counts as finished once
enqueued, so only the not-enqueued case can be told (the furthest seq a member reached is the one
the others lack).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mycroft import schema

SIDE_KERNEL = "kernel"  # the side of a finding made from kernel channels (flow findings: send / recv)
SIDE_GPU = "gpu"  # suspect: the rank's GPU / stream (its kernel never started)
SIDE_HOST = "host"  # suspect: the rank's host (it never handed the collective to NCCL)
SIDE_TRANSPORT = "intra_node_transport"  # every rank inside the kernel, nothing finishes


@dataclass(slots=True)
class KernelFinding:
    """One rank's part in a collective that does not finish."""

    rank: int
    comm: str  # NCCL commHash, hex
    seq: int
    state: str  # schema.KERNEL_STATE_*
    channels: list[int] = field(default_factory=list)  # kernel channels running
    age_s: float = 0.0  # the oldest running channel's age
    func: str = ""
    culprit: bool = False
    suspect_side: str = ""
    evidence: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "comm": self.comm, "seq": self.seq, "state": self.state,
                "channels": self.channels, "age_s": self.age_s, "func": self.func, "culprit": self.culprit,
                "suspect_side": self.suspect_side, "evidence": self.evidence}


def _rows(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> list[tuple[Any, ...]]:
    """Parallel heartbeat arrays as rows; none when one is missing or the lengths differ."""
    cols: list[list[Any]] = []
    for key in keys:
        value = attrs.get(key)
        if not isinstance(value, list | tuple):
            return []
        cols.append(list(value))
    if any(len(c) != len(cols[0]) for c in cols):
        return []
    return list(zip(*cols, strict=True))


def classify_kernels(heartbeat_attrs_by_rank: Mapping[int, Mapping[str, Any]],
                     min_age_s: float = 0.0) -> list[KernelFinding]:
    """Every rank's state for each stuck collective; culprits first.

    A collective is looked at once some rank has a kernel channel of it running for at least
    min_age_s, or (no kernel-channel events at all) once some rank has it enqueued.
    """
    running: dict[tuple[str, int], dict[int, tuple[list[int], float]]] = {}
    enqueued: dict[tuple[str, int], dict[int, tuple[str, int]]] = {}
    highest: dict[tuple[str, int], int] = {}  # (comm, rank) -> highest seq the rank reports
    for rank, attrs in heartbeat_attrs_by_rank.items():
        for comm, seq, channel, age in _rows(attrs, (schema.ATTR_HB_FLOW_KCH_COMMS, schema.ATTR_HB_FLOW_KCH_SEQS,
                                                      schema.ATTR_HB_FLOW_KCH_CHANNELS,
                                                      schema.ATTR_HB_FLOW_KCH_AGES_S)):
            if int(seq) < 0:
                continue
            chans, oldest = running.setdefault((str(comm), int(seq)), {}).get(int(rank), ([], 0.0))
            running[(str(comm), int(seq))][int(rank)] = ([*chans, int(channel)], max(oldest, float(age)))
            key = (str(comm), int(rank))
            highest[key] = max(highest.get(key, -1), int(seq))
        for comm, seq, func, kernels in _rows(attrs, (schema.ATTR_HB_FLOW_NCOLL_COMMS, schema.ATTR_HB_FLOW_NCOLL_SEQS,
                                                       schema.ATTR_HB_FLOW_NCOLL_FUNCS,
                                                       schema.ATTR_HB_FLOW_NCOLL_KERNELS)):
            enqueued.setdefault((str(comm), int(seq)), {})[int(rank)] = (str(func), int(kernels))
            key = (str(comm), int(rank))
            highest[key] = max(highest.get(key, -1), int(seq))
        for comm, done in _rows(attrs, (schema.ATTR_HB_FLOW_NCOMM_COMMS, schema.ATTR_HB_FLOW_NCOMM_DONE_SEQS)):
            key = (str(comm), int(rank))  # a member of the communicator, even with nothing in flight
            highest[key] = max(highest.get(key, -1), int(done))
    findings: list[KernelFinding] = []
    kernel_events = bool(running)
    if kernel_events:
        stuck = [k for k, by_rank in running.items() if max(age for _, age in by_rank.values()) >= min_age_s]
    else:  # no kernel channels (KernelCh off): a collective is "finished" once enqueued; the
        # furthest seq any member reached is the one the laggards have not enqueued
        tops: dict[str, int] = {}
        for (comm, _), seq in highest.items():
            tops[comm] = max(tops.get(comm, -1), seq)
        stuck = [(comm, seq) for comm, seq in tops.items() if seq >= 0]
    for comm, seq in sorted(stuck):
        members = sorted({r for (c, r) in highest if c == comm})
        inside = running.get((comm, seq), {})
        queued = enqueued.get((comm, seq), {})
        func = next((f for f, _ in queued.values()), "")
        part: list[KernelFinding] = []
        reached: list[int] = []
        for r in members:
            if r in inside:
                chans, age = inside[r]
                part.append(KernelFinding(r, comm, seq, schema.KERNEL_STATE_RUNNING, sorted(chans), age, func))
            elif r in queued and queued[r][1] == 0:
                part.append(KernelFinding(r, comm, seq, schema.KERNEL_STATE_NOT_STARTED, func=func))
            elif r not in queued and highest.get((comm, r), -1) < seq:
                part.append(KernelFinding(r, comm, seq, schema.KERNEL_STATE_NOT_ENQUEUED, func=func))
            else:
                reached.append(r)
        _blame(part, kernel_events, reached)
        findings.extend(part)
    findings.sort(key=lambda f: (not f.culprit, f.comm, f.seq, f.rank))
    return findings


def _blame(part: list[KernelFinding], kernel_events: bool, reached: list[int]) -> None:
    inside = [f for f in part if f.state == schema.KERNEL_STATE_RUNNING]
    absent = [f for f in part if f.state == schema.KERNEL_STATE_NOT_ENQUEUED]
    late = [f for f in part if f.state == schema.KERNEL_STATE_NOT_STARTED]
    what = f"{part[0].func or 'collective'} seq {part[0].seq} of comm {part[0].comm}" if part else ""
    if not part:
        return
    waiting = ", ".join(str(f.rank) for f in inside[:8])
    ahead = ", ".join(str(r) for r in [*(f.rank for f in inside), *(f.rank for f in late), *reached][:8])
    for f in absent:
        f.culprit, f.suspect_side = True, SIDE_HOST
        f.evidence = (f"rank {f.rank} has not given {what} to NCCL (it has finished or enqueued only lower seqs)"
                      + (f" while ranks {ahead} have it" if ahead else ""))
    if inside:
        for f in late:
            f.culprit, f.suspect_side = True, SIDE_GPU
            f.evidence = (f"rank {f.rank} enqueued {what} but its kernel has not started on the GPU (the GPU is "
                          f"still busy with earlier work on the stream) while ranks {waiting} wait inside it")
    elif late and kernel_events:
        for f in late:
            f.evidence = f"rank {f.rank} enqueued {what}; its kernel has not started"
    if inside and not absent and not late:
        channels = sorted({c for f in inside for c in f.channels})
        for f in inside:
            f.suspect_side = SIDE_TRANSPORT
            f.evidence = (f"every rank is inside the kernel of {what} (channels {channels[:16]}, oldest "
                          f"{max(x.age_s for x in inside):.1f}s) and none finishes: the intra-node transport "
                          f"(NVLink / P2P / SHM) does not move data; no rank is to blame on this evidence")
    for f in inside:
        if not f.evidence:
            f.evidence = f"rank {f.rank} is inside the kernel of {what} on channels {f.channels[:16]}, waiting"


def summarize(findings: list[KernelFinding]) -> dict[str, Any]:
    """Verdict-sized: the first culprit (rank, side, state, text), or the transport case (rank None)."""
    if not findings:
        return {}
    top = findings[0]
    rank = top.rank if top.culprit else None
    return {"rank": rank, "side": top.suspect_side, "state": top.state, "text": top.evidence,
            "kernels": [f.as_dict() for f in findings[:32]]}
